//! How fast a plan run publishes: a fixed cap (`--rate`) or one that rises linearly
//! (`--ramp`), kept by one [`Pacer`] shared by all the connections of a run.
//!
//! A ramp only rises, so the rate at any moment is the slowest the run will go from then
//! on: what is budgeted at the current rate (a chunk's sending time, a lease) holds.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Publishes per second a run may make.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    /// At most this many a second.
    Fixed(f64),
    /// `from` a second until the ramp starts, then rising linearly to `to` over `over`.
    Ramp { from: f64, to: f64, over: Duration },
}

impl Rate {
    /// The rate `elapsed` after the ramp started (`None`: not started yet).
    pub fn at(&self, elapsed: Option<Duration>) -> f64 {
        match *self {
            Rate::Fixed(r) => r,
            Rate::Ramp { from, to, over } => {
                let Some(e) = elapsed else { return from };
                let done = match over.is_zero() {
                    true => 1.0,
                    false => (e.as_secs_f64() / over.as_secs_f64()).min(1.0),
                };
                from + (to - from) * done
            }
        }
    }

    /// The slowest rate it ever runs at (the ramp's first).
    pub fn slowest(&self) -> f64 {
        match *self {
            Rate::Fixed(r) => r,
            Rate::Ramp { from, .. } => from,
        }
    }
}

/// A publish rate shared by several connections: one slot after another, each a period
/// of the rate at that slot after the one before.
pub struct Pacer {
    rate: Rate,
    /// When the ramp started (a fixed rate ignores it).
    started: Mutex<Option<Instant>>,
    /// The next free slot.
    next: tokio::sync::Mutex<Option<Instant>>,
}

impl Pacer {
    /// The caller has checked that the rates are positive and finite.
    pub fn new(rate: Rate) -> Arc<Pacer> {
        Arc::new(Pacer {
            rate,
            started: Mutex::new(None),
            next: tokio::sync::Mutex::new(None),
        })
    }

    pub fn per_second(rate: f64) -> Arc<Pacer> {
        Pacer::new(Rate::Fixed(rate))
    }

    /// Starts the ramp now (the first call counts): until then it runs at its first rate.
    pub fn start_ramp(&self) {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(Instant::now);
    }

    fn rate_at(&self, t: Instant) -> f64 {
        let started = *self.started.lock().unwrap_or_else(|e| e.into_inner());
        self.rate
            .at(started.map(|s| t.saturating_duration_since(s)))
    }

    /// Publishes per second now.
    pub fn rate_now(&self) -> f64 {
        self.rate_at(Instant::now())
    }

    /// The time between two publishes now: the longest it will be from now on.
    pub fn period_now(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.rate_now())
    }

    /// Waits for the next slot. A slot missed is not made up for (no burst after a pause).
    pub async fn wait(&self) {
        let mut next = self.next.lock().await;
        let now = Instant::now();
        let slot = next.map_or(now, |n| n.max(now));
        tokio::time::sleep_until(slot).await;
        *next = Some(slot + Duration::from_secs_f64(1.0 / self.rate_at(slot)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ramp_rises_linearly_then_holds() {
        let r = Rate::Ramp {
            from: 5.0,
            to: 105.0,
            over: Duration::from_secs(100),
        };
        assert_eq!(r.at(None), 5.0);
        assert_eq!(r.at(Some(Duration::ZERO)), 5.0);
        assert_eq!(r.at(Some(Duration::from_secs(50))), 55.0);
        assert_eq!(r.at(Some(Duration::from_secs(100))), 105.0);
        assert_eq!(r.at(Some(Duration::from_secs(1000))), 105.0);
        assert_eq!(r.slowest(), 5.0);
        assert_eq!(Rate::Fixed(3.0).at(Some(Duration::from_secs(9))), 3.0);
    }
}
