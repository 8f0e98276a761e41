//! Whether the ingester may acknowledge writes right now, and why not: a
//! lease it could not renew, another process fenced it, or a generation
//! the catalog refused is quarantined. While any holds, exports are
//! answered 503 / UNAVAILABLE naming it and `/ready` is false. A WAL that
//! fails to write makes `/ready` false too, and its exports fail with 503
//! one by one until a write succeeds. `mira_ingester_refusing_writes{reason}`
//! says which.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::metrics::{Metrics, ReasonLabels};
use crate::wal::Wal;

#[derive(Debug)]
pub struct Health {
    wal: Wal,
    /// Until when the catalog holds our lease, by our own clock: the send
    /// time of the last renewal that succeeded plus its ttl.
    lease_until: Mutex<Option<Instant>>,
    fenced: AtomicBool,
    quarantined: AtomicBool,
    catalog_ok: AtomicBool,
}

impl Health {
    pub fn new(wal: Wal) -> Health {
        Health {
            wal,
            lease_until: Mutex::new(None),
            fenced: AtomicBool::new(false),
            quarantined: AtomicBool::new(false),
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
        if self.quarantined.load(Ordering::Relaxed) {
            return Some(
                "a sealed generation could not be published and was quarantined; see the log and the quarantine directory"
                    .to_owned(),
            );
        }
        let lease = *self
            .lease_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if lease.is_none_or(|until| Instant::now() >= until) {
            return Some("the ingester's lease in the catalog could not be renewed".to_owned());
        }
        None
    }

    /// Ready: accepting writes, the WAL writing and the catalog answering.
    /// (A failing WAL does not refuse exports up front: each one tries, is
    /// answered 503 while the disk stays full, and the first that is
    /// written makes the WAL healthy again.)
    pub fn ready(&self) -> bool {
        self.refusal().is_none() && self.wal.healthy() && self.catalog_ok.load(Ordering::Relaxed)
    }

    /// A lease renewal sent at `sent` with `ttl` succeeded.
    pub fn lease_renewed(&self, sent: Instant, ttl: Duration) {
        let mut l = self
            .lease_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let until = sent + ttl;
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

    pub fn set_quarantined(&self, on: bool) {
        self.quarantined.store(on, Ordering::Relaxed);
    }

    /// Sets the `mira_ingester_refusing_writes` gauges.
    pub fn export(&self, metrics: &Metrics) {
        let lease_ok = self
            .lease_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some_and(|u| Instant::now() < u);
        for (reason, on) in [
            ("wal", !self.wal.healthy()),
            ("lease", !lease_ok),
            ("fenced", self.fenced.load(Ordering::Relaxed)),
            ("quarantine", self.quarantined.load(Ordering::Relaxed)),
        ] {
            metrics
                .refusing
                .get_or_create(&ReasonLabels { reason })
                .set(i64::from(on));
        }
    }
}
