package plog

import (
	"context"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
)

// This file holds the storage primitives of Kafka-style replication (the ISR model; KIP-101 and
// KIP-279 for truncation by leader epoch): the replicated high watermark, appending a leader's batches
// as they are, truncating a diverging tail, and the leader-epoch cache. The replication protocol itself
// (who fetches what, the ISR, the HW as min LEO over the ISR) lives in the broker; see doc.go.

// ErrOffsetMismatch is returned (wrapped) by AppendReplica when the batches do not continue the log:
// the first does not start at the log end offset, or one does not start right after the previous one.
var ErrOffsetMismatch = errors.New("plog: replica batches do not continue the log")

// EpochEntry is one entry of the leader-epoch cache (KIP-101): the first offset written in a leader
// epoch.
type EpochEntry struct {
	Epoch       int32 // leader epoch, >= 0
	StartOffset int64 // offset of the first batch of the epoch (after retention: at most the log start)
}

// SetReplicated switches the partition to replicated mode (idempotent; there is no way back): from
// then on HighWatermark is what SetHighWatermark sets, starting from the HW the partition has now
// (DurableEnd), and Read caps at it, while appends only advance DurableEnd. The HW is checkpointed in
// its own key (as Kafka's replication-offset-checkpoint file) when SetReplicated returns, after every
// SetHighWatermark (by the writer goroutine, shortly after) and on Close, and a partition with a
// checkpoint comes back in replicated mode on reopen, with the checkpointed HW clamped into
// [LogStartOffset, LogEndOffset]. Call it before serving reads of a replicated partition. A failure to
// write the checkpoint (store closed or failed) is logged; the partition is in replicated mode anyway.
func (p *Partition) SetReplicated() {
	p.mu.Lock()
	if p.replicated || p.gone != nil {
		p.mu.Unlock()
		return
	}
	p.replicated = true
	p.mu.Unlock()
	r := p.newReq(reqCheckpoint, AppendOptions{})
	err := p.s.enqueue(r)
	if err == nil {
		<-r.done
		err = r.err
	}
	if err != nil {
		p.s.log.Warn("replicated mode: HW checkpoint not written", "partition", p.id, "err", err)
	}
}

// Replicated reports whether the partition is in replicated mode (SetReplicated, or recovered with an
// HW checkpoint).
func (p *Partition) Replicated() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.replicated
}

// DurableEnd returns the local end of what is written and, when Options.Fsync, fsynced: the offset
// after the last batch that a crash cannot take back (unless replicated, this is also the HW). A leader
// reports it as its own LEO when the HW is computed, and ReadLocal caps at it. Changed fires when it
// advances. It is at most LogEndOffset.
func (p *Partition) DurableEnd() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.durable
}

// SetHighWatermark sets the replicated HW (an offset): what the broker's replication layer computed as
// the min LEO over the ISR, or a follower's min(leader's HW, own LEO). It moves forward only (a lower
// value is ignored, nil returned); only Truncate moves it down. A value above DurableEnd is clamped
// to it. Moving it wakes Changed and queues an HW checkpoint for the writer goroutine (written with the
// next group; a crash before loses only the newest value, and the HW then comes back lower, which is
// safe). Errors: the partition is not in replicated mode; hw < 0; ErrPartitionDeleted; ErrClosed
// (wrapped); a failed store (rerr.ErrStorage: the HW is set in memory but no checkpoint queued).
func (p *Partition) SetHighWatermark(hw int64) error {
	if hw < 0 {
		return fmt.Errorf("set high watermark of %s: negative offset %d", p.id, hw)
	}
	p.mu.Lock()
	if p.gone != nil {
		p.mu.Unlock()
		return p.check("set high watermark of")
	}
	if !p.replicated {
		p.mu.Unlock()
		return fmt.Errorf("set high watermark of %s: the partition is not in replicated mode (SetReplicated)", p.id)
	}
	hw = min(hw, p.durable)
	if hw <= p.hw {
		p.mu.Unlock()
		return nil
	}
	p.hw = hw
	p.notifyLocked()
	queue := !p.hwQueued
	p.hwQueued = true
	p.mu.Unlock()
	if !queue {
		return nil // the queued checkpoint writes the HW as it is when the writer gets to it
	}
	if err := p.s.enqueue(p.newReq(reqCheckpoint, AppendOptions{})); err != nil {
		p.mu.Lock()
		p.hwQueued = false
		p.mu.Unlock()
		return err
	}
	return nil
}

// ReadLocal is Read capped at DurableEnd instead of HighWatermark, for followers fetching from this
// leader (they must get past the replicated HW, or it could never advance). Same results and errors as
// Read, with DurableEnd as the upper bound: rerr.ErrOffsetOutOfRange (wrapped) when offset <
// LogStartOffset or > DurableEnd, and offset == DurableEnd returns dst unchanged.
func (p *Partition) ReadLocal(dst []byte, offset int64, maxBytes int) ([]byte, error) {
	return p.read(dst, offset, maxBytes, true)
}

// AppendReplica appends batches fetched from the leader (ReadLocal output: one or more concatenated
// Kafka RecordBatch v2) as they are, for a follower: their base offsets and PartitionLeaderEpoch are
// kept and no log-append time is stamped, so the follower's log is byte-identical to the leader's. The
// first batch must start at LogEndOffset (counting appends queued before this one) and each next one
// right after the previous batch's last offset, else nothing is appended and the error wraps
// ErrOffsetMismatch (opts.AllowGaps relaxes both to "at or after", for the gaps of compacted logs).
// Every batch is checked with batch.Validate (CRC-32C, record framing) before anything is queued.
//
// It shares Append's queue and writer (one ordered queue per partition, group-committed with all
// partitions' appends), and its bookkeeping: the time index, the active segment (opts.SegmentBytes,
// SegmentMs) and the leader-epoch cache (a batch whose epoch is newer than the latest entry adds
// (epoch, baseOffset)). It returns when written, and fsynced if opts.Sync && Options.Fsync, with the
// new LogEndOffset (the end of the last batch). opts.LogAppendTime and opts.LeaderEpoch are ignored.
// The slice is owned by plog from the call on (it is not modified). ctx ends only the wait, as in
// Append.
//
// Errors (wrapped): ErrOffsetMismatch; rerr.ErrCorruptMessage (bad header or CRC, or no batch);
// rerr.ErrMessageTooLarge (a batch longer than Options.ValueLogFileSize); ctx.Err();
// ErrPartitionDeleted; ErrClosed; rerr.ErrStorage after a write or fsync failure of the store.
func (p *Partition) AppendReplica(ctx context.Context, batches []byte, opts AppendOptions) (int64, error) {
	r, err := p.prepareReplica(batches, opts)
	if err != nil {
		return 0, err
	}
	if err := p.s.room.Acquire(ctx, r.held); err != nil {
		return 0, fmt.Errorf("append to %s: waiting for room in the write queue: %w", p.id, err)
	}
	if err := p.s.enqueue(r); err != nil {
		p.s.room.Release(r.held)
		return 0, err
	}
	select {
	case <-r.done:
		if r.err != nil {
			return 0, r.err
		}
		return r.last + 1, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("append to %s: %w", p.id, ctx.Err())
	}
}

// prepareReplica validates a follower's batches and checks that they continue each other.
func (p *Partition) prepareReplica(batches []byte, opts AppendOptions) (*appendReq, error) {
	if err := p.check("append to"); err != nil {
		return nil, err
	}
	r := p.newReq(reqReplica, opts)
	next := int64(-1)
	for rest := batches; len(rest) > 0; {
		h, err := batch.Validate(rest)
		if err != nil {
			return nil, fmt.Errorf("append to %s: batch %d: %w", p.id, len(r.batches), err)
		}
		b := rest[:h.Size()]
		rest = rest[h.Size():]
		if int64(len(b)) > p.s.opts.ValueLogFileSize {
			return nil, fmt.Errorf("append to %s: %w", p.id, rerr.New(runnelv1.ErrorCode_MESSAGE_TOO_LARGE,
				"batch of %d bytes exceeds the store's value-log file size %d", len(b), p.s.opts.ValueLogFileSize))
		}
		if h.BaseOffset < 0 || (next >= 0 && (h.BaseOffset < next || (!opts.AllowGaps && h.BaseOffset != next))) {
			return nil, fmt.Errorf("append to %s: %w: batch %d starts at offset %d, the previous one ends at %d",
				p.id, ErrOffsetMismatch, len(r.batches), h.BaseOffset, next)
		}
		next = h.NextOffset()
		pid, first := abortOf(b, h)
		r.batches = append(r.batches, stagedBatch{data: b, lastDelta: h.LastOffsetDelta, maxTs: h.MaxTimestamp,
			epoch: h.PartitionLeaderEpoch, base: h.BaseOffset, abortPID: pid, abortFirst: first})
		r.bytes += int64(len(b))
	}
	if len(r.batches) == 0 {
		return nil, fmt.Errorf("append to %s: %w", p.id, rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "no record batch"))
	}
	r.held = min(r.bytes, maxQueuedBytes)
	return r, nil
}

// Truncate removes the tail of the log from offset on, for a follower whose log diverges from a new
// leader's (the truncation offset comes from the leader-epoch exchange, KIP-101/KIP-279) and for an
// unclean leader election. It returns the new LogEndOffset:
//
//   - offset at a batch's base, or in a compaction gap: every batch with base >= offset goes, and the
//     LEO becomes offset;
//   - offset inside a batch: from that batch's base (batches are never split), and the LEO becomes it;
//   - offset == LogEndOffset: nothing changes;
//   - offset < LogStartOffset or > LogEndOffset: the whole log goes, and LogStartOffset = LEO = HW =
//     offset, as Kafka's truncateFullyAndStartAt (for a follower whose log lies wholly below the
//     leader's log start, or whose own log start lies above the end the epoch exchange agreed on);
//     the leader-epoch cache is emptied. (Kafka's truncateTo ignores an offset above the LEO; here
//     that is the way to restart a log at an offset, so compute truncation offsets from the epoch
//     exchange as min(answer, LogEndOffset).)
//
// The time-index entries, delete horizons, leader-epoch cache entries and aborted-transaction entries
// (by marker offset) of the removed batches go with them (the cache keeps entries with start offset < the new LEO), the active segment loses their
// bytes, and LEO and DurableEnd become the new end (when Options.Fsync, after an fsync that also covers
// everything written before), and the HW is clamped to it (in replicated mode the clamped checkpoint is
// written in the truncation's transaction, so a crash never brings back an HW over a removed batch).
// Changed fires. The changes are committed in one Badger transaction; a truncation too big for one
// records itself first and the next open finishes it after a crash.
//
// Concurrency: Truncate holds the partition's maintenance lock (ApplyRetention and Compact wait, and
// it waits for a run of theirs) and goes through the writer's queue like the appends: appends queued
// before it are written before it runs (and removed if they lie at or above the new end), appends
// queued after it are written after it, at the new end; AppendReplica batches must then continue the
// new end. It returns once it ran. Reads in flight see the log before or after the truncation, never a
// mixture. Errors (wrapped): offset < 0; ErrPartitionDeleted; ErrClosed; rerr.ErrStorage when the
// store failed (a failed truncation write fails the store, as a failed append does).
func (p *Partition) Truncate(offset int64) (int64, error) {
	return p.truncate(offset, -1)
}

// TruncateAsFollower is Truncate for a follower of the leader at epoch, the truncation of the
// leader-epoch exchange (KIP-101). The writer runs it only while no leadership above epoch has been
// granted here (BeginLeadership), else it fails NOT_LEADER_OR_FOLLOWER and changes nothing: a cut
// decided while following must not remove what this replica appended as the leader it became
// meanwhile. When nothing is stored or being written at or above offset it returns at once, without
// the writer (and without the fsync a truncation costs).
func (p *Partition) TruncateAsFollower(offset int64, epoch int32) (int64, error) {
	p.mu.Lock()
	noop := offset == p.next && p.gone == nil
	p.mu.Unlock()
	if noop {
		return offset, nil
	}
	return p.truncate(offset, epoch)
}

// BeginLeadership records that this replica leads from epoch on: TruncateAsFollower requests for
// lower epochs are refused from now on, and leader appends under epoch pass FenceLeaderAppends.
func (p *Partition) BeginLeadership(epoch int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.leading = max(p.leading, epoch)
}

func (p *Partition) truncate(offset int64, followEpoch int32) (int64, error) {
	if offset < 0 {
		return 0, fmt.Errorf("truncate %s: negative offset %d", p.id, offset)
	}
	if err := p.check("truncate"); err != nil {
		return 0, err
	}
	p.retMu.Lock()
	defer p.retMu.Unlock()
	r := p.newReq(reqTruncate, AppendOptions{})
	r.truncTo, r.followEpoch = offset, followEpoch
	if err := p.s.enqueue(r); err != nil {
		return 0, err
	}
	<-r.done
	if r.err != nil {
		return 0, r.err
	}
	return r.last + 1, nil
}

// truncate runs a Truncate on the writer goroutine, with nothing else of the store being written.
func (s *Store) truncate(r *appendReq) {
	p := r.p
	if r.followEpoch >= 0 {
		p.mu.Lock()
		leading := p.leading
		p.mu.Unlock()
		if leading > r.followEpoch {
			r.finish(fmt.Errorf("truncate %s: %w", p.id, rerr.New(runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER,
				"decided while following epoch %d, but this replica leads at epoch %d now", r.followEpoch, leading)))
			return
		}
	}
	s.dropMu.RLock()
	newEnd, gen, fatal, err := p.truncateNow(r.truncTo)
	s.dropMu.RUnlock()
	if err != nil {
		if fatal {
			err = fmt.Errorf("truncate to %d: %w", r.truncTo, err)
			s.fail(err)
			err = storageErr(err)
		}
		r.finish(err)
		return
	}
	r.last = newEnd - 1
	if !s.opts.Fsync {
		r.finish(nil)
		return
	}
	// The fsync makes the truncation and everything written before it durable; the syncer then moves
	// DurableEnd to the new end (with the new generation, past the groups written before) and answers.
	r.sync = true
	s.toSyncer(&group{reqs: []*appendReq{r}, ends: []partEnd{{p, newEnd, gen}}})
}

// truncateNow computes and commits a truncation to offset and updates the partition's memory. It runs
// on the writer goroutine (so every request queued before is written: p.next is the LEO) with dropMu
// held for reading and retMu held by Truncate. fatal reports a Badger write failure.
func (p *Partition) truncateNow(offset int64) (newEnd, gen int64, fatal bool, err error) {
	s := p.s
	p.mu.Lock()
	gone, end, logStart, segBase, checkpoint, hw := p.gone, p.next, p.logStart, p.segBase, p.checkpoint, p.hw
	gen = p.gen.Load()
	p.mu.Unlock()
	if gone != nil {
		return 0, 0, false, gone
	}
	if offset == end {
		return end, gen, false, nil
	}
	txn := s.db.NewTransaction(false)
	defer txn.Discard()
	newStart, newEnd := logStart, offset
	if offset < logStart || offset > end {
		newStart = offset // the log empties and restarts at offset
	} else if base, ok, err := p.floorBatch(txn, offset); err != nil {
		return 0, 0, false, fmt.Errorf("truncate %s: %w", p.id, err)
	} else if ok && base < offset {
		item, err := txn.Get(batchKey(p.lprefix, base))
		if err != nil {
			return 0, 0, false, fmt.Errorf("truncate %s: read batch at %d: %w", p.id, base, err)
		}
		err = item.Value(func(v []byte) error {
			if len(v) < batch.HeaderSize {
				return rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "stored batch at %d is %d bytes", base, len(v))
			}
			if base+int64(lastOffsetDelta(v))+1 > offset {
				newEnd = base // offset lies inside the batch: it goes whole
			}
			return nil
		})
		if err != nil {
			return 0, 0, false, fmt.Errorf("truncate %s: %w", p.id, err)
		}
	}
	plan, err := p.planTruncate(txn, newStart, newEnd, segBase)
	if err != nil {
		return 0, 0, false, fmt.Errorf("truncate %s: %w", p.id, err)
	}
	// The state first: floor = newEnd so recovery never takes the old LEO back, and the cleaner
	// checkpoint and (replicated) HW checkpoint within the new log.
	st := partState{logStart: newStart, floor: newEnd, checkpoint: min(max(checkpoint, newStart), newEnd)}
	head := []op{{key: p.sprefix, value: encodeState(st)}}
	p.mu.Lock()
	replicated := p.replicated
	p.mu.Unlock()
	if replicated {
		head = append(head, op{key: p.wprefix, value: encodeOffset(min(max(hw, newStart), newEnd))})
	}
	if err := s.applyTruncation(p, head, plan.deletes, newStart, newEnd); err != nil {
		return 0, 0, true, err
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	p.next, p.leo = newEnd, newEnd
	if s.opts.Fsync && newStart < newEnd {
		p.durable = min(p.durable, newEnd) // the truncation's fsync moves it to newEnd
	} else {
		p.durable = newEnd // no batch left to wait for (an emptied log may start above the old end)
	}
	if p.replicated {
		p.hw = min(max(p.hw, newStart), p.durable)
	} else {
		p.hw = p.durable
	}
	p.logStart, p.floor, p.checkpoint = newStart, st.floor, st.checkpoint
	p.size -= plan.freed
	p.segBytes -= plan.segFreed
	if p.segBytes <= 0 {
		p.segBytes = 0 // the next batch starts a segment (and stores its key)
	}
	p.maxTs = plan.maxTs
	p.epochs = plan.epochs
	p.aborted = keepAborted(p.aborted, newStart, newEnd)
	p.wEpoch = -1
	if n := len(p.epochs); n > 0 {
		p.wEpoch = p.epochs[n-1].Epoch
	}
	gen = p.gen.Add(1) // before the writer writes anything more to the partition (see snapshot)
	if p.gone == nil {
		p.notifyLocked()
	}
	return newEnd, gen, false, nil
}

// truncPlan is what a truncation to [newStart, newEnd) deletes and what stays.
type truncPlan struct {
	deletes         []op
	freed, segFreed int64        // bytes of the deleted batches; of those at or after the segment base
	maxTs           int64        // running max timestamp of what stays (the last time-index entry), -1 when none
	epochs          []EpochEntry // the leader-epoch entries that stay
}

// planTruncate finds every key of the partition's batches, time index, delete horizons and leader-epoch
// cache outside [newStart, newEnd) (by base offset, or start offset for the cache). Below newStart
// there is anything only when the truncation empties the log (newStart = newEnd) or a crashed
// retention left stale keys.
func (p *Partition) planTruncate(txn *badger.Txn, newStart, newEnd, segBase int64) (truncPlan, error) {
	plan := truncPlan{maxTs: -1}
	del := func(k []byte) { plan.deletes = append(plan.deletes, op{key: k, del: true}) }

	// Batches, delete horizons and aborted transactions: keyed by base (or marker) offset, so two
	// ranges.
	for _, prefix := range [][]byte{p.lprefix, p.hprefix, p.aprefix} {
		isBatch := prefix[0] == kindBatch
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: false})
		visit := func(k []byte, item *badger.Item) error {
			if len(k) != batchKeyLen {
				return fmt.Errorf("key of %d bytes under prefix %q", len(k), prefix[:1])
			}
			del(item.KeyCopy(nil))
			if isBatch {
				n := storedValueSize(item.ValueSize())
				plan.freed += n
				if batchKeyOffset(k) >= segBase {
					plan.segFreed += n
				}
			}
			return nil
		}
		var err error
		for it.Rewind(); it.Valid() && err == nil; it.Next() {
			if k := it.Item().Key(); len(k) == batchKeyLen && batchKeyOffset(k) >= newStart {
				break
			}
			err = visit(it.Item().Key(), it.Item())
		}
		for it.Seek(batchKey(prefix, max(newEnd, newStart))); it.Valid() && err == nil; it.Next() {
			err = visit(it.Item().Key(), it.Item())
		}
		it.Close()
		if err != nil {
			return plan, err
		}
	}

	// Time index: keyed by (running max timestamp, base offset), both rising, so the entries at or
	// after newEnd are a suffix (walked backwards from the end) and those below newStart a prefix.
	it := txn.NewIterator(badger.IteratorOptions{Prefix: p.tprefix, PrefetchValues: false, Reverse: true})
	end := append(append([]byte{}, p.tprefix...), bytes16xFF...)
	for it.Seek(end); it.Valid(); it.Next() {
		ts, base := timeKeyParts(it.Item().Key())
		if base < newEnd && base >= newStart {
			plan.maxTs = ts
			break
		}
		if base < newStart {
			break
		}
		del(it.Item().KeyCopy(nil))
	}
	it.Close()
	it = txn.NewIterator(badger.IteratorOptions{Prefix: p.tprefix, PrefetchValues: false})
	for it.Rewind(); it.Valid(); it.Next() {
		if _, base := timeKeyParts(it.Item().Key()); base >= newStart {
			break
		}
		del(it.Item().KeyCopy(nil))
	}
	it.Close()

	// Leader-epoch cache: a few entries.
	entries, err := p.readEpochs(txn)
	if err != nil {
		return plan, err
	}
	for _, e := range entries {
		if e.StartOffset >= newEnd || e.StartOffset < newStart {
			del(epochKey(p.eprefix, e.Epoch))
			continue
		}
		plan.epochs = append(plan.epochs, e)
	}
	return plan, nil
}

// bytes16xFF sorts after any key suffix of the time index.
var bytes16xFF = []byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}

// applyTruncation commits head (state, HW checkpoint) and deletes in one transaction. When they do not
// fit in one, it commits a truncation record with head first, then the deletes in as many transactions
// as needed, then removes the record: recovery finishes a truncation whose record it finds
// (redoTruncate), so a crash never leaves half a truncation behind.
func (s *Store) applyTruncation(p *Partition, head, deletes []op, newStart, newEnd int64) error {
	ops := append(head[:len(head):len(head)], deletes...)
	err := s.applyAtomic(ops)
	if !errors.Is(err, badger.ErrTxnTooBig) {
		return err
	}
	rec := append([]op{{key: p.xprefix, value: encodeTrunc(newStart, newEnd)}}, head...)
	if err := s.applyAtomic(rec); err != nil {
		return err
	}
	if testHookTruncRecord != nil {
		testHookTruncRecord()
	}
	if err := s.apply(deletes); err != nil {
		return err
	}
	return s.apply([]op{{key: p.xprefix, del: true}})
}

// testHookTruncRecord, when set by a test, runs when a truncation takes the record path.
var testHookTruncRecord func()

// applyAtomic writes ops in one transaction, or returns badger.ErrTxnTooBig and writes nothing.
func (s *Store) applyAtomic(ops []op) error {
	txn := s.db.NewTransaction(true)
	defer txn.Discard()
	for _, o := range ops {
		var err error
		if o.del {
			err = txn.Delete(o.key)
		} else {
			err = txn.Set(o.key, o.value)
		}
		if err != nil {
			return err
		}
	}
	return txn.Commit()
}

// redoTruncate finishes a truncation that a crash interrupted (its record is still stored): the state
// and HW checkpoint were written with the record, the deletes follow. Recovery calls it first.
func (p *Partition) redoTruncate() error {
	s := p.s
	txn := s.db.NewTransaction(false)
	defer txn.Discard()
	item, err := txn.Get(p.xprefix)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read truncation record: %w", err)
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return fmt.Errorf("read truncation record: %w", err)
	}
	newStart, newEnd, err := decodeTrunc(v)
	if err != nil {
		return err
	}
	plan, err := p.planTruncate(txn, newStart, newEnd, newEnd)
	if err != nil {
		return fmt.Errorf("finish truncation to [%d, %d): %w", newStart, newEnd, err)
	}
	s.dropMu.RLock()
	defer s.dropMu.RUnlock()
	if err := s.apply(append(plan.deletes, op{key: p.xprefix, del: true})); err != nil {
		return fmt.Errorf("finish truncation to [%d, %d): %w", newStart, newEnd, err)
	}
	s.log.Warn("finished a truncation interrupted by a crash", "partition", p.id, "log_start", newStart, "log_end", newEnd)
	return nil
}

// readEpochs returns the stored leader-epoch cache, checked: epochs rise with the keys, start offsets
// never fall.
func (p *Partition) readEpochs(txn *badger.Txn) ([]EpochEntry, error) {
	var out []EpochEntry
	it := txn.NewIterator(badger.IteratorOptions{Prefix: p.eprefix})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		var e EpochEntry
		err := item.Value(func(v []byte) error {
			var err error
			e, err = decodeEpochEntry(item.Key(), v)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("leader-epoch cache: %w", err)
		}
		if n := len(out); n > 0 && e.StartOffset < out[n-1].StartOffset {
			return nil, fmt.Errorf("leader-epoch cache: epoch %d starts at %d, before epoch %d at %d",
				e.Epoch, e.StartOffset, out[n-1].Epoch, out[n-1].StartOffset)
		}
		out = append(out, e)
	}
	return out, nil
}

// recoverEpochs loads the leader-epoch cache into p (whose log start and LEO are recovered) and
// returns the fixes to store: entries below the log start are pruned as retention prunes them (a crash
// may have split retention's transactions), and entries at or past the LEO go (a crash between the
// transactions of one large write group can store an epoch's entry without its first batch), except
// a single entry at the LEO, which is what retention leaves of a log it emptied.
func (p *Partition) recoverEpochs(txn *badger.Txn) ([]op, error) {
	entries, err := p.readEpochs(txn)
	if err != nil {
		return nil, err
	}
	var fix []op
	deletes, kept, entries := pruneEpochs(entries, p.logStart)
	for _, e := range deletes {
		fix = append(fix, op{key: epochKey(p.eprefix, e.Epoch), del: true})
	}
	if kept != nil {
		fix = append(fix, op{key: epochKey(p.eprefix, kept.Epoch), value: encodeOffset(kept.StartOffset)})
	}
	for n := len(entries); n > 0; n-- {
		e := entries[n-1]
		if e.StartOffset < p.leo || (e.StartOffset == p.leo && n == 1) {
			break
		}
		fix = append(fix, op{key: epochKey(p.eprefix, e.Epoch), del: true})
		entries = entries[:n-1]
	}
	p.epochs = entries
	if n := len(entries); n > 0 {
		p.wEpoch = entries[n-1].Epoch
	}
	return fix, nil
}

// pruneEpochs prunes a leader-epoch cache for the log start start, as Kafka's
// LeaderEpochFileCache.truncateFromStart: the latest entry at or below start stays, moved up to start
// (kept, when it moves), and the ones before it go (deletes). It returns the pruned cache too.
func pruneEpochs(entries []EpochEntry, start int64) (deletes []EpochEntry, kept *EpochEntry, out []EpochEntry) {
	i := 0 // entries[:i] start at or below start
	for i < len(entries) && entries[i].StartOffset <= start {
		i++
	}
	if i == 0 {
		return nil, nil, entries
	}
	deletes = entries[:i-1]
	out = append([]EpochEntry{{Epoch: entries[i-1].Epoch, StartOffset: start}}, entries[i:]...)
	if entries[i-1].StartOffset < start {
		kept = &out[0]
	}
	return deletes, kept, out
}

// EpochEntries returns a copy of the leader-epoch cache (KIP-101), sorted by epoch (and so by start
// offset): for each leader epoch that wrote a batch still in the log (or the one covering the log
// start), the offset of its first batch. Batches with a negative PartitionLeaderEpoch add nothing.
func (p *Partition) EpochEntries() []EpochEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]EpochEntry(nil), p.epochs...)
}

// LatestEpoch returns the epoch of the latest leader-epoch cache entry: -1 when the log never held a
// batch with an epoch >= 0, or a Truncate removed them all. (A log that retention emptied keeps its
// latest entry, as in Kafka.)
func (p *Partition) LatestEpoch() int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.epochs); n > 0 {
		return p.epochs[n-1].Epoch
	}
	return -1
}

// EndOffsetForEpoch answers OffsetsForLeaderEpoch (KIP-101, KIP-279) from the leader-epoch cache: for
// the largest epoch <= epoch that the cache holds, its end offset (the start offset of the next larger
// epoch in the cache, or LogEndOffset when it is the latest) and that epoch. (-1, -1) when epoch is
// below every entry or the cache is empty. A follower truncates to min(the answer, its own end offset
// for the answered epoch) when it holds that epoch, else asks again with its own epoch below it.
//
// Unlike Kafka's leader, which adds its new epoch to the cache when elected (so a request for an epoch
// above its latest is answered "undefined"), this cache holds only epochs that wrote batches, so an
// epoch above the latest gets (LEO, latest epoch); and an epoch below the first entry gets (-1, -1)
// where Kafka answers the first entry's start offset with the epoch asked for.
func (p *Partition) EndOffsetForEpoch(epoch int32) (endOffset int64, foundEpoch int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.epochs) - 1; i >= 0; i-- {
		if p.epochs[i].Epoch > epoch {
			continue
		}
		if i == len(p.epochs)-1 {
			return p.leo, p.epochs[i].Epoch
		}
		return p.epochs[i+1].StartOffset, p.epochs[i].Epoch
	}
	return -1, -1
}

// FenceLeaderAppends makes the writer refuse, from now on, every leader append (Append, AppendAsync)
// made under a leader epoch below epoch, with NOT_LEADER_OR_FOLLOWER. The replication layer calls it
// when this replica starts following at epoch, before it truncates for the new leader: an append of
// the ended leadership that is still queued would otherwise be written after the truncation read the
// log's end, and stay under the old epoch at offsets where the new leader has its own batches (Kafka
// keeps the two apart with the partition's leaderIsrUpdateLock). An append already taken by the writer
// is ahead of any Truncate queued later, which removes it. Lowering the fence does nothing.
func (p *Partition) FenceLeaderAppends(epoch int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fence = max(p.fence, epoch)
}

// TruncationOffset is the follower's side of the leader-epoch exchange (KIP-101, with KIP-279's
// repeated rounds; Kafka's AbstractFetcherThread.getOffsetTruncationState). The follower asked the
// leader where its latest epoch (LatestEpoch) ends and got (leaderEpoch, leaderEnd): the largest epoch
// at or below it in the leader's log and that epoch's end offset, or (-1, -1) when the leader has none
// (OffsetForLeaderEpoch). TruncationOffset returns the offset to truncate this log to and whether the
// exchange is complete; when it is not, the follower truncates there and asks again about its new
// latest epoch, since only then is the rest of its log known to be a prefix of the leader's.
//
//   - An empty log (no epoch): nothing to cut, complete.
//   - The leader holds none of this log's epochs at or below the latest (an unclean election, or a
//     leader log that starts later): none of this log is known to be the leader's, so it empties and
//     restarts at 0, complete; the follower's fetch from 0 then copies the leader's log from its
//     start (OFFSET_OUT_OF_RANGE moves it there when the leader's log starts later).
//   - This log holds leaderEpoch: min(leaderEnd, this log's end of that epoch), complete.
//   - It does not (it followed or led later epochs without that one's batches): cut to the end of its
//     own largest epoch below leaderEpoch and ask again. Stopping here, as KIP-101 alone did, would
//     keep this log's batches of later epochs at offsets where the leader has leaderEpoch's.
func (p *Partition) TruncationOffset(leaderEpoch int32, leaderEnd int64) (offset int64, complete bool) {
	p.mu.Lock()
	leo, empty := p.leo, len(p.epochs) == 0
	p.mu.Unlock()
	if empty {
		return leo, true
	}
	if leaderEpoch < 0 || leaderEnd < 0 {
		return 0, true
	}
	own, found := p.EndOffsetForEpoch(leaderEpoch)
	switch {
	case found < 0:
		return 0, true
	case found == leaderEpoch:
		return min(leaderEnd, own, leo), true
	default:
		return min(own, leo), false
	}
}

// checkpointAll writes the HW checkpoint of every open partition in replicated mode; Close calls it once
// the writer stopped.
func (s *Store) checkpointAll() {
	if s.failure() != nil {
		return
	}
	s.partsMu.Lock()
	parts := make([]*Partition, 0, len(s.parts))
	for _, p := range s.parts {
		parts = append(parts, p)
	}
	s.partsMu.Unlock()
	// dropMu before the checks, as the writer: a DeletePartition that retires a partition after its
	// check drops the checkpoint written here with the rest.
	s.dropMu.RLock()
	var ops []op
	for _, p := range parts {
		p.mu.Lock()
		if p.replicated && p.gone == nil {
			ops = append(ops, op{key: p.wprefix, value: encodeOffset(p.hw)})
		}
		p.mu.Unlock()
	}
	var err error
	if len(ops) > 0 {
		err = s.apply(ops)
	}
	s.dropMu.RUnlock()
	if err != nil {
		s.log.Warn("HW checkpoints not written on close", "dir", s.opts.Dir, "err", err)
	}
}
