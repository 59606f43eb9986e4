// Package quorum runs the controller quorum: a thin, generic shell around hashicorp/raft that replicates
// an opaque state machine across 1, 3 or 5 voters and any number of non-voters.
//
// # Why a generic shell
//
// Runnel follows KRaft (KIP-500, KIP-595): the cluster metadata — brokers, topics, partitions with their
// replicas, ISR, leader and leader epoch, configs — is a log replicated by a Raft quorum of controllers,
// and every other broker follows that log as a non-voter so it has the whole metadata locally.
//
// The metadata state machine is deterministic and lives in broker/meta: it takes committed entries and
// snapshots as bytes, reads no clock, starts no goroutine and does no I/O, so it can be driven step by
// step in tests. Everything that is not deterministic lives here instead: raft's goroutines and timers,
// the TCP transport, the write-ahead log (raft-wal) and the snapshot files. This package knows nothing
// about topics; it only moves bytes into StateMachine.Apply in the same order on every node.
//
// # Pieces
//
//   - Log and stable store: github.com/hashicorp/raft-wal in Dir/wal (segment files plus a small bolt
//     file for raft's term and vote).
//   - Snapshots: raft's file snapshot store in Dir/snapshots, the 2 newest kept. A snapshot is the
//     state machine's bytes behind a 12-byte header that carries the index it was taken at, so Restore
//     learns it (raft's FSM.Restore does not say).
//   - Transport: raft's NetworkTransport (msgpack over TCP, a pool of 3 connections per peer, 5 s I/O
//     timeout) over a TCP stream layer of this package that tracks its connections, so that Close ends
//     every connection handler instead of leaving them blocked on reads from live peers.
//   - Logging: raft's hclog lines go to slog; raft's own INFO lines are logged at slog Debug, and the
//     shell logs leadership changes at Info.
//
// # Bootstrapping
//
// Voters come from static configuration (Kafka's controller.quorum.voters, "1@host:port,..."). A voter
// that finds no raft state in its Dir bootstraps the cluster with exactly that voter set, sorted by id,
// so every voter writes the same first entry (raft allows every voter to bootstrap with the same
// configuration). A non-voter starts empty and waits for the leader to add it (AddNonvoter). A node
// restarting with its Dir restores its newest snapshot, then catches up from its log and the leader.
//
// # Proposals and their outcome
//
// Propose tags each entry (in raft's Log.Extensions, which the state machine never sees) with a number
// of its own, and the apply path hands the state machine's result back to the waiting Propose by that
// tag. So a proposal waits for exactly its entry, bounded by its context, without a goroutine per call.
// Raft cannot take back an entry once it has reached a follower: when Propose returns an error after it
// appended the entry (leadership lost, context ended), the entry may still commit later under a new
// leader. Callers must treat such outcomes as unknown, which is why metadata records are written to be
// idempotent or conditional on the state they expect, as KRaft's are.
//
// Barrier is a tagged entry the state machine never sees: when it is applied, everything committed
// before it has been applied here, which is what a new leader waits for before acting on its state
// (the Raft paper, §8: a new leader learns what is committed only by committing an entry of its own
// term; KRaft's controller likewise waits for its log to be applied before it serves writes).
package quorum
