//! What an operator configures for an ingester ([`Settings`]): the
//! `[ingester]` table of the TOML file, the `mira ingester` flags and their
//! `MIRA_*` variables. [`Settings::validate`] names the bad field and
//! rejects (never clamps); [`Settings::build`] turns valid settings into
//! the [`IngesterConfig`] the node runs with.

use std::net::SocketAddr;
use std::path::PathBuf;

use mira_common::config::{ByteSize, ConfigError, Duration, in_range, positive};
use mira_core::convert::Limits;
use serde::{Deserialize, Serialize};

use crate::node::IngesterConfig;
use crate::otlp::ReceiverConfig;
use crate::pipeline::PipelineConfig;
use crate::shard::SealPolicy;
use crate::wal::WalMode;

/// Most shards per signal.
pub const MAX_SHARDS: usize = 256;

/// Largest `max_future` (`--max-future`): a week ahead of the clock.
pub const MAX_FUTURE_LIMIT: Duration = Duration::from_secs(7 * 86_400);

/// Largest `max_past` (`--max-past`): ten years back.
pub const MAX_PAST_LIMIT: Duration = Duration::from_secs(3_650 * 86_400);

/// Checks the accepted time window: both bounds within their limits and,
/// at `now_ns`, `now − max_past` and `now + max_future` inside the times a
/// block can be published with (`0..=LAST_PUBLISHABLE_NS`), so every
/// accepted record is publishable.
fn check_window(max_past: Duration, max_future: Duration, now_ns: u64) -> Result<(), ConfigError> {
    use mira_core::block::path::LAST_PUBLISHABLE_NS;
    let ns = |d: Duration| u64::try_from(d.get().as_nanos()).unwrap_or(u64::MAX);
    positive("ingester.max_past", max_past)?;
    if max_past > MAX_PAST_LIMIT || ns(max_past) > now_ns {
        return Err(ConfigError::new(
            "ingester.max_past",
            format!("--max-past {max_past} is above the limit of {MAX_PAST_LIMIT} (or reaches before 1970)"),
        ));
    }
    if max_future > MAX_FUTURE_LIMIT || now_ns.saturating_add(ns(max_future)) > LAST_PUBLISHABLE_NS {
        return Err(ConfigError::new(
            "ingester.max_future",
            format!(
                "--max-future {max_future} is above the limit of {MAX_FUTURE_LIMIT} (or reaches past the last publishable time, 2262-04-11)"
            ),
        ));
    }
    Ok(())
}

/// An ingester's settings (see the module doc; defaults in `Default`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Stable identity (the pod name); keys WAL watermarks and the lease.
    pub id: String,
    /// OTLP/gRPC listen address.
    pub grpc_listen: SocketAddr,
    /// OTLP/HTTP listen address (also the probes).
    pub http_listen: SocketAddr,
    /// Address queriers reach this ingester at; default: `grpc_listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
    /// Catalog members, comma separated host:port.
    pub catalog: String,
    /// When an export is acknowledged: page-cache, fsync or off.
    pub wal: WalMode,
    /// Shards per signal; default: the number of cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<usize>,
    /// Requests queued per shard.
    pub shard_queue_size: ByteSize,
    /// How long a request waits for room before 429 / RESOURCE_EXHAUSTED.
    pub admit_wait: Duration,
    /// Seal a generation at this much Arrow data.
    pub seal_size: ByteSize,
    /// Seal a generation at this age.
    pub seal_age: Duration,
    /// Largest decompressed request.
    pub max_message_size: ByteSize,
    /// Most attributes per record, span, event, link, resource or scope.
    pub max_attributes: usize,
    /// Longest string or bytes attribute value.
    pub max_attribute_value_size: ByteSize,
    /// Export requests read, decoded or awaiting their ack at once.
    pub max_inflight_requests: usize,
    /// How long an HTTP client has to send a body once it holds a slot.
    pub body_timeout: Duration,
    /// Most memory one request may take to decode (estimated on the wire).
    pub max_decoded_size: ByteSize,
    /// Most decoded memory of all requests in flight together.
    pub max_inflight_decoded_size: ByteSize,
    /// Blocks larger than this are uploaded as multipart.
    pub multipart_above: ByteSize,
    /// Refuse requests without X-Scope-OrgID.
    pub require_tenant: bool,
    /// Records older than now minus this are rejected.
    pub max_past: Duration,
    /// Records newer than now plus this are rejected.
    pub max_future: Duration,
    /// How long the ingester's catalog lease lasts (renewed at a third).
    pub lease_ttl: Duration,
    /// Skip (and count) the rest of a WAL segment after a corrupt frame
    /// instead of refusing to start.
    pub wal_skip_corrupt: bool,
    /// Most blocks per catalog publish command.
    pub publish_chunk_blocks: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            id: "ingester-0".to_owned(),
            grpc_listen: SocketAddr::from(([0, 0, 0, 0], 4317)),
            http_listen: SocketAddr::from(([0, 0, 0, 0], 4318)),
            advertise: None,
            catalog: "127.0.0.1:7400".to_owned(),
            wal: WalMode::PageCache,
            shards: None,
            shard_queue_size: ByteSize::mib(64),
            admit_wait: Duration::from_secs(5),
            seal_size: ByteSize::mib(32),
            seal_age: Duration::from_secs(300),
            max_message_size: ByteSize::mib(16),
            max_attributes: 128,
            max_attribute_value_size: ByteSize::kib(64),
            max_inflight_requests: 8,
            body_timeout: Duration::from_secs(30),
            max_decoded_size: ByteSize::mib(256),
            max_inflight_decoded_size: ByteSize::gib(1),
            multipart_above: ByteSize::mib(16),
            require_tenant: false,
            max_past: Duration::from_secs(168 * 3600),
            max_future: Duration::from_secs(600),
            lease_ttl: Duration::from_secs(15),
            wal_skip_corrupt: false,
            publish_chunk_blocks: mira_catalog::model::MAX_BLOCKS_PER_COMMAND,
        }
    }
}

/// The shards used when none are configured: one per core.
fn default_shards() -> usize {
    std::thread::available_parallelism().map_or(2, std::num::NonZero::get)
}

impl Settings {
    /// Checks every field; the first bad one is named.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.id.is_empty() || self.id.len() > 253 || self.id.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ConfigError::new(
                "ingester.id",
                format!("{:?} must be 1..=253 characters without spaces", self.id),
            ));
        }
        if self.catalog.split(',').all(|s| s.trim().is_empty()) {
            return Err(ConfigError::new("ingester.catalog", "no catalog member given"));
        }
        if let Some(n) = self.shards {
            in_range("ingester.shards", n, 1, MAX_SHARDS)?;
        }
        positive("ingester.shard_queue_size", self.shard_queue_size.bytes())?;
        positive("ingester.seal_size", self.seal_size.bytes())?;
        positive("ingester.seal_age", self.seal_age)?;
        positive("ingester.max_message_size", self.max_message_size.bytes())?;
        positive("ingester.max_attributes", self.max_attributes)?;
        positive(
            "ingester.max_attribute_value_size",
            self.max_attribute_value_size.bytes(),
        )?;
        positive("ingester.max_inflight_requests", self.max_inflight_requests)?;
        positive("ingester.body_timeout", self.body_timeout)?;
        positive("ingester.max_decoded_size", self.max_decoded_size.bytes())?;
        if self.max_inflight_decoded_size.bytes() < self.max_decoded_size.bytes() {
            return Err(ConfigError::new(
                "ingester.max_inflight_decoded_size",
                format!(
                    "{} is less than ingester.max_decoded_size ({}): no request of that size could ever be admitted",
                    self.max_inflight_decoded_size, self.max_decoded_size
                ),
            ));
        }
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        check_window(self.max_past, self.max_future, now_ns)?;
        in_range(
            "ingester.lease_ttl",
            self.lease_ttl,
            Duration::from_secs(1),
            Duration::from_secs(86_400),
        )?;
        in_range(
            "ingester.publish_chunk_blocks",
            self.publish_chunk_blocks,
            1,
            mira_catalog::model::MAX_BLOCKS_PER_COMMAND,
        )?;
        Ok(())
    }

    /// The node's configuration (validated first).
    pub fn build(&self, data_dir: PathBuf) -> Result<IngesterConfig, ConfigError> {
        self.validate()?;
        Ok(IngesterConfig {
            ingester_id: self.id.clone(),
            grpc_listen: self.grpc_listen,
            http_listen: self.http_listen,
            advertise: self.advertise.clone().unwrap_or_else(|| self.grpc_listen.to_string()),
            data_dir,
            wal_mode: self.wal,
            pipeline: PipelineConfig {
                shards: self.shards.unwrap_or_else(default_shards).min(MAX_SHARDS),
                queue_bytes: self.shard_queue_size.as_usize(),
                admit_wait: self.admit_wait.get(),
                seal: SealPolicy {
                    max_bytes: self.seal_size.as_usize(),
                    max_age: self.seal_age.get(),
                },
                upload_queue: 2,
                limits: Limits {
                    max_attrs: self.max_attributes,
                    max_value_bytes: self.max_attribute_value_size.as_usize(),
                    window: None,
                },
                max_past: self.max_past.get(),
                max_future: self.max_future.get(),
            },
            receivers: ReceiverConfig {
                max_wire_bytes: self.max_message_size.as_usize(),
                max_message_bytes: self.max_message_size.as_usize(),
                require_tenant: self.require_tenant,
                max_inflight: self.max_inflight_requests,
                body_timeout: self.body_timeout.get(),
                max_decoded_bytes: self.max_decoded_size.bytes(),
                max_inflight_decoded_bytes: self.max_inflight_decoded_size.bytes(),
            },
            lease_ttl: self.lease_ttl.get(),
            multipart_above: self.multipart_above.as_usize(),
            publish_chunk_blocks: self.publish_chunk_blocks,
            wal_skip_corrupt: self.wal_skip_corrupt,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_build_what_the_flags_used_to() {
        let s = Settings::default();
        s.validate().expect("defaults");
        let c = s.build(PathBuf::from("/data")).expect("build");
        assert_eq!(c.pipeline.seal.max_age, std::time::Duration::from_secs(300));
        assert_eq!(c.pipeline.seal.max_bytes, 32 << 20);
        assert_eq!(c.receivers.max_message_bytes, 16 << 20);
        assert_eq!(c.receivers.body_timeout, std::time::Duration::from_secs(30));
        assert_eq!(c.advertise, "0.0.0.0:4317");
        assert_eq!(c.lease_ttl, std::time::Duration::from_secs(15));
    }

    #[test]
    fn bad_values_are_rejected_naming_the_field_not_clamped() {
        type Change = fn(&mut Settings);
        let cases: [(&str, Change); 13] = [
            (
                "ingester.max_future",
                (|s| s.max_future = Duration::from_secs(7 * 86_400 + 1)),
            ),
            (
                "ingester.max_past",
                (|s| s.max_past = Duration::from_secs(3_650 * 86_400 + 1)),
            ),
            ("ingester.max_past", (|s| s.max_past = Duration::default())),
            ("ingester.seal_age", (|s| s.seal_age = Duration::default())),
            ("ingester.body_timeout", (|s| s.body_timeout = Duration::default())),
            ("ingester.seal_size", (|s| s.seal_size = ByteSize(0))),
            ("ingester.shards", (|s| s.shards = Some(0))),
            ("ingester.shards", (|s| s.shards = Some(MAX_SHARDS + 1))),
            ("ingester.lease_ttl", (|s| s.lease_ttl = Duration::from_millis(10))),
            ("ingester.publish_chunk_blocks", (|s| s.publish_chunk_blocks = 0)),
            ("ingester.max_inflight_requests", (|s| s.max_inflight_requests = 0)),
            ("ingester.id", (|s| s.id = "a b".to_owned())),
            ("ingester.catalog", (|s| s.catalog = " , ".to_owned())),
        ];
        for (field, change) in cases {
            let mut s = Settings::default();
            change(&mut s);
            let e = s.validate().expect_err(field);
            assert_eq!(e.field, field, "{e}");
            assert!(s.build(PathBuf::from("/data")).is_err(), "{field}");
        }
    }

    /// At the limits the window is accepted; one that would reach past the
    /// last publishable time or before 1970 at `now` is not, whatever the
    /// limits.
    #[test]
    fn the_window_must_stay_publishable_at_now() {
        use mira_core::block::path::LAST_PUBLISHABLE_NS;
        let now = 1_765_000_000_000_000_000;
        check_window(MAX_PAST_LIMIT, MAX_FUTURE_LIMIT, now).expect("the limits");
        check_window(Duration::from_secs(1), Duration::default(), now).expect("no future at all");
        let e = check_window(
            Duration::from_secs(60),
            Duration::from_secs(60),
            LAST_PUBLISHABLE_NS - 1,
        )
        .expect_err("past the last publishable time");
        assert_eq!(e.field, "ingester.max_future");
        assert!(e.to_string().contains("--max-future"), "{e}");
        let e =
            check_window(Duration::from_secs(60), Duration::from_secs(60), 30_000_000_000).expect_err("before 1970");
        assert_eq!(e.field, "ingester.max_past");
    }
}
