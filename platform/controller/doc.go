// Package controller is the shell around the metadata state machine (broker/meta) on every node: it
// runs the node's part of the Raft controller quorum (platform/quorum), registers the node as a
// broker and keeps it alive with heartbeats, and — on the node that leads the quorum — fences brokers
// that fail and moves their leaderships. This is the KRaft design (KIP-500, KIP-631, KIP-595):
//
//   - Every node applies the metadata log to its own meta.FSM, so it answers Metadata locally. Voters
//     (--controller-voters) elect the leader; the others follow as raft non-voters, which the leader
//     adds when they register.
//   - Writes (topic create/delete/alter, registrations, fencing) go to the leader: a node that is not
//     the leader forwards them once over the Controller gRPC service, then waits until it has applied
//     the entry itself, so its own next answer reflects the write.
//   - A broker registers fenced and is unfenced when its heartbeat shows it has applied the metadata
//     log up to its own registration. The leader fences a broker when serf reports it failed or left,
//     or when no heartbeat came for the session timeout, whichever is first; a broker stopping cleanly
//     asks to be fenced first (controlled shutdown) so its leaderships move before it goes.
//   - The heartbeat times live only in the leader's memory: a new leader starts every broker's clock
//     afresh, and fences at once the brokers serf already knows as failed.
package controller
