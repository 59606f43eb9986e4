package broker

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/topiccfg"
)

// CreateTopics implements runnelv1.AdminServer. Each topic succeeds or fails on its own; a created
// topic is in this node's metadata when the call returns, so a Metadata call to it that follows finds it.
func (b *Broker) CreateTopics(ctx context.Context, req *runnelv1.CreateTopicsRequest) (*runnelv1.CreateTopicsResponse, error) {
	resp := &runnelv1.CreateTopicsResponse{}
	for _, nt := range req.Topics {
		r := &runnelv1.TopicResult{Name: nt.Name}
		resp.Topics = append(resp.Topics, r)
		spec := meta.Spec{Name: nt.Name, Partitions: nt.Partitions, ReplicationFactor: nt.ReplicationFactor, Configs: nt.Configs}
		if req.ValidateOnly {
			if _, err := b.md.Image().ValidateCreate(spec); err != nil {
				r.Error = rerr.ToInfo(err)
			}
			continue
		}
		t, err := b.createTopic(ctx, spec)
		if err != nil {
			r.Error = rerr.ToInfo(err)
			continue
		}
		r.TopicId = t.ID
		b.log.Info("topic created", "topic", t.Name, "partitions", t.Partitions, "replication_factor", t.ReplicationFactor, "configs", t.Overrides)
	}
	return resp, nil
}

// createTopic validates spec against this node's image (so bad input is refused without a round trip),
// then proposes it to the controller, which validates again against the latest image.
func (b *Broker) createTopic(ctx context.Context, spec meta.Spec) (*meta.Topic, error) {
	if _, err := b.md.Image().ValidateCreate(spec); err != nil {
		return nil, err
	}
	img, err := b.md.Propose(ctx, meta.Command{Type: meta.CmdCreateTopic, Spec: &spec, TopicID: uuid.NewString(),
		CreatedMs: time.Now().UnixMilli()})
	if err != nil {
		return nil, err
	}
	t, ok := img.Topic(spec.Name)
	if !ok {
		return nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q was deleted right after it was created", spec.Name)
	}
	return t, nil
}

// DeleteTopics implements runnelv1.AdminServer: the controller removes the topic from the metadata, and
// every replica drops its data as it applies that (which wakes fetches waiting on it: they answer
// UNKNOWN_TOPIC_OR_PARTITION).
func (b *Broker) DeleteTopics(ctx context.Context, req *runnelv1.DeleteTopicsRequest) (*runnelv1.DeleteTopicsResponse, error) {
	resp := &runnelv1.DeleteTopicsResponse{}
	for _, name := range req.Topics {
		r := &runnelv1.TopicResult{Name: name}
		resp.Topics = append(resp.Topics, r)
		t, err := b.deleteTopic(ctx, name)
		if err != nil {
			r.Error = rerr.ToInfo(err)
			continue
		}
		r.TopicId = t.ID
		b.log.Info("topic deleted", "topic", name)
	}
	return resp, nil
}

func (b *Broker) deleteTopic(ctx context.Context, name string) (*meta.Topic, error) {
	t, ok := b.md.Image().Topic(name)
	if !ok {
		return nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q does not exist", name)
	}
	if t.Internal {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "topic %q is internal and cannot be deleted", name)
	}
	img, err := b.md.Propose(ctx, meta.Command{Type: meta.CmdDeleteTopic, Name: name})
	if err != nil {
		return nil, err
	}
	// Drop the local data now rather than when the metadata loop gets to it, so the caller's next
	// request sees it gone.
	if err := b.reconcile(img); err != nil {
		return t, err
	}
	return t, nil
}

// ListTopics implements runnelv1.AdminServer.
func (b *Broker) ListTopics(_ context.Context, req *runnelv1.ListTopicsRequest) (*runnelv1.ListTopicsResponse, error) {
	resp := &runnelv1.ListTopicsResponse{}
	for _, t := range b.md.Image().TopicList() {
		if t.Internal && !req.IncludeInternal {
			continue
		}
		resp.Topics = append(resp.Topics, &runnelv1.TopicSummary{Name: t.Name, TopicId: t.ID, Partitions: t.Partitions,
			ReplicationFactor: t.ReplicationFactor, Internal: t.Internal})
	}
	return resp, nil
}

// DescribeTopics implements runnelv1.AdminServer: configs with effective values, each partition's
// leader, replicas and ISR, and the offsets and size of the partition's log on this broker (with
// include_stats its produce rates here too); -1 offsets for partitions this broker holds no replica of.
// The SDK asks each partition's leader for its offsets. An empty topic list describes every topic.
func (b *Broker) DescribeTopics(_ context.Context, req *runnelv1.DescribeTopicsRequest) (*runnelv1.DescribeTopicsResponse, error) {
	img := b.md.Image()
	names := req.Topics
	if len(names) == 0 {
		for _, t := range img.TopicList() {
			names = append(names, t.Name)
		}
	}
	resp := &runnelv1.DescribeTopicsResponse{}
	for _, name := range names {
		d := &runnelv1.TopicDescription{Name: name}
		resp.Topics = append(resp.Topics, d)
		t, ok := img.Topic(name)
		if !ok {
			d.Error = rerr.ToInfo(rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q does not exist", name))
			continue
		}
		d.TopicId, d.ReplicationFactor, d.Internal = t.ID, t.ReplicationFactor, t.Internal
		d.Configs = topiccfg.Entries(t.Overrides)
		logs := b.localTopicLogs(t)
		for i, st := range t.Assignment {
			pd := &runnelv1.PartitionDescription{Partition: int32(i), LeaderId: st.Leader, LeaderEpoch: st.LeaderEpoch,
				Replicas: st.Replicas, Isr: st.ISR, LogStartOffset: -1, HighWatermark: -1, LogEndOffset: -1, ReassigningTo: st.Target}
			if i < len(logs) && logs[i] != nil {
				p := logs[i]
				pd.LogStartOffset, pd.HighWatermark, pd.LogEndOffset, pd.SizeBytes = p.LogStartOffset(), p.HighWatermark(), p.LogEndOffset(), p.Size()
				pd.Stats = b.tel.PartitionStats(name, int32(i), req.IncludeStats)
			}
			d.Partitions = append(d.Partitions, pd)
		}
	}
	return resp, nil
}

// AlterTopicConfigs implements runnelv1.AdminServer (incremental, as kafka-configs --alter): set
// assigns, delete returns to defaults. Fails as a whole with INVALID_CONFIG or UNKNOWN_TOPIC_OR_PARTITION
// and then changes nothing.
func (b *Broker) AlterTopicConfigs(ctx context.Context, req *runnelv1.AlterTopicConfigsRequest) (*runnelv1.AlterTopicConfigsResponse, error) {
	t, err := b.md.Image().ValidateAlter(req.Topic, req.Set, req.Delete)
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	if !req.ValidateOnly {
		img, err := b.md.Propose(ctx, meta.Command{Type: meta.CmdAlterTopicConfig, Name: req.Topic, Set: req.Set, Delete: req.Delete})
		if err != nil {
			return nil, rerr.ToStatus(err)
		}
		if nt, ok := img.Topic(req.Topic); ok {
			t = nt
		}
		b.log.Info("topic configs altered", "topic", t.Name, "configs", t.Overrides)
	}
	return &runnelv1.AlterTopicConfigsResponse{Configs: topiccfg.Entries(t.Overrides)}, nil
}

// ElectLeaders implements runnelv1.AdminServer: preferred leader election through the controller
// (meta.CmdElectPreferredLeaders); the answer lists the partitions whose leader changed.
func (b *Broker) ElectLeaders(ctx context.Context, req *runnelv1.ElectLeadersRequest) (*runnelv1.ElectLeadersResponse, error) {
	before := b.md.Image()
	if req.Topic != "" {
		t, ok := before.Topic(req.Topic)
		if !ok {
			return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q does not exist", req.Topic))
		}
		for _, p := range req.Partitions {
			if _, ok := t.Partition(p); !ok {
				return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q has no partition %d", req.Topic, p))
			}
		}
	} else if len(req.Partitions) > 0 {
		return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "partitions without a topic"))
	}
	after, err := b.md.Propose(ctx, meta.Command{Type: meta.CmdElectPreferredLeaders, Name: req.Topic, Partitions: req.Partitions})
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	resp := &runnelv1.ElectLeadersResponse{}
	for _, t := range after.TopicList() {
		old, ok := before.Topic(t.Name)
		if !ok || old.Num != t.Num {
			continue
		}
		for i, p := range t.Assignment {
			if i < len(old.Assignment) && old.Assignment[i].Leader != p.Leader {
				resp.Moved = append(resp.Moved, &runnelv1.PartitionLeader{Topic: t.Name, Partition: int32(i), LeaderId: p.Leader, LeaderEpoch: p.LeaderEpoch})
			}
		}
	}
	if len(resp.Moved) > 0 {
		b.log.Info("preferred leaders elected", "partitions", len(resp.Moved))
	}
	return resp, nil
}

// ReassignPartitions implements runnelv1.AdminServer: one controller command per partition
// (meta.CmdReassignPartition); each succeeds or fails on its own.
func (b *Broker) ReassignPartitions(ctx context.Context, req *runnelv1.ReassignPartitionsRequest) (*runnelv1.ReassignPartitionsResponse, error) {
	resp := &runnelv1.ReassignPartitionsResponse{}
	for _, pr := range req.Partitions {
		r := &runnelv1.PartitionReassignmentResult{Topic: pr.Topic, Partition: pr.Partition}
		resp.Partitions = append(resp.Partitions, r)
		_, err := b.md.Propose(ctx, meta.Command{Type: meta.CmdReassignPartition, Name: pr.Topic, Partition: pr.Partition, Replicas: pr.Replicas})
		if err != nil {
			r.Error = rerr.ToInfo(err)
			continue
		}
		b.log.Info("partition reassignment started", "topic", pr.Topic, "partition", pr.Partition, "replicas", pr.Replicas)
	}
	return resp, nil
}
