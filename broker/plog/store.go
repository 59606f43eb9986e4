package plog

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"golang.org/x/sync/semaphore"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
)

// ErrPartitionDeleted is returned (wrapped) by the methods of a *Partition after DeletePartition, and by
// appends that were queued when it ran.
var ErrPartitionDeleted = errors.New("partition deleted")

// ErrClosed is returned (wrapped, together with rerr.ErrStorage so clients treat it as retriable) by
// Store and Partition methods after Close, and by appends still queued when Close ran.
var ErrClosed = errors.New("plog: store closed")

// ErrCloseTimeout is returned (wrapped) by Close when the store has not closed within
// Options.CloseTimeout. Badger retries a failed memtable flush once a second without end (its
// flushMemtable), so a store whose directory was removed, or whose disk fails, would otherwise never
// close, and a node stopping would never exit. After it Badger's goroutines still run and its
// directory lock stays held, so the same process cannot open that directory again while it exists:
// the caller should exit (Close says what else holds). What was acknowledged is in the value log and
// the memtable's WAL, which the next Open replays, as after a crash.
var ErrCloseTimeout = errors.New("plog: Badger did not close")

// Store holds every partition log of a node in one Badger DB. One writer goroutine group-commits the
// appends of all partitions; one syncer goroutine fsyncs behind it (Options.Fsync); one goroutine runs
// value-log GC every Options.GCInterval; without fsync a prefetcher and a flusher run as well
// (prefetch.go, flush.go). Close stops them all, except those stuck in Badger when it gives up
// (ErrCloseTimeout). All methods are safe for concurrent use.
type Store struct {
	opts Options
	db   *badger.DB
	log  *slog.Logger
	disk diskGuard // refuses appends when the filesystem runs out of room

	// lifeMu guards the DB's lifetime: every method that touches db holds it for reading and fails with
	// ErrClosed once closed is set; Close takes it for writing before db.Close, so no call ever reaches
	// a closed Badger (which panics on some paths).
	lifeMu sync.RWMutex
	closed bool
	// abandoned is set when Close gave up (ErrCloseTimeout). acquire checks it before lifeMu, so calls
	// fail with ErrClosed even when the stuck shutdown never got as far as setting closed.
	abandoned atomic.Bool

	// dropMu orders our writes against DropPrefix, which makes Badger refuse every write while it runs
	// (ErrBlockedWrites): the writer, retention and GC hold it for reading around their writes,
	// DeletePartition holds it for writing around DropPrefix. The writer also holds it across offset
	// assignment, so no batch of a partition being deleted is written after its prefix was dropped.
	dropMu sync.RWMutex

	// partsMu guards parts, and serialises opening (recovery) with deleting, so a partition is never
	// recovered from keys that a concurrent DeletePartition is dropping.
	partsMu sync.Mutex
	parts   map[PartitionID]*Partition

	// The append queue, drained by the writer goroutine.
	qmu     sync.Mutex
	queue   []*appendReq
	qclosed bool  // Close began: no more appends
	failed  error // sticky storage failure: Badger write or fsync failed, nothing more is appended
	wake    chan struct{}
	room    *semaphore.Weighted // bytes queued or being written, at most maxQueuedBytes

	// Groups written and waiting for fsync, drained by the syncer goroutine.
	smu      sync.Mutex
	synced   []*group
	syncWake chan struct{}
	// Highest value-log and memtable-WAL file numbers seen by the last sync (syncer goroutine only).
	lastVlogFid, lastMemFid uint64
	// syncFn makes written data durable: syncToDisk, or a failure injected by tests.
	syncFn func() error
	// now is the writer's clock for rolling segments: time.Now, or a clock injected by tests (set
	// before the first append).
	now func() time.Time

	gcMu sync.Mutex // one value-log GC at a time (Badger rejects a second one)
	// Value-log GC passes by outcome since Open, for metrics (ValueLogGCStats).
	gcRewritten, gcNothing, gcErrors atomic.Int64

	// Counters of writer groups and fsyncs, which show how well group commit batches (benchmarks).
	groups, fsyncs atomic.Int64

	// Without Options.Fsync: how many writebacks of the value log the prefetch goroutine started
	// (writebackBytes), and how it starts one (prefetchFile.writeback, or a failure injected by tests,
	// set before the first append).
	writebacks  atomic.Int64
	writebackFn func(f *prefetchFile, off, n int64) error
	// Likewise the flushes of the active value-log file the flusher took (flushesTaken) and made,
	// successfully or not (flushes: a file deleted meanwhile is not flushed, so not counted), and how it
	// makes one (datasyncFile of the request's path, or a failure injected by tests, set before the
	// first append); see flush.go.
	flushesTaken, flushes atomic.Int64
	datasyncFn            func(flushReq) error
	// Bytes written since the writer last woke the prefetcher (writer goroutine only), and bytes of
	// value log the prefetcher asked the kernel to read ahead (see prefetch.go).
	unprefetched int64
	prefetched   atomic.Int64
	// Steps the prefetch goroutine ran, so tests can wait for one.
	prefetchSteps atomic.Int64
	// Bytes of value log the prefetcher asked the kernel to drop from the page cache (pagecache.go).
	pageCacheDropped atomic.Int64

	stopWriter, writerDone chan struct{}
	stopSyncer, syncerDone chan struct{}
	stopGC, gcDone         chan struct{}
	prefetchWake           chan struct{}
	stopPrefetch           chan struct{}
	prefetchDone           chan struct{}
	flushReqs              chan flushReq // unbuffered: a request is taken only by an idle flusher
	stopFlusher            chan struct{}
	flusherDone            chan struct{}
	callbacks              *callbackRunner // runs AppendAsync's callbacks (callbacks.go)
	closeOnce              sync.Once
	closeErr               error
}

// Open opens (creating if needed) the Badger DB in opts.Dir and starts the writer, syncer, GC, prefetch
// and flush goroutines; Close stops them (and the idle append-callback workers; one running a callback
// ends when it returns). Badger replays its logs on open, so writes survive a crash of the process
// (kill -9) and, when fsynced, of the machine. Partitions are recovered lazily by Store.Partition.
func Open(opts Options) (*Store, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	removed, err := removeUnstartedValueLogs(opts.Dir)
	for _, path := range removed {
		opts.Logger.Warn("deleted an empty value-log file a crash left (it held nothing)", "path", path)
	}
	if err != nil {
		return nil, fmt.Errorf("open partition store in %s: %w", opts.Dir, err)
	}
	db, err := badger.Open(opts.badgerOptions())
	if err != nil {
		return nil, fmt.Errorf("open partition store in %s: %w", opts.Dir, err)
	}
	s := &Store{
		opts:       opts,
		db:         db,
		log:        opts.Logger,
		parts:      make(map[PartitionID]*Partition),
		wake:       make(chan struct{}, 1),
		room:       semaphore.NewWeighted(maxQueuedBytes),
		syncWake:   make(chan struct{}, 1),
		stopWriter: make(chan struct{}),
		writerDone: make(chan struct{}),
		stopSyncer: make(chan struct{}),
		syncerDone: make(chan struct{}),
		stopGC:     make(chan struct{}),
		gcDone:     make(chan struct{}),

		prefetchWake: make(chan struct{}, 1),
		stopPrefetch: make(chan struct{}),
		prefetchDone: make(chan struct{}),
		flushReqs:    make(chan flushReq),
		stopFlusher:  make(chan struct{}),
		flusherDone:  make(chan struct{}),
		callbacks:    newCallbackRunner(),
	}
	s.syncFn = s.syncToDisk
	s.writebackFn = (*prefetchFile).writeback
	s.datasyncFn = func(r flushReq) error { return datasyncFile(r.path) }
	s.now = time.Now
	go s.writeLoop()
	go s.syncLoop()
	go s.gcLoop()
	go s.prefetchLoop()
	go s.flushLoop()
	return s, nil
}

// DB returns the Badger DB. Keys under the prefix "m/" are free for metadata; every other key belongs to
// plog. Writes to it fail with badger.ErrBlockedWrites while a DeletePartition runs; retry them.
func (s *Store) DB() *badger.DB { return s.db }

// Close fails appends still queued with ErrClosed, waits for the group being written and fsyncs it,
// stops the goroutines, writes the HW checkpoint of every partition in replicated mode, closes every
// open partition (their Changed channels close, so long-polls wake up) and closes Badger. Later calls
// return the first call's result. All of it takes at most Options.CloseTimeout, else Close returns an
// error wrapping ErrCloseTimeout and the shutdown stays blocked in Badger, with its goroutines and its
// directory lock: the process should exit. It blocks in one of two places, and either way the store's
// methods then fail with ErrClosed and the open partitions are retired (their Changed channels close):
//   - in Badger's own close, which flushes the memtable: so when the directory is gone (Badger fails
//     writes once it cannot create a memtable, and the store then refuses appends);
//   - behind a write Badger holds until a memtable is flushed, when tables cannot be written but
//     memtables can (a disk failing some writes; with fsync on, a failed sync usually fails the
//     store first): the store's writer never returns, so Close marks the store closed itself and
//     retires the partitions, unless a call stuck in Badger holds them.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		done := make(chan error, 1)
		go func() { done <- s.shutdown() }()
		t := time.NewTimer(s.opts.CloseTimeout)
		defer t.Stop()
		select {
		case s.closeErr = <-done:
		case <-t.C:
			s.abandon()
			s.closeErr = fmt.Errorf("close partition store in %s: %w within %s (Badger retries a memtable flush that fails without end: is the directory gone or the disk failing? Badger's log says why)",
				s.opts.Dir, ErrCloseTimeout, s.opts.CloseTimeout)
		}
	})
	return s.closeErr
}

// abandon makes every later call fail with ErrClosed and retires the open partitions, after Close gave
// up. It takes partsMu only if it is free: the stuck shutdown or an open stuck in Badger may hold it,
// and waiting for them would block Close in turn.
func (s *Store) abandon() {
	s.abandoned.Store(true)
	if !s.partsMu.TryLock() {
		return
	}
	defer s.partsMu.Unlock()
	for _, p := range s.parts {
		p.retire(ErrClosed)
	}
}

// shutdown is Close's work, on a goroutine of its own so that Close can give up on it
// (ErrCloseTimeout); after a timeout it stays blocked in Badger, which nothing can stop.
func (s *Store) shutdown() error {
	s.qmu.Lock()
	s.qclosed = true
	s.qmu.Unlock()
	close(s.stopWriter)
	<-s.writerDone
	close(s.stopSyncer) // after the writer: the syncer fsyncs the last groups it handed over
	<-s.syncerDone
	close(s.stopGC)
	<-s.gcDone
	close(s.stopPrefetch)
	<-s.prefetchDone
	close(s.stopFlusher) // after the prefetcher, which hands it the flushes
	<-s.flusherDone
	s.checkpointAll()

	s.lifeMu.Lock()
	s.closed = true
	s.lifeMu.Unlock()
	s.partsMu.Lock()
	for _, p := range s.parts {
		p.retire(ErrClosed)
	}
	s.parts = nil
	s.partsMu.Unlock()
	s.callbacks.stop()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close partition store in %s: %w", s.opts.Dir, err)
	}
	return nil
}

// errClosed is ErrClosed with the storage error code, so the API edge answers KAFKA_STORAGE_ERROR
// (retriable) and clients try again, e.g. on the next leader.
func errClosed(what string) error {
	return fmt.Errorf("%s: %w (%w)", what, ErrClosed, rerr.ErrStorage)
}

// acquire checks the store is open and holds lifeMu for reading; release with s.lifeMu.RUnlock.
func (s *Store) acquire(what string) error {
	if s.abandoned.Load() {
		return errClosed(what)
	}
	s.lifeMu.RLock()
	if s.closed {
		s.lifeMu.RUnlock()
		return errClosed(what)
	}
	return nil
}

// Partition opens the log of id, recovering its log start offset, LEO, size and leader-epoch cache from
// Badger (HW = DurableEnd = LEO; a partition with an HW checkpoint comes back in replicated mode with
// that HW, clamped into [log start, LEO]), or creates an empty one. Calling it again with the same id
// returns the same *Partition until DeletePartition or Close. Errors: ErrClosed; rerr.ErrUnknownTopicOrPartition for a negative partition
// number; Badger read errors; rerr.ErrCorruptMessage when the last stored batch has a bad header.
func (s *Store) Partition(id PartitionID) (*Partition, error) {
	if err := s.acquire("open partition " + id.String()); err != nil {
		return nil, err
	}
	defer s.lifeMu.RUnlock()
	if id.Partition < 0 {
		return nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "partition %s: negative partition number", id)
	}
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	if p := s.parts[id]; p != nil {
		return p, nil
	}
	p, err := s.recover(id)
	if err != nil {
		return nil, fmt.Errorf("open partition %s: %w", id, err)
	}
	s.parts[id] = p
	return p, nil
}

// DeletePartition removes every batch, time-index entry, delete horizon, leader-epoch entry and
// aborted-transaction entry, the
// segment key, the HW checkpoint and the state of the partition with Badger's DropPrefix (which drops
// whole tables instead of writing a tombstone per key, and blocks all writes to the DB while it runs),
// and closes its *Partition: Changed() channels close, later calls return ErrPartitionDeleted, and so
// do appends still queued. Deleting a partition that has no data is not an error. A later
// Store.Partition(id) starts an empty log at offset 0.
func (s *Store) DeletePartition(id PartitionID) error {
	if err := s.acquire("delete partition " + id.String()); err != nil {
		return err
	}
	defer s.lifeMu.RUnlock()
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	if p := s.parts[id]; p != nil {
		p.retire(ErrPartitionDeleted)
		delete(s.parts, id)
	}
	s.dropMu.Lock()
	defer s.dropMu.Unlock()
	prefixes := make([][]byte, len(partKinds))
	for i, kind := range partKinds {
		prefixes[i] = partPrefix(kind, id)
	}
	if err := s.db.DropPrefix(prefixes...); err != nil {
		return fmt.Errorf("delete partition %s: %w", id, err)
	}
	return nil
}

// RunValueLogGC rewrites value-log files of which at least half is garbage (batches deleted by retention
// or DeletePartition), one after another until none qualifies, and returns nil then. The periodic GC
// goroutine does the same every Options.GCInterval; this runs it now. Badger learns what is garbage from
// LSM compactions, so space comes back only after the deletions were compacted. Errors: ErrClosed;
// Badger errors (wrapped).
func (s *Store) RunValueLogGC() error {
	if err := s.acquire("value-log GC"); err != nil {
		return err
	}
	defer s.lifeMu.RUnlock()
	return s.runGC(nil)
}

// runGC runs Badger's value-log GC until it finds nothing to rewrite or stop closes.
func (s *Store) runGC(stop <-chan struct{}) error {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		err := s.gcOnce()
		switch {
		case err == nil:
			s.gcRewritten.Add(1)
			continue // a file was rewritten; the next may qualify too
		case errors.Is(err, badger.ErrNoRewrite), errors.Is(err, badger.ErrRejected):
			s.gcNothing.Add(1)
			return nil
		default:
			s.gcErrors.Add(1)
			return fmt.Errorf("value-log GC in %s: %w", s.opts.Dir, err)
		}
	}
}

// GCStats counts value-log GC passes since Open by outcome.
type GCStats struct {
	Rewritten int64 // a value-log file was rewritten
	Nothing   int64 // no file had enough garbage (or another GC was running)
	Errors    int64 // the pass failed
}

// ValueLogGCStats returns the value-log GC passes since Open, periodic and RunValueLogGC's alike.
func (s *Store) ValueLogGCStats() GCStats {
	return GCStats{Rewritten: s.gcRewritten.Load(), Nothing: s.gcNothing.Load(), Errors: s.gcErrors.Load()}
}

// DiskUsage returns the disk space in bytes taken by Badger's LSM tree files (.sst: the offset index and
// partition state) and value-log files (.vlog: the record batches) in the store's directory. It lists
// the directory rather than asking Badger, whose own sizes are process-global expvars that the store
// turns off (badgerOptions) and that it refreshes only once a minute. Space is counted in allocated
// blocks where the system says (fileDiskSize): Badger preallocates each value-log file to its full
// size as a sparse file, whose length says nothing about what it holds.
func (s *Store) DiskUsage() (lsm, vlog int64, err error) {
	entries, err := os.ReadDir(s.opts.Dir)
	if err != nil {
		return 0, 0, err
	}
	for _, e := range entries {
		name := e.Name()
		isSST, isVlog := strings.HasSuffix(name, ".sst"), strings.HasSuffix(name, ".vlog")
		if !isSST && !isVlog {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // removed since the listing (compaction, GC)
		}
		if isSST {
			lsm += fileDiskSize(info)
		} else {
			vlog += fileDiskSize(info)
		}
	}
	return lsm, vlog, nil
}

// gcOnce runs one Badger value-log GC pass (at most one file rewritten).
//
// Badger v4.9.6's rewrite reads the memtable's maxVersion (DB.MaxVersion, added with the fix of
// badger#2286) without the lock its writer holds while updating it. The race is benign (a stale, lower
// value only makes compaction keep more versions), but the race detector fails any test where a
// rewrite overlaps a write. Under -race, GC therefore excludes our writes for its duration; in normal
// builds it only excludes DropPrefix, so appends never wait for GC.
func (s *Store) gcOnce() error {
	if raceBuild {
		s.dropMu.Lock()
		defer s.dropMu.Unlock()
	} else {
		s.dropMu.RLock()
		defer s.dropMu.RUnlock()
	}
	return s.db.RunValueLogGC(0.5)
}

func (s *Store) gcLoop() {
	defer close(s.gcDone)
	if s.opts.GCInterval < 0 {
		<-s.stopGC
		return
	}
	t := time.NewTicker(s.opts.GCInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopGC:
			return
		case <-t.C:
			if err := s.runGC(s.stopGC); err != nil {
				s.log.Warn("value-log GC failed", "dir", s.opts.Dir, "err", err)
			}
		}
	}
}

// reqKind says what a request of the writer's queue does. All kinds share the one queue, so the
// requests of a partition take effect in the order they were queued.
type reqKind uint8

const (
	reqAppend     reqKind = iota // Append, AppendAsync: assign offsets, stamp them
	reqReplica                   // AppendReplica: keep the batches' offsets, check they continue the log
	reqTruncate                  // Truncate: remove the tail (Store.truncate)
	reqCheckpoint                // write the HW checkpoint (SetReplicated, SetHighWatermark)
)

// appendReq is one Append (or AppendReplica, Truncate, HW checkpoint) call waiting for the writer (and
// maybe the syncer).
type appendReq struct {
	p         *Partition
	kind      reqKind
	batches   []stagedBatch
	bytes     int64 // sum of batch sizes
	held      int64 // bytes held in Store.room
	sync      bool  // acks=all: done only after the fsync (when Options.Fsync)
	allowGaps bool  // reqReplica: AppendOptions.AllowGaps
	truncTo   int64 // reqTruncate: the offset asked for
	// reqTruncate by TruncateAsFollower: the leader epoch followed; refused once a leadership above
	// it was granted (Partition.leading). -1: unconditional (Truncate).
	followEpoch int32
	// The topic's segment limits (AppendOptions.SegmentBytes, SegmentMs).
	segBytes, segMs int64

	// Set by the writer before done is closed.
	base, last, logStart int64
	epochs               []EpochEntry // leader-epoch cache entries the batches start
	aborted              []AbortedTxn // aborted transactions the batches' ABORT markers end
	err                  error
	done                 chan struct{}
	callback             func(AppendResult, error) // AppendAsync's; run by Store.callbacks
}

// what names the request in errors.
func (r *appendReq) what() string {
	switch r.kind {
	case reqTruncate:
		return "truncate " + r.p.id.String()
	case reqCheckpoint:
		return "checkpoint the high watermark of " + r.p.id.String()
	default:
		return "append to " + r.p.id.String()
	}
}

// result is what Append returns once done is closed.
func (r *appendReq) result() (AppendResult, error) {
	if r.err != nil {
		return AppendResult{}, r.err
	}
	return AppendResult{BaseOffset: r.base, LastOffset: r.last, LogStartOffset: r.logStart}, nil
}

// stagedBatch is one batch of an append, parsed by the caller's goroutine so the writer only stamps
// the base offset.
type stagedBatch struct {
	data      []byte
	lastDelta int32
	maxTs     int64
	epoch     int32 // the batch's PartitionLeaderEpoch, for the leader-epoch cache
	base      int64 // reqReplica: the batch's own base offset, kept
	// An ABORT marker (abortOf): the producer and the first offset of the transaction it ends, for the
	// aborted-transaction index; abortFirst is -1 for every other batch.
	abortPID, abortFirst int64
}

// finish completes r with err, or with ErrPartitionDeleted when the partition went away meanwhile
// (its data was dropped, so reporting success would lie).
func (r *appendReq) finish(err error) {
	if err == nil {
		if gone := r.p.goneErr(); gone != nil {
			err = gone
		} else {
			r.logStart = r.p.LogStartOffset()
		}
	}
	if err != nil {
		r.err = fmt.Errorf("%s: %w", r.what(), err)
	}
	close(r.done)
	if r.callback != nil {
		// Not on the writer or syncer goroutine: a slow callback must not hold up every partition.
		res, err := r.result()
		cb := r.callback
		r.p.s.callbacks.run(func() { cb(res, err) })
	}
}

// enqueue hands r to the writer goroutine.
func (s *Store) enqueue(r *appendReq) error {
	if err := s.disk.reserve(s.opts, r.bytes); err != nil {
		return fmt.Errorf("%s: %w", r.what(), err)
	}
	s.qmu.Lock()
	switch {
	case s.qclosed:
		s.qmu.Unlock()
		return errClosed(r.what())
	case s.failed != nil:
		err := s.failed
		s.qmu.Unlock()
		return fmt.Errorf("%s: %w", r.what(), storageErr(err))
	}
	s.queue = append(s.queue, r)
	s.qmu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default: // the writer is already due to look at the queue
	}
	return nil
}

// storageErr marks err as KAFKA_STORAGE_ERROR, keeping it in the chain.
func storageErr(err error) error {
	return fmt.Errorf("%w: %w", rerr.ErrStorage, err)
}

// failure returns the sticky storage failure (see fail), nil while the store works.
func (s *Store) failure() error {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	return s.failed
}

// fail makes a Badger write or fsync failure sticky, as Kafka takes a log directory offline: after an
// fsync failure the page cache may have dropped the dirty pages (fsyncgate), so nothing written since can
// be trusted to be on disk, and a write error leaves offsets assigned to data that may not exist.
func (s *Store) fail(err error) {
	s.qmu.Lock()
	first := s.failed == nil
	if first {
		s.failed = err
	}
	s.qmu.Unlock()
	if first {
		s.log.Error("partition store failed; appends are refused until restart", "dir", s.opts.Dir, "err", err)
	}
}

// group is what one writer pass committed: the requests, and per partition the end offset to which the
// HW may advance once the group is durable.
type group struct {
	reqs []*appendReq
	ends []partEnd
}

type partEnd struct {
	p        *Partition
	end, gen int64 // gen: the partition's truncation generation when the group was written
}

// writeLoop is the writer goroutine: it takes everything queued, writes it in one Badger transaction
// (more if it is too big for one) and hands it to the syncer. Appends that arrive while a group is
// being written form the next group, so the group size adapts to the load.
func (s *Store) writeLoop() {
	defer close(s.writerDone)
	var spare []*appendReq
	for {
		select {
		case <-s.stopWriter:
			s.qmu.Lock()
			rest := s.queue
			s.queue = nil
			s.qmu.Unlock()
			for _, r := range rest {
				s.room.Release(r.held)
				r.finish(errClosed("store closing"))
			}
			return
		case <-s.wake:
		}
		// Two slices take turns: the writer works through one while appends fill the other.
		s.qmu.Lock()
		reqs := s.queue
		s.queue, spare = spare, nil
		failed := s.failed
		s.qmu.Unlock()
		if len(reqs) == 0 {
			spare = reqs
			continue
		}
		if failed != nil {
			s.failAll(reqs, failed)
		} else {
			s.writeReqs(reqs)
		}
		clear(reqs) // drop references to the batches before reusing the slice
		spare = reqs[:0]
	}
}

// failAll completes reqs with the store's sticky failure.
func (s *Store) failAll(reqs []*appendReq, failed error) {
	for _, r := range reqs {
		s.room.Release(r.held)
		r.finish(storageErr(failed))
	}
}

// writeReqs writes what the writer took from the queue, in queue order: the requests between two
// truncations form one group (one commit, one fsync), and each truncation runs on its own in between,
// so it sees every request queued before it written and no request queued after it.
func (s *Store) writeReqs(reqs []*appendReq) {
	for first := true; len(reqs) > 0; first = false {
		if !first {
			if failed := s.failure(); failed != nil {
				s.failAll(reqs, failed)
				return
			}
		}
		i := slices.IndexFunc(reqs, func(r *appendReq) bool { return r.kind == reqTruncate })
		if i < 0 {
			s.writeGroup(reqs)
			return
		}
		if i > 0 {
			s.writeGroup(reqs[:i])
		}
		s.truncate(reqs[i])
		reqs = reqs[i+1:]
	}
}

// writeGroup assigns offsets to reqs in queue order, writes them, and completes or forwards them.
func (s *Store) writeGroup(reqs []*appendReq) {
	g := &group{reqs: make([]*appendReq, 0, len(reqs))}
	var entries []*badger.Entry
	var held int64
	endIdx := make(map[*Partition]int, 4)

	nowMs := s.now().UnixMilli()
	s.dropMu.RLock()
	for _, r := range reqs {
		held += r.held
		p := r.p
		p.mu.Lock()
		if p.gone != nil {
			err := p.gone
			p.mu.Unlock()
			r.finish(err)
			continue
		}
		switch r.kind {
		case reqAppend:
			if e := r.batches[0].epoch; e < p.fence {
				fence := p.fence
				p.mu.Unlock()
				r.finish(fmt.Errorf("append to %s: %w", p.id, rerr.New(runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER,
					"the append was made under leader epoch %d; this replica follows epoch %d now", e, fence)))
				continue
			}
		case reqCheckpoint:
			p.hwQueued = false
			if p.replicated {
				entries = append(entries, badger.NewEntry(p.wprefix, encodeOffset(p.hw)))
			}
			p.mu.Unlock()
			g.reqs = append(g.reqs, r)
			continue
		case reqReplica:
			// Checked here, against the end of everything queued before: the batches' own offsets
			// must continue the log (prepareReplica checked they continue each other).
			if first := r.batches[0].base; first < p.next || (!r.allowGaps && first != p.next) {
				next := p.next
				p.mu.Unlock()
				r.finish(fmt.Errorf("%w: the batches start at offset %d, the log ends at %d", ErrOffsetMismatch, first, next))
				continue
			}
		}
		r.base = p.next
		if r.kind == reqReplica {
			r.base = r.batches[0].base
		}
		for _, b := range r.batches {
			if r.kind == reqReplica {
				p.next = b.base // as the leader stored it; past p.next only over a gap (AllowGaps)
			} else {
				// The base offset lies outside the CRC, so stamping it keeps the batch valid.
				batch.SetBaseOffset(b.data, p.next)
			}
			if e := p.segmentLocked(int64(len(b.data)), nowMs, r.segBytes, r.segMs); e != nil {
				entries = append(entries, e)
			}
			if b.epoch >= 0 && b.epoch > p.wEpoch {
				// The batch starts a newer leader epoch: its cache entry goes into the batch's
				// transaction, ahead of it (a crash never leaves a stored batch without its entry).
				p.wEpoch = b.epoch
				r.epochs = append(r.epochs, EpochEntry{Epoch: b.epoch, StartOffset: p.next})
				entries = append(entries, badger.NewEntry(epochKey(p.eprefix, b.epoch), encodeOffset(p.next)))
			}
			if b.abortFirst >= 0 {
				// An ABORT marker: its index entry goes into the marker's transaction, ahead of it (a
				// stored marker always has its entry; recovery drops an entry left without one).
				a := AbortedTxn{ProducerID: b.abortPID, FirstOffset: min(b.abortFirst, p.next), LastOffset: p.next}
				r.aborted = append(r.aborted, a)
				entries = append(entries, badger.NewEntry(batchKey(p.aprefix, p.next), encodeAborted(a)))
			}
			entries = append(entries, badger.NewEntry(batchKey(p.lprefix, p.next), b.data))
			if b.maxTs > p.maxTs {
				// As Kafka's time index: an entry only where the running max rises, so the index's
				// timestamps rise with offsets and a seek by timestamp finds the first candidate batch.
				p.maxTs = b.maxTs
				entries = append(entries, badger.NewEntry(timeKey(p.tprefix, b.maxTs, p.next), nil))
			}
			p.next += int64(b.lastDelta) + 1
		}
		r.last = p.next - 1
		end, gen := p.next, p.gen.Load()
		p.mu.Unlock()
		g.reqs = append(g.reqs, r)
		if i, ok := endIdx[p]; ok {
			g.ends[i].end = end
		} else {
			endIdx[p] = len(g.ends)
			g.ends = append(g.ends, partEnd{p, end, gen})
		}
	}
	err := s.commit(entries)
	s.dropMu.RUnlock()
	s.groups.Add(1)
	s.room.Release(held)

	if err != nil {
		err = fmt.Errorf("write %d batches: %w", len(entries), err)
		s.fail(err)
		for _, r := range g.reqs {
			r.finish(storageErr(err))
		}
		return
	}
	var wrote int64
	for _, r := range g.reqs {
		if r.kind != reqCheckpoint {
			r.p.written(r.last+1, r.bytes, r.epochs, r.aborted)
		}
		wrote += r.bytes
	}
	s.wakePrefetch(wrote)
	if !s.opts.Fsync {
		for _, pe := range g.ends {
			pe.p.advanceHW(pe.end, pe.gen)
		}
		for _, r := range g.reqs {
			r.finish(nil)
		}
		return
	}
	// acks=1 answers once written; acks=all and the HW wait for the fsync. (An HW checkpoint does not
	// wait: losing it only brings back a lower HW.)
	for _, r := range g.reqs {
		if !r.sync {
			r.finish(nil)
		}
	}
	if len(g.ends) > 0 {
		s.toSyncer(g)
	}
}

// toSyncer hands a written group to the syncer.
func (s *Store) toSyncer(g *group) {
	s.smu.Lock()
	s.synced = append(s.synced, g)
	s.smu.Unlock()
	select {
	case s.syncWake <- struct{}{}:
	default:
	}
}

// commit writes entries in as few Badger transactions as fit (a transaction holds keys up to 15% of a
// memtable). Badger applies transactions in commit order, so after a crash what survives is a prefix
// of entries and every partition's offsets stay contiguous.
func (s *Store) commit(entries []*badger.Entry) error {
	txn := s.db.NewTransaction(true)
	defer func() { txn.Discard() }()
	for _, e := range entries {
		err := txn.SetEntry(e)
		if errors.Is(err, badger.ErrTxnTooBig) {
			if err = txn.Commit(); err != nil {
				return err
			}
			txn = s.db.NewTransaction(true)
			err = txn.SetEntry(e)
		}
		if err != nil {
			return err
		}
	}
	return txn.Commit()
}

// writebackBytes is how much of the active value log may be dirty, without Options.Fsync, before
// the prefetch goroutine starts writing it back (prefetch.go):
// sync_file_range(SYNC_FILE_RANGE_WRITE) of what was written since the last writeback, up to
// writebackLag short of the end, which starts the I/O and waits for nothing. Without it the pages
// stay dirty (the kernel writes them back after 30 s, or once gigabytes are dirty) until Badger
// rotates to the next value-log file, which it does every ValueLogFileSize (256 MiB when this was
// measured: every 4 s at 60 MB/s; 1 GiB now) and which msyncs the whole file it leaves on Badger's
// write path: every write of every partition waited 75-450 ms for that on a 2-core machine, which
// made the produce p99 at half of the maximum throughput (issue 9). With a writeback every few MiB
// the rotation finds the file nearly clean. RocksDB's bytes_per_sync does the same, with the same
// call, for the same reason. (An msync or fsync instead, as at first, also commits ext4's journal
// and locks the folio Badger is writing into while it is written back: at 50,000 records/s every
// one of them held Badger's writes for 5-45 ms.) The data is no more durable for it: nobody waits
// for the writeback, so acknowledgements promise nothing more than before.
const writebackBytes = 4 << 20

// syncLoop is the syncer goroutine: it fsyncs once for all groups written since the last fsync, then
// moves their HWs and answers their acks=all appends. It runs behind the writer, which meanwhile writes
// the next group.
func (s *Store) syncLoop() {
	defer close(s.syncerDone)
	for {
		stopping := false
		select {
		case <-s.stopSyncer:
			stopping = true
		case <-s.syncWake:
		}
		s.smu.Lock()
		groups := s.synced
		s.synced = nil
		s.smu.Unlock()
		if len(groups) > 0 {
			s.syncGroups(groups)
		}
		if stopping {
			return
		}
	}
}

func (s *Store) syncGroups(groups []*group) {
	err := s.failure()
	if err == nil {
		s.fsyncs.Add(1)
		if err = s.syncFn(); err != nil {
			err = fmt.Errorf("fsync %s: %w", s.opts.Dir, err)
			s.fail(err)
		}
	}
	for _, g := range groups {
		if err == nil {
			for _, pe := range g.ends {
				pe.p.advanceHW(pe.end, pe.gen)
			}
		}
		for _, r := range g.reqs {
			if r.sync {
				if err != nil {
					r.finish(storageErr(err))
				} else {
					r.finish(nil)
				}
			}
		}
	}
}

// syncToDisk fsyncs everything written so far: every value-log and memtable WAL file that was active
// at the last sync or created since, and the directory when files were created. Badger writes both
// kinds of file through shared memory maps; on Linux an fdatasync of the file writes back the map's
// dirty pages, as the msync of Badger's own Sync would (msync(MS_SYNC) is an fdatasync of the
// range). A file that is gone was a memtable WAL that Badger flushed to a table (which Badger syncs)
// and deleted, or a value-log file that value-log GC rewrote and deleted.
//
// On Linux it does not call db.Sync: that holds the DB's lock for reading while it msyncs the memtable
// WAL, and every write batch takes that lock for writing (ensureRoomForWrite), so on an fsyncing node
// each write, acks=1 appends included, waited for the disk's cache flush of the sync in progress,
// 5-45 ms on this machine (docs/performance.md). Syncing the files by path takes no lock of Badger's.
// Elsewhere, where POSIX does not promise that fsync covers a shared mapping, db.Sync runs first.
// TestSyncCoversActiveLogFiles holds which files it covers.
func (s *Store) syncToDisk() error {
	if !fsyncCoversMmap {
		if err := s.db.Sync(); err != nil {
			return err
		}
	}
	files, err := badgerLogFiles(s.opts.Dir)
	if err != nil {
		return err
	}
	maxVlog, maxMem := s.lastVlogFid, s.lastMemFid
	for _, f := range files {
		if f.vlog {
			maxVlog = max(maxVlog, f.fid)
		} else {
			maxMem = max(maxMem, f.fid)
		}
	}
	for _, f := range files {
		last := s.lastMemFid
		if f.vlog {
			last = s.lastVlogFid
		}
		// The file active at the last sync (it may hold writes since), and any created after it. A
		// write that completed before this sync began is in one of them: the files it could be in
		// existed when the directory was listed.
		if f.fid >= last {
			if err := syncPath(filepath.Join(s.opts.Dir, f.name), false); err != nil {
				return err
			}
		}
	}
	if maxVlog != s.lastVlogFid || maxMem != s.lastMemFid {
		if err := syncPath(s.opts.Dir, true); err != nil { // the new files' entries
			return err
		}
	}
	s.lastVlogFid, s.lastMemFid = maxVlog, maxMem
	return nil
}

// syncPath fdatasyncs a file by name, or fsyncs a directory (dir) for its entries; testHookSyncPath,
// when set, sees each path first. A file that is gone has nothing left to sync (see syncToDisk).
func syncPath(path string, dir bool) error {
	if testHookSyncPath != nil {
		testHookSyncPath(path)
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if dir {
		err = f.Sync()
	} else {
		err = datasync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}

// testHookSyncPath, when set by a test, is called with every path syncPath syncs.
var testHookSyncPath func(path string)

// StoredPartitions returns every partition that has any key in the DB (batches, state, an HW
// checkpoint, …), sorted. The broker
// compares it with the metadata to drop the logs of partitions no longer placed on this node (a topic
// deleted while the node was down), as Kafka removes stray logs.
func (s *Store) StoredPartitions() ([]PartitionID, error) {
	seen := map[PartitionID]bool{}
	err := s.db.View(func(txn *badger.Txn) error {
		for _, kind := range partKinds {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{kind}})
			for it.Rewind(); it.Valid(); {
				k := it.Item().Key()
				if len(k) < partPrefixLen {
					it.Next()
					continue
				}
				id := PartitionID{TopicNum: binary.BigEndian.Uint64(k[1:9]), Partition: int32(binary.BigEndian.Uint32(k[9:13]))}
				seen[id] = true
				// Skip the rest of this partition's keys of this kind.
				next := append(partPrefix(kind, id), 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF)
				it.Seek(next)
			}
			it.Close()
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list stored partitions: %w", err)
	}
	out := make([]PartitionID, 0, len(seen))
	for id := range seen {
		out = append(out, id)
	}
	slices.SortFunc(out, func(a, b PartitionID) int {
		if a.TopicNum != b.TopicNum {
			return cmp.Compare(a.TopicNum, b.TopicNum)
		}
		return cmp.Compare(a.Partition, b.Partition)
	})
	return out, nil
}

// diskGuard refuses appends that would leave the store's filesystem with less than
// Options.MinFreeBytes free. It asks the filesystem at most every diskCheckEvery and, in between,
// counts what was let through twice (the value log, then the LSM tree as memtables flush), so a burst
// cannot run past the reserve between two looks. Refusals are KAFKA_STORAGE_ERROR, retriable: once
// retention, compaction or an operator frees space, appends go on.
type diskGuard struct {
	mu      sync.Mutex
	checked time.Time
	free    int64 // at the last look, minus what was let through since; -1: unknown
	full    bool  // the last refusal was logged
}

// diskCheckEvery bounds how stale the guard's view of the free space is.
const diskCheckEvery = 250 * time.Millisecond

func (g *diskGuard) reserve(opts Options, n int64) error {
	if opts.MinFreeBytes < 0 || n == 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if time.Since(g.checked) > diskCheckEvery || g.free-2*n < opts.MinFreeBytes {
		g.free, g.checked = freeBytes(opts.Dir), time.Now()
	}
	if g.free < 0 {
		return nil // the system does not say
	}
	if g.free-2*n < opts.MinFreeBytes {
		if !g.full {
			g.full = true
			opts.Logger.Error("disk almost full: appends refused until space is freed", "dir", opts.Dir,
				"free_bytes", g.free, "min_free_bytes", opts.MinFreeBytes)
		}
		return rerr.New(runnelv1.ErrorCode_KAFKA_STORAGE_ERROR, "the disk of %s has %d MiB free, below the %d MiB the store keeps free: appends are refused until space is freed",
			opts.Dir, g.free>>20, opts.MinFreeBytes>>20)
	}
	if g.full {
		g.full = false
		opts.Logger.Info("disk space freed: appends accepted again", "dir", opts.Dir, "free_bytes", g.free)
	}
	g.free -= 2 * n
	return nil
}
