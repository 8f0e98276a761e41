//! The compactor tests' world: a real single-member catalog, an in-memory
//! object store, a manual clock, and blocks of testkit log records
//! published straight to the catalog, remembered so a test can compare
//! what is live with what was sent.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::TryStreamExt;
use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, CatalogNode, ClientConfig, NodeConfig};
use mira_common::Process;
use mira_common::clock::{Clock, ManualClock};
use mira_compactor::planner::Rules;
use mira_compactor::{Compactor, CompactorConfig};
use mira_core::block::path::block_path;
use mira_core::block::{Block, VerifyCache};
use mira_core::convert::{LogsBuilder, SignalBuilder, logs_to_otlp};
use mira_core::ids::{BlockId, Signal, TenantId};
use mira_core::tables::{read_tables, write_hot};
use mira_testkit::corpus::{Cardinality, Corpus};
use mira_testkit::flatten;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;

pub const H: i64 = 3_600_000_000_000;
pub const MIN: i64 = 60_000_000_000;

/// A single-member catalog with its data under `dir`, led, and a client.
pub async fn single_catalog(dir: &std::path::Path) -> (CatalogNode, Arc<CatalogClient>) {
    let addr = mira_testkit::net::free_addr();
    let node = CatalogNode::start(NodeConfig::single(addr, dir.join("catalog")), &Process::default())
        .await
        .expect("test step");
    node.wait_for_leader(Duration::from_secs(20)).await.expect("test step");
    let catalog = Arc::new(CatalogClient::new(vec![addr.to_string()], ClientConfig::default()));
    (node, catalog)
}

pub struct Env {
    pub dir: tempfile::TempDir,
    pub node: CatalogNode,
    pub catalog: Arc<CatalogClient>,
    pub store: Arc<dyn ObjectStore>,
    pub clock: Clock,
    pub manual: ManualClock,
    /// Flattened records published, by partition start.
    pub sent: BTreeMap<i64, Vec<Vec<u8>>>,
    /// Every request published: (tenant, hour start, records).
    pub requests: Vec<(String, i64, ExportLogsServiceRequest)>,
    pub corpus: Corpus,
}

impl Env {
    pub async fn new() -> Env {
        let dir = tempfile::tempdir().expect("test step");
        let (node, catalog) = single_catalog(dir.path()).await;
        let (clock, manual) = Clock::manual(SystemTime::now());
        Env {
            dir,
            node,
            catalog,
            store: Arc::new(InMemory::new()),
            clock,
            manual,
            sent: BTreeMap::new(),
            requests: Vec::new(),
            corpus: Corpus::new(7, Cardinality::Low),
        }
    }

    /// Publishes `n` blocks of `records` log records each, with record
    /// times starting `hour_start + 1 min`, created `created_ago` before now.
    pub async fn publish(
        &mut self,
        tenant: &str,
        hour_start: i64,
        n: usize,
        records: usize,
        created_ago: i64,
    ) -> Vec<pb::Block> {
        let mut out = Vec::new();
        let seed = self.sent.values().map(Vec::len).sum::<usize>() as u64;
        self.corpus = Corpus::starting_at(seed, Cardinality::Low, (hour_start + MIN) as u64);
        for _ in 0..n {
            let req = self.corpus.logs(records);
            let mut b = LogsBuilder::default();
            b.append(&req).expect("test step");
            let tables = b.finish().expect("test step");
            let id = BlockId::new();
            let tenant_id = TenantId::new(tenant).expect("test step");
            let bytes = write_hot(&tables, id, tenant_id.clone()).expect("test step");
            let block = Block::from_bytes(bytes.clone(), Arc::new(VerifyCache::new(8))).expect("test step");
            let meta = block.meta().clone();
            let key = block_path(&tenant_id, Signal::Logs, meta.min_time, id);
            self.store
                .put(&key, PutPayload::from(bytes.clone()))
                .await
                .expect("test step");
            let record = pb::Block {
                id: id.to_string(),
                tenant: tenant.to_owned(),
                signal: pb::Signal::Logs as i32,
                min_time_ns: meta.min_time as i64,
                max_time_ns: meta.max_time as i64,
                rows: meta.rows,
                bytes: bytes.len() as u64,
                level: pb::Level::Hot as i32,
                object_key: key.to_string(),
                created_at_ns: self.clock.now_ns() - created_ago,
                ..Default::default()
            };
            self.catalog
                .publish(vec![record.clone()], None)
                .await
                .expect("test step");
            self.sent.entry(hour_start).or_default().extend(flatten::logs(&req));
            self.requests.push((tenant.to_owned(), hour_start, req));
            out.push(record);
        }
        out
    }

    pub fn config(&self, holder: &str) -> CompactorConfig {
        let mut c = mira_compactor::settings::Settings::default()
            .build()
            .expect("test step");
        c.holder = format!("{holder}/{}", BlockId::new());
        c.rules = Rules {
            min_block_age_ns: 0,
            deletion_grace_ns: 10 * MIN,
            ..Rules::default()
        };
        c.threads = 2;
        c.orphan_grace_ns = H;
        c
    }

    pub fn compactor(&self, holder: &str) -> Arc<Compactor> {
        let process = Process::new(self.clock.clone());
        Compactor::new(self.config(holder), &process, self.store.clone(), self.catalog.clone()).expect("test step")
    }

    pub async fn blocks(&self, state: pb::BlockState) -> Vec<pb::Block> {
        self.catalog.list_all_blocks(&[state]).await.expect("test step")
    }

    /// Flattened records of every live block, by partition start.
    pub async fn live_records(&self) -> BTreeMap<i64, Vec<Vec<u8>>> {
        let mut out: BTreeMap<i64, Vec<Vec<u8>>> = BTreeMap::new();
        for b in self.blocks(pb::BlockState::Live).await {
            let bytes = self
                .store
                .get(&Path::from(b.object_key.as_str()))
                .await
                .expect("test step")
                .bytes()
                .await
                .expect("test step");
            let block = Block::from_bytes(bytes, Arc::new(VerifyCache::new(8))).expect("test step");
            let req = logs_to_otlp(&read_tables(&block, None).expect("test step")).expect("test step");
            out.entry(b.partition_start_ns).or_default().extend(flatten::logs(&req));
        }
        out
    }

    pub async fn assert_exactly_once(&self) {
        let mut got = self.live_records().await;
        let mut want = self.sent.clone();
        for v in got.values_mut().chain(want.values_mut()) {
            v.sort();
        }
        assert_eq!(got.len(), want.len(), "partitions");
        for (p, w) in &want {
            let g = &got[p];
            assert_eq!(g.len(), w.len(), "partition {p}: records live vs sent");
            assert!(g == w, "partition {p}: the live records differ from those sent");
        }
    }

    pub async fn object_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .store
            .list(None)
            .map_ok(|o| o.location.to_string())
            .try_collect()
            .await
            .expect("test step");
        keys.sort();
        keys
    }

    pub fn hour_start(&self, hours_ago: i64) -> i64 {
        let now = self.clock.now_ns();
        (now - hours_ago * H).div_euclid(H) * H
    }
}

pub fn count_by_partition(blocks: &[pb::Block]) -> BTreeMap<i64, Vec<&pb::Block>> {
    let mut m: BTreeMap<i64, Vec<&pb::Block>> = BTreeMap::new();
    for b in blocks {
        m.entry(b.partition_start_ns).or_default().push(b);
    }
    m
}
