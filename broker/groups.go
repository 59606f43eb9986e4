package broker

import (
	"context"
	"errors"
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
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// maxGroupsPerRequest caps the group ids of one DescribeGroups or DeleteGroups.
const maxGroupsPerRequest = 10_000

// DefaultOffsetsReplicationFactor is the replication factor of __consumer_offsets (Kafka's
// offsets.topic.replication.factor), capped at the number of brokers when the cluster is smaller.
const DefaultOffsetsReplicationFactor = 3

// groupShard is one __consumer_offsets partition and the core that owns its groups; its codec is a
// *groupCodec (groups_txn.go).
type groupShard = stateShard[group.Record, *group.Coordinator]

// GroupCoordinator serves the Groups gRPC service: the thin shell around one group.Coordinator per
// partition of __consumer_offsets that this node leads (all of them on a single node). Per partition it
// serialises calls to the core, appends the records a call produced to the partition with acks=all
// semantics (fsynced), hands them back to the core once durable, and only then answers
// (stateshard.go). One goroutine follows the metadata: it loads a partition's groups when this node
// becomes its leader and drops them when it stops leading it; it also drives the cores' timers (Tick)
// and tells them about topic changes. See broker/group's doc.go.
type GroupCoordinator struct {
	runnelv1.UnimplementedGroupsServer

	b      *Broker
	cfg    group.Config
	log    *slog.Logger
	shards *stateShards[group.Record, *group.Coordinator] // the __consumer_offsets partitions led here

	topicsMu sync.Mutex
	topics   map[string]group.TopicInfo // what the cores were last told

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
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
	gc := &GroupCoordinator{b: b, cfg: cfg, log: logger, stop: make(chan struct{})}
	gc.shards = &stateShards[group.Record, *group.Coordinator]{b: b, topic: group.OffsetsTopic, what: "group",
		partitions: cfg.OffsetsTopicPartitions, log: logger, newCore: func() *group.Coordinator { return group.New(cfg) },
		newCodec: func() stateCodec[group.Record] { return &groupCodec{txnFirst: map[int64]int64{}} },
		shards:   map[int32]*groupShard{}, loaded: gc.start}
	gc.topics = gc.topicInfos()
	gc.shards.follow(time.Now())
	b.tel.ObserveGroups(gc.reportGroups)
	b.SetOffsetsMarkers(gc) // WriteTxnMarkers hands __consumer_offsets partitions here (groups_txn.go)
	gc.wg.Add(1)
	go gc.loop()
	return gc, nil
}

// start starts the groups of a shard just replayed, s.mu held, before it serves: the core learns the
// topics the cores were last told (Start), what that writes is appended, and the groups are reported.
// It takes topicsMu under s.mu, the reverse of syncTopics, safely: s is not in the shards yet, so
// syncTopics cannot be waiting for it.
func (gc *GroupCoordinator) start(s *groupShard, now time.Time) {
	gc.topicsMu.Lock()
	topics := gc.topics
	gc.topicsMu.Unlock()
	if recs := s.core.Start(now, topics); len(recs) > 0 {
		s.submit(recs, now)
	}
	gc.observeShard(s, now, true)
}

// Loaded reports whether __consumer_offsets exists and every partition of it this node leads is
// loaded, so group calls for those partitions are served rather than answered
// COORDINATOR_LOAD_IN_PROGRESS.
func (gc *GroupCoordinator) Loaded() bool { return gc.shards.Loaded() }

// loadedShards returns the shards loaded now, by partition.
func (gc *GroupCoordinator) loadedShards() []*groupShard { return gc.shards.list() }

// Close stops the timer goroutine. Appends in flight complete on the store's goroutines.
func (gc *GroupCoordinator) Close() {
	gc.closeOnce.Do(func() { close(gc.stop); gc.b.tel.ObserveGroups(nil); gc.b.SetOffsetsMarkers(nil) })
	gc.wg.Wait()
}

// loop follows metadata changes, and the replication layer's taking up of leaderships, at once and
// runs the cores' timers every TickInterval.
func (gc *GroupCoordinator) loop() {
	defer gc.wg.Done()
	t := time.NewTicker(gc.cfg.TickInterval)
	defer t.Stop()
	led := gc.b.repl.ledChanged() // renewed only once it fired, so a leadership taken up meanwhile is seen
	for {
		changed := gc.b.md.Changed()
		select {
		case <-gc.stop:
			return
		case <-changed:
			now := time.Now()
			gc.syncTopics(now)
			gc.shards.follow(now)
		case <-led:
			led = gc.b.repl.ledChanged()
			gc.shards.follow(time.Now())
		case now := <-t.C:
			gc.syncTopics(now)
			gc.shards.follow(now)
			for _, s := range gc.loadedShards() {
				gc.background(s, now, func(c *group.Coordinator) []group.Record { return c.Tick(now) })
			}
		}
	}
}

// background runs fn, a call of the core no client made (Tick, SetTopics), on s unless s failed, and
// appends what it returns without waiting. When fn wrote, every group of s is reported: such a call
// may remove members or bump epochs of any of them.
func (gc *GroupCoordinator) background(s *groupShard, now time.Time, fn func(c *group.Coordinator) []group.Record) {
	s.tick(now, func(c *group.Coordinator) []group.Record {
		recs := fn(c)
		if len(recs) > 0 {
			gc.observeShard(s, now, false) // s.mu held, as observeShard needs
		}
		return recs
	})
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
		gc.background(s, now, func(c *group.Coordinator) []group.Record { return c.SetTopics(now, topics) })
	}
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
	s, err := gc.shards.shard(req.GroupId)
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
	s, err := gc.shards.shard(req.GroupId)
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
	s, err := gc.shards.shard(req.GroupId)
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
		s, err := gc.shards.shard(id)
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
		s, err := gc.shards.shard(id)
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
