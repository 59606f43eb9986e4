// Package membership tells every Runnel node which other nodes exist, how to reach them, and which of
// them are alive. It wraps hashicorp/serf.
//
// # Why serf
//
// Serf runs the SWIM gossip protocol (with HashiCorp's Lifeguard refinements) through memberlist: every
// node probes a random peer each ProbeInterval, asks a few others to probe it indirectly when the direct
// probe goes unanswered, and only then marks it suspect; a suspect that does not refute within the
// suspicion timeout (SuspicionMult × ProbeInterval, scaled by log10 of the cluster size) is declared
// failed and the news spreads by gossip. Load on each node is constant in the cluster size, there is no
// central registry to keep alive, and a node joins by knowing any one member's address (`--join`).
// A clean shutdown broadcasts a leave intent first, so the others can tell "left" from "failed".
//
// # What the tags carry
//
// Each node publishes a small set of serf tags (serf caps the encoded set at 512 bytes, so the keys are
// short): its node id ("id", also its serf name "node-<id>"), its role ("role": controller, a Raft voter
// of the controller quorum, or broker, a non-voting follower of the metadata log), the addresses of its
// gRPC API ("grpc"), its Raft transport ("raft") and its HTTP endpoint ("http"), its rack ("rack"), and
// the cluster id once it knows it ("cid"). A node that starts knows nothing but one member's gossip
// address; the tags give it everything else it needs to find the controller quorum and the brokers.
//
// # Failure detection and broker heartbeats
//
// Serf is one of two independent failure detectors. The controller also expects a heartbeat from every
// registered broker over gRPC, and it fences a broker (removes it from ISRs, moves its partition
// leaderships away) on whichever comes first: serf's failed (or left) event for that broker, or missed
// heartbeats past the broker session timeout. Serf is usually faster for a crashed process or machine
// (seconds, with the LAN timings of DefaultConfig) and catches a node that is gone from the network; the
// heartbeats catch a node that still gossips but whose broker no longer makes progress. A serf join
// only says the node is reachable again; whether its broker is back is the controller's decision
// (broker registration, as in Kafka's KRaft).
//
// # Safety checks at start
//
// Start refuses, with ErrDuplicateNodeID, to join a cluster in which another live member already uses
// the node id at a different address. Two checks make this reliable:
//
//   - At the join, a memberlist merge delegate on both sides refuses to merge two member lists that
//     name one live node at two addresses, so nothing of the newcomer enters the cluster and the
//     established node is unaffected.
//   - Right after a join, the newcomer asks every member, with a serf query ("runnel-whois"), where it
//     sees the newcomer's name alive; the other node with that name answers too. This catches the
//     races the merge check cannot see: two nodes with one id joining the same member at the same
//     moment (a copy-pasted compose file), or joining through members that have not heard of each
//     other yet. In such a race both may find each other and both be refused: never are both
//     admitted, and no tie-break is attempted (one by start time would trust clocks, one by address
//     could admit a newcomer beside an established node that never checks again).
//
// Serf's own name conflict resolution is disabled: it votes with the members other than the two
// claimants, so with no third member both lose and shut serf down under their owner.
//
// Start refuses, with ErrEncryption, to run with a gossip key the members reached cannot use. Addresses
// that cannot be reached at all are retried in the background, since the first nodes of a cluster start
// before the others.
package membership
