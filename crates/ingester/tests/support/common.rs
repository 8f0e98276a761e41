//! Shared by the ingester's in-process tests: a single-member catalog and
//! an ingester over a test store, one-record log exports and their POST,
//! and the log bodies of a block.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, CatalogNode, ClientConfig, NodeConfig};
use mira_ingester::otlp::ReceiverConfig;
use mira_ingester::{IngesterConfig, IngesterNode, PipelineConfig, WalMode};
use mira_testkit::http::Response;
pub use mira_testkit::net::free_addr;
use mira_testkit::store::TestStore;

/// POSTs an export of one log record with `body`, at
/// [`mira_testkit::recent_base_time`] + `n`, to `/v1/logs` on `addr`; the
/// answer, or `None` when none came.
pub async fn post_log(addr: SocketAddr, n: u64, body: String) -> Option<Response> {
    let export = mira_testkit::otlp::log_export(&[], [(n, body)]);
    mira_testkit::http::post(addr, "/v1/logs", &[("Content-Type", "application/x-protobuf")], export).await
}

/// The status of an answer (0 when none came).
pub fn status(answer: &Option<Response>) -> u16 {
    answer.as_ref().map_or(0, |r| r.status)
}

/// The string bodies of a logs block.
pub fn block_bodies(bytes: bytes::Bytes) -> Vec<String> {
    let cache = Arc::new(mira_core::block::VerifyCache::new(16));
    let block = mira_core::block::Block::from_bytes(bytes, cache).expect("block");
    let req =
        mira_core::convert::logs_to_otlp(&mira_core::tables::read_tables(&block, None).expect("tables")).expect("otlp");
    mira_testkit::flatten::log_bodies(&req)
}

/// The string bodies of every published logs block of the default tenant.
pub async fn published_bodies(client: &CatalogClient, store: &TestStore) -> Vec<String> {
    use object_store::ObjectStoreExt as _;
    let mut out = Vec::new();
    for b in published_logs(client).await.blocks {
        let bytes = store
            .get(&object_store::path::Path::from(b.object_key.as_str()))
            .await
            .expect("object")
            .bytes()
            .await
            .expect("bytes");
        out.extend(block_bodies(bytes));
    }
    out
}

/// A single-member catalog and an ingester (page-cache WAL) in `dir`.
pub struct Running {
    pub catalog: CatalogNode,
    pub client: Arc<CatalogClient>,
    pub node: IngesterNode,
}

pub async fn start(dir: &Path, pipeline: PipelineConfig, multipart_above: usize, store: Arc<TestStore>) -> Running {
    let catalog_addr = free_addr();
    let catalog = CatalogNode::start(
        NodeConfig::single(catalog_addr, dir.join("catalog")),
        &mira_common::Process::default(),
    )
    .await
    .expect("catalog");
    catalog.wait_for_leader(Duration::from_secs(20)).await.expect("leader");
    let client = Arc::new(CatalogClient::new(
        vec![catalog_addr.to_string()],
        ClientConfig::default(),
    ));
    let config = IngesterConfig {
        ingester_id: "test".into(),
        grpc_listen: free_addr(),
        http_listen: free_addr(),
        advertise: "127.0.0.1:1".into(),
        data_dir: dir.join("ingester"),
        wal_mode: WalMode::PageCache,
        pipeline,
        receivers: ReceiverConfig::default(),
        lease_ttl: Duration::from_secs(15),
        multipart_above,
        publish_chunk_blocks: mira_catalog::model::MAX_BLOCKS_PER_COMMAND,
        wal_skip_corrupt: false,
    };
    let node = IngesterNode::start(config, &mira_common::Process::default(), client.clone(), store)
        .await
        .expect("ingester");
    Running { catalog, client, node }
}

/// Every published logs block of the default tenant (linearizable).
pub async fn published_logs(client: &CatalogClient) -> pb::ListBlocksReply {
    client
        .list_blocks(pb::ListBlocksRequest {
            tenant: "default".into(),
            signal: pb::Signal::Logs as i32,
            min_time_ns: 0,
            max_time_ns: i64::MAX,
            states: vec![],
            linearizable: true,
            ..Default::default()
        })
        .await
        .expect("list")
}
