package broker

import (
	"context"
	"fmt"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/broker/topiccfg"
)

// CreateTopics implements runnelv1.AdminServer. Each topic succeeds or fails on its own.
func (b *Broker) CreateTopics(_ context.Context, req *runnelv1.CreateTopicsRequest) (*runnelv1.CreateTopicsResponse, error) {
	resp := &runnelv1.CreateTopicsResponse{}
	for _, nt := range req.Topics {
		r := &runnelv1.TopicResult{Name: nt.Name}
		resp.Topics = append(resp.Topics, r)
		spec := meta.Spec{Name: nt.Name, Partitions: nt.Partitions, ReplicationFactor: nt.ReplicationFactor, Configs: nt.Configs}
		if req.ValidateOnly {
			t, err := b.meta.Validate(spec)
			if err != nil {
				r.Error = rerr.ToInfo(err)
			} else {
				r.TopicId = t.ID
			}
			continue
		}
		t, err := b.createTopic(spec)
		if err != nil {
			r.Error = rerr.ToInfo(err)
			continue
		}
		r.TopicId = t.ID
		b.log.Info("topic created", "topic", t.Name, "partitions", t.Partitions, "configs", t.Overrides)
	}
	return resp, nil
}

func (b *Broker) createTopic(spec meta.Spec) (*meta.Topic, error) {
	b.mu.Lock() // serialises creates and deletes with the partition map
	defer b.mu.Unlock()
	t, err := b.meta.Create(spec)
	if err != nil {
		return nil, err
	}
	ps, err := b.openPartitions(t)
	if err != nil {
		return nil, err
	}
	b.parts[t.Name] = ps
	return t, nil
}

// DeleteTopics implements runnelv1.AdminServer: metadata goes first, so no new request finds the topic,
// then each partition's data is dropped, which wakes fetches waiting on it (they answer
// UNKNOWN_TOPIC_OR_PARTITION).
func (b *Broker) DeleteTopics(_ context.Context, req *runnelv1.DeleteTopicsRequest) (*runnelv1.DeleteTopicsResponse, error) {
	resp := &runnelv1.DeleteTopicsResponse{}
	for _, name := range req.Topics {
		r := &runnelv1.TopicResult{Name: name}
		resp.Topics = append(resp.Topics, r)
		t, err := b.deleteTopic(name)
		if err != nil {
			r.Error = rerr.ToInfo(err)
			continue
		}
		r.TopicId = t.ID
		b.log.Info("topic deleted", "topic", name)
	}
	return resp, nil
}

func (b *Broker) deleteTopic(name string) (*meta.Topic, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t, ok := b.meta.Get(name); ok && t.Internal {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "topic %q is internal and cannot be deleted", name)
	}
	t, err := b.meta.Delete(name)
	if err != nil {
		return nil, err
	}
	delete(b.parts, name)
	b.tel.ForgetTopic(name)
	for i := int32(0); i < t.Partitions; i++ {
		if err := b.store.DeletePartition(plog.PartitionID{TopicNum: t.Num, Partition: i}); err != nil {
			return t, fmt.Errorf("drop data of %s-%d: %w", name, i, err)
		}
	}
	return t, nil
}

// ListTopics implements runnelv1.AdminServer.
func (b *Broker) ListTopics(_ context.Context, req *runnelv1.ListTopicsRequest) (*runnelv1.ListTopicsResponse, error) {
	resp := &runnelv1.ListTopicsResponse{}
	for _, t := range b.meta.List() {
		if t.Internal && !req.IncludeInternal {
			continue
		}
		resp.Topics = append(resp.Topics, &runnelv1.TopicSummary{Name: t.Name, TopicId: t.ID, Partitions: t.Partitions,
			ReplicationFactor: t.ReplicationFactor, Internal: t.Internal})
	}
	return resp, nil
}

// DescribeTopics implements runnelv1.AdminServer: configs with effective values, and each partition's
// offsets and size, and with include_stats its produce rates on this broker. An empty topic list
// describes every topic.
func (b *Broker) DescribeTopics(_ context.Context, req *runnelv1.DescribeTopicsRequest) (*runnelv1.DescribeTopicsResponse, error) {
	names := req.Topics
	if len(names) == 0 {
		for _, t := range b.meta.List() {
			names = append(names, t.Name)
		}
	}
	resp := &runnelv1.DescribeTopicsResponse{}
	for _, name := range names {
		d := &runnelv1.TopicDescription{Name: name}
		resp.Topics = append(resp.Topics, d)
		t, ok := b.meta.Get(name)
		b.mu.RLock()
		ps := b.parts[name]
		b.mu.RUnlock()
		if !ok || ps == nil {
			d.Error = rerr.ToInfo(rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q does not exist", name))
			continue
		}
		d.TopicId, d.ReplicationFactor, d.Internal = t.ID, t.ReplicationFactor, t.Internal
		d.Configs = topiccfg.Entries(t.Overrides)
		for i, p := range ps {
			d.Partitions = append(d.Partitions, &runnelv1.PartitionDescription{Partition: int32(i), LeaderId: b.cfg.NodeID,
				Replicas: []int32{b.cfg.NodeID}, Isr: []int32{b.cfg.NodeID}, LogStartOffset: p.LogStartOffset(),
				HighWatermark: p.HighWatermark(), LogEndOffset: p.LogEndOffset(), SizeBytes: p.Size(),
				Stats: b.tel.PartitionStats(name, int32(i), req.IncludeStats)})
		}
	}
	return resp, nil
}

// AlterTopicConfigs implements runnelv1.AdminServer (incremental, as kafka-configs --alter): set
// assigns, delete returns to defaults. Fails as a whole with INVALID_CONFIG or UNKNOWN_TOPIC_OR_PARTITION
// and then changes nothing.
func (b *Broker) AlterTopicConfigs(_ context.Context, req *runnelv1.AlterTopicConfigsRequest) (*runnelv1.AlterTopicConfigsResponse, error) {
	t, err := b.meta.Alter(req.Topic, req.Set, req.Delete, req.ValidateOnly)
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	if !req.ValidateOnly {
		b.log.Info("topic configs altered", "topic", t.Name, "configs", t.Overrides)
	}
	return &runnelv1.AlterTopicConfigsResponse{Configs: topiccfg.Entries(t.Overrides)}, nil
}
