package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/group"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/broker/topiccfg"
	"github.com/runnel-io/runnel/client/batch"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// maxGroupsPerRequest caps the group ids of one DescribeGroups or DeleteGroups.
const maxGroupsPerRequest = 10_000

// groupWriteTimeout bounds how long a group write to a replicated __consumer_offsets partition waits for
// the ISR; after it the shard is reloaded from its log (follow), since the core's memory ran ahead.
const groupWriteTimeout = 30 * time.Second

// replayReadBytes is how much of a __consumer_offsets partition one read takes while loading.
const replayReadBytes = 4 << 20

// DefaultOffsetsReplicationFactor is the replication factor of __consumer_offsets (Kafka's
// offsets.topic.replication.factor), capped at the number of brokers when the cluster is smaller.
const DefaultOffsetsReplicationFactor = 3

// GroupCoordinator serves the Groups gRPC service: the thin shell around one group.Coordinator per
// partition of __consumer_offsets that this node leads (all of them on a single node). Per partition it
// serialises calls to the core, appends the records a call produced to the partition with acks=all
// semantics (fsynced), hands them back to the core once durable, and only then answers. One goroutine
// follows the metadata: it loads a partition's groups when this node becomes its leader and drops
// them when it stops leading it; it also drives the cores' timers (Tick) and tells them about topic
// changes. See broker/group's doc.go.
type GroupCoordinator struct {
	runnelv1.UnimplementedGroupsServer

	b   *Broker
	cfg group.Config
	log *slog.Logger

	shardsMu sync.RWMutex
	shards   map[int32]*groupShard // the __consumer_offsets partitions led here

	topicsMu sync.Mutex
	topics   map[string]group.TopicInfo // what the cores were last told

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// groupShard is one __consumer_offsets partition and the core that owns its groups.
type groupShard struct {
	partition   int32
	leaderEpoch int32 // the epoch at which this node loaded it: a later epoch means a reload
	plog        *plog.Partition
	// replicated waits, for a replicated partition, until the ISR has the records of an append (acks=all),
	// calling done with the outcome; nil for a partition with one replica.
	replicated func(res plog.AppendResult, done func(error))
	log        *slog.Logger

	mu     sync.Mutex
	core   *group.Coordinator
	queue  []*groupWrite // appended and not yet applied, in log order
	failed error         // a write failed: the core's memory is ahead of the log; refuse until restart
	// txnFirst maps a producer id to the offset of its first transactional batch since its last
	// marker, the FirstOffset of its next marker (groups_txn.go).
	txnFirst map[int64]int64
}

// groupWrite is one append of records to the shard's partition.
type groupWrite struct {
	recs    []group.Record
	base    int64 // the offset the append got, set before it completes
	done    bool
	err     error
	applied chan struct{} // closed once the records are durable and applied (or failed)
}

// NewGroupCoordinator starts the goroutine that follows the metadata: it creates __consumer_offsets
// (cfg.OffsetsTopicPartitions partitions, cleanup.policy=compact, internal) once the cluster's brokers
// are up, and loads the groups and committed offsets of each partition this node leads from the
// partition. Close stops it.
func NewGroupCoordinator(b *Broker, cfg group.Config, logger *slog.Logger) (*GroupCoordinator, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	gc := &GroupCoordinator{b: b, cfg: cfg, log: logger, shards: map[int32]*groupShard{}, stop: make(chan struct{})}
	gc.topics = gc.topicInfos()
	gc.follow(time.Now())
	b.tel.ObserveGroups(gc.reportGroups)
	b.SetOffsetsMarkers(gc) // WriteTxnMarkers hands __consumer_offsets partitions here (groups_txn.go)
	gc.wg.Add(1)
	go gc.loop()
	return gc, nil
}

// follow brings the loaded shards in line with the metadata: loads the partitions of
// __consumer_offsets led here, drops those led elsewhere now, and creates the topic when it is missing
// and DefaultOffsetsReplicationFactor brokers are up (or every broker the cluster has, registered or
// voter, when it has fewer), so the replication factor does not depend on which node started first.
func (gc *GroupCoordinator) follow(now time.Time) {
	img := gc.b.md.Image()
	t, ok := img.Topic(group.OffsetsTopic)
	if !ok {
		gc.dropShards(func(int32) bool { return true })
		alive := int32(len(img.AliveBrokers()))
		expected := int32(max(len(img.Brokers), gc.b.cfg.ControllerVoters, 1))
		if gc.b.Ready() && alive >= min(expected, DefaultOffsetsReplicationFactor) {
			gc.createOffsetsTopic(min(alive, DefaultOffsetsReplicationFactor))
		}
		return
	}
	if !t.Internal {
		gc.log.Warn("the group coordinator uses a topic that was not created as internal", "topic", t.Name)
	}
	gc.dropShards(func(p int32) bool {
		st, ok := t.Partition(p)
		s := gc.shards[p]
		s.mu.Lock()
		failed := s.failed != nil && len(s.queue) == 0
		s.mu.Unlock()
		// A shard whose write failed is reloaded from its log, which is the truth (the core's memory
		// ran ahead of it).
		return !ok || st.Leader != gc.b.cfg.NodeID || st.LeaderEpoch != s.leaderEpoch || failed
	})
	if !gc.b.Ready() {
		return // loading from a log this node may not lead any more is wasted: wait for this run's metadata
	}
	for i, st := range t.Assignment {
		p := int32(i)
		gc.shardsMu.RLock()
		loaded := gc.shards[p] != nil
		gc.shardsMu.RUnlock()
		if loaded || st.Leader != gc.b.cfg.NodeID {
			continue
		}
		if err := gc.load(t, p, st.LeaderEpoch, now); err != nil {
			gc.log.Error("loading groups failed", "partition", p, "err", err)
		}
	}
}

func (gc *GroupCoordinator) createOffsetsTopic(rf int32) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t, err := gc.b.createTopic(ctx, meta.Spec{Name: group.OffsetsTopic, Partitions: gc.cfg.OffsetsTopicPartitions, ReplicationFactor: rf,
		Internal: true, Configs: map[string]string{topiccfg.CleanupPolicy: "compact"}})
	switch {
	case err == nil:
		gc.log.Info("topic created", "topic", t.Name, "partitions", t.Partitions, "replication_factor", rf, "internal", true)
	case errors.Is(err, rerr.ErrTopicAlreadyExists):
	default:
		gc.log.Warn("creating the group offsets topic failed; will retry", "topic", group.OffsetsTopic, "err", err)
	}
}

// dropShards unloads the shards for which drop is true (called with no shard lock held).
func (gc *GroupCoordinator) dropShards(drop func(p int32) bool) {
	gc.shardsMu.Lock()
	defer gc.shardsMu.Unlock()
	for p := range gc.shards {
		if drop(p) {
			delete(gc.shards, p)
			gc.log.Info("group partition unloaded", "partition", p)
		}
	}
}

// load rebuilds the groups of partition p from its log and starts serving them.
func (gc *GroupCoordinator) load(t *meta.Topic, p, leaderEpoch int32, now time.Time) error {
	_, l, err := gc.b.partition(t.Name, p)
	if err != nil {
		return err
	}
	s := &groupShard{partition: p, leaderEpoch: leaderEpoch, plog: l, log: gc.log, core: group.New(gc.cfg), txnFirst: map[int64]int64{}}
	if st, _ := t.Partition(p); len(st.Replicas) > 1 {
		s.replicated = func(res plog.AppendResult, done func(error)) {
			gc.b.afterAppend(t, p, true, res, time.Now().Add(groupWriteTimeout), done)
		}
	}
	if err := s.replay(); err != nil {
		return err
	}
	gc.topicsMu.Lock()
	topics := gc.topics
	gc.topicsMu.Unlock()
	s.mu.Lock()
	if recs := s.core.Start(now, topics); len(recs) > 0 {
		s.submit(recs, now)
	}
	gc.observeShard(s, now, true)
	s.mu.Unlock()
	gc.shardsMu.Lock()
	gc.shards[p] = s
	gc.shardsMu.Unlock()
	gc.log.Debug("group partition loaded", "partition", p, "leader_epoch", leaderEpoch)
	return nil
}

// Loaded reports whether __consumer_offsets exists and every partition of it this node leads is
// loaded, so group calls for those partitions are served rather than answered
// COORDINATOR_LOAD_IN_PROGRESS.
func (gc *GroupCoordinator) Loaded() bool {
	t, ok := gc.b.md.Image().Topic(group.OffsetsTopic)
	if !ok {
		return false
	}
	gc.shardsMu.RLock()
	defer gc.shardsMu.RUnlock()
	for i, st := range t.Assignment {
		if s := gc.shards[int32(i)]; st.Leader == gc.b.cfg.NodeID && (s == nil || s.leaderEpoch != st.LeaderEpoch) {
			return false
		}
	}
	return true
}

// loadedShards returns the shards loaded now.
func (gc *GroupCoordinator) loadedShards() []*groupShard {
	gc.shardsMu.RLock()
	defer gc.shardsMu.RUnlock()
	out := make([]*groupShard, 0, len(gc.shards))
	for _, s := range gc.shards {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *groupShard) int { return int(a.partition - b.partition) })
	return out
}

// replay feeds every record of the partition, from its log start to its HW (its durable end when
// replicated), to the core: records of transactional batches with their producer, markers as marker
// records (loadBatch, groups_txn.go).
func (s *groupShard) replay() error {
	bad := 0
	// A replicated partition is read to its durable end: this leader's log is the truth from now on,
	// and what it holds above the HW becomes committed as the followers copy it.
	end, read := s.plog.HighWatermark, s.plog.Read
	if s.plog.Replicated() {
		end, read = s.plog.DurableEnd, s.plog.ReadLocal
	}
	for off := s.plog.LogStartOffset(); off < end(); {
		data, err := read(nil, off, replayReadBytes)
		if err != nil {
			return fmt.Errorf("load %s-%d at offset %d: %w", group.OffsetsTopic, s.partition, off, err)
		}
		if len(data) == 0 {
			break
		}
		err = batch.Split(data, func(b []byte, h batch.Header) error {
			off = h.NextOffset()
			n, err := s.loadBatch(b, h)
			bad += n
			return err
		})
		if err != nil {
			return fmt.Errorf("load %s-%d at offset %d: %w", group.OffsetsTopic, s.partition, off, err)
		}
	}
	if bad > 0 {
		s.log.Error("group coordinator skipped records it could not load", "partition", s.partition, "records", bad)
	}
	return nil
}

// Close stops the timer goroutine. Appends in flight complete on the store's goroutines.
func (gc *GroupCoordinator) Close() {
	gc.closeOnce.Do(func() { close(gc.stop); gc.b.tel.ObserveGroups(nil); gc.b.SetOffsetsMarkers(nil) })
	gc.wg.Wait()
}

// loop follows metadata changes at once and runs the cores' timers every TickInterval.
func (gc *GroupCoordinator) loop() {
	defer gc.wg.Done()
	t := time.NewTicker(gc.cfg.TickInterval)
	defer t.Stop()
	for {
		changed := gc.b.md.Changed()
		select {
		case <-gc.stop:
			return
		case <-changed:
			now := time.Now()
			gc.syncTopics(now)
			gc.follow(now)
		case now := <-t.C:
			gc.syncTopics(now)
			gc.follow(now)
			for _, s := range gc.loadedShards() {
				s.mu.Lock()
				if s.failed == nil {
					if recs := s.core.Tick(now); len(recs) > 0 {
						s.submit(recs, now)
						gc.observeShard(s, now, false)
					}
				}
				s.mu.Unlock()
			}
		}
	}
}

// topicInfos returns the node's topics as the cores need them.
func (gc *GroupCoordinator) topicInfos() map[string]group.TopicInfo {
	out := map[string]group.TopicInfo{}
	for _, t := range gc.b.md.Image().TopicList() {
		out[t.Name] = group.TopicInfo{ID: t.ID, Partitions: t.Partitions, Internal: t.Internal}
	}
	return out
}

// syncTopics tells every core about topics created, deleted or grown since the last time. It runs on
// every tick, and before joins and subscription changes so a topic created just before is seen.
func (gc *GroupCoordinator) syncTopics(now time.Time) {
	gc.topicsMu.Lock()
	defer gc.topicsMu.Unlock()
	topics := gc.topicInfos()
	if maps.Equal(topics, gc.topics) {
		return
	}
	gc.topics = topics
	for _, s := range gc.loadedShards() {
		s.mu.Lock()
		if s.failed == nil {
			if recs := s.core.SetTopics(now, topics); len(recs) > 0 {
				s.submit(recs, now)
				gc.observeShard(s, now, false)
			}
		}
		s.mu.Unlock()
	}
}

// submit encodes recs as batches (one per run of records of one producer: encodeGroupRecords) and
// appends them fsynced (acks=all). Called with s.mu held, so appends reach the log in the order the core
// made them.
func (s *groupShard) submit(recs []group.Record, now time.Time) *groupWrite {
	return s.appendWrite(encodeGroupRecords(recs, now.UnixMilli()), recs)
}

// appendWrite appends data, the encoding of recs, as the shard's next write. Called with s.mu held.
func (s *groupShard) appendWrite(data []byte, recs []group.Record) *groupWrite {
	w := &groupWrite{recs: recs, base: -1, applied: make(chan struct{})}
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
func (s *groupShard) complete(w *groupWrite, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.done, w.err = true, err
	for len(s.queue) > 0 && s.queue[0].done {
		head := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		switch {
		case head.err != nil && s.failed == nil:
			s.failed = head.err
			s.log.Error("writing group state failed; the partition's groups are reloaded from its log",
				"partition", s.partition, "err", head.err)
		case head.err == nil && s.failed == nil:
			s.core.Apply(head.recs)
			s.noteTxnWrite(head)
		}
		close(head.applied)
	}
}

func coordinatorUnavailable(partition int32, err error) error {
	return rerr.New(runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE, "group state of %s-%d: %v", group.OffsetsTopic, partition, err)
}

// do runs fn on the core with the shard locked, appends the records it returns and waits until they
// are durable and applied. A call that writes nothing waits for the writes before it, so it never
// answers with state that a crash could take back.
func (s *groupShard) do(ctx context.Context, now time.Time, fn func(c *group.Coordinator) ([]group.Record, error)) error {
	s.mu.Lock()
	if s.failed != nil {
		s.mu.Unlock()
		return coordinatorUnavailable(s.partition, s.failed)
	}
	recs, err := fn(s.core)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	var w *groupWrite
	if len(recs) > 0 {
		w = s.submit(recs, now)
	} else if n := len(s.queue); n > 0 {
		w = s.queue[n-1]
	}
	s.mu.Unlock()
	return s.await(ctx, w)
}

// await waits until w (nil: nothing) is durable and applied.
func (s *groupShard) await(ctx context.Context, w *groupWrite) error {
	if w == nil {
		return nil
	}
	select {
	case <-w.applied:
		if w.err != nil {
			return coordinatorUnavailable(s.partition, w.err)
		}
		return nil
	case <-ctx.Done():
		return rerr.New(runnelv1.ErrorCode_REQUEST_TIMED_OUT, "waiting for the group state to be written: %v", ctx.Err())
	}
}

// read runs fn on the core with the shard locked.
func (s *groupShard) read(fn func(c *group.Coordinator)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(s.core)
}

// shard returns the shard of groupID. Errors: NOT_COORDINATOR naming the leader of the group's
// partition when another node leads it, COORDINATOR_NOT_AVAILABLE when the partition has no leader or
// the topic does not exist yet, COORDINATOR_LOAD_IN_PROGRESS while this node loads it.
func (gc *GroupCoordinator) shard(groupID string) (*groupShard, error) {
	t, ok := gc.b.md.Image().Topic(group.OffsetsTopic)
	if !ok {
		return nil, rerr.New(runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE, "%s does not exist yet (it is created once the cluster's brokers are up)", group.OffsetsTopic)
	}
	p := group.PartitionFor(groupID, t.Partitions)
	st, _ := t.Partition(p)
	switch st.Leader {
	case gc.b.cfg.NodeID:
	case meta.NoLeader:
		return nil, rerr.New(runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE, "%s-%d, which holds group %q, has no leader", group.OffsetsTopic, p, groupID)
	default:
		return nil, &rerr.Error{Code: runnelv1.ErrorCode_NOT_COORDINATOR, LeaderID: st.Leader, LeaderEpoch: st.LeaderEpoch,
			Message: fmt.Sprintf("broker %d coordinates group %q (it leads %s-%d), not broker %d", st.Leader, groupID, group.OffsetsTopic, p, gc.b.cfg.NodeID)}
	}
	gc.shardsMu.RLock()
	s := gc.shards[p]
	gc.shardsMu.RUnlock()
	if s == nil || s.leaderEpoch != st.LeaderEpoch {
		return nil, rerr.New(runnelv1.ErrorCode_COORDINATOR_LOAD_IN_PROGRESS, "group %q: %s-%d is being loaded", groupID, group.OffsetsTopic, p)
	}
	return s, nil
}

// Heartbeat implements runnelv1.GroupsServer; see group.Coordinator.Heartbeat. Errors are gRPC
// statuses with an ErrorInfo detail.
func (gc *GroupCoordinator) Heartbeat(ctx context.Context, req *runnelv1.GroupHeartbeatRequest) (*runnelv1.GroupHeartbeatResponse, error) {
	now := time.Now()
	if req.MemberEpoch == group.JoinEpoch || !req.SubscriptionUnchanged {
		gc.syncTopics(now)
	}
	client := group.ClientInfo{ClientID: clientID(ctx), ClientHost: peerHost(ctx)}
	var resp *runnelv1.GroupHeartbeatResponse
	s, err := gc.shard(req.GroupId)
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	err = s.do(ctx, now, func(c *group.Coordinator) ([]group.Record, error) {
		r, recs, err := c.Heartbeat(now, req, client)
		gc.observeGroup(c, req.GroupId, now)
		resp = r
		return recs, err
	})
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	return resp, nil
}

// CommitOffsets implements runnelv1.GroupsServer; see group.Coordinator.Commit. It answers once the
// commits are fsynced; per-partition refusals are in the results.
func (gc *GroupCoordinator) CommitOffsets(ctx context.Context, req *runnelv1.CommitOffsetsRequest) (*runnelv1.CommitOffsetsResponse, error) {
	now := time.Now()
	logEnd := gc.logEnd
	var resp *runnelv1.CommitOffsetsResponse
	s, err := gc.shard(req.GroupId)
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	err = s.do(ctx, now, func(c *group.Coordinator) ([]group.Record, error) {
		r, recs, err := c.Commit(now, req, logEnd)
		resp = r
		return recs, err
	})
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	return resp, nil
}

// FetchOffsets implements runnelv1.GroupsServer: durable committed offsets, -1 where none.
func (gc *GroupCoordinator) FetchOffsets(_ context.Context, req *runnelv1.FetchOffsetsRequest) (*runnelv1.FetchOffsetsResponse, error) {
	var resp *runnelv1.FetchOffsetsResponse
	s, err := gc.shard(req.GroupId)
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	s.read(func(c *group.Coordinator) { resp, err = c.FetchOffsets(req) })
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	return resp, nil
}

// ListGroups implements runnelv1.GroupsServer: every group with members or committed offsets.
func (gc *GroupCoordinator) ListGroups(context.Context, *runnelv1.ListGroupsRequest) (*runnelv1.ListGroupsResponse, error) {
	resp := &runnelv1.ListGroupsResponse{}
	for _, s := range gc.loadedShards() {
		s.read(func(c *group.Coordinator) { resp.Groups = append(resp.Groups, c.List()...) })
	}
	for _, g := range resp.Groups {
		g.CoordinatorId = gc.b.cfg.NodeID
	}
	slices.SortFunc(resp.Groups, func(a, b *runnelv1.GroupSummary) int {
		switch {
		case a.GroupId < b.GroupId:
			return -1
		case a.GroupId > b.GroupId:
			return 1
		}
		return 0
	})
	return resp, nil
}

// DescribeGroups implements runnelv1.GroupsServer. An empty list describes every group. Unknown groups
// carry GROUP_ID_NOT_FOUND in their description.
func (gc *GroupCoordinator) DescribeGroups(ctx context.Context, req *runnelv1.DescribeGroupsRequest) (*runnelv1.DescribeGroupsResponse, error) {
	ids := req.GroupIds
	if len(ids) > maxGroupsPerRequest {
		return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%d group ids, at most %d", len(ids), maxGroupsPerRequest))
	}
	if len(ids) == 0 {
		list, _ := gc.ListGroups(ctx, nil)
		for _, g := range list.Groups {
			ids = append(ids, g.GroupId)
		}
	}
	resp := &runnelv1.DescribeGroupsResponse{}
	for _, id := range ids {
		var d *runnelv1.GroupDescription
		s, err := gc.shard(id)
		if err != nil {
			d = &runnelv1.GroupDescription{GroupId: id, Error: rerr.ToInfo(err), CoordinatorId: -1}
			if e := (*rerr.Error)(nil); errors.As(err, &e) && e.Code == runnelv1.ErrorCode_NOT_COORDINATOR {
				d.CoordinatorId = e.LeaderID
			}
			resp.Groups = append(resp.Groups, d)
			continue
		}
		s.read(func(c *group.Coordinator) { d = c.Describe(id) })
		d.CoordinatorId = gc.b.cfg.NodeID
		resp.Groups = append(resp.Groups, d)
	}
	return resp, nil
}

// DeleteGroups implements runnelv1.GroupsServer: each empty group and its committed offsets are
// deleted (tombstones, fsynced before the answer); others get NON_EMPTY_GROUP or GROUP_ID_NOT_FOUND.
func (gc *GroupCoordinator) DeleteGroups(ctx context.Context, req *runnelv1.DeleteGroupsRequest) (*runnelv1.DeleteGroupsResponse, error) {
	if len(req.GroupIds) > maxGroupsPerRequest {
		return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%d group ids, at most %d", len(req.GroupIds), maxGroupsPerRequest))
	}
	resp := &runnelv1.DeleteGroupsResponse{}
	for _, id := range req.GroupIds {
		now := time.Now()
		s, err := gc.shard(id)
		if err == nil {
			err = s.do(ctx, now, func(c *group.Coordinator) ([]group.Record, error) { return c.DeleteGroup(now, id) })
		}
		resp.Groups = append(resp.Groups, &runnelv1.GroupResult{GroupId: id, Error: rerr.ToInfo(err)})
		if err == nil {
			gc.b.tel.GroupDeleted(id)
			gc.log.Info("group deleted", "group", id)
		}
	}
	return resp, nil
}

// peerHost returns the client's address without the port, for DescribeGroups.
// clientID returns the client's id for DescribeGroups: the SDK sends it (WithClientID) as the gRPC user
// agent, to which grpc-go appends its own " grpc-go/x.y.z", removed here. "" when there is none.
func clientID(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	ua := md.Get("user-agent")
	if len(ua) == 0 {
		return ""
	}
	id := ua[0]
	if i := strings.LastIndex(id, " grpc-go/"); i >= 0 {
		id = id[:i]
	} else if strings.HasPrefix(id, "grpc-go/") {
		id = "" // grpc-go's own agent: the client named itself nothing
	}
	return id
}

func peerHost(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		return p.Addr.String()
	}
	return host
}

// checkWritable refuses produce requests to internal topics such as __consumer_offsets: only the broker
// writes them, and a foreign record there would be loaded as group state.
func checkWritable(t *meta.Topic) error {
	if t.Internal {
		return rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "topic %q is internal: only the broker writes to it", t.Name)
	}
	return nil
}
