//! Keeping the compactor's bulk catalog writes (retention tombstones,
//! offload and freed-primary marks, purges) to a share of the catalog's
//! time, so ingesters' publishes, which go through the same Raft log, are
//! never queued behind a sweep of 100,000 blocks.
//!
//! A [`CatalogPacer`] runs one command at a time and, after a command that
//! took `d` from request to answer, lets the next start only
//! `d × (100 − percent) / percent` later. A command's time is what the
//! catalog spent on it as the compactor sees it (log append, fsync, apply,
//! queueing behind other writes), so a loaded catalog slows the sweep down
//! by itself: on an idle catalog 100 tombstones of 1,000 blocks take about
//! 4 ms each and the sweep ends in under 5 s at 10 %, while on a catalog
//! busy with ingest it stretches out instead of taking its time from the
//! publishes (docs/perf.md, "Retention and offload").

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// See the module doc.
#[derive(Debug)]
pub struct CatalogPacer {
    /// Percent of the time (1..=100; 100: no pause).
    percent: u32,
    next: tokio::sync::Mutex<Instant>,
}

impl CatalogPacer {
    pub fn new(percent: u32) -> CatalogPacer {
        CatalogPacer {
            percent: percent.clamp(1, 100),
            next: tokio::sync::Mutex::new(Instant::now()),
        }
    }

    /// The pause owed after a command that took `took`.
    pub fn pause_after(&self, took: Duration) -> Duration {
        took.saturating_mul(100 - self.percent) / self.percent
    }

    /// Runs `command` once the pause owed by the previous one has passed.
    /// Commands run one at a time.
    pub async fn run<T>(&self, command: impl Future<Output = T>) -> T {
        let mut next = self.next.lock().await;
        tokio::time::sleep_until(*next).await;
        let start = Instant::now();
        let out = command.await;
        let took = start.elapsed();
        *next = Instant::now() + self.pause_after(took);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_keeps_commands_to_their_share() {
        let ms = Duration::from_millis;
        assert_eq!(CatalogPacer::new(10).pause_after(ms(4)), ms(36));
        assert_eq!(CatalogPacer::new(25).pause_after(ms(80)), ms(240));
        assert_eq!(CatalogPacer::new(100).pause_after(ms(80)), ms(0));
        // Out-of-range shares are clamped, never a division by zero.
        assert_eq!(CatalogPacer::new(0).pause_after(ms(1)), ms(99));
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_command_waits_for_the_pause() {
        let pacer = CatalogPacer::new(20);
        let t0 = Instant::now();
        pacer.run(tokio::time::sleep(Duration::from_millis(10))).await;
        let second = pacer.run(async { Instant::now() }).await;
        // 10 ms of command, then 40 ms of pause before the next starts.
        assert_eq!(second - t0, Duration::from_millis(50));
    }
}
