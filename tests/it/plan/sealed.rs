//! Plans are bound to their database, sealed, and say when they are cut short.

use crate::common::*;
use serde_json::{json, Value};

fn write_plan(db: &TestDb, args: &[&str]) -> (tempfile::NamedTempFile, Run) {
    let mut a = vec!["plan"];
    a.extend_from_slice(args);
    let r = db.dlq(&a);
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), &r.stdout).unwrap();
    (f, r)
}

#[test]
fn plans_are_bound_to_their_database_sealed_and_say_when_cut() {
    let a = TestDb::migrated(Backend::Sqlite);
    let b = TestDb::migrated(Backend::Sqlite);
    let pg = TestDb::migrated(Backend::Postgres);
    for db in [&a, &b, &pg] {
        db.import_examples();
    }
    let (file, r) = write_plan(&a, &["--reason", "retries_exhausted", "--limit", "4"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(
        r.stderr.contains(": 4 of 9 dead letters (raise --limit)"),
        "{}",
        r.stderr
    );
    let plan = r.json();
    assert_eq!(plan["matched"], 9);
    assert_eq!(plan["count"], 4);
    assert!(plan["database_id"].is_string());
    assert!(plan["digest"].is_string());
    let p = file.path().to_str().unwrap();
    // Another database, of either kind: refused before anything is claimed.
    for other in [&b, &pg] {
        for args in [
            vec!["replay", "--plan", p, "--yes"],
            vec![
                "resolve",
                "--plan",
                p,
                "--delivered",
                "--note",
                "x",
                "--yes",
            ],
            vec!["discard", "--plan", p, "--note", "x", "--yes"],
        ] {
            let r = other.dlq(&args);
            assert_eq!(r.code, 2, "{args:?}: {}", r.all());
            assert!(r.stderr.contains("another database"), "{}", r.stderr);
        }
        assert_eq!(
            other
                .dlq(&["list", "--state", "pending"])
                .json()
                .as_array()
                .unwrap()
                .len(),
            33
        );
    }
    // Edited plans: filters, an item, the count.
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut v = plan.clone();
        f(&mut v);
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), v.to_string()).unwrap();
        let r = a.dlq(&[
            "discard",
            "--plan",
            file.path().to_str().unwrap(),
            "--note",
            "x",
            "--yes",
        ]);
        assert_eq!(r.code, 2, "{}", r.all());
        r.stderr
    };
    assert!(edit(&|v| v["filters"]["reason"] = json!("poison_message")).contains("edited"));
    assert!(edit(&|v| v["items"][0]["id"] = plan["items"][1]["id"].clone()).contains("twice"));
    let e = edit(&|v| {
        v["items"].as_array_mut().unwrap().pop();
    });
    assert!(e.contains("says 4 dead letters but lists 3"), "{e}");
    let e = edit(&|v| {
        v["items"].as_array_mut().unwrap().pop();
        v["count"] = json!(3);
    });
    assert!(e.contains("edited"), "{e}");
    assert!(edit(&|v| {
        v.as_object_mut().unwrap().remove("digest");
    })
    .contains("no digest"));
    // The plan itself still works where it was made.
    let r = a.dlq(&["discard", "--plan", p, "--note", "x", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    // --state is honoured or refused.
    let (_, r) = write_plan(&a, &["--state", "replayed"]);
    assert_eq!(r.code, 2, "{}", r.all());
}
