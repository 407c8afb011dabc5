//! `dlq list` on many rows: the capped count ("50 of 10,000+ shown", `--count` for the
//! exact number) and rows streamed to stdout (the same JSON array, tables in chunks).

use crate::common::*;

const FLOOD: usize = 10_050;

/// `n` rows in one statement, newest `f-000001`; every fourth is a `poison_message`.
fn flood(db: &TestDb, n: usize) {
    let sql = match db.backend {
        Backend::Postgres => format!(
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, dead_lettered_at) \
             SELECT 'f-' || lpad(g::text, 6, '0'), '\\x7b7d'::bytea, \
                    CASE WHEN g % 4 = 0 THEN 'poison_message' ELSE 'retries_exhausted' END, \
                    1, '{{}}', now() - g * interval '1 second' \
             FROM generate_series(1, {n}) g"
        ),
        Backend::Sqlite => format!(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {n}) \
             INSERT INTO dead_letters (id, body, reason, attempts, headers_json, dead_lettered_at) \
             SELECT printf('f-%06d', n), X'7b7d', \
                    CASE WHEN n % 4 = 0 THEN 'poison_message' ELSE 'retries_exhausted' END, \
                    1, '{{}}', CAST(strftime('%s', 'now') AS INTEGER) * 1000 - n * 1000 \
             FROM g"
        ),
    };
    db.sql(&[&sql]);
}

#[test]
fn list_counts_a_flood_up_to_10000_and_exactly_with_count() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        flood(&db, FLOOD);

        let r = db.dlq(&["list"]);
        assert_eq!(r.code, 0, "{backend:?}: {}", r.all());
        assert_eq!(r.json().as_array().unwrap().len(), 50);
        assert_eq!(
            r.stderr.trim(),
            "50 of 10,000+ shown (raise --limit or narrow the filters)",
            "{backend:?}"
        );

        let r = db.dlq(&["list", "--count"]);
        assert_eq!(r.code, 0, "{backend:?}: {}", r.all());
        assert_eq!(
            r.stderr.trim(),
            "50 of 10,050 shown (raise --limit or narrow the filters)",
            "{backend:?}"
        );

        // Under the cap the count is exact without asking.
        let r = db.dlq(&["list", "--reason", "poison_message", "--limit", "10"]);
        assert_eq!(
            r.stderr.trim(),
            "10 of 2,512 shown (raise --limit or narrow the filters)",
            "{backend:?}"
        );

        // A limit above the cap is counted up to the limit.
        let r = db.dlq(&["list", "--limit", "10020"]);
        assert_eq!(r.json().as_array().unwrap().len(), 10_020);
        assert_eq!(
            r.stderr.trim(),
            "10,020 of 10,020+ shown (raise --limit or narrow the filters)",
            "{backend:?}"
        );

        // Every row shown: nothing to add.
        let r = db.dlq(&["list", "--limit", "20000"]);
        assert_eq!(r.json().as_array().unwrap().len(), FLOOD, "{backend:?}");
        assert_eq!(r.stderr, "", "{backend:?}");
    }
}

#[test]
fn list_streams_many_rows_as_the_same_array_and_tables_in_chunks() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        flood(&db, 2_500);

        let all = db.dlq(&["list", "--limit", "3000"]);
        assert_eq!(all.code, 0, "{backend:?}: {}", all.all());
        let rows = all.json();
        let rows = rows.as_array().unwrap();
        assert_eq!(rows.len(), 2_500, "{backend:?}");
        assert_eq!(rows[0]["id"], "f-000001");
        assert_eq!(rows[2_499]["id"], "f-002500");
        // The same items, byte for byte, as a run that holds its few rows: the big run's
        // text goes on where the small one closes its array.
        let few = db.dlq(&["list", "--limit", "7"]);
        assert_eq!(few.json().as_array().unwrap()[..], rows[..7], "{backend:?}");
        let open = few.stdout.strip_suffix("\n]\n").unwrap();
        assert!(
            all.stdout
                .starts_with(&format!("{open},\n  {{\n    \"id\": \"f-000008\"")),
            "{backend:?}: the stream differs from the whole array"
        );
        // And what serde_json prints for the whole array held in memory (before: the same
        // rows in a Vec): same bytes.
        let held: Vec<dlq::model::Summary> = serde_json::from_str(&all.stdout).unwrap();
        assert!(
            all.stdout == format!("{}\n", serde_json::to_string_pretty(&held).unwrap()),
            "{backend:?}: not the bytes of the whole array"
        );
        for (format, header) in [("table", "│ ID "), ("markdown", "| ID ")] {
            let r = db.dlq(&["-o", format, "list", "--limit", "2500"]);
            assert_eq!(r.code, 0, "{backend:?} {format}: {}", r.all());
            // Tables of 1,000 rows, each with its header, an empty line apart.
            assert_eq!(r.stdout.matches(header).count(), 3, "{backend:?} {format}");
            assert_eq!(r.stdout.matches("\n\n").count(), 2, "{backend:?} {format}");
            for id in ["f-000001", "f-001000", "f-001001", "f-002500"] {
                assert_eq!(r.stdout.matches(id).count(), 1, "{backend:?} {format} {id}");
            }
        }
        let empty = db.dlq(&["list", "--reason", "nothing"]);
        assert_eq!(empty.stdout, "[]\n", "{backend:?}");
        let empty = db.dlq(&["-o", "table", "list", "--reason", "nothing"]);
        assert_eq!(empty.stdout.matches("│ ID ").count(), 1, "{backend:?}");
    }
}
