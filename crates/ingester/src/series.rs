//! The per-tenant active-series limit of metrics (`max_series` of
//! `--limits-file`, [`mira_common::limits`]), per ingester like Mimir's
//! per-ingester series limit: each tenant's series seen here within the
//! last hour are its active series; a point of a series already active is
//! always taken, a point of a new series only while the tenant has fewer
//! than `max_series` of them. Refused points are answered through OTLP's
//! partial success (`rejected_data_points`, an `error_message` naming the
//! limit), the rest of the request is acknowledged; they are left out of
//! the WAL frame, so nothing refused is stored or replayed.
//!
//! Each tenant's set has its own lock, held for one pass over a request's
//! points (between its decode and its append, never across an await), so
//! a tenant at its limit does not wait on another's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use mira_common::clock::Clock;
use mira_common::limits::{Kind, Limiter};
use mira_core::ids::TenantId;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;

/// How long a series stays active without a point.
pub const ACTIVE_FOR: std::time::Duration = std::time::Duration::from_secs(3600);
/// How often a tenant's set is swept for idle series.
const SWEEP_EVERY_NS: i64 = 60_000_000_000;

#[derive(Debug, Default)]
struct TenantSeries {
    /// Series → when last seen (Unix ns).
    last_seen: HashMap<u64, i64>,
    swept_ns: i64,
}

/// The active series of every tenant on this ingester.
#[derive(Debug)]
pub struct ActiveSeries {
    limiter: Arc<Limiter>,
    clock: Clock,
    tenants: RwLock<HashMap<TenantId, Arc<Mutex<TenantSeries>>>>,
}

impl ActiveSeries {
    pub fn new(limiter: Arc<Limiter>, clock: Clock) -> ActiveSeries {
        ActiveSeries {
            limiter,
            clock,
            tenants: RwLock::new(HashMap::new()),
        }
    }

    /// `tenant`'s `max_series` now; 0: unlimited (nothing is tracked).
    pub fn limit(&self, tenant: &TenantId) -> u64 {
        if self.limiter.enabled() {
            self.limiter.get(tenant).max_series
        } else {
            0
        }
    }

    fn tenant(&self, tenant: &TenantId) -> Arc<Mutex<TenantSeries>> {
        if let Some(t) = self
            .tenants
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(tenant)
        {
            return t.clone();
        }
        self.tenants
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(tenant.clone())
            .or_default()
            .clone()
    }

    /// Removes the points of `req` whose series are new beyond `limit`
    /// (> 0); returns how many were removed, and the limit.
    pub fn gate(&self, tenant: &TenantId, limit: u64, req: &mut ExportMetricsServiceRequest) -> (usize, u64) {
        let now = self.clock.now_ns();
        let set = self.tenant(tenant);
        let mut set = set.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if now.saturating_sub(set.swept_ns) >= SWEEP_EVERY_NS {
            let oldest = now.saturating_sub(i64::try_from(ACTIVE_FOR.as_nanos()).unwrap_or(i64::MAX));
            set.last_seen.retain(|_, seen| *seen >= oldest);
            set.swept_ns = now;
        }
        let cap = usize::try_from(limit).unwrap_or(usize::MAX);
        let refused = mira_core::convert::gate_series(req, &mut |series| {
            let len = set.last_seen.len();
            match set.last_seen.get_mut(&series) {
                Some(seen) => {
                    *seen = now;
                    true
                }
                None if len < cap => {
                    set.last_seen.insert(series, now);
                    true
                }
                None => false,
            }
        });
        drop(set);
        self.limiter.count_refusal(Kind::Series, refused as u64);
        (refused, limit)
    }

    /// `tenant`'s active series now (tests, and `/metrics` could show a
    /// total without the tenant).
    pub fn active(&self, tenant: &TenantId) -> usize {
        self.tenant(tenant)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .last_seen
            .len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use mira_common::limits::LimitsFile;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::metrics::v1::{
        Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric,
    };

    use super::*;

    /// One gauge point per `(name, host)`.
    fn request(points: &[(&str, &str)]) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: points
                        .iter()
                        .map(|(name, host)| Metric {
                            name: (*name).to_owned(),
                            data: Some(metric::Data::Gauge(Gauge {
                                data_points: vec![NumberDataPoint {
                                    attributes: vec![KeyValue {
                                        key: "host".to_owned(),
                                        value: Some(AnyValue {
                                            value: Some(any_value::Value::StringValue((*host).to_owned())),
                                        }),
                                        ..KeyValue::default()
                                    }],
                                    ..NumberDataPoint::default()
                                }],
                            })),
                            ..Metric::default()
                        })
                        .collect(),
                    ..ScopeMetrics::default()
                }],
                ..ResourceMetrics::default()
            }],
        }
    }

    fn hosts(req: &ExportMetricsServiceRequest) -> Vec<String> {
        let mut out = Vec::new();
        for m in &req.resource_metrics[0].scope_metrics[0].metrics {
            if let Some(metric::Data::Gauge(g)) = &m.data {
                for p in &g.data_points {
                    if let Some(any_value::Value::StringValue(h)) =
                        p.attributes[0].value.as_ref().and_then(|v| v.value.as_ref())
                    {
                        out.push(format!("{}/{h}", m.name));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn new_series_past_the_limit_are_refused_known_ones_taken_idle_ones_expire() {
        let (clock, hand) = mira_common::clock::Clock::manual(UNIX_EPOCH + Duration::from_secs(1_000_000));
        let file = LimitsFile::parse("[tenants.a]\nmax_series = 2\n").expect("limits");
        let limiter = Arc::new(Limiter::with_file(None, file, clock.clone()));
        let s = ActiveSeries::new(limiter, clock);
        let a = TenantId::new("a").expect("tenant");
        assert_eq!(s.limit(&a), 2);
        let mut r = request(&[("cpu", "x"), ("cpu", "y"), ("cpu", "z"), ("mem", "x")]);
        assert_eq!(s.gate(&a, 2, &mut r), (2, 2));
        assert_eq!(hosts(&r), ["cpu/x", "cpu/y"]);
        // Known series pass; new ones do not, in the same request.
        let mut r = request(&[("cpu", "y"), ("cpu", "z"), ("cpu", "x")]);
        assert_eq!(s.gate(&a, 2, &mut r).0, 1);
        assert_eq!(hosts(&r), ["cpu/y", "cpu/x"]);
        assert_eq!(s.active(&a), 2);
        // Another tenant has its own set.
        let b = TenantId::new("b").expect("tenant");
        let mut r = request(&[("cpu", "z"), ("mem", "z")]);
        assert_eq!(s.gate(&b, 2, &mut r).0, 0);
        // After an hour without points the series are no longer active.
        hand.advance(ACTIVE_FOR + Duration::from_secs(61));
        let mut r = request(&[("disk", "x"), ("disk", "y")]);
        assert_eq!(s.gate(&a, 2, &mut r).0, 0);
        assert_eq!(hosts(&r), ["disk/x", "disk/y"]);
        assert_eq!(s.active(&a), 2);
    }
}
