//! The editor flow through a fake `$EDITOR`: save, cancel (unchanged or empty), and a
//! buffer that is not JSON, which opens again with the error on top.

use super::{add, body_of, revision_of, BODY};
use crate::common::*;
use std::os::unix::fs::PermissionsExt;

fn script(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{text}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.display().to_string()
}

#[test]
fn editor_save_cancel_and_invalid_json_then_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let fix = script(dir.path(), "fix", r#"sed -i 's/"1,50"/"1.50"/' "$1""#);
    let keep = script(dir.path(), "keep", "true");
    let empty = script(dir.path(), "empty", r#": > "$1""#);
    let count = dir.path().join("count");
    let twice = script(
        dir.path(),
        "twice",
        &format!(
            r#"n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}
if [ $n = 1 ]; then sed -i 's/"1,50"/"1.50"/; s/"rate": 1.10,/"rate": 1.10,,/' "$1"; exit 0; fi
head -1 "$1" | grep -q '^# dlq: this is not valid JSON' || exit 9
sed -i 's/,,/,/' "$1""#,
            c = count.display()
        ),
    );
    for b in BACKENDS {
        let _ = std::fs::remove_file(&count);
        let db = TestDb::migrated(b);
        for id in ["e1", "e2", "e3", "e4"] {
            add(&db, id, BODY.as_bytes());
        }
        let want = BODY.replace("1,50", "1.50").into_bytes();
        let edit = |id: &str, editor: &str| {
            db.dlq_env(
                &["edit", id, "--note", "by hand", "--editor"],
                &[("EDITOR", editor), ("VISUAL", editor)],
            )
        };
        let r = edit("e1", &fix);
        assert_eq!(
            (r.code, r.json()["outcome"].as_str()),
            (0, Some("edited")),
            "{}",
            r.all()
        );
        assert_eq!(
            body_of(&revision_of(&db, "e1")),
            want,
            "{b:?}: only the changed value, as the body wrote the rest"
        );
        for (id, editor) in [("e2", &keep), ("e3", &empty)] {
            let r = edit(id, editor);
            assert_eq!(
                (r.code, r.json()["outcome"].as_str()),
                (0, Some("unchanged")),
                "{}",
                r.all()
            );
            assert_eq!(
                db.show(id)["state"],
                "pending",
                "{b:?} {id}: cancelled, nothing written"
            );
        }
        let r = edit("e4", &twice);
        assert_eq!(
            (r.code, r.json()["outcome"].as_str()),
            (0, Some("edited")),
            "{}",
            r.all()
        );
        assert_eq!(
            std::fs::read_to_string(&count).unwrap().trim(),
            "2",
            "opened twice"
        );
        assert_eq!(body_of(&revision_of(&db, "e4")), want);
        assert_eq!(db.ids(&["--revisions"]).len(), 2, "{b:?}");
    }
}
