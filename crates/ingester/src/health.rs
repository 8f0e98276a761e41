//! Whether the ingester may acknowledge writes right now, and why not: a
//! lease it could not renew, another process fenced it, or a generation
//! the catalog refused is quarantined. While any holds, exports are
//! answered 503 / UNAVAILABLE naming it and `/ready` is false. A WAL that
//! fails to write makes `/ready` false too, and its exports fail with 503
//! one by one until a write succeeds. `mira_ingester_refusing_writes{reason}`
//! says which.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use mira_common::clock::Clock;

use crate::metrics::{Metrics, ReasonLabels};
use crate::wal::Wal;

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

    /// Sets the `mira_ingester_refusing_writes` gauges.
    pub fn export(&self, metrics: &Metrics) {
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
