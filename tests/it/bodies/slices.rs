//! Bodies read in slices: boundary sizes byte-identical through show, dry run, single and
//! plan replay; the claim's lease and row lock while a body is read; no password shown.

use crate::common::*;
use std::process::Stdio;

/// Sizes around the inline limit (1 MiB) and the slice (8 MiB).
const SIZES: [usize; 9] = [
    0,
    1,
    MIB - 1,
    MIB,
    MIB + 1,
    8 * MIB,
    8 * MIB + 1,
    16 * MIB,
    16 * MIB + 1,
];

fn import(db: &TestDb, prefix: &str, queue: &str) -> Vec<(String, Vec<u8>)> {
    let mut rows = Vec::new();
    let mut lines = String::new();
    for (i, len) in SIZES.iter().enumerate() {
        let id = format!("{prefix}-{i}-{len}");
        let b = noise(i as u32 + prefix.len() as u32 * 100, *len);
        lines.push_str(&letter(&id, queue, &b).to_string());
        lines.push('\n');
        rows.push((id, b));
    }
    let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    rows
}

#[test]
fn boundary_sizes_are_byte_identical_through_show_dry_run_single_and_plan_replay() {
    for backend in BACKENDS {
        let mut rabbit = Rabbit::new();
        let qa = rabbit.queue("rv_single");
        let qb = rabbit.queue("rv_plan");
        let db = TestDb::migrated(backend);
        let single = import(&db, "s", &qa);
        let planned = import(&db, "p", &qb);

        for (id, b) in single.iter().chain(planned.iter()) {
            let v = db.show(id);
            assert!(unb64(&v["body_base64"]) == *b, "show {id}");
            assert_eq!(v["body_bytes"], b.len(), "show {id}");
            let r = db.dlq(&["replay", id, "--dry-run"]);
            assert_eq!(r.code, 0, "{}", r.all());
            assert!(unb64(&r.json()["body_base64"]) == *b, "dry-run {id}");
        }

        // One by one: `replay ID --yes` (reads the summary only, the claim reads the body).
        for (id, b) in &single {
            let r = db.dlq(&["replay", id, "--yes"]);
            assert_eq!(r.code, 0, "{id}: {}", r.all());
            assert_eq!(r.json()["outcome"], "replayed", "{id}");
            let got = rabbit.drain(&qa);
            assert_eq!(got.len(), 1, "{id}");
            assert!(
                got[0].body == *b,
                "{id}: published body differs ({} bytes)",
                got[0].body.len()
            );
        }

        // One batch: every size claimed by one UPDATE, bodies read in slices in its transaction.
        let r = db.dlq(&["plan", "--source-queue", &qb]);
        assert_eq!(r.code, 0, "{}", r.all());
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), &r.stdout).unwrap();
        let r = db.dlq(&[
            "replay",
            "--plan",
            f.path().to_str().unwrap(),
            "--yes",
            "--batch-size",
            "100",
        ]);
        assert_eq!(r.code, 0, "{}", r.all());
        let got = rabbit.drain(&qb);
        assert_eq!(got.len(), planned.len());
        let counts = per_id(&got);
        for (id, b) in &planned {
            assert_eq!(counts.get(id), Some(&1), "{id} published once");
            let m = got
                .iter()
                .find(|m| m.headers["x-dead-letter-id"].as_str() == Some(id.as_str()))
                .unwrap();
            assert!(m.body == *b, "{id}: published body differs");
        }
        assert_eq!(
            db.scalar("SELECT count(*) FROM dead_letters WHERE replayed_at IS NULL"),
            0
        );
    }
}

fn insert_big_compressible(db: &TestDb) {
    // 256 MB of hex and x's: compresses to about 56%.
    db.sql(&[
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, source_queue) \
              SELECT 'big', convert_to(string_agg(md5(g::text) || repeat('x', 32), ''), 'UTF8'), \
                     'poison_message', 1, '{}', 'q' \
              FROM generate_series(1, 4000000) g",
    ]);
}

/// The lease is counted from the claim transaction's start (`now()`), and the claim now
/// lasts as long as its slice reads: `dlq claim` of a large compressible body with a
/// short lease reports "lease held ... for 5s; pass the token to `dlq replay --token`"
/// (exit 0) for a lease that had already ended when it returned.
#[test]
fn dlq_claim_does_not_report_a_lease_that_ended_before_it_returned() {
    let db = TestDb::migrated(Backend::Postgres);
    insert_big_compressible(&db);
    let r = db.dlq(&["claim", "big", "--lease", "5s"]);
    let returned = chrono::Utc::now();
    assert_eq!(r.code, 0, "{}", r.all());
    let v = r.json();
    let until: chrono::DateTime<chrono::Utc> = v["expires_at"].as_str().unwrap().parse().unwrap();
    assert!(
        until > returned,
        "claim said {} but its lease ended at {until}, before it returned at {returned}",
        r.stdout
    );
}

/// A claim holds its row lock only for its UPDATE, not while the body is read (reading a
/// large compressed body in slices inside the claim took seconds, and a second claim of
/// the row failed with "lock wait timed out" instead of answering "not claimed"). Here
/// replay A's body read waits on an advisory lock the test holds; meanwhile B's claim of
/// the same row must answer `not_claimed`, with a lock timeout far shorter than A's wait.
/// (The review's test of a lost COMMIT answer after the slices is gone with the COMMIT:
/// the claim is one autocommit statement again.)
#[test]
fn a_second_claim_while_the_first_reads_the_body_gets_a_clean_not_claimed() {
    let mut rabbit = Rabbit::new();
    let queue = rabbit.queue("rv_lock");
    let db = TestDb::migrated(Backend::Postgres);
    let b = noise(3, 3 * MIB);
    db.add(letter("big", &queue, &b));
    let mut gate = SliceGate::close(&db, false);
    let a = db
        .cmd()
        .args(["replay", "big", "--yes"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    gate.waiting("A");
    let second = db.dlq(&["claim", "big", "--lock-timeout", "1s"]);
    gate.open();
    let a = a.wait_with_output().unwrap();
    assert_eq!(second.code, 3, "{}", second.all());
    assert_eq!(second.json()["outcome"], "not_claimed", "{}", second.stdout);
    let a = Run::from(a);
    assert_eq!(a.code, 0, "{}", a.all());
    let got = rabbit.drain(&queue);
    assert_eq!(got.len(), 1);
    assert!(got[0].body == b, "A published another body");
}

/// A body read that fails after the claim (here: statement_timeout on a late slice of a
/// compressed body) releases the claim: the row is pending again, nothing published, and
/// its history says why.
#[test]
fn a_body_read_that_fails_after_the_claim_releases_it() {
    let mut rabbit = Rabbit::new();
    let queue = rabbit.queue("rv_timeout");
    let db = TestDb::migrated(Backend::Postgres);
    insert_big_compressible(&db);
    db.sql(&[&format!(
        "UPDATE dead_letters SET source_queue = '{queue}' WHERE id = 'big'"
    )]);
    let r = db.dlq(&["replay", "big", "--yes", "--statement-timeout", "300ms"]);
    eprintln!("replay: exit {} {}", r.code, r.all());
    assert_ne!(r.code, 0);
    assert_eq!(rabbit.count(&queue), 0);
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letters WHERE id = 'big' AND replay_claim_owner IS NULL AND replayed_at IS NULL"),
        1
    );
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM dead_letter_history WHERE action = 'release' \
             AND detail LIKE 'its body could not be read%nothing was published'"
        ),
        1
    );
}

/// Passwords in both URLs never appear in a verbose replay of a sliced body, nor in the
/// error of a claim whose slice read fails.
#[test]
fn no_password_in_verbose_sliced_replay_or_its_errors() {
    let mut rabbit = Rabbit::new();
    let queue = rabbit.queue("rv_secret");
    let db = TestDb::migrated(Backend::Postgres);
    let b = noise(9, 9 * MIB);
    db.add(letter("s1", &queue, &b));
    let pg = db.url.replace("postgres@", "postgres:pg-s3cret-pw@");
    let amqp = "amqp://guest:guest@127.0.0.1:5672/%2f";
    let env = [("DLQ_DATABASE_URL", pg.as_str()), ("DLQ_AMQP_URL", amqp)];
    let r = db.dlq_env(&["-vv", "replay", "s1", "--yes"], &env);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(!r.all().contains("pg-s3cret-pw"), "{}", r.all());
    assert!(rabbit.drain(&queue)[0].body == b);
    db.add(letter("s2", &queue, &b));
    let r = db.dlq_env(
        &["-vv", "replay", "s2", "--yes", "--statement-timeout", "1ms"],
        &env,
    );
    assert_ne!(r.code, 0);
    assert!(!r.all().contains("pg-s3cret-pw"), "{}", r.all());
}
