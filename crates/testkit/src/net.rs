//! Loopback ports and waiting on a condition, for tests that start servers
//! (in process or as real processes).

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

/// A loopback address whose port was free a moment ago.
pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
}

/// The port of [`free_addr`].
pub fn free_port() -> u16 {
    free_addr().port()
}

/// Polls `check` every 50 ms until it yields a value, and panics naming
/// `what` when `limit` passes first (a condition with a deadline, never a
/// bare sleep).
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
