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
//	s|topicNum(8)|partition(4)                               → logStartOffset(8) nextOffsetFloor(8)
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
//   - The state key is written only when retention moves the log start, so a log emptied by retention
//     keeps its offsets across restarts. Everything else (LEO, size, running max) is recovered from the
//     keys when a partition is opened: the last batch's header gives the LEO, a key-only iteration the
//     size (from Badger's value sizes, without reading the values).
//   - Retention deletes whole oldest batches (their keys; Badger's deletes are tombstones in the LSM) and
//     value-log GC later rewrites or drops value-log files that became mostly garbage. Deleting a
//     partition drops its key ranges with DropPrefix.
//
// # Group commit and durability
//
// Appends to all partitions go through one queue. One writer goroutine takes what is queued, assigns
// offsets per partition in queue order by rewriting the batch headers (base offset; leader epoch and
// log-append time are stamped by Append before queueing), and writes everything in one Badger
// transaction. It then hands the group to a syncer goroutine that fsyncs once (db.Sync, plus any
// value-log or WAL file Badger rotated since the last fsync) for everything written so far, while the
// writer already writes the next group. With Options.Fsync the HW moves only after the fsync that covers
// the data, so a consumer never sees a record that a crash could take back; acks=1 appends return once
// written and acks=all ones after the fsync. Without Fsync the HW moves and all appends return once
// written (a kill -9 loses nothing then either: Badger's files are memory-mapped, the page cache keeps the
// data; a machine crash can lose the tail).
//
// A failed Badger write or fsync stops all appends of the store (rerr.ErrStorage) until restart, as Kafka
// takes a failed log directory offline: after a failed fsync the kernel may have dropped the dirty pages,
// so no later acknowledgement could be trusted.
//
// # Goroutines
//
// Open starts the writer, the syncer and the value-log GC loop; Close stops them (failing appends still
// queued with ErrClosed) before closing Badger.
package plog
