//! Whether the ingester may acknowledge writes right now, and why not: a
//! lease it could not renew, another process fenced it, or a generation
//! the catalog refused whole is quarantined. While any holds, exports are
//! answered 503 / UNAVAILABLE naming it and `/ready` is false. A WAL that
//! fails to write makes `/ready` false too, and its exports fail with 503
//! one by one until a write succeeds. `mira_ingester_refusing_writes{reason}`
//! says which.
//!
//! A tenant's block set aside in the quarantine directory (its rows could
//! not be published, the rest of its generation was) refuses nothing: the
//! ingester serves every tenant, `/ready` stays 200 and names each copy in
//! its body ([`Health::notes`], also those found on disk at start), and
//! `mira_ingester_quarantined` counts them. Marking the pod not ready
//! would take every tenant's traffic away for one tenant's rows (and a
//! restart does not cure it); the gauge is what to alert on.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use mira_common::clock::Clock;

use crate::metrics::{Metrics, ReasonLabels};
use crate::wal::Wal;

/// Most quarantine copies `/ready` names one by one.
pub const MAX_NOTES: usize = 20;

#[derive(Debug)]
pub struct Health {
    wal: Wal,
    /// Until when the catalog holds our lease, by our own clock (ns): the
    /// send time of the last renewal that succeeded plus its ttl.
    lease_until: Mutex<Option<i64>>,
    clock: Clock,
    fenced: AtomicBool,
    /// Generations quarantined and not (yet) published.
    quarantined: AtomicUsize,
    /// The quarantine copies this data directory holds, one line each.
    held: Mutex<Vec<String>>,
    catalog_ok: AtomicBool,
}

impl Health {
    pub fn new(wal: Wal, clock: Clock) -> Health {
        Health {
            wal,
            clock,
            lease_until: Mutex::new(None),
            fenced: AtomicBool::new(false),
            quarantined: AtomicUsize::new(0),
            held: Mutex::new(Vec::new()),
            catalog_ok: AtomicBool::new(true),
        }
    }

    /// Why exports are refused now, if they are.
    pub fn refusal(&self) -> Option<String> {
        if self.fenced.load(Ordering::Relaxed) {
            return Some(
                "another process took over this ingester id (fenced by the catalog); this one publishes nothing more"
                    .to_owned(),
            );
        }
        if self.quarantined.load(Ordering::Relaxed) > 0 {
            return Some(
                "a sealed generation could not be published and was quarantined; see the log and the quarantine directory"
                    .to_owned(),
            );
        }
        let lease = *self
            .lease_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if lease.is_none_or(|until| self.clock.now_ns() >= until) {
            return Some("the ingester's lease in the catalog could not be renewed".to_owned());
        }
        None
    }

    /// Ready: accepting writes, the WAL writing and the catalog answering.
    /// (A failing WAL does not refuse exports up front: each one tries, is
    /// answered 503 while the disk stays full, and the first that is
    /// written makes the WAL healthy again.)
    pub fn readiness(&self) -> Result<(), String> {
        if let Some(why) = self.refusal() {
            return Err(why);
        }
        if !self.wal.healthy() {
            return Err("the WAL cannot be written (disk full or failing)".to_owned());
        }
        if !self.catalog_ok.load(Ordering::Relaxed) {
            return Err("the catalog does not answer".to_owned());
        }
        Ok(())
    }

    /// How much of the lease is left by the clock (zero when none).
    pub fn lease_remaining(&self) -> Duration {
        let until = *self
            .lease_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        until.map_or(Duration::ZERO, |u| {
            Duration::from_nanos(u64::try_from(u.saturating_sub(self.clock.now_ns())).unwrap_or(0))
        })
    }

    /// A lease renewal sent at `sent_ns` (by the clock) with `ttl` succeeded.
    pub fn lease_renewed(&self, sent_ns: i64, ttl: Duration) {
        let mut l = self
            .lease_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let until = sent_ns.saturating_add(i64::try_from(ttl.as_nanos()).unwrap_or(i64::MAX));
        *l = Some(l.map_or(until, |old| old.max(until)));
        self.catalog_ok.store(true, Ordering::Relaxed);
    }

    pub fn catalog_unreachable(&self) {
        self.catalog_ok.store(false, Ordering::Relaxed);
    }

    pub fn set_fenced(&self) {
        self.fenced.store(true, Ordering::Relaxed);
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Relaxed)
    }

    /// One more generation quarantined (`true`), or one of them published
    /// after all (`false`).
    pub fn set_quarantined(&self, on: bool) {
        if on {
            self.quarantined.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = self
                .quarantined
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// A quarantine copy written (or found at start): named by `/ready`.
    pub fn quarantine_noted(&self, note: String) {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(note);
    }

    /// What `/ready` adds to its body while ready: the quarantine copies
    /// held, the first [`MAX_NOTES`] by name and how many more.
    pub fn notes(&self) -> Vec<String> {
        let held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out: Vec<String> = held
            .iter()
            .take(MAX_NOTES)
            .map(|n| format!("quarantined, not published: {n}"))
            .collect();
        if held.len() > MAX_NOTES {
            out.push(format!("and {} more quarantine copies", held.len() - MAX_NOTES));
        }
        out
    }

    /// Sets the `mira_ingester_refusing_writes` gauges and the
    /// `mira_ingester_quarantined` count.
    pub fn export(&self, metrics: &Metrics) {
        let held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len();
        metrics.quarantine_held.set(i64::try_from(held).unwrap_or(i64::MAX));
        let lease_ok = self
            .lease_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some_and(|u| self.clock.now_ns() < u);
        for (reason, on) in [
            ("wal", !self.wal.healthy()),
            ("lease", !lease_ok),
            ("fenced", self.fenced.load(Ordering::Relaxed)),
            ("quarantine", self.quarantined.load(Ordering::Relaxed) > 0),
        ] {
            metrics
                .refusing
                .get_or_create(&ReasonLabels { reason })
                .set(i64::from(on));
        }
    }
}
