//! Fan-out to the live ingesters' recent-data service
//! (`proto/ingester.proto`), each bounded by a timeout, dialled like the
//! catalog (TLS and the cluster credential: the service answers cluster
//! members only).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use mira_catalog::proto as cpb;
use mira_common::cluster::{ClusterChannel, Dialer};
use mira_core::Signal;
use mira_proto::ingester as ipb;

use crate::stats::Stats;

/// Largest recent-data reply accepted (an ingester's open blocks).
const MAX_REPLY: usize = 1 << 30;

/// Channels to ingesters, by address, made once and reused.
#[derive(Debug, Default)]
pub struct RecentClients {
    dialer: Dialer,
    channels: Mutex<HashMap<String, ClusterChannel>>,
}

impl RecentClients {
    pub fn new(dialer: Dialer) -> RecentClients {
        RecentClients {
            dialer,
            channels: Mutex::default(),
        }
    }

    fn channel(&self, address: &str) -> Result<ClusterChannel, String> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = channels.get(address) {
            return Ok(c.clone());
        }
        let channel = self.dialer.channel(address, Duration::from_secs(2))?;
        channels.insert(address.to_owned(), channel.clone());
        Ok(channel)
    }

    /// Asks every ingester at once; one answer (or error) per ingester id.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn ask(
        &self,
        ingesters: &[cpb::IngesterLease],
        tenant: &str,
        signal: Signal,
        min_ns: i64,
        max_ns: i64,
        timeout: Duration,
        stats: &Stats,
    ) -> Vec<(String, Result<ipb::RecentReply, String>)> {
        let asks = ingesters.iter().map(|lease| {
            stats.add_ingester();
            let request = ipb::RecentRequest {
                tenant: tenant.to_owned(),
                signal: mira_catalog::pb_impl::signal::to_pb(signal),
                min_time_ns: min_ns,
                max_time_ns: max_ns,
            };
            let channel = self.channel(&lease.address);
            async move {
                let channel = channel?;
                let mut client = ipb::recent_client::RecentClient::new(channel).max_decoding_message_size(MAX_REPLY);
                match tokio::time::timeout(timeout, client.query(request)).await {
                    Ok(Ok(reply)) => Ok(reply.into_inner()),
                    Ok(Err(status)) => Err(format!("{}: {}", status.code(), status.message())),
                    Err(_) => Err(format!("no answer within {timeout:?}")),
                }
            }
        });
        let answers = futures::future::join_all(asks).await;
        ingesters.iter().map(|l| l.ingester_id.clone()).zip(answers).collect()
    }
}
