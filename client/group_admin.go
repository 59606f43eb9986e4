package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// Consumer group administration (Kafka's kafka-consumer-groups and AdminClient group calls).

// GroupSummary is one group in ListGroups.
type GroupSummary struct {
	GroupID string
	// State is KIP-848's group state: "empty", "assigning", "reconciling", "stable" (or "dead").
	State         string
	Members       int32
	CoordinatorID int32
}

// GroupDescription is a group in detail, from DescribeGroup.
type GroupDescription struct {
	GroupID string
	State   string
	// GroupEpoch bumps on every change of membership, subscriptions or subscribed topics;
	// AssignmentEpoch is the epoch the target assignment was computed at.
	GroupEpoch      int32
	AssignmentEpoch int32
	Assignor        string
	CoordinatorID   int32
	Members         []GroupMember // sorted by member id
}

// GroupMember is one member of a GroupDescription.
type GroupMember struct {
	MemberID   string
	InstanceID string // "" for a dynamic member
	ClientID   string
	ClientHost string
	// MemberEpoch is the assignment epoch the member has reconciled to; -2 for a static member that
	// left for now and whose partitions stay reserved until its session timeout.
	MemberEpoch      int32
	SubscribedTopics []string
	SubscribedRegex  string
	// Assignment is what the member owns now (including partitions it is still revoking);
	// TargetAssignment what it will own once the group is reconciled.
	Assignment       []TopicPartition
	TargetAssignment []TopicPartition
}

// PartitionLag is one partition of a group's offsets with its lag, from GroupLag.
type PartitionLag struct {
	Topic     string
	Partition int32
	// Committed is the group's committed offset (the next offset to read), -1 when none.
	Committed int64
	// LogStartOffset and LogEndOffset bound the partition's readable records; LogEndOffset is the
	// high watermark, the end a consumer can read to.
	LogStartOffset int64
	LogEndOffset   int64
	// Lag is LogEndOffset - Committed: records written and not yet committed by the group; -1 when the
	// group has no commit for the partition.
	Lag int64
	// MemberID and InstanceID name the member that owns the partition now ("" when none does).
	MemberID   string
	InstanceID string
}

// groupErr returns the error of a per-group result, marked final so it is not retried, except the
// coordinator errors, which send the call to the group's coordinator.
func groupErr(info *runnelv1.ErrorInfo) error {
	if err := rerr.FromInfo(info); err != nil {
		switch info.Code {
		case runnelv1.ErrorCode_NOT_COORDINATOR, runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE, runnelv1.ErrorCode_COORDINATOR_LOAD_IN_PROGRESS:
			// Asked the wrong broker, or one still loading: the coordinator routing retries elsewhere.
			return err
		}
		return final{err}
	}
	return nil
}

// ListGroups lists the groups of every broker (each coordinates some), sorted by id.
func (a *Admin) ListGroups(ctx context.Context) ([]GroupSummary, error) {
	md, err := a.cl.metadata(ctx, []string{})
	if err != nil {
		return nil, fmt.Errorf("list groups: %w", err)
	}
	nodes := []int32{-1}
	if len(md.Brokers) > 0 {
		nodes = nodes[:0]
		for _, b := range md.Brokers {
			nodes = append(nodes, b.NodeId)
		}
	}
	seen := map[string]GroupSummary{}
	for _, node := range nodes {
		err := unfinal(a.cl.retry(ctx, func(ctx context.Context) error {
			cc, err := a.cl.nodeConn(node)
			if err != nil {
				return err
			}
			resp, err := runnelv1.NewGroupsClient(cc).ListGroups(ctx, &runnelv1.ListGroupsRequest{})
			if err != nil {
				return wireErr(err)
			}
			for _, s := range resp.Groups {
				seen[s.GroupId] = GroupSummary{GroupID: s.GroupId, State: s.State, Members: s.Members, CoordinatorID: s.CoordinatorId}
			}
			return nil
		}))
		if err != nil {
			return nil, fmt.Errorf("list groups of node %d: %w", node, err)
		}
	}
	out := make([]GroupSummary, 0, len(seen))
	for _, s := range seen {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GroupID < out[j].GroupID })
	return out, nil
}

// DescribeGroup returns a group's state, epochs, assignor and members with their partitions. An
// unknown group gives GROUP_ID_NOT_FOUND (compare the code with errors.As on *rerr.Error).
func (a *Admin) DescribeGroup(ctx context.Context, group string) (*GroupDescription, error) {
	var out *GroupDescription
	err := newCoordinator(a.cl).call(ctx, func(ctx context.Context, gc runnelv1.GroupsClient) error {
		resp, err := gc.DescribeGroups(ctx, &runnelv1.DescribeGroupsRequest{GroupIds: []string{group}})
		if err != nil {
			return wireErr(err)
		}
		d, err := oneTopic(resp.Groups, group, func(g *runnelv1.GroupDescription) string { return g.GroupId })
		if err != nil {
			return err
		}
		if err := groupErr(d.Error); err != nil {
			return err
		}
		out = &GroupDescription{GroupID: d.GroupId, State: d.State, GroupEpoch: d.GroupEpoch, AssignmentEpoch: d.AssignmentEpoch,
			Assignor: d.Assignor, CoordinatorID: d.CoordinatorId}
		for _, m := range d.Members {
			out.Members = append(out.Members, GroupMember{MemberID: m.MemberId, InstanceID: m.InstanceId, ClientID: m.ClientId,
				ClientHost: m.ClientHost, MemberEpoch: m.MemberEpoch, SubscribedTopics: m.SubscribedTopicNames,
				SubscribedRegex: m.SubscribedTopicRegex, Assignment: fromProtoPartitions(m.Assignment),
				TargetAssignment: fromProtoPartitions(m.TargetAssignment)})
		}
		sort.Slice(out.Members, func(i, j int) bool { return out.Members[i].MemberID < out.Members[j].MemberID })
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("describe group %q: %w", group, err)
	}
	return out, nil
}

// FetchOffsets returns a group's committed offsets of the given partitions (Offset -1 where there is
// none), or of every partition it has committed when none is given, sorted. An unknown group has none.
func (a *Admin) FetchOffsets(ctx context.Context, group string, partitions ...TopicPartition) ([]CommittedOffset, error) {
	m, err := fetchOffsets(ctx, newCoordinator(a.cl), group, partitions, false)
	if err != nil {
		return nil, err
	}
	out := make([]CommittedOffset, 0, len(m))
	for _, c := range m {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out, nil
}

// DeleteGroup deletes a group without members and its committed offsets. A group with members
// (including a static member whose partitions are reserved) gives NON_EMPTY_GROUP; an unknown one
// GROUP_ID_NOT_FOUND.
func (a *Admin) DeleteGroup(ctx context.Context, group string) error {
	err := newCoordinator(a.cl).call(ctx, func(ctx context.Context, gc runnelv1.GroupsClient) error {
		resp, err := gc.DeleteGroups(ctx, &runnelv1.DeleteGroupsRequest{GroupIds: []string{group}})
		if err != nil {
			return wireErr(err)
		}
		r, err := oneTopic(resp.Groups, group, func(g *runnelv1.GroupResult) string { return g.GroupId })
		if err != nil {
			return err
		}
		return groupErr(r.Error)
	})
	if err != nil {
		return fmt.Errorf("delete group %q: %w", group, err)
	}
	return nil
}

// partitionRange is a partition's readable range from DescribeTopic.
type partitionRange struct{ start, end int64 }

// topicRanges returns the log start offset and high watermark of every partition of the topics.
func (a *Admin) topicRanges(ctx context.Context, topics []string) (map[TopicPartition]partitionRange, error) {
	out := map[TopicPartition]partitionRange{}
	for _, t := range topics {
		d, err := a.DescribeTopic(ctx, t)
		if err != nil {
			return nil, err
		}
		for _, p := range d.Partitions {
			out[TopicPartition{t, p.Partition}] = partitionRange{p.LogStartOffset, p.HighWatermark}
		}
	}
	return out, nil
}

// GroupLag returns, for every partition of the topics the group has committed offsets for, is assigned
// or subscribes to by name, the committed offset, the log end offset (high watermark), the lag between
// them and the member owning it, sorted by topic and partition. Topics deleted since are left out.
func (a *Admin) GroupLag(ctx context.Context, group string) ([]PartitionLag, error) {
	desc, err := a.DescribeGroup(ctx, group)
	if err != nil && !isCode(err, runnelv1.ErrorCode_GROUP_ID_NOT_FOUND) {
		return nil, err
	}
	committed, err := fetchOffsets(ctx, newCoordinator(a.cl), group, nil, false)
	if err != nil {
		return nil, err
	}
	topics := map[string]bool{}
	owner := map[TopicPartition]GroupMember{}
	if desc != nil {
		for _, m := range desc.Members {
			for _, t := range m.SubscribedTopics {
				topics[t] = true
			}
			for _, k := range m.Assignment {
				topics[k.Topic] = true
				owner[k] = m
			}
		}
	}
	for k := range committed {
		topics[k.Topic] = true
	}
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	slices.Sort(names)
	var out []PartitionLag
	for _, t := range names {
		ranges, err := a.topicRanges(ctx, []string{t})
		if errors.Is(err, rerr.ErrUnknownTopicOrPartition) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lag of group %q: %w", group, err)
		}
		for k, r := range ranges {
			l := PartitionLag{Topic: k.Topic, Partition: k.Partition, Committed: -1, LogStartOffset: r.start, LogEndOffset: r.end, Lag: -1}
			if c, ok := committed[k]; ok && c.Offset >= 0 {
				l.Committed, l.Lag = c.Offset, max(0, r.end-c.Offset)
			}
			if m, ok := owner[k]; ok {
				l.MemberID, l.InstanceID = m.MemberID, m.InstanceID
			}
			out = append(out, l)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out, nil
}

// resetKind says how ResetOffsets computes a partition's new offset.
type resetKind int8

const (
	resetEarliest resetKind = iota
	resetLatest
	resetDatetime
	resetOffset
	resetShift
)

// ResetSpec says where ResetOffsets moves a group's committed offsets, as kafka-consumer-groups
// --reset-offsets options do. Build it with ResetToEarliest, ResetToLatest, ResetToDatetime,
// ResetToOffset or ResetShiftBy.
type ResetSpec struct {
	kind resetKind
	n    int64
	at   time.Time
}

// ResetToEarliest moves to the log start offset (--to-earliest).
func ResetToEarliest() ResetSpec { return ResetSpec{kind: resetEarliest} }

// ResetToLatest moves to the log end offset, the high watermark (--to-latest): the group skips
// everything written so far.
func ResetToLatest() ResetSpec { return ResetSpec{kind: resetLatest} }

// ResetToDatetime moves to the first record with a timestamp at or after t, or the log end when none is
// that recent (--to-datetime).
func ResetToDatetime(t time.Time) ResetSpec { return ResetSpec{kind: resetDatetime, at: t} }

// ResetToOffset moves every partition to offset n, clamped to the partition's [log start, log end]
// (--to-offset).
func ResetToOffset(n int64) ResetSpec { return ResetSpec{kind: resetOffset, n: n} }

// ResetShiftBy moves each partition's committed offset by n (negative: back), clamped to [log start,
// log end] (--shift-by). A partition without a committed offset cannot be shifted: an error, as in
// Kafka.
func ResetShiftBy(n int64) ResetSpec { return ResetSpec{kind: resetShift, n: n} }

// String describes the spec as the CLI flag that makes it.
func (s ResetSpec) String() string {
	switch s.kind {
	case resetLatest:
		return "to-latest"
	case resetDatetime:
		return "to-datetime " + s.at.UTC().Format(time.RFC3339Nano)
	case resetOffset:
		return fmt.Sprintf("to-offset %d", s.n)
	case resetShift:
		return fmt.Sprintf("shift-by %d", s.n)
	}
	return "to-earliest"
}

// OffsetReset is one partition of a ResetOffsets plan.
type OffsetReset struct {
	Topic     string
	Partition int32
	// Current is the committed offset before the reset (-1: none); Target the one after.
	Current        int64
	Target         int64
	LogStartOffset int64
	LogEndOffset   int64
}

// ResetOffsets computes where spec moves the group's committed offsets of partitions and returns the
// plan, sorted; with execute it also commits the plan (as an admin: member id "", member epoch -1).
// The coordinator accepts that only while the group has no members, so with execute a group with
// members gives NON_EMPTY_GROUP and nothing changes; without execute the plan is returned anyway.
// Partitions that do not exist give UNKNOWN_TOPIC_OR_PARTITION. Kafka: kafka-consumer-groups
// --reset-offsets (--dry-run / --execute).
func (a *Admin) ResetOffsets(ctx context.Context, group string, partitions []TopicPartition, spec ResetSpec, execute bool) ([]OffsetReset, error) {
	if len(partitions) == 0 {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "reset offsets of group %q: no partitions given", group)
	}
	if execute {
		desc, err := a.DescribeGroup(ctx, group)
		if err != nil && !isCode(err, runnelv1.ErrorCode_GROUP_ID_NOT_FOUND) {
			return nil, err
		}
		if desc != nil && len(desc.Members) > 0 {
			return nil, rerr.New(runnelv1.ErrorCode_NON_EMPTY_GROUP, "group %q has %d member(s) (state %s); offsets can be reset only while it has none: stop its consumers first",
				group, len(desc.Members), desc.State)
		}
	}
	parts := slices.Clone(partitions)
	sortTopicPartitions(parts)
	parts = slices.Compact(parts)
	committed, err := fetchOffsets(ctx, newCoordinator(a.cl), group, parts, false)
	if err != nil {
		return nil, err
	}
	var topics []string
	for _, k := range parts {
		if len(topics) == 0 || topics[len(topics)-1] != k.Topic {
			topics = append(topics, k.Topic)
		}
	}
	ranges, err := a.topicRanges(ctx, topics)
	if err != nil {
		return nil, fmt.Errorf("reset offsets of group %q: %w", group, err)
	}
	plan := make([]OffsetReset, 0, len(parts))
	for _, k := range parts {
		r, ok := ranges[k]
		if !ok {
			return nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "reset offsets of group %q: %s does not exist", group, k)
		}
		cur := int64(-1)
		if c, ok := committed[k]; ok && c.Offset >= 0 {
			cur = c.Offset
		}
		row := OffsetReset{Topic: k.Topic, Partition: k.Partition, Current: cur, LogStartOffset: r.start, LogEndOffset: r.end}
		clamp := func(n int64) int64 { return min(max(n, r.start), r.end) }
		switch spec.kind {
		case resetEarliest:
			row.Target = r.start
		case resetLatest:
			row.Target = r.end
		case resetOffset:
			row.Target = clamp(spec.n)
		case resetShift:
			if cur < 0 {
				return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "reset offsets of group %q: cannot shift %s, which has no committed offset (use --to-offset, --to-earliest or --to-latest)", group, k)
			}
			row.Target = clamp(cur + spec.n)
		case resetDatetime:
			off, _, err := a.ListOffsets(ctx, k.Topic, k.Partition, OffsetAfterTime(spec.at))
			if err != nil {
				return nil, fmt.Errorf("reset offsets of group %q: %w", group, err)
			}
			if off < 0 {
				off = r.end // no record that recent: the end, as Kafka does
			}
			row.Target = clamp(off)
		}
		plan = append(plan, row)
	}
	if !execute {
		return plan, nil
	}
	req := &runnelv1.CommitOffsetsRequest{GroupId: group, MemberId: "", MemberEpoch: -1}
	for _, row := range plan {
		req.Partitions = append(req.Partitions, &runnelv1.CommitPartition{Topic: row.Topic, Partition: row.Partition, Offset: row.Target, LeaderEpoch: -1})
	}
	err = newCoordinator(a.cl).call(ctx, func(ctx context.Context, gc runnelv1.GroupsClient) error {
		resp, err := gc.CommitOffsets(ctx, req)
		if err != nil {
			return wireErr(err)
		}
		var errs []error
		for _, r := range resp.Partitions {
			if err := rerr.FromInfo(r.Error); err != nil {
				errs = append(errs, &PartitionError{Topic: r.Topic, Partition: r.Partition, Err: err})
			}
		}
		if err := errors.Join(errs...); err != nil {
			return final{err}
		}
		return nil
	})
	if err != nil {
		return plan, fmt.Errorf("reset offsets of group %q: %w", group, err)
	}
	return plan, nil
}
