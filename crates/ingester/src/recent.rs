//! The recent-data service (`proto/ingester.proto`): rows this ingester
//! holds that are not in published blocks yet, as hot Mira blocks (Arrow
//! IPC sections), with the published version the querier must have seen.
//! At most [`RecentService::MAX_CONCURRENT`] requests are answered at once
//! (each rebuilds blocks from the open requests, CPU and memory); past that
//! the answer is RESOURCE_EXHAUSTED, which a querier reports as partial.

use std::sync::Arc;

use mira_core::ids::{BlockId, TenantId};
use mira_core::tables::write_hot;
use mira_proto::ingester as pb;
use tonic::{Request, Response, Status};

use crate::pipeline::Pipeline;

/// The gRPC service over a running pipeline.
#[derive(Clone)]
pub struct RecentService {
    pipeline: Arc<Pipeline>,
    slots: Arc<tokio::sync::Semaphore>,
}

impl RecentService {
    /// Requests answered at once.
    pub const MAX_CONCURRENT: usize = 8;

    pub fn new(pipeline: Arc<Pipeline>) -> RecentService {
        RecentService {
            pipeline,
            slots: Arc::new(tokio::sync::Semaphore::new(RecentService::MAX_CONCURRENT)),
        }
    }
}

impl std::fmt::Debug for RecentService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecentService").finish_non_exhaustive()
    }
}

#[tonic::async_trait]
impl pb::recent_server::Recent for RecentService {
    async fn query(&self, request: Request<pb::RecentRequest>) -> Result<Response<pb::RecentReply>, Status> {
        let req = request.into_inner();
        let tenant = TenantId::new(&req.tenant).map_err(|e| Status::invalid_argument(format!("tenant: {e}")))?;
        let signal = mira_catalog::pb_impl::signal::from_pb(req.signal)
            .ok_or_else(|| Status::invalid_argument(format!("signal: unknown code {}", req.signal)))?;
        if req.min_time_ns < 0 || req.max_time_ns < req.min_time_ns {
            return Err(Status::invalid_argument(
                "time range: need 0 <= min_time_ns <= max_time_ns",
            ));
        }
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            return Err(Status::resource_exhausted(format!(
                "recent data: {} requests are being answered; retry later",
                RecentService::MAX_CONCURRENT
            )));
        };
        let pipeline = self.pipeline.clone();
        let (min, max) = (req.min_time_ns as u64, req.max_time_ns as u64);
        // Decoding and encoding is CPU work: off the runtime workers.
        let reply = tokio::task::spawn_blocking(move || -> Result<pb::RecentReply, Status> {
            let (parts, published_version) = pipeline.recent(&tenant, signal, min, max);
            let mut blocks = Vec::with_capacity(parts.len());
            for (id, tables) in parts {
                let block_id = id.unwrap_or_default();
                let bytes = write_hot(&tables, block_id, tenant.clone())
                    .map_err(|e| Status::internal(format!("encode recent rows: {e}")))?;
                blocks.push(pb::RecentBlock {
                    pending_block_id: id.map(|i: BlockId| i.to_string()).unwrap_or_default(),
                    block: bytes.to_vec(),
                });
            }
            drop(slot);
            Ok(pb::RecentReply {
                published_version,
                blocks,
            })
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??;
        Ok(Response::new(reply))
    }
}
