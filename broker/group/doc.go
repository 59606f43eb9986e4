// Package group is the deterministic core of Runnel's consumer group coordinator: KIP-848's broker-side
// assignment ("the consumer rebalance protocol"), with committed offsets and group state kept as records
// of the compacted internal topic __consumer_offsets.
//
// # Shape: a core and a shell
//
// A Coordinator holds the groups of one __consumer_offsets partition. It is a state machine in the
// etcd-io/raft mould (DESIGN.md §6): no goroutines, no clock (every call takes now), no I/O. Calls that
// change state return the records to append; the broker (broker/groups.go, the shell) appends them to
// the partition fsynced, gives them back through Apply once durable, and only then answers the client.
// The shell owns the one goroutine that calls Tick (session and rebalance timeouts, group expiry) and
// SetTopics (topic created, deleted, grown), and serialises calls per partition. That split is what lets
// testdata/*.txt drive the core step by step with a scripted clock, faults included — missed heartbeats,
// slow revocations, lost answers, coordinator restarts — and lets property tests (rapid) run thousands
// of random histories in seconds.
//
// # Epochs and reconciliation (KIP-848)
//
// The group epoch bumps whenever the target assignment's inputs change: a member joins or is removed,
// a subscription or the group's assignor changes, a subscribed topic is created, deleted or gains
// partitions. The target assignment is then recomputed at once by the group's assignor (broker/group/
// assignor: "uniform", sticky and balanced, the default; or "range") and takes the group epoch as its
// assignment epoch. Each member moves towards its target on its own heartbeats:
//
//   - partitions it owns outside its target are left out of the assignment it is sent: that is how
//     revocation is signalled. The member stays at its epoch until a heartbeat's owned_partitions no longer
//     lists them (or the rebalance timeout removes it);
//   - then it moves to the assignment epoch — its member epoch is always the assignment epoch it has
//     reconciled to — and gets the target partitions nobody owns;
//   - target partitions still owned by another member (not yet revoked there) come on later heartbeats.
//
// The group keeps an index of who owns each partition (assigned or pending revocation), and a
// partition is handed out only while nobody is in it: no partition ever has two owners on the
// coordinator's side, and, because a member gives a partition up before the heartbeat that says so and
// sends one heartbeat at a time, none from the members' side either (see the SDK rules below). Check
// verifies this and the other invariants after every call in tests and -race builds.
//
// Members whose heartbeats are due soonest are the assignor's preferred donors, and the first
// interval after a member reconciles is a fraction of the heartbeat interval (fixed per member and
// epoch), which spreads the members' heartbeats: a member joining a group of 50 over 600 partitions gets
// its first partition in about one reconciling interval (200ms) and all of them in about a second with
// the default 5s heartbeat interval.
//
// # Timeouts and static membership
//
// A member not heard from for its session timeout is removed and its partitions freed; one that has not
// acknowledged a revocation within its rebalance timeout likewise. A static member (instance id) that
// leaves with epoch -2 keeps its partitions reserved for its session timeout; a process joining with
// the same instance id takes its place — member id, epoch and partitions — without a new group epoch.
// A second live member with the same instance id gets UNRELEASED_INSTANCE_ID.
//
// # Commits
//
// A member commits with its member id and current epoch, and only partitions it owns (including those
// it is revoking: commit on revocation). Older epochs of a live member are STALE_MEMBER_EPOCH (heartbeat
// and retry), removed members UNKNOWN_MEMBER_ID, epochs it never had FENCED_MEMBER_EPOCH, so a member
// that was removed cannot overwrite a newer commit. Offsets lie in [0, log end offset], metadata is at
// most 4096 bytes. An admin commit (no member id, epoch -1) needs an empty group. Commits take effect
// only through Apply, so FetchOffsets never shows a commit a crash could take back. Every refused call
// leaves the group as it was: each path checks everything before it changes anything.
//
// # Offsets in transactions (KIP-98, KIP-447)
//
// TxnOffsetCommit is validated as Commit is and fenced by producer epoch too (PRODUCER_FENCED); its
// records are appended as a transactional batch of the producer and stay pending per producer id until
// the producer's end-transaction marker (Marker, appended by the shell as a control batch in the
// partition's write order): COMMIT installs them, ABORT drops them. Between plain commits, tombstones
// and several transactions the offset record that comes last in the log wins, as in Kafka. FetchOffsets
// with require_stable answers UNSTABLE_OFFSET_COMMIT for a partition with pending offsets; a group
// holding them is neither deleted (NON_EMPTY_GROUP) nor expired. Replay passes the producer of every
// record of a transactional batch and every marker (Record.Producer, Record.Marker) to Load, which
// rebuilds the same pending state. See txn.go.
//
// # Records
//
// records.go defines the keys and values (a compact, versioned binary encoding, fuzzed by
// FuzzDecode*Record): one record per committed offset, one per group (epochs, assignor, subscribed
// topics' metadata, when it became empty), one per member (subscription, timeouts, epochs,
// reconciliation state, assigned, pending and target partitions). A member removed or a group deleted
// gets tombstones. On start the shell replays the partition through Load and Start: committed offsets,
// epochs, members, their assignments and static reservations come back; members are not alive until
// they heartbeat again — those that do carry on with their ids and epochs, the others time out.
//
// Empty groups expire after OffsetsRetention (Kafka's offsets.retention.minutes, 7 days): their offsets
// are tombstoned. Offsets of a deleted topic are tombstoned when the coordinator learns of the deletion.
//
// # What the SDK must do (the heartbeat protocol)
//
//   - Send one heartbeat at a time, and the next one after heartbeat_interval_ms, or at once after it
//     finished revoking partitions.
//   - Join with member_epoch 0 and the subscription (topic names, or an RE2 regex over whole topic names);
//     afterwards send subscription_unchanged=true unless the subscription changed.
//   - Send owned_partitions in full on every heartbeat: the partitions it processes at that moment. The
//     coordinator frees a partition it asked to revoke as soon as a heartbeat leaves it out.
//   - An answer with an assignment carries the member's full assignment; without one, nothing changed.
//     Partitions owned but missing from it must be revoked (commit, stop), then acknowledged by a heartbeat
//     sent at once. New partitions in it may be started at once.
//   - On FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID: drop every partition without committing, rejoin with
//     epoch 0. On STALE_MEMBER_EPOCH from a commit: take the epoch from the next heartbeat and retry if the
//     partition is still owned.
//   - Drop every partition (without committing) when no heartbeat sent within the last session timeout
//     has been answered, or when a revocation asked for by the answer to a heartbeat sent at T has not
//     been acknowledged (a later heartbeat without those partitions answered) by T + rebalance timeout:
//     the coordinator may have removed the member and handed its partitions to others. Measured from send
//     times, this always happens before the coordinator's own deadline.
//   - Leave with epoch -1 after revoking everything, or -2 (static members) to come back with the same
//     instance id within the session timeout.
package group
