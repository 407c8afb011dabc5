//! Large bodies: byte-for-byte through import, show and replay on both stores, `show`
//! output unchanged by streaming it, and sqlx's slow-statement log kept off a default
//! run's stderr. Memory use itself is shown by `benches/run.py --only bigbody`.

use crate::common::*;
use serde_json::{json, Value};

fn sha256(bytes: &[u8]) -> String {
    dlq::model::sha256_hex(bytes)
}

/// 8 MiB that are not UTF-8 (every byte value, 0xff and lone continuation bytes included).
fn binary_body() -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..8 * MIB)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if i % 4096 == 0 {
                0xff
            } else {
                (x >> 24) as u8
            }
        })
        .collect()
}

/// About 8 MiB of UTF-8 JSON with characters JSON must escape and some it need not.
fn json_body() -> Vec<u8> {
    let items: Vec<Value> = (0..110_000)
        .map(|i| json!({"n": i, "note": format!("café \"{i}\"\n\t\\ ✓ \u{7f}"), "pad": "x".repeat(32)}))
        .collect();
    let body = serde_json::to_vec(&json!({"event_id": "evt-big", "items": items})).unwrap();
    assert!(body.len() > 8 * MIB, "{}", body.len());
    body
}

/// One import line: the body as base64 (as `export` writes it) or as text only.
fn line(id: &str, queue: &str, body: &[u8], as_text: bool) -> String {
    let mut v = json!({"id": id, "reason": "poison_message", "attempts": 1,
                       "headers": {"x-producer": "big"}, "source_queue": queue});
    if as_text {
        v["body_text"] = json!(std::str::from_utf8(body).unwrap());
    } else {
        v["body_base64"] = json!(b64(body));
    }
    format!("{v}\n")
}

/// `show -o json` of `id` holds exactly `body`.
fn assert_shows(db: &TestDb, id: &str, body: &[u8]) -> String {
    let r = db.dlq(&["show", id]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = r.json();
    assert!(
        unb64(&v["body_base64"]) == body,
        "{id}: body_base64 differs"
    );
    match std::str::from_utf8(body) {
        Ok(text) => assert!(v["body_text"].as_str() == Some(text), "{id}: body_text"),
        Err(_) => assert!(
            v.get("body_text").is_none(),
            "{id}: body_text of a binary body"
        ),
    }
    assert_eq!(v["sha256"], sha256(body));
    assert_eq!(v["body_bytes"], body.len());
    r.stdout
}

/// On PostgreSQL both bodies are read in slices (over 1 MiB): the binary one is exactly
/// one 8 MiB slice, the JSON one a little more (a second, short slice).
#[test]
fn multi_mib_bodies_round_trip_through_import_show_and_replay_on_both_stores() {
    let bodies = [("bin", binary_body(), false), ("json", json_body(), true)];
    let mut rabbit = Rabbit::new();
    let queue = rabbit.queue("dlq_big");
    let pg = TestDb::migrated(Backend::Postgres);
    let sqlite = TestDb::migrated(Backend::Sqlite);
    for (from, to) in [(&pg, &sqlite), (&sqlite, &pg)] {
        for (kind, body, as_text) in &bodies {
            let id = format!("{kind}-from-{:?}", from.backend);
            let r = from.dlq_stdin(
                &["import", "-"],
                line(&id, &queue, body, *as_text).as_bytes(),
            );
            assert_eq!(r.code, 0, "{}", r.stderr);
            let shown = assert_shows(from, &id, body);
            // `show -o json` output (body_base64 and, for text, body_text too) imports
            // into the other store unchanged.
            let r = to.dlq_stdin(&["import", "-"], shown.as_bytes());
            assert_eq!(r.code, 0, "{}", r.stderr);
            assert_shows(to, &id, body);
            for db in [from, to] {
                let r = db.dlq(&["replay", &id, "--yes"]);
                assert_eq!(r.code, 0, "{:?}: {}", db.backend, r.all());
                assert_eq!(r.json()["outcome"], "replayed");
                let got = rabbit.drain(&queue);
                assert_eq!(got.len(), 1);
                assert!(got[0].body == *body, "{id} from {:?}: body", db.backend);
                assert_eq!(got[0].message_id.is_some(), *as_text);
            }
        }
    }
}

#[test]
fn a_show_line_whose_body_fields_disagree_is_refused_whichever_comes_first() {
    let db = TestDb::migrated(Backend::Sqlite);
    let body = binary_body();
    let text = "x".repeat(MIB);
    for (n, doc) in [
        format!(
            r#"{{"id":"a","reason":"r","body_base64":"{}","body_text":"{text}"}}"#,
            b64(&body)
        ),
        format!(
            r#"{{"id":"a","reason":"r","body_text":"{text}","body_base64":"{}"}}"#,
            b64(&body)
        ),
        format!(
            r#"{{"id":"a","reason":"r","body_base64":"{}","body_base64":"{}"}}"#,
            b64(b"x"),
            b64(b"x")
        ),
    ]
    .iter()
    .enumerate()
    {
        let r = db.dlq_stdin(&["import", "-"], doc.as_bytes());
        assert_eq!(r.code, 2, "{n}: {}", r.all());
        let field = if n < 2 {
            "body_text: differs"
        } else {
            "body_base64: appears twice"
        };
        assert!(
            r.stderr
                .starts_with(&format!("dlq: error: line 1: field {field}")),
            "{n}: {}",
            r.stderr
        );
    }
    assert_eq!(db.scalar("SELECT count(*) FROM dead_letters"), 0);
}

/// `show` output of two small rows as the release before streaming printed it (`<RLO>`:
/// U+202E, which the compiler refuses in a literal).
const SHOW_JSON: &str = r#"{
  "id": "small-json",
  "reason": "poison_message",
  "attempts": 3,
  "replayed_at": null,
  "replay_claim_owner": null,
  "replay_claim_expires_at": null,
  "last_replay_error": null,
  "event_id": "e-1",
  "error": "ValueError: bad",
  "producer": "svc",
  "schema_version": null,
  "source_queue": "orders",
  "exchange": null,
  "routing_key": null,
  "dead_lettered_at": "2026-01-02T03:04:05Z",
  "replay_attempt_at": null,
  "discarded_at": null,
  "discard_note": null,
  "revision_of": null,
  "state": "pending",
  "headers": {
    "n": 1.5,
    "x-producer": "svc"
  },
  "body_base64": "eyJldmVudF9pZCI6ICJlLTEiLCAiYW1vdW50IjogMTIuNSwgIm5vdGUiOiAiY2Fmw6kgXCJxXCJcbuKAriJ9",
  "body_text": "{\"event_id\": \"e-1\", \"amount\": 12.5, \"note\": \"café \\\"q\\\"\\n<RLO>\"}",
  "sha256": "b6b900c5ce6d96c01a4d8ab8c3300526d80ffcf7c6791fb0cfc0136d2fe6db22",
  "body_bytes": 63,
  "settling_until": null,
  "settling": null,
  "revised_as": null,
  "history": []
}
"#;

const SHOW_BIN_JSON: &str = r#"{
  "id": "small-bin",
  "reason": "retries_exhausted",
  "attempts": 5,
  "replayed_at": null,
  "replay_claim_owner": null,
  "replay_claim_expires_at": null,
  "last_replay_error": null,
  "event_id": null,
  "error": null,
  "producer": null,
  "schema_version": null,
  "source_queue": null,
  "exchange": "ex",
  "routing_key": "rk",
  "dead_lettered_at": "2026-01-02T03:04:06Z",
  "replay_attempt_at": null,
  "discarded_at": null,
  "discard_note": null,
  "revision_of": null,
  "state": "pending",
  "headers": {},
  "body_base64": "AAEC//6AQUIKGwABAv/+gEFCChsAAQL//oBBQgobAAEC//6AQUIKGwABAv/+gEFCChsAAQL//oBBQgobAAEC//6AQUIKGw==",
  "sha256": "eba94c659d9ccc94f46a586a384757f7cfe46d2eca910bc5046231b38312515c",
  "body_bytes": 70,
  "settling_until": null,
  "settling": null,
  "revised_as": null,
  "history": []
}
"#;

/// The table view: what identifies the record and its sizes first, the body last.
const SHOW_BIN_TABLE: &str = "id:               small-bin
state:            pending
sha256:           eba94c659d9ccc94f46a586a384757f7cfe46d2eca910bc5046231b38312515c
body bytes:       70
headers bytes:    2
reason:           retries_exhausted
attempts:         5
dead-lettered at: 2026-01-02T03:04:06Z
event id:         (unknown)
producer:         (unknown)
schema version:   (unknown)
source queue:     (unknown)
exchange:         ex
routing key:      rk
error:            \nreplayed at:      -
lease:            -
last replay err:  -

history:
  (none)

headers:
{}

body:
(not UTF-8; hex dump)
00000000  00 01 02 ff fe 80 41 42 0a 1b 00 01 02 ff fe 80  |......AB........|
00000010  41 42 0a 1b 00 01 02 ff fe 80 41 42 0a 1b 00 01  |AB........AB....|
00000020  02 ff fe 80 41 42 0a 1b 00 01 02 ff fe 80 41 42  |....AB........AB|
00000030  0a 1b 00 01 02 ff fe 80 41 42 0a 1b 00 01 02 ff  |........AB......|
00000040  fe 80 41 42 0a 1b                                |..AB..|
";

#[test]
fn show_prints_small_bodies_exactly_as_before() {
    let text = "{\"event_id\": \"e-1\", \"amount\": 12.5, \"note\": \"café \\\"q\\\"\\n\u{202e}\"}";
    let bin: Vec<u8> = [0, 1, 2, 0xff, 0xfe, 0x80, 0x41, 0x42, 0x0a, 0x1b].repeat(7);
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        db.add(
            json!({"id": "small-json", "reason": "poison_message", "attempts": 3,
            "headers": {"x-producer": "svc", "n": 1.5}, "source_queue": "orders",
            "event_id": "e-1", "dead_lettered_at": "2026-01-02T03:04:05Z",
            "error": "ValueError: bad", "body_text": text}),
        );
        db.add(
            json!({"id": "small-bin", "reason": "retries_exhausted", "attempts": 5,
            "headers": {}, "exchange": "ex", "routing_key": "rk",
            "dead_lettered_at": "2026-01-02T03:04:06Z", "body_base64": b64(&bin)}),
        );
        for (id, format, expected) in [
            ("small-json", "json", SHOW_JSON),
            ("small-bin", "json", SHOW_BIN_JSON),
            ("small-bin", "table", SHOW_BIN_TABLE),
        ] {
            let r = db.dlq(&["-o", format, "show", id]);
            assert_eq!(r.code, 0, "{}", r.stderr);
            let expected = expected.replace("<RLO>", "\u{202e}");
            assert_eq!(r.stdout, expected, "{backend:?} {id} -o {format}");
        }
    }
}

/// A large body that comes back shorter than its length (here a `substr` that returns
/// nothing, as if the row had been deleted meanwhile) is an error: nothing is published,
/// the claim is released, and `show` prints no cut body.
#[test]
fn a_body_that_cannot_be_read_whole_is_neither_published_nor_shown_cut() {
    let mut rabbit = Rabbit::new();
    let queue = rabbit.queue("dlq_cut");
    let db = TestDb::migrated(Backend::Postgres);
    let body = binary_body();
    let r = db.dlq_stdin(
        &["import", "-"],
        line("cut", &queue, &body, false).as_bytes(),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    replace_substr(&db, "RETURN ''::bytea;");
    let shown = db.dlq(&["show", "cut"]);
    assert_eq!(shown.code, 1, "{}", shown.all());
    assert_eq!(shown.stdout, "");
    assert!(
        shown.stderr.contains("changed or the row was deleted"),
        "{}",
        shown.stderr
    );
    let r = db.dlq(&["replay", "cut", "--yes"]);
    assert_eq!(r.code, 3, "{}", r.all());
    let v = r.json();
    assert_eq!(v["outcome"], "not_replayed", "{v}");
    let detail = v["detail"].as_str().unwrap();
    assert!(
        detail.contains("changed or the row was deleted"),
        "{detail}"
    );
    assert!(detail.contains("nothing was published"), "{detail}");
    assert!(
        rabbit.drain(&queue).is_empty(),
        "published a body it could not read"
    );
    // The body is read after the claim; since it could not be, the claim was released.
    let listed = db.dlq(&["list"]).json();
    assert_eq!(listed[0]["id"], "cut");
    assert_eq!(listed[0]["state"], "pending", "{listed}");
    assert!(listed[0]["replay_claim_owner"].is_null(), "{listed}");
}

/// `show` of a body read in slices reads one version of the row: a body rewritten while
/// it is being read (between two slices) does not give half of each. The first slice
/// waits on an advisory lock the test holds while it rewrites the body.
#[test]
fn a_body_read_in_slices_comes_from_one_version_of_the_row() {
    let db = TestDb::migrated(Backend::Postgres);
    let old = binary_body();
    let mut new = old.clone();
    new.iter_mut().for_each(|b| *b = !*b);
    let old = [old.as_slice(), &old[..MIB]].concat();
    let new = [new.as_slice(), &new[..MIB]].concat(); // 9 MiB: two slices
    let r = db.dlq_stdin(&["import", "-"], line("twice", "q", &old, false).as_bytes());
    assert_eq!(r.code, 0, "{}", r.stderr);
    let mut gate = SliceGate::close(&db, false);
    let child = db
        .cmd()
        .args(["show", "twice"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    gate.waiting("show");
    gate.set_body("twice", &new);
    gate.open();
    let shown = Run::from(child.wait_with_output().unwrap());
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    let got = unb64(&shown.json()["body_base64"]);
    assert!(
        got == old,
        "the body shown mixes two versions or is the new one"
    );
}

/// `replay ID --dry-run -o json`, as printed before it was written as a stream.
const DRY_RUN_JSON: &str = r#"{
  "body_base64": "eyJldmVudF9pZCI6ICJlLTEiLCAiYW1vdW50IjogMTIuNSwgIm5vdGUiOiAiY2Fmw6kgXCJxXCJcbuKAriJ9",
  "body_text": "{\"event_id\": \"e-1\", \"amount\": 12.5, \"note\": \"café \\\"q\\\"\\n<RLO>\"}",
  "delivery_mode": 2,
  "detail": "would publish to exchange (default exchange) routing key orders; nothing was claimed or published",
  "exchange": "",
  "headers": {
    "n": 1.5,
    "x-dead-letter-id": "small-json",
    "x-dead-letter-reason": "poison_message",
    "x-producer": "svc",
    "x-replayed-by": "tester",
    "x-replayed-from-dlq": "true"
  },
  "id": "small-json",
  "mandatory": true,
  "message_id": "e-1",
  "outcome": "dry_run",
  "routing_key": "orders",
  "sha256": "b6b900c5ce6d96c01a4d8ab8c3300526d80ffcf7c6791fb0cfc0136d2fe6db22",
  "state": "pending"
}
"#;

const DRY_RUN_BIN_JSON: &str = r#"{
  "body_base64": "AAEC//6AQUIKGwABAv/+gEFCChsAAQL//oBBQgobAAEC//6AQUIKGwABAv/+gEFCChsAAQL//oBBQgobAAEC//6AQUIKGw==",
  "body_text": null,
  "delivery_mode": 2,
  "detail": "would publish to exchange ex routing key rk; nothing was claimed or published",
  "exchange": "ex",
  "headers": {
    "x-dead-letter-id": "small-bin",
    "x-dead-letter-reason": "retries_exhausted",
    "x-replayed-by": "tester",
    "x-replayed-from-dlq": "true"
  },
  "id": "small-bin",
  "mandatory": true,
  "message_id": null,
  "outcome": "dry_run",
  "routing_key": "rk",
  "sha256": "eba94c659d9ccc94f46a586a384757f7cfe46d2eca910bc5046231b38312515c",
  "state": "pending"
}
"#;

#[test]
fn replay_dry_run_prints_small_bodies_exactly_as_before() {
    let text = "{\"event_id\": \"e-1\", \"amount\": 12.5, \"note\": \"café \\\"q\\\"\\n\u{202e}\"}";
    let bin: Vec<u8> = [0, 1, 2, 0xff, 0xfe, 0x80, 0x41, 0x42, 0x0a, 0x1b].repeat(7);
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        db.add(
            json!({"id": "small-json", "reason": "poison_message", "attempts": 3,
            "headers": {"x-producer": "svc", "n": 1.5, "x-death": [{"count": 1}]},
            "source_queue": "orders", "event_id": "e-1",
            "dead_lettered_at": "2026-01-02T03:04:05Z", "error": "ValueError: bad",
            "body_text": text}),
        );
        db.add(
            json!({"id": "small-bin", "reason": "retries_exhausted", "attempts": 5,
            "headers": {}, "exchange": "ex", "routing_key": "rk",
            "dead_lettered_at": "2026-01-02T03:04:06Z", "body_base64": b64(&bin)}),
        );
        for (id, expected) in [
            ("small-json", DRY_RUN_JSON),
            ("small-bin", DRY_RUN_BIN_JSON),
        ] {
            let r = db.dlq(&["replay", id, "--dry-run"]);
            assert_eq!(r.code, 0, "{}", r.stderr);
            assert_eq!(
                r.stdout,
                expected.replace("<RLO>", "\u{202e}"),
                "{backend:?} {id}"
            );
        }
    }
}

/// Runs `dlq [-v] claim ID` on PostgreSQL while a transaction holds the row, and lets
/// the claim's UPDATE go only after it has waited on the lock for over a second: sqlx's
/// slow-statement threshold. Returns the run.
fn slow_claim(db: &TestDb, url: &str, id: &str, verbose: bool) -> Run {
    rt().block_on(async {
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        let mut holder = pool.begin().await.unwrap();
        sqlx::query("SELECT id FROM dead_letters WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_one(&mut *holder)
            .await
            .unwrap();
        let mut cmd = db.cmd();
        cmd.env("DLQ_DATABASE_URL", url);
        if verbose {
            cmd.arg("-v");
        }
        let child = cmd
            .args(["claim", id])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Until dlq's UPDATE waits on the row lock (in this test's database: other tests'
        // runs wait on locks of their own beside it, in this one binary).
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND application_name = 'dlq' AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        holder.commit().await.unwrap();
        pool.close().await;
        Run::from(child.wait_with_output().unwrap())
    })
}

#[test]
fn a_slow_statement_is_logged_only_with_v_and_without_secrets() {
    let db = TestDb::migrated(Backend::Postgres);
    for id in ["quiet", "verbose"] {
        db.add(json!({"id": id, "reason": "r", "body_text": "{}", "source_queue": "q"}));
    }
    // Trust authentication takes any password: one the log must not show.
    let url = db.url.replacen("postgres@", "postgres:pw-s3cret-42@", 1);

    let quiet = slow_claim(&db, &url, "quiet", false);
    assert_eq!(quiet.code, 0, "{}", quiet.all());
    assert_eq!(quiet.json()["outcome"], "claimed");
    assert_eq!(quiet.stderr, "", "a default run prints nothing on stderr");

    let verbose = slow_claim(&db, &url, "verbose", true);
    assert_eq!(verbose.code, 0, "{}", verbose.all());
    let token = verbose.json()["token"].as_str().unwrap().to_string();
    assert!(
        verbose.stderr.contains("slow statement") && verbose.stderr.contains("UPDATE dead_letters"),
        "-v shows the slow statement: {}",
        verbose.stderr
    );
    assert!(
        !verbose.stderr.contains("pw-s3cret-42"),
        "{}",
        verbose.stderr
    );
    assert!(!verbose.stderr.contains(&token), "{}", verbose.stderr);
    let uuid = token.rsplit_once(':').unwrap().1;
    assert!(!verbose.stderr.contains(uuid), "{}", verbose.stderr);
}
