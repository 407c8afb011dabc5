//! What `dlq replay --plan` shows as it goes. With `-o json` one JSON line per item on
//! stdout; otherwise a line on stderr for each item not replayed. On a terminal (not with
//! `-o json`) a progress bar on stderr (counts per outcome, the current rate, what the run
//! waits for); without one, a line on stderr when a wait (canary, target depth) starts and
//! ends. The bar never decides what stdout carries: `-o` does.

use super::super::report::ItemView;
use super::super::Ctx;
use dlq::model::Outcome;
use dlq::plan::RunEvent;
use dlq::publisher::Pacer;
use std::collections::BTreeMap;
use std::sync::Arc;

/// How a run's events are shown.
pub struct Progress<'a> {
    ctx: &'a Ctx,
    bar: Option<indicatif::ProgressBar>,
    pacer: Option<Arc<Pacer>>,
    counts: BTreeMap<Outcome, usize>,
    switches: usize,
    /// What the run waits for now, if anything.
    waiting: Option<String>,
}

impl<'a> Progress<'a> {
    /// A bar when the output module says one goes on stderr, else lines.
    pub fn new(ctx: &'a Ctx, len: u64, pacer: Option<Arc<Pacer>>) -> Self {
        Progress {
            ctx,
            bar: ctx.out.progress_bar().then(|| progress_bar(len)),
            pacer,
            counts: BTreeMap::new(),
            switches: 0,
            waiting: None,
        }
    }

    pub fn finish(&self) {
        if let Some(pb) = &self.bar {
            pb.finish_and_clear();
        }
    }

    pub fn on_event(&mut self, e: RunEvent<'_>) {
        match e {
            RunEvent::Item(r, summary) => {
                if self.ctx.out.is_json() {
                    self.ctx.out.json_line(&ItemView::of(r));
                }
                *self.counts.entry(r.outcome).or_default() += 1;
                self.switches = summary.node_switches;
                let line = (r.outcome != Outcome::Replayed && !self.ctx.out.is_json())
                    .then(|| ItemView::of(r).line());
                match (&self.bar, line) {
                    (Some(pb), line) => {
                        pb.inc(1);
                        line.into_iter().for_each(|l| pb.println(l));
                    }
                    (None, Some(line)) => crate::cli::output::say(&line),
                    (None, None) => {}
                }
            }
            RunEvent::CanaryWait { sent, wait } => {
                let wait = humantime::format_duration(wait);
                self.wait(
                    format!("canary: {sent} sent, watching {wait} for any to come back"),
                    format!("canary: {sent} sent; watching {wait} for any of them to come back as a new dead letter before going on"),
                );
            }
            RunEvent::CanaryPassed => {
                let ramp = match self.pacer {
                    Some(_) => "; the ramp starts",
                    None => "",
                };
                self.go_on(format!(
                    "canary passed: none of its items came back; going on{ramp}"
                ));
            }
            RunEvent::DepthWait { queue, ready, max } => {
                let said = self.waiting.is_some();
                let bar = format!("waiting: queue {queue} holds {ready} ready (max {max})");
                let line = format!("waiting: target queue {queue} holds {ready} ready messages, more than --max-target-depth {max}");
                match said && self.bar.is_none() {
                    true => self.waiting = Some(bar),
                    false => self.wait(bar, line),
                }
            }
            RunEvent::DepthBelow { queue, ready } => self.go_on(format!(
                "target queue {queue} is down to {ready} ready messages; going on"
            )),
        }
        self.refresh();
    }

    /// A wait starts: `bar` in the bar, or `line` on stderr.
    fn wait(&mut self, bar: String, line: String) {
        if self.bar.is_none() {
            say(&line);
        }
        self.waiting = Some(bar);
    }

    /// A wait ends, said on stderr without a bar.
    fn go_on(&mut self, line: String) {
        if self.bar.is_none() {
            say(&line);
        }
        self.waiting = None;
    }

    fn refresh(&self) {
        let Some(pb) = &self.bar else { return };
        let mut parts: Vec<String> = self
            .counts
            .iter()
            .map(|(o, n)| format!("{o} {n}"))
            .collect();
        if self.switches > 0 {
            parts.push(format!("node switches {}", self.switches));
        }
        if let Some(p) = &self.pacer {
            parts.push(format!("rate {:.1}/s", p.rate_now()));
        }
        parts.extend(self.waiting.clone());
        pb.set_message(dlq::sanitize::line(&parts.join(", ")).into_owned());
    }
}

fn say(line: &str) {
    crate::cli::output::say(&format!("dlq: {line}"));
}

fn progress_bar(len: u64) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {rate} eta {eta} {msg}")
            .map(|s| {
                s.with_key(
                    "rate",
                    |p: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                        let _ = w.write_str(&rate_text(p.per_sec()));
                    },
                )
            })
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb
}

/// Items a second as a person reads it: one decimal under 10/s, none above
/// (indicatif's `{per_sec}` printed `1.9429/s`).
fn rate_text(per_sec: f64) -> String {
    match per_sec {
        r if !r.is_finite() || r <= 0.0 => "0/s".into(),
        r if r < 10.0 => format!("{r:.1}/s"),
        r => format!("{r:.0}/s"),
    }
}

#[cfg(test)]
mod tests {
    /// Once broke: the bar showed `1.9429/s` (issue 25, item 9).
    #[test]
    fn the_rate_has_at_most_one_decimal() {
        assert_eq!(super::rate_text(1.9429), "1.9/s");
        assert_eq!(super::rate_text(19.6), "20/s");
        assert_eq!(super::rate_text(f64::INFINITY), "0/s");
        assert_eq!(super::rate_text(0.0), "0/s");
    }
}
