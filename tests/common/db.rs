//! A fresh database per test: a new PostgreSQL database or a SQLite file in a temp
//! dir, dropped with the test; `dlq` run against it.

use super::*;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

pub const BACKENDS: [Backend; 2] = [Backend::Postgres, Backend::Sqlite];

/// Runs `$body` with `$pool` connected to the test database, whichever backend it is.
macro_rules! with_pool {
    ($db:expr, $pool:ident, $body:block) => {{
        let db: &TestDb = $db;
        rt().block_on(async move {
            match db.backend {
                Backend::Postgres => {
                    let $pool = sqlx::PgPool::connect(&db.url).await.unwrap();
                    let out = $body;
                    $pool.close().await;
                    out
                }
                Backend::Sqlite => {
                    let $pool = sqlx::SqlitePool::connect(&format!("{}?mode=rwc", db.url))
                        .await
                        .unwrap();
                    let out = $body;
                    $pool.close().await;
                    out
                }
            }
        })
    }};
}

/// A fresh database: a new PostgreSQL database or a SQLite file in a temp dir.
pub struct TestDb {
    pub backend: Backend,
    pub url: String,
    pg_name: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Postgres => TestDb::postgres_created_with(""),
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite://{}", dir.path().join("dlq.db").display());
                TestDb {
                    backend,
                    url,
                    pg_name: None,
                    _dir: Some(dir),
                }
            }
        }
    }

    /// A fresh PostgreSQL database made by `CREATE DATABASE name {options}`.
    pub fn postgres_created_with(options: &str) -> TestDb {
        let name = unique("dlq_t");
        rt().block_on(async {
            let pool = sqlx::PgPool::connect(PG_ADMIN)
                .await
                .expect("PostgreSQL at 127.0.0.1:5432");
            sqlx::query(&format!("CREATE DATABASE {name} {options}"))
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
        });
        TestDb {
            backend: Backend::Postgres,
            url: format!("postgres://postgres@127.0.0.1:5432/{name}"),
            pg_name: Some(name),
            _dir: None,
        }
    }

    /// A fresh, migrated database.
    pub fn migrated(backend: Backend) -> TestDb {
        let db = TestDb::new(backend);
        let r = db.dlq(&["migrate"]);
        assert_eq!(r.code, 0, "migrate: {}", r.all());
        db
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_dlq"));
        for (k, _) in std::env::vars() {
            if k.starts_with("DLQ_") {
                c.env_remove(k);
            }
        }
        c.env("DLQ_DATABASE_URL", &self.url)
            .env("DLQ_AMQP_URL", AMQP)
            .env("DLQ_OPERATOR", "tester")
            .env("DLQ_OUTPUT", "json")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null());
        c
    }

    pub fn dlq(&self, args: &[&str]) -> Run {
        Run::from(self.cmd().args(args).output().unwrap())
    }

    pub fn dlq_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut c = self.cmd();
        for (k, v) in env {
            c.env(k, v);
        }
        Run::from(c.args(args).output().unwrap())
    }

    pub fn dlq_stdin(&self, args: &[&str], input: &[u8]) -> Run {
        let mut child = self
            .cmd()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        Run::from(child.wait_with_output().unwrap())
    }

    /// Runs SQL statements directly (as a worker or an operator with psql would).
    pub fn sql(&self, statements: &[&str]) {
        with_pool!(self, pool, {
            for s in statements {
                sqlx::query(s)
                    .execute(&pool)
                    .await
                    .unwrap_or_else(|e| panic!("{s}: {e}"));
            }
        })
    }

    /// Sets the database's default isolation for new sessions (PostgreSQL), as an
    /// administrator may: dlq's checks after an advisory lock must not depend on it.
    pub fn default_isolation(&self, level: &str) {
        self.sql(&[&format!(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = %L', \
             current_database(), '{level}'); END $$"
        )]);
    }

    /// One integer from a query.
    pub fn scalar(&self, q: &str) -> i64 {
        with_pool!(self, pool, {
            sqlx::query_scalar::<_, i64>(q)
                .fetch_one(&pool)
                .await
                .unwrap()
        })
    }

    pub fn import_examples(&self) {
        let r = self.dlq(&["import", &examples_file()]);
        assert_eq!(r.code, 0, "{}", r.stderr);
    }

    /// Imports one dead letter with the given JSON fields.
    pub fn add(&self, row: serde_json::Value) {
        let r = self.dlq_stdin(&["import", "-"], format!("{row}\n").as_bytes());
        assert_eq!(r.code, 0, "import failed: {}", r.stderr);
    }

    /// `dlq plan ARGS` written to a file, for `dlq replay --plan`.
    pub fn plan_file(&self, args: &[&str]) -> tempfile::NamedTempFile {
        let mut a = vec!["plan"];
        a.extend_from_slice(args);
        let r = self.dlq(&a);
        assert_eq!(r.code, 0, "{}", r.all());
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), &r.stdout).unwrap();
        f
    }

    /// The IDs a `dlq list ...` prints, in its order.
    pub fn ids(&self, list_args: &[&str]) -> Vec<String> {
        let mut args = vec!["list"];
        args.extend_from_slice(list_args);
        self.dlq(&args).ids()
    }

    pub fn show(&self, id: &str) -> serde_json::Value {
        let r = self.dlq(&["show", id]);
        assert_eq!(r.code, 0, "show {id}: {}", r.stderr);
        r.json()
    }

    /// `n` rows `one-0`.. inserted one statement each, as a worker does (PostgreSQL).
    pub fn insert_one_by_one(&self, n: usize) {
        for i in 0..n {
            self.sql(&[&format!(
                "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, producer) \
                 VALUES ('one-{i}', 'z', 'poison_message', 1, '{{}}', 'billing')"
            )]);
        }
    }

    /// Runs `f` while another session holds the lock of the kept counts' fold
    /// (PostgreSQL): a fold under way elsewhere, its transaction still open.
    pub fn with_fold_held(&self, f: impl FnOnce()) {
        let mut psql = Command::new("psql")
            .args(["-X", "-q", &self.url])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("psql");
        let mut stdin = psql.stdin.take().unwrap();
        stdin
            .write_all(
                b"BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('dlq_rollup_fold', 0));\n\
                  \\echo held\n",
            )
            .unwrap();
        wait_for_line(psql.stdout.as_mut().unwrap(), "held");
        f();
        drop(stdin);
        psql.wait().unwrap();
    }
}

fn wait_for_line(out: &mut impl std::io::Read, want: &str) {
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(out).lines();
    for line in lines.by_ref() {
        if line.unwrap().trim() == want {
            return;
        }
    }
    panic!("psql never said {want}");
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = &self.pg_name {
            let name = name.clone();
            rt().block_on(async move {
                if let Ok(pool) = sqlx::PgPool::connect(PG_ADMIN).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&pool)
                        .await;
                    pool.close().await;
                }
            });
        }
    }
}

pub fn examples_file() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/dead-letters.jsonl")
        .display()
        .to_string()
}
