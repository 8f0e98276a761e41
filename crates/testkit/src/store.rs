//! An in-memory [`ObjectStore`] for tests that records every GET range it
//! serves and can stall writes, or reads, behind a gate (a store that
//! hangs, then recovers).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use tokio::sync::watch;

/// In-memory store with GET recording and a write gate.
#[derive(Debug)]
pub struct TestStore {
    inner: InMemory,
    gets: Mutex<Vec<Option<GetRange>>>,
    open: watch::Sender<bool>,
    readable: watch::Sender<bool>,
    /// GETs waiting at the read gate now.
    stalled_reads: Arc<AtomicUsize>,
    multipart: std::sync::atomic::AtomicU64,
}

impl Default for TestStore {
    fn default() -> Self {
        Self::new()
    }
}

impl TestStore {
    /// A store whose writes go through at once.
    pub fn new() -> Self {
        TestStore {
            inner: InMemory::new(),
            gets: Mutex::new(Vec::new()),
            open: watch::channel(true).0,
            readable: watch::channel(true).0,
            stalled_reads: Arc::new(AtomicUsize::new(0)),
            multipart: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The GET ranges served since the last call (`None`: whole object).
    pub fn take_gets(&self) -> Vec<Option<GetRange>> {
        std::mem::take(&mut *self.gets.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Multipart uploads started.
    pub fn multipart_uploads(&self) -> u64 {
        self.multipart.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stalls (`false`) or releases (`true`) every write; stalled writes
    /// wait, they do not fail.
    pub fn set_writable(&self, open: bool) {
        self.open.send_replace(open);
    }

    /// Stalls (`false`) or releases (`true`) every GET; a stalled GET waits
    /// (for ever while closed), it does not fail, and is recorded only once
    /// it goes through.
    pub fn set_readable(&self, open: bool) {
        self.readable.send_replace(open);
    }

    /// GETs waiting at the read gate now (a cancelled one stops counting).
    pub fn stalled_reads(&self) -> usize {
        self.stalled_reads.load(Ordering::SeqCst)
    }

    fn read_gate(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.readable.subscribe();
        let stalled = self.stalled_reads.clone();
        async move {
            if *rx.borrow_and_update() {
                return;
            }
            stalled.fetch_add(1, Ordering::SeqCst);
            let _waiting = Waiting(stalled);
            let _ = rx.wait_for(|open| *open).await;
        }
    }

    fn gate(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.open.subscribe();
        async move {
            let _ = rx.wait_for(|open| *open).await;
        }
    }
}

/// Counts one stalled read until dropped (done or cancelled).
struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl fmt::Display for TestStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TestStore({})", self.inner)
    }
}

type BoxFut<'a, T> = Pin<Box<dyn Future<Output = object_store::Result<T>> + Send + 'a>>;

// `ObjectStore` is an `async_trait`; these are its desugared signatures.
impl ObjectStore for TestStore {
    fn put_opts<'a, 'b, 'c>(
        &'a self,
        location: &'b Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> BoxFut<'c, PutResult>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        let gate = self.gate();
        Box::pin(async move {
            gate.await;
            self.inner.put_opts(location, payload, opts).await
        })
    }

    fn put_multipart_opts<'a, 'b, 'c>(
        &'a self,
        location: &'b Path,
        opts: PutMultipartOptions,
    ) -> BoxFut<'c, Box<dyn MultipartUpload>>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        let gate = self.gate();
        self.multipart.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Box::pin(async move {
            gate.await;
            self.inner.put_multipart_opts(location, opts).await
        })
    }

    fn get_opts<'a, 'b, 'c>(&'a self, location: &'b Path, options: GetOptions) -> BoxFut<'c, GetResult>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        let gate = self.read_gate();
        Box::pin(async move {
            gate.await;
            if !options.head {
                self.gets
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(options.range.clone());
            }
            self.inner.get_opts(location, options).await
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_delimiter<'a, 'b, 'c>(&'a self, prefix: Option<&'b Path>) -> BoxFut<'c, ListResult>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        self.inner.list_with_delimiter(prefix)
    }

    fn copy_opts<'a, 'b, 'c, 'd>(&'a self, from: &'b Path, to: &'c Path, options: CopyOptions) -> BoxFut<'d, ()>
    where
        'a: 'd,
        'b: 'd,
        'c: 'd,
        Self: 'd,
    {
        self.inner.copy_opts(from, to, options)
    }
}
