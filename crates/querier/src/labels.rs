//! Label pickers: the attribute names of a signal in a time range, and the
//! values one takes. Names and listed values come from the blocks'
//! attribute-index sidecars; a key with too many values to list is read
//! from its attribute table.

use std::collections::BTreeSet;
use std::sync::Arc;

use mira_core::Signal;
use mira_core::attrs::AttrReader;
use mira_core::scan::AttrScope;
use mira_core::schema;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use serde::Serialize;

use crate::answer::Answer;
use crate::selector::{name_of, scope_of};
use crate::stats::Stats;
use crate::{Querier, QueryError};

/// Most values one answer lists.
pub const MAX_VALUES: usize = 10_000;

/// Attribute (label) names, or the values of one.
#[derive(Debug, Serialize)]
pub struct LabelList {
    pub data: Vec<String>,
}

pub type LabelsAnswer = Answer<LabelList>;

fn record_attr_table(signal: Signal) -> &'static str {
    match signal {
        Signal::Logs => schema::LOG_ATTRS,
        Signal::Traces => schema::SPAN_ATTRS,
        Signal::Metrics => schema::SERIES_ATTRS,
    }
}

/// The text of an attribute value, as matchers compare it.
fn value_text(r: &AttrReader<'_>, row: usize) -> Option<String> {
    if let Some(s) = r.str_value(row) {
        return Some(s.to_owned());
    }
    match r.key_value(row).ok()?.value?.value? {
        Value::IntValue(i) => Some(i.to_string()),
        Value::DoubleValue(d) => Some(d.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

impl Querier {
    /// Attribute names (selector form: `resource.<key>` or `<key>`).
    pub async fn labels(
        self: &Arc<Self>,
        tenant: &str,
        signal: Signal,
        start: u64,
        end: u64,
    ) -> Result<LabelsAnswer, QueryError> {
        self.check_range(start, end)?;
        if signal == Signal::Metrics {
            return self.metric_labels(tenant, None, start, end).await;
        }
        let stats = Stats::default();
        let plan = self.plan(tenant, signal, start, end, &stats).await?;
        let reads = plan.candidates.iter().map(|c| self.block_sidecars(c, &stats));
        let mut names = BTreeSet::new();
        for s in futures::future::try_join_all(reads).await? {
            for scope in [AttrScope::Resource, AttrScope::Record] {
                names.extend(s.attrs.keys(scope).map(|k| name_of(scope, k)));
            }
        }
        let data = names.into_iter().collect();
        Ok(Answer::new(LabelList { data }, plan.gaps, &stats))
    }

    /// Distinct values of a block field the attribute index lists (span
    /// names, severity texts, metric names), sorted, at most
    /// [`MAX_VALUES`]; a block with too many to list is noted.
    pub async fn field_values(
        self: &Arc<Self>,
        tenant: &str,
        signal: Signal,
        field: &str,
        start: u64,
        end: u64,
    ) -> Result<LabelsAnswer, QueryError> {
        self.check_range(start, end)?;
        let stats = Stats::default();
        let plan = self.plan(tenant, signal, start, end, &stats).await?;
        let reads = plan.candidates.iter().map(|c| self.block_sidecars(c, &stats));
        let mut values = BTreeSet::new();
        let mut gaps = plan.gaps;
        let mut unlisted = false;
        for s in futures::future::try_join_all(reads).await? {
            match s.attrs.values(AttrScope::Field, field) {
                Some(v) => values.extend(v.iter().cloned()),
                None => unlisted = true,
            }
        }
        if unlisted {
            gaps.note(format!("some blocks hold too many values of {field} to list"));
        }
        let data = values.into_iter().take(MAX_VALUES).collect();
        Ok(Answer::new(LabelList { data }, gaps, &stats))
    }

    /// Distinct values of one attribute (as text), sorted, at most
    /// [`MAX_VALUES`].
    pub async fn label_values(
        self: &Arc<Self>,
        tenant: &str,
        signal: Signal,
        name: &str,
        start: u64,
        end: u64,
    ) -> Result<LabelsAnswer, QueryError> {
        self.check_range(start, end)?;
        if signal == Signal::Metrics {
            return self.metric_labels(tenant, Some(name), start, end).await;
        }
        let stats = Stats::default();
        let plan = self.plan(tenant, signal, start, end, &stats).await?;
        let (scope, key) = scope_of(name);
        let reads = plan.candidates.iter().map(|c| {
            let stats = &stats;
            async move {
                let sidecars = self.block_sidecars(c, stats).await?;
                if let Some(v) = sidecars.attrs.values(scope, key) {
                    return Ok::<_, QueryError>(v.to_vec());
                }
                // Too many to list: read the attribute table.
                let table = match scope {
                    AttrScope::Resource => schema::RESOURCE_ATTRS,
                    _ => record_attr_table(signal),
                };
                let tables = self.scan_tables(c, &[table], stats).await?;
                let key = key.to_owned();
                let id = c.id;
                self.on_pool(move || -> Result<Vec<String>, mira_core::Error> {
                    let batch = tables.get(table)?;
                    let r = AttrReader::new(batch, table)?;
                    // The smallest values, one more than listed (to tell
                    // that there are more): the answer is then the first
                    // values of the whole range in order, however the rows
                    // are split into blocks, not the first found.
                    let mut out = BTreeSet::new();
                    for row in 0..r.len() {
                        if r.key(row) == key
                            && let Some(v) = value_text(&r, row)
                        {
                            out.insert(v);
                            if out.len() > MAX_VALUES + 1 {
                                out.pop_last();
                            }
                        }
                    }
                    Ok(out.into_iter().collect())
                })
                .await
                .map_err(|e| QueryError::corrupt(&format!("block {id}"), e))
            }
        });
        let mut values = BTreeSet::new();
        let mut gaps = plan.gaps;
        for v in futures::future::try_join_all(reads).await? {
            values.extend(v);
        }
        if values.len() > MAX_VALUES {
            gaps.note(format!(
                "more than {MAX_VALUES} values; the first {MAX_VALUES} are listed"
            ));
        }
        let data = values.into_iter().take(MAX_VALUES).collect();
        Ok(Answer::new(LabelList { data }, gaps, &stats))
    }
}
