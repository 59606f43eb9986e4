package group

import (
	"maps"
	"slices"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// Commit validates an offset commit and returns the per-partition results and the records of the
// partitions that passed. The offsets take effect when the caller hands those records, made durable, to
// Apply; only then may it answer.
//
// A member commits with its member id and current epoch, and only partitions it owns (assigned, or
// still to be revoked, so it can commit on revocation). An admin commit (empty member id, epoch -1, as
// kafka-consumer-groups --reset-offsets) is accepted only while the group has no members.
//
// Errors failing the whole call (nothing is committed): COORDINATOR_LOAD_IN_PROGRESS, INVALID_GROUP_ID,
// INVALID_REQUEST (too many or repeated partitions, an admin commit with another epoch),
// NON_EMPTY_GROUP, UNKNOWN_MEMBER_ID (no such member: it was removed, or never joined),
// FENCED_MEMBER_EPOCH (an epoch the member has not reached, or a static member that left),
// STALE_MEMBER_EPOCH (an older epoch of a current member: heartbeat, then retry with the new one).
// Per partition: OFFSET_METADATA_TOO_LARGE, OFFSET_OUT_OF_RANGE (below 0 or beyond the log end offset),
// UNKNOWN_TOPIC_OR_PARTITION, STALE_MEMBER_EPOCH (a partition the member does not own at this epoch).
func (c *Coordinator) Commit(now time.Time, req *runnelv1.CommitOffsetsRequest, logEnd LogEndFunc) (*runnelv1.CommitOffsetsResponse, []Record, error) {
	if err := c.loadErr(); err != nil {
		return nil, nil, err
	}
	if err := validGroupID(req.GroupId); err != nil {
		return nil, nil, err
	}
	m, err := c.checkCommitter(req.GroupId, req.MemberId, req.MemberEpoch, req.Partitions)
	if err != nil {
		return nil, nil, err
	}
	resp := &runnelv1.CommitOffsetsResponse{Partitions: make([]*runnelv1.CommitPartitionResult, len(req.Partitions))}
	for i, p := range req.Partitions {
		r := &runnelv1.CommitPartitionResult{Topic: p.Topic, Partition: p.Partition}
		resp.Partitions[i] = r
		if err := c.checkCommit(m, p, logEnd); err != nil {
			r.Error = rerr.ToInfo(err)
			continue
		}
		k := tp{p.Topic, p.Partition}
		v := OffsetCommit{Offset: p.Offset, LeaderEpoch: p.LeaderEpoch, Metadata: p.Metadata, CommitTimestampMs: now.UnixMilli()}
		c.out = append(c.out, Record{Key: offsetKey(req.GroupId, k).encode(), Value: v.encode()})
		countUp(c.pending, req.GroupId, k)
	}
	return resp, c.flush(), nil
}

// checkCommitter validates the partition list and the committer of a commit (Commit, TxnOffsetCommit)
// and returns the member, nil for an admin commit. See Commit for the errors.
func (c *Coordinator) checkCommitter(gid, memberID string, memberEpoch int32, ps []*runnelv1.CommitPartition) (*member, error) {
	if len(ps) > MaxCommitPartitions {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "commit of %d partitions, at most %d", len(ps), MaxCommitPartitions)
	}
	seen := make(map[tp]bool, len(ps))
	for _, p := range ps {
		if p == nil {
			return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "commit with an empty partition entry")
		}
		k := tp{p.Topic, p.Partition}
		if seen[k] {
			return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "partition %s-%d appears twice in one commit", p.Topic, p.Partition)
		}
		seen[k] = true
	}
	g := c.groups[gid]
	if memberID == "" {
		if memberEpoch != AdminEpoch {
			return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "a commit without member id is an admin commit and must carry member epoch -1, not %d", memberEpoch)
		}
		if g != nil && len(g.members) > 0 {
			return nil, rerr.New(runnelv1.ErrorCode_NON_EMPTY_GROUP, "group %q has %d member(s); offsets can be set from outside only while it has none", g.id, len(g.members))
		}
		return nil, nil
	}
	var m *member
	if g != nil {
		m = g.members[memberID]
	}
	switch {
	case m == nil:
		return nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_MEMBER_ID, "group %q has no member %q", gid, memberID)
	case m.departed:
		return nil, rerr.New(runnelv1.ErrorCode_FENCED_MEMBER_EPOCH, "member %q left the group", m.id)
	case memberEpoch > m.epoch:
		return nil, rerr.New(runnelv1.ErrorCode_FENCED_MEMBER_EPOCH, "member %q is at epoch %d, the commit says %d", m.id, m.epoch, memberEpoch)
	case memberEpoch < m.epoch:
		return nil, rerr.New(runnelv1.ErrorCode_STALE_MEMBER_EPOCH, "member %q is at epoch %d, the commit says %d: heartbeat and retry", m.id, m.epoch, memberEpoch)
	}
	return m, nil
}

func (c *Coordinator) checkCommit(m *member, p *runnelv1.CommitPartition, logEnd LogEndFunc) error {
	if len(p.Metadata) > c.cfg.MaxOffsetMetadataBytes {
		return rerr.New(runnelv1.ErrorCode_OFFSET_METADATA_TOO_LARGE, "%s-%d: metadata of %d bytes, at most %d", p.Topic, p.Partition, len(p.Metadata), c.cfg.MaxOffsetMetadataBytes)
	}
	if p.Offset < 0 {
		return rerr.New(runnelv1.ErrorCode_OFFSET_OUT_OF_RANGE, "%s-%d: negative offset %d", p.Topic, p.Partition, p.Offset)
	}
	end, ok := logEnd(p.Topic, p.Partition)
	if !ok {
		return rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "%s-%d does not exist", p.Topic, p.Partition)
	}
	if p.Offset > end {
		return rerr.New(runnelv1.ErrorCode_OFFSET_OUT_OF_RANGE, "%s-%d: offset %d is beyond the log end offset %d", p.Topic, p.Partition, p.Offset, end)
	}
	if m != nil && !m.owns(tp{p.Topic, p.Partition}) {
		return rerr.New(runnelv1.ErrorCode_STALE_MEMBER_EPOCH, "%s-%d is not assigned to member %q at epoch %d", p.Topic, p.Partition, m.id, m.epoch)
	}
	return nil
}

// FetchOffsets returns the durable committed offsets of a group: of the partitions asked for (offset -1
// where there is none), or of every partition with a commit, sorted. An unknown group has none.
// Offsets of transactions not yet ended are never returned. With require_stable (KIP-447) a partition
// that has such offsets answers UNSTABLE_OFFSET_COMMIT in its entry (offset -1) instead, and the
// partitions of every partition listing include those with only such offsets, so a member taking
// a partition over waits until the transaction's marker decides where to start.
// Errors: COORDINATOR_LOAD_IN_PROGRESS, INVALID_GROUP_ID, INVALID_REQUEST (too many partitions).
func (c *Coordinator) FetchOffsets(req *runnelv1.FetchOffsetsRequest) (*runnelv1.FetchOffsetsResponse, error) {
	if err := c.loadErr(); err != nil {
		return nil, err
	}
	if err := validGroupID(req.GroupId); err != nil {
		return nil, err
	}
	asked, err := partsFromProto("partitions", req.Partitions, MaxCommitPartitions)
	if err != nil {
		return nil, err
	}
	offs := c.offsets[req.GroupId]
	resp := &runnelv1.FetchOffsetsResponse{}
	emit := func(k tp) {
		if req.RequireStable && c.unstable(req.GroupId, k) {
			resp.Offsets = append(resp.Offsets, &runnelv1.CommittedOffset{Topic: k.topic, Partition: k.part, Offset: -1, LeaderEpoch: -1, CommitTimestampMs: -1,
				Error: rerr.ToInfo(rerr.New(runnelv1.ErrorCode_UNSTABLE_OFFSET_COMMIT, "group %q: a transaction holding offsets of %s-%d has not ended", req.GroupId, k.topic, k.part))})
			return
		}
		o, ok := offs[k]
		if !ok {
			resp.Offsets = append(resp.Offsets, &runnelv1.CommittedOffset{Topic: k.topic, Partition: k.part, Offset: -1, LeaderEpoch: -1, CommitTimestampMs: -1})
			return
		}
		resp.Offsets = append(resp.Offsets, &runnelv1.CommittedOffset{Topic: k.topic, Partition: k.part, Offset: o.Offset,
			LeaderEpoch: o.LeaderEpoch, Metadata: o.Metadata, CommitTimestampMs: o.CommitTimestampMs})
	}
	if len(req.Partitions) > 0 {
		asked.each(emit)
		return resp, nil
	}
	set := make(map[tp]bool, len(offs))
	for k := range offs {
		set[k] = true
	}
	if req.RequireStable {
		for k := range c.txnInflight[req.GroupId] {
			set[k] = true
		}
		for pid := range c.openTxns[req.GroupId] {
			for k := range c.txns[pid].offsets[req.GroupId] {
				set[k] = true
			}
		}
	}
	keys := slices.SortedFunc(maps.Keys(set), cmpTP)
	for _, k := range keys {
		emit(k)
	}
	return resp, nil
}
