//! The come-back watch: a canary or a paced run stops when what it sent comes back as a
//! new dead letter (the consumer still fails it), however and whenever it is stored.

use super::*;
/// How the target's failing worker dead-letters again what it takes.
#[derive(Clone, Copy)]
enum Fails {
    /// A new dead letter with the message's event ID (`evt-` and the row's ID).
    SameEvent,
    /// A new dead letter with no event ID, keeping the message's `x-dead-letter-id`.
    KeepingHeaders,
    /// As `SameEvent`, stamped as capture stamps it: the broker's `x-death` time, whole
    /// seconds by a clock a little behind the database's.
    SameEventBrokerStamped,
    /// As `SameEvent`, stored late (a capture behind its queue) with the time it was
    /// taken, after a newer unrelated dead letter the watch has already read.
    SameEventStoredLate,
    /// As `KeepingHeaders`, stored late as `SameEventStoredLate` is.
    KeepingHeadersStoredLate,
    /// As capture stores the message (body and headers kept, the event ID left to the
    /// store's rule), stored late: when a header or body field names another event than
    /// the row's (a revision made with `--new-event-id`, a worker's `event_id` column),
    /// it comes back under that one, not the one it was published with.
    CapturedLate,
}

impl Fails {
    fn stored_late(self) -> bool {
        matches!(
            self,
            Fails::SameEventStoredLate | Fails::KeepingHeadersStoredLate | Fails::CapturedLate
        )
    }
}

/// What a run against a failing worker came to.
struct AgainstFailing {
    /// Whether the run exited within the limit (else it was killed).
    exited: bool,
    run: Run,
    /// The rows whose messages the worker took, in order (also those left at the end).
    seen: Vec<String>,
}

/// Plays a worker that fails every message of `q` until `child` exits (killed after
/// 30 s); `also` runs on each look.
fn against_failing(
    rabbit: &Rabbit,
    q: &str,
    db: &TestDb,
    mut child: Child,
    fails: Fails,
    mut also: impl FnMut(),
) -> AgainstFailing {
    let mut seen = Vec::new();
    let exited = until(Duration::from_secs(30), || {
        also();
        while let Some(id) = take_one(rabbit, q) {
            let mut again = letter(&format!("{id}-again"), q, b"{}");
            let taken = chrono::Utc::now();
            if fails.stored_late() {
                let mut flood = letter(&format!("{id}-flood"), "elsewhere", b"{}");
                let newer = taken + chrono::Duration::seconds(1);
                flood["dead_lettered_at"] = newer.to_rfc3339().into();
                db.add(flood);
                std::thread::sleep(Duration::from_millis(1500));
                again["dead_lettered_at"] = taken.to_rfc3339().into();
            }
            match fails {
                Fails::SameEvent | Fails::SameEventStoredLate => {
                    again["event_id"] = format!("evt-{id}").into()
                }
                Fails::SameEventBrokerStamped => {
                    again["event_id"] = format!("evt-{id}").into();
                    let whole = chrono::Utc::now().timestamp() - 2;
                    let at = chrono::DateTime::from_timestamp(whole, 0).unwrap();
                    again["dead_lettered_at"] = at.to_rfc3339().into();
                }
                Fails::KeepingHeaders | Fails::KeepingHeadersStoredLate => {
                    again.as_object_mut().unwrap().remove("event_id");
                    again["headers"]["x-dead-letter-id"] = id.clone().into();
                }
                Fails::CapturedLate => {
                    let sent = db.show(&id);
                    again.as_object_mut().unwrap().remove("event_id");
                    again["body_base64"] = sent["body_base64"].clone();
                    again["headers"] = sent["headers"].clone();
                    again["headers"]["x-dead-letter-id"] = id.clone().into();
                }
            }
            db.add(again);
            seen.push(id);
        }
        child.try_wait().unwrap().is_some()
    });
    if !exited {
        let _ = child.kill();
    }
    let run = Run::from(child.wait_with_output().unwrap());
    seen.extend(std::iter::from_fn(|| take_one(rabbit, q)));
    AgainstFailing { exited, run, seen }
}

/// Runs `plan` (with `extra`) against a worker that `fails` every message, and asserts
/// that the run exited, stopped by a come-back. Returns the rows published.
fn stopped_by_a_come_back(
    (rabbit, q, db): (&Rabbit, &str, &TestDb),
    plan: &tempfile::NamedTempFile,
    extra: &[&str],
    fails: Fails,
) -> Vec<String> {
    let child = spawn(db, plan, extra);
    let AgainstFailing { exited, run, seen } = against_failing(rabbit, q, db, child, fails, || {});
    assert!(exited, "{}", run.all());
    let s = summary_of(&run);
    assert_eq!(s["stopped"], "came_back", "{}", run.all());
    seen
}

/// As [`stopped_by_a_come_back`] with a canary of 1: exactly the canary was published.
fn stopped_after_a_canary_of_one(
    ctx: (&Rabbit, &str, &TestDb),
    plan: &tempfile::NamedTempFile,
    fails: Fails,
) {
    let canary = ["--canary", "1", "--canary-wait", "8s"];
    let seen = stopped_by_a_come_back(ctx, plan, &canary, fails);
    assert_eq!(seen.len(), 1, "exactly the canary was published: {seen:?}");
}

#[test]
fn a_canary_whose_events_come_back_stops_the_run_after_exactly_its_items() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_canary_back");
    let db = TestDb::migrated(Backend::Postgres);
    seed(&db, &q, 20, "c");
    let plan = db.plan_file(&[]);
    // One batch would take all 20: only the canary holds the run at 3.
    let child = spawn(&db, &plan, &["--canary", "3", "--canary-wait", "60s"]);
    let AgainstFailing {
        exited,
        run: r,
        seen,
    } = against_failing(&rabbit, &q, &db, child, Fails::SameEvent, || {});
    assert!(exited, "the run stops long before its 60 s canary wait");
    let s = summary_of(&r);
    assert_eq!(s["stopped"], "came_back", "{}", r.all());
    assert_eq!(s["counts"]["replayed"], 3, "{s}");
    assert_eq!(s["not_reached"], 17, "{s}");
    assert_eq!(r.code, 3, "{}", r.all());
    assert_eq!(seen.len(), 3, "exactly the canary was published: {seen:?}");
    assert!(r.stderr.contains("canary: 3 sent"), "{}", r.stderr);
    assert!(r.stderr.contains("came back"), "{}", r.stderr);
    // The 17 not reached are still pending (plus the 3 new dead letters).
    assert_eq!(db.scalar("SELECT count(*) FROM dead_letters WHERE id LIKE 'c%' AND id NOT LIKE '%-again' AND replayed_at IS NULL AND replay_claim_owner IS NULL"), 17);
    assert_eq!(
        state_count(&db, "claimed") + state_count(&db, "uncertain"),
        0
    );
}

/// Once broke: only `replayed` items were watched; a canary item left `uncertain` (its
/// confirm lost) came back unseen, the canary passed and the run went on.
#[test]
fn an_uncertain_canary_item_that_comes_back_stops_the_run() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_canary_unsure");
    let db = TestDb::migrated(Backend::Postgres);
    seed(&db, &q, 10, "u");
    let plan = db.plan_file(&[]);
    // The link drops as the broker's first confirm passes: the canary's message is in the
    // queue, its outcome unknown to the run. Later connections go through.
    let confirm_cut = std::sync::Arc::new(AtomicBool::new(false));
    let amqp = Proxy::start(
        "127.0.0.1:5672",
        OnServerBytes::CutOnce(BASIC_ACK.to_vec(), confirm_cut.clone()),
    );
    let url = format!("amqp://guest:guest@{}/%2f", amqp.addr());
    let extra = [
        "--canary",
        "1",
        "--canary-wait",
        "60s",
        "--confirm-timeout",
        "5s",
    ];
    let child = db.spawn_plan(&plan, &extra, &[("DLQ_AMQP_URL", &url)]);
    let clear_cut = || {
        if confirm_cut.load(Ordering::SeqCst) {
            amqp.cut.store(false, Ordering::SeqCst);
        }
    };
    let AgainstFailing {
        exited,
        run: r,
        seen,
    } = against_failing(&rabbit, &q, &db, child, Fails::SameEvent, clear_cut);
    assert!(
        exited,
        "the run stops long before its 60 s wait: {}",
        r.all()
    );
    assert!(confirm_cut.load(Ordering::SeqCst), "the confirm was cut");
    let s = summary_of(&r);
    assert_eq!(s["stopped"], "came_back", "{}", r.all());
    assert_eq!(s["counts"]["uncertain"], 1, "{s}");
    assert_eq!(s["not_reached"], 9, "{s}");
    // Uncertain (6) is worse than the items not reached (3).
    assert_eq!(s["worst"], "uncertain", "{s}");
    assert_eq!(r.code, 6, "{}", r.all());
    let detail = s["stop_detail"].as_str().unwrap();
    assert!(detail.contains("whose replay was uncertain"), "{detail}");
    assert!(detail.contains("dlq resolve u0000 --delivered"), "{detail}");
    assert_eq!(seen, ["u0000"], "only the canary was published");
    // It came back, so it was delivered; but the run does not decide that.
    assert_eq!(db.show("u0000")["state"], "uncertain");
    assert_eq!(pending(&db), 9 + 1, "the rest, and the new dead letter");
}

/// Once broke (review): a rerun counted the rows it found `uncertain` (an earlier run's
/// attempts, not published by this one) as its canary, waited with nothing out, then went
/// on: its canary was no items it had published.
#[test]
fn a_reruns_canary_counts_only_what_it_published() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_canary_rerun");
    let db = TestDb::migrated(Backend::Postgres);
    seed(&db, &q, 8, "k");
    let plan = db.plan_file(&[]);
    let items: serde_json::Value =
        serde_json::from_slice(&std::fs::read(plan.path()).unwrap()).unwrap();
    let first: Vec<String> = items["items"].as_array().unwrap()[..2]
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_string())
        .collect();
    // The plan's first two were attempted by a run that crashed: uncertain.
    db.sql(&[&format!(
        "UPDATE dead_letters SET replay_attempt_at = now() WHERE id IN ('{}', '{}')",
        first[0], first[1]
    )]);
    let child = spawn(&db, &plan, &["--canary", "2", "--canary-wait", "60s"]);
    let AgainstFailing {
        exited,
        run: r,
        seen,
    } = against_failing(&rabbit, &q, &db, child, Fails::SameEvent, || {});
    assert!(
        exited,
        "the canary's own two came back long before its 60 s wait"
    );
    let s = summary_of(&r);
    assert_eq!(s["stopped"], "came_back", "{}", r.all());
    assert_eq!(s["counts"]["replayed"], 2, "{s}");
    assert_eq!(s["counts"]["uncertain"], 2, "{s}");
    assert_eq!(r.code, 6, "{}", r.all());
    assert_eq!(seen.len(), 2, "exactly the canary was published: {seen:?}");
    assert!(!seen.iter().any(|id| first.contains(id)), "{seen:?}");
}

/// Once broke: the watch matched event IDs only, so a canary of rows with no event ID
/// always passed, and the run went on into a consumer failing every message. A new dead
/// letter whose `x-dead-letter-id` header names a row the run sent is known as its coming
/// back.
#[test]
fn a_canary_without_event_ids_is_watched_by_its_header() {
    // Also stored after a newer row was read: found by the sweep of the headers.
    for fails in [Fails::KeepingHeaders, Fails::KeepingHeadersStoredLate] {
        let mut rabbit = Rabbit::new();
        let q = rabbit.queue("dlq_canary_noevent");
        let db = TestDb::migrated(Backend::Sqlite);
        let lines: String = (0..10)
            .map(|i| {
                let mut l = letter(&format!("ne{i:04}"), &q, b"not json");
                l.as_object_mut().unwrap().remove("event_id");
                format!("{l}\n")
            })
            .collect();
        let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
        assert_eq!(r.code, 0, "{}", r.all());
        assert!(
            db.dlq(&["show", "ne0000", "-o", "json"]).json()["event_id"].is_null(),
            "no event ID"
        );
        let plan = db.plan_file(&[]);
        let child = spawn(&db, &plan, &["--canary", "2", "--canary-wait", "60s"]);
        let AgainstFailing {
            exited,
            run: r,
            seen,
        } = against_failing(&rabbit, &q, &db, child, fails, || {});
        assert!(exited, "the canary came back long before its 60 s wait");
        let s = summary_of(&r);
        assert_eq!(s["stopped"], "came_back", "{}", r.all());
        assert_eq!(s["counts"]["replayed"], 2, "{s}");
        assert_eq!(r.code, 3, "{}", r.all());
        assert_eq!(seen.len(), 2, "exactly the canary was published: {seen:?}");
        assert!(r.stderr.contains("replayed dead letter"), "{}", r.stderr);
    }
}

/// Once broke (review): the watch read dead letters stamped after the run's start, by
/// the database's clock; capture stamps a come-back with its broker's `x-death` time,
/// whole seconds, so one dead-lettered in the run's first second was never seen and the
/// canary passed a consumer failing everything.
#[test]
fn a_come_back_stamped_by_the_broker_in_the_first_second_is_seen() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_canary_stamped");
    let db = TestDb::migrated(Backend::Sqlite);
    // Dead-lettered an hour ago: the watch has nothing to read until the come-back.
    let hour_ago = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let lines: String = (0..6)
        .map(|i| {
            let mut l = letter(&format!("t{i:04}"), &q, b"{}");
            l["dead_lettered_at"] = hour_ago.clone().into();
            format!("{l}\n")
        })
        .collect();
    let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    let plan = db.plan_file(&[]);
    let canary = ["--canary", "1", "--canary-wait", "60s"];
    let fails = Fails::SameEventBrokerStamped;
    let seen = stopped_by_a_come_back((&rabbit, &q, &db), &plan, &canary, fails);
    assert_eq!(seen.len(), 1, "exactly the canary was published: {seen:?}");
}

/// Once broke: the watch read new dead letters a page at a time in time order, so a
/// come-back stored after a newer row had been read (a capture behind its queue stamps
/// the broker's time) was never seen, and the canary passed a consumer failing all.
#[test]
fn a_come_back_stored_after_a_newer_row_is_seen_before_the_canary_passes() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_canary_late");
    let db = TestDb::migrated(Backend::Sqlite);
    seed(&db, &q, 4, "late");
    let plan = db.plan_file(&[]);
    stopped_after_a_canary_of_one((&rabbit, &q, &db), &plan, Fails::SameEventStoredLate);
}

/// A revision made with `--new-event-id` comes back (stored late) under the event ID its
/// header still names, not the one it was published with.
// Once broke: only the published event IDs were swept; the canary passed, all 4 went out.
#[test]
fn a_revision_with_a_new_event_id_that_comes_back_late_is_seen_before_the_canary_passes() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_canary_revision");
    let db = TestDb::migrated(Backend::Sqlite);
    for i in 0..4 {
        // The event ID in a header, as `revisions::add` stores it.
        let id = format!("rv{i:04}");
        let mut l = letter(&id, &q, format!("{{\"n\":{i}}}").as_bytes());
        l["event_id"] = serde_json::Value::Null;
        l["headers"] = serde_json::json!({"tenant": "acme", "x-event-id": format!("evt-{id}")});
        db.add(l);
    }
    let plan = db.plan_file(&[]);
    let revised = tempfile::NamedTempFile::new().unwrap();
    let p = plan.path().to_str().unwrap();
    let o = revised.path().to_str().unwrap();
    let edit = [
        "edit",
        "--plan",
        p,
        "--set",
        "fixed=true",
        "--new-event-id",
        "--note",
        "fix",
        "--yes",
        "--plan-out",
        o,
    ];
    let r = db.dlq(&edit);
    assert_eq!(r.code, 0, "{}", r.all());
    stopped_after_a_canary_of_one((&rabbit, &q, &db), &revised, Fails::CapturedLate);
}

/// A row whose `event_id` column differs from its body's `event_id` comes back (stored
/// late) under the body's.
// Once broke: as above, the canary passed and all 4 went out.
#[test]
fn a_come_back_under_its_bodys_event_id_stored_late_is_seen_before_the_canary_passes() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_canary_body_event");
    let db = TestDb::migrated(Backend::Postgres);
    for i in 0..4 {
        // The worker wrote the envelope's ID as the column; the body says another.
        let id = format!("be{i:04}");
        let body = format!("{{\"event_id\":\"body-{id}\",\"n\":{i}}}");
        db.add(letter(&id, &q, body.as_bytes()));
    }
    assert_eq!(db.show("be0000")["event_id"], "evt-be0000");
    let plan = db.plan_file(&[]);
    stopped_after_a_canary_of_one((&rabbit, &q, &db), &plan, Fails::CapturedLate);
}

/// The same after the canary (here: none, a paced run): the whole window is swept every
/// few seconds, so the run stops long before its 40 s.
#[test]
fn a_come_back_stored_after_a_newer_row_stops_a_paced_run() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_paced_late");
    let db = TestDb::migrated(Backend::Postgres);
    seed(&db, &q, 80, "paced");
    let plan = db.plan_file(&["--limit", "1000"]);
    let fails = Fails::SameEventStoredLate;
    let seen = stopped_by_a_come_back((&rabbit, &q, &db), &plan, &["--rate", "2/s"], fails);
    assert!(seen.len() < 60, "stopped early: {} published", seen.len());
}

/// A message taken off `queue`: its `x-dead-letter-id`, body, and its event ID and
/// headers as capture stores them (capture's own code makes the row).
struct Taken {
    id: String,
    body: Vec<u8>,
    event_id: Option<String>,
    headers: serde_json::Value,
}

fn take_off_the_wire(rabbit: &Rabbit, queue: &str) -> Option<Taken> {
    use lapin::options::BasicGetOptions;
    let got = rabbit
        .block_on(
            rabbit
                .channel()
                .basic_get(queue.into(), BasicGetOptions { no_ack: true }),
        )
        .unwrap()?;
    let d = &got.delivery;
    let row = dlq::capture::to_letter(&d.data, &d.properties, false, None).row;
    let headers: serde_json::Value = serde_json::from_str(&row.headers_json).unwrap();
    Some(Taken {
        id: headers["x-dead-letter-id"].as_str().unwrap().to_string(),
        body: d.data.clone(),
        event_id: row.event_id,
        headers,
    })
}

/// A canary of 1 over 4 rows of PostgreSQL (`wire0000`..: event ID column `event`,
/// headers `headers`, `ID` in each the row's number) against a worker whose failures
/// capture stores late: the row capture makes of what came off the wire.
/// Asserts that the come-back stopped the run after exactly the canary.
fn canary_against_captured_late(form: &str, event: Option<&str>, headers: &str) {
    canary_against_captured_late_with(form, event, headers, |i| format!("{{\"n\":{i}}}").into());
}

/// [`canary_against_captured_late`], the body of row `i` given by `body`.
fn canary_against_captured_late_with(
    form: &str,
    event: Option<&str>,
    headers: &str,
    body: impl Fn(usize) -> Vec<u8>,
) {
    canary_against_captured_late_on(Backend::Postgres, form, event, headers, body);
}

/// [`canary_against_captured_late_with`] on `backend`.
fn canary_against_captured_late_on(
    backend: Backend,
    form: &str,
    event: Option<&str>,
    headers: &str,
    body: impl Fn(usize) -> Vec<u8>,
) {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_canary_wire");
    let db = TestDb::migrated(backend);
    for i in 0..4 {
        let id = format!("wire{i:04}");
        let n = i.to_string();
        let headers = headers.replace("ID", &n);
        let event = event.map_or("NULL".to_string(), |e| format!("'{}'", e.replace("ID", &n)));
        let hex: String = body(i).iter().map(|b| format!("{b:02x}")).collect();
        let blob = match backend {
            Backend::Postgres => format!("decode('{hex}', 'hex')"),
            Backend::Sqlite => format!("X'{hex}'"),
        };
        db.sql(&[&format!(
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, event_id, \
             source_queue) VALUES ('{id}', {blob}, \
             'retries_exhausted', 1, '{headers}', {event}, '{q}')"
        )]);
    }
    let plan = db.plan_file(&[]);
    let mut child = spawn(&db, &plan, &["--canary", "1", "--canary-wait", "8s"]);
    let mut seen = Vec::new();
    let exited = until(Duration::from_secs(30), || {
        while let Some(t) = take_off_the_wire(&rabbit, &q) {
            let id = t.id;
            let taken = chrono::Utc::now();
            let mut flood = letter(&format!("{id}-flood"), "elsewhere", b"{}");
            flood["dead_lettered_at"] = (taken + chrono::Duration::seconds(1)).to_rfc3339().into();
            db.add(flood);
            std::thread::sleep(Duration::from_millis(1500));
            let mut again = letter(&format!("{id}-again"), &q, &t.body);
            again["event_id"] = t.event_id.into();
            again["headers"] = t.headers;
            again["dead_lettered_at"] = taken.to_rfc3339().into();
            db.add(again);
            seen.push(id);
        }
        child.try_wait().unwrap().is_some()
    });
    if !exited {
        let _ = child.kill();
    }
    let run = Run::from(child.wait_with_output().unwrap());
    let s = summary_of(&run);
    assert_eq!(s["stopped"], "came_back", "{form}: {}", run.all());
    assert_eq!(
        seen.len(),
        1,
        "{form}: exactly the canary was published: {seen:?}"
    );
}

/// A come-back stored late (as capture stores what it takes off the wire) is known by
/// the event ID the header that went out names, which is not the stored text:
/// `x-event-id` as a number goes out a double (`0.50` comes back `0.5`), and of a key
/// given twice the last goes out (the store's rule, and the watch, read the first). A
/// string header, the control, is seen.
#[test]
fn a_come_back_under_the_header_event_id_as_published_stored_late_is_seen_before_the_canary_passes()
{
    let forms = [
        ("control", r#"{"tenant":"acme","x-event-id":"s-ID"}"#),
        (
            "twice",
            r#"{"x-event-id":"first-ID","tenant":"acme","x-event-id":"last-ID"}"#,
        ),
        ("number", r#"{"tenant":"acme","x-event-id":ID.50}"#),
    ];
    for (form, headers) in forms {
        canary_against_captured_late(form, None, headers);
    }
}

/// A row whose worker wrote its event ID column beside an `x-event-id` header that is no
/// scalar (an array): capture stores the come-back with its message ID as its event ID,
/// as it does when the content names none the store's rule reads.
// Once broke (review 34): capture left the column NULL whenever an `x-event-id` header
// was there, the rule found none in an array, and the come-back had no event ID; every
// row sent had one, so the sweep skipped the headers, and one stored late was never seen.
#[test]
fn a_come_back_with_no_event_id_of_rows_that_all_had_one_stored_late_is_seen_before_the_canary_passes(
) {
    let headers = r#"{"tenant":"acme","x-event-id":["ID"]}"#;
    canary_against_captured_late("array", Some("evt-ID"), headers);
}

/// A body that names its event but is not UTF-8 (Latin-1 text after its `event_id`):
/// capture leaves the come-back's event ID to the store's rule, which on PostgreSQL reads
/// no JSON from it; the come-back has no event ID, every row sent had one, and stored
/// late it is never seen: the canary passes a consumer that fails everything. UTF-8, the
/// control, is seen.
#[test]
fn a_come_back_of_a_body_not_utf8_stored_late_is_seen_before_the_canary_passes() {
    let headers = r#"{"tenant":"acme"}"#;
    let bodies: [(&str, &[u8]); 2] = [("utf-8", b"Jos\xc3\xa9"), ("latin-1", b"Jos\xe9")];
    for (form, name) in bodies {
        canary_against_captured_late_with(form, Some("evt-ID"), headers, |i| {
            let mut b = format!("{{\"event_id\":\"evt-{i}\",\"name\":\"").into_bytes();
            b.extend_from_slice(name);
            b.extend_from_slice(b"\"}");
            b
        });
    }
}

/// A row whose event ID column is not the event its `x-event-id` header names, which
/// holds a NUL (`\u0000`), on SQLite: capture stores the come-back under that ID with the
/// NUL replaced (U+FFFD), and the watch watches it so. Without the NUL, the control.
// Once broke (review 39): the watch watched the ID NUL and all; stored late, the
// come-back was never seen and the canary passed a consumer that failed everything.
#[test]
fn a_come_back_whose_header_event_id_holds_a_nul_stored_late_is_seen_before_the_canary_passes() {
    let forms = [
        ("control", r#"{"tenant":"acme","x-event-id":"n-ID-x"}"#),
        ("nul", r#"{"tenant":"acme","x-event-id":"n-ID\u0000x"}"#),
    ];
    for (form, headers) in forms {
        canary_against_captured_late_on(Backend::Sqlite, form, Some("evt-ID"), headers, |i| {
            format!("{{\"n\":{i}}}").into()
        });
    }
}
