//! Formats for scripts: `-o tsv` (a header line unless `--no-headers`), `--no-headers` on
//! a table, and `-q` on `list` and `plan` (IDs only, one per line, for `xargs`).

use crate::common::*;

fn three(db: &TestDb) {
    for (id, producer) in [
        ("tsv-1", "billing"),
        ("tsv-2", "billing"),
        ("tsv-3", "inventory"),
    ] {
        let mut l = letter(id, "orders", b"{}");
        l["producer"] = producer.into();
        l["error"] = "ValueError: bad\tamount\nline two".into();
        db.add(l);
    }
}

#[test]
fn list_as_tsv_has_one_header_line_and_a_tab_between_cells() {
    let db = TestDb::migrated(Backend::Sqlite);
    three(&db);
    let r = db.dlq(&["list", "-o", "tsv"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", r.stdout);
    assert!(
        lines[0].starts_with("ID\tDEAD-LETTERED\tREASON\tPRODUCER\t"),
        "{}",
        lines[0]
    );
    let cols = lines[0].split('\t').count();
    for l in &lines[1..] {
        let cells: Vec<&str> = l.split('\t').collect();
        assert_eq!(cells.len(), cols, "a tab inside a cell: {l:?}");
        assert!(cells[0].starts_with("tsv-"), "{l}");
        assert_eq!(
            cells[cols - 1],
            "ValueError: bad\\tamount\\nline two",
            "{l}"
        );
    }
    let r = db.dlq(&["list", "-o", "tsv", "--no-headers"]);
    assert_eq!(r.stdout.lines().count(), 3, "{}", r.stdout);
    assert!(
        r.stdout.lines().all(|l| l.starts_with("tsv-")),
        "{}",
        r.stdout
    );
}

#[test]
fn aggregate_as_tsv_has_plain_numbers() {
    let db = TestDb::migrated(Backend::Sqlite);
    three(&db);
    let r = db.dlq(&["aggregate", "--by", "producer", "-o", "tsv"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines[0].split('\t').take(2).collect::<Vec<_>>(),
        ["PRODUCER", "COUNT"],
        "{}",
        r.stdout
    );
    assert!(
        lines[1].starts_with("billing\t2\t2\t0\t0\t0\t0\t"),
        "{}",
        r.stdout
    );
    let r = db.dlq(&["aggregate", "--by", "producer", "-o", "tsv", "--no-headers"]);
    let first: Vec<&str> = r
        .stdout
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(first, ["billing", "inventory"], "{}", r.stdout);
}

#[test]
fn no_headers_leaves_out_a_tables_header() {
    let db = TestDb::migrated(Backend::Sqlite);
    three(&db);
    let with = db.dlq(&["list", "-o", "table"]);
    assert!(with.stdout.contains("PRODUCER"), "{}", with.stdout);
    let without = db.dlq(&["list", "-o", "table", "--no-headers"]);
    assert_eq!(without.code, 0, "{}", without.all());
    assert!(
        !without.stdout.contains("PRODUCER") && without.stdout.contains("tsv-1"),
        "{}",
        without.stdout
    );
}

#[test]
fn quiet_list_and_plan_print_ids_one_a_line_whatever_the_format() {
    let db = TestDb::migrated(Backend::Sqlite);
    three(&db);
    for o in ["json", "table", "tsv", "markdown"] {
        let r = db.dlq(&["list", "-q", "--producer", "billing", "-o", o]);
        assert_eq!(r.code, 0, "{}", r.all());
        let mut ids: Vec<&str> = r.stdout.lines().collect();
        ids.sort();
        assert_eq!(ids, ["tsv-1", "tsv-2"], "-o {o}: {}", r.stdout);
    }
    let r = db.dlq(&["plan", "--quiet", "--producer", "billing"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.stdout, "tsv-1\ntsv-2\n", "{}", r.all());
    // The IDs feed `xargs -n1 dlq show`.
    let shown = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} list -q --producer inventory | xargs -n1 {} show -o json",
            bin(),
            bin()
        ))
        .envs(db.cmd().get_envs().filter_map(|(k, v)| Some((k, v?))))
        .output()
        .unwrap();
    let s: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(s["id"], "tsv-3");
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_dlq")
}
