package broker

import (
	"context"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/plog"
)

// leaderReplica returns the replica state of a partition this broker leads at epoch, for a request from
// replica id. Errors: UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH (the
// follower's epoch is older), UNKNOWN_LEADER_EPOCH (newer: this broker has not applied it yet).
func (b *Broker) leaderReplica(topic string, partition, epoch, replicaID int32) (*replica, error) {
	t, ok := b.md.Image().Topic(topic)
	if !ok {
		return nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q does not exist", topic)
	}
	st, ok := t.Partition(partition)
	if !ok {
		return nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q has no partition %d", topic, partition)
	}
	if err := b.checkLeader(topic, partition, st); err != nil {
		return nil, err
	}
	if err := checkEpoch(topic, partition, t, &epoch); err != nil {
		return nil, err
	}
	if !st.IsReplica(replicaID) || replicaID == b.cfg.NodeID {
		return nil, rerr.New(runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER, "broker %d is not a follower of %s-%d (replicas %v)", replicaID, topic, partition, st.Replicas)
	}
	r := b.repl.get(plog.PartitionID{TopicNum: t.Num, Partition: partition})
	if r == nil {
		return nil, rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "%s-%d: leadership not taken up here yet", topic, partition)
	}
	r.mu.Lock()
	ok = r.leader && r.epoch == st.LeaderEpoch
	r.mu.Unlock()
	if !ok {
		return nil, rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "%s-%d: leadership at epoch %d not taken up here yet", topic, partition, st.LeaderEpoch)
	}
	return r, nil
}

// ReplicaFetch implements runnelv1.ReplicationServer: a long poll answered with each partition's batches
// from the follower's log end offset up to the leader's durable end, once there is data, max_wait_ms has
// passed or a partition has an error. Each fetch offset also reports the follower's log end offset.
func (b *Broker) ReplicaFetch(ctx context.Context, req *runnelv1.ReplicaFetchRequest) (*runnelv1.ReplicaFetchResponse, error) {
	if len(req.Partitions) == 0 || req.MaxBytes < 0 || req.MaxWaitMs < 0 {
		return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "replica fetch without partitions or with negative sizes"))
	}
	maxBytes := min(int(req.MaxBytes), MaxFetchBytes)
	if maxBytes == 0 {
		maxBytes = DefaultFetchMaxBytes
	}
	deadline := time.Now().Add(min(time.Duration(req.MaxWaitMs)*time.Millisecond, MaxFetchWait))
	reps := make([]*replica, len(req.Partitions))
	now := time.Now()
	for i, fp := range req.Partitions {
		r, err := b.leaderReplica(fp.Topic, fp.Partition, fp.CurrentLeaderEpoch, req.ReplicaId)
		if err == nil {
			reps[i] = r
			b.repl.followerFetched(r, req.ReplicaId, fp.FetchOffset, now)
		}
	}
	return longPoll(ctx, deadline, 1, func() (*runnelv1.ReplicaFetchResponse, int, bool, []<-chan struct{}) {
		resp := &runnelv1.ReplicaFetchResponse{Partitions: make([]*runnelv1.ReplicaFetchPartitionResult, len(req.Partitions))}
		total, anyErr := 0, false
		var changed []<-chan struct{}
		for i, fp := range req.Partitions {
			res := &runnelv1.ReplicaFetchPartitionResult{Topic: fp.Topic, Partition: fp.Partition, HighWatermark: -1, LogStartOffset: -1, LogEndOffset: -1}
			resp.Partitions[i] = res
			r := reps[i]
			if r == nil {
				_, err := b.leaderReplica(fp.Topic, fp.Partition, fp.CurrentLeaderEpoch, req.ReplicaId)
				if err == nil {
					err = rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "%s-%d: leadership not taken up here yet", fp.Topic, fp.Partition)
				}
				res.Error, anyErr = rerr.ToInfo(err), true
				continue
			}
			changed = append(changed, r.log.Changed())
			res.HighWatermark, res.LogStartOffset, res.LogEndOffset = r.log.HighWatermark(), r.log.LogStartOffset(), r.log.DurableEnd()
			limit := min(int(fp.PartitionMaxBytes), maxBytes-total)
			if fp.PartitionMaxBytes <= 0 {
				limit = min(DefaultPartitionMaxBytes, maxBytes-total)
			}
			if limit <= 0 {
				if total > 0 {
					continue
				}
				limit = 1
			}
			throttled, capBytes := b.repl.throttled(r, req.ReplicaId)
			if throttled {
				continue // a catching-up follower over the replication throttle: nothing this time
			}
			if capBytes > 0 {
				limit = min(limit, capBytes) // one answer at most a bucket's worth, all of it charged
			}
			recs, err := r.log.ReadLocal(nil, fp.FetchOffset, limit)
			if err != nil {
				res.Error, anyErr = rerr.ToInfo(storeErr(fp.Topic, fp.Partition, err)), true
				continue
			}
			b.repl.charge(r, req.ReplicaId, len(recs))
			res.Records = recs
			res.BatchTraces = b.tel.ReplicaTraces(fp.Topic, fp.Partition, recs) // traced batches: the followers continue their traces
			total += len(recs)
		}
		return resp, total, anyErr, changed
	})
}

// OffsetForLeaderEpoch implements runnelv1.ReplicationServer (KIP-101): per partition, the end offset of
// the largest epoch at or below the asked one in this leader's log.
func (b *Broker) OffsetForLeaderEpoch(_ context.Context, req *runnelv1.OffsetForLeaderEpochRequest) (*runnelv1.OffsetForLeaderEpochResponse, error) {
	resp := &runnelv1.OffsetForLeaderEpochResponse{}
	for _, p := range req.Partitions {
		res := &runnelv1.OffsetForLeaderEpochResult{Topic: p.Topic, Partition: p.Partition, LeaderEpoch: -1, EndOffset: -1}
		resp.Partitions = append(resp.Partitions, res)
		r, err := b.leaderReplica(p.Topic, p.Partition, p.CurrentLeaderEpoch, req.ReplicaId)
		if err != nil {
			res.Error = rerr.ToInfo(err)
			continue
		}
		if p.LeaderEpoch < 0 {
			continue // the follower's log is empty: nothing to truncate
		}
		res.EndOffset, res.LeaderEpoch = r.log.EndOffsetForEpoch(p.LeaderEpoch)
	}
	return resp, nil
}

// afterAppend finishes an append to partition t/p of this leader: with acks=all on a replicated
// partition it waits for the ISR (waitISR), else done runs at once.
func (b *Broker) afterAppend(t *meta.Topic, p int32, acksAll bool, res plog.AppendResult, deadline time.Time, done func(error)) {
	if !acksAll || len(t.Assignment[p].Replicas) <= 1 {
		done(nil)
		return
	}
	r := b.repl.get(plog.PartitionID{TopicNum: t.Num, Partition: p})
	if r == nil {
		done(rerr.New(runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER, "%s-%d: not led here any more", t.Name, p))
		return
	}
	b.repl.waitISR(r, res.LastOffset+1, deadline, done)
}

// replicaOf returns the replica state of a replicated partition this broker leads (nil for a
// partition with one replica), checking min.insync.replicas for acks=all before anything is written.
// For every acks value the replication layer must have taken up the leadership at the epoch of t (the
// image the append is stamped from): the image can show this broker leading before apply made the
// replica leader, and an append stamped with the new epoch while the replica still follows would pass
// the log's fence and then be cut by the follower's truncation.
func (b *Broker) replicaOf(t *meta.Topic, p int32, acksAll bool) (*replica, error) {
	if len(t.Assignment[p].Replicas) <= 1 {
		return nil, nil
	}
	r := b.repl.get(plog.PartitionID{TopicNum: t.Num, Partition: p})
	if r == nil {
		return nil, rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "%s-%d: leadership not taken up here yet", t.Name, p)
	}
	if !r.leadsAt(t.Assignment[p].LeaderEpoch) {
		return nil, rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "%s-%d: leadership at epoch %d not taken up here yet", t.Name, p, t.Assignment[p].LeaderEpoch)
	}
	if acksAll {
		if err := r.checkMinISR(); err != nil {
			return nil, err
		}
	}
	return r, nil
}
