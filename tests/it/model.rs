//! Model-based test of the replay protocol v2: random sequences of claim / attempt /
//! mark / release / settle-uncertain / resolve / time passing, by several actors holding
//! fresh or stale tokens, run against the real SQLite and PostgreSQL stores and against a
//! small in-memory model, which must agree after every step. A process that crashes is an
//! actor that never takes its next step, which random sequences do all the time. Time
//! passes in the database: leases are moved into the past by SQL, never by sleeping.
//!
//! `Edit` makes a revision of the targeted copy (`dlq edit`: the original set aside in the
//! same transaction), and `Target` points the next steps at any copy, old or new.
//!
//! The property: one business event is published (a successful attempt, not undone by a
//! release after a certain failure) at most once through all its copies, plus once more
//! for each `resolve --not-delivered`; and a row is never `replayed` without an attempt. And a rerun (`Rerun`: the whole protocol,
//! as `dlq replay ID` right after a crash at any step) reports an open attempt as
//! `uncertain`, never `not_replayed`.

use crate::common::*;
use dlq::secret::SecretUrl;
use dlq::store::{
    open, LeaseAfter, NewDeadLetter, NewRevision, OnExisting, Resolution, RevisionWrite, Store,
    StoreOptions,
};
use proptest::prelude::*;
use std::time::Duration;

const ID: &str = "m1";

#[derive(Debug, Clone)]
enum Op {
    Claim {
        actor: usize,
        lease_min: u64,
    },
    Attempt {
        actor: usize,
        stale: bool,
        outlive_min: u64,
    },
    Mark {
        actor: usize,
        stale: bool,
    },
    Release {
        actor: usize,
        stale: bool,
    },
    Uncertain {
        actor: usize,
        stale: bool,
    },
    Resolve {
        delivered: bool,
    },
    Advance {
        min: u64,
    },
    Rerun,
    /// A revision of the targeted copy.
    Edit,
    /// The next steps act on copy `copy` (modulo the copies there are).
    Target {
        copy: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize, 1..10u64).prop_map(|(actor, lease_min)| Op::Claim { actor, lease_min }),
        (0..3usize, any::<bool>(), 0..6u64).prop_map(|(actor, stale, outlive_min)| {
            Op::Attempt {
                actor,
                stale,
                outlive_min,
            }
        }),
        (0..3usize, any::<bool>()).prop_map(|(actor, stale)| Op::Mark { actor, stale }),
        (0..3usize, any::<bool>()).prop_map(|(actor, stale)| Op::Release { actor, stale }),
        (0..3usize, any::<bool>()).prop_map(|(actor, stale)| Op::Uncertain { actor, stale }),
        any::<bool>().prop_map(|delivered| Op::Resolve { delivered }),
        (1..15u64).prop_map(|min| Op::Advance { min }),
        Just(Op::Rerun),
        Just(Op::Edit),
        (0..4usize).prop_map(|copy| Op::Target { copy }),
    ]
}

/// The whole truth about one row, in minutes relative to now.
#[derive(Debug, Default)]
struct Model {
    replayed: bool,
    /// Set aside by an edit (a revision carries the event now).
    discarded: bool,
    attempt: bool,
    owner: Option<String>,
    expires_in: Option<i64>,
    publishes: u32,
    resolved_not_delivered: u32,
}

impl Model {
    fn lease_live(&self) -> bool {
        self.expires_in.is_some_and(|e| e > 0)
    }
    fn holds(&self, token: &str) -> bool {
        !self.replayed && self.owner.as_deref() == Some(token)
    }
    /// An open attempt is uncertain whatever its lease does.
    fn state(&self) -> &'static str {
        if self.replayed {
            "replayed"
        } else if self.discarded {
            "discarded"
        } else if self.attempt {
            "uncertain"
        } else if self.lease_live() {
            "claimed"
        } else {
            "pending"
        }
    }
}

struct Harness {
    store: Box<dyn Store>,
    backend: Backend,
    url: String,
    _db: TestDb,
}

impl Harness {
    async fn new(db: TestDb) -> Harness {
        let backend = db.backend;
        let store = open(&SecretUrl::new(db.url.clone()), &StoreOptions::default())
            .await
            .unwrap();
        Harness {
            store,
            backend,
            url: db.url.clone(),
            _db: db,
        }
    }

    async fn reset(&self) {
        self.sql("DELETE FROM dead_letters", 0).await;
        let row = NewDeadLetter {
            line: 1,
            id: ID.into(),
            body: b"{}".to_vec(),
            reason: "retries_exhausted".into(),
            headers_json: "{}".into(),
            ..Default::default()
        };
        self.store
            .import(vec![row], OnExisting::Refuse)
            .await
            .unwrap();
    }

    /// Moves every lease `min` minutes into the past: time passing, on the DB's terms.
    async fn advance(&self, min: u64) {
        let q = match self.backend {
            Backend::Postgres => "UPDATE dead_letters SET replay_claim_expires_at = replay_claim_expires_at - make_interval(mins => $1::int)",
            Backend::Sqlite => "UPDATE dead_letters SET replay_claim_expires_at = replay_claim_expires_at - ?1 * 60000000",
        };
        self.sql(q, min as i64).await;
    }

    async fn sql(&self, q: &str, arg: i64) {
        match self.backend {
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&self.url).await.unwrap();
                let mut query = sqlx::query(q);
                if q.contains("$1") {
                    query = query.bind(arg);
                }
                query.execute(&pool).await.unwrap();
                pool.close().await;
            }
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&self.url).await.unwrap();
                let mut query = sqlx::query(q);
                if q.contains("?1") {
                    query = query.bind(arg);
                }
                query.execute(&pool).await.unwrap();
                pool.close().await;
            }
        }
    }

    /// `dlq replay ID` as a new process would run it (the broker is never reached: the
    /// row has no target).
    async fn rerun(&self, id: &str) -> dlq::model::Outcome {
        let opts = dlq::publisher::PublisherOptions {
            connect_timeout: Duration::from_secs(5),
            confirm_timeout: Duration::from_secs(5),
            connection_name: "model".into(),
            tls: Default::default(),
            topology: Default::default(),
        };
        let mut broker =
            dlq::publisher::Broker::new(vec![SecretUrl::new(AMQP.to_string())], opts, None);
        let replay_opts = dlq::replay::ReplayOptions {
            operator: "rerun".into(),
            lease: Duration::from_secs(60),
            ..Default::default()
        };
        let item = dlq::replay::Item {
            id: id.into(),
            expected_sha256: None,
        };
        let stop = std::sync::atomic::AtomicBool::new(false);
        let reports = dlq::replay::replay(
            self.store.as_ref(),
            &mut broker,
            &[item],
            &replay_opts,
            &stop,
        )
        .await
        .unwrap();
        broker.close().await;
        reports[0].outcome
    }

    async fn state(&self, id: &str) -> String {
        let rows = self.store.summaries(&[id.to_string()]).await.unwrap();
        rows[0].state.as_str().to_string()
    }

    /// `dlq edit` of `id` as a new copy `new`; whether it was written.
    async fn edit(&self, id: &str, new: &str) -> bool {
        let rev = NewRevision {
            original_id: id.into(),
            discard_note: format!("revised as {new}: model"),
            row: NewDeadLetter {
                line: 1,
                id: new.into(),
                body: format!("{{\"copy\":\"{new}\"}}").into_bytes(),
                reason: "retries_exhausted".into(),
                headers_json: "{}".into(),
                revision_of: Some(id.into()),
                ..Default::default()
            },
            history: Vec::new(),
        };
        self.store.revise(&rev).await.unwrap() == RevisionWrite::Written
    }
}

async fn check(h: &Harness, ops: Vec<Op>) -> Result<(), TestCaseError> {
    h.reset().await;
    // The copies of the one business event: the original, then each revision.
    let mut copies = vec![ID.to_string()];
    let mut models = vec![Model::default()];
    let mut cur = 0;
    // Every token each actor was ever given, newest last.
    let mut tokens: Vec<Vec<String>> = vec![Vec::new(); 3];
    let pick = |tokens: &Vec<Vec<String>>, actor: usize, stale: bool| -> String {
        let t = &tokens[actor];
        match (stale, t.len()) {
            (_, 0) => format!("actor{actor}:00000000-0000-4000-8000-000000000000"),
            (true, _) => t[0].clone(),
            (false, n) => t[n - 1].clone(),
        }
    };
    for op in ops {
        match op {
            Op::Target { copy } => cur = copy % copies.len(),
            Op::Advance { min } => {
                for (i, m) in models.iter_mut().enumerate() {
                    if i != cur {
                        m.expires_in = m.expires_in.map(|e| e - min as i64);
                    }
                }
            }
            Op::Edit => {
                let new = format!("{ID}-r{}", copies.len());
                let got = h.edit(&copies[cur], &new).await;
                let expect = models[cur].state() == "pending";
                prop_assert_eq!(
                    got,
                    expect,
                    "edit of {} on {:?}",
                    &copies[cur],
                    &models[cur]
                );
                if expect {
                    models[cur].discarded = true;
                    copies.push(new);
                    models.push(Model::default());
                }
            }
            _ => {}
        }
        let ids = vec![copies[cur].clone()];
        let model = &mut models[cur];
        let done = match op {
            Op::Target { .. } | Op::Edit => (true, true),
            Op::Claim { actor, lease_min } => {
                let token = dlq::replay::new_token(&format!("actor{actor}"));
                let got = h
                    .store
                    .claim(&ids, &token, Duration::from_secs(lease_min * 60), &[])
                    .await
                    .unwrap();
                let expect =
                    !model.replayed && !model.discarded && !model.attempt && !model.lease_live();
                if expect {
                    model.owner = Some(token.clone());
                    model.expires_in = Some(lease_min as i64);
                    tokens[actor].push(token);
                }
                (!got.is_empty(), expect)
            }
            Op::Attempt {
                actor,
                stale,
                outlive_min,
            } => {
                let token = pick(&tokens, actor, stale);
                let new = dlq::replay::new_token(&format!("actor{actor}"));
                let outlive = Duration::from_secs(outlive_min * 60);
                let got = h
                    .store
                    .attempt(&ids, &token, &new, outlive, &[])
                    .await
                    .unwrap();
                let expect = model.holds(&token)
                    && !model.attempt
                    && model.expires_in.is_some_and(|e| e > outlive_min as i64);
                if expect {
                    model.owner = Some(new.clone());
                    model.attempt = true;
                    model.publishes += 1;
                    tokens[actor].push(new);
                }
                (!got.is_empty(), expect)
            }
            Op::Mark { actor, stale } => {
                let token = pick(&tokens, actor, stale);
                let got = h.store.mark_replayed(&ids, &token, &[]).await.unwrap();
                let expect = model.holds(&token) && model.attempt;
                if expect {
                    model.replayed = true;
                    model.expires_in = None;
                }
                (!got.is_empty(), expect)
            }
            Op::Release { actor, stale } => {
                let token = pick(&tokens, actor, stale);
                let got = h
                    .store
                    .release(&ids, &token, Some("model"), &[])
                    .await
                    .unwrap();
                let expect = model.holds(&token) && model.lease_live();
                if expect {
                    // The protocol releases an attempted row only when its publish
                    // certainly failed: that attempt published nothing.
                    if model.attempt {
                        model.publishes -= 1;
                    }
                    model.owner = None;
                    model.expires_in = None;
                    model.attempt = false;
                }
                (!got.is_empty(), expect)
            }
            Op::Uncertain { actor, stale } => {
                let token = pick(&tokens, actor, stale);
                let got = h
                    .store
                    .settle_uncertain(&ids, &token, "model", LeaseAfter::EndsNow, &[])
                    .await
                    .unwrap();
                let expect = model.holds(&token) && model.attempt;
                if expect {
                    model.expires_in = Some(model.expires_in.unwrap_or(0).min(0));
                }
                (!got.is_empty(), expect)
            }
            Op::Resolve { delivered } => {
                let resolution = if delivered {
                    Resolution::Delivered
                } else {
                    Resolution::NotDelivered
                };
                let got = h.store.resolve(&ids, resolution, &[]).await.unwrap();
                let expect = !model.replayed && model.attempt && !model.lease_live();
                if expect && delivered {
                    model.replayed = true;
                    model.expires_in = None;
                } else if expect {
                    model.attempt = false;
                    model.owner = None;
                    model.expires_in = None;
                    model.resolved_not_delivered += 1;
                }
                (!got.is_empty(), expect)
            }
            Op::Advance { min } => {
                // Time passes for every copy's lease, not only the targeted one's.
                h.advance(min).await;
                model.expires_in = model.expires_in.map(|e| e - min as i64);
                (true, true)
            }
            Op::Rerun => {
                let outcome = h.rerun(&ids[0]).await;
                // The row has no target: a rerun that claims it releases it unpublished.
                let expect = match model.state() {
                    "uncertain" => dlq::model::Outcome::Uncertain,
                    "pending" => {
                        model.owner = None;
                        model.expires_in = None;
                        dlq::model::Outcome::NotReplayed
                    }
                    _ => dlq::model::Outcome::NotReplayed,
                };
                prop_assert_eq!(outcome, expect, "rerun on {:?}", model);
                (true, true)
            }
        };
        prop_assert_eq!(done.0, done.1, "{:?} on {:?}", op, model);
        for (id, m) in copies.iter().zip(&models) {
            prop_assert_eq!(h.state(id).await, m.state(), "{} after {:?}", id, op);
            prop_assert!(!m.replayed || m.publishes > 0, "replayed unpublished");
        }
        let published: u32 = models.iter().map(|m| m.publishes).sum();
        let resolved: u32 = models.iter().map(|m| m.resolved_not_delivered).sum();
        prop_assert!(
            published <= 1 + resolved,
            "one event published twice through its copies: {:?}",
            models
        );
    }
    // An unknown ID is never claimed.
    let none = h
        .store
        .claim(
            &["no-such".to_string()],
            "x:y",
            Duration::from_secs(60),
            &[],
        )
        .await
        .unwrap();
    prop_assert!(none.is_empty());
    Ok(())
}

fn run_model(backend: Backend, cases: u32) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let db = TestDb::migrated(backend);
    let h = rt.block_on(Harness::new(db));
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        ..ProptestConfig::default()
    });
    runner
        .run(&proptest::collection::vec(op(), 1..30), |ops| {
            rt.block_on(check(&h, ops))
        })
        .unwrap();
}

#[test]
fn replay_protocol_matches_the_model_on_sqlite() {
    run_model(Backend::Sqlite, 128);
}

#[test]
fn replay_protocol_matches_the_model_on_postgres() {
    run_model(Backend::Postgres, 64);
}
