package platform_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/group"
	"github.com/runnel-io/runnel/broker/txn"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/platform"
)

func (tn *testNode) groups() runnelv1.GroupsClient { return runnelv1.NewGroupsClient(tn.conn) }

// hb sends one heartbeat and returns the answer or the catalogue error.
func hb(t *testing.T, g runnelv1.GroupsClient, req *runnelv1.GroupHeartbeatRequest) (*runnelv1.GroupHeartbeatResponse, error) {
	t.Helper()
	resp, err := g.Heartbeat(ctxT(t), req)
	if err != nil {
		if _, ok := status.FromError(err); !ok {
			t.Fatalf("not a gRPC status: %v", err)
		}
		return nil, rerr.FromStatus(err)
	}
	return resp, nil
}

func isCode(err error, code runnelv1.ErrorCode) bool { return errors.Is(err, &rerr.Error{Code: code}) }

// joinStable joins a member and heartbeats (acknowledging revocations at once) until it is reconciled.
func joinStable(t *testing.T, g runnelv1.GroupsClient, req *runnelv1.GroupHeartbeatRequest) *runnelv1.GroupHeartbeatResponse {
	t.Helper()
	resp, err := hb(t, g, req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestGroupsBadInput sends every kind of bad group request to a real node: each gets its own error
// (as a gRPC status with an ErrorInfo detail, or per partition), and the group's stored state —
// DescribeGroups and FetchOffsets — is exactly as before.
func TestGroupsBadInput(t *testing.T) {
	tn := startNode(t, t.TempDir(), func(c *platform.Config) {
		c.Groups.MaxGroupSize = 3
		c.Groups.MaxSubscribedTopics = 5
	})
	tn.createTopic(t, "orders", 2, nil)
	if _, err := tn.produce(t, "orders", 0, makeBatch("o", 10, 1000, batch.CompressionNone), runnelv1.Acks_ACKS_ALL); err != nil {
		t.Fatal(err)
	}
	g := tn.groups()
	// Member a joins and owns both partitions; b joins, and a revokes orders-1 for b.
	a := joinStable(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", SubscribedTopicNames: []string{"orders"}})
	b := joinStable(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", SubscribedTopicNames: []string{"orders"}})
	a = joinStable(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: a.MemberId, MemberEpoch: a.MemberEpoch, SubscriptionUnchanged: true,
		OwnedPartitions: []*runnelv1.TopicPartitions{{Topic: "orders", Partitions: []int32{0, 1}}}})
	owned := func(r *runnelv1.GroupHeartbeatResponse) []*runnelv1.TopicPartitions { return r.Assignment.Partitions }
	aOwned := owned(a)
	a = joinStable(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: a.MemberId, MemberEpoch: a.MemberEpoch, SubscriptionUnchanged: true, OwnedPartitions: aOwned})
	b = joinStable(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: b.MemberId, MemberEpoch: b.MemberEpoch, SubscriptionUnchanged: true})
	if a.MemberEpoch != 2 || b.MemberEpoch != 2 || len(aOwned) != 1 || len(owned(b)) != 1 {
		t.Fatalf("setup: a %v, b %v", a, b)
	}
	aPart, bPart := aOwned[0].Partitions[0], b.Assignment.Partitions[0].Partitions[0]
	commit := func(member string, epoch int32, parts ...*runnelv1.CommitPartition) (*runnelv1.CommitOffsetsResponse, error) {
		resp, err := g.CommitOffsets(ctxT(t), &runnelv1.CommitOffsetsRequest{GroupId: "g", MemberId: member, MemberEpoch: epoch, Partitions: parts})
		return resp, rerr.FromStatus(err)
	}
	if r, err := commit(a.MemberId, 2, &runnelv1.CommitPartition{Topic: "orders", Partition: aPart, Offset: 0, Metadata: "first"}); err != nil || r.Partitions[0].Error != nil {
		t.Fatalf("good commit: %v %v", r, err)
	}
	state := func() string {
		d, err := g.DescribeGroups(ctxT(t), &runnelv1.DescribeGroupsRequest{GroupIds: []string{"g"}})
		if err != nil {
			t.Fatal(err)
		}
		o, err := g.FetchOffsets(ctxT(t), &runnelv1.FetchOffsetsRequest{GroupId: "g"})
		if err != nil {
			t.Fatal(err)
		}
		return d.String() + "\n" + o.String()
	}
	before := state()
	ownA := []*runnelv1.TopicPartitions{{Topic: "orders", Partitions: []int32{aPart}}}
	long := strings.Repeat("x", group.MaxIDBytes+1)
	many := []string{"t1", "t2", "t3", "t4", "t5", "t6"}

	// Calls that fail as a whole: a gRPC status whose detail names the code.
	for _, c := range []struct {
		name string
		call func() error
		want runnelv1.ErrorCode
	}{
		{"unknown member", func() error {
			_, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: "ghost", MemberEpoch: 2, SubscriptionUnchanged: true})
			return err
		}, runnelv1.ErrorCode_UNKNOWN_MEMBER_ID},
		{"stale epoch", func() error {
			// The previous epoch is accepted once in case its answer was lost, but only from a member
			// that claims nothing it no longer has; a claims b's partition too.
			both := []*runnelv1.TopicPartitions{{Topic: "orders", Partitions: []int32{0, 1}}}
			_, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: a.MemberId, MemberEpoch: 1, SubscriptionUnchanged: true, OwnedPartitions: both})
			return err
		}, runnelv1.ErrorCode_FENCED_MEMBER_EPOCH},
		{"future epoch", func() error {
			_, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: a.MemberId, MemberEpoch: 9, SubscriptionUnchanged: true, OwnedPartitions: ownA})
			return err
		}, runnelv1.ErrorCode_FENCED_MEMBER_EPOCH},
		{"invalid regex", func() error {
			_, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: a.MemberId, MemberEpoch: 2, SubscribedTopicRegex: "orders(", OwnedPartitions: ownA})
			return err
		}, runnelv1.ErrorCode_INVALID_REGULAR_EXPRESSION},
		{"too many topics", func() error {
			_, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: a.MemberId, MemberEpoch: 2, SubscribedTopicNames: many, OwnedPartitions: ownA})
			return err
		}, runnelv1.ErrorCode_INVALID_REQUEST},
		{"session timeout too short", func() error {
			_, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", SubscribedTopicNames: []string{"orders"}, SessionTimeoutMs: 10})
			return err
		}, runnelv1.ErrorCode_INVALID_SESSION_TIMEOUT},
		{"unknown assignor", func() error {
			_, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", SubscribedTopicNames: []string{"orders"}, ServerAssignor: "cooperative-sticky"})
			return err
		}, runnelv1.ErrorCode_UNSUPPORTED_ASSIGNOR},
		{"empty group id", func() error {
			_, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{SubscribedTopicNames: []string{"orders"}})
			return err
		}, runnelv1.ErrorCode_INVALID_GROUP_ID},
		{"long group id", func() error {
			_, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: long, SubscribedTopicNames: []string{"orders"}})
			return err
		}, runnelv1.ErrorCode_INVALID_GROUP_ID},
		{"control character in group id", func() error {
			_, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g\n", SubscribedTopicNames: []string{"orders"}})
			return err
		}, runnelv1.ErrorCode_INVALID_GROUP_ID},
		{"static leave without instance id", func() error {
			_, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: a.MemberId, MemberEpoch: -2})
			return err
		}, runnelv1.ErrorCode_INVALID_REQUEST},
		{"commit with a stale epoch", func() error {
			_, err := commit(a.MemberId, 1, &runnelv1.CommitPartition{Topic: "orders", Partition: aPart, Offset: 3})
			return err
		}, runnelv1.ErrorCode_STALE_MEMBER_EPOCH},
		{"commit with a future epoch", func() error {
			_, err := commit(a.MemberId, 3, &runnelv1.CommitPartition{Topic: "orders", Partition: aPart, Offset: 3})
			return err
		}, runnelv1.ErrorCode_FENCED_MEMBER_EPOCH},
		{"commit from an unknown member", func() error {
			_, err := commit("ghost", 2, &runnelv1.CommitPartition{Topic: "orders", Partition: aPart, Offset: 3})
			return err
		}, runnelv1.ErrorCode_UNKNOWN_MEMBER_ID},
		{"admin commit to a group with members", func() error {
			_, err := commit("", -1, &runnelv1.CommitPartition{Topic: "orders", Partition: aPart, Offset: 3})
			return err
		}, runnelv1.ErrorCode_NON_EMPTY_GROUP},
		{"commit of one partition twice", func() error {
			p := &runnelv1.CommitPartition{Topic: "orders", Partition: aPart, Offset: 3}
			_, err := commit(a.MemberId, 2, p, p)
			return err
		}, runnelv1.ErrorCode_INVALID_REQUEST},
		{"fetch offsets of a bad group id", func() error {
			_, err := g.FetchOffsets(ctxT(t), &runnelv1.FetchOffsetsRequest{GroupId: ""})
			return rerr.FromStatus(err)
		}, runnelv1.ErrorCode_INVALID_GROUP_ID},
	} {
		err := c.call()
		if !isCode(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
		if after := state(); after != before {
			t.Fatalf("%s changed the group:\nbefore %s\nafter %s", c.name, before, after)
		}
	}
	// The wire form: a status with the right gRPC code and an ErrorInfo detail.
	_, err := g.Heartbeat(ctxT(t), &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: "ghost", MemberEpoch: 2})
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || len(st.Details()) != 1 {
		t.Fatalf("status %v with details %v", st.Code(), st.Details())
	}

	// Per-partition refusals: the call succeeds and the partition says why.
	for _, c := range []struct {
		name string
		p    *runnelv1.CommitPartition
		want runnelv1.ErrorCode
	}{
		{"b's partition", &runnelv1.CommitPartition{Topic: "orders", Partition: bPart, Offset: 0}, runnelv1.ErrorCode_STALE_MEMBER_EPOCH},
		{"negative offset", &runnelv1.CommitPartition{Topic: "orders", Partition: aPart, Offset: -1}, runnelv1.ErrorCode_OFFSET_OUT_OF_RANGE},
		{"no such partition", &runnelv1.CommitPartition{Topic: "orders", Partition: 10, Offset: 1}, runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION},
		{"no such topic", &runnelv1.CommitPartition{Topic: "nope", Partition: 0, Offset: 1}, runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION},
		{"metadata too large", &runnelv1.CommitPartition{Topic: "orders", Partition: aPart, Offset: 0, Metadata: strings.Repeat("m", 4097)}, runnelv1.ErrorCode_OFFSET_METADATA_TOO_LARGE},
	} {
		resp, err := commit(a.MemberId, 2, c.p)
		if err != nil || resp.Partitions[0].Error.GetCode() != c.want {
			t.Errorf("%s: %v %v, want %v", c.name, resp, err, c.want)
		}
	}
	// Beyond the log end offset: orders-0 has 10 records, orders-1 none.
	leo := map[int32]int64{0: 10, 1: 0}
	if resp, err := commit(a.MemberId, 2, &runnelv1.CommitPartition{Topic: "orders", Partition: aPart, Offset: leo[aPart] + 1}); err != nil ||
		resp.Partitions[0].Error.GetCode() != runnelv1.ErrorCode_OFFSET_OUT_OF_RANGE {
		t.Fatalf("commit beyond the log end: %v %v", resp, err)
	}
	if after := state(); after != before {
		t.Fatalf("refused partitions changed the group:\nbefore %s\nafter %s", before, after)
	}

	// Too many members: the group holds 3.
	for i := 0; i < 3; i++ {
		_, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "full", SubscribedTopicNames: []string{"orders"}})
		if i < 3 && err != nil {
			t.Fatal(err)
		}
	}
	full := describeGroup(t, g, "full")
	if _, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "full", SubscribedTopicNames: []string{"orders"}}); !isCode(err, runnelv1.ErrorCode_GROUP_MAX_SIZE_REACHED) {
		t.Fatalf("4th member: %v", err)
	}
	if d := describeGroup(t, g, "full"); !proto.Equal(d, full) {
		t.Fatalf("refused join changed the group: %v", d)
	}
	del, err := g.DeleteGroups(ctxT(t), &runnelv1.DeleteGroupsRequest{GroupIds: []string{"full", "never"}})
	if err != nil || del.Groups[0].Error.GetCode() != runnelv1.ErrorCode_NON_EMPTY_GROUP || del.Groups[1].Error.GetCode() != runnelv1.ErrorCode_GROUP_ID_NOT_FOUND {
		t.Fatalf("delete: %v %v", del, err)
	}

	// __consumer_offsets: hidden from ListTopics, closed to producers, cannot be deleted.
	lt, err := tn.admin.ListTopics(ctxT(t), &runnelv1.ListTopicsRequest{})
	if err != nil || len(lt.Topics) != 1 {
		t.Fatalf("list topics: %v %v", lt, err)
	}
	lt, err = tn.admin.ListTopics(ctxT(t), &runnelv1.ListTopicsRequest{IncludeInternal: true})
	// Sorted by name: __consumer_offsets, __transaction_state (the transaction coordinator's), orders.
	if err != nil || len(lt.Topics) != 3 || lt.Topics[0].Name != group.OffsetsTopic || !lt.Topics[0].Internal || lt.Topics[0].Partitions != 50 ||
		lt.Topics[1].Name != txn.StateTopic || !lt.Topics[1].Internal {
		t.Fatalf("list topics with internal: %v %v", lt, err)
	}
	if _, err := tn.produce(t, group.OffsetsTopic, 0, makeBatch("x", 1, 0, batch.CompressionNone), runnelv1.Acks_ACKS_ALL); !errors.Is(err, rerr.ErrInvalidRequest) {
		t.Fatalf("produce to %s: %v", group.OffsetsTopic, err)
	}
	dt, err := tn.admin.DeleteTopics(ctxT(t), &runnelv1.DeleteTopicsRequest{Topics: []string{group.OffsetsTopic}})
	if err != nil || dt.Topics[0].Error.GetCode() != runnelv1.ErrorCode_INVALID_REQUEST {
		t.Fatalf("delete %s: %v %v", group.OffsetsTopic, dt, err)
	}
	if after := state(); after != before {
		t.Fatalf("the group changed:\nbefore %s\nafter %s", before, after)
	}
}

// TestGroupsRestart: committed offsets, group epochs, members and static reservations survive a node
// restart; a member carries on with its id and epoch, and a static member's restart gets its
// partitions back without a rebalance.
func TestGroupsRestart(t *testing.T) {
	// Registered first, so it runs after the nodes are closed: the coordinator's timer goroutine and
	// everything else a node starts must be gone.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	dir := t.TempDir()
	tn := startNode(t, dir)
	tn.createTopic(t, "events", 4, nil)
	for p := int32(0); p < 4; p++ {
		if _, err := tn.produce(t, "events", p, makeBatch("e", 20, 1000, batch.CompressionNone), runnelv1.Acks_ACKS_ALL); err != nil {
			t.Fatal(err)
		}
	}
	g := tn.groups()
	sub := []string{"events"}
	a := joinStable(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", SubscribedTopicNames: sub, InstanceId: "ia"})
	b := joinStable(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", SubscribedTopicNames: sub})
	ownedA := a.Assignment.Partitions
	// a revokes half for b: heartbeat until both are stable.
	for i := 0; i < 10; i++ {
		ra := joinStable(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: a.MemberId, MemberEpoch: a.MemberEpoch, InstanceId: "ia", SubscriptionUnchanged: true, OwnedPartitions: ownedA})
		if ra.Assignment != nil {
			ownedA = ra.Assignment.Partitions
		}
		a = ra
		rb := joinStable(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: b.MemberId, MemberEpoch: b.MemberEpoch, SubscriptionUnchanged: true, OwnedPartitions: b.GetAssignment().GetPartitions()})
		if rb.Assignment != nil {
			b.Assignment = rb.Assignment
		}
		b.MemberEpoch = rb.MemberEpoch
		if d := describeGroup(t, g, "g"); d.State == "stable" {
			break
		}
	}
	if d := describeGroup(t, g, "g"); d.State != "stable" {
		t.Fatalf("not stable: %v", d)
	}
	var parts []*runnelv1.CommitPartition
	for _, tps := range ownedA {
		for _, p := range tps.Partitions {
			parts = append(parts, &runnelv1.CommitPartition{Topic: "events", Partition: p, Offset: int64(5 + p), LeaderEpoch: 0, Metadata: "m"})
		}
	}
	cr, err := g.CommitOffsets(ctxT(t), &runnelv1.CommitOffsetsRequest{GroupId: "g", MemberId: a.MemberId, MemberEpoch: a.MemberEpoch, Partitions: parts})
	if err != nil || cr.Partitions[0].Error != nil {
		t.Fatalf("commit: %v %v", cr, err)
	}
	// a restarts as well (it leaves for now, keeping its partitions reserved), then the node restarts.
	if _, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: a.MemberId, MemberEpoch: -2, InstanceId: "ia"}); err != nil {
		t.Fatal(err)
	}
	offsetsBefore, err := g.FetchOffsets(ctxT(t), &runnelv1.FetchOffsetsRequest{GroupId: "g"})
	if err != nil || len(offsetsBefore.Offsets) != len(parts) {
		t.Fatalf("offsets: %v %v", offsetsBefore, err)
	}
	descBefore := describeGroup(t, g, "g")
	tn.close()

	tn = startNode(t, dir)
	g = tn.groups()
	offsetsAfter, err := g.FetchOffsets(ctxT(t), &runnelv1.FetchOffsetsRequest{GroupId: "g"})
	if err != nil || !proto.Equal(offsetsAfter, offsetsBefore) {
		t.Fatalf("offsets after restart:\n%v\nbefore:\n%v (%v)", offsetsAfter, offsetsBefore, err)
	}
	descAfter := describeGroup(t, g, "g")
	for _, d := range []*runnelv1.GroupDescription{descBefore, descAfter} {
		for _, m := range d.Members {
			m.ClientHost = "" // a new connection after the restart
		}
	}
	if !proto.Equal(descAfter, descBefore) {
		t.Fatalf("group after restart:\n%v\nbefore:\n%v", descAfter, descBefore)
	}
	// b carries on as if nothing happened.
	rb, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: b.MemberId, MemberEpoch: b.MemberEpoch, SubscriptionUnchanged: true, OwnedPartitions: b.Assignment.Partitions})
	if err != nil || rb.MemberEpoch != b.MemberEpoch || rb.Assignment != nil {
		t.Fatalf("b after restart: %v %v", rb, err)
	}
	// a's new process comes back with its instance id: same partitions, same epoch, no rebalance.
	ra, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", InstanceId: "ia", SubscribedTopicNames: sub})
	if err != nil || ra.MemberEpoch != a.MemberEpoch || !proto.Equal(&runnelv1.Assignment{Partitions: ownedA}, ra.Assignment) {
		t.Fatalf("a's restart: %v %v, want epoch %d and %v", ra, err, a.MemberEpoch, ownedA)
	}
	if d := describeGroup(t, g, "g"); d.GroupEpoch != descBefore.GroupEpoch || d.State != "stable" {
		t.Fatalf("group after a's return: %v", d)
	}
}

// TestGroupsOwnership: members join, leave, crash and restart in random order (fixed seed), some of
// them slow to revoke, while a checker records each member's ownership intervals from its own side. No
// partition may ever be owned by two members at once, and once the churn stops the group converges to
// a balanced assignment covering every partition.
func TestGroupsOwnership(t *testing.T) {
	const (
		session   = 2 * time.Second
		rebalance = 3 * time.Second
		churn     = 6 * time.Second
	)
	tn := startNode(t, t.TempDir(), func(c *platform.Config) {
		c.Groups.HeartbeatInterval = 200 * time.Millisecond
		c.Groups.ReconcilingHeartbeatInterval = 50 * time.Millisecond
		c.Groups.MinSessionTimeout = 500 * time.Millisecond
		c.Groups.TickInterval = 20 * time.Millisecond
	})
	tn.createTopic(t, "a", 8, nil)
	tn.createTopic(t, "b", 4, nil)
	const partitions = 12
	rng := rand.New(rand.NewPCG(1, 2))
	check := newOwnershipChecker()
	var members []*simMember
	for i := 0; i < 10; i++ {
		m := &simMember{name: fmt.Sprintf("m%d", i), group: "g", topics: []string{"a", "b"}, groups: tn.groups(), check: check,
			session: session, rebalance: rebalance, rng: rand.New(rand.NewPCG(uint64(i), 7))}
		if i%3 == 0 {
			m.instance = fmt.Sprintf("instance-%d", i)
		}
		if i == 4 {
			m.topics, m.regex = nil, "a|b" // the same topics, by regex
		}
		if i%2 == 1 {
			m.maxRevokeDelay = 300 * time.Millisecond
		}
		members = append(members, m)
	}
	running := map[*simMember]bool{}
	for _, m := range members[:6] {
		m.start()
		running[m] = true
	}
	t.Cleanup(func() {
		for m := range running {
			m.stop(stopCrash)
		}
	})
	actions := map[string]int{}
	for end := time.Now().Add(churn); time.Now().Before(end); {
		time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond) // the pace of the churn, not a wait for a condition
		m := members[rng.IntN(len(members))]
		switch {
		case !running[m]:
			m.start()
			running[m] = true
			actions["start"]++
		case len(running) <= 2:
		default:
			mode := stopMode(rng.IntN(3))
			m.stop(mode)
			delete(running, m)
			actions[[]string{"crash", "leave", "static leave"}[mode]]++
		}
		if p := joinProblems(members, check); p != "" {
			t.Fatalf("during churn:\n%s", p)
		}
	}
	t.Logf("churn: %v", actions)
	var live []*simMember
	for _, m := range members {
		if running[m] {
			live = append(live, m)
		}
	}
	waitFor(t, 30*time.Second, func() string {
		if p := joinProblems(members, check); p != "" {
			t.Fatalf("while converging:\n%s", p)
		}
		return converged(t, tn.groups(), "g", live, partitions)
	})
	owners := check.snapshot()
	if len(owners) != partitions {
		t.Fatalf("the checker sees %d owned partitions, want %d", len(owners), partitions)
	}
	n := 0
	for _, ivs := range check.intervals {
		n += len(ivs)
	}
	t.Logf("%d ownership intervals closed, %d open; %d live members, state %s", n, len(owners), len(live), describeGroup(t, tn.groups(), "g").State)
}

// TestGroupJoinTime measures, with the default heartbeat interval (5s) and session timeout, how long
// a member joining a group of 50 members over 600 partitions takes until it owns partitions (and until
// it owns all of its share). The other members commit on revocation and acknowledge at once, as the
// SDK does. Skipped with -short: forming the group takes a few heartbeat intervals.
func TestGroupJoinTime(t *testing.T) {
	if testing.Short() {
		t.Skip("forms a 50-member group at the default 5s heartbeat interval")
	}
	first, full := measureJoin(t, 1)
	if first[0] > 2*time.Second {
		t.Fatalf("joining took %v until the first partition, want under 2s", first[0])
	}
	t.Logf("join of the 51st member: first partition after %v, all of its share after %v", first[0], full[0])
}

// BenchmarkGroupJoin reports the join time of TestGroupJoinTime over b.N joins (the member leaves and
// the group settles between them): ms-first is until the first partition, ms-full until all of its
// share.
func BenchmarkGroupJoin(b *testing.B) {
	first, full := measureJoin(b, b.N)
	var sf, sa time.Duration
	for i := range first {
		sf += first[i]
		sa += full[i]
	}
	b.ReportMetric(float64(sf.Milliseconds())/float64(len(first)), "ms-first")
	b.ReportMetric(float64(sa.Milliseconds())/float64(len(full)), "ms-full")
	b.ReportMetric(0, "ns/op")
}

func measureJoin(t testing.TB, joins int) (first, full []time.Duration) {
	tn := startNode(t, t.TempDir()) // default group config: 5s heartbeats, 45s sessions
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const partitions = 600
	cr, err := tn.admin.CreateTopics(ctx, &runnelv1.CreateTopicsRequest{Topics: []*runnelv1.NewTopic{{Name: "big", Partitions: partitions}}})
	if err != nil || cr.Topics[0].Error != nil {
		t.Fatalf("create topic: %v %v", cr, err)
	}
	check := newOwnershipChecker()
	rng := rand.New(rand.NewPCG(3, 4))
	newMember := func(name string, delay time.Duration) *simMember {
		return &simMember{name: name, group: "join", topics: []string{"big"}, groups: tn.groups(), check: check,
			session: 45 * time.Second, rebalance: 5 * time.Minute, commitOnRevoke: true, startDelay: delay,
			reconcilingInterval: group.DefaultConfig().ReconcilingHeartbeatInterval,
			rng:                 rand.New(rand.NewPCG(rng.Uint64(), 1))}
	}
	var members []*simMember
	for i := 0; i < 50; i++ {
		// Joins spread over one heartbeat interval, so heartbeats are spread as in a group that has run
		// for a while.
		m := newMember(fmt.Sprintf("m%02d", i), time.Duration(rng.Int64N(int64(5*time.Second))))
		m.start()
		members = append(members, m)
	}
	newcomer := newMember("new", 0)
	running := false
	t.Cleanup(func() {
		for _, m := range members {
			m.stop(stopCrash)
		}
		if running {
			newcomer.stop(stopCrash)
		}
	})
	settle := func(live []*simMember) {
		waitFor(t, 2*time.Minute, func() string {
			if p := joinProblems(append(members, newcomer), check); p != "" {
				t.Fatalf("%s", p)
			}
			return converged(t, tn.groups(), "join", live, partitions)
		})
	}
	settle(members)
	for i := 0; i < joins; i++ {
		newcomer.start()
		running = true
		settle(append(members, newcomer))
		newcomer.mu.Lock()
		first = append(first, newcomer.firstOwned.Sub(newcomer.joinSent))
		full = append(full, newcomer.reconciled.Sub(newcomer.joinSent))
		newcomer.mu.Unlock()
		t.Logf("join %d: first partition after %v, all %d of its share after %v", i+1, first[i], len(newcomer.ownedList()), full[i])
		newcomer.stop(stopLeave)
		running = false
		if i < joins-1 {
			settle(members)
		}
	}
	return first, full
}
