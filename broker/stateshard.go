package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/group"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/broker/topiccfg"
	"github.com/runnel-io/runnel/client/batch"
)

// This file is the machinery shared by coordinators that keep their state in an internal compacted
// topic and run a deterministic core per partition of it (broker/group in groups.go, broker/txn in
// txns.go): one shard per partition led here, calls serialised per shard, the records a call produced
// appended acks=all and handed back to the core in log order once durable, the partition replayed when
// this node becomes its leader, and the shards kept in line with the metadata. How records are laid
// out in batches is each coordinator's (stateCodec): the transaction coordinator writes plain batches
// of keys and values (kvCodec), the group coordinator also transactional batches and markers
// (groupCodec, groups_txn.go).

// stateWriteTimeout bounds how long a state write to a replicated partition waits for the ISR; after
// it the shard is reloaded from its log (follow), since the core's memory ran ahead.
const stateWriteTimeout = 30 * time.Second

// replayReadBytes is how much of a state partition one read takes while loading.
const replayReadBytes = 4 << 20

// stateCodec lays out the records a core emits (group.Record, txn.Record) in the record batches of its
// partition, and keeps what the shell must know of that layout. Each shard has its own (stateShards.
// newCodec); its methods run during the shard's replay, or with the shard's mu held.
type stateCodec[R any] interface {
	// encode returns recs, as one call of the core returned them, as the bytes of one append (one or
	// more batches, timestamp ts in ms). The bytes are new and the caller's.
	encode(recs []R, ts int64) []byte
	// replay hands the records of one stored batch b (header h) to load while the partition is loaded,
	// and returns how many of them load refused (or the batch held that are no record of the core).
	replay(b []byte, h batch.Header, load func(R) error) (bad int, err error)
	// applied notes that recs, appended at offset base, are durable and were applied to the core.
	applied(recs []R, base int64)
}

// kvRecord is a record of an internal state topic that is a key and a value only (txn.Record); a nil
// Value is a tombstone.
type kvRecord interface{ ~struct{ Key, Value []byte } }

// kvCodec writes the records of one append as one plain batch and replays plain batches, skipping
// control batches: the layout of a state topic without transactions (__transaction_state).
type kvCodec[R kvRecord] struct{}

func (kvCodec[R]) encode(recs []R, ts int64) []byte {
	var b batch.Builder
	for _, r := range recs {
		kv := struct{ Key, Value []byte }(r)
		b.Append(ts, kv.Key, kv.Value, nil)
	}
	return b.Build(batch.CompressionNone) // the builder is dropped here, so the built bytes are ours to hand on
}

func (kvCodec[R]) replay(b []byte, h batch.Header, load func(R) error) (bad int, err error) {
	if h.IsControl() {
		return 0, nil
	}
	_, err = batch.DecodeBatch(b, func(r batch.Record) error {
		if err := load(R{Key: r.Key, Value: r.Value}); err != nil {
			bad++
		}
		return nil
	})
	return bad, err
}

func (kvCodec[R]) applied([]R, int64) {}

// stateCore is what a shard needs of a deterministic core.
type stateCore[R any] interface {
	// Load replays one durable record read from the partition while loading; an error means the record
	// was skipped (counted and logged).
	Load(R) error
	// Apply takes back, once durable and in log order, records the core returned.
	Apply([]R)
}

// stateShard is one partition of an internal state topic led here and the core that owns its keys.
type stateShard[R any, C stateCore[R]] struct {
	topic       string
	partition   int32
	leaderEpoch int32 // the epoch at which this node loaded it: a later epoch means a reload
	plog        *plog.Partition
	// replicated waits, for a replicated partition, until the ISR has the records of an append (acks=all),
	// calling done with the outcome; nil for a partition with one replica.
	replicated func(res plog.AppendResult, done func(error))
	log        *slog.Logger
	codec      stateCodec[R]
	// afterApply, when set, runs with mu held after durable records were applied to the core.
	afterApply func()
	// ctx is cancelled when the shard is unloaded (mu held while cancelling); wg counts the goroutines
	// the shard owns (the transaction coordinator's marker writers), which stop with ctx.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	core   C
	queue  []*stateWrite[R] // appended and not yet applied, in log order
	failed error            // a write failed: the core's memory is ahead of the log; refuse until reloaded
}

// stateWrite is one append of records to a shard's partition.
type stateWrite[R any] struct {
	recs    []R
	base    int64 // the offset the append got, set before it completes
	done    bool
	err     error
	applied chan struct{} // closed once the records are durable and applied (or failed)
}

// replay feeds every record of the partition, from its log start to its HW (its durable end when
// replicated, once everything this replica has written is durable), to the core, through the codec.
func (s *stateShard[R, C]) replay() error {
	bad := 0
	// A replicated partition is read to its durable end: this leader's log is the truth from now on,
	// and what it holds above the HW becomes committed as the followers copy it.
	end, read := s.plog.HighWatermark, s.plog.Read
	if s.plog.Replicated() {
		// A follower acknowledges what it has written, before its fsync: records the old leader
		// acknowledged (a commit, a transaction's partitions) may not be durable here yet, and a
		// replay that stopped short of them would lose them. Wait for them, or fail the load (the
		// next follow retries it; callers get COORDINATOR_LOAD_IN_PROGRESS meanwhile).
		if !waitDurable(s.plog, rebuildDurableWait) {
			return rerr.New(runnelv1.ErrorCode_COORDINATOR_LOAD_IN_PROGRESS, "load %s-%d: the log is not yet durable to its end %d (at %d) after %v",
				s.topic, s.partition, s.plog.LogEndOffset(), s.plog.DurableEnd(), rebuildDurableWait)
		}
		end, read = s.plog.DurableEnd, s.plog.ReadLocal
	}
	for off := s.plog.LogStartOffset(); off < end(); {
		data, err := read(nil, off, replayReadBytes)
		if err != nil {
			return fmt.Errorf("load %s-%d at offset %d: %w", s.topic, s.partition, off, err)
		}
		if len(data) == 0 {
			break
		}
		err = batch.Split(data, func(b []byte, h batch.Header) error {
			off = h.NextOffset()
			n, err := s.codec.replay(b, h, s.core.Load)
			bad += n
			return err
		})
		if err != nil {
			return fmt.Errorf("load %s-%d at offset %d: %w", s.topic, s.partition, off, err)
		}
	}
	if bad > 0 {
		s.log.Error("coordinator skipped records it could not load", "topic", s.topic, "partition", s.partition, "records", bad)
	}
	return nil
}

// submit encodes recs (the codec) and appends them fsynced (acks=all). Called with s.mu held, so
// appends reach the log in the order the core made them.
func (s *stateShard[R, C]) submit(recs []R, now time.Time) *stateWrite[R] {
	return s.append(s.codec.encode(recs, now.UnixMilli()), recs)
}

// append appends data, the encoding of recs, as the shard's next write; the core gets recs through
// Apply once data is durable. Called with s.mu held.
func (s *stateShard[R, C]) append(data []byte, recs []R) *stateWrite[R] {
	w := &stateWrite[R]{recs: recs, base: -1, applied: make(chan struct{})}
	s.queue = append(s.queue, w)
	s.plog.AppendAsync(data, plog.AppendOptions{Sync: true, LogAppendTime: -1, LeaderEpoch: s.leaderEpoch},
		func(res plog.AppendResult, err error) {
			if err == nil {
				w.base = res.BaseOffset // read by complete, which runs after this, under s.mu
			}
			if err != nil || s.replicated == nil {
				s.complete(w, err)
				return
			}
			s.replicated(res, func(err error) { s.complete(w, err) })
		})
	return w
}

// complete marks w written, then applies every written record at the head of the queue, in log order:
// appends may complete out of order, the core must see them in order.
func (s *stateShard[R, C]) complete(w *stateWrite[R], err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.done, w.err = true, err
	applied := false
	for len(s.queue) > 0 && s.queue[0].done {
		head := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		switch {
		case head.err != nil && s.failed == nil:
			s.failed = head.err
			s.log.Error("writing coordinator state failed; the partition is reloaded from its log",
				"topic", s.topic, "partition", s.partition, "err", head.err)
		case head.err == nil && s.failed == nil:
			s.core.Apply(head.recs)
			s.codec.applied(head.recs, head.base)
			applied = true
		}
		close(head.applied)
	}
	if applied && s.afterApply != nil {
		s.afterApply()
	}
}

func (s *stateShard[R, C]) unavailable(err error) error {
	return rerr.New(runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE, "state of %s-%d: %v", s.topic, s.partition, err)
}

// do runs fn on the core with the shard locked, appends the records it returns and waits until they
// are durable and applied, then returns fn's error (a call may both write and refuse: the transaction
// coordinator aborts a takeover's open transaction and answers CONCURRENT_TRANSACTIONS). A call that
// writes nothing waits for the writes before it, so it never answers with state that a crash could
// take back.
func (s *stateShard[R, C]) do(ctx context.Context, now time.Time, fn func(c C) ([]R, error)) error {
	s.mu.Lock()
	if s.failed != nil {
		s.mu.Unlock()
		return s.unavailable(s.failed)
	}
	recs, callErr := fn(s.core)
	var w *stateWrite[R]
	if len(recs) > 0 {
		w = s.submit(recs, now)
	} else if n := len(s.queue); n > 0 && callErr == nil {
		w = s.queue[n-1]
	}
	s.mu.Unlock()
	if err := s.await(ctx, w); err != nil {
		return err
	}
	return callErr
}

// await waits until w (nil: nothing) is durable and applied. Errors: COORDINATOR_NOT_AVAILABLE when
// the write failed, REQUEST_TIMED_OUT when ctx ends first.
func (s *stateShard[R, C]) await(ctx context.Context, w *stateWrite[R]) error {
	if w == nil {
		return nil
	}
	select {
	case <-w.applied:
		if w.err != nil {
			return s.unavailable(w.err)
		}
		return nil
	case <-ctx.Done():
		return rerr.New(runnelv1.ErrorCode_REQUEST_TIMED_OUT, "waiting for the state of %s-%d to be written: %v", s.topic, s.partition, ctx.Err())
	}
}

// read runs fn on the core with the shard locked.
func (s *stateShard[R, C]) read(fn func(c C)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(s.core)
}

// tick runs fn (a timer of the core) unless the shard failed, and appends what it returns without
// waiting; it reports whether anything was written.
func (s *stateShard[R, C]) tick(now time.Time, fn func(c C) []R) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed != nil {
		return false
	}
	if recs := fn(s.core); len(recs) > 0 {
		s.submit(recs, now)
		return true
	}
	return false
}

// unload stops the shard's goroutines and waits for them.
func (s *stateShard[R, C]) unload() {
	s.mu.Lock()
	s.cancel() // under mu: afterApply checks ctx under mu before it starts a goroutine
	s.mu.Unlock()
	s.wg.Wait()
}

// stateShards are the shards of one internal state topic that this node leads.
type stateShards[R any, C stateCore[R]] struct {
	b     *Broker
	topic string
	// what names a key in errors: "group", "transactional id".
	what       string
	partitions int32 // of the topic when this node creates it
	log        *slog.Logger
	newCore    func() C
	newCodec   func() stateCodec[R] // one per shard
	// loaded, when set, runs with the new shard's mu held after its replay, before it serves (the group
	// coordinator's Start, the transaction coordinator's resumption of prepared transactions).
	loaded func(s *stateShard[R, C], now time.Time)
	// afterApply, when set, is the shards' afterApply hook.
	afterApply func(s *stateShard[R, C])

	mu     sync.RWMutex
	shards map[int32]*stateShard[R, C]
}

// follow brings the loaded shards in line with the metadata: loads the partitions led here, drops
// those led elsewhere now, and creates the topic when it is missing and DefaultOffsetsReplicationFactor
// brokers are up (or every broker the cluster has, registered or voter, when it has fewer), so the
// replication factor does not depend on which node started first.
func (ss *stateShards[R, C]) follow(now time.Time) {
	img := ss.b.md.Image()
	t, ok := img.Topic(ss.topic)
	if !ok {
		ss.drop(func(int32, *stateShard[R, C]) bool { return true })
		alive := int32(len(img.AliveBrokers()))
		expected := int32(max(len(img.Brokers), ss.b.cfg.ControllerVoters, 1))
		if ss.b.Ready() && alive >= min(expected, DefaultOffsetsReplicationFactor) {
			ss.createTopic(min(alive, DefaultOffsetsReplicationFactor))
		}
		return
	}
	if !t.Internal {
		ss.log.Warn("a coordinator uses a topic that was not created as internal", "topic", t.Name)
	}
	ss.drop(func(p int32, s *stateShard[R, C]) bool {
		st, ok := t.Partition(p)
		s.mu.Lock()
		failed := s.failed != nil && len(s.queue) == 0
		s.mu.Unlock()
		// A shard whose write failed is reloaded from its log, which is the truth (the core's memory
		// ran ahead of it).
		return !ok || st.Leader != ss.b.cfg.NodeID || st.LeaderEpoch != s.leaderEpoch || failed
	})
	if !ss.b.Ready() {
		return // loading from a log this node may not lead any more is wasted: wait for this run's metadata
	}
	for i, st := range t.Assignment {
		p := int32(i)
		ss.mu.RLock()
		loaded := ss.shards[p] != nil
		ss.mu.RUnlock()
		if loaded || st.Leader != ss.b.cfg.NodeID {
			continue
		}
		if len(st.Replicas) > 1 && !ss.b.repl.leads(plog.PartitionID{TopicNum: t.Num, Partition: p}, st.LeaderEpoch) {
			// The replica still follows: its truncation for the previous epoch may yet cut what a
			// replay would read, or what the shard would write. The coordinator's loop calls follow
			// again when the replication layer takes up a leadership.
			continue
		}
		if err := ss.load(t, p, st.LeaderEpoch, now); err != nil {
			ss.log.Error("loading coordinator state failed", "topic", ss.topic, "partition", p, "err", err)
		}
	}
}

func (ss *stateShards[R, C]) createTopic(rf int32) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t, err := ss.b.createTopic(ctx, meta.Spec{Name: ss.topic, Partitions: ss.partitions, ReplicationFactor: rf,
		Internal: true, Configs: map[string]string{topiccfg.CleanupPolicy: "compact"}})
	switch {
	case err == nil:
		ss.log.Info("topic created", "topic", t.Name, "partitions", t.Partitions, "replication_factor", rf, "internal", true)
	case errors.Is(err, rerr.ErrTopicAlreadyExists):
	default:
		ss.log.Warn("creating an internal topic failed; will retry", "topic", ss.topic, "err", err)
	}
}

// drop unloads the shards for which drop is true, stopping their goroutines.
func (ss *stateShards[R, C]) drop(drop func(p int32, s *stateShard[R, C]) bool) {
	var gone []*stateShard[R, C]
	ss.mu.Lock()
	for p, s := range ss.shards {
		if drop(p, s) {
			delete(ss.shards, p)
			gone = append(gone, s)
			ss.log.Debug("coordinator partition unloaded", "topic", ss.topic, "partition", p) // as "loaded": 100 lines at every shutdown otherwise
		}
	}
	ss.mu.Unlock()
	for _, s := range gone {
		s.unload()
	}
}

// load rebuilds the state of partition p from its log and starts serving it.
func (ss *stateShards[R, C]) load(t *meta.Topic, p, leaderEpoch int32, now time.Time) error {
	_, l, err := ss.b.partition(t.Name, p)
	if err != nil {
		return err
	}
	s := &stateShard[R, C]{topic: t.Name, partition: p, leaderEpoch: leaderEpoch, plog: l, log: ss.log, core: ss.newCore(), codec: ss.newCodec()}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if st, _ := t.Partition(p); len(st.Replicas) > 1 {
		s.replicated = func(res plog.AppendResult, done func(error)) {
			ss.b.afterAppend(t, p, true, res, time.Now().Add(stateWriteTimeout), done)
		}
	}
	if ss.afterApply != nil {
		s.afterApply = func() { ss.afterApply(s) }
	}
	if err := s.replay(); err != nil {
		s.cancel()
		return err
	}
	if ss.loaded != nil {
		s.mu.Lock()
		ss.loaded(s, now)
		s.mu.Unlock()
	}
	ss.mu.Lock()
	ss.shards[p] = s
	ss.mu.Unlock()
	ss.log.Debug("coordinator partition loaded", "topic", ss.topic, "partition", p, "leader_epoch", leaderEpoch)
	return nil
}

// Loaded reports whether the topic exists and every partition of it this node leads is loaded.
func (ss *stateShards[R, C]) Loaded() bool {
	t, ok := ss.b.md.Image().Topic(ss.topic)
	if !ok {
		return false
	}
	ss.mu.RLock()
	defer ss.mu.RUnlock()
	for i, st := range t.Assignment {
		if s := ss.shards[int32(i)]; st.Leader == ss.b.cfg.NodeID && (s == nil || s.leaderEpoch != st.LeaderEpoch) {
			return false
		}
	}
	return true
}

// list returns the shards loaded now, by partition.
func (ss *stateShards[R, C]) list() []*stateShard[R, C] {
	ss.mu.RLock()
	defer ss.mu.RUnlock()
	out := make([]*stateShard[R, C], 0, len(ss.shards))
	for _, s := range ss.shards {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *stateShard[R, C]) int { return int(a.partition - b.partition) })
	return out
}

// shard returns the shard of key (a group or transactional id, hashed with group.PartitionFor).
// Errors: NOT_COORDINATOR naming the leader of the key's partition when another node leads it,
// COORDINATOR_NOT_AVAILABLE when the partition has no leader or the topic does not exist yet,
// COORDINATOR_LOAD_IN_PROGRESS while this node loads it.
func (ss *stateShards[R, C]) shard(key string) (*stateShard[R, C], error) {
	t, ok := ss.b.md.Image().Topic(ss.topic)
	if !ok {
		return nil, rerr.New(runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE, "%s does not exist yet (it is created once the cluster's brokers are up)", ss.topic)
	}
	p := group.PartitionFor(key, t.Partitions)
	st, _ := t.Partition(p)
	switch st.Leader {
	case ss.b.cfg.NodeID:
	case meta.NoLeader:
		return nil, rerr.New(runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE, "%s-%d, which holds %s %q, has no leader", ss.topic, p, ss.what, key)
	default:
		return nil, &rerr.Error{Code: runnelv1.ErrorCode_NOT_COORDINATOR, LeaderID: st.Leader, LeaderEpoch: st.LeaderEpoch,
			Message: fmt.Sprintf("broker %d coordinates %s %q (it leads %s-%d), not broker %d", st.Leader, ss.what, key, ss.topic, p, ss.b.cfg.NodeID)}
	}
	ss.mu.RLock()
	s := ss.shards[p]
	ss.mu.RUnlock()
	if s == nil || s.leaderEpoch != st.LeaderEpoch {
		return nil, rerr.New(runnelv1.ErrorCode_COORDINATOR_LOAD_IN_PROGRESS, "%s %q: %s-%d is being loaded", ss.what, key, ss.topic, p)
	}
	return s, nil
}

// shardAt returns the loaded shard of partition p, which this node must lead (a partition leader's
// call, such as a transaction marker, rather than a coordinator's). Errors: UNKNOWN_TOPIC_OR_PARTITION,
// NOT_LEADER_OR_FOLLOWER (naming the leader) or LEADER_NOT_AVAILABLE when this node does not lead it,
// COORDINATOR_LOAD_IN_PROGRESS while it loads it.
func (ss *stateShards[R, C]) shardAt(p int32) (*stateShard[R, C], error) {
	t, ok := ss.b.md.Image().Topic(ss.topic)
	if !ok {
		return nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "%s does not exist yet", ss.topic)
	}
	st, ok := t.Partition(p)
	if !ok {
		return nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "%s has no partition %d (it has %d)", ss.topic, p, t.Partitions)
	}
	if err := ss.b.checkLeader(ss.topic, p, st); err != nil {
		return nil, err
	}
	ss.mu.RLock()
	s := ss.shards[p]
	ss.mu.RUnlock()
	if s == nil || s.leaderEpoch != st.LeaderEpoch {
		return nil, rerr.New(runnelv1.ErrorCode_COORDINATOR_LOAD_IN_PROGRESS, "%s-%d is being loaded", ss.topic, p)
	}
	return s, nil
}

// close unloads every shard, stopping their goroutines.
func (ss *stateShards[R, C]) close() {
	ss.drop(func(int32, *stateShard[R, C]) bool { return true })
}
