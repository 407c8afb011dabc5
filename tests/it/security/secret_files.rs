//! Secrets from files: file flags beat variables, and a file others can read warns.

use crate::common::*;

// ---------------------------------------------------------------------------------------
// Flag over environment, files readable by others

#[test]
fn file_flags_beat_variables_and_plain_flags_beat_file_variables() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_u_flags");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("f1", &q, b"{}"));
    db.add(letter("f2", &q, b"{}"));
    let dir = tempfile::tempdir().unwrap();
    let db_file = dir.path().join("db-url");
    std::fs::write(&db_file, format!("{}\n", db.url)).unwrap();
    let amqp_file = dir.path().join("amqp-url");
    std::fs::write(&amqp_file, format!("{AMQP}\n")).unwrap();
    let nowhere = "postgres://nobody@127.0.0.1:1/none";
    let bad_amqp = "amqp://guest:wrong@127.0.0.1:5672/%2f";
    let missing = dir.path().join("missing");
    let (dbf, af, mf) = (
        db_file.to_str().unwrap(),
        amqp_file.to_str().unwrap(),
        missing.to_str().unwrap(),
    );
    // --database-url-file over DLQ_DATABASE_URL, --amqp-url-file over DLQ_AMQP_URL.
    let r = db.dlq_env(
        &[
            "--database-url-file",
            dbf,
            "--amqp-url-file",
            af,
            "replay",
            "f1",
            "--yes",
        ],
        &[("DLQ_DATABASE_URL", nowhere), ("DLQ_AMQP_URL", bad_amqp)],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    // --database-url over DLQ_DATABASE_URL_FILE, --amqp-url over DLQ_AMQP_URL_FILE.
    let r = db.dlq_env(
        &[
            "--database-url",
            &db.url,
            "--amqp-url",
            AMQP,
            "replay",
            "f2",
            "--yes",
        ],
        &[("DLQ_DATABASE_URL_FILE", mf), ("DLQ_AMQP_URL_FILE", mf)],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(rabbit.drain(&q).len(), 2);
    // Flags after the subcommand count the same.
    let r = db.dlq_env(
        &["list", "--database-url-file", dbf],
        &[("DLQ_DATABASE_URL", nowhere)],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    // Both variables: the file wins.
    let r = db.dlq_env(
        &["list"],
        &[
            ("DLQ_DATABASE_URL", nowhere),
            ("DLQ_DATABASE_URL_FILE", dbf),
        ],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    // Both flags typed: one clear error.
    for (a, b) in [
        (
            ["--database-url", db.url.as_str()],
            ["--database-url-file", dbf],
        ),
        (["--amqp-url", AMQP], ["--amqp-url-file", af]),
    ] {
        let r = db.dlq(&[a[0], a[1], b[0], b[1], "list"]);
        assert_eq!(r.code, 2, "{}", r.all());
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
        assert!(
            r.stderr.starts_with("dlq: error: ")
                && r.stderr.contains(a[0])
                && r.stderr.contains(b[0]),
            "{}",
            r.stderr
        );
    }
}

#[cfg(unix)]
#[test]
fn files_holding_a_password_warn_when_others_can_read_them() {
    use std::os::unix::fs::PermissionsExt;
    let pg = TestDb::migrated(Backend::Postgres);
    let dir = tempfile::tempdir().unwrap();
    let chmod = |p: &std::path::Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let with_pw = pg.url.replace("postgres@", "postgres:Canary6pw@");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[profiles.p]\ndatabase_url = \"{with_pw}\"\noperator = \"alice\"\n"),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    for (mode, warns) in [(0o644, true), (0o640, true), (0o600, false), (0o400, false)] {
        chmod(&config, mode);
        let mut c = pg.cmd();
        c.env_remove("DLQ_DATABASE_URL");
        let r = Run::from(
            c.args(["--config", cfg, "--profile", "p", "list"])
                .output()
                .unwrap(),
        );
        assert_eq!(r.code, 0, "{}", r.all());
        assert!(!r.all().contains("Canary6pw"));
        let warning: Vec<&str> = r
            .stderr
            .lines()
            .filter(|l| l.starts_with("dlq: warning"))
            .collect();
        if warns {
            assert_eq!(warning.len(), 1, "{mode:o}: {}", r.stderr);
            assert!(
                warning[0].contains(cfg) && warning[0].contains(&format!("chmod 600 {cfg}")),
                "{}",
                warning[0]
            );
        } else {
            assert!(warning.is_empty(), "{mode:o}: {}", r.stderr);
        }
    }
    // A URL file: warned about when it holds a password, not otherwise.
    let url_file = dir.path().join("db url");
    for (content, warns) in [(with_pw.as_str(), true), (pg.url.as_str(), false)] {
        std::fs::write(&url_file, content).unwrap();
        chmod(&url_file, 0o644);
        let r = pg.dlq(&[
            "--database-url-file",
            url_file.to_str().unwrap(),
            "claim",
            "nope",
        ]);
        assert_eq!(r.code, 4, "{}", r.all());
        let warnings = r
            .stderr
            .lines()
            .filter(|l| l.starts_with("dlq: warning"))
            .count();
        assert_eq!(warnings, usize::from(warns), "{content}: {}", r.stderr);
        if warns {
            assert!(
                r.stderr.contains("chmod 600 '"),
                "a path with a space is quoted: {}",
                r.stderr
            );
        }
    }
}
