//! A selection's mix for a prompt: which producers and schema versions (the top few, with
//! counts), so that a bulk change says what it is about to touch.

use super::Result;
use std::collections::BTreeMap;

/// Rows read for the breakdown: enough to name the mix of any selection a person reads.
const SAMPLE: usize = 5000;

/// The top three values with counts, and how many others: `billing 2, orders 1`.
pub fn top(counts: &BTreeMap<String, usize>) -> String {
    let mut v: Vec<(&String, &usize)> = counts.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let mut shown: Vec<String> = v.iter().take(3).map(|(k, n)| format!("{k} {n}")).collect();
    if v.len() > 3 {
        shown.push(format!("{} more", v.len() - 3));
    }
    shown.join(", ")
}

/// `  producers: …` and `  schema versions: …` of the rows `ids` (the first [`SAMPLE`]).
pub async fn lines(store: &dyn dlq::store::Store, ids: &[String]) -> Result<String> {
    let rows = store.summaries(&ids[..ids.len().min(SAMPLE)]).await?;
    let mut producers = BTreeMap::new();
    let mut schemas = BTreeMap::new();
    for r in &rows {
        *producers
            .entry(super::output::opt(&r.producer))
            .or_default() += 1;
        *schemas
            .entry(super::output::opt(&r.schema_version))
            .or_default() += 1;
    }
    let of = match ids.len() > SAMPLE {
        true => format!(" (of the first {SAMPLE})"),
        false => String::new(),
    };
    Ok(format!(
        "  producers:       {}{of}\n  schema versions: {}{of}",
        top(&producers),
        top(&schemas)
    ))
}
