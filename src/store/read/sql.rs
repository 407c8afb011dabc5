//! SQL text with its bound values, built once and handed to either driver: sqlx's
//! `QueryBuilder` (every read), or a statement that the SQLite export steps itself
//! (`store/sqlite_export.rs`), which needs the values back out, and a `QueryBuilder`
//! never gives them.

use super::{Bind, Dialect};
use sqlx::QueryBuilder;

/// A statement, or a part of one, and its values in order.
#[derive(Default)]
pub struct Sql {
    parts: Vec<Part>,
}

enum Part {
    Text(String),
    Bind(Bind),
}

impl Sql {
    pub fn new(text: impl Into<String>) -> Sql {
        Sql {
            parts: vec![Part::Text(text.into())],
        }
    }

    pub fn push(&mut self, text: impl Into<String>) -> &mut Sql {
        self.parts.push(Part::Text(text.into()));
        self
    }

    pub fn bind(&mut self, value: Bind) -> &mut Sql {
        self.parts.push(Part::Bind(value));
        self
    }

    /// Appends `other` (text and values) to this statement.
    pub fn append(&mut self, other: Sql) -> &mut Sql {
        self.parts.extend(other.parts);
        self
    }

    /// Appends it to `qb`, each value bound as the dialect binds it.
    pub(crate) fn push_into<D: Dialect>(self, qb: &mut QueryBuilder<'static, D>) {
        for part in self.parts {
            match part {
                Part::Text(t) => {
                    qb.push(t);
                }
                Part::Bind(v) => D::bind(qb, v),
            }
        }
    }

    pub(crate) fn into_builder<D: Dialect>(self) -> QueryBuilder<'static, D> {
        let mut qb = QueryBuilder::new("");
        self.push_into(&mut qb);
        qb
    }

    /// The text with a `?` where each value goes, and the values in that order.
    pub(crate) fn positional(self) -> (String, Vec<Bind>) {
        let mut text = String::new();
        let mut values = Vec::new();
        for part in self.parts {
            match part {
                Part::Text(t) => text.push_str(&t),
                Part::Bind(v) => {
                    text.push('?');
                    values.push(v);
                }
            }
        }
        (text, values)
    }
}
