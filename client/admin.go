package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// Admin manages topics and reads cluster metadata and offsets. Every call retries failures of the whole
// call that may be transient (a broker unreachable, say) within the request timeout and ctx; an answer
// about a topic, such as TOPIC_ALREADY_EXISTS or UNKNOWN_TOPIC_OR_PARTITION, is returned at once.
// Errors are catalogue errors: compare with errors.Is against the rerr sentinels. Safe for concurrent
// use.
type Admin struct {
	cfg adminConfig
	cl  *cluster

	// home is the broker the admin calls go to while it answers. Brokers apply metadata changes at
	// their own pace, so calls rotated over brokers could see a topic created by the previous call
	// missing; one broker applies a change it committed before answering, which gives an Admin
	// read-your-writes (a broker that fails is replaced by the next one, where it may not hold).
	homeMu sync.Mutex
	home   string
}

// TopicSummary is one topic in ListTopics.
type TopicSummary struct {
	Name              string
	TopicID           string // unique over the cluster's life: a topic created again gets a new one
	Partitions        int32
	ReplicationFactor int32
	Internal          bool
}

// TopicDescription is a topic in detail, from DescribeTopic.
type TopicDescription struct {
	Name              string
	TopicID           string
	ReplicationFactor int32
	Internal          bool
	Configs           []ConfigEntry // every topic config with its effective value
	Partitions        []PartitionDescription
}

// ConfigEntry is one topic config.
type ConfigEntry struct {
	Name  string
	Value string
	// IsDefault is true when the topic does not set it and the broker default applies.
	IsDefault bool
}

// PartitionDescription is one partition of a TopicDescription. Offsets are record offsets; sizes bytes.
type PartitionDescription struct {
	Partition      int32
	LeaderID       int32 // -1 when there is no leader
	LeaderEpoch    int32
	Replicas       []int32
	ISR            []int32 // in-sync replicas
	LogStartOffset int64
	HighWatermark  int64
	LogEndOffset   int64
	SizeBytes      int64
	// ReassigningTo is the replica list a running reassignment moves the partition to; nil when none.
	ReassigningTo []int32
	// Stats are the partition's produce rates on its leader, from DescribeTopicWithStats; nil from
	// DescribeTopic, or when the broker keeps none (its telemetry is disabled).
	Stats *PartitionStats
}

// PartitionStats are the bytes and records appended to a partition, counted per wall-clock minute by
// the broker that answered (the leader) since it started: what shows a hot partition
// (docs/hot-keys.md). Bytes are record batches as produced (compressed, headers included).
type PartitionStats struct {
	// LastMinute and LastFiveMinutes are rates estimated from the per-minute counts, the oldest minute
	// weighted by the part of it inside the window.
	LastMinute, LastFiveMinutes PartitionRate
	// BytesInPerMinute and RecordsInPerMinute are counts per minute, newest first: [0] is the current,
	// partial minute, [1] to [5] the five before it.
	BytesInPerMinute, RecordsInPerMinute []int64
	// BytesInTotal and RecordsInTotal count every append since the broker started.
	BytesInTotal, RecordsInTotal int64
	// Window is what LastFiveMinutes covers: five minutes, or less just after the broker started.
	Window time.Duration
}

// PartitionRate is what was appended to a partition per second over a window.
type PartitionRate struct {
	BytesPerSec, RecordsPerSec float64
}

// NewAdmin returns an admin client for the cluster reachable at brokers. It validates the options and
// connects lazily.
func NewAdmin(brokers []string, opts ...AdminOption) (*Admin, error) {
	cfg, err := newAdminConfig(opts)
	if err != nil {
		return nil, err
	}
	cl, err := newCluster(brokers, cfg.common)
	if err != nil {
		return nil, err
	}
	return &Admin{cfg: cfg, cl: cl}, nil
}

// Close closes the connections. Calls in progress fail.
func (a *Admin) Close() error { return a.cl.close() }

func (a *Admin) admin(ctx context.Context, fn func(ctx context.Context, c runnelv1.AdminClient) error) error {
	return unfinal(a.onHome(ctx, func(ctx context.Context, cc *grpc.ClientConn) error {
		return fn(ctx, runnelv1.NewAdminClient(cc))
	}))
}

// onHome calls fn with the home broker's connection, retrying (on another broker after a retriable
// failure) within the request timeout.
func (a *Admin) onHome(ctx context.Context, fn func(ctx context.Context, cc *grpc.ClientConn) error) error {
	return a.cl.retry(ctx, func(ctx context.Context) error {
		addr := a.homeAddr()
		cc, err := a.cl.dial(addr)
		if err != nil {
			return err
		}
		err = fn(ctx, cc)
		if err != nil && retriable(err) {
			a.leaveHome(addr)
		}
		return err
	})
}

// homeAddr returns the home broker, choosing one when there is none.
func (a *Admin) homeAddr() string {
	a.homeMu.Lock()
	defer a.homeMu.Unlock()
	if a.home == "" {
		a.home = a.cl.anyAddr()
	}
	return a.home
}

// leaveHome drops addr as the home broker after a retriable failure there, so the retry goes elsewhere.
func (a *Admin) leaveHome(addr string) {
	a.homeMu.Lock()
	defer a.homeMu.Unlock()
	if a.home == addr {
		a.home = ""
	}
}

// topicErr returns the error of a per-topic result, marked final so it is not retried.
func topicErr(info *runnelv1.ErrorInfo) error {
	if err := rerr.FromInfo(info); err != nil {
		return final{err}
	}
	return nil
}

// CreateTopic creates a topic with partitions and replicationFactor (0 or less: the broker defaults)
// and configs (Kafka's names, e.g. "retention.ms"), and returns its topic id. An existing topic gives
// rerr.ErrTopicAlreadyExists; bad arguments INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS,
// INVALID_REPLICATION_FACTOR or INVALID_CONFIG.
func (a *Admin) CreateTopic(ctx context.Context, name string, partitions, replicationFactor int32, configs map[string]string) (string, error) {
	var id string
	err := a.admin(ctx, func(ctx context.Context, c runnelv1.AdminClient) error {
		resp, err := c.CreateTopics(ctx, &runnelv1.CreateTopicsRequest{Topics: []*runnelv1.NewTopic{
			{Name: name, Partitions: partitions, ReplicationFactor: replicationFactor, Configs: configs}}})
		if err != nil {
			return wireErr(err)
		}
		r, err := oneTopic(resp.Topics, name, func(t *runnelv1.TopicResult) string { return t.Name })
		if err != nil {
			return err
		}
		id = r.TopicId
		return topicErr(r.Error)
	})
	return id, err
}

// DeleteTopic deletes a topic and its records. An unknown topic gives rerr.ErrUnknownTopicOrPartition.
func (a *Admin) DeleteTopic(ctx context.Context, name string) error {
	return a.admin(ctx, func(ctx context.Context, c runnelv1.AdminClient) error {
		resp, err := c.DeleteTopics(ctx, &runnelv1.DeleteTopicsRequest{Topics: []string{name}})
		if err != nil {
			return wireErr(err)
		}
		r, err := oneTopic(resp.Topics, name, func(t *runnelv1.TopicResult) string { return t.Name })
		if err != nil {
			return err
		}
		return topicErr(r.Error)
	})
}

// ListTopics lists the topics, internal ones (such as __consumer_offsets) only when includeInternal.
func (a *Admin) ListTopics(ctx context.Context, includeInternal bool) ([]TopicSummary, error) {
	var out []TopicSummary
	err := a.admin(ctx, func(ctx context.Context, c runnelv1.AdminClient) error {
		resp, err := c.ListTopics(ctx, &runnelv1.ListTopicsRequest{IncludeInternal: includeInternal})
		if err != nil {
			return wireErr(err)
		}
		out = make([]TopicSummary, 0, len(resp.Topics))
		for _, t := range resp.Topics {
			out = append(out, TopicSummary{Name: t.Name, TopicID: t.TopicId, Partitions: t.Partitions,
				ReplicationFactor: t.ReplicationFactor, Internal: t.Internal})
		}
		return nil
	})
	return out, err
}

// DescribeTopic returns a topic's configs and partitions. An unknown topic gives
// rerr.ErrUnknownTopicOrPartition.
func (a *Admin) DescribeTopic(ctx context.Context, name string) (*TopicDescription, error) {
	return a.describeTopic(ctx, name, false)
}

// DescribeTopicWithStats is DescribeTopic with each partition's produce rates (PartitionDescription.
// Stats) over the last minute and five minutes, to find hot partitions. It is a separate call because
// the broker computes the rates only when asked.
func (a *Admin) DescribeTopicWithStats(ctx context.Context, name string) (*TopicDescription, error) {
	return a.describeTopic(ctx, name, true)
}

func (a *Admin) describeTopic(ctx context.Context, name string, stats bool) (*TopicDescription, error) {
	var out *TopicDescription
	err := a.admin(ctx, func(ctx context.Context, c runnelv1.AdminClient) error {
		resp, err := c.DescribeTopics(ctx, &runnelv1.DescribeTopicsRequest{Topics: []string{name}, IncludeStats: stats})
		if err != nil {
			return wireErr(err)
		}
		t, err := oneTopic(resp.Topics, name, func(t *runnelv1.TopicDescription) string { return t.Name })
		if err != nil {
			return err
		}
		if err := topicErr(t.Error); err != nil {
			return err
		}
		d := &TopicDescription{Name: t.Name, TopicID: t.TopicId, ReplicationFactor: t.ReplicationFactor, Internal: t.Internal,
			Configs: configEntries(t.Configs)}
		for _, p := range t.Partitions {
			d.Partitions = append(d.Partitions, PartitionDescription{Partition: p.Partition, LeaderID: p.LeaderId,
				LeaderEpoch: p.LeaderEpoch, Replicas: p.Replicas, ISR: p.Isr, LogStartOffset: p.LogStartOffset,
				HighWatermark: p.HighWatermark, LogEndOffset: p.LogEndOffset, SizeBytes: p.SizeBytes, Stats: partitionStats(p.Stats),
				ReassigningTo: p.ReassigningTo})
		}
		out = d
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := a.leaderOffsets(ctx, out, stats); err != nil {
		return nil, err
	}
	return out, nil
}

// leaderOffsets replaces each partition's offsets, size and rates with those of its leader: a broker
// answers DescribeTopics with its own logs, and only the leader's are the partition's.
func (a *Admin) leaderOffsets(ctx context.Context, d *TopicDescription, stats bool) error {
	byLeader := map[int32][]int{}
	for i, p := range d.Partitions {
		if p.LeaderID >= 0 {
			byLeader[p.LeaderID] = append(byLeader[p.LeaderID], i)
		}
	}
	if _, err := a.cl.metadata(ctx, []string{d.Name}); err != nil {
		return err
	}
	for leader, idx := range byLeader {
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second) // a dead leader must not hold up the rest
		err := a.cl.retry(lctx, func(ctx context.Context) error {
			cc, err := a.cl.nodeConn(leader)
			if err != nil {
				return err
			}
			resp, err := runnelv1.NewAdminClient(cc).DescribeTopics(ctx, &runnelv1.DescribeTopicsRequest{Topics: []string{d.Name}, IncludeStats: stats})
			if err != nil {
				return wireErr(err)
			}
			t, err := oneTopic(resp.Topics, d.Name, func(t *runnelv1.TopicDescription) string { return t.Name })
			if err != nil {
				return err
			}
			if err := topicErr(t.Error); err != nil {
				return err
			}
			for _, i := range idx {
				if i < len(t.Partitions) && t.Partitions[i].Partition == d.Partitions[i].Partition {
					lp := t.Partitions[i]
					p := &d.Partitions[i]
					p.LogStartOffset, p.HighWatermark, p.LogEndOffset, p.SizeBytes = lp.LogStartOffset, lp.HighWatermark, lp.LogEndOffset, lp.SizeBytes
					p.Stats = partitionStats(lp.Stats)
				}
			}
			return nil
		})
		cancel()
		if err != nil {
			// A leader that does not answer (it just died; the controller has not moved its partitions
			// yet) leaves its partitions' offsets at -1 rather than failing the whole description.
			a.cfg.common.logger.Debug("describe on a partition leader failed", "topic", d.Name, "leader", leader, "err", err)
			for _, i := range idx {
				p := &d.Partitions[i]
				p.LogStartOffset, p.HighWatermark, p.LogEndOffset, p.SizeBytes, p.Stats = -1, -1, -1, 0, nil
			}
		}
	}
	return nil
}

func partitionStats(s *runnelv1.PartitionStats) *PartitionStats {
	if s == nil {
		return nil
	}
	rate := func(r *runnelv1.PartitionRate) PartitionRate {
		return PartitionRate{BytesPerSec: r.GetBytesInPerSec(), RecordsPerSec: r.GetRecordsInPerSec()}
	}
	return &PartitionStats{LastMinute: rate(s.LastMinute), LastFiveMinutes: rate(s.LastFiveMinutes),
		BytesInPerMinute: s.BytesInPerMinute, RecordsInPerMinute: s.RecordsInPerMinute,
		BytesInTotal: s.BytesInTotal, RecordsInTotal: s.RecordsInTotal, Window: time.Duration(s.WindowMs) * time.Millisecond}
}

// AlterTopicConfig sets configs of a topic and returns deleted ones to the broker default (as
// kafka-configs --alter --add-config/--delete-config), then returns every config with its effective
// value. Invalid values give rerr.ErrInvalidConfig and change nothing.
func (a *Admin) AlterTopicConfig(ctx context.Context, name string, set map[string]string, del []string) ([]ConfigEntry, error) {
	var out []ConfigEntry
	err := a.admin(ctx, func(ctx context.Context, c runnelv1.AdminClient) error {
		resp, err := c.AlterTopicConfigs(ctx, &runnelv1.AlterTopicConfigsRequest{Topic: name, Set: set, Delete: del})
		if err != nil {
			// The call fails as a whole for an unknown topic: that is the answer, not worth retrying.
			if err = wireErr(err); errors.Is(err, rerr.ErrUnknownTopicOrPartition) {
				return final{err}
			}
			return err
		}
		out = configEntries(resp.Configs)
		return nil
	})
	return out, err
}

// ListOffsets resolves spec for a partition: the log start offset (OffsetEarliest), the high watermark
// (OffsetLatest), or the first offset whose record timestamp is at or after a time (OffsetAfterTime;
// offset -1 when no record is that recent). ts is that record's timestamp in ms, or -1. OffsetAt(o)
// returns o as it is.
func (a *Admin) ListOffsets(ctx context.Context, topic string, partition int32, spec Offset) (offset, ts int64, err error) {
	return listOffsets(ctx, a.cl, topic, partition, spec, false, ReadUncommitted)
}

// PartitionLeader is a partition and its leader after an election.
type PartitionLeader struct {
	TopicPartition
	LeaderID    int32
	LeaderEpoch int32
}

// ElectLeaders moves the leadership of partitions back to their preferred replica (the first of their
// replica list) where it is alive and in the ISR, as kafka-leader-election --election-type PREFERRED
// does: topic "" means every topic, no partitions every partition of topic. It returns the partitions
// whose leader changed. An unknown topic or partition gives rerr.ErrUnknownTopicOrPartition.
func (a *Admin) ElectLeaders(ctx context.Context, topic string, partitions ...int32) ([]PartitionLeader, error) {
	var out []PartitionLeader
	err := a.admin(ctx, func(ctx context.Context, c runnelv1.AdminClient) error {
		resp, err := c.ElectLeaders(ctx, &runnelv1.ElectLeadersRequest{Topic: topic, Partitions: partitions})
		if err != nil {
			if err = wireErr(err); errors.Is(err, rerr.ErrUnknownTopicOrPartition) {
				return final{err}
			}
			return err
		}
		out = out[:0]
		for _, m := range resp.Moved {
			out = append(out, PartitionLeader{TopicPartition: TopicPartition{m.Topic, m.Partition}, LeaderID: m.LeaderId, LeaderEpoch: m.LeaderEpoch})
		}
		return nil
	})
	return out, err
}

// ReassignPartition starts moving topic's partition to replicas (the preferred leader first), as
// kafka-reassign-partitions does (KIP-455): the new replicas copy the log, and once they are all in the
// ISR the old ones are dropped and the leadership moves to a new one if needed. It returns once the
// move has started; DescribeTopic's ReassigningTo shows it running. Errors: UNKNOWN_TOPIC_OR_PARTITION,
// INVALID_REQUEST (a broker not registered, a replica twice, a move already running),
// INVALID_REPLICATION_FACTOR (fewer replicas than min.insync.replicas).
func (a *Admin) ReassignPartition(ctx context.Context, topic string, partition int32, replicas []int32) error {
	return a.admin(ctx, func(ctx context.Context, c runnelv1.AdminClient) error {
		resp, err := c.ReassignPartitions(ctx, &runnelv1.ReassignPartitionsRequest{Partitions: []*runnelv1.PartitionReassignment{
			{Topic: topic, Partition: partition, Replicas: replicas}}})
		if err != nil {
			return wireErr(err)
		}
		if len(resp.Partitions) != 1 {
			return rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "reassignment answer has %d results", len(resp.Partitions))
		}
		return topicErr(resp.Partitions[0].Error)
	})
}

// ClusterStatus describes the cluster as one node sees it: nodes and their roles, the controller
// leader, raft term and indexes, fenced brokers, offline and under-replicated partitions.
func (a *Admin) ClusterStatus(ctx context.Context) (*runnelv1.ClusterStatusResponse, error) {
	var out *runnelv1.ClusterStatusResponse
	err := a.onHome(ctx, func(ctx context.Context, cc *grpc.ClientConn) error {
		var err error
		out, err = runnelv1.NewClusterClient(cc).Status(ctx, &runnelv1.ClusterStatusRequest{})
		return wireErr(err)
	})
	return out, err
}

// Metadata returns the cluster's brokers and the topics' partitions with leaders and replicas (all
// topics when none is named). Per-topic errors are in the answer.
func (a *Admin) Metadata(ctx context.Context, topics ...string) (*runnelv1.MetadataResponse, error) {
	return a.cl.metadata(ctx, topics)
}

func configEntries(cs []*runnelv1.ConfigEntry) []ConfigEntry {
	out := make([]ConfigEntry, 0, len(cs))
	for _, c := range cs {
		out = append(out, ConfigEntry{Name: c.Name, Value: c.Value, IsDefault: c.IsDefault})
	}
	return out
}

// oneTopic finds name's result in an answer about one topic.
func oneTopic[T any](ts []T, name string, nameOf func(T) string) (T, error) {
	for _, t := range ts {
		if nameOf(t) == name {
			return t, nil
		}
	}
	var zero T
	return zero, rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "answer without a result for topic %q", name)
}

// listOffsets resolves spec with a ListOffsets call to the partition's leader. retryPartition also
// retries retriable per-partition errors (UNKNOWN_TOPIC_OR_PARTITION of a topic just created), within
// the request timeout; otherwise they are returned at once. A time with no record at or after it
// resolves to offset -1 for Admin, and to the high watermark for a consumer (retryPartition set). With
// ReadCommitted, LATEST is the last stable offset (a read_committed consumer's end).
func listOffsets(ctx context.Context, cl *cluster, topic string, partition int32, spec Offset, retryPartition bool, iso IsolationLevel) (int64, int64, error) {
	lp := &runnelv1.ListOffsetsPartition{Topic: topic, Partition: partition}
	switch spec.kind {
	case offsetExact:
		return spec.at, -1, nil
	case offsetEarliest:
		lp.Spec = runnelv1.OffsetSpec_EARLIEST
	case offsetLatest:
		lp.Spec = runnelv1.OffsetSpec_LATEST
	case offsetTime:
		lp.Spec, lp.Timestamp = runnelv1.OffsetSpec_TIMESTAMP, spec.at
	}
	var res *runnelv1.ListOffsetsPartitionResult
	err := cl.retry(ctx, func(ctx context.Context) error {
		leader := cl.leader(topic, partition)
		if leader < 0 {
			if _, err := cl.metadataOnce(ctx, []string{topic}); err != nil {
				return err
			}
			leader = cl.leader(topic, partition) // still -1 if unknown: then any broker is asked
		}
		cc, err := cl.nodeConn(leader)
		if err != nil {
			return err
		}
		resp, err := runnelv1.NewRecordsClient(cc).ListOffsets(ctx, &runnelv1.ListOffsetsRequest{Partitions: []*runnelv1.ListOffsetsPartition{lp}, IsolationLevel: iso.proto()})
		if err != nil {
			return wireErr(err)
		}
		for _, r := range resp.Partitions {
			if r.Topic == topic && r.Partition == partition {
				if err := rerr.FromInfo(r.Error); err != nil {
					if !retryPartition || !retriable(err) {
						return final{err}
					}
					_, _ = cl.metadataOnce(ctx, []string{topic}) // the leader may have moved
					return err
				}
				res = r
				return nil
			}
		}
		return rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "ListOffsets answer without %s-%d", topic, partition)
	})
	if err != nil {
		return -1, -1, fmt.Errorf("list offsets of %s-%d (%v): %w", topic, partition, spec, unfinal(err))
	}
	if spec.kind == offsetTime && res.Offset < 0 && retryPartition {
		return listOffsets(ctx, cl, topic, partition, OffsetLatest(), retryPartition, iso)
	}
	return res.Offset, res.Timestamp, nil
}
