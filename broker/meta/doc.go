// Package meta is the cluster's metadata as a deterministic state machine: the registered brokers,
// the topics with their configs, and each partition's replicas, ISR, leader, leader epoch and partition
// epoch. It is the state the Raft controller quorum replicates (the KRaft design, KIP-500 and KIP-631):
// the controller leader proposes Commands, every node (voter or not) applies the committed ones in the
// same order with Apply and so holds the whole metadata locally, which is what it answers Metadata
// requests from.
//
// Why a separate, pure package: Apply reads no clock, draws no random numbers and does no I/O — the
// proposer puts ids and timestamps into the command — so every node computes the same Image from the
// same log, and tests drive it step by step (DESIGN.md §6, deterministic cores). platform/quorum owns
// the goroutines, the network and the log; FSM adapts an Image to its StateMachine interface.
//
// Images are immutable: Apply returns a new *Image that shares the unchanged topics and brokers with
// the old one, so readers take the current image with one atomic load and need no lock.
//
// Rules that come from Kafka:
//   - A broker registers fenced and is unfenced once it has caught up with the metadata log (KIP-631);
//     a fenced broker leads nothing and is dropped from every ISR it was in (an ISR never becomes empty:
//     its last member stays, so the partition waits for it rather than losing acknowledged records).
//   - Leaders are elected only here, from the ISR in replica order; an out-of-sync replica is elected
//     only when the topic sets unclean.leader.election.enable=true. Every leader change bumps the
//     leader epoch (KIP-101), every change of leader or ISR bumps the partition epoch (KIP-497), and
//     an ISR change proposed with a stale partition epoch is refused.
//   - New partitions are spread evenly over the unfenced brokers, alternating racks when racks are set
//     (Kafka's AdminUtils.assignReplicasToBrokers).
package meta
