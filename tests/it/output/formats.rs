//! `-o` decides what stdout carries, wherever it goes: `-o table` through a pipe is a
//! table (or text), never JSON; without `-o`, JSON when piped.

use crate::common::*;

/// Once broke: `replay --plan ... -o table | cut` printed JSON lines, because the plan
/// run picked its format by whether a progress bar was shown (issue 25, item 4).
#[test]
fn a_plan_run_through_a_pipe_honours_o_table() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_fmt");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("fmt-1", &q, b"{}"));
    db.add(letter("fmt-2", &q, b"{}"));
    let plan = db.plan_file(&[]);
    let path = plan.path().to_str().unwrap();
    let t = db.dlq(&["replay", "--plan", path, "--yes", "-o", "table"]);
    assert_eq!(t.code, 0, "{}", t.all());
    assert!(
        t.stdout.lines().all(|l| !l.trim_start().starts_with('{')),
        "JSON on stdout with -o table:\n{}",
        t.stdout
    );
    assert!(t.stdout.contains("2 of 2 done"), "{}", t.all());
    assert_eq!(rabbit.drain(&q).len(), 2);
    // Without -o a pipe still gets JSON lines (the contract's default), one per item.
    db.add(letter("fmt-3", &q, b"{}"));
    let plan = db.plan_file(&[]);
    let mut c = db.cmd();
    c.env_remove("DLQ_OUTPUT");
    let args = ["replay", "--plan", plan.path().to_str().unwrap(), "--yes"];
    let j = Run::from(c.args(args).output().unwrap());
    assert_eq!(summary_of(&j)["done"], 1, "{}", j.all());
    assert_eq!(j.lines().len(), 2, "{}", j.all());
}
