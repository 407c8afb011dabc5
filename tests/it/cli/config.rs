//! Configuration: the config file's errors (exit 1, what and where), profiles, and the
//! order flag > environment > profile > default.

use crate::common::*;

/// Everything wrong with the config file exits 1 (bad configuration, as the contract
/// and README say) with a one-line error that says what and where; typed arguments
/// stay usage errors (2).
#[test]
fn configuration_errors_exit_1_and_say_what_is_wrong() {
    let db = TestDb::migrated(Backend::Sqlite);
    let xdg = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let mut c = db.cmd();
        c.env("XDG_CONFIG_HOME", xdg.path());
        Run::from(c.args(args).output().unwrap())
    };
    // An unknown field: its name and line are in the error.
    write_config(
        xdg.path(),
        "[profiles.staging]\noperator = \"x\"\nbogus = 1\n",
    );
    let r = run(&["--profile", "staging", "list"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(
        r.stderr.contains("unknown field `bogus`") && r.stderr.contains("line 3"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    // Malformed TOML.
    write_config(xdg.path(), "[profiles.staging\n");
    let r = run(&["--profile", "staging", "list"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("line 1"), "{}", r.stderr);
    // An unknown profile.
    write_config(xdg.path(), "[profiles.staging]\noperator = \"x\"\n");
    let r = run(&["--profile", "prod", "list"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("no profile \"prod\""), "{}", r.stderr);
    // A bad URL in a profile is configuration; the same URL typed is usage.
    write_config(
        xdg.path(),
        "[profiles.staging]\ndatabase_url = \"postgres://u:SECRETPW@[::1/x\"\n",
    );
    let mut c = db.cmd();
    c.env_remove("DLQ_DATABASE_URL")
        .env("XDG_CONFIG_HOME", xdg.path());
    let r = Run::from(c.args(["--profile", "staging", "list"]).output().unwrap());
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(
        r.stderr.contains("profile staging") && !r.stderr.contains("SECRETPW"),
        "{}",
        r.stderr
    );
    let mut c = db.cmd();
    c.env_remove("DLQ_DATABASE_URL");
    let r = Run::from(
        c.args(["--database-url", "postgres://u:SECRETPW@[::1/x", "list"])
            .output()
            .unwrap(),
    );
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(!r.stderr.contains("SECRETPW"), "{}", r.stderr);
    // A bad URL parameter likewise: 1 from the profile (it exited 2), 2 typed.
    let bad = "postgres://postgres:SECRETPW@127.0.0.1:5432/postgres?sslmode=bogus";
    write_config(
        xdg.path(),
        &format!("[profiles.staging]\ndatabase_url = \"{bad}\"\n"),
    );
    let mut c = db.cmd();
    c.env_remove("DLQ_DATABASE_URL")
        .env("XDG_CONFIG_HOME", xdg.path());
    let r = Run::from(c.args(["--profile", "staging", "list"]).output().unwrap());
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(
        r.stderr.contains("profile staging")
            && r.stderr.contains("sslmode")
            && !r.stderr.contains("SECRETPW"),
        "{}",
        r.stderr
    );
    let r = db.dlq_env(&["list"], &[("DLQ_DATABASE_URL", bad)]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(!r.stderr.contains("SECRETPW"), "{}", r.stderr);
}

/// A profile's `lease` is checked by the commands that take a lease: a bad one does
/// not stop `list`, and stops `claim` as a configuration error.
#[test]
fn a_bad_lease_in_a_profile_does_not_break_list() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(serde_json::json!({"id": "a1", "body_text": "{}", "reason": "poison_message"}));
    let xdg = tempfile::tempdir().unwrap();
    write_config(
        xdg.path(),
        &format!(
            "[profiles.staging]\ndatabase_url = \"{}\"\nlease = \"soon\"\n",
            db.url
        ),
    );
    let run = |args: &[&str]| {
        let mut c = db.cmd();
        c.env_remove("DLQ_DATABASE_URL")
            .env("XDG_CONFIG_HOME", xdg.path());
        Run::from(c.args(args).output().unwrap())
    };
    let r = run(&["--profile", "staging", "list"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.ids(), vec!["a1".to_string()]);
    let r = run(&["--profile", "staging", "claim", "a1"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("lease"), "{}", r.stderr);
}

#[test]
fn profile_resolution_order_is_flag_env_profile_default() {
    let a = TestDb::migrated(Backend::Sqlite);
    let b = TestDb::migrated(Backend::Sqlite);
    a.add(serde_json::json!({"id": "only-in-a", "body_text": "{}", "reason": "poison_message"}));
    b.add(serde_json::json!({"id": "only-in-b", "body_text": "{}", "reason": "poison_message"}));
    let xdg = tempfile::tempdir().unwrap();
    write_config(
        xdg.path(),
        &format!("[profiles.staging]\ndatabase_url = \"{}\"\noperator = \"from-profile\"\nlease = \"7m\"\n", a.url),
    );
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = a.cmd();
        c.env_remove("DLQ_DATABASE_URL")
            .env_remove("DLQ_OPERATOR")
            .env("XDG_CONFIG_HOME", xdg.path());
        for (k, v) in env {
            c.env(k, v);
        }
        Run::from(c.args(args).output().unwrap())
    };
    let ids = |r: &Run| r.ids();
    // profile > default
    assert_eq!(
        ids(&run(&["--profile", "staging", "list"], &[])),
        ["only-in-a"]
    );
    // env > profile
    assert_eq!(
        ids(&run(
            &["--profile", "staging", "list"],
            &[("DLQ_DATABASE_URL", &b.url)]
        )),
        ["only-in-b"]
    );
    // flag > env > profile
    assert_eq!(
        ids(&run(
            &["--profile", "staging", "--database-url", &b.url, "list"],
            &[("DLQ_DATABASE_URL", &a.url)]
        )),
        ["only-in-b"]
    );
    // DLQ_PROFILE selects it too; the profile's operator and lease are used.
    let r = run(&["claim", "only-in-a"], &[("DLQ_PROFILE", "staging")]);
    assert_eq!(r.code, 0, "{}", r.all());
    let j = r.json();
    assert!(j["token"].as_str().unwrap().starts_with("from-profile:"));
    assert!(j["detail"].as_str().unwrap().contains("7m"), "{j}");
    // flag > profile for the operator and the lease
    let r = run(
        &[
            "--profile",
            "staging",
            "--operator",
            "flag-op",
            "claim",
            "only-in-a",
            "--lease",
            "3m",
        ],
        &[],
    );
    assert_eq!(r.code, 3, "still claimed by from-profile: {}", r.all());
    assert!(r.json()["detail"]
        .as_str()
        .unwrap()
        .contains("from-profile"));
    // without a profile: the built-in default sqlite://dlq.db in the working directory.
    let cwd = tempfile::tempdir().unwrap();
    let mut c = a.cmd();
    c.env_remove("DLQ_DATABASE_URL")
        .current_dir(cwd.path())
        .args(["list"]);
    let r = Run::from(c.output().unwrap());
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("dlq.db") && r.stderr.contains("dlq migrate"),
        "{}",
        r.stderr
    );
    // unknown profile: bad configuration
    let r = run(&["--profile", "prod", "list"], &[]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("no profile \"prod\"") && r.stderr.contains("staging"),
        "{}",
        r.stderr
    );
}
