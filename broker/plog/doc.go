// Package plog stores the partition logs of a node: record batches at consecutive offsets, in ONE Badger
// DB for all partitions of the node.
//
// # Why one Badger DB, and how it is used
//
// A Kafka broker keeps a directory of segment files per partition. Thousands of partitions then mean
// thousands of open files, fsyncs per partition and a lot of small random writes. Here every partition
// shares one key-value store whose value log is, in effect, a single append-only log for the whole
// node. Keys are big-endian, so iteration order is offset order and one partition's keys of one kind
// are one contiguous range:
//
//	l|topicNum(8)|partition(4)|baseOffset(8)                 → the whole stored batch (Kafka RecordBatch v2)
//	t|topicNum(8)|partition(4)|maxTimestamp(8)|baseOffset(8) → empty: the time index
//	s|topicNum(8)|partition(4)                               → logStartOffset(8) nextOffsetFloor(8) cleanerCheckpoint(8)
//	g|topicNum(8)|partition(4)                               → activeSegmentBase(8) firstWriteMs(8)
//	h|topicNum(8)|partition(4)|baseOffset(8)                 → deleteHorizonMs(8) of a cleaned batch with tombstones
//	e|topicNum(8)|partition(4)|leaderEpoch(4)                → startOffset(8): the leader-epoch cache (KIP-101)
//	w|topicNum(8)|partition(4)                               → highWatermark(8): the HW checkpoint of a replicated partition
//	x|topicNum(8)|partition(4)                               → newStart(8) newEnd(8): a Truncate too big for one transaction, under way
//	a|topicNum(8)|partition(4)|markerOffset(8)               → producerID(8) firstOffset(8): an aborted transaction (aborted.go)
//
// Keys under "m/" belong to the node's metadata, not to plog.
//
//   - Values of at least valueThreshold bytes (61, the batch header size, so every batch) go to Badger's
//     value log, which is written sequentially; the LSM tree holds only keys and 12-byte value pointers.
//     So the value log is the append-only log and the LSM tree is the offset index (Badger writes 64 KiB
//     values ~3× faster this way than inline, with a quarter of the memory).
//   - A read seeks to the batch with the greatest base offset <= the offset asked for, then walks forward
//     returning whole batches: the broker never re-encodes records.
//   - The time index gets an entry only where a batch raises the partition's running max timestamp (as
//     Kafka's time index), so its timestamps rise with its offsets and one seek finds the first batch that
//     can hold a record at or after a timestamp. Time-based retention uses the same index and needs no
//     batch reads.
//   - The state key is written only by retention (when it moves the log start, so a log emptied by
//     retention keeps its offsets across restarts), by the cleaner (its checkpoint) and by Truncate
//     (the floor drops to the new end), all under the partition's maintenance lock. (Stores from
//     before compaction have a 16-byte state; it is read.) Everything else (LEO, size, running max) is
//     recovered from the keys when a partition is opened: the last batch's header gives the LEO, a
//     key-only iteration the size (from Badger's value sizes, without reading the values).
//   - Retention deletes whole oldest batches (their keys; Badger's deletes are tombstones in the LSM) and
//     value-log GC later rewrites or drops value-log files that became mostly garbage. Deleting a
//     partition drops its key ranges with DropPrefix.
//
// # Segments
//
// A Kafka log is a directory of segment files; the last one, the active segment, takes the appends,
// and the cleaner never touches it. Here there are no files, but the same boundary is kept: the writer
// tracks the active segment's start offset, the time its first batch was written and its bytes, and
// rolls it before a batch that would take it past segment.bytes or when its first batch is older than
// segment.ms (for compacted topics min(segment.ms, max.compaction.lag.ms), Kafka's maxSegmentMs), as
// Kafka rolls on append. The limits come with each append (AppendOptions), so a config change applies
// from the next append. The start and time are stored in the segment key in the transaction of the
// segment's first batch. Kafka never rolls a segment without an append, so a quiet compacted topic
// keeps its tail uncleaned forever; Compact therefore also rolls an active segment older than
// segment.ms when nothing is being written. "Closed segments" are then simply the batches below the
// active segment's start. Retention stays per batch (it deletes whole oldest batches); segments matter
// only to the cleaner.
//
// # Log compaction
//
// For cleanup.policy=compact (or compact,delete) Partition.Compact keeps the latest record of every
// key, as Kafka's log cleaner does, and never moves an offset.
//
//   - Cleanable range: [log start, end) where end is the least of the active segment's start, the HW,
//     the first batch whose running max timestamp is younger than min.compaction.lag.ms (one seek in
//     the time index) and the base of the last batch below the HW. The last batch is never cleaned: in
//     Kafka the active segment always holds it, and it keeps a reader at the end of the log from
//     waiting at an offset in a gap that no batch up to the HW would take it past.
//   - Dirty ratio: the cleaner checkpoint (stored in the state key) is where the last clean ended;
//     [log start, checkpoint) is clean and holds each key at most once. Dirty bytes are those of
//     [checkpoint, end), and the ratio is dirty / (clean + dirty) bytes, from Badger's key iteration
//     without reading values. A run cleans when the ratio is at least min.cleanable.dirty.ratio, when
//     the first dirty batch's max timestamp is older than max.compaction.lag.ms, or when a kept
//     tombstone's delete horizon has passed (as Kafka's cleaner takes logs with expired tombstones
//     when nothing is dirty).
//   - Key map: every key from the checkpoint up to the HW (the dirty part and the active tail, so a
//     key rewritten in the tail makes its older copies obsolete) → its latest offset, as 128-bit
//     seeded hashes. The clean part needs no mapping: it holds each key once, and its record is kept
//     unless the map has a later offset for the key.
//   - Rewrite: each batch of the range is rewritten (batch.FilterRecords) keeping only the records
//     that are the latest of their key; the retained records' bytes are copied unchanged, the header
//     keeps base offset, last offset delta, timestamps, producer fields and codec, and gets a new
//     count, length and CRC. A batch left without records is deleted. Readers see gaps: Read from an
//     offset in a gap returns the next batch; the log start does not move (Kafka's neither), and
//     OFFSET_OUT_OF_RANGE still means below the log start (told apart from a gap by the log start
//     stored in the reader's snapshot) or above the HW. Keyless records are dropped, as Kafka's
//     cleaner drops them; produce refuses them on compacted topics (INVALID_RECORD).
//   - Tombstones: Kafka once aged tombstones by the cleaned segment's file time and now writes a
//     delete horizon into the batch header (KIP-534). Readers here would misread such a header, so the
//     horizon lives in a side index: the first clean that keeps a tombstone as the latest of its key
//     writes h|…|baseOffset → now + delete.retention.ms; a later clean after that time removes the
//     batch's tombstones (and the entry with the batch). Retention and DeletePartition drop the
//     entries with their batches.
//   - Safety: a run holds the partition's maintenance lock (retMu, shared with retention) and reads
//     from one Badger snapshot. It writes groups of whole batches, one transaction each, under the
//     store's dropMu like retention (so DeletePartition cannot interleave), starting with the state
//     (so recovery never takes a removed first batch for a moved log start) and, in the last group,
//     ending with the new checkpoint. A reader's snapshot sees each batch old or new, both valid;
//     appends go on at the tail, which the cleaner does not write; a crash or a cancelled ctx leaves a
//     valid mixture, and since offsets are processed in order an older copy of a key is always gone no
//     later than the tombstone that deleted it. Size is adjusted per committed group, and recovery
//     recomputes it from the rewritten values. Badger's value-log GC reclaims the old values.
//   - Cost: a run reads and decodes the whole range and the tail, as Kafka's cleaner rereads all
//     segments; only batches that change are written. The map holds ~40 bytes per distinct key of the
//     dirty part and the tail, without a cap (Kafka bounds it with log.cleaner.dedupe.buffer.size and
//     cleans in several passes).
//
// # Group commit and durability
//
// Appends to all partitions go through one queue. One writer goroutine takes what is queued, assigns
// offsets per partition in queue order by rewriting the batch headers (base offset; leader epoch and
// log-append time are stamped by Append before queueing), and writes everything in one Badger
// transaction. It then hands the group to a syncer goroutine that fsyncs once (every value-log and
// memtable WAL file active at the last fsync or created since, by path; see Store.syncToDisk) for
// everything written so far, while the
// writer already writes the next group. With Options.Fsync the durable end (DurableEnd; unless the
// partition is replicated, also the HW) moves only after the fsync that covers the data, so a consumer
// never sees a record that a crash could take back; acks=1 appends return once written and acks=all
// ones after the fsync. Without Fsync the durable end moves and all appends return once written (a
// kill -9 loses nothing then either: Badger's files are memory-mapped, the page cache keeps the data;
// a machine crash can lose the tail). The queue also carries a follower's AppendReplica, Truncate and
// HW checkpoints, so everything done to one partition takes effect in the order it was asked for.
//
// # Replication
//
// Replication (Kafka's ISR model, in the broker) needs four things from the log; replica.go has them.
//
//   - Two ends. A leader must not let consumers read what the ISR does not have yet (a new leader may
//     not have it, and the record would vanish), yet its followers must read exactly that to copy it.
//     So a partition put in replicated mode (SetReplicated) keeps two offsets: DurableEnd, the local
//     end that is written and fsynced (what the HW was before; the leader counts it as its own LEO and
//     followers read up to it with ReadLocal), and the HW, which only the replication layer moves
//     (SetHighWatermark: min LEO over the ISR on the leader, min(leader's HW, own LEO) on a follower)
//     and which Read, OffsetForTimestamp, retention and the cleaner stop at. The HW never passes
//     DurableEnd and moves forward only, except that Truncate clamps it. It is checkpointed in its own
//     key (Kafka's replication-offset-checkpoint): by the writer shortly after each move, in the
//     truncation's transaction, and on Close; a partition with a checkpoint reopens in replicated mode
//     with the checkpoint clamped into [log start, LEO] (a checkpoint that lags only hides records
//     until the leader moves the HW again; one above the log would show records that were never
//     committed). Partitions never put in replicated mode behave as before: HW = DurableEnd.
//   - Copies as they are. AppendReplica stores a leader's batches unchanged (offsets, leader epochs,
//     timestamps, CRC), after batch.Validate, if they continue the log exactly (ErrOffsetMismatch
//     otherwise; AppendOptions.AllowGaps lets through the gaps a compacted leader has), so a follower's
//     log is byte-identical to the leader's and can serve as leader in turn.
//   - The leader-epoch cache (KIP-101). For each leader epoch the offset of its first batch, stored in
//     the batch's transaction when a batch's PartitionLeaderEpoch exceeds the latest entry, read back
//     on open without touching a batch, pruned by retention below the log start (the entry covering it
//     stays, moved up to it, as Kafka's truncateFromStart) and by Truncate above the new end.
//     EndOffsetForEpoch answers OffsetsForLeaderEpoch from it: with it a follower finds where its log
//     leaves the new leader's (KIP-101, and KIP-279's repeated exchange when it holds an epoch the
//     leader never had), where truncating to the HW (Kafka before KIP-101) could lose acknowledged
//     records or keep diverging ones.
//   - Truncation. Truncate removes every batch from an offset on (rounded down to a batch's base), with
//     its time-index entries, delete horizons, epoch entries, and its bytes in the active segment, in
//     one Badger transaction with the lowered floor and HW checkpoint (a truncation too big for one
//     writes a record first, and the next open finishes it). It runs on the writer goroutine between
//     two groups, holding the partition's maintenance lock: appends queued before it are written
//     first, appends queued after it land at the new end. It bumps a truncation generation, with which
//     readers (who read their bounds before taking a Badger snapshot) notice a truncation in between,
//     and the syncer drops the end offsets of groups written before it (the truncation's own fsync
//     covers them). Below the log start or above the LEO it empties the log and restarts it at the
//     offset (Kafka's truncateFullyAndStartAt).
//
// # Transactions
//
// Transaction markers (KIP-98) are ordinary control batches to the log; the broker decides what they
// mean. The log keeps one thing for them (aborted.go): an index of aborted transactions, Kafka's
// .txnindex. Append and AppendReplica alike index every ABORT marker whose value names the first
// offset of the transaction on the partition (batch.ControlMarker.FirstOffset, -1 when it wrote nothing
// here), in the marker's transaction, so leaders and followers hold the same index from the bytes
// alone. It is keyed by the marker's offset and cut like the batches (retention below the log start,
// Truncate at or above the new end, DeletePartition), and held in memory whole: aborted transactions
// are few. AbortedTransactions answers a read_committed fetch, ReadUpTo caps its read at the last
// stable offset. Compaction keeps control batches but still treats the records of aborted
// transactions like any others.
//
// A failed Badger write or fsync stops all appends of the store (rerr.ErrStorage) until restart, as Kafka
// takes a failed log directory offline: after a failed fsync the kernel may have dropped the dirty pages,
// so no later acknowledgement could be trusted.
//
// # Goroutines
//
// Open starts the writer, the syncer and the value-log GC loop; Close stops them (failing appends still
// queued with ErrClosed) before closing Badger. Close gives up after Options.CloseTimeout
// (ErrCloseTimeout): Badger retries a failed memtable flush without end, so without the bound a store
// whose directory was removed would never close. Its goroutines then stay behind; the process is meant
// to exit.
package plog
