//! `dlq show`: every column, body, hash and headers; an unknown ID.

use super::*;
use crate::common::*;
use serde_json::json;

#[test]
fn show_of_an_unknown_id_prints_the_same_not_found_report_as_claim() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let show = db.dlq(&["show", "nosuch"]);
        let claim = db.dlq(&["claim", "nosuch"]);
        assert_eq!(show.code, 4, "{}", show.all());
        assert_eq!(claim.code, 4, "{}", claim.all());
        let (s, c) = (show.json(), claim.json());
        assert_eq!(s["outcome"], "not_found", "{s}");
        assert_eq!(s["id"], "nosuch");
        assert_eq!(s, c, "show and claim report an unknown ID alike");
        // On a terminal table the same report, on stdout.
        let t = db.dlq(&["show", "nosuch", "-o", "table"]);
        assert_eq!(t.code, 4);
        assert!(t.stdout.contains("nosuch: not_found"), "{}", t.all());
    }
}

#[test]
fn show_prints_every_column_body_hash_and_headers() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        db.import_examples();
        let lines = std::fs::read_to_string(examples_file()).unwrap();
        let original: Vec<serde_json::Value> = lines
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // The non-UTF-8 poison body.
        let poison = original
            .iter()
            .find(|r| {
                r["error"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("UnicodeDecodeError")
            })
            .unwrap();
        let s = db.show(poison["id"].as_str().unwrap());
        assert_eq!(s["body_base64"], poison["body_base64"]);
        assert_eq!(s["sha256"], poison["sha256"]);
        assert!(s.get("body_text").is_none(), "not UTF-8: no body_text");
        assert_eq!(s["history"], json!([]));
        assert_eq!(s["headers"]["x-first-death-queue"], "orders.created");
        for k in LIST_KEYS {
            assert!(s.get(k).is_some(), "show misses {k}");
        }
        // The hex dump in the table view.
        let t = db.dlq(&["show", poison["id"].as_str().unwrap(), "-o", "table"]);
        assert!(
            t.stdout.contains("hex dump") && t.stdout.contains("ff fe 00"),
            "{}",
            t.stdout
        );
        // JSON bodies are pretty printed; the large body is cut in the table view only.
        let large = original
            .iter()
            .find(|r| {
                r["error"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("PayloadTooLarge")
            })
            .unwrap();
        let t = db.dlq(&["show", large["id"].as_str().unwrap(), "-o", "table"]);
        assert!(t.stdout.contains("more bytes not shown"), "{b:?}");
        let s = db.show(large["id"].as_str().unwrap());
        assert_eq!(s["body_base64"], large["body_base64"]);
        assert!(s["body_text"].as_str().unwrap().len() > 100_000);
    }
}
