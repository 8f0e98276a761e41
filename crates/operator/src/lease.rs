//! Leader election over a `coordination.k8s.io/v1` Lease, with client-go's
//! timings (lease 15 s, renew deadline 10 s, retry 2 s), so only one
//! replica of the operator reconciles at a time.
//!
//! [`decide`] is the whole policy, pure: create the Lease when there is
//! none, renew it when this replica holds it, take it when it is free or
//! its record has not changed for a lease duration *as measured here*
//! (client-go's `observedTime`: the local time the record was last seen
//! to change, so clock skew between replicas does not matter), else
//! follow. Writes carry the `resourceVersion` read, so two replicas racing
//! for one Lease see a 409 and one of them follows.
//!
//! [`LeaderElector::hold`] renews every retry period and gives up when no
//! renewal succeeded for the renew deadline: shorter than the lease, so a
//! leader that cannot renew stops reconciling before another replica may
//! take over (the caller then exits: fail-stop, like
//! kube-controller-manager). On shutdown [`LeaderElector::release`] empties
//! the holder so the next replica takes over at once.
//!
//! The lease gives availability, not correctness: catalog commands are
//! idempotent and status is written by one field manager, so two brief
//! leaders cost duplicate events, not wrong data.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use mira_common::clock::Clock;
use tokio::time::Instant;

/// The election's names and timings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's defaults.
    pub fn new(name: &str, identity: &str) -> LeaseConfig {
        LeaseConfig {
            name: name.to_owned(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What to do with the Lease as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// There is none: create it, holding it.
    Create,
    /// Free or expired: take it over.
    Acquire,
    /// Held by this replica: renew it.
    Renew,
    /// Held by another replica whose lease has not expired.
    Follow { holder: String },
}

/// The decision for `me`, given the Lease's spec (`None`: no Lease), the
/// local instant its record was last seen to change, and now.
pub fn decide(
    spec: Option<&LeaseSpec>,
    me: &str,
    observed_at: Instant,
    now: Instant,
    default_duration: Duration,
) -> Decision {
    let Some(spec) = spec else { return Decision::Create };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder == me {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::Acquire;
    }
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .map_or(default_duration, Duration::from_secs);
    if now >= observed_at + duration {
        Decision::Acquire
    } else {
        Decision::Follow {
            holder: holder.to_owned(),
        }
    }
}

/// How holding the lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// The stop signal came.
    Stopped,
    /// No renewal succeeded within the renew deadline.
    Lost,
}

/// One replica's side of the election.
#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    clock: Clock,
    /// The spec last seen and the local instant it was first seen so.
    observed: Option<(LeaseSpec, Instant)>,
    /// When this replica last wrote the Lease successfully as holder.
    last_renew: Option<Instant>,
}

fn micro_time(clock: &Clock) -> MicroTime {
    MicroTime(Timestamp::try_from(clock.now()).unwrap_or(Timestamp::UNIX_EPOCH))
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl LeaderElector {
    /// An elector over `api` (the Lease's namespace).
    pub fn new(api: Api<Lease>, config: LeaseConfig, clock: Clock) -> LeaderElector {
        LeaderElector {
            api,
            config,
            clock,
            observed: None,
            last_renew: None,
        }
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    fn observe(&mut self, spec: Option<&LeaseSpec>, now: Instant) -> Instant {
        match (spec, &self.observed) {
            (Some(s), Some((seen, at))) if seen == s => *at,
            (Some(s), _) => {
                self.observed = Some((s.clone(), now));
                now
            }
            (None, _) => {
                self.observed = None;
                now
            }
        }
    }

    /// One round: read the Lease, then create, take over or renew it as
    /// [`decide`]s. `Ok(true)` when this replica holds it afterwards; a
    /// lost race (409) is `Ok(false)`.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = Instant::now();
        let current = self.api.get_opt(&self.config.name).await?;
        let spec = current.as_ref().and_then(|l| l.spec.clone());
        let observed_at = self.observe(spec.as_ref(), now);
        let decision = match (&current, &spec) {
            (Some(_), None) => Decision::Acquire,
            _ => decide(
                spec.as_ref(),
                &self.config.identity,
                observed_at,
                now,
                self.config.lease_duration,
            ),
        };
        let stamp = micro_time(&self.clock);
        let seconds = i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let written = match decision {
            Decision::Follow { .. } => return Ok(false),
            Decision::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.config.identity.clone()),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: Some(stamp.clone()),
                        renew_time: Some(stamp),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Decision::Acquire | Decision::Renew => {
                let mut lease = current.unwrap_or_default();
                let old = lease.spec.take().unwrap_or_default();
                let spec = if decision == Decision::Renew {
                    LeaseSpec {
                        lease_duration_seconds: Some(seconds),
                        renew_time: Some(stamp),
                        ..old
                    }
                } else {
                    LeaseSpec {
                        holder_identity: Some(self.config.identity.clone()),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: Some(stamp.clone()),
                        renew_time: Some(stamp),
                        lease_transitions: Some(old.lease_transitions.unwrap_or(0) + 1),
                        ..old
                    }
                };
                lease.spec = Some(spec);
                self.api
                    .replace(&self.config.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(lease) => {
                if let Some(spec) = lease.spec {
                    self.observed = Some((spec, now));
                }
                self.last_renew = Some(now);
                Ok(true)
            }
            Err(e) if conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Tries every retry period until this replica leads (true) or `stop`
    /// resolves first (false).
    pub async fn acquire(&mut self, stop: &mut (impl Future<Output = ()> + Unpin)) -> bool {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(target: "mira::operator", lease = self.config.name, identity = self.config.identity, "leading");
                    return true;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(target: "mira::operator", lease = self.config.name, error = %e, "lease"),
            }
            tokio::select! {
                () = &mut *stop => return false,
                () = tokio::time::sleep(self.config.retry_period) => {}
            }
        }
    }

    /// Renews every retry period until `stop` resolves ([`Held::Stopped`])
    /// or no renewal succeeded for the renew deadline ([`Held::Lost`]).
    /// Each attempt is cut off at the deadline, so a hung API call does
    /// not keep a stale leader running.
    pub async fn hold(&mut self, stop: &mut (impl Future<Output = ()> + Unpin)) -> Held {
        loop {
            let deadline = self.last_renew.unwrap_or_else(Instant::now) + self.config.renew_deadline;
            tokio::select! {
                () = &mut *stop => return Held::Stopped,
                () = tokio::time::sleep(self.config.retry_period) => {}
            }
            let attempt = tokio::time::timeout_at(deadline, self.try_acquire_or_renew());
            let renewed = tokio::select! {
                () = &mut *stop => return Held::Stopped,
                r = attempt => r,
            };
            match renewed {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    tracing::error!(target: "mira::operator", lease = self.config.name, "another replica holds the lease");
                    return Held::Lost;
                }
                Ok(Err(e)) => {
                    tracing::warn!(target: "mira::operator", lease = self.config.name, error = %e, "renew lease");
                }
                Err(_) => {}
            }
            // `last_renew` moves only on success, so `deadline` still
            // counts from the last good renewal.
            let renewed_in_time = self
                .last_renew
                .is_some_and(|t| t + self.config.renew_deadline > Instant::now());
            if !renewed_in_time && Instant::now() >= deadline {
                tracing::error!(target: "mira::operator", lease = self.config.name, "could not renew the lease within the renew deadline");
                return Held::Lost;
            }
        }
    }

    /// Gives the lease up (holder emptied) if this replica holds it.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.take() else { return Ok(()) };
        if spec.holder_identity.as_deref() != Some(&self.config.identity) {
            return Ok(());
        }
        lease.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            renew_time: Some(micro_time(&self.clock)),
            ..spec
        });
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                self.last_renew = None;
                Ok(())
            }
            Err(e) if conflict(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests;
