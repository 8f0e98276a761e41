//! Log queries: newest (or oldest) first with a limit and a resumable
//! cursor, over published and recent blocks.
//!
//! Lines are totally ordered by (time, origin block, origin row): the
//! cursor is the key of the last line returned, and the next page holds
//! the lines after it. A line's origin is the block and row it was first
//! sealed in: the block's own id and row, or, in a block the compactor
//! merged, what the block's lineage section says (`mira_core::lineage`).
//! So a cursor stays valid across a seal (a recent block keeps its id and
//! row numbers when published) and across merges (a merged line keeps its
//! origin), and cursors issued before lineage existed decode unchanged:
//! they name a line of an unmerged block, whose origin is itself.

use std::collections::HashMap;
use std::sync::Arc;

use mira_core::block::decode_section;
use mira_core::convert::{LogRow, log_rows, table_names};
use mira_core::lineage::{LINEAGE_SECTION, Lineage, lineage_from};
use mira_core::scan::{AttrMatcher, LineFilter, Order, Predicate, ScanRequest};
use mira_core::{BlockId, Signal};
use serde::Serialize;

use crate::answer::{Answer, u64_as_string};
use crate::plan::{Candidate, Src, Waves};
use crate::stats::Stats;
use crate::{Querier, QueryError};

/// Where a line sits in the total order: its time, then its origin (the
/// block and row it was first sealed in; see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LineKey {
    pub time: u64,
    /// The origin block.
    pub block: BlockId,
    /// The row in the origin block.
    pub row: u32,
}

impl LineKey {
    /// `{time}-{origin block}-{origin row}`: the format cursors have always
    /// had (before lineage the block was the line's own, which is its
    /// origin for an unmerged block).
    pub fn encode(&self) -> String {
        format!("{}-{}-{}", self.time, self.block, self.row)
    }

    pub fn decode(s: &str) -> Result<LineKey, QueryError> {
        let bad = || QueryError::BadRequest(format!("cursor {:?} is not one this API returned", trunc(s)));
        let mut parts = s.splitn(3, '-');
        let time = parts.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
        let block = parts
            .next()
            .filter(|b| b.len() == 26)
            .and_then(|b| b.parse().ok())
            .ok_or_else(bad)?;
        let row = parts.next().and_then(|r| r.parse().ok()).ok_or_else(bad)?;
        Ok(LineKey { time, block, row })
    }

    /// The cursor handed to `tenant`: [`LineKey::encode`] and a tag of the
    /// tenant (`{time}-{block}-{row}.{tag}`), so another tenant presenting
    /// it is refused.
    pub fn encode_for(&self, tenant: &str) -> String {
        format!("{}.{}", self.encode(), tenant_tag(tenant))
    }

    /// Decodes a cursor `tenant` presents: one [`LineKey::encode_for`]
    /// made for it (or an untagged one of earlier releases, which names
    /// only a position).
    pub fn decode_for(s: &str, tenant: &str) -> Result<LineKey, QueryError> {
        match s.rsplit_once('.') {
            None => LineKey::decode(s),
            Some((key, tag)) if tag == tenant_tag(tenant) => LineKey::decode(key),
            Some(_) => Err(QueryError::BadRequest(format!(
                "cursor {:?} was not issued to this tenant",
                trunc(s)
            ))),
        }
    }
}

/// 16 hex digits of the SHA-256 of a tenant's name.
fn tenant_tag(tenant: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(tenant.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn trunc(s: &str) -> String {
    s.chars().take(64).collect()
}

/// A logs query.
#[derive(Debug, Clone)]
pub struct LogsQuery {
    pub tenant: String,
    /// `[start, end)`, Unix nanoseconds.
    pub start: u64,
    pub end: u64,
    pub matchers: Vec<AttrMatcher>,
    pub lines: Vec<LineFilter>,
    pub min_severity: Option<i32>,
    /// Only records of this trace (pruned by the blocks' Bloom filters).
    pub trace_id: Option<[u8; 16]>,
    pub limit: usize,
    /// `NewestFirst` or `OldestFirst`.
    pub order: Order,
    pub cursor: Option<LineKey>,
}

impl LogsQuery {
    /// `[start, end)` narrowed by the cursor.
    fn window(&self) -> (u64, u64) {
        let (mut start, mut end) = (self.start, self.end);
        if let Some(c) = &self.cursor {
            match self.order {
                Order::OldestFirst => start = start.max(c.time),
                _ => end = end.min(c.time.saturating_add(1)),
            }
        }
        (start, end)
    }
}

/// One line of the answer.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Line {
    /// The record's time (event time, or observed time when unset).
    #[serde(serialize_with = "u64_as_string")]
    pub time_unix_nano: u64,
    pub resource: Option<opentelemetry_proto::tonic::resource::v1::Resource>,
    pub scope: Option<opentelemetry_proto::tonic::common::v1::InstrumentationScope>,
    /// The record as OTLP/JSON.
    pub record: opentelemetry_proto::tonic::logs::v1::LogRecord,
}

/// A page of lines.
#[derive(Debug, Clone, Serialize)]
pub struct LogLines {
    pub lines: Vec<Line>,
    /// Pass as `cursor` for the next page; absent when this page is the last.
    pub cursor: Option<String>,
}

pub type LogsAnswer = Answer<LogLines>;

/// A matching row found by a scan.
#[derive(Debug)]
struct Hit {
    key: LineKey,
    candidate: usize,
    /// The row in the candidate block (its origin row is in `key`).
    row: u32,
}

fn before(order: Order, a: &LineKey, b: &LineKey) -> bool {
    match order {
        Order::OldestFirst => a < b,
        _ => a > b,
    }
}

impl Querier {
    pub async fn logs(self: &Arc<Self>, q: LogsQuery) -> Result<LogsAnswer, QueryError> {
        self.check_range(q.start, q.end)?;
        self.check_limit(q.limit)?;
        let stats = Stats::default();
        let (start, end) = q.window();
        let plan = self.plan(&q.tenant, Signal::Logs, start, end, &stats).await?;
        let lines = self.logs_in(&plan.candidates, &q, &stats).await?;
        Ok(Answer::new(lines, plan.gaps, &stats))
    }

    /// A page of `q` from the blocks of a plan made for its window (or a
    /// wider one: pages after the first may reuse the first page's plan).
    pub(crate) async fn logs_in(
        &self,
        planned: &[Candidate],
        q: &LogsQuery,
        stats: &Stats,
    ) -> Result<LogLines, QueryError> {
        let (start, end) = q.window();
        // The planned blocks in the window, in reading order (indexes into
        // `planned`, which is not copied).
        let mut order: Vec<usize> = (0..planned.len())
            .filter(|&i| planned[i].max_time >= start && planned[i].min_time < end)
            .collect();
        match q.order {
            Order::OldestFirst => order.sort_by(|&a, &b| {
                let (a, b) = (&planned[a], &planned[b]);
                (a.min_time, &a.id).cmp(&(b.min_time, &b.id))
            }),
            _ => order.sort_by(|&a, &b| {
                let (a, b) = (&planned[a], &planned[b]);
                (b.max_time, &b.id).cmp(&(a.max_time, &a.id))
            }),
        }
        // A page read from published blocks only may be kept whole
        // ([`crate::results`]): the same blocks give the same page.
        let page_key = self
            .results
            .enabled()
            .then(|| crate::results::answer_key(&q.tenant, &format!("{q:?}"), order.iter().map(|&i| &planned[i])))
            .flatten();
        if let Some(k) = &page_key
            && let Some(page) = self.results.page(k, stats)
        {
            return Ok(LogLines::clone(&page));
        }
        let predicate = Predicate {
            time: Some((start, end)),
            attrs: q.matchers.clone(),
            lines: q.lines.clone(),
            min_severity: q.min_severity,
            trace_id: q.trace_id,
            ..Default::default()
        };
        let mut waves = Waves::new(order.len(), self.config.threads);
        let mut hits: Vec<Hit> = Vec::new();
        loop {
            // Enough lines, and no later block can hold a better one.
            if hits.len() >= q.limit
                && let Some(&i) = order.get(waves.position())
            {
                let c = &planned[i];
                let worst = &hits[q.limit - 1].key;
                let done = match q.order {
                    Order::OldestFirst => c.min_time > worst.time,
                    _ => c.max_time < worst.time,
                };
                if done {
                    break;
                }
            }
            let Some(batch) = waves.next_wave() else { break };
            let scans = order[batch]
                .iter()
                .map(|&i| self.scan_block(&planned[i], i, &predicate, q, stats));
            for found in futures::future::try_join_all(scans).await? {
                hits.extend(found);
            }
            hits.sort_by(|a, b| match q.order {
                Order::OldestFirst => a.key.cmp(&b.key),
                _ => b.key.cmp(&a.key),
            });
            hits.truncate(q.limit);
        }
        let cursor = (hits.len() == q.limit).then(|| hits[q.limit - 1].key.encode_for(&q.tenant));
        let lines = self.materialize(planned, hits, stats).await?;
        let page = LogLines { lines, cursor };
        if let Some(k) = page_key {
            self.results.insert_page(k, Arc::new(page.clone()));
        }
        Ok(page)
    }

    /// The best `limit` matching lines of one block, after the cursor.
    async fn scan_block(
        &self,
        c: &Candidate,
        index: usize,
        predicate: &Predicate,
        q: &LogsQuery,
        stats: &Stats,
    ) -> Result<Vec<Hit>, QueryError> {
        // A block holding the cursor's time may hold lines at that time on
        // both sides of it: scan it without a limit.
        let straddles = q
            .cursor
            .as_ref()
            .is_some_and(|k| c.min_time <= k.time && k.time <= c.max_time);
        let req = ScanRequest {
            predicate: predicate.clone(),
            order: q.order,
            limit: (!straddles).then_some(q.limit),
        };
        let Some(out) = self.scan_candidate(c, Signal::Logs, req, stats).await? else {
            return Ok(Vec::new());
        };
        let (mut rows, mut times) = (out.rows, out.times);
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let lineage = self.lineage(c, stats).await?;
        // The scan breaks ties in time by row, which in a merged block is
        // not the origin order: when the limit cut lines at the last time
        // returned, take every line at that time and order them here.
        if let (Some(_), Some(&last)) = (&lineage, times.last())
            && !straddles
            && rows.len() >= q.limit
        {
            let tied = ScanRequest {
                predicate: Predicate {
                    time: Some((last, last.saturating_add(1))),
                    ..predicate.clone()
                },
                order: q.order,
                limit: None,
            };
            if let Some(more) = self.scan_candidate(c, Signal::Logs, tied, stats).await? {
                let keep: Vec<usize> = (0..rows.len()).filter(|&i| times[i] != last).collect();
                rows = keep.iter().map(|&i| rows[i]).chain(more.rows).collect();
                times = keep.iter().map(|&i| times[i]).chain(more.times).collect();
            }
        }
        let origins = match &lineage {
            Some(l) => l.origins(&rows),
            None => rows.iter().map(|&r| (c.id, r)).collect(),
        };
        let mut hits: Vec<Hit> = rows
            .iter()
            .zip(&times)
            .zip(origins)
            .map(|((&row, &time), (block, origin_row))| Hit {
                key: LineKey {
                    time,
                    block,
                    row: origin_row,
                },
                candidate: index,
                row,
            })
            .collect();
        if let Some(k) = &q.cursor {
            hits.retain(|h| before(q.order, k, &h.key));
        }
        hits.sort_by(|a, b| match q.order {
            Order::OldestFirst => a.key.cmp(&b.key),
            _ => b.key.cmp(&a.key),
        });
        hits.truncate(q.limit);
        Ok(hits)
    }

    /// The lineage of a block the compactor merged; `None` for a block
    /// without one (its rows are their own origins). Published blocks'
    /// sections come through the block cache.
    async fn lineage(&self, c: &Candidate, stats: &Stats) -> Result<Option<Arc<Lineage>>, QueryError> {
        let lineage = match &c.src {
            Src::Recent(block) => {
                let block = block.clone();
                let id = c.id;
                self.on_pool(move || block.lineage())
                    .await
                    .map_err(|e| QueryError::corrupt(&format!("recent block {id}"), e))?
            }
            Src::Published { key } => {
                let manifest = self
                    .cache
                    .manifest(&self.store, key, stats)
                    .await
                    .map_err(|e| QueryError::block(key, e))?;
                let Some((_, entry)) = manifest.section(LINEAGE_SECTION) else {
                    return Ok(None);
                };
                let entry = entry.clone();
                let bytes = self
                    .cache
                    .section(&self.store, key, &manifest, LINEAGE_SECTION, stats)
                    .await
                    .map_err(|e| QueryError::block(key, e))?;
                let meta = manifest.meta.clone();
                let decoded = self
                    .on_pool(move || {
                        let batches = decode_section(meta.block_id, &entry, bytes)?;
                        lineage_from(meta.rows, &batches)
                    })
                    .await
                    .map_err(|e| QueryError::corrupt(key, e))?;
                Some(decoded)
            }
        };
        Ok(lineage.map(Arc::new))
    }

    /// The lines for the hits, in hit order.
    async fn materialize(
        &self,
        candidates: &[Candidate],
        hits: Vec<Hit>,
        stats: &Stats,
    ) -> Result<Vec<Line>, QueryError> {
        let order: Vec<(usize, u32)> = hits.iter().map(|h| (h.candidate, h.row)).collect();
        let groups = group_by_candidate(hits);
        let reads = groups.into_iter().map(|(_, group)| async move {
            let c = &candidates[group[0].candidate];
            let tables = self.tables(c, table_names(Signal::Logs), stats).await?;
            let rows: Vec<u32> = group.iter().map(|h| h.row).collect();
            let id = c.id;
            let got = self
                .on_pool(move || log_rows(&tables, &rows))
                .await
                .map_err(|e| QueryError::corrupt(&format!("block {id}"), e))?;
            Ok::<_, QueryError>(
                group
                    .into_iter()
                    .zip(got)
                    .map(|(h, r)| ((h.candidate, h.row), (h.key.time, r)))
                    .collect::<Vec<_>>(),
            )
        });
        let mut by_key: HashMap<(usize, u32), (u64, LogRow)> = HashMap::new();
        for part in futures::future::try_join_all(reads).await? {
            by_key.extend(part);
        }
        Ok(order
            .into_iter()
            .filter_map(|k| by_key.remove(&k))
            .map(|(time, r)| Line {
                time_unix_nano: time,
                resource: r.resource,
                scope: r.scope,
                record: r.record,
            })
            .collect())
    }
}

/// Hits grouped by the block they are in, blocks in first-seen order.
fn group_by_candidate(hits: Vec<Hit>) -> Vec<(usize, Vec<Hit>)> {
    let mut index: HashMap<usize, usize> = HashMap::new();
    let mut out: Vec<(usize, Vec<Hit>)> = Vec::new();
    for h in hits {
        let i = *index.entry(h.candidate).or_insert_with(|| {
            out.push((h.candidate, Vec::new()));
            out.len() - 1
        });
        out[i].1.push(h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_refuses_garbage() {
        let k = LineKey {
            time: 17,
            block: "01JDQ7ZV6M3W9X2Y4B8N5C1K0A".parse().expect("ulid"),
            row: 3,
        };
        assert_eq!(LineKey::decode(&k.encode()).expect("decode"), k);
        // A tenant's cursor is refused to another; an untagged one (earlier
        // releases) names a position only.
        let acme = k.encode_for("acme");
        assert_eq!(LineKey::decode_for(&acme, "acme").expect("own cursor"), k);
        let e = LineKey::decode_for(&acme, "beta").expect_err("another tenant's cursor");
        assert!(e.to_string().contains("not issued to this tenant"), "{e}");
        assert_eq!(LineKey::decode_for(&k.encode(), "beta").expect("untagged"), k);
        assert!(LineKey::decode_for(&format!("{acme}x"), "acme").is_err());
        for bad in [
            "",
            "x",
            "1-2-3",
            "1-01JDQ7ZV6M3W9X2Y4B8N5C1K0A-x",
            "-01JDQ7ZV6M3W9X2Y4B8N5C1K0A-1",
        ] {
            assert!(LineKey::decode(bad).is_err(), "{bad}");
        }
        let newer = LineKey { time: 18, ..k.clone() };
        assert!(before(Order::NewestFirst, &newer, &k));
        assert!(before(Order::OldestFirst, &k, &newer));
    }

    /// A catalog, a store and a querier over them, in-process.
    struct Rig {
        _dir: tempfile::TempDir,
        _catalog: mira_catalog::CatalogNode,
        client: Arc<mira_catalog::CatalogClient>,
        store: Arc<dyn object_store::ObjectStore>,
        querier: Arc<Querier>,
        /// A querier over the same catalog and store without a result
        /// cache: what every cached answer must equal.
        plain: Arc<Querier>,
    }

    /// Every line at `T` or `T - 1000`; the blocks' lines share times.
    const T: u64 = mira_testkit::EPOCH_NS as u64;

    impl Rig {
        async fn start() -> Rig {
            use std::time::Duration;
            let dir = tempfile::tempdir().expect("tempdir");
            let addr = mira_testkit::net::free_addr();
            let catalog = mira_catalog::CatalogNode::start(
                mira_catalog::NodeConfig::single(addr, dir.path().join("catalog")),
                &mira_common::Process::default(),
            )
            .await
            .expect("catalog");
            catalog.wait_for_leader(Duration::from_secs(20)).await.expect("leader");
            let client = Arc::new(mira_catalog::CatalogClient::new(
                vec![addr.to_string()],
                mira_catalog::ClientConfig::default(),
            ));
            let store: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
            let mut config = crate::QuerierConfig::new(dir.path().join("cache"));
            config.threads = 1;
            let mut plain = config.clone();
            plain.cache_dir = dir.path().join("plain-cache");
            plain.result_cache_bytes = 0;
            let querier = Querier::new(
                config,
                mira_common::clock::Clock::system(),
                store.clone(),
                client.clone(),
            )
            .expect("querier");
            let plain = Querier::new(
                plain,
                mira_common::clock::Clock::system(),
                store.clone(),
                client.clone(),
            )
            .expect("querier");
            Rig {
                _dir: dir,
                _catalog: catalog,
                client,
                store,
                querier,
                plain,
            }
        }

        /// Puts a block in the store and returns its catalog entry.
        async fn put(&self, bytes: bytes::Bytes) -> mira_catalog::proto::Block {
            use mira_core::block::{Block, VerifyCache, block_path};
            let block = Block::from_bytes(bytes.clone(), Arc::new(VerifyCache::new(8))).expect("open");
            let m = block.meta().clone();
            let key = block_path(&m.tenant, Signal::Logs, m.min_time, m.block_id).to_string();
            use object_store::ObjectStoreExt;
            self.store
                .put(
                    &object_store::path::Path::from(key.as_str()),
                    object_store::PutPayload::from(bytes.clone()),
                )
                .await
                .expect("put");
            mira_catalog::proto::Block {
                id: m.block_id.to_string(),
                min_time_ns: m.min_time as i64,
                max_time_ns: m.max_time as i64,
                rows: m.rows,
                bytes: bytes.len() as u64,
                level: match m.level {
                    mira_core::block::Level::Hot => mira_catalog::proto::Level::Hot as i32,
                    mira_core::block::Level::Cold => mira_catalog::proto::Level::Cold as i32,
                },
                object_key: key,
                ..mira_catalog::testing::block(m.tenant.as_str(), m.min_time as i64, 0)
            }
        }

        /// Waits until both queriers' catalog copies have `version`.
        async fn seen(&self, version: u64) {
            for q in [&self.querier, &self.plain] {
                q.mirror
                    .wait_for(version, std::time::Duration::from_secs(20))
                    .await
                    .expect("the querier's catalog copy catches up");
            }
        }

        /// One page of every line in `[T - 1000, T]`.
        async fn page(
            &self,
            tenant: &str,
            order: Order,
            limit: usize,
            cursor: Option<&str>,
        ) -> (Vec<String>, Option<String>) {
            let q = LogsQuery {
                tenant: tenant.into(),
                start: T - 1000,
                end: T + 1,
                matchers: Vec::new(),
                lines: Vec::new(),
                min_severity: None,
                trace_id: None,
                limit,
                order,
                cursor: cursor.map(|c| LineKey::decode_for(c, tenant).expect("cursor")),
            };
            let answer = self.querier.logs(q).await.expect("query");
            let bodies = answer
                .body
                .lines
                .iter()
                .map(|l| match l.record.body.as_ref().and_then(|b| b.value.as_ref()) {
                    Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => s.clone(),
                    other => panic!("unexpected body {other:?}"),
                })
                .collect();
            (bodies, answer.body.cursor)
        }
    }

    /// A block of `n` lines at `T` and 2 at `T - 1000`, bodies `b{i}-{j}`.
    fn tiny_block(tenant: &str, i: usize, n: usize) -> bytes::Bytes {
        use mira_core::convert::{LogsBuilder, SignalBuilder};
        use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
        use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
        use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
        let record = |j: usize, time: u64| LogRecord {
            time_unix_nano: time,
            body: Some(AnyValue {
                value: Some(any_value::Value::StringValue(format!("b{i}-{j}"))),
            }),
            ..Default::default()
        };
        let req = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: (0..n + 2)
                        .map(|j| record(j, if j % 5 == 4 && j < 10 { T - 1000 } else { T }))
                        .collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let mut b = LogsBuilder::default();
        b.append(&req).expect("append");
        let tables = b.finish().expect("finish");
        let tenant = mira_core::TenantId::new(tenant).expect("tenant");
        mira_core::tables::write_hot(&tables, BlockId::new(), tenant).expect("write")
    }

    /// Pages of 7 through lines that mostly share one timestamp, while the
    /// blocks under the cursor are replaced by their merge (inputs in
    /// reverse order, so row order is not origin order), then that merge
    /// by a cold merge of it: every line comes exactly once, in the order
    /// of one unpaged query.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cursors_stay_valid_while_blocks_are_merged_under_them() {
        use mira_core::block::{Block, VerifyCache};
        use mira_core::compact::{merge_blocks, merge_blocks_cold};
        let rig = Rig::start().await;
        // One tenant per order, so each starts from unmerged blocks.
        for (tenant, order) in [("newest", Order::NewestFirst), ("oldest", Order::OldestFirst)] {
            let mut entries = Vec::new();
            let mut raw = Vec::new();
            for i in 0..5 {
                let bytes = tiny_block(tenant, i, 11);
                entries.push(rig.put(bytes.clone()).await);
                raw.push(bytes);
            }
            let v = rig.client.publish(entries.clone(), None).await.expect("publish");
            rig.seen(v).await;
            let (all, cursor) = rig.page(tenant, order, 1000, None).await;
            assert_eq!(all.len(), 5 * 13, "{order:?}");
            assert_eq!(cursor, None);

            let open = |b: &bytes::Bytes| Block::from_bytes(b.clone(), Arc::new(VerifyCache::new(8))).expect("open");
            let mut paged: Vec<String> = Vec::new();
            let mut cursor: Option<String> = None;
            let mut live: Vec<String> = entries.iter().map(|e| e.id.clone()).collect();
            let mut pages = 0;
            loop {
                let (lines, next) = rig.page(tenant, order, 7, cursor.as_deref()).await;
                pages += 1;
                paged.extend(lines);
                let Some(next) = next else { break };
                cursor = Some(next);
                // Between pages 1 and 2, merge; between 3 and 4, merge again.
                let merged = match pages {
                    1 => {
                        let inputs: Vec<Block> = raw.iter().rev().map(open).collect();
                        Some(merge_blocks(&inputs, BlockId::new()).expect("merge"))
                    }
                    3 => Some(merge_blocks_cold(&[open(&raw[0])], BlockId::new()).expect("merge cold")),
                    _ => None,
                };
                if let Some(bytes) = merged {
                    let entry = rig.put(bytes.clone()).await;
                    let v = rig
                        .client
                        .replace(mira_catalog::proto::Replace {
                            add: vec![entry.clone()],
                            tombstone: std::mem::take(&mut live),
                            now_ns: mira_common::clock::Clock::system().now_ns(),
                            ..Default::default()
                        })
                        .await
                        .expect("replace");
                    rig.seen(v).await;
                    live = vec![entry.id];
                    raw = vec![bytes];
                }
                assert!(pages < 50, "the cursor loops");
            }
            assert_eq!(paged, all, "{order:?}");
            assert!(pages > 4, "both merges happened under a cursor");
            // Over the merged block alone, from the start: the first page's
            // limited scan cuts lines at one time, which must be taken in
            // origin order, not row order.
            let mut again: Vec<String> = Vec::new();
            let mut cursor: Option<String> = None;
            for _ in 0..50 {
                let (lines, next) = rig.page(tenant, order, 7, cursor.as_deref()).await;
                again.extend(lines);
                cursor = next;
                if cursor.is_none() {
                    break;
                }
            }
            assert_eq!(again, all, "{order:?}, merged");
            assert_eq!(rig.page(tenant, order, 1000, None).await.0, all, "{order:?}, merged");
        }
    }

    /// A block of `tenant` with one line every 10 ns from `base`, bodies
    /// `b{i}-{j}`, service `api` (even `i`) or `web` (odd).
    fn timed_block(tenant: &str, i: usize, base: u64, n: usize) -> bytes::Bytes {
        use mira_core::convert::{LogsBuilder, SignalBuilder};
        use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
        use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
        use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
        use opentelemetry_proto::tonic::resource::v1::Resource;
        let text = |s: String| {
            Some(AnyValue {
                value: Some(any_value::Value::StringValue(s)),
            })
        };
        let req = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: Some(Resource {
                    attributes: vec![KeyValue {
                        key: "service.name".into(),
                        value: text(if i.is_multiple_of(2) { "api" } else { "web" }.into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                scope_logs: vec![ScopeLogs {
                    log_records: (0..n)
                        .map(|j| LogRecord {
                            time_unix_nano: base + 10 * j as u64,
                            body: text(format!("b{i}-{j}")),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let mut b = LogsBuilder::default();
        b.append(&req).expect("append");
        let tables = b.finish().expect("finish");
        let tenant = mira_core::TenantId::new(tenant).expect("tenant");
        mira_core::tables::write_hot(&tables, BlockId::new(), tenant).expect("write")
    }

    /// The queries the result cache test repeats over `[start, end)`: no
    /// filter, a line filter, a matcher with a negative line filter; both
    /// orders; limits that cut and that do not.
    fn repeated_queries(tenant: &str, start: u64, end: u64) -> Vec<LogsQuery> {
        use mira_core::scan::{AttrScope, MatchOp};
        let base = LogsQuery {
            tenant: tenant.into(),
            start,
            end,
            matchers: Vec::new(),
            lines: Vec::new(),
            min_severity: None,
            trace_id: None,
            limit: 1000,
            order: Order::NewestFirst,
            cursor: None,
        };
        let api = AttrMatcher {
            scope: AttrScope::Resource,
            key: "service.name".into(),
            op: MatchOp::Eq("api".into()),
        };
        vec![
            base.clone(),
            LogsQuery {
                limit: 5,
                ..base.clone()
            },
            LogsQuery {
                limit: 7,
                order: Order::OldestFirst,
                ..base.clone()
            },
            LogsQuery {
                lines: vec![LineFilter::Contains("-1".into())],
                ..base.clone()
            },
            LogsQuery {
                matchers: vec![api],
                lines: vec![LineFilter::NotContains("-2".into())],
                limit: 9,
                ..base
            },
        ]
    }

    type Got = (Vec<(u64, String)>, Option<String>, crate::stats::StatsJson);

    async fn ask(q: &Arc<Querier>, lq: &LogsQuery) -> Got {
        let a = q.logs(lq.clone()).await.expect("query");
        let lines = a
            .body
            .lines
            .iter()
            .map(|l| match l.record.body.as_ref().and_then(|b| b.value.as_ref()) {
                Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => {
                    (l.time_unix_nano, s.clone())
                }
                other => panic!("unexpected body {other:?}"),
            })
            .collect();
        (lines, a.body.cursor, a.stats)
    }

    /// Every query twice through the cached querier and once through the
    /// uncached one: both cached answers equal the uncached one, and the
    /// second is served from the cache alone. Returns the uncached answers.
    async fn repeat_and_compare(rig: &Rig, qs: &[LogsQuery], when: &str) -> Vec<Vec<(u64, String)>> {
        let mut out = Vec::new();
        for (n, q) in qs.iter().enumerate() {
            let first = ask(&rig.querier, q).await;
            let second = ask(&rig.querier, q).await;
            let plain = ask(&rig.plain, q).await;
            assert_eq!(
                (&first.0, &first.1),
                (&plain.0, &plain.1),
                "{when}, query {n}, first run"
            );
            assert_eq!(
                (&second.0, &second.1),
                (&plain.0, &plain.1),
                "{when}, query {n}, second run"
            );
            let s = &second.2;
            assert_eq!(s.result_cache_misses, 0, "{when}, query {n}: {s:?}");
            // Every block is published: the page is kept whole, one hit.
            assert_eq!(s.result_cache_hits, 1, "{when}, query {n}: {s:?}");
            assert_eq!(s.rows_scanned, 0, "{when}, query {n}: {s:?}");
            assert_eq!(plain.2.result_cache_hits + plain.2.result_cache_misses, 0, "disabled");
            out.push(plain.0);
        }
        out
    }

    /// Repeated queries, a sliding range, then a compaction (new ids), a
    /// tombstone and a retention rewrite between repeats: every cached
    /// answer equals the uncached path's, and the changes show.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_result_cache_answers_exactly_what_the_uncached_path_does() {
        use mira_core::block::{Block, Level, VerifyCache};
        let rig = Rig::start().await;
        let tenant = "rcache";
        let open = |b: &bytes::Bytes| Block::from_bytes(b.clone(), Arc::new(VerifyCache::new(8))).expect("open");
        // Block i: 20 lines from T + i * 1000.
        let raw: Vec<bytes::Bytes> = (0..4)
            .map(|i| timed_block(tenant, i, T + i as u64 * 1000, 20))
            .collect();
        let mut entries = Vec::new();
        for b in &raw {
            entries.push(rig.put(b.clone()).await);
        }
        let v = rig.client.publish(entries.clone(), None).await.expect("publish");
        rig.seen(v).await;
        // Another tenant's identical blocks never hit this tenant's entries.
        let other: Vec<bytes::Bytes> = (0..4)
            .map(|i| timed_block("other", i, T + i as u64 * 1000, 20))
            .collect();
        let mut others = Vec::new();
        for b in &other {
            others.push(rig.put(b.clone()).await);
        }
        let v = rig.client.publish(others, None).await.expect("publish");
        rig.seen(v).await;

        let full = repeated_queries(tenant, T, T + 4000);
        let before = repeat_and_compare(&rig, &full, "initial").await;
        assert_eq!(before[0].len(), 80);
        let (lines, _, s) = ask(&rig.querier, &repeated_queries("other", T, T + 4000)[0]).await;
        assert_eq!(lines.len(), 80);
        assert_eq!(s.result_cache_hits, 0, "another tenant: {s:?}");

        // A dashboard's sliding range: block 2 (whole in both ranges) is
        // reused; block 3 (cut by each range elsewhere, a part no query
        // read before) is read again.
        let slide1 = repeated_queries(tenant, T + 1450, T + 3100);
        let slide2 = repeated_queries(tenant, T + 1500, T + 3150);
        repeat_and_compare(&rig, &slide1, "slide 1").await;
        let (lines, _, s) = ask(&rig.querier, &slide2[0]).await;
        assert_eq!(lines, ask(&rig.plain, &slide2[0]).await.0);
        assert!(s.result_cache_hits >= 1 && s.result_cache_misses >= 1, "{s:?}");
        repeat_and_compare(&rig, &slide2, "slide 2").await;

        // Compaction: blocks 0 and 1 merged under a new id.
        let merged = mira_core::compact::merge_blocks(&[open(&raw[0]), open(&raw[1])], BlockId::new()).expect("merge");
        let m = rig.put(merged).await;
        let v = rig
            .client
            .replace(mira_catalog::proto::Replace {
                add: vec![m],
                tombstone: vec![entries[0].id.clone(), entries[1].id.clone()],
                now_ns: mira_common::clock::Clock::system().now_ns(),
                ..Default::default()
            })
            .await
            .expect("replace");
        rig.seen(v).await;
        let (_, _, s) = ask(&rig.querier, &full[0]).await;
        assert!(s.result_cache_misses >= 1, "the merged block is new: {s:?}");
        let compacted = repeat_and_compare(&rig, &full, "compacted").await;
        assert_eq!(compacted, before, "a compaction changes no answer");

        // Tombstone: block 2 goes, and its lines with it.
        let v = rig
            .client
            .tombstone_v2(
                vec![entries[2].id.clone()],
                mira_common::clock::Clock::system().now_ns(),
                mira_catalog::proto::TombstoneReason::Manual,
            )
            .await
            .expect("tombstone");
        rig.seen(v).await;
        let tombstoned = repeat_and_compare(&rig, &full, "tombstoned").await;
        assert_eq!(tombstoned[0].len(), 60, "block 2's lines are gone");
        assert_ne!(tombstoned[3], compacted[3], "the line filter's answer changed");

        // Retention: block 3's lines before T + 3100 dropped, rewritten
        // under a new id.
        let cutoff = T + 3100;
        let kept =
            mira_core::compact::merge_blocks_filtered(&[open(&raw[3])], BlockId::new(), Level::Hot, &|_, tables| {
                let root = tables.get(mira_core::convert::root_table(Signal::Logs))?;
                let times = mira_core::scan::record_times(Signal::Logs, root)?;
                Ok(times.iter().map(|&t| t >= cutoff).collect())
            })
            .expect("rewrite");
        let r = rig.put(kept.bytes.expect("rows kept")).await;
        let v = rig
            .client
            .replace(mira_catalog::proto::Replace {
                add: vec![r],
                tombstone: vec![entries[3].id.clone()],
                now_ns: mira_common::clock::Clock::system().now_ns(),
                ..Default::default()
            })
            .await
            .expect("replace");
        rig.seen(v).await;
        let retained = repeat_and_compare(&rig, &full, "retention").await;
        assert_eq!(retained[0].len(), 50, "block 3's older half is gone");
        assert!(retained[0].iter().all(|(t, _)| *t < T + 2000 || *t >= cutoff));
    }

    /// Random predicates, orders, limits and ranges (capped cases, from
    /// proptest's strategies) over a few blocks, before and after a
    /// compaction: each asked twice through the cached querier equals the
    /// uncached querier's answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn random_queries_answer_the_same_cached_and_uncached() {
        use mira_core::scan::{AttrScope, MatchOp};
        use proptest::prelude::*;
        use proptest::strategy::ValueTree;
        let rig = Rig::start().await;
        let tenant = "prop";
        let raw: Vec<bytes::Bytes> = (0..4)
            .map(|i| timed_block(tenant, i, T + i as u64 * 1000, 25))
            .collect();
        let mut entries = Vec::new();
        for b in &raw {
            entries.push(rig.put(b.clone()).await);
        }
        let v = rig.client.publish(entries.clone(), None).await.expect("publish");
        rig.seen(v).await;
        let token = prop::sample::select(vec!["-1", "-2", "b0", "b3", "4", "none"]);
        let line = (token, any::<bool>()).prop_map(|(t, neg)| {
            if neg {
                LineFilter::NotContains(t.into())
            } else {
                LineFilter::Contains(t.into())
            }
        });
        let matcher = (prop::sample::select(vec!["api", "web", "x"]), any::<bool>()).prop_map(|(v, neg)| AttrMatcher {
            scope: AttrScope::Resource,
            key: "service.name".into(),
            op: if neg {
                MatchOp::Ne(v.into())
            } else {
                MatchOp::Eq(v.into())
            },
        });
        let query = (
            prop::collection::vec(line, 0..3),
            prop::option::of(matcher),
            any::<bool>(),
            1usize..40,
            0u64..4200,
            50u64..4500,
        )
            .prop_map(|(lines, matcher, oldest, limit, from, len)| LogsQuery {
                tenant: tenant.into(),
                start: T + from,
                end: T + from + len,
                matchers: matcher.into_iter().collect(),
                lines,
                min_severity: None,
                trace_id: None,
                limit,
                order: if oldest { Order::OldestFirst } else { Order::NewestFirst },
                cursor: None,
            });
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let cases: Vec<LogsQuery> = (0..48)
            .map(|_| query.new_tree(&mut runner).expect("a case").current())
            .collect();
        let check = |when: &'static str| {
            let rig = &rig;
            let cases = &cases;
            async move {
                for (n, q) in cases.iter().enumerate() {
                    let want = ask(&rig.plain, q).await;
                    for run in 0..2 {
                        let got = ask(&rig.querier, q).await;
                        assert_eq!(
                            (&got.0, &got.1),
                            (&want.0, &want.1),
                            "{when}, case {n} run {run}: {q:?}"
                        );
                    }
                }
            }
        };
        check("blocks as sealed").await;
        let open = |b: &bytes::Bytes| {
            mira_core::block::Block::from_bytes(b.clone(), Arc::new(mira_core::block::VerifyCache::new(8)))
                .expect("open")
        };
        let merged = mira_core::compact::merge_blocks(&[open(&raw[2]), open(&raw[1])], BlockId::new()).expect("merge");
        let m = rig.put(merged).await;
        let v = rig
            .client
            .replace(mira_catalog::proto::Replace {
                add: vec![m],
                tombstone: vec![entries[1].id.clone(), entries[2].id.clone()],
                now_ns: mira_common::clock::Clock::system().now_ns(),
                ..Default::default()
            })
            .await
            .expect("replace");
        rig.seen(v).await;
        check("compacted").await;
    }
}
