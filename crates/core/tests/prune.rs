//! A block's pruning answers come from its manifest and sidecars alone: no
//! row section is fetched or verified.

use std::sync::Arc;

use mira_core::block::{Block, VerifyCache};
use mira_core::convert::{LogsBuilder, SignalBuilder, SpansBuilder};
use mira_core::scan::{AttrMatcher, AttrScope, MatchOp, Predicate, ScanRequest, prune, scan};
use mira_core::sidecar::{PruneRule, Verdict};
use mira_core::tables::write_hot;
use mira_core::{BlockId, TenantId};
use mira_testkit::corpus::{Cardinality, Corpus};

fn eq(scope: AttrScope, key: &str, v: &str) -> AttrMatcher {
    AttrMatcher {
        scope,
        key: key.into(),
        op: MatchOp::Eq(v.into()),
    }
}

#[test]
fn pruning_reads_only_sidecars_and_never_loses_a_match() {
    let mut corpus = Corpus::new(21, Cardinality::Low);
    let mut b = SpansBuilder::default();
    b.append(&corpus.traces(3000)).expect("append");
    let tables = b.finish().expect("finish");
    let bytes = write_hot(&tables, BlockId::new(), TenantId::default_tenant()).expect("write");
    let cache = Arc::new(VerifyCache::new(64));
    let block = Block::from_bytes(bytes, cache.clone()).expect("open");
    let (t0, t1) = (tables.min_time, tables.max_time);

    let absent_trace = Predicate {
        trace_id: Some([0xAB; 16]),
        ..Default::default()
    };
    let cases = [
        (
            Predicate {
                time: Some((t1 + 1, t1 + 1000)),
                ..Default::default()
            },
            Some(PruneRule::Time),
        ),
        (
            Predicate {
                time: Some((t0, t0)),
                ..Default::default()
            },
            Some(PruneRule::Time),
        ),
        (
            Predicate {
                min_duration: Some(u64::MAX / 2),
                ..Default::default()
            },
            Some(PruneRule::ZoneMap),
        ),
        (
            Predicate {
                attrs: vec![eq(AttrScope::Resource, "service.name", "no-such-service")],
                ..Default::default()
            },
            Some(PruneRule::AttrIndex),
        ),
        (
            Predicate {
                attrs: vec![eq(AttrScope::Field, "name", "no such span name")],
                ..Default::default()
            },
            Some(PruneRule::AttrIndex),
        ),
        (absent_trace, Some(PruneRule::Bloom)),
        (
            Predicate {
                attrs: vec![eq(AttrScope::Resource, "service.name", "checkout")],
                ..Default::default()
            },
            None,
        ),
        (
            Predicate {
                time: Some((t0, t1 + 1)),
                ..Default::default()
            },
            None,
        ),
    ];
    for (p, want) in &cases {
        let v = prune(&block, p).expect("prune");
        match want {
            Some(rule) => assert_eq!(v, Verdict::Pruned(*rule), "{p:?}"),
            None => assert_eq!(v, Verdict::MayMatch, "{p:?}"),
        }
    }
    // Only the three sidecar sections were ever verified.
    assert_eq!(cache.verifications(), 3, "pruning read a row section");

    // Every trace id present in the block is reported as possibly present,
    // and a pruned predicate really had no match.
    for (p, want) in &cases {
        let matched = scan(
            &block,
            &ScanRequest {
                predicate: p.clone(),
                ..Default::default()
            },
        )
        .expect("scan");
        if want.is_some() {
            assert!(
                matched.rows.is_empty(),
                "pruned but {} rows match: {p:?}",
                matched.rows.len()
            );
        }
    }
}

#[test]
fn every_logged_trace_id_survives_pruning() {
    let mut corpus = Corpus::new(22, Cardinality::High);
    let req = corpus.logs(5000);
    let mut b = LogsBuilder::default();
    b.append(&req).expect("append");
    let tables = b.finish().expect("finish");
    let block = Block::from_bytes(
        write_hot(&tables, BlockId::new(), TenantId::default_tenant()).expect("write"),
        Arc::new(VerifyCache::new(64)),
    )
    .expect("open");
    let mut checked = 0;
    for r in req
        .resource_logs
        .iter()
        .flat_map(|r| &r.scope_logs)
        .flat_map(|s| &s.log_records)
    {
        if let Ok(id) = <[u8; 16]>::try_from(r.trace_id.as_slice()) {
            let p = Predicate {
                trace_id: Some(id),
                ..Default::default()
            };
            assert_eq!(prune(&block, &p).expect("prune"), Verdict::MayMatch);
            checked += 1;
        }
    }
    assert!(checked > 1000, "the corpus should put trace ids on half the records");
}
