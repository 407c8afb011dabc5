//! Hostile rows (terminal escapes, invalid UTF-8, bidi controls) never reach a terminal
//! raw: tables, JSON, Markdown, history, progress lines.

use super::*;
use crate::common::*;
use base64::Engine;
use serde_json::{json, Value};
use std::io::Read;
use std::process::{Command, Stdio};

// ---------------------------------------------------------------------------------------
// Hostile content

/// A hostile text tagged with the column it goes to. No text field holds NUL (PostgreSQL
/// TEXT cannot, and `import` refuses it on both stores): bodies and headers carry it.
fn hostile(tag: &str, _backend: Backend) -> String {
    format!("{tag}<{}>", ATTACKS.concat()).replace('\0', "")
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
