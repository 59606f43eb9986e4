package broker

import (
	"context"
	"fmt"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
)

// ListOffsets implements runnelv1.RecordsServer: per partition, the log start offset (EARLIEST), the
// high watermark (LATEST; the last stable offset for READ_COMMITTED, KIP-98), or the first offset whose
// timestamp is at or after the given one (TIMESTAMP; -1 when there is none, as in Kafka).
func (b *Broker) ListOffsets(_ context.Context, req *runnelv1.ListOffsetsRequest) (*runnelv1.ListOffsetsResponse, error) {
	resp := &runnelv1.ListOffsetsResponse{Partitions: make([]*runnelv1.ListOffsetsPartitionResult, len(req.Partitions))}
	for i, lp := range req.Partitions {
		r := &runnelv1.ListOffsetsPartitionResult{Topic: lp.Topic, Partition: lp.Partition, Offset: -1, Timestamp: -1}
		resp.Partitions[i] = r
		t, p, err := b.partition(lp.Topic, lp.Partition)
		if err != nil {
			r.Error = rerr.ToInfo(err)
			continue
		}
		switch lp.Spec {
		case runnelv1.OffsetSpec_EARLIEST:
			r.Offset = p.LogStartOffset()
		case runnelv1.OffsetSpec_LATEST:
			r.Offset = p.HighWatermark()
			if req.IsolationLevel == runnelv1.IsolationLevel_READ_COMMITTED {
				lso, err := b.lastStableOffset(t, lp.Partition, p)
				if err != nil {
					r.Offset, r.Error = -1, rerr.ToInfo(storeErr(lp.Topic, lp.Partition, err))
					continue
				}
				r.Offset = min(lso, r.Offset)
			}
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

// Metadata implements runnelv1.RecordsServer from this node's metadata image: the unfenced brokers,
// the controller leader, and each partition's leader, leader epoch, replicas and ISR
// (LEADER_NOT_AVAILABLE on a partition that has no leader).
func (b *Broker) Metadata(_ context.Context, req *runnelv1.MetadataRequest) (*runnelv1.MetadataResponse, error) {
	img := b.md.Image()
	resp := &runnelv1.MetadataResponse{ControllerId: b.md.ControllerID(), ClusterId: img.ClusterID}
	for _, br := range img.AliveBrokers() {
		resp.Brokers = append(resp.Brokers, &runnelv1.Broker{NodeId: br.ID, GrpcAddr: br.GRPCAddr, Rack: br.Rack})
	}
	var topics []*meta.Topic
	if len(req.Topics) == 0 {
		topics = img.TopicList()
	} else {
		for _, name := range req.Topics {
			t, ok := img.Topic(name)
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
		for i, st := range t.Assignment {
			pm := &runnelv1.PartitionMetadata{Partition: int32(i), LeaderId: st.Leader, LeaderEpoch: st.LeaderEpoch,
				Replicas: st.Replicas, Isr: st.ISR}
			if st.Leader == meta.NoLeader {
				pm.Error = rerr.ToInfo(&rerr.Error{Code: runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, LeaderID: -1, LeaderEpoch: st.LeaderEpoch,
					Message: fmt.Sprintf("%s-%d has no leader: none of its in-sync replicas %v is alive", t.Name, i, st.ISR)})
			}
			tm.Partitions = append(tm.Partitions, pm)
		}
		resp.Topics = append(resp.Topics, tm)
	}
	return resp, nil
}
