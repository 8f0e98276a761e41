//! Catalog commands from bytes, decoded the ways a catalog member decodes
//! them and applied to a fresh state machine state (`State::apply`, what
//! the Raft state machine runs for each committed entry):
//!
//! - 0: a sequence of postcard `Command`s (the Raft log's encoding),
//!   applied one after another to one state;
//! - 1: a postcard Raft log `Entry` (the redb log store's encoding);
//! - 2: a postcard Raft RPC payload (`AppendEntriesRequest`, whose entries
//!   are applied; `VoteRequest`; `InstallSnapshotRequest`, whose data is
//!   read as a snapshot image);
//! - 3: a protobuf `WriteRequest` (the catalog's client API), converted
//!   (`Command::try_from`) and applied;
//! - 4: a snapshot image (`decode_image`, zstd + postcard).
//!
//! Input: byte 0 picks the case (`% 5`), the rest is the bytes.
//!
//! Checked beyond "no panic": a refused command leaves the state exactly
//! as it was; an accepted one leaves a state whose snapshot image encodes,
//! decodes and rebuilds to the same image; a decoded command re-encodes
//! to bytes that decode to the same command.

#![no_main]

#[path = "../common/seeds.rs"]
mod seeds;

use libfuzzer_sys::fuzz_target;
use mira_catalog::model::{BlockRecord, Command, Policy, PolicyKind};
use mira_catalog::proto as pb;
use mira_catalog::state::State;
use mira_catalog::state_machine::{decode_image, encode_image};
use mira_catalog::types::{Entry, NodeId, TypeConfig};
use openraft::EntryPayload;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use prost::Message;

/// At most this many commands of one input are applied.
const MAX_COMMANDS: usize = 64;

fn apply(state: &mut State, cmd: &Command) {
    let again: Command = postcard::to_stdvec(cmd)
        .ok()
        .and_then(|b| postcard::from_bytes(&b).ok())
        .expect("a command re-encodes and decodes");
    assert_eq!(&again, cmd, "a command does not survive its own encoding");
    let before = state.to_image();
    match state.apply(cmd) {
        Err(_) => assert!(state.to_image() == before, "a refused command changed the state"),
        Ok(_) => {
            let image = state.to_image();
            let bytes = encode_image(&image).expect("a state's image encodes");
            let decoded = decode_image(&bytes).expect("an encoded image decodes");
            assert!(decoded == image, "the snapshot image does not decode to itself");
            assert!(
                State::from_image(decoded).to_image() == image,
                "the state rebuilt from its image differs"
            );
        }
    }
}

fn apply_entries<'a>(entries: impl IntoIterator<Item = &'a Entry>) {
    let mut state = State::new();
    for e in entries.into_iter().take(MAX_COMMANDS) {
        if let EntryPayload::Normal(cmd) = &e.payload {
            apply(&mut state, cmd);
        }
    }
}

fn image(bytes: &[u8]) {
    if let Ok(image) = decode_image(bytes) {
        let state = State::from_image(image);
        let once = state.to_image();
        assert!(
            State::from_image(once.clone()).to_image() == once,
            "a state rebuilt from its own image differs"
        );
    }
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    use mira_catalog::testing::block;
    let b1 = block("team-a", 1_750_000_000_000_000_000, 60_000_000_000);
    let b2 = block("team-b", 1_750_000_360_000_000_000, 1_000_000_000);
    let records: Vec<BlockRecord> = [&b1, &b2]
        .into_iter()
        .filter_map(|b| BlockRecord::try_from(b).ok())
        .collect();
    let ids: Vec<_> = records.iter().map(|r| r.id).collect();
    let now = 1_750_000_400_000_000_000;
    let commands = vec![
        Command::Heartbeat {
            ingester_id: "ingester-0".into(),
            address: "10.0.0.1:4317".into(),
            now_ns: now,
            ttl_ms: 15_000,
        },
        Command::Fence {
            ingester_id: "ingester-0".into(),
        },
        Command::Publish {
            blocks: records.clone(),
            watermark: Some(mira_catalog::model::Watermark {
                ingester_id: "ingester-0".into(),
                shard: 1,
                wal_seq: 42,
            }),
        },
        Command::AcquireLease {
            key: "compact/team-a/logs".into(),
            holder: "compactor-0".into(),
            now_ns: now,
            ttl_ms: 30_000,
        },
        Command::SetPolicy(Policy {
            kind: PolicyKind::Retention,
            name: "default".into(),
            tenant: String::new(),
            body_json: r#"{"v":1,"retain_s":3600}"#.into(),
        }),
        Command::Tombstone {
            ids: ids[..1].to_vec(),
            now_ns: now,
        },
        Command::Purge { ids: ids[..1].to_vec() },
        Command::ReleaseLease {
            key: "compact/team-a/logs".into(),
            holder: "compactor-0".into(),
        },
    ];
    let mut out = Vec::new();
    let mut all = Vec::new();
    for (i, c) in commands.iter().enumerate() {
        let b = postcard::to_stdvec(c).expect("encode a command");
        all.extend_from_slice(&b);
        out.push((format!("command-{i}"), seeds::with_selector(0, &b)));
    }
    out.push(("commands-all".into(), seeds::with_selector(0, &all)));

    let entry = |index: u64, payload| Entry {
        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 0), index),
        payload,
    };
    let entries: Vec<Entry> = commands
        .iter()
        .enumerate()
        .map(|(i, c)| entry(i as u64 + 1, EntryPayload::Normal(c.clone())))
        .collect();
    for (i, e) in entries.iter().enumerate().take(3) {
        out.push((
            format!("entry-{i}"),
            seeds::with_selector(1, &postcard::to_stdvec(e).expect("encode an entry")),
        ));
    }
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: openraft::Vote::new_committed(1, 0),
        prev_log_id: None,
        entries,
        leader_commit: None,
    };
    let mut rpc = vec![0u8];
    rpc.extend(postcard::to_stdvec(&append).expect("encode append entries"));
    out.push(("rpc-append".into(), seeds::with_selector(2, &rpc)));
    let vote = VoteRequest::<NodeId>::new(openraft::Vote::new(2, 1), None);
    let mut rpc = vec![1u8];
    rpc.extend(postcard::to_stdvec(&vote).expect("encode a vote"));
    out.push(("rpc-vote".into(), seeds::with_selector(2, &rpc)));

    let writes = [
        pb::write_request::Command::Publish(pb::Publish {
            blocks: vec![b1.clone(), b2.clone()],
            watermark: None,
        }),
        pb::write_request::Command::Heartbeat(pb::Heartbeat {
            ingester_id: "ingester-0".into(),
            address: "10.0.0.1:4317".into(),
            now_ns: now,
            ttl_ms: 15_000,
        }),
        pb::write_request::Command::Tombstone(pb::Tombstone {
            ids: vec![b1.id.clone()],
            now_ns: now,
        }),
        pb::write_request::Command::SetPolicy(pb::SetPolicy {
            policy: Some(pb::Policy {
                kind: pb::PolicyKind::Offload as i32,
                name: "to-cold".into(),
                tenant: "team-a".into(),
                body_json: r#"{"v":1,"target":"cold-1","after_s":3600}"#.into(),
                status_json: String::new(),
            }),
        }),
    ];
    for (i, w) in writes.into_iter().enumerate() {
        let req = pb::WriteRequest { command: Some(w) };
        out.push((format!("write-{i}"), seeds::with_selector(3, &req.encode_to_vec())));
    }

    let mut state = State::new();
    for c in &commands {
        let _ = state.apply(c);
    }
    out.push((
        "image".into(),
        seeds::with_selector(4, &encode_image(&state.to_image()).expect("encode an image")),
    ));
    out
}

fuzz_target!(
    init: seeds::write_if_asked(seeds),
    |data: &[u8]| {
        let Some((&sel, rest)) = data.split_first() else {
            return;
        };
        match sel % 5 {
            0 => {
                let mut state = State::new();
                let mut bytes = rest;
                for _ in 0..MAX_COMMANDS {
                    let Ok((cmd, tail)) = postcard::take_from_bytes::<Command>(bytes) else {
                        break;
                    };
                    apply(&mut state, &cmd);
                    bytes = tail;
                }
            }
            1 => {
                if let Ok(e) = postcard::from_bytes::<Entry>(rest) {
                    apply_entries([&e]);
                }
            }
            2 => match rest.split_first() {
                Some((0, b)) => {
                    if let Ok(req) = postcard::from_bytes::<AppendEntriesRequest<TypeConfig>>(b) {
                        apply_entries(&req.entries);
                    }
                }
                Some((1, b)) => {
                    let _ = postcard::from_bytes::<VoteRequest<NodeId>>(b);
                }
                Some((_, b)) => {
                    if let Ok(req) = postcard::from_bytes::<InstallSnapshotRequest<TypeConfig>>(b) {
                        image(&req.data);
                    }
                }
                None => {}
            },
            3 => {
                if let Ok(req) = pb::WriteRequest::decode(rest)
                    && let Ok(cmd) = Command::try_from(&req)
                {
                    apply(&mut State::new(), &cmd);
                }
            }
            _ => image(rest),
        }
    }
);
