//! A mark whose reply is lost: the row is read back, not reported as doubt. A store that
//! loses the reply on purpose (in process) shows it.

use crate::common::*;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// What the wrapper store of [`wrapper`] does once.
#[derive(PartialEq)]
pub(super) enum Fault {
    /// None: the wrapper passes every call through.
    Nothing,
    LoseMarkReply,
    RivalAttempt,
}

/// `dlq replay ID --yes` through the wrapper store of [`wrapper`], as the library runs it.
pub(super) fn replay_through(db: &TestDb, id: &str, fault: Fault) -> dlq::replay::ItemReport {
    use dlq::store::Store;
    rt().block_on(async {
        let inner = dlq::store::open(
            &dlq::secret::SecretUrl::new(db.url.clone()),
            &dlq::store::StoreOptions::default(),
        )
        .await
        .unwrap();
        let store = wrapper::LoseFirstMarkReply {
            inner,
            armed: AtomicBool::new(fault == Fault::LoseMarkReply),
            rival: AtomicBool::new(fault == Fault::RivalAttempt),
        };
        let mut broker = dlq::publisher::Broker::new(
            vec![dlq::secret::SecretUrl::new(AMQP)],
            dlq::publisher::PublisherOptions {
                connect_timeout: Duration::from_secs(5),
                confirm_timeout: Duration::from_secs(5),
                connection_name: "review".into(),
                tls: Default::default(),
                topology: Default::default(),
            },
            None,
        );
        let opts = dlq::replay::ReplayOptions {
            operator: "tester".into(),
            lease: Duration::from_secs(60),
            ..Default::default()
        };
        let items = [dlq::replay::Item {
            id: id.into(),
            expected_sha256: None,
        }];
        let stop = AtomicBool::new(false);
        let r = dlq::replay::replay(&store, &mut broker, &items, &opts, &stop)
            .await
            .unwrap();
        broker.close().await;
        store.close().await;
        r.into_iter().next().unwrap()
    })
}

/// Once broke (review of protocol v2): a mark whose COMMIT went through but whose reply
/// was lost was reported `uncertain` although the row was `replayed`. The mark is retried,
/// the retry finds the row already replayed and returns no ID; now the row is read back.
#[test]
fn a_lost_mark_reply_reports_the_row_replayed() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("rv_lostmark");
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("m1", &q, br#"{"event_id":"evt-m1"}"#));
    let report = replay_through(&db, "m1", Fault::LoseMarkReply);
    assert_eq!(rabbit.drain(&q).len(), 1);
    assert_eq!(state(&db, "m1"), "replayed");
    assert_eq!(
        report.outcome,
        dlq::Outcome::Replayed,
        "row is replayed but the run reported {:?}: {:?}",
        report.outcome,
        report.reason
    );
}

mod wrapper {
    use async_trait::async_trait;
    use chrono::{DateTime, Utc};
    use dlq::model::*;
    use dlq::store::*;
    use dlq::{DlqError, Result};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// The real store, except that the first mark commits and then "loses its reply"
    /// (`armed`), and that the first attempt is beaten by a rival holding the same token
    /// (`rival`: two holders of one hand-taken token that both passed the claim).
    pub struct LoseFirstMarkReply {
        pub inner: Box<dyn Store>,
        pub armed: AtomicBool,
        pub rival: AtomicBool,
    }

    #[async_trait]
    impl Reads for LoseFirstMarkReply {
        async fn check_schema(&self) -> Result<()> {
            self.inner.check_schema().await
        }
        async fn now(&self) -> Result<DateTime<Utc>> {
            self.inner.now().await
        }
        async fn aggregate(&self, d: &[Dimension], f: &Filter) -> Result<Vec<Group>> {
            self.inner.aggregate(d, f).await
        }
        async fn load(&self, ids: &[String]) -> Result<Vec<DeadLetter>> {
            self.inner.load(ids).await
        }
        async fn summaries(&self, ids: &[String]) -> Result<Vec<Summary>> {
            self.inner.summaries(ids).await
        }
        async fn body_bytes(&self, ids: &[String]) -> Result<i64> {
            self.inner.body_bytes(ids).await
        }
        async fn history(&self, id: &str) -> Result<Vec<HistoryEntry>> {
            self.inner.history(id).await
        }
        async fn revised_as(&self, id: &str) -> Result<Vec<String>> {
            self.inner.revised_as(id).await
        }
        async fn live_copies(&self, ids: &[String]) -> Result<Vec<dlq::store::copies::LiveCopy>> {
            self.inner.live_copies(ids).await
        }
        async fn plan_candidates(&self, f: &Filter, limit: i64) -> Result<Vec<PlanCandidate>> {
            self.inner.plan_candidates(f, limit).await
        }
        async fn held(&self, ids: &[String], token: &str) -> Result<Vec<DeadLetter>> {
            self.inner.held(ids, token).await
        }
        async fn dead_lettered_since(
            &self,
            after: &(DateTime<Utc>, String),
            limit: i64,
        ) -> Result<Vec<dlq::store::NewArrival>> {
            self.inner.dead_lettered_since(after, limit).await
        }
        async fn came_back_among(
            &self,
            since: DateTime<Utc>,
            events: &[String],
            headers: dlq::store::HeaderSweep,
        ) -> Result<Vec<dlq::store::NewArrival>> {
            self.inner.came_back_among(since, events, headers).await
        }
        async fn ids_starting_with(
            &self,
            prefix: &str,
            state: Option<dlq::model::State>,
            limit: i64,
        ) -> dlq::Result<Vec<String>> {
            self.inner.ids_starting_with(prefix, state, limit).await
        }
        async fn common_values(
            &self,
            dim: dlq::model::Dimension,
            limit: i64,
        ) -> dlq::Result<Vec<(String, i64)>> {
            self.inner.common_values(dim, limit).await
        }
        async fn database_id(&self) -> dlq::Result<String> {
            self.inner.database_id().await
        }
        async fn count(&self, filter: &dlq::model::Filter) -> dlq::Result<i64> {
            self.inner.count(filter).await
        }
        async fn export(
            &self,
            filter: &dlq::model::Filter,
            sink: &mut (dyn FnMut(dlq::store::NewDeadLetter) -> dlq::Result<()> + Send),
        ) -> dlq::Result<u64> {
            self.inner.export(filter, sink).await
        }

        async fn list_each(
            &self,
            f: &Filter,
            limit: i64,
            sink: &mut (dyn FnMut(Summary) -> Result<()> + Send),
        ) -> Result<u64> {
            self.inner.list_each(f, limit, sink).await
        }
        async fn count_at_most(&self, f: &Filter, cap: i64) -> Result<i64> {
            self.inner.count_at_most(f, cap).await
        }
    }

    #[async_trait]
    impl AlertReads for LoseFirstMarkReply {
        async fn gauges(&self, f: &Filter) -> Result<dlq::store::alerting::Gauges> {
            self.inner.gauges(f).await
        }
    }

    #[async_trait]
    impl dlq::store::Revise for LoseFirstMarkReply {
        async fn revise(&self, r: &dlq::store::NewRevision) -> Result<dlq::store::RevisionWrite> {
            self.inner.revise(r).await
        }
    }

    #[async_trait]
    impl Store for LoseFirstMarkReply {
        async fn migrate(&self) -> Result<Vec<String>> {
            self.inner.migrate().await
        }
        async fn import(
            &self,
            rows: Vec<NewDeadLetter>,
            existing: OnExisting,
        ) -> Result<ImportReport> {
            self.inner.import(rows, existing).await
        }
        async fn claim(
            &self,
            ids: &[String],
            token: &str,
            lease: Duration,
            h: &[NewHistory],
        ) -> Result<Vec<dlq::store::Claimed>> {
            self.inner.claim(ids, token, lease, h).await
        }
        async fn attempt(
            &self,
            ids: &[String],
            token: &str,
            new_token: &str,
            outlive: Duration,
            h: &[NewHistory],
        ) -> Result<Vec<String>> {
            if self.rival.swap(false, Ordering::SeqCst) {
                let rival = format!("rival:{}", uuid::Uuid::new_v4());
                self.inner.attempt(ids, token, &rival, outlive, &[]).await?;
            }
            self.inner.attempt(ids, token, new_token, outlive, h).await
        }
        async fn mark_replayed(
            &self,
            ids: &[String],
            token: &str,
            h: &[NewHistory],
        ) -> Result<Vec<String>> {
            let r = self.inner.mark_replayed(ids, token, h).await;
            if r.is_ok() && self.armed.swap(false, Ordering::SeqCst) {
                return Err(DlqError::Unavailable {
                    what: "connection reset (simulated after COMMIT)".into(),
                    source: None,
                });
            }
            r
        }
        async fn release(
            &self,
            ids: &[String],
            token: &str,
            e: Option<&str>,
            h: &[NewHistory],
        ) -> Result<Vec<String>> {
            self.inner.release(ids, token, e, h).await
        }
        async fn settle_uncertain(
            &self,
            ids: &[String],
            token: &str,
            e: &str,
            end: dlq::store::LeaseAfter,
            h: &[NewHistory],
        ) -> Result<Vec<String>> {
            self.inner.settle_uncertain(ids, token, e, end, h).await
        }
        async fn resolve(
            &self,
            ids: &[String],
            resolution: dlq::store::Resolution,
            h: &[NewHistory],
        ) -> Result<Vec<String>> {
            self.inner.resolve(ids, resolution, h).await
        }
        async fn append_history(&self, e: &[NewHistory]) -> Result<()> {
            self.inner.append_history(e).await
        }
        async fn close(&self) {
            self.inner.close().await
        }
        async fn capture(
            &self,
            rows: &[dlq::store::CapturedLetter],
        ) -> dlq::Result<Vec<dlq::store::CaptureOutcome>> {
            self.inner.capture(rows).await
        }
        async fn discard(
            &self,
            ids: &[String],
            note: &str,
            h: &[NewHistory],
        ) -> dlq::Result<Vec<String>> {
            self.inner.discard(ids, note, h).await
        }
        async fn restore(&self, ids: &[String], h: &[NewHistory]) -> dlq::Result<Vec<String>> {
            self.inner.restore(ids, h).await
        }
        async fn prune_batch(
            &self,
            filter: &dlq::model::Filter,
            after: Option<&str>,
            window: i64,
        ) -> dlq::Result<(Option<String>, u64)> {
            self.inner.prune_batch(filter, after, window).await
        }
    }
}
