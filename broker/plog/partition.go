package plog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
)

// Partition is the log of one partition: record batches at consecutive offsets from LogStartOffset to
// LogEndOffset, readable up to HighWatermark. Get one from Store.Partition. All methods are safe for
// concurrent use.
type Partition struct {
	s                                           *Store
	id                                          PartitionID
	lprefix, tprefix, sprefix, gprefix, hprefix []byte
	eprefix, wprefix, xprefix, aprefix          []byte

	// retMu is the partition's maintenance lock: it serialises ApplyRetention, Compact and Truncate
	// runs, which compute their changes from one snapshot and are the only writers of the state key.
	retMu sync.Mutex

	// gen counts truncations. Truncate (on the writer goroutine) bumps it under mu after its Badger
	// commit and before the writer writes anything more to the partition. Readers compare it before and
	// after taking their Badger snapshot, and the syncer ignores HW advances of groups written before
	// the truncation (the truncation's own fsync advances the durable end past them).
	gen atomic.Int64

	mu       sync.Mutex
	gone     error // ErrPartitionDeleted or ErrClosed once retired
	next     int64 // next offset the writer assigns (>= leo: includes batches being written)
	maxTs    int64 // running max of batch max timestamps (time index), -1 when none
	leo      int64 // end of what is written to Badger
	durable  int64 // end of what is written, and fsynced when Options.Fsync (DurableEnd)
	hw       int64 // end of what Read returns: durable unless replicated, else what SetHighWatermark set
	logStart int64
	size     int64 // bytes of batches in [logStart, leo)
	changed  chan struct{}

	// Replication (replica.go). replicated: the HW is SetHighWatermark's, checkpointed in the HW key.
	// epochs is the leader-epoch cache of what is written (sorted; in Badger under eprefix); wEpoch is
	// the writer's latest epoch, including batches being written. hwQueued: a checkpoint of the HW
	// is queued for the writer.
	replicated bool
	epochs     []EpochEntry
	wEpoch     int32
	hwQueued   bool
	fence      int32 // the least leader epoch a leader append may still be written under (FenceLeaderAppends)
	leading    int32 // the latest epoch this replica was granted the leadership at (BeginLeadership), -1: none

	// aborted is the aborted-transaction index of what is written (aborted.go), sorted by marker
	// offset; in Badger under aprefix.
	aborted []AbortedTxn

	// Persisted in the state key (changed under retMu, read under mu).
	floor      int64 // stored LEO floor
	checkpoint int64 // cleaner checkpoint: [logStart, checkpoint) holds each key at most once

	// The active segment [segBase, next): the tail the cleaner never touches. The writer rolls it
	// (segmentLocked); segBase and segTime are persisted in the segment key when a segment gets its
	// first batch.
	segBase  int64
	segTime  int64 // ms when the segment's first batch was written
	segBytes int64 // bytes of batches in the segment; 0: empty, the next batch starts a new one
}

// ID returns the partition's id.
func (p *Partition) ID() PartitionID { return p.id }

// LogStartOffset returns the first offset still stored (moved by ApplyRetention).
func (p *Partition) LogStartOffset() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logStart
}

// LogEndOffset returns the offset after the last batch written to Badger (not necessarily fsynced).
func (p *Partition) LogEndOffset() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.leo
}

// HighWatermark returns the offset up to which Read returns data. Unless the partition is in replicated
// mode (SetReplicated), it is DurableEnd: the LEO once the data is written, and fsynced when
// Options.Fsync, so no reader sees a record a crash could take back. In replicated mode it is what the
// replication layer last set with SetHighWatermark (min LEO over the ISR), clamped to DurableEnd.
func (p *Partition) HighWatermark() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hw
}

// Size returns the bytes of stored batches, from LogStartOffset to LogEndOffset.
func (p *Partition) Size() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.size
}

// Changed returns a channel that is closed when the HW or DurableEnd advances, the log start offset
// moves, Truncate runs, or the partition is deleted or its store closed; call it again for the next
// change. Take the channel before
// checking the state you wait on, so a change in between is not missed.
func (p *Partition) Changed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// notifyLocked broadcasts a change: closes the current channel and installs a fresh one. p.mu is held.
func (p *Partition) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// retire closes the partition for good with why (ErrPartitionDeleted or ErrClosed): Changed stays closed.
func (p *Partition) retire(why error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone == nil {
		p.gone = why
		close(p.changed)
	}
}

// goneErr returns why the partition is retired, or nil.
func (p *Partition) goneErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gone
}

// check returns an error wrapping ErrPartitionDeleted or ErrClosed when the partition is retired.
func (p *Partition) check(what string) error {
	switch err := p.goneErr(); {
	case err == nil:
		return nil
	case errors.Is(err, ErrClosed):
		return errClosed(what + " " + p.id.String())
	default:
		return fmt.Errorf("%s %s: %w", what, p.id, err)
	}
}

// written records that batches up to end (exclusive) totalling n bytes, the leader-epoch cache
// entries epochs they started and the aborted transactions their markers end, are in Badger. The
// writer calls it in queue order.
func (p *Partition) written(end, n int64, epochs []EpochEntry, aborted []AbortedTxn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if end > p.leo {
		p.leo = end
	}
	p.size += n
	p.epochs = append(p.epochs, epochs...)
	p.aborted = append(p.aborted, aborted...)
}

// advanceHW moves the durable end forward to end (and, unless replicated, the HW with it) and wakes the
// waiters. Groups reach it in order, so it only ever moves forward through whole batches. gen is the
// partition's truncation generation when the group was written: a group written before a Truncate may
// hold batches the truncation removed (and the offsets may since hold others, not yet durable), so its
// advance is dropped; the truncation's own fsync advances the end past it.
func (p *Partition) advanceHW(end, gen int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone == nil && gen == p.gen.Load() && end > p.durable {
		p.durable = end
		if !p.replicated {
			p.hw = end
		}
		p.notifyLocked()
	}
}

// AppendOptions are the per-call settings of Append.
type AppendOptions struct {
	Sync          bool  // acks=all: wait for the fsync (when Options.Fsync) before returning
	LogAppendTime int64 // ms; >= 0 stamps each batch with batch.SetLogAppendTime, < 0 keeps producer time
	LeaderEpoch   int32 // written into each batch with batch.SetPartitionLeaderEpoch
	// SegmentBytes and SegmentMs are the topic's segment.bytes and segment.ms (capped by
	// max.compaction.lag.ms for compacted topics): the active segment rolls before a batch that would
	// take it past SegmentBytes, or when its first batch was written more than SegmentMs ago. They are
	// per append, not per partition, so a config change applies from the next append on. <= 0 takes
	// DefaultSegmentBytes / DefaultSegmentMs (Kafka's defaults).
	SegmentBytes int64
	SegmentMs    int64
	// AllowGaps (AppendReplica only; Append ignores it) accepts a batch that starts after the offset
	// where the log or the previous batch ends, as Kafka's follower append does: the log of a compacted
	// topic has gaps where the leader's cleaner removed whole batches, and a follower copies it with
	// its gaps. Off, AppendReplica wants contiguous offsets (ErrOffsetMismatch otherwise), which
	// catches a follower fetching from the wrong offset. Overlaps are refused either way.
	AllowGaps bool
}

// Kafka's defaults of segment.bytes and segment.ms, used when AppendOptions leave them at zero.
const (
	DefaultSegmentBytes = 1 << 30
	DefaultSegmentMs    = 7 * 24 * 60 * 60 * 1000
)

// segmentLocked accounts a batch of n bytes that the writer is about to store at p.next to the active
// segment, rolling the segment first when the batch would take it past segBytes or its first batch was
// written more than segMs before nowMs, as Kafka rolls a log segment on append. When the batch starts a
// segment it returns the segment key's entry, which the writer stores in the batch's transaction, ahead
// of the batch: after a crash the stored segment start is never past a stored batch. p.mu is held.
func (p *Partition) segmentLocked(n, nowMs, segBytes, segMs int64) *badger.Entry {
	if segBytes <= 0 {
		segBytes = DefaultSegmentBytes
	}
	if segMs <= 0 {
		segMs = DefaultSegmentMs
	}
	if p.segBytes > 0 && (p.segBytes > segBytes-n || nowMs-p.segTime > segMs) {
		p.segBytes = 0
	}
	var e *badger.Entry
	if p.segBytes == 0 {
		p.segBase, p.segTime = p.next, nowMs
		e = badger.NewEntry(p.gprefix, encodeSeg(p.next, nowMs))
	}
	p.segBytes += n
	return e
}

// ActiveSegmentStart returns the offset where the active segment starts: the cleaner considers only
// batches below it.
func (p *Partition) ActiveSegmentStart() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.segBytes == 0 {
		return p.next
	}
	return p.segBase
}

// AppendResult says where an Append went.
type AppendResult struct {
	BaseOffset     int64 // offset of the first record of the first batch
	LastOffset     int64 // offset of the last record of the last batch
	LogStartOffset int64 // the partition's log start offset when the append completed
}

// Append stores one or more concatenated batches at consecutive offsets, in order. The caller has
// validated them (batch.Validate, size caps); the slice is owned by plog from here on and is rewritten in
// place (base offset, leader epoch, log-append time). It returns when the batches are written, and
// fsynced if opts.Sync && Options.Fsync. Concurrent appends to all partitions of the store are
// group-committed into one Badger transaction and one fsync.
//
// ctx ends only the wait: a queued append is written anyway, and its offsets are then taken.
// Errors (wrapped): ctx.Err(); rerr.ErrCorruptMessage when a header does not parse or nothing is given;
// rerr.ErrMessageTooLarge for a batch longer than Options.ValueLogFileSize; ErrPartitionDeleted;
// ErrClosed; rerr.ErrStorage after a write or fsync failure of the store (sticky until restart).
func (p *Partition) Append(ctx context.Context, batches []byte, opts AppendOptions) (AppendResult, error) {
	r, err := p.prepare(batches, opts)
	if err != nil {
		return AppendResult{}, err
	}
	if err := p.s.room.Acquire(ctx, r.held); err != nil {
		return AppendResult{}, fmt.Errorf("append to %s: waiting for room in the write queue: %w", p.id, err)
	}
	if err := p.s.enqueue(r); err != nil {
		p.s.room.Release(r.held)
		return AppendResult{}, err
	}
	select {
	case <-r.done:
		return r.result()
	case <-ctx.Done():
		return AppendResult{}, fmt.Errorf("append to %s: %w", p.id, ctx.Err())
	}
}

// AppendAsync is Append without the wait, for callers that answer many partitions in one response: it
// queues the batches before it returns, so appends started one after another are stored in that order,
// and later calls done exactly once with what Append would have returned (also for errors found before
// queueing). done runs on a goroutine that runs nothing else meanwhile (Store.callbacks), so it may
// block or take the caller's locks. When the write queue is full (64 MiB queued), AppendAsync waits
// for room: that is the producers' back-pressure.
func (p *Partition) AppendAsync(batches []byte, opts AppendOptions, done func(AppendResult, error)) {
	r, err := p.prepare(batches, opts)
	if err != nil {
		p.s.callbacks.run(func() { done(AppendResult{}, err) })
		return
	}
	r.callback = done
	_ = p.s.room.Acquire(context.Background(), r.held) // fails only with a cancelled ctx
	if err := p.s.enqueue(r); err != nil {
		p.s.room.Release(r.held)
		p.s.callbacks.run(func() { done(AppendResult{}, err) })
	}
}

// prepare parses the batches and stamps leader epoch and log-append time, on the caller's goroutine so
// the writer goroutine only has to assign offsets.
func (p *Partition) prepare(batches []byte, opts AppendOptions) (*appendReq, error) {
	if err := p.check("append to"); err != nil {
		return nil, err
	}
	r := p.newReq(reqAppend, opts)
	for rest := batches; len(rest) > 0; {
		h, err := batch.ParseHeader(rest)
		if err != nil {
			return nil, fmt.Errorf("append to %s: batch %d: %w", p.id, len(r.batches), err)
		}
		b := rest[:h.Size()]
		rest = rest[h.Size():]
		if int64(len(b)) > p.s.opts.ValueLogFileSize {
			return nil, fmt.Errorf("append to %s: %w", p.id, rerr.New(runnelv1.ErrorCode_MESSAGE_TOO_LARGE,
				"batch of %d bytes exceeds the store's value-log file size %d", len(b), p.s.opts.ValueLogFileSize))
		}
		batch.SetPartitionLeaderEpoch(b, opts.LeaderEpoch)
		maxTs := h.MaxTimestamp
		if opts.LogAppendTime >= 0 {
			batch.SetLogAppendTime(b, opts.LogAppendTime)
			maxTs = opts.LogAppendTime
		}
		pid, first := abortOf(b, h)
		r.batches = append(r.batches, stagedBatch{data: b, lastDelta: h.LastOffsetDelta, maxTs: maxTs, epoch: opts.LeaderEpoch,
			abortPID: pid, abortFirst: first})
		r.bytes += int64(len(b))
	}
	if len(r.batches) == 0 {
		return nil, fmt.Errorf("append to %s: %w", p.id, rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "no record batch"))
	}
	r.held = min(r.bytes, maxQueuedBytes)
	return r, nil
}

// newReq is a request of kind for the writer, with the settings of opts.
func (p *Partition) newReq(kind reqKind, opts AppendOptions) *appendReq {
	return &appendReq{p: p, kind: kind, sync: opts.Sync, segBytes: opts.SegmentBytes, segMs: opts.SegmentMs,
		allowGaps: opts.AllowGaps, done: make(chan struct{})}
}

// outOfRange builds the OFFSET_OUT_OF_RANGE error for offset; bound names the upper bound.
func (p *Partition) outOfRange(offset, start, end int64, bound string) error {
	return fmt.Errorf("read %s: %w", p.id, rerr.New(runnelv1.ErrorCode_OFFSET_OUT_OF_RANGE,
		"offset %d outside [log start %d, %s %d]", offset, start, bound, end))
}

// Read appends to dst whole stored batches, from the batch that holds offset (which may begin before
// it: consumers skip the records below their position), while the bytes appended stay within maxBytes;
// the first batch is appended even if larger (KIP-74), so a consumer always makes progress. It never
// returns a batch at or above the HW. offset == HW returns dst unchanged (a long-poll then waits on
// Changed). An offset that compaction removed (a gap: no stored batch holds it) reads from the next
// batch after it, as Kafka readers skip compacted-away offsets. Errors (wrapped):
// rerr.ErrOffsetOutOfRange when offset < LogStartOffset or > HW (also when retention deletes the batch
// during the read); ErrPartitionDeleted; ErrClosed; Badger read errors.
func (p *Partition) Read(dst []byte, offset int64, maxBytes int) ([]byte, error) {
	return p.read(dst, offset, maxBytes, false)
}

// noCap is the read cap of reads capped only by the HW or DurableEnd.
const noCap = int64(1<<63 - 1)

// bounds returns what a read needs: the truncation generation (read first), whether the partition is
// retired, the log start, and the HW or, when local, DurableEnd.
func (p *Partition) bounds(local bool) (gen int64, gone error, start, end int64) {
	gen = p.gen.Load()
	p.mu.Lock()
	defer p.mu.Unlock()
	end = p.hw
	if local {
		end = p.durable
	}
	return gen, p.gone, p.logStart, end
}

// snapshot opens the Badger snapshot for a read whose bounds were taken at truncation generation gen,
// or returns nil when a Truncate ran meanwhile and the bounds must be read again.
//
// The bounds are read before the snapshot is taken: they move only after Badger's commit returned, and
// a transaction begun after that sees the commit, so every batch below the bound is in the snapshot.
// (Retention commits before moving the log start; a batch it deleted meanwhile is missing from the
// snapshot, which the walks tell from a compaction gap by the log start stored in the same snapshot.)
// A Truncate moves the bounds down only after its commit, so a snapshot taken in between just misses
// batches below the old bounds, as if the truncation had come first; but once the writer has written
// new batches at the truncated offsets, a snapshot read with the old bounds could return batches that
// are not durable yet. The writer writes nothing more to the partition before the truncation
// generation moved, so a generation unchanged across NewTransaction rules that out.
func (p *Partition) snapshot(gen int64) *badger.Txn {
	txn := p.s.db.NewTransaction(false)
	if p.gen.Load() != gen {
		txn.Discard()
		return nil
	}
	return txn
}

// read is Read, capped at DurableEnd instead of the HW when local (ReadLocal).
//
// One attempt reads one snapshot with bounds taken just before it. The snapshot may be newer than the
// bounds: a cleaner that ran in between with a higher HW may have removed every batch of [offset, old
// bound) because newer versions of their keys lie above the old bound. The snapshot then holds nothing
// below the bound from offset on, which would leave a consumer stuck at offset. A cleaner always keeps
// the last batch below the HW it saw, so such an empty answer is retried with fresh bounds; it stands
// only when the bound did not move, where it is what the log holds.
func (p *Partition) read(dst []byte, offset int64, maxBytes int, local bool) ([]byte, error) {
	return p.readCapped(dst, offset, maxBytes, local, noCap)
}

// readCapped is read that also stops at upTo (ReadUpTo): batches reaching upTo or beyond are not
// returned, and offsets in [upTo, bound] read nothing.
func (p *Partition) readCapped(dst []byte, offset int64, maxBytes int, local bool, upTo int64) ([]byte, error) {
	s := p.s
	if err := s.acquire("read " + p.id.String()); err != nil {
		return dst, err
	}
	defer s.lifeMu.RUnlock()
	lastEnd := int64(-1)
	for {
		out, end, err := p.readOnce(dst, offset, maxBytes, local, upTo)
		if err != nil || len(out) > len(dst) || offset == end || end == lastEnd {
			return out, err
		}
		lastEnd = end
	}
}

// testHookAfterBounds, when set by a test, runs in a read between taking the bounds and the snapshot:
// the window in which a cleaner can overtake the reader.
var testHookAfterBounds func()

// readOnce is one attempt of read: it returns what it appended and the bound it read up to.
func (p *Partition) readOnce(dst []byte, offset int64, maxBytes int, local bool, upTo int64) ([]byte, int64, error) {
	orig := dst // returned on errors, so a failed read leaves dst as it was
	bound := "high watermark"
	if local {
		bound = "durable end"
	}
	var txn *badger.Txn
	var hw int64
	for txn == nil {
		gen, gone, start, end := p.bounds(local)
		if gone != nil {
			return orig, end, p.check("read")
		}
		if offset < start || offset > end {
			return orig, end, p.outOfRange(offset, start, end, bound)
		}
		end = min(end, upTo)
		if offset >= end {
			return dst, end, nil
		}
		if testHookAfterBounds != nil {
			testHookAfterBounds()
		}
		txn, hw = p.snapshot(gen), end
	}
	defer txn.Discard()

	it := txn.NewIterator(badger.IteratorOptions{Prefix: p.lprefix})
	defer it.Close()
	// Consumers mostly ask for the offset after the last batch they read, which is a batch's key.
	it.Seek(batchKey(p.lprefix, offset))
	if !it.Valid() || batchKeyOffset(it.Item().Key()) != offset {
		base, ok, err := p.floorBatch(txn, offset)
		if err != nil {
			return orig, hw, fmt.Errorf("read %s at %d: %w", p.id, offset, err)
		}
		if ok {
			it.Seek(batchKey(p.lprefix, base))
		}
		// Otherwise no batch begins at or before offset (the cleaner removed the first batches, or
		// retention deleted them after the bounds were read) and the iterator stands after offset.
	}
	added := 0
	for ; it.Valid(); it.Next() {
		item := it.Item()
		base := batchKeyOffset(item.Key())
		if base >= hw {
			break
		}
		first := added == 0
		stop, skip := false, false
		err := item.Value(func(v []byte) error {
			if len(v) < batch.HeaderSize {
				return rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "stored batch at %d is %d bytes", base, len(v))
			}
			next := base + int64(lastOffsetDelta(v)) + 1
			if first && next <= offset {
				skip = true // the batch before offset ends below it: offset lies in a gap
				return nil
			}
			if next > hw || (!first && added+len(v) > maxBytes) {
				stop = true
				return nil
			}
			dst = append(dst, v...)
			added += len(v)
			return nil
		})
		if err != nil {
			return orig, hw, fmt.Errorf("read %s at %d: %w", p.id, offset, err)
		}
		if stop {
			break
		}
		if skip {
			continue
		}
		if first && base > offset {
			// No stored batch holds offset: a compaction gap (read on) or retention deleted it after
			// the bounds were read (out of range).
			if err := p.checkGap(txn, offset, hw, bound); err != nil {
				return orig, hw, err
			}
		}
	}
	if added == 0 {
		// Nothing below the HW from offset on: retention deleted it meanwhile, or (a log the cleaner
		// left without batches up to the HW) there is nothing to read yet.
		if err := p.checkGap(txn, offset, hw, bound); err != nil {
			return orig, hw, err
		}
	}
	return dst, hw, nil
}

// checkGap decides what an offset no stored batch holds means. Compaction never moves the log start;
// retention writes the new one in the transaction that deletes the first batches. So the log start
// stored in the reader's snapshot says whether offset was deleted by retention (OFFSET_OUT_OF_RANGE) or
// lies in a compaction gap (nil: read on from the next batch).
func (p *Partition) checkGap(txn *badger.Txn, offset, hw int64, bound string) error {
	stored, err := p.storedLogStart(txn)
	if err != nil {
		return fmt.Errorf("read %s at %d: %w", p.id, offset, err)
	}
	if offset < stored {
		return p.outOfRange(offset, stored, hw, bound)
	}
	return nil
}

// storedLogStart returns the log start offset stored in txn's snapshot (0 when none is stored yet).
func (p *Partition) storedLogStart(txn *badger.Txn) (int64, error) {
	item, err := txn.Get(p.sprefix)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read state: %w", err)
	}
	var st partState
	err = item.Value(func(v []byte) error {
		st, err = decodeState(v)
		return err
	})
	return st.logStart, err
}

// floorBatch finds the base offset of the batch with the greatest base offset <= offset.
func (p *Partition) floorBatch(txn *badger.Txn, offset int64) (int64, bool, error) {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: p.lprefix, Reverse: true})
	defer it.Close()
	it.Seek(batchKey(p.lprefix, offset))
	if !it.Valid() {
		return 0, false, nil
	}
	return batchKeyOffset(it.Item().Key()), true, nil
}

// lastOffsetDelta reads the field from a batch header (at least HeaderSize bytes).
func lastOffsetDelta(b []byte) int32 { return int32(binary.BigEndian.Uint32(b[23:])) }

// OffsetForTimestamp returns the first offset below the HW whose record timestamp is >= ts (ms), and
// that record's timestamp, or (-1, -1) when there is none. It seeks the time index to the first batch
// whose running max timestamp reaches ts (earlier batches hold no such record), then decodes that batch's
// records (decompressing them if needed) to find the exact record. Batches with LogAppendTime count all
// their records at the batch's timestamp, as Kafka does. The special Kafka values -1 (latest) and -2
// (earliest) are the caller's business. Errors (wrapped): rerr.ErrCorruptMessage for records that do
// not decode; ErrPartitionDeleted; ErrClosed; Badger read errors.
func (p *Partition) OffsetForTimestamp(ts int64) (offset, timestamp int64, err error) {
	s := p.s
	if err := s.acquire("offset for timestamp in " + p.id.String()); err != nil {
		return -1, -1, err
	}
	defer s.lifeMu.RUnlock()
	var txn *badger.Txn
	var start, hw int64
	for txn == nil { // as in Read
		gen, gone, st, end := p.bounds(false)
		if gone != nil {
			return -1, -1, p.check("offset for timestamp in")
		}
		txn, start, hw = p.snapshot(gen), st, end
	}
	defer txn.Discard()

	tit := txn.NewIterator(badger.IteratorOptions{Prefix: p.tprefix, PrefetchValues: false})
	tit.Seek(timeKey(p.tprefix, ts, 0))
	if !tit.Valid() {
		tit.Close()
		return -1, -1, nil
	}
	_, from := timeKeyParts(tit.Item().Key())
	tit.Close()
	from = max(from, start)

	// Normally the indexed batch holds the record. After retention deleted the batch that raised the
	// running max, the index points at the new first batch, and the record may come some batches later.
	it := txn.NewIterator(badger.IteratorOptions{Prefix: p.lprefix})
	defer it.Close()
	for it.Seek(batchKey(p.lprefix, from)); it.Valid(); it.Next() {
		item := it.Item()
		if batchKeyOffset(item.Key()) >= hw {
			break
		}
		var found bool
		err := item.Value(func(v []byte) error {
			h, err := batch.ParseHeader(v)
			if err != nil {
				return err
			}
			if h.MaxTimestamp < ts {
				return nil
			}
			offset, timestamp, found, err = findTimestamp(v[:h.Size()], h, ts)
			return err
		})
		if err != nil {
			return -1, -1, fmt.Errorf("offset for timestamp %d in %s: %w", ts, p.id, err)
		}
		if found {
			return offset, timestamp, nil
		}
	}
	return -1, -1, nil
}

// ApplyRetention deletes whole oldest batches below the HW: those older than now-retentionMs
// (retentionMs < 0: no time limit) and then, while Size exceeds retentionBytes (< 0: no size limit), the
// oldest ones. A batch's age is the running max of batch max timestamps up to it, as Kafka ages segments
// by their largest timestamp, so the expired batches are a prefix of the log and a batch with an old
// timestamp behind a newer one waits for it. The new log start offset is persisted with the deletion, so
// it survives restart even when the log is emptied. Deleted data is reclaimed by value-log GC later. It
// returns the number of batches deleted. Errors (wrapped): ErrPartitionDeleted; ErrClosed; Badger errors.
func (p *Partition) ApplyRetention(now time.Time, retentionMs, retentionBytes int64) (int, error) {
	s := p.s
	if err := s.acquire("retention of " + p.id.String()); err != nil {
		return 0, err
	}
	defer s.lifeMu.RUnlock()
	p.retMu.Lock()
	defer p.retMu.Unlock()
	p.mu.Lock()
	gone, start, hw, size := p.gone, p.logStart, p.hw, p.size
	p.mu.Unlock()
	if gone != nil {
		return 0, p.check("retention of")
	}
	if hw <= start || (retentionMs < 0 && (retentionBytes < 0 || size <= retentionBytes)) {
		return 0, nil
	}

	txn := s.db.NewTransaction(false)
	defer txn.Discard()
	// Batches before timeBound are expired by time.
	timeBound := start
	if retentionMs >= 0 {
		timeBound = hw
		tit := txn.NewIterator(badger.IteratorOptions{Prefix: p.tprefix, PrefetchValues: false})
		tit.Seek(timeKey(p.tprefix, now.UnixMilli()-retentionMs, 0))
		if tit.Valid() {
			_, timeBound = timeKeyParts(tit.Item().Key())
		}
		tit.Close()
	}

	var deletes [][]byte
	var deleted []deletedBatch // to take them off the active segment's size if it reached below newStart
	var freed int64
	remaining := size
	newStart := hw
	it := txn.NewIterator(badger.IteratorOptions{Prefix: p.lprefix, PrefetchValues: false})
	for it.Seek(batchKey(p.lprefix, start)); it.Valid(); it.Next() {
		item := it.Item()
		base := batchKeyOffset(item.Key())
		if base >= hw {
			break
		}
		n := storedValueSize(item.ValueSize())
		if base < timeBound || (retentionBytes >= 0 && remaining > retentionBytes) {
			deletes = append(deletes, item.KeyCopy(nil))
			deleted = append(deleted, deletedBatch{base, n})
			remaining -= n
			freed += n
			continue
		}
		newStart = base
		break
	}
	it.Close()
	if len(deletes) == 0 {
		return 0, nil
	}

	// The time-index entries of deleted batches go too. If the entry that covers newStart (the last one
	// deleted) goes, an entry with its timestamp is put at newStart, so the index still rises with the
	// offsets, a seek by timestamp still finds the first remaining candidate batch, and recovery still
	// finds the running max timestamp (also when the log is now empty).
	var tdeletes [][]byte
	var repoint []byte
	tit := txn.NewIterator(badger.IteratorOptions{Prefix: p.tprefix, PrefetchValues: false})
	var lastTs int64
	coveredAtStart := false
	for tit.Rewind(); tit.Valid(); tit.Next() {
		ts, base := timeKeyParts(tit.Item().Key())
		if base >= newStart {
			coveredAtStart = base == newStart
			break
		}
		tdeletes = append(tdeletes, tit.Item().KeyCopy(nil))
		lastTs = ts
	}
	tit.Close()
	if len(tdeletes) > 0 && !coveredAtStart {
		repoint = timeKey(p.tprefix, lastTs, newStart)
	}

	// Delete horizons of the deleted batches (compacted topics with compact,delete) go too.
	hdeletes, err := keysBelow(txn, p.hprefix, newStart)
	if err != nil {
		return 0, fmt.Errorf("retention of %s: %w", p.id, err)
	}
	// So do the aborted-transaction entries whose marker it deletes: the marker follows every record
	// of its transaction, so they are all gone, and no reader from the new log start needs the entry.
	adeletes, err := keysBelow(txn, p.aprefix, newStart)
	if err != nil {
		return 0, fmt.Errorf("retention of %s: %w", p.id, err)
	}
	hdeletes = append(hdeletes, adeletes...)

	// The state goes first: if a crash splits the transactions, the next open sees the new log start
	// and removes the batches left below it. The floor and the cleaner checkpoint only change under
	// retMu, which this holds. So does the leader-epoch cache below the log start (the writer only
	// adds entries at the end, which retention never reaches past).
	p.mu.Lock()
	st := partState{logStart: newStart, floor: max(p.floor, newStart), checkpoint: p.checkpoint}
	edeletes, ekept, _ := pruneEpochs(p.epochs, newStart)
	p.mu.Unlock()
	ops := []op{{key: p.sprefix, value: encodeState(st)}}
	if repoint != nil {
		ops = append(ops, op{key: repoint, value: []byte{}})
	}
	for _, k := range deletes {
		ops = append(ops, op{key: k, del: true})
	}
	for _, k := range tdeletes {
		ops = append(ops, op{key: k, del: true})
	}
	for _, k := range hdeletes {
		ops = append(ops, op{key: k, del: true})
	}
	// The leader-epoch entry that covers the new log start moves up to it, and older ones go, as
	// Kafka's LeaderEpochFileCache.truncateFromStart. After the batches: a crash in between leaves
	// entries below the log start, which recovery prunes the same way.
	if ekept != nil {
		ops = append(ops, op{key: epochKey(p.eprefix, ekept.Epoch), value: encodeOffset(ekept.StartOffset)})
	}
	for _, e := range edeletes {
		ops = append(ops, op{key: epochKey(p.eprefix, e.Epoch), del: true})
	}
	s.dropMu.RLock()
	if err := p.check("retention of"); err != nil {
		s.dropMu.RUnlock()
		return 0, err
	}
	err = s.apply(ops)
	s.dropMu.RUnlock()
	if err != nil {
		return 0, fmt.Errorf("retention of %s: delete %d batches below %d: %w", p.id, len(deletes), newStart, err)
	}
	p.mu.Lock()
	p.floor = st.floor
	if p.gone == nil && newStart > p.logStart {
		p.logStart = newStart
		p.size -= freed
		_, _, p.epochs = pruneEpochs(p.epochs, newStart)
		p.aborted = keepAborted(p.aborted, newStart, noCap)
		// Retention may delete into the active segment (a log older than retention.ms throughout),
		// as Kafka deletes a rolled active segment: the segment then starts at the new log start.
		if p.segBytes > 0 && p.segBase < newStart {
			for _, d := range deleted {
				if d.base >= p.segBase {
					p.segBytes -= d.size
				}
			}
			p.segBase = newStart
		}
		p.notifyLocked()
	}
	p.mu.Unlock()
	return len(deletes), nil
}

// deletedBatch is the base offset and stored size of a batch retention deletes.
type deletedBatch struct{ base, size int64 }

// keysBelow returns copies of the keys of one partition's per-batch index (prefix|baseOffset) with a
// base offset below end.
func keysBelow(txn *badger.Txn, prefix []byte, end int64) ([][]byte, error) {
	var keys [][]byte
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: false})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		k := it.Item().Key()
		if len(k) != batchKeyLen {
			return nil, fmt.Errorf("index key of %d bytes under prefix %q", len(k), prefix[:1])
		}
		if batchKeyOffset(k) >= end {
			break
		}
		keys = append(keys, it.Item().KeyCopy(nil))
	}
	return keys, nil
}

// op is one key to set or delete.
type op struct {
	key, value []byte
	del        bool
}

// apply writes ops in order in as few transactions as fit.
func (s *Store) apply(ops []op) error {
	txn := s.db.NewTransaction(true)
	defer func() { txn.Discard() }()
	do := func(o op) error {
		if o.del {
			return txn.Delete(o.key)
		}
		return txn.Set(o.key, o.value)
	}
	for _, o := range ops {
		err := do(o)
		if errors.Is(err, badger.ErrTxnTooBig) {
			if err = txn.Commit(); err != nil {
				return err
			}
			txn = s.db.NewTransaction(true)
			err = do(o)
		}
		if err != nil {
			return err
		}
	}
	return txn.Commit()
}

// recover builds the partition from what Badger holds: log start = the stored one (or the first batch
// when none is stored), LEO = max(end of the last batch, stored floor), size = sum of the batch sizes
// from the log start, running max timestamp = the last time-index entry, HW = DurableEnd = LEO, the
// cleaner checkpoint from the state, the active segment from the segment key (its start clamped into
// the log; without a key the whole log is one segment first written now). Batches, index entries and
// delete horizons below the stored log start (left by a retention a crash interrupted) are deleted.
// A Truncate a crash interrupted is finished first. With an HW checkpoint the partition comes back in
// replicated mode with that HW (clamped into [log start, LEO]); the leader-epoch cache is read from
// its keys (recoverEpochs), and so is the aborted-transaction index (recoverAborted).
func (s *Store) recover(id PartitionID) (*Partition, error) {
	p := &Partition{
		s:       s,
		id:      id,
		leading: -1,
		lprefix: partPrefix(kindBatch, id),
		tprefix: partPrefix(kindTime, id),
		sprefix: partPrefix(kindState, id),
		gprefix: partPrefix(kindSeg, id),
		hprefix: partPrefix(kindHoriz, id),
		eprefix: partPrefix(kindEpoch, id),
		wprefix: partPrefix(kindHW, id),
		xprefix: partPrefix(kindTrunc, id),
		aprefix: partPrefix(kindAbort, id),
		maxTs:   -1,
		wEpoch:  -1,
		changed: make(chan struct{}),
	}
	if err := p.redoTruncate(); err != nil {
		return nil, err
	}
	txn := s.db.NewTransaction(false)
	defer txn.Discard()

	hasState := false
	switch item, err := txn.Get(p.sprefix); {
	case errors.Is(err, badger.ErrKeyNotFound):
	case err != nil:
		return nil, fmt.Errorf("read state: %w", err)
	default:
		v, err := item.ValueCopy(nil)
		if err != nil {
			return nil, fmt.Errorf("read state: %w", err)
		}
		st, err := decodeState(v)
		if err != nil {
			return nil, err
		}
		hasState = true
		p.logStart, p.floor, p.checkpoint = st.logStart, st.floor, st.checkpoint
	}
	hasSeg := false
	switch item, err := txn.Get(p.gprefix); {
	case errors.Is(err, badger.ErrKeyNotFound):
	case err != nil:
		return nil, fmt.Errorf("read segment state: %w", err)
	default:
		v, err := item.ValueCopy(nil)
		if err != nil {
			return nil, fmt.Errorf("read segment state: %w", err)
		}
		if p.segBase, p.segTime, err = decodeSeg(v); err != nil {
			return nil, err
		}
		hasSeg = true
	}

	var stale [][]byte
	var last []byte
	firstBase := int64(-1)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: p.lprefix, PrefetchValues: false})
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		base := batchKeyOffset(item.Key())
		if base < p.logStart {
			stale = append(stale, item.KeyCopy(nil))
			continue
		}
		if firstBase < 0 {
			firstBase = base
		}
		n := storedValueSize(item.ValueSize())
		p.size += n
		if base >= p.segBase {
			p.segBytes += n
		}
		last = item.KeyCopy(last)
	}
	it.Close()

	p.leo = p.floor
	if last != nil {
		item, err := txn.Get(last)
		if err != nil {
			return nil, fmt.Errorf("read last batch: %w", err)
		}
		var h batch.Header
		err = item.Value(func(v []byte) error {
			h, err = batch.ParseHeader(v)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("last batch at %d: %w", batchKeyOffset(last), err)
		}
		p.leo = max(p.leo, batchKeyOffset(last)+int64(h.LastOffsetDelta)+1)
		if !hasState {
			// Compaction stores the state before it can remove a first batch, so the first batch is
			// the log start only for a log no retention or cleaner has touched.
			p.logStart = max(p.logStart, firstBase)
		}
	}
	p.logStart = min(p.logStart, p.leo)
	p.next, p.durable, p.hw = p.leo, p.leo, p.leo
	switch item, err := txn.Get(p.wprefix); {
	case errors.Is(err, badger.ErrKeyNotFound):
	case err != nil:
		return nil, fmt.Errorf("read high watermark checkpoint: %w", err)
	default:
		var hw int64
		err := item.Value(func(v []byte) error {
			hw, err = decodeHW(v)
			return err
		})
		if err != nil {
			return nil, err
		}
		// The checkpoint may lag the HW (it is written after it moved) and retention may have moved
		// the log start past it since; it is never trusted above what the log holds.
		p.replicated, p.hw = true, min(max(hw, p.logStart), p.leo)
	}
	switch {
	case !hasSeg:
		// A log from before segments were tracked, or an empty one: one segment, aged from now.
		p.segBase, p.segTime, p.segBytes = p.logStart, s.now().UnixMilli(), p.size
	case p.segBytes == 0:
		p.segBase = p.leo
	default:
		p.segBase = min(max(p.segBase, p.logStart), p.leo)
	}

	tit := txn.NewIterator(badger.IteratorOptions{Prefix: p.tprefix, PrefetchValues: false})
	for tit.Rewind(); tit.Valid(); tit.Next() {
		ts, base := timeKeyParts(tit.Item().Key())
		if base < p.logStart {
			stale = append(stale, tit.Item().KeyCopy(nil))
			continue
		}
		p.maxTs = ts // rises with the keys; the last one is the running max
	}
	tit.Close()
	hstale, err := keysBelow(txn, p.hprefix, p.logStart)
	if err != nil {
		return nil, err
	}
	stale = append(stale, hstale...)
	efix, err := p.recoverEpochs(txn)
	if err != nil {
		return nil, err
	}
	afix, err := p.recoverAborted(txn)
	if err != nil {
		return nil, err
	}
	efix = append(efix, afix...)
	if len(stale) > 0 || len(efix) > 0 {
		ops := make([]op, len(stale), len(stale)+len(efix))
		for i, k := range stale {
			ops[i] = op{key: k, del: true}
		}
		ops = append(ops, efix...)
		s.dropMu.RLock()
		err := s.apply(ops)
		s.dropMu.RUnlock()
		if err != nil {
			return nil, fmt.Errorf("delete %d entries below log start %d: %w", len(stale), p.logStart, err)
		}
	}
	return p, nil
}
