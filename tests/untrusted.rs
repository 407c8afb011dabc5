//! Untrusted content, secrets and output integrity: hostile rows through every human view
//! (and exact bytes through JSON, export and import), passwords in every URL shape
//! through every command that can fail on a URL, flag over environment, files readable by
//! others, failed writes and closed pipes, and the parsers of untrusted bytes fuzzed.
//!
//! The fuzz tests (`fuzz_*`) take `PROPTEST_CASES`; see docs/security.md.

mod common;
use base64::Engine;
use common::*;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::io::{BufRead, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Hostile content

/// What a hostile publisher puts into any text it controls.
const ATTACKS: [&str; 8] = [
    "\u{1b}]0;pwned\u{7}",              // retitle the terminal window (OSC 0)
    "\u{1b}]52;c;cm0gLXJmIH4K\u{7}",    // write the clipboard (OSC 52)
    "\u{1b}[2J\u{1b}[41m",              // clear the screen, red background (CSI)
    "\u{9b}2J",                         // the same with the one-byte C1 CSI
    "\u{202e}gnp.exe\u{2066}x\u{2069}", // bidi override and isolate
    "shown\roverwritten",               // return to the start of the line
    "\u{7f}\u{8}\u{0}",                 // DEL, backspace, NUL
    "a|b`c\\|d",                        // Markdown table breakers
];

/// A hostile text tagged with the column it goes to. No text field holds NUL (PostgreSQL
/// TEXT cannot, and `import` refuses it on both stores): bodies and headers carry it.
fn hostile(tag: &str, _backend: Backend) -> String {
    format!("{tag}<{}>", ATTACKS.concat()).replace('\0', "")
}

/// Characters a terminal acts on instead of printing, defined here independently of
/// `dlq::sanitize`: C0 (but newline and tab), DEL, C1, bidi controls, line separators.
fn is_raw_control(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(
            c,
            '\u{61c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

#[track_caller]
fn assert_clean(bytes: &[u8], what: &str) {
    let text = std::str::from_utf8(bytes).unwrap_or_else(|e| {
        panic!(
            "{what}: not UTF-8 ({e}): {:?}",
            String::from_utf8_lossy(bytes)
        )
    });
    if let Some(c) = text.chars().find(|c| is_raw_control(*c)) {
        panic!("{what}: raw {c:?} in {}", text.escape_debug());
    }
}

/// A run with its raw bytes (a `Run` would hide invalid UTF-8).
struct Raw {
    code: i32,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Raw {
    fn of(mut c: Command) -> Raw {
        let o = c.output().unwrap();
        Raw {
            code: o.status.code().unwrap_or(-1),
            stdout: o.stdout,
            stderr: o.stderr,
        }
    }
    fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    #[track_caller]
    fn assert_clean(&self, what: &str) {
        assert_clean(&self.stdout, &format!("{what} stdout"));
        assert_clean(&self.stderr, &format!("{what} stderr"));
    }
}

/// Bodies that attack each way a body is shown.
fn hostile_bodies() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        // Not JSON (raw controls inside a string): shown as text.
        ("text", b"{\"x\":\"\x1b]0;pwned\x07\x1b[2J\"}".to_vec()),
        // JSON whose strings hold C1, bidi and DEL: serde_json prints those raw.
        (
            "json",
            "{\"x\":\"\u{9b}2J \u{202e}evil \u{7f}\",\"y\":\"\u{1b}[41m\"}"
                .as_bytes()
                .to_vec(),
        ),
        // Text with CRLF, tabs and an escape sequence across lines.
        (
            "crlf",
            b"line one\r\n\tline two \x1b[2J\r\nshown\roverwritten".to_vec(),
        ),
        // Not UTF-8, with NUL: a hex dump.
        ("binary", b"\x00\xff\xfe\x1b]52;c;eA==\x07\x9b".to_vec()),
    ]
}

/// Imports one dead letter per hostile body with every text column hostile, and returns
/// their IDs. The IDs carry a bidi override (import refuses control characters in IDs).
fn add_hostile_rows(db: &TestDb) -> Vec<String> {
    let h = |tag: &str| hostile(tag, db.backend);
    let mut ids = Vec::new();
    for (name, body) in hostile_bodies() {
        let id = format!("h-{name}-\u{202e}lave");
        db.add(json!({
            "id": id,
            "reason": h("reason"),
            "attempts": 3,
            "headers": {"x-h": h("header"), h("key"): [h("nested"), {"k": h("deep")}]},
            "event_id": h("event"),
            "error": format!("{}: boom", h("Error")),
            "producer": h("producer"),
            "schema_version": h("schema"),
            "source_queue": h("queue"),
            "exchange": h("exchange"),
            "routing_key": h("rk"),
            "last_replay_error": h("last"),
            "replay_claim_owner": format!("{}:tok", h("owner")),
            "replay_claim_expires_at": "2020-01-01T00:00:00Z",
            "body_base64": b64(&body),
        }));
        ids.push(id);
    }
    ids
}

/// A row as a worker would write it: an ESC sequence in the ID, and on SQLite invalid
/// UTF-8 in every text column and in headers_json (SQLite does not check TEXT).
fn add_worker_rows(db: &TestDb) -> String {
    let id = "w-\u{1b}[2J-\u{1b}]0;t\u{7}".to_string();
    let text = hostile("worker", db.backend);
    let bad: Vec<u8> = [b"bad\xff\xfe" as &[u8], text.as_bytes()].concat();
    let owner = format!("{text}:tok");
    let history = hostile("history", db.backend);
    rt().block_on(async {
        match db.backend {
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
                sqlx::query(
                    "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, replay_claim_owner, \
                     replay_claim_expires_at, last_replay_error, event_id, error, producer, schema_version, \
                     source_queue, exchange, routing_key) \
                     VALUES ($1, $2, $3, 1, $4, $5, now() + interval '1 hour', $3, $3, $3, $3, $3, $3, $3, $3)",
                )
                .bind(&id)
                .bind(text.as_bytes())
                .bind(&text)
                .bind(json!({ "x": text }).to_string())
                .bind(&owner)
                .execute(&pool)
                .await
                .unwrap();
                sqlx::query(
                    "INSERT INTO dead_letter_history (dead_letter_id, operator, action, outcome, detail, token, target, plan_id) \
                     VALUES ($1, $2, $2, $2, $2, $2, $2, $2)",
                )
                .bind(&id)
                .bind(&history)
                .execute(&pool)
                .await
                .unwrap();
                pool.close().await;
            }
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
                let ms = chrono::Utc::now().timestamp_millis() + 3_600_000;
                sqlx::query(
                    "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, replay_claim_owner, \
                     replay_claim_expires_at, last_replay_error, event_id, error, producer, schema_version, \
                     source_queue, exchange, routing_key) \
                     VALUES (?1, ?2, CAST(?2 AS TEXT), 1, CAST(?3 AS TEXT), CAST(?4 AS TEXT), ?5, CAST(?2 AS TEXT), \
                     CAST(?2 AS TEXT), CAST(?2 AS TEXT), CAST(?2 AS TEXT), CAST(?2 AS TEXT), CAST(?2 AS TEXT), \
                     CAST(?2 AS TEXT), CAST(?2 AS TEXT))",
                )
                .bind(&id)
                .bind(&bad)
                .bind([b"{\"x\":\"" as &[u8], &bad, b"\"}"].concat())
                .bind([&bad as &[u8], b":tok"].concat())
                .bind(ms)
                .execute(&pool)
                .await
                .unwrap();
                let bad_history: Vec<u8> = [b"\xff" as &[u8], history.as_bytes()].concat();
                sqlx::query(
                    "INSERT INTO dead_letter_history (dead_letter_id, operator, action, outcome, detail, token, target, plan_id) \
                     VALUES (?1, CAST(?2 AS TEXT), CAST(?2 AS TEXT), CAST(?2 AS TEXT), CAST(?2 AS TEXT), \
                     CAST(?2 AS TEXT), CAST(?2 AS TEXT), CAST(?2 AS TEXT))",
                )
                .bind(&id)
                .bind(&bad_history)
                .execute(&pool)
                .await
                .unwrap();
                pool.close().await;
            }
        }
    });
    id
}

/// Adds hostile history entries to a row (operator, action, outcome, detail, ...).
fn add_hostile_history(db: &TestDb, id: &str) {
    let h = hostile("hist", db.backend);
    let q = match db.backend {
        Backend::Postgres => "INSERT INTO dead_letter_history (dead_letter_id, operator, action, outcome, detail, token, target, plan_id) VALUES ($1, $2, $2, $2, $2, $2, $2, $2)",
        Backend::Sqlite => "INSERT INTO dead_letter_history (dead_letter_id, operator, action, outcome, detail, token, target, plan_id) VALUES (?1, ?2, ?2, ?2, ?2, ?2, ?2, ?2)",
    };
    rt().block_on(async {
        match db.backend {
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
                sqlx::query(q)
                    .bind(id)
                    .bind(&h)
                    .execute(&pool)
                    .await
                    .unwrap();
                pool.close().await;
            }
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
                sqlx::query(q)
                    .bind(id)
                    .bind(&h)
                    .execute(&pool)
                    .await
                    .unwrap();
                pool.close().await;
            }
        }
    });
}

/// The number of `|` not escaped by a backslash.
fn unescaped_pipes(line: &str) -> usize {
    let mut n = 0;
    let mut escaped = false;
    for c in line.chars() {
        match (escaped, c) {
            (false, '\\') => escaped = true,
            (false, '|') => n += 1,
            _ => escaped = false,
        }
    }
    n
}

#[track_caller]
fn assert_markdown_table_intact(md: &str, what: &str) {
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
    assert!(rows.len() >= 2, "{what}: no table in {md}");
    let cells = unescaped_pipes(rows[0]);
    for r in &rows {
        assert_eq!(
            unescaped_pipes(r),
            cells,
            "{what}: a value broke the table: {r}"
        );
    }
}

#[test]
fn hostile_rows_never_reach_a_terminal_raw() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let mut ids = add_hostile_rows(&db);
        add_worker_rows(&db);
        add_hostile_history(&db, &ids[0]);
        let text_id = ids[0].clone();
        // Held by someone whose name is hostile: claim, release and replay quote it.
        let live = "h-live-\u{202e}".to_string();
        db.add(json!({
            "id": live, "reason": "r", "body_text": "{}", "routing_key": "q",
            "replay_claim_owner": format!("{}:tok", hostile("holder", db.backend)),
            "replay_claim_expires_at": "2099-01-01T00:00:00Z",
        }));
        ids.push(live.clone());
        for format in ["table", "markdown"] {
            let mut runs: Vec<Vec<String>> = vec![
                vec!["list".into()],
                vec!["list".into(), "--limit".into(), "2".into()],
                vec![
                    "aggregate".into(),
                    "--by".into(),
                    "reason,producer,schema_version,source_queue".into(),
                ],
                vec!["aggregate".into(), "--by".into(), "day".into()],
                vec!["claim".into(), live.clone()],
                vec![
                    "release".into(),
                    live.clone(),
                    "--token".into(),
                    "x:y".into(),
                ],
                vec!["replay".into(), live.clone(), "--yes".into()],
                vec!["show".into(), "no-such-\u{202e}id".into()],
                vec!["replay".into(), text_id.clone(), "--dry-run".into()],
                vec!["__ids".into()],
            ];
            for id in &ids {
                runs.push(vec!["show".into(), id.clone()]);
            }
            for args in runs {
                let mut c = db.cmd();
                c.args(["-o", format]).args(&args);
                let r = Raw::of(c);
                let what = format!("{backend:?} {format} {args:?}");
                r.assert_clean(&what);
                if format == "markdown" && ["list", "aggregate"].contains(&args[0].as_str()) {
                    assert_eq!(r.code, 0, "{what}: {}", r.err());
                    assert_markdown_table_intact(&r.out(), &what);
                }
            }
        }
        // The escapes are shown, visibly: the content is there, defused.
        let mut c = db.cmd();
        c.args(["-o", "table", "show", &text_id]);
        let r = Raw::of(c);
        assert_eq!(r.code, 0, "{}", r.err());
        let out = r.out();
        for shown in [
            "\\u{1b}]0;pwned\\u{7}",
            "\\u{202e}",
            "shown\\roverwritten",
            "\\u{9b}2J",
        ] {
            assert!(out.contains(shown), "{backend:?}: {shown} not in {out}");
        }
        assert!(out.contains("history:") && out.contains("hist<"), "{out}");
        // The worker's row: listed (lossily on SQLite), its history shown, nothing raw.
        let mut c = db.cmd();
        c.args(["-o", "table", "list", "--state", "claimed"]);
        let r = Raw::of(c);
        assert_eq!(r.code, 0, "{}", r.err());
        assert!(r.out().contains("w-\\u{1b}[2J"), "{}", r.out());
        // An error line that quotes hostile input is escaped too.
        let line = json!({"id": "e1", "reason": "r", "body_text": "x", "sha256": format!("00{}", ATTACKS.concat().replace('\0', ""))});
        let mut c = db.cmd();
        c.args(["import", "-"]).stdin(Stdio::piped());
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(
            &mut child.stdin.take().unwrap(),
            format!("{line}\n").as_bytes(),
        )
        .unwrap();
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(2));
        assert_clean(&o.stderr, "import error");
        assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
    }
}

#[test]
fn hostile_history_and_worker_rows_show_on_sqlite_despite_invalid_utf8() {
    let db = TestDb::migrated(Backend::Sqlite);
    let worker = add_worker_rows(&db);
    // JSON: the row is there, the invalid bytes escaped (JSON cannot carry them).
    let list = db.dlq(&["list"]).json();
    let row = list
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == worker.as_str())
        .unwrap();
    assert!(
        row["error"]
            .as_str()
            .unwrap()
            .starts_with("bad\\xff\\xfeworker<"),
        "{row}"
    );
    for format in ["table", "markdown"] {
        for args in [
            vec!["list"],
            vec!["aggregate", "--by", "producer,source_queue"],
        ] {
            let mut c = db.cmd();
            c.args(["-o", format]).args(&args);
            let r = Raw::of(c);
            assert_eq!(r.code, 0, "{args:?}: {}", r.err());
            r.assert_clean(&format!("{format} {args:?}"));
        }
    }
}

/// `show -o json` without the history (the one part an import does not carry).
fn shown(db: &TestDb, id: &str) -> Value {
    let mut v = db.show(id);
    v.as_object_mut().unwrap().remove("history");
    v
}

#[test]
fn json_export_and_import_keep_hostile_bytes_exact() {
    for (from, to) in [
        (Backend::Sqlite, Backend::Postgres),
        (Backend::Postgres, Backend::Sqlite),
    ] {
        let a = TestDb::migrated(from);
        // Rows bound for PostgreSQL cannot carry NUL in text; bodies can.
        let h = |tag: &str| hostile(tag, Backend::Postgres);
        let mut ids = Vec::new();
        for (name, body) in hostile_bodies() {
            let id = format!("x-{name}-\u{202e}");
            a.add(json!({
                "id": id, "reason": h("reason"), "attempts": 2,
                "headers": {"x-h": h("header"), h("key"): {"n": 1.5e300, "i": 12345678901234i64}},
                "event_id": h("event"), "error": h("error"), "producer": h("producer"),
                "schema_version": h("schema"), "source_queue": h("queue"),
                "exchange": h("exchange"), "routing_key": h("rk"),
                "last_replay_error": h("last"), "dead_lettered_at": "2026-01-02T03:04:05Z",
                "body_base64": b64(&body),
            }));
            // Exact in every JSON view.
            let s = a.show(&id);
            assert_eq!(s["error"], h("error"));
            assert_eq!(s["producer"], h("producer"));
            assert_eq!(s["headers"]["x-h"], h("header"));
            assert_eq!(
                base64::engine::general_purpose::STANDARD
                    .decode(s["body_base64"].as_str().unwrap())
                    .unwrap(),
                body
            );
            ids.push((id, body));
        }
        let list = a.dlq(&["list"]).json();
        assert!(
            list.as_array()
                .unwrap()
                .iter()
                .all(|r| r["error"] == h("error")),
            "{list}"
        );
        let agg = a.dlq(&["aggregate", "--by", "producer"]).json();
        assert_eq!(agg[0]["producer"], h("producer"), "{agg}");
        // Export (show -o json, one object per line) into the other store, and back.
        let b = TestDb::migrated(to);
        let c = TestDb::migrated(from);
        for (id, body) in &ids {
            let exported = a.show(id);
            b.add(exported.clone());
            assert_eq!(shown(&b, id), shown(&a, id), "{from:?} -> {to:?}");
            c.add(b.show(id));
            assert_eq!(
                shown(&c, id),
                shown(&a, id),
                "{from:?} -> {to:?} -> {from:?}"
            );
            let r = c.dlq(&["show", id]).json();
            assert_eq!(
                base64::engine::general_purpose::STANDARD
                    .decode(r["body_base64"].as_str().unwrap())
                    .unwrap(),
                *body
            );
        }
    }
}

/// Runs `cmd` with stderr on a pseudo-terminal (so that `dlq` shows progress), and
/// returns its exit code, its stdout and everything written to the terminal.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn with_terminal_stderr(mut cmd: Command) -> (i32, Vec<u8>, Vec<u8>) {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    // SAFETY: plain libc calls on a descriptor this function owns; every result checked.
    let (master, slave_path) = unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(m >= 0, "posix_openpt");
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
        let ws = libc::winsize {
            ws_row: 50,
            ws_col: 200,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        libc::ioctl(m, libc::TIOCSWINSZ, &ws);
        let path = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_string_lossy()
            .into_owned();
        (std::fs::File::from_raw_fd(m), path)
    };
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(slave_path)
        .unwrap();
    cmd.stderr(Stdio::from(slave)).stdout(Stdio::piped());
    let child = cmd.spawn().unwrap();
    drop(cmd); // closes this process's copy of the terminal's slave side
    let reader = std::thread::spawn(move || {
        let mut master = master;
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match master.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
        all
    });
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        reader.join().unwrap(),
    )
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn plan_progress_lines_escape_hostile_details() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_u_plan");
    let db = TestDb::migrated(Backend::Sqlite);
    let ok = "p-ok-\u{202e}";
    let taken = "p-taken-\u{2066}";
    let lost = "p-lost-\u{202e}";
    let gone = "p-gone-\u{202e}";
    db.add(letter(ok, &q, b"{}"));
    db.add(letter(taken, &q, b"{}"));
    db.add(letter(gone, &q, b"{}"));
    let mut unroutable = letter(lost, &q, b"{}");
    unroutable["routing_key"] = json!(unique("no_such_queue"));
    db.add(unroutable);
    let r = db.dlq(&["plan", "--allow-mixed"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // A plan whose ID is hostile, sealed as `dlq plan` seals one.
    let mut plan: dlq::plan::Plan = serde_json::from_str(&r.stdout).unwrap();
    plan.plan_id = format!("plan-{}", ATTACKS.concat());
    plan.seal();
    let dir = tempfile::tempdir().unwrap();
    let plan_file = dir.path().join("plan.json");
    std::fs::write(&plan_file, serde_json::to_string(&plan).unwrap()).unwrap();
    // After the review: someone else holds one (their name is hostile), one is deleted.
    let owner = hostile("owner", Backend::Sqlite).replace('\0', "");
    rt().block_on(async {
        let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
        sqlx::query("UPDATE dead_letters SET replay_claim_owner = ?1, replay_claim_expires_at = ?2 WHERE id = ?3")
            .bind(format!("{owner}:tok"))
            .bind(chrono::Utc::now().timestamp_millis() + 3_600_000)
            .bind(taken)
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("DELETE FROM dead_letters WHERE id = ?1")
            .bind(gone)
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    });
    for format in ["table", "markdown"] {
        let mut c = db.cmd();
        c.args([
            "-o",
            format,
            "replay",
            "--plan",
            plan_file.to_str().unwrap(),
            "--yes",
        ]);
        let (code, stdout, terminal) = with_terminal_stderr(c);
        let shown = String::from_utf8_lossy(&terminal).into_owned();
        assert!(code >= 3, "{format}: exit {code}: {shown}");
        assert_clean(&stdout, &format!("{format} plan summary"));
        // The progress bar draws with its own \r and CSI sequences; none of the hostile
        // ones may reach the terminal.
        for raw in [
            "\u{7}",
            "\u{1b}]",
            "\u{1b}[41m",
            "\u{1b}[2J",
            "\u{9b}",
            "\u{202e}",
            "\u{2066}",
            "\0",
            "\u{7f}",
            "\u{8}",
            "\roverwritten",
        ] {
            assert!(
                !shown.contains(raw),
                "{format}: raw {raw:?} on the terminal: {}",
                shown.escape_debug()
            );
        }
        assert!(
            shown.contains("owner<\\u{1b}]0;pwned\\u{7}"),
            "{format}: the hostile holder is shown escaped: {}",
            shown.escape_debug()
        );
        assert!(
            shown.contains("p-gone-\\u{202e}"),
            "{}",
            shown.escape_debug()
        );
        let summary = String::from_utf8_lossy(&stdout);
        assert!(summary.contains("plan plan-\\u{1b}]0;pwned"), "{summary}");
    }
    assert_eq!(
        rabbit.drain(&q).len(),
        1,
        "only the reviewed, free one went out"
    );
}

// ---------------------------------------------------------------------------------------
// Secrets in URLs

/// Every byte not an ASCII letter or digit as %XX: how a password goes into a URL.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The forms of `pw` that must not appear: as given, percent-encoded, and decoded (the
/// form a driver would use when the URL held it raw).
fn forms(pw: &str) -> Vec<String> {
    let decoded = url::form_urlencoded::parse(format!("x={}", pw.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let mut v = vec![pw.to_string(), encode(pw), decoded];
    v.retain(|s| s.len() >= 6);
    v.dedup();
    v
}

#[track_caller]
fn assert_no_password(r: &Raw, pw: &str, what: &str) {
    let all = format!("{}{}", r.out(), r.err());
    for f in forms(pw) {
        assert!(
            !all.contains(&f),
            "{what}: {f:?} leaked:\n{}",
            all.escape_debug()
        );
    }
}

/// The PostgreSQL URL shapes the docs accept, and broken ones, for database `db`.
/// `true`: the shape is broken whatever the password.
fn pg_shapes(pw: &str, db: &str) -> Vec<(String, bool)> {
    let enc = encode(pw);
    vec![
        (
            format!("postgres://postgres:{enc}@127.0.0.1:5432/{db}"),
            false,
        ),
        (
            format!("postgresql://postgres:{pw}@127.0.0.1:5432/{db}"),
            false,
        ),
        (
            format!("postgres://postgres@127.0.0.1:5432/{db}?password={enc}"),
            false,
        ),
        (
            format!("postgres://postgres@127.0.0.1:5432/{db}?sslmode=disable&password={pw}"),
            false,
        ),
        (format!("postgres:postgres:{pw}@127.0.0.1:5432/{db}"), true),
        (
            format!("postgres://postgres:{pw}@127.0.0.1:54x2/{db}"),
            true,
        ),
        (
            format!("postgres://postgres:{enc}@127.0.0.1:5432/{db}?sslmode=bogus"),
            true,
        ),
    ]
}

/// The AMQP URL shapes, and broken ones (every password here is wrong for the broker).
fn amqp_shapes(pw: &str) -> Vec<(String, bool)> {
    let enc = encode(pw);
    vec![
        (format!("amqp://guest:{enc}@127.0.0.1:5672/%2f"), false),
        (format!("amqp://guest:{pw}@127.0.0.1:5672/%2f"), false),
        (format!("amqp://guest:{enc}@127.0.0.1:5672"), false),
        (format!("amqp:guest:{pw}@127.0.0.1"), true),
        (format!("amqp://guest:{pw}@127.0.0.1:56x2/%2f"), true),
        (format!("amqp://guest:{enc}@127.0.0.1:5672/"), true),
        (
            format!("amqp://guest:{enc}@127.0.0.1:5672/%2f?password={enc}"),
            false,
        ),
    ]
}

/// Where a URL comes from.
#[derive(Debug, Clone, Copy)]
enum Source {
    Env,
    Flag,
    File,
}

/// Everything needed to run each command that opens the database or dials the broker.
struct Fixture {
    db: TestDb,
    dir: tempfile::TempDir,
    plan: String,
    import: String,
}

impl Fixture {
    fn new() -> Fixture {
        let db = TestDb::migrated(Backend::Postgres);
        db.add(letter("u1", "dlq_u_none", b"{}"));
        let dir = tempfile::tempdir().unwrap();
        let plan = dir.path().join("plan.json");
        let r = db.dlq(&["plan"]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        std::fs::write(&plan, &r.stdout).unwrap();
        let import = dir.path().join("import.jsonl");
        std::fs::write(&import, format!("{}\n", letter("u2", "dlq_u_none", b"{}"))).unwrap();
        Fixture {
            plan: plan.display().to_string(),
            import: import.display().to_string(),
            db,
            dir,
        }
    }

    fn db_name(&self) -> String {
        self.db.url.rsplit('/').next().unwrap().to_string()
    }

    /// Every command that opens the database.
    fn db_commands(&self) -> Vec<Vec<String>> {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        vec![
            s(&["list"]),
            s(&["aggregate", "--by", "reason"]),
            s(&["show", "u1"]),
            s(&["claim", "u1"]),
            s(&["release", "u1", "--token", "tester:x"]),
            s(&["plan"]),
            s(&["import", &self.import, "--skip-existing"]),
            s(&["migrate"]),
            s(&["__ids"]),
            s(&["replay", "u1", "--dry-run"]),
            s(&["replay", "--plan", &self.plan, "--yes"]),
        ]
    }

    /// Every command that dials the broker (or checks its URL first).
    fn amqp_commands(&self) -> Vec<Vec<String>> {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        vec![
            s(&["replay", "u1", "--yes"]),
            s(&["replay", "u1", "--dry-run"]),
            s(&["replay", "--plan", &self.plan, "--yes"]),
        ]
    }

    /// Runs `args` with the database URL (`amqp == false`) or the AMQP URL from `source`.
    fn run(&self, amqp: bool, url: &str, source: Source, extra: &[&str], args: &[String]) -> Raw {
        let mut c = self.db.cmd();
        c.env("DLQ_CONNECT_TIMEOUT", "2s");
        let (flag, env) = if amqp {
            ("--amqp-url", "DLQ_AMQP_URL")
        } else {
            ("--database-url", "DLQ_DATABASE_URL")
        };
        match source {
            Source::Env => {
                c.env(env, url);
            }
            Source::Flag => {
                c.arg(format!("{flag}={url}"));
            }
            Source::File => {
                let f = self.dir.path().join(unique("url"));
                std::fs::write(&f, format!("{url}\n")).unwrap();
                c.arg(format!("{flag}-file")).arg(&f);
            }
        }
        c.args(extra).args(args);
        Raw::of(c)
    }
}

#[track_caller]
fn check_url_run(r: &Raw, pw: &str, broken: bool, what: &str) {
    assert_no_password(r, pw, what);
    let err = r.err();
    let errors = err.lines().filter(|l| l.starts_with("dlq: error")).count();
    assert!(
        errors <= 1,
        "{what}: {errors} error lines: {}",
        err.replace(pw, "***")
    );
    if broken {
        assert_ne!(r.code, 0, "{what}: a broken URL was accepted");
    }
}

#[test]
fn passwords_in_every_url_shape_stay_out_of_every_stream() {
    let fx = Fixture::new();
    let db = fx.db_name();
    // Each shape the issue found, each password character that needs encoding.
    for pw in ["PASS/WORD-Canary1", "Canary2@p#w?d%x y"] {
        // Every command plainly; the refusal of --require-tls and -vv's logs on a few.
        let with_extras = |args: &[String]| {
            ["list", "migrate", "--plan"]
                .iter()
                .any(|a| args.contains(&a.to_string()))
                || args == fx.amqp_commands()[0].as_slice()
        };
        for (url, broken) in pg_shapes(pw, &db) {
            for args in fx.db_commands() {
                for extra in [&[][..], &["--require-tls"][..], &["-vv"][..]] {
                    if !extra.is_empty() && !with_extras(&args) {
                        continue;
                    }
                    let r = fx.run(false, &url, Source::Env, extra, &args);
                    check_url_run(&r, pw, broken, &format!("{url:?} {extra:?} {args:?}"));
                }
            }
        }
        for (url, broken) in amqp_shapes(pw) {
            for args in fx.amqp_commands() {
                for extra in [&[][..], &["--require-tls"][..], &["-vv"][..]] {
                    if !extra.is_empty() && !with_extras(&args) {
                        continue;
                    }
                    let r = fx.run(true, &url, Source::Env, extra, &args);
                    check_url_run(&r, pw, broken, &format!("{url:?} {extra:?} {args:?}"));
                }
            }
        }
    }
    // What the errors say: which part is wrong, at most scheme and host.
    let pw = "PASS/WORD-Canary3";
    let cases = [
        (
            false,
            format!("postgres://root:{pw}@127.0.0.1:5432/test"),
            "an `@` after the host",
        ),
        (
            false,
            format!("postgres:root:{pw}@127.0.0.1:5432/x"),
            "no `//` after the scheme",
        ),
        (
            false,
            "postgres://root:Canary4@127.0.0.1:5x/x".to_string(),
            "port is not a number",
        ),
        (
            true,
            format!("amqp:guest:{pw}@127.0.0.1"),
            "no `//` after the scheme",
        ),
        (
            true,
            format!("amqp://guest:{pw}@127.0.0.1:5672/%2f"),
            "an `@` after the host",
        ),
    ];
    for (amqp, url, says) in cases {
        for source in [Source::Env, Source::Flag, Source::File] {
            let args = if amqp {
                fx.amqp_commands()[0].clone()
            } else {
                vec!["list".to_string()]
            };
            let r = fx.run(amqp, &url, source, &[], &args);
            assert_eq!(r.code, 2, "{url:?} {source:?}: {}", r.err());
            assert!(r.err().contains(says), "{url:?}: {}", r.err());
            assert_no_password(&r, pw, &url);
            assert_no_password(&r, "Canary4", &url);
        }
    }
    // A parsed URL is shown with its password and password= parameter replaced.
    let url = format!("postgres://postgres@127.0.0.1:5432/{db}?password=Canary5pw");
    let r = fx.run(
        false,
        &url,
        Source::Env,
        &["-o", "table"],
        &["migrate".to_string()],
    );
    assert_eq!(r.code, 0, "{}", r.err());
    assert!(r.out().contains("?password=***"), "{}", r.out());
    let r = fx.run(
        false,
        &url,
        Source::Env,
        &["--require-tls"],
        &["list".to_string()],
    );
    assert_eq!(r.code, 2);
    assert!(
        r.err().contains("?password=***") && !r.err().contains("Canary5pw"),
        "{}",
        r.err()
    );
}

#[test]
fn generated_passwords_never_leak_through_any_command() {
    let fx = Fixture::new();
    let db = fx.db_name();
    let db_commands = fx.db_commands();
    let amqp_commands = fx.amqp_commands();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let password = "[A-Za-z0-9/@#?% ]{4,12}".prop_map(|s| format!("Pw{s}Zq"));
    let pick = (
        0..7usize,
        0..7usize,
        0..11usize,
        0..3usize,
        0..3usize,
        0..3usize,
    );
    runner
        .run(
            &(password, pick),
            |(pw, (pg, amqp, cmd, acmd, source, extra))| {
                let source = [Source::Env, Source::Flag, Source::File][source];
                let extra: &[&str] = [&[][..], &["-vv"][..], &["--require-tls"][..]][extra];
                let (url, broken) = pg_shapes(&pw, &db)[pg].clone();
                let args = &db_commands[cmd % db_commands.len()];
                let r = fx.run(false, &url, source, extra, args);
                check_url_run(
                    &r,
                    &pw,
                    broken,
                    &format!("{url:?} {source:?} {extra:?} {args:?}"),
                );
                let (url, broken) = amqp_shapes(&pw)[amqp].clone();
                let args = &amqp_commands[acmd];
                let r = fx.run(true, &url, source, extra, args);
                check_url_run(
                    &r,
                    &pw,
                    broken,
                    &format!("{url:?} {source:?} {extra:?} {args:?}"),
                );
                Ok(())
            },
        )
        .unwrap();
}

// ---------------------------------------------------------------------------------------
// Flag over environment, files readable by others

#[test]
fn file_flags_beat_variables_and_plain_flags_beat_file_variables() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_u_flags");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("f1", &q, b"{}"));
    db.add(letter("f2", &q, b"{}"));
    let dir = tempfile::tempdir().unwrap();
    let db_file = dir.path().join("db-url");
    std::fs::write(&db_file, format!("{}\n", db.url)).unwrap();
    let amqp_file = dir.path().join("amqp-url");
    std::fs::write(&amqp_file, format!("{AMQP}\n")).unwrap();
    let nowhere = "postgres://nobody@127.0.0.1:1/none";
    let bad_amqp = "amqp://guest:wrong@127.0.0.1:5672/%2f";
    let missing = dir.path().join("missing");
    let (dbf, af, mf) = (
        db_file.to_str().unwrap(),
        amqp_file.to_str().unwrap(),
        missing.to_str().unwrap(),
    );
    // --database-url-file over DLQ_DATABASE_URL, --amqp-url-file over DLQ_AMQP_URL.
    let r = db.dlq_env(
        &[
            "--database-url-file",
            dbf,
            "--amqp-url-file",
            af,
            "replay",
            "f1",
            "--yes",
        ],
        &[("DLQ_DATABASE_URL", nowhere), ("DLQ_AMQP_URL", bad_amqp)],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    // --database-url over DLQ_DATABASE_URL_FILE, --amqp-url over DLQ_AMQP_URL_FILE.
    let r = db.dlq_env(
        &[
            "--database-url",
            &db.url,
            "--amqp-url",
            AMQP,
            "replay",
            "f2",
            "--yes",
        ],
        &[("DLQ_DATABASE_URL_FILE", mf), ("DLQ_AMQP_URL_FILE", mf)],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(rabbit.drain(&q).len(), 2);
    // Flags after the subcommand count the same.
    let r = db.dlq_env(
        &["list", "--database-url-file", dbf],
        &[("DLQ_DATABASE_URL", nowhere)],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    // Both variables: the file wins.
    let r = db.dlq_env(
        &["list"],
        &[
            ("DLQ_DATABASE_URL", nowhere),
            ("DLQ_DATABASE_URL_FILE", dbf),
        ],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    // Both flags typed: one clear error.
    for (a, b) in [
        (
            ["--database-url", db.url.as_str()],
            ["--database-url-file", dbf],
        ),
        (["--amqp-url", AMQP], ["--amqp-url-file", af]),
    ] {
        let r = db.dlq(&[a[0], a[1], b[0], b[1], "list"]);
        assert_eq!(r.code, 2, "{}", r.all());
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
        assert!(
            r.stderr.starts_with("dlq: error: ")
                && r.stderr.contains(a[0])
                && r.stderr.contains(b[0]),
            "{}",
            r.stderr
        );
    }
}

#[cfg(unix)]
#[test]
fn files_holding_a_password_warn_when_others_can_read_them() {
    use std::os::unix::fs::PermissionsExt;
    let pg = TestDb::migrated(Backend::Postgres);
    let dir = tempfile::tempdir().unwrap();
    let chmod = |p: &std::path::Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let with_pw = pg.url.replace("postgres@", "postgres:Canary6pw@");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[profiles.p]\ndatabase_url = \"{with_pw}\"\noperator = \"alice\"\n"),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    for (mode, warns) in [(0o644, true), (0o640, true), (0o600, false), (0o400, false)] {
        chmod(&config, mode);
        let mut c = pg.cmd();
        c.env_remove("DLQ_DATABASE_URL");
        let r = Run::from(
            c.args(["--config", cfg, "--profile", "p", "list"])
                .output()
                .unwrap(),
        );
        assert_eq!(r.code, 0, "{}", r.all());
        assert!(!r.all().contains("Canary6pw"));
        let warning: Vec<&str> = r
            .stderr
            .lines()
            .filter(|l| l.starts_with("dlq: warning"))
            .collect();
        if warns {
            assert_eq!(warning.len(), 1, "{mode:o}: {}", r.stderr);
            assert!(
                warning[0].contains(cfg) && warning[0].contains(&format!("chmod 600 {cfg}")),
                "{}",
                warning[0]
            );
        } else {
            assert!(warning.is_empty(), "{mode:o}: {}", r.stderr);
        }
    }
    // A URL file: warned about when it holds a password, not otherwise.
    let url_file = dir.path().join("db url");
    for (content, warns) in [(with_pw.as_str(), true), (pg.url.as_str(), false)] {
        std::fs::write(&url_file, content).unwrap();
        chmod(&url_file, 0o644);
        let r = pg.dlq(&[
            "--database-url-file",
            url_file.to_str().unwrap(),
            "claim",
            "nope",
        ]);
        assert_eq!(r.code, 4, "{}", r.all());
        let warnings = r
            .stderr
            .lines()
            .filter(|l| l.starts_with("dlq: warning"))
            .count();
        assert_eq!(warnings, usize::from(warns), "{content}: {}", r.stderr);
        if warns {
            assert!(
                r.stderr.contains("chmod 600 '"),
                "a path with a space is quoted: {}",
                r.stderr
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Output integrity

#[test]
fn output_that_cannot_be_written_is_an_error() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("o1", "q", b"{\"a\":1}"));
    for args in [
        vec!["plan"],
        vec!["show", "o1", "-o", "json"],
        vec!["show", "o1", "-o", "table"],
        vec!["list"],
        vec!["list", "-o", "table"],
        vec!["list", "-o", "markdown"],
        vec!["aggregate", "--by", "reason"],
        vec!["migrate"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let r = Run::from(db.cmd().args(&args).stdout(full).output().unwrap());
        assert_eq!(r.code, 1, "{args:?}: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.starts_with("dlq: error: ") && r.stderr.contains("No space left"),
            "{args:?}: {}",
            r.stderr
        );
    }
}

#[test]
fn a_closed_pipe_ends_the_command_at_once_and_quietly() {
    let db = TestDb::migrated(Backend::Sqlite);
    for i in 0..3 {
        db.add(letter(&format!("c{i}"), "q", b"{}"));
    }
    // list --watch: the reader goes away while dlq waits for its next round.
    let mut child = db
        .cmd()
        .args(["list", "--watch", "30s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with("[{"), "{first}");
    let closed = Instant::now();
    drop(stdout);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if closed.elapsed() > Duration::from_secs(1) {
            let _ = child.kill();
            panic!("list --watch still runs 1s after its reader went away");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(0));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(err, "", "quietly");

    // The same as an operator types it.
    let started = Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' list --watch | head -1",
            env!("CARGO_BIN_EXE_dlq")
        ))
        .envs(db.cmd().get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");

    // A one-shot command whose reader is already gone: no "Broken pipe" error.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' list -o table | true; '{}' show c1 -o json | true",
            env!("CARGO_BIN_EXE_dlq"),
            env!("CARGO_BIN_EXE_dlq")
        ))
        .envs(db.cmd().get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

// ---------------------------------------------------------------------------------------
// Fuzzing the parsers of untrusted bytes: no panic, bounded memory.

mod counting {
    //! An allocator that counts this thread's live bytes and their peak, to bound what a
    //! parser allocates for its input.
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    pub struct Counting;

    thread_local! {
        static LIVE: Cell<isize> = const { Cell::new(0) };
        static PEAK: Cell<isize> = const { Cell::new(0) };
    }

    fn track(delta: isize) {
        let _ = LIVE.try_with(|l| {
            let v = l.get() + delta;
            l.set(v);
            let _ = PEAK.try_with(|p| {
                if v > p.get() {
                    p.set(v)
                }
            });
        });
    }

    // SAFETY: every call is forwarded to the system allocator unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            // SAFETY: forwarded as is.
            let p = unsafe { System.alloc(l) };
            if !p.is_null() {
                track(l.size() as isize);
            }
            p
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            // SAFETY: forwarded as is.
            unsafe { System.dealloc(p, l) };
            track(-(l.size() as isize));
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            // SAFETY: forwarded as is.
            let q = unsafe { System.realloc(p, l, new) };
            if !q.is_null() {
                track(new as isize - l.size() as isize);
            }
            q
        }
    }

    /// Runs `f` and returns the most bytes it held at once (on this thread).
    pub fn peak<R>(f: impl FnOnce() -> R) -> (R, usize) {
        let start = LIVE.with(|l| l.get());
        PEAK.with(|p| p.set(start));
        let r = f();
        let peak = PEAK.with(|p| p.get());
        (r, (peak - start).max(0) as usize)
    }
}

#[global_allocator]
static ALLOC: counting::Counting = counting::Counting;

/// What a parser may hold for an input of `len` bytes.
fn budget(len: usize) -> usize {
    64 * len + 256 * 1024
}

/// A large body is held once while its line is read: the decoded body plus the parser's
/// string buffer, never the base64 text again as a JSON value (nor `body_text` beside it).
#[test]
fn import_holds_a_large_body_once_beside_the_parsers_buffer() {
    // 3 MiB: exactly 4 MiB of base64, a size the parser's buffer grows to exactly.
    let body = "0123456789abcdef".repeat(3 * 65536);
    let b64 = base64::engine::general_purpose::STANDARD.encode(&body);
    assert_eq!(b64.len(), 4 << 20);
    let export = json!({"id": "a", "reason": "r", "body_base64": b64});
    let show = json!({"id": "a", "reason": "r", "body_base64": b64, "body_text": body});
    for line in [export, show] {
        let line = format!("{line}\n");
        let (rows, used) = counting::peak(|| dlq::import::read_lines(line.as_bytes()));
        assert_eq!(rows.unwrap()[0].body, body.as_bytes());
        let bound = b64.len() + body.len() + (256 << 10);
        assert!(used <= bound, "{used} bytes held, more than {bound}");
    }
}

/// JSON values, nested, with hostile strings: the shape of import lines, plans, headers.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::from),
        "[a-z_]{1,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("id".to_string()),
                    Just("reason".to_string()),
                    Just("body_base64".to_string()),
                    Just("body_text".to_string()),
                    Just("headers".to_string()),
                    Just("items".to_string()),
                    Just("sha256".to_string()),
                    Just("attempts".to_string()),
                    Just("dead_lettered_at".to_string()),
                    any::<String>(),
                ],
                inner,
                0..8
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn fuzz_config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(fuzz_config())]

    #[test]
    fn fuzz_import_lines(bytes in prop::collection::vec(any::<u8>(), 0..4096), lines in prop::collection::vec(json_value(), 0..6)) {
        let (_, used) = counting::peak(|| dlq::import::read_lines(&bytes[..]));
        prop_assert!(used <= budget(bytes.len()), "{used} bytes for {}", bytes.len());
        let text: String = lines.iter().map(|v| format!("{v}\n")).collect();
        let (_, used) = counting::peak(|| dlq::import::read_lines(text.as_bytes()));
        prop_assert!(used <= budget(text.len()), "{used} bytes for {}", text.len());
    }

    #[test]
    fn fuzz_import_lines_that_almost_parse(id in any::<String>(), reason in any::<String>(), b64 in "[A-Za-z0-9+/=%]{0,64}", sha in any::<String>(), attempts in any::<i64>(), at in any::<String>(), headers in json_value()) {
        let line = json!({"id": id, "reason": reason, "body_base64": b64, "sha256": sha, "attempts": attempts, "dead_lettered_at": at, "headers": headers});
        let _ = dlq::import::read_lines(format!("{line}\n").as_bytes());
        let line = json!({"id": id, "reason": reason, "body_text": b64, "headers_json": headers.to_string()});
        let _ = dlq::import::read_lines(format!("{line}\n").as_bytes());
    }

    #[test]
    fn fuzz_plan_files(bytes in prop::collection::vec(any::<u8>(), 0..4096), value in json_value(), ids in prop::collection::vec(any::<String>(), 0..8)) {
        let parse = |b: &[u8]| {
            if let Ok(plan) = serde_json::from_slice::<dlq::plan::Plan>(b) {
                for item in &plan.items {
                    let _ = dlq::model::validate_id(&item.id);
                }
            }
        };
        let (_, used) = counting::peak(|| parse(&bytes));
        prop_assert!(used <= budget(bytes.len()));
        let text = value.to_string();
        let (_, used) = counting::peak(|| parse(text.as_bytes()));
        prop_assert!(used <= budget(text.len()));
        let items: Vec<Value> = ids.iter().map(|id| json!({"id": id, "sha256": id})).collect();
        let plan = json!({"plan_id": "p", "created_at": "2026-01-01T00:00:00Z", "created_by": "x",
            "filters": {"reason": null, "producer": null, "schema_version": null, "source_queue": null,
                        "since": null, "until": null, "state": "pending"},
            "allow_mixed": false, "mix": {}, "count": ids.len(), "items": items});
        parse(plan.to_string().as_bytes());
    }

    #[test]
    fn fuzz_urls(raw in any::<String>(), pw in "[A-Za-z0-9/@#?% ]{6,16}", host in "[a-z0-9.:\\[\\]]{0,20}", tail in "[/?#=&a-z0-9%@:]{0,24}") {
        // (Constructing one also grows the process's list of secrets to scrub, which
        // thousands of fuzz cases fill: that part is not measured.)
        let u = dlq::secret::SecretUrl::new(raw.clone());
        let (_, used) = counting::peak(|| {
            let _ = (u.problem(), u.to_string(), u.has_password(), u.scheme(), format!("{u:?}"));
            let _ = dlq::publisher::parse_amqp_url(&u);
        });
        prop_assert!(used <= budget(raw.len()));
        // However a password is placed, no rendering of the URL shows it.
        let pw = format!("Pw{pw}Zq");
        for scheme in ["postgres", "postgresql", "amqp", "amqps", "sqlite", "mysql"] {
            for url in [
                format!("{scheme}://user:{pw}@{host}{tail}"),
                format!("{scheme}:user:{pw}@{host}{tail}"),
                format!("{scheme}://user@{host}{tail}?password={pw}"),
                format!("{scheme}://{host}/db?a=1&sslpassword={pw}&b=2"),
            ] {
                let u = dlq::secret::SecretUrl::new(url.clone());
                let shown = format!("{u} {u:?} {}", u.problem().unwrap_or(""));
                prop_assert!(!shown.contains(&pw), "{url:?} shown as {shown:?}");
                let _ = dlq::publisher::parse_amqp_url(&u).map_err(|e| {
                    assert!(!e.to_string().contains(&pw), "{url:?}: {e}");
                });
            }
        }
    }

    #[test]
    fn fuzz_durations_and_times(s in any::<String>(), n in any::<u64>(), unit in "(ns|us|ms|s|m|h|d|w|y|M|)") {
        let now = chrono::Utc::now();
        for t in [s.clone(), format!("{n}{unit}"), format!("{n}{unit}{n}{unit}"), format!("-{n}{unit}")] {
            let _ = dlq::timeparse::parse_duration(&t);
            let _ = dlq::timeparse::parse_time(&t, now);
            let _ = dlq::timeparse::duration_arg(&t);
            let _ = dlq::timeparse::time_arg(&t);
        }
    }

    #[test]
    fn fuzz_header_json(s in any::<String>(), value in json_value(), depth in 0usize..300) {
        let _ = dlq::model::parse_headers(&s);
        let nested = format!("{}{}{}", "{\"a\":[".repeat(depth), value, "]}".repeat(depth));
        let (_, used) = counting::peak(|| {
            for text in [value.to_string(), nested.clone(), format!("{{\"h\":{value}}}")] {
                let h = dlq::model::parse_headers(&text);
                let out = dlq::publisher::replay_headers(&h, "id", "reason", "op");
                let _ = dlq::publisher::to_field_table(&out);
            }
        });
        prop_assert!(used <= budget(nested.len() * 3));
    }

    #[test]
    fn fuzz_the_sanitizer(s in any::<String>(), hostile in prop::collection::vec(prop::sample::select(ATTACKS.to_vec()), 0..6)) {
        let s = format!("{s}{}", hostile.concat());
        let line = dlq::sanitize::line(&s);
        prop_assert!(!line.chars().any(is_raw_control));
        prop_assert!(line.len() <= 10 * s.len() + 16);
        let block = dlq::sanitize::block(&s);
        prop_assert!(!block.chars().any(is_raw_control));
        let md = dlq::sanitize::markdown_cell(&s);
        prop_assert_eq!(unescaped_pipes(&md), 0);
        prop_assert!(!md.chars().any(is_raw_control));
    }
}
