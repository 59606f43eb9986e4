package broker

import (
	"context"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
)

// ListOffsets implements runnelv1.RecordsServer: per partition, the log start offset (EARLIEST), the
// high watermark (LATEST), or the first offset whose timestamp is at or after the given one (TIMESTAMP;
// -1 when there is none, as in Kafka).
func (b *Broker) ListOffsets(_ context.Context, req *runnelv1.ListOffsetsRequest) (*runnelv1.ListOffsetsResponse, error) {
	resp := &runnelv1.ListOffsetsResponse{Partitions: make([]*runnelv1.ListOffsetsPartitionResult, len(req.Partitions))}
	for i, lp := range req.Partitions {
		r := &runnelv1.ListOffsetsPartitionResult{Topic: lp.Topic, Partition: lp.Partition, Offset: -1, Timestamp: -1}
		resp.Partitions[i] = r
		_, p, err := b.partition(lp.Topic, lp.Partition)
		if err != nil {
			r.Error = rerr.ToInfo(err)
			continue
		}
		switch lp.Spec {
		case runnelv1.OffsetSpec_EARLIEST:
			r.Offset = p.LogStartOffset()
		case runnelv1.OffsetSpec_LATEST:
			r.Offset = p.HighWatermark()
		case runnelv1.OffsetSpec_TIMESTAMP:
			if lp.Timestamp < 0 {
				r.Error = rerr.ToInfo(rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "negative timestamp %d; use EARLIEST or LATEST", lp.Timestamp))
				continue
			}
			off, ts, err := p.OffsetForTimestamp(lp.Timestamp)
			if err != nil {
				r.Error = rerr.ToInfo(storeErr(lp.Topic, lp.Partition, err))
				continue
			}
			r.Offset, r.Timestamp = off, ts
		default:
			r.Error = rerr.ToInfo(rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "offset spec %v: want EARLIEST, LATEST or TIMESTAMP", lp.Spec))
		}
	}
	return resp, nil
}

// Metadata implements runnelv1.RecordsServer. On a single node this broker leads every partition at
// leader epoch 0 and is the controller.
func (b *Broker) Metadata(_ context.Context, req *runnelv1.MetadataRequest) (*runnelv1.MetadataResponse, error) {
	resp := &runnelv1.MetadataResponse{
		Brokers:      []*runnelv1.Broker{{NodeId: b.cfg.NodeID, GrpcAddr: b.cfg.AdvertisedAddr, Rack: b.cfg.Rack}},
		ControllerId: b.cfg.NodeID,
		ClusterId:    b.meta.ClusterID(),
	}
	var topics []*meta.Topic
	if len(req.Topics) == 0 {
		topics = b.meta.List()
	} else {
		for _, name := range req.Topics {
			t, ok := b.meta.Get(name)
			if !ok {
				resp.Topics = append(resp.Topics, &runnelv1.TopicMetadata{Name: name,
					Error: rerr.ToInfo(rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q does not exist", name))})
				continue
			}
			topics = append(topics, t)
		}
	}
	for _, t := range topics {
		tm := &runnelv1.TopicMetadata{Name: t.Name, TopicId: t.ID, Internal: t.Internal}
		for i := int32(0); i < t.Partitions; i++ {
			tm.Partitions = append(tm.Partitions, &runnelv1.PartitionMetadata{Partition: i, LeaderId: b.cfg.NodeID,
				Replicas: []int32{b.cfg.NodeID}, Isr: []int32{b.cfg.NodeID}})
		}
		resp.Topics = append(resp.Topics, tm)
	}
	return resp, nil
}
