//! Fuzzing the parsers of untrusted bytes: no panic, bounded memory (a counting global
//! allocator, per thread). `PROPTEST_CASES=100000 cargo test --release --test it fuzz_`.

use super::*;
use base64::Engine;
use proptest::prelude::*;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------
// Fuzzing the parsers of untrusted bytes: no panic, bounded memory.

mod counting {
    //! An allocator that counts this thread's live bytes and their peak, to bound what a
    //! parser allocates for its input.
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    pub struct Counting;

    thread_local! {
        static LIVE: Cell<isize> = const { Cell::new(0) };
        static PEAK: Cell<isize> = const { Cell::new(0) };
    }

    fn track(delta: isize) {
        let _ = LIVE.try_with(|l| {
            let v = l.get() + delta;
            l.set(v);
            let _ = PEAK.try_with(|p| {
                if v > p.get() {
                    p.set(v)
                }
            });
        });
    }

    // SAFETY: every call is forwarded to the system allocator unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            // SAFETY: forwarded as is.
            let p = unsafe { System.alloc(l) };
            if !p.is_null() {
                track(l.size() as isize);
            }
            p
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            // SAFETY: forwarded as is.
            unsafe { System.dealloc(p, l) };
            track(-(l.size() as isize));
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            // SAFETY: forwarded as is.
            let q = unsafe { System.realloc(p, l, new) };
            if !q.is_null() {
                track(new as isize - l.size() as isize);
            }
            q
        }
    }

    /// Runs `f` and returns the most bytes it held at once (on this thread).
    pub fn peak<R>(f: impl FnOnce() -> R) -> (R, usize) {
        let start = LIVE.with(|l| l.get());
        PEAK.with(|p| p.set(start));
        let r = f();
        let peak = PEAK.with(|p| p.get());
        (r, (peak - start).max(0) as usize)
    }
}

#[global_allocator]
static ALLOC: counting::Counting = counting::Counting;

/// What a parser may hold for an input of `len` bytes.
fn budget(len: usize) -> usize {
    64 * len + 256 * 1024
}

/// A large body is held once while its line is read: the decoded body plus the parser's
/// string buffer, never the base64 text again as a JSON value (nor `body_text` beside it).
#[test]
fn import_holds_a_large_body_once_beside_the_parsers_buffer() {
    // 3 MiB: exactly 4 MiB of base64, a size the parser's buffer grows to exactly.
    let body = "0123456789abcdef".repeat(3 * 65536);
    let b64 = base64::engine::general_purpose::STANDARD.encode(&body);
    assert_eq!(b64.len(), 4 << 20);
    let export = json!({"id": "a", "reason": "r", "body_base64": b64});
    let show = json!({"id": "a", "reason": "r", "body_base64": b64, "body_text": body});
    for line in [export, show] {
        let line = format!("{line}\n");
        let (rows, used) = counting::peak(|| dlq::import::read_lines(line.as_bytes()));
        assert_eq!(rows.unwrap()[0].body, body.as_bytes());
        let bound = b64.len() + body.len() + (256 << 10);
        assert!(used <= bound, "{used} bytes held, more than {bound}");
    }
}

/// JSON values, nested, with hostile strings: the shape of import lines, plans, headers.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::from),
        "[a-z_]{1,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("id".to_string()),
                    Just("reason".to_string()),
                    Just("body_base64".to_string()),
                    Just("body_text".to_string()),
                    Just("headers".to_string()),
                    Just("items".to_string()),
                    Just("sha256".to_string()),
                    Just("attempts".to_string()),
                    Just("dead_lettered_at".to_string()),
                    any::<String>(),
                ],
                inner,
                0..8
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn fuzz_config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(fuzz_config())]

    #[test]
    fn fuzz_import_lines(bytes in prop::collection::vec(any::<u8>(), 0..4096), lines in prop::collection::vec(json_value(), 0..6)) {
        let (_, used) = counting::peak(|| dlq::import::read_lines(&bytes[..]));
        prop_assert!(used <= budget(bytes.len()), "{used} bytes for {}", bytes.len());
        let text: String = lines.iter().map(|v| format!("{v}\n")).collect();
        let (_, used) = counting::peak(|| dlq::import::read_lines(text.as_bytes()));
        prop_assert!(used <= budget(text.len()), "{used} bytes for {}", text.len());
    }

    #[test]
    fn fuzz_import_lines_that_almost_parse(id in any::<String>(), reason in any::<String>(), b64 in "[A-Za-z0-9+/=%]{0,64}", sha in any::<String>(), attempts in any::<i64>(), at in any::<String>(), headers in json_value()) {
        let line = json!({"id": id, "reason": reason, "body_base64": b64, "sha256": sha, "attempts": attempts, "dead_lettered_at": at, "headers": headers});
        let _ = dlq::import::read_lines(format!("{line}\n").as_bytes());
        let line = json!({"id": id, "reason": reason, "body_text": b64, "headers_json": headers.to_string()});
        let _ = dlq::import::read_lines(format!("{line}\n").as_bytes());
    }

    #[test]
    fn fuzz_plan_files(bytes in prop::collection::vec(any::<u8>(), 0..4096), value in json_value(), ids in prop::collection::vec(any::<String>(), 0..8)) {
        let parse = |b: &[u8]| {
            if let Ok(plan) = serde_json::from_slice::<dlq::plan::Plan>(b) {
                for item in &plan.items {
                    let _ = dlq::model::validate_id(&item.id);
                }
            }
        };
        let (_, used) = counting::peak(|| parse(&bytes));
        prop_assert!(used <= budget(bytes.len()));
        let text = value.to_string();
        let (_, used) = counting::peak(|| parse(text.as_bytes()));
        prop_assert!(used <= budget(text.len()));
        let items: Vec<Value> = ids.iter().map(|id| json!({"id": id, "sha256": id})).collect();
        let plan = json!({"plan_id": "p", "created_at": "2026-01-01T00:00:00Z", "created_by": "x",
            "filters": {"reason": null, "producer": null, "schema_version": null, "source_queue": null,
                        "since": null, "until": null, "state": "pending"},
            "allow_mixed": false, "mix": {}, "count": ids.len(), "items": items});
        parse(plan.to_string().as_bytes());
    }

    #[test]
    fn fuzz_urls(raw in any::<String>(), pw in "[A-Za-z0-9/@#?% ]{6,16}", host in "[a-z0-9.:\\[\\]]{0,20}", tail in "[/?#=&a-z0-9%@:]{0,24}") {
        // (Constructing one also grows the process's list of secrets to scrub, which
        // thousands of fuzz cases fill: that part is not measured.)
        let u = dlq::secret::SecretUrl::new(raw.clone());
        let (_, used) = counting::peak(|| {
            let _ = (u.problem(), u.to_string(), u.has_password(), u.scheme(), format!("{u:?}"));
            let _ = dlq::publisher::parse_amqp_url(&u);
        });
        prop_assert!(used <= budget(raw.len()));
        // However a password is placed, no rendering of the URL shows it.
        let pw = format!("Pw{pw}Zq");
        for scheme in ["postgres", "postgresql", "amqp", "amqps", "sqlite", "mysql"] {
            for url in [
                format!("{scheme}://user:{pw}@{host}{tail}"),
                format!("{scheme}:user:{pw}@{host}{tail}"),
                format!("{scheme}://user@{host}{tail}?password={pw}"),
                format!("{scheme}://{host}/db?a=1&sslpassword={pw}&b=2"),
            ] {
                let u = dlq::secret::SecretUrl::new(url.clone());
                let shown = format!("{u} {u:?} {}", u.problem().unwrap_or(""));
                prop_assert!(!shown.contains(&pw), "{url:?} shown as {shown:?}");
                let _ = dlq::publisher::parse_amqp_url(&u).map_err(|e| {
                    assert!(!e.to_string().contains(&pw), "{url:?}: {e}");
                });
            }
        }
    }

    #[test]
    fn fuzz_durations_and_times(s in any::<String>(), n in any::<u64>(), unit in "(ns|us|ms|s|m|h|d|w|y|M|)") {
        let now = chrono::Utc::now();
        for t in [s.clone(), format!("{n}{unit}"), format!("{n}{unit}{n}{unit}"), format!("-{n}{unit}")] {
            let _ = dlq::timeparse::parse_duration(&t);
            let _ = dlq::timeparse::parse_time(&t, now);
            let _ = dlq::timeparse::duration_arg(&t);
            let _ = dlq::timeparse::time_arg(&t);
        }
    }

    #[test]
    fn fuzz_header_json(s in any::<String>(), value in json_value(), depth in 0usize..300) {
        let _ = dlq::model::parse_headers(&s);
        let nested = format!("{}{}{}", "{\"a\":[".repeat(depth), value, "]}".repeat(depth));
        let (_, used) = counting::peak(|| {
            for text in [value.to_string(), nested.clone(), format!("{{\"h\":{value}}}")] {
                let h = dlq::model::parse_headers(&text);
                let out = dlq::publisher::replay_headers(&h, "id", "reason", "op");
                let _ = dlq::publisher::to_field_table(&out);
            }
        });
        prop_assert!(used <= budget(nested.len() * 3));
    }

    #[test]
    fn fuzz_the_sanitizer(s in any::<String>(), hostile in prop::collection::vec(prop::sample::select(ATTACKS.to_vec()), 0..6)) {
        let s = format!("{s}{}", hostile.concat());
        let line = dlq::sanitize::line(&s);
        prop_assert!(!line.chars().any(is_raw_control));
        prop_assert!(line.len() <= 10 * s.len() + 16);
        let block = dlq::sanitize::block(&s);
        prop_assert!(!block.chars().any(is_raw_control));
        let md = dlq::sanitize::markdown_cell(&s);
        prop_assert_eq!(unescaped_pipes(&md), 0);
        prop_assert!(!md.chars().any(is_raw_control));
    }
}
