//! Log queries: newest (or oldest) first with a limit and a resumable
//! cursor, over published and recent blocks.
//!
//! Lines are totally ordered by (time, block id, row): the cursor is the
//! key of the last line returned, and the next page holds the lines after
//! it. A recent block keeps its id and row numbers when published, so a
//! cursor stays valid across a seal.

use std::collections::HashMap;
use std::sync::Arc;

use mira_core::convert::{LogRow, log_rows, table_names};
use mira_core::scan::{AttrMatcher, LineFilter, Order, Predicate, ScanRequest};
use mira_core::{BlockId, Signal};
use serde::Serialize;

use crate::answer::{Answer, u64_as_string};
use crate::plan::{Candidate, Waves};
use crate::stats::Stats;
use crate::{Querier, QueryError};

/// Where a line sits in the total order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LineKey {
    pub time: u64,
    pub block: BlockId,
    pub row: u32,
}

impl LineKey {
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
#[derive(Debug, Serialize)]
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
#[derive(Debug, Serialize)]
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
        let cursor = (hits.len() == q.limit).then(|| hits[q.limit - 1].key.encode());
        let lines = self.materialize(planned, hits, stats).await?;
        Ok(LogLines { lines, cursor })
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
        let mut hits: Vec<Hit> = out
            .rows
            .iter()
            .zip(&out.times)
            .map(|(&row, &time)| Hit {
                key: LineKey { time, block: c.id, row },
                candidate: index,
            })
            .collect();
        if let Some(k) = &q.cursor {
            hits.retain(|h| before(q.order, k, &h.key));
            hits.truncate(q.limit);
        }
        Ok(hits)
    }

    /// The lines for the hits, in hit order.
    async fn materialize(
        &self,
        candidates: &[Candidate],
        hits: Vec<Hit>,
        stats: &Stats,
    ) -> Result<Vec<Line>, QueryError> {
        let order: Vec<(usize, u32)> = hits.iter().map(|h| (h.candidate, h.key.row)).collect();
        let groups = group_by_candidate(hits);
        let reads = groups.into_iter().map(|(_, group)| async move {
            let c = &candidates[group[0].candidate];
            let tables = self.tables(c, table_names(Signal::Logs), stats).await?;
            let rows: Vec<u32> = group.iter().map(|h| h.key.row).collect();
            let id = c.id;
            let got = self
                .on_pool(move || log_rows(&tables, &rows))
                .await
                .map_err(|e| QueryError::corrupt(&format!("block {id}"), e))?;
            Ok::<_, QueryError>(
                group
                    .into_iter()
                    .zip(got)
                    .map(|(h, r)| ((h.candidate, h.key.row), (h.key.time, r)))
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
}
