//! `edit ID` racing `replay ID` on the same rows, as separate processes: exactly one of
//! them wins each row, and once the revisions are replayed every event was delivered
//! exactly once (never through both copies, never lost).

use crate::common::*;
use std::process::Stdio;

#[test]
fn concurrent_replay_and_edit_deliver_every_event_exactly_once() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_rev_race");
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        for round in 0..3 {
            let ids: Vec<String> = (0..12).map(|i| format!("r{round}-{i}")).collect();
            for id in &ids {
                db.add(letter(
                    id,
                    &q,
                    format!(r#"{{"amount": "1,50", "n": "{id}"}}"#).as_bytes(),
                ));
            }
            let mut children = Vec::new();
            for id in &ids {
                let replay = db
                    .cmd()
                    .args(["replay", id, "--yes"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                let edit = db
                    .cmd()
                    .args(["edit", id, "--note", "race", "--set", "amount=\"1.50\""])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                children.push((id.clone(), replay, edit));
            }
            for (id, replay, edit) in children {
                let r = Run::from(replay.wait_with_output().unwrap());
                let e = Run::from(edit.wait_with_output().unwrap());
                let won = (r.code == 0) as u8 + (e.code == 0) as u8;
                // The row's guard lets at most one of them take it. Both can lose only
                // when the replay took the row and then published nothing (it gave up
                // before sending, e.g. a slow machine); the row is then pending again.
                assert!(
                    won == 1
                        || (won == 0
                            && r.json()["detail"]
                                .as_str()
                                .is_some_and(|d| d.contains("nothing was published"))),
                    "{b:?} {id}: exactly one wins: replay {} / edit {}",
                    r.all(),
                    e.all()
                );
                assert!(r.code == 0 || r.code == 3, "{}", r.all());
                assert!(e.code == 0 || e.code == 3, "{}", e.all());
            }
            // Replay what is left: the revisions, and any original neither run took.
            for rid in db.ids(&["--state", "pending"]) {
                let r = db.dlq(&["replay", &rid, "--yes"]);
                assert_eq!(r.code, 0, "{}", r.all());
            }
            let got = rabbit.drain(&q);
            let mut per_event = std::collections::HashMap::new();
            for m in &got {
                *per_event.entry(m.message_id.clone().unwrap()).or_insert(0) += 1;
            }
            for id in &ids {
                assert_eq!(
                    per_event.get(&format!("evt-{id}")),
                    Some(&1),
                    "{b:?} {id}: {per_event:?}"
                );
            }
            assert_eq!(got.len(), ids.len(), "{b:?} round {round}");
            assert_eq!(
                db.ids(&["--state", "pending"]).len(),
                0,
                "nothing left pending"
            );
        }
    }
}
