//! How a table fits a terminal. The command says what each column is for ([`Fit`]): the
//! columns a person asked for (an ID, the `--by` keys, the filtered-for fields, a state, a
//! time) are never left out nor broken; free text is cut with `…` on one line (never
//! wrapped mid-word); extras give way in the order the command gave. When even the kept
//! columns do not fit, each record is shown vertically, one field a line (psql's `\x`).

use super::super::Headers;
use super::Colour;
use comfy_table::{presets, Cell, Color, ContentArrangement, Table};

/// What a column may give up when the table is too wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// Always shown, never cut (an ID, a key asked for, a time, a state).
    Keep,
    /// Free text: cut to the width left, with `…`.
    Cut,
    /// Left out when there is no room; lower ranks first.
    Drop(u8),
}

/// A column's title, what it may give up, and whether its cells are coloured.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub fit: Fit,
    pub paint: Paint,
}

/// How a column's cells are coloured on a terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paint {
    Plain,
    /// A state or an outcome: coloured by its word ([`colour_of`]).
    Word,
}

impl Column {
    pub fn new(name: &str, fit: Fit) -> Self {
        Column {
            name: name.to_string(),
            fit,
            paint: Paint::Plain,
        }
    }

    /// A column of states or outcomes, coloured on a terminal.
    pub fn painted(self) -> Self {
        Column {
            paint: Paint::Word,
            ..self
        }
    }
}

/// How a table is drawn: its header line, its colours.
#[derive(Debug, Clone, Copy)]
pub struct Look {
    pub headers: Headers,
    pub colour: Colour,
}

/// The ANSI foreground code of [`colour_of`], for a line outside a table.
pub fn ansi_of(word: &str) -> Option<&'static str> {
    Some(match colour_of(word)? {
        Color::Green => "32",
        Color::Yellow => "33",
        Color::Cyan => "36",
        Color::Red => "31",
        Color::Magenta => "35",
        _ => "90",
    })
}

/// The colour of a state or an outcome: `uncertain` must not look like `pending`.
pub fn colour_of(word: &str) -> Option<Color> {
    Some(match word {
        "replayed" | "resolved" | "claimed_ok" => Color::Green,
        "uncertain" | "interrupted" => Color::Yellow,
        "claimed" => Color::Cyan,
        "discarded" => Color::DarkGrey,
        "publish_failed" | "not_found" => Color::Red,
        w if w.starts_with("not_") => Color::Magenta,
        _ => return None,
    })
}

/// What fitting a table gave: the text, and what a person must be told.
pub struct Fitted {
    pub text: String,
    pub left_out: Vec<String>,
    pub vertical: bool,
}

/// The narrowest a free-text column is cut to before it is left out.
const MIN_CUT: usize = 5;

/// Cells cost their width, a space either side and a border.
fn cost(widths: &[usize]) -> usize {
    widths.iter().map(|w| w + 3).sum::<usize>() + 1
}

/// The table of `rows` (already one line each), fitted to `width` when there is one.
pub fn render(
    style: comfy_table::TableStyle,
    columns: &[Column],
    rows: &[Vec<String>],
    width: Option<usize>,
    look: Look,
) -> Fitted {
    let natural: Vec<usize> = (0..columns.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([columns[i].name.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let Some(width) = width else {
        return Fitted {
            text: draw(
                style,
                columns,
                rows,
                &(0..columns.len()).collect::<Vec<_>>(),
                &natural,
                look,
            ),
            left_out: Vec::new(),
            vertical: false,
        };
    };
    let (kept, widths) = fit(columns, &natural, width);
    let left_out = (0..columns.len())
        .filter(|i| !kept.contains(i))
        .map(|i| columns[i].name.clone())
        .collect();
    let keep_only: Vec<usize> = kept.iter().map(|&i| widths[i]).collect();
    if cost(&keep_only) > width {
        return Fitted {
            text: vertical(columns, rows, width),
            left_out: Vec::new(),
            vertical: true,
        };
    }
    Fitted {
        text: draw(style, columns, rows, &kept, &widths, look),
        left_out,
        vertical: false,
    }
}

/// The columns kept and each column's width: extras left out by rank, then free text
/// that cannot have [`MIN_CUT`]; free text then shares what is left.
fn fit(columns: &[Column], natural: &[usize], width: usize) -> (Vec<usize>, Vec<usize>) {
    let mut widths: Vec<usize> = columns
        .iter()
        .zip(natural)
        .map(|(c, &n)| match c.fit {
            Fit::Cut => n.min(MIN_CUT.max(c.name.chars().count())),
            _ => n,
        })
        .collect();
    let mut kept: Vec<usize> = (0..columns.len()).collect();
    let used = |kept: &[usize], widths: &[usize]| {
        cost(&kept.iter().map(|&i| widths[i]).collect::<Vec<_>>())
    };
    while used(&kept, &widths) > width {
        let extra = kept
            .iter()
            .enumerate()
            .filter_map(|(pos, &i)| match columns[i].fit {
                Fit::Drop(rank) => Some((rank, pos)),
                _ => None,
            })
            .min();
        let cut = kept.iter().rposition(|&i| columns[i].fit == Fit::Cut);
        match (extra, cut) {
            (Some((_, pos)), _) | (None, Some(pos)) => {
                kept.remove(pos);
            }
            (None, None) => break,
        }
    }
    // Free text takes what is left, up to its whole width.
    let cuts: Vec<usize> = kept
        .iter()
        .copied()
        .filter(|&i| columns[i].fit == Fit::Cut)
        .collect();
    let mut spare = width.saturating_sub(used(&kept, &widths));
    for (n, &i) in cuts.iter().enumerate() {
        let share = spare / (cuts.len() - n);
        let more = (natural[i] - widths[i]).min(share);
        widths[i] += more;
        spare -= more;
    }
    (kept, widths)
}

/// `s` on at most `max` characters, its end replaced by `…` when cut.
fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

fn draw(
    style: comfy_table::TableStyle,
    columns: &[Column],
    rows: &[Vec<String>],
    kept: &[usize],
    widths: &[usize],
    look: Look,
) -> String {
    let mut t = Table::new();
    t.load_style(style)
        .set_content_arrangement(ContentArrangement::Disabled);
    if look.colour == Colour::On {
        t.enforce_styling();
    }
    if look.headers == Headers::Shown {
        t.set_header(kept.iter().map(|&i| columns[i].name.clone()));
    }
    for r in rows {
        t.add_row(kept.iter().map(|&i| {
            let text = match columns[i].fit {
                Fit::Cut => cut(&r[i], widths[i]),
                _ => r[i].clone(),
            };
            let colour = match (look.colour, columns[i].paint) {
                (Colour::On, Paint::Word) => colour_of(&text),
                _ => None,
            };
            match colour {
                Some(c) => Cell::new(text).fg(c),
                None => Cell::new(text),
            }
        }));
    }
    t.to_string()
}

/// Each record as a block of `NAME | value` lines, free text cut to the width.
fn vertical(columns: &[Column], rows: &[Vec<String>], width: usize) -> String {
    let label = columns
        .iter()
        .map(|c| c.name.chars().count())
        .max()
        .unwrap_or(0);
    let room = width.saturating_sub(label + 3).max(MIN_CUT);
    let mut out = String::new();
    for (n, r) in rows.iter().enumerate() {
        let head = format!("-[ RECORD {} ]", n + 1);
        let dashes = width.saturating_sub(head.chars().count()).min(40);
        out.push_str(&format!("{head}{}\n", "-".repeat(dashes)));
        for (c, v) in columns.iter().zip(r) {
            let v = match c.fit {
                Fit::Keep => v.clone(),
                _ => cut(v, room),
            };
            out.push_str(&format!("{:<label$} | {v}\n", c.name));
        }
    }
    out.trim_end_matches('\n').to_string()
}

/// The style of a table for a terminal.
pub const TERMINAL: comfy_table::TableStyle = presets::UTF8_FULL_CONDENSED;
