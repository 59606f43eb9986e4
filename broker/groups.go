package broker

import (
	"context"
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

// replayReadBytes is how much of a __consumer_offsets partition one read takes while loading.
const replayReadBytes = 4 << 20

// GroupCoordinator serves the Groups gRPC service: the thin shell around one group.Coordinator per
// partition of __consumer_offsets (all of them lead here on a single node). Per partition it
// serialises calls to the core, appends the records a call produced to the partition with acks=all
// semantics (fsynced), hands them back to the core once durable, and only then answers; one goroutine
// drives the cores' timers (Tick) and tells them about topic changes. See broker/group's doc.go.
type GroupCoordinator struct {
	runnelv1.UnimplementedGroupsServer

	b      *Broker
	cfg    group.Config
	log    *slog.Logger
	shards []*groupShard

	topicsMu sync.Mutex
	topics   map[string]group.TopicInfo // what the cores were last told

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// groupShard is one __consumer_offsets partition and the core that owns its groups.
type groupShard struct {
	partition int32
	plog      *plog.Partition
	log       *slog.Logger

	mu     sync.Mutex
	core   *group.Coordinator
	queue  []*groupWrite // appended and not yet applied, in log order
	failed error         // a write failed: the core's memory is ahead of the log; refuse until restart
}

// groupWrite is one append of records to the shard's partition.
type groupWrite struct {
	recs    []group.Record
	done    bool
	err     error
	applied chan struct{} // closed once the records are durable and applied (or failed)
}

// NewGroupCoordinator creates __consumer_offsets if it is missing (cfg.OffsetsTopicPartitions
// partitions, cleanup.policy=compact, internal), rebuilds every partition's groups and committed offsets
// from the partition, and starts the timer goroutine. Close stops it.
func NewGroupCoordinator(b *Broker, cfg group.Config, logger *slog.Logger) (*GroupCoordinator, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	gc := &GroupCoordinator{b: b, cfg: cfg, log: logger, stop: make(chan struct{})}
	t, ok := b.meta.Get(group.OffsetsTopic)
	if !ok {
		var err error
		t, err = b.createTopic(meta.Spec{Name: group.OffsetsTopic, Partitions: cfg.OffsetsTopicPartitions, Internal: true,
			Configs: map[string]string{topiccfg.CleanupPolicy: "compact"}})
		if err != nil {
			return nil, fmt.Errorf("create %s: %w", group.OffsetsTopic, err)
		}
		logger.Info("topic created", "topic", t.Name, "partitions", t.Partitions, "internal", true)
	} else if !t.Internal {
		logger.Warn("the group coordinator uses a topic that was not created as internal", "topic", t.Name)
	}
	b.mu.RLock()
	parts := b.parts[group.OffsetsTopic]
	b.mu.RUnlock()
	start := time.Now()
	gc.topics = gc.topicInfos()
	for i, p := range parts {
		s := &groupShard{partition: int32(i), plog: p, log: logger, core: group.New(cfg)}
		if err := s.replay(); err != nil {
			return nil, err
		}
		s.mu.Lock()
		if recs := s.core.Start(start, gc.topics); len(recs) > 0 {
			s.submit(recs, start)
		}
		gc.observeShard(s, start, true)
		s.mu.Unlock()
		gc.shards = append(gc.shards, s)
	}
	logger.Info("group coordinator loaded", "partitions", len(parts), "took", time.Since(start).Round(time.Millisecond))
	b.tel.ObserveGroups(gc.reportGroups)
	gc.wg.Add(1)
	go gc.tickLoop()
	return gc, nil
}

// replay feeds every record of the partition, from its log start to its HW, to the core.
func (s *groupShard) replay() error {
	bad := 0
	for off := s.plog.LogStartOffset(); off < s.plog.HighWatermark(); {
		data, err := s.plog.Read(nil, off, replayReadBytes)
		if err != nil {
			return fmt.Errorf("load %s-%d at offset %d: %w", group.OffsetsTopic, s.partition, off, err)
		}
		if len(data) == 0 {
			break
		}
		err = batch.Split(data, func(b []byte, h batch.Header) error {
			off = h.NextOffset()
			if h.IsControl() {
				return nil
			}
			_, err := batch.DecodeBatch(b, func(r batch.Record) error {
				if err := s.core.Load(group.Record{Key: r.Key, Value: r.Value}); err != nil {
					bad++
				}
				return nil
			})
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
	gc.closeOnce.Do(func() { close(gc.stop); gc.b.tel.ObserveGroups(nil) })
	gc.wg.Wait()
}

func (gc *GroupCoordinator) tickLoop() {
	defer gc.wg.Done()
	t := time.NewTicker(gc.cfg.TickInterval)
	defer t.Stop()
	for {
		select {
		case <-gc.stop:
			return
		case now := <-t.C:
			gc.syncTopics(now)
			for _, s := range gc.shards {
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
	for _, t := range gc.b.meta.List() {
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
	for _, s := range gc.shards {
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

// submit encodes recs as one batch and appends it fsynced (acks=all). Called with s.mu held, so
// appends reach the log in the order the core made them.
func (s *groupShard) submit(recs []group.Record, now time.Time) *groupWrite {
	var b batch.Builder
	ts := now.UnixMilli()
	for _, r := range recs {
		b.Append(ts, r.Key, r.Value, nil)
	}
	w := &groupWrite{recs: recs, applied: make(chan struct{})}
	s.queue = append(s.queue, w)
	// The builder is dropped here, so the built bytes are ours to hand to plog.
	s.plog.AppendAsync(b.Build(batch.CompressionNone), plog.AppendOptions{Sync: true, LogAppendTime: -1},
		func(_ plog.AppendResult, err error) { s.complete(w, err) })
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
			s.log.Error("writing group state failed; the partition's groups are unavailable until restart",
				"partition", s.partition, "err", head.err)
		case head.err == nil && s.failed == nil:
			s.core.Apply(head.recs)
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

func (gc *GroupCoordinator) shard(groupID string) *groupShard {
	return gc.shards[group.PartitionFor(groupID, int32(len(gc.shards)))]
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
	err := gc.shard(req.GroupId).do(ctx, now, func(c *group.Coordinator) ([]group.Record, error) {
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
	logEnd := func(topic string, partition int32) (int64, bool) {
		_, p, err := gc.b.partition(topic, partition)
		if err != nil {
			return 0, false
		}
		return p.LogEndOffset(), true
	}
	var resp *runnelv1.CommitOffsetsResponse
	err := gc.shard(req.GroupId).do(ctx, now, func(c *group.Coordinator) ([]group.Record, error) {
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
	var err error
	gc.shard(req.GroupId).read(func(c *group.Coordinator) { resp, err = c.FetchOffsets(req) })
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	return resp, nil
}

// ListGroups implements runnelv1.GroupsServer: every group with members or committed offsets.
func (gc *GroupCoordinator) ListGroups(context.Context, *runnelv1.ListGroupsRequest) (*runnelv1.ListGroupsResponse, error) {
	resp := &runnelv1.ListGroupsResponse{}
	for _, s := range gc.shards {
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
		gc.shard(id).read(func(c *group.Coordinator) { d = c.Describe(id) })
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
		err := gc.shard(id).do(ctx, now, func(c *group.Coordinator) ([]group.Record, error) { return c.DeleteGroup(now, id) })
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
