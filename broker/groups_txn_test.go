package broker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/group"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/platform"
	"github.com/runnel-io/runnel/platform/platformtest"
)

// groupTxnNode is a real single-node cluster (group and transaction coordinators wired as the node
// wires them) driven over gRPC, with a topic "in" of one partition holding 10 records.
type groupTxnNode struct {
	n      *platform.Node
	groups runnelv1.GroupsClient
	txns   runnelv1.TransactionsClient
}

func startGroupTxnNode(t *testing.T, dir string, create bool) *groupTxnNode {
	t.Helper()
	n := platformtest.StartNode(t, dir)
	conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	gn := &groupTxnNode{n: n, groups: runnelv1.NewGroupsClient(conn), txns: runnelv1.NewTransactionsClient(conn)}
	if create {
		ctx := gtCtx(t)
		resp, err := n.Broker().CreateTopics(ctx, &runnelv1.CreateTopicsRequest{Topics: []*runnelv1.NewTopic{{Name: "in", Partitions: 1}}})
		if err != nil {
			t.Fatal(rerr.FromStatus(err))
		}
		if err := rerr.FromInfo(resp.Topics[0].Error); err != nil {
			t.Fatal(err)
		}
		var b batch.Builder
		for range 10 {
			b.Append(1000, nil, []byte("v"), nil)
		}
		pr, err := n.Broker().Produce(ctx, &runnelv1.ProduceRequest{Acks: runnelv1.Acks_ACKS_ALL,
			Partitions: []*runnelv1.ProducePartition{{Topic: "in", Partition: 0, Records: append([]byte(nil), b.Build(batch.CompressionNone)...)}}})
		if err != nil {
			t.Fatal(rerr.FromStatus(err))
		}
		if err := rerr.FromInfo(pr.Partitions[0].Error); err != nil {
			t.Fatal(err)
		}
	}
	return gn
}

func gtCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// gtRetry calls fn until it returns nil or an error that is not retriable, for at most 20s (the
// coordinators load their partitions after a start).
func gtRetry(t *testing.T, fn func() error) error {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := rerr.FromStatus(fn())
		var e *rerr.Error
		if err == nil || !errors.As(err, &e) || !e.Retriable() || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (gn *groupTxnNode) join(t *testing.T) *runnelv1.GroupHeartbeatResponse {
	t.Helper()
	var resp *runnelv1.GroupHeartbeatResponse
	if err := gtRetry(t, func() (err error) {
		resp, err = gn.groups.Heartbeat(gtCtx(t), &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberEpoch: group.JoinEpoch, SubscribedTopicNames: []string{"in"}})
		return err
	}); err != nil {
		t.Fatalf("join: %v", err)
	}
	if resp.Assignment == nil || len(resp.Assignment.Partitions) != 1 {
		t.Fatalf("join: assignment %v", resp.Assignment)
	}
	return resp
}

func (gn *groupTxnNode) initProducer(t *testing.T, id string) *runnelv1.TxnProducer {
	t.Helper()
	var init *runnelv1.InitTxnProducerIdResponse
	if err := gtRetry(t, func() (err error) {
		init, err = gn.txns.InitProducerId(gtCtx(t), &runnelv1.InitTxnProducerIdRequest{TransactionalId: id})
		return err
	}); err != nil {
		t.Fatalf("InitProducerId: %v", err)
	}
	return &runnelv1.TxnProducer{TransactionalId: id, ProducerId: init.ProducerId, ProducerEpoch: init.ProducerEpoch}
}

func (gn *groupTxnNode) addOffsets(t *testing.T, p *runnelv1.TxnProducer) {
	t.Helper()
	if err := gtRetry(t, func() error {
		_, err := gn.txns.AddOffsetsToTxn(gtCtx(t), &runnelv1.AddOffsetsToTxnRequest{Producer: p, GroupId: "g"})
		return err
	}); err != nil {
		t.Fatalf("AddOffsetsToTxn: %v", err)
	}
}

func (gn *groupTxnNode) endTxn(t *testing.T, p *runnelv1.TxnProducer, commit bool) {
	t.Helper()
	var resp *runnelv1.EndTxnResponse
	if err := gtRetry(t, func() (err error) {
		resp, err = gn.txns.EndTxn(gtCtx(t), &runnelv1.EndTxnRequest{Producer: p, Commit: commit})
		return err
	}); err != nil {
		t.Fatalf("EndTxn: %v", err)
	}
	p.ProducerEpoch = resp.ProducerEpoch // the next transaction's epoch (KIP-890 part 2)
}

// commit sends a TxnOffsetCommit of in-0 at offset and returns the call's or the partition's error.
func (gn *groupTxnNode) commit(t *testing.T, p *runnelv1.TxnProducer, m *runnelv1.GroupHeartbeatResponse, offset int64) error {
	t.Helper()
	resp, err := gn.groups.TxnOffsetCommit(gtCtx(t), &runnelv1.TxnOffsetCommitRequest{GroupId: "g", TransactionalId: p.TransactionalId,
		ProducerId: p.ProducerId, ProducerEpoch: p.ProducerEpoch, MemberId: m.MemberId, MemberEpoch: m.MemberEpoch,
		Partitions: []*runnelv1.CommitPartition{{Topic: "in", Partition: 0, Offset: offset, LeaderEpoch: -1}}})
	if err != nil {
		return rerr.FromStatus(err)
	}
	return rerr.FromInfo(resp.Partitions[0].Error)
}

// offset fetches the group's offset of in-0; with stable, an unstable partition answers its error.
func (gn *groupTxnNode) offset(t *testing.T, stable bool) (int64, error) {
	t.Helper()
	var resp *runnelv1.FetchOffsetsResponse
	if err := gtRetry(t, func() (err error) {
		resp, err = gn.groups.FetchOffsets(gtCtx(t), &runnelv1.FetchOffsetsRequest{GroupId: "g", RequireStable: stable,
			Partitions: []*runnelv1.TopicPartitions{{Topic: "in", Partitions: []int32{0}}}})
		return err
	}); err != nil {
		t.Fatalf("FetchOffsets: %v", err)
	}
	o := resp.Offsets[0]
	return o.Offset, rerr.FromInfo(o.Error)
}

// waitOffset polls until in-0's stable offset is want: markers are written after EndTxn answers.
func (gn *groupTxnNode) waitOffset(t *testing.T, want int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := gn.offset(t, true)
		if err == nil && got == want {
			return
		}
		if err != nil && !errors.Is(err, rerr.ErrUnstableOffsetCommit) || time.Now().After(deadline) {
			t.Fatalf("offset of in-0: %d %v, want %d", got, err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// offsetsLog returns the batches of the group's __consumer_offsets partition.
func (gn *groupTxnNode) offsetsLog(t *testing.T) []seenBatch {
	t.Helper()
	p := group.PartitionFor("g", platform.DefaultConfig().Groups.WithDefaults().OffsetsTopicPartitions)
	var out []seenBatch
	for next := int64(0); ; {
		resp, err := gn.n.Broker().Fetch(gtCtx(t), &runnelv1.FetchRequest{Partitions: []*runnelv1.FetchPartition{{Topic: group.OffsetsTopic, Partition: p, FetchOffset: next}}})
		if err != nil {
			t.Fatal(rerr.FromStatus(err))
		}
		r := resp.Partitions[0]
		if err := rerr.FromInfo(r.Error); err != nil {
			t.Fatal(err)
		}
		if len(r.Records) == 0 {
			return out
		}
		bs := batches(t, r.Records)
		out = append(out, bs...)
		next = bs[len(bs)-1].next
	}
}

// TestTxnOffsetCommitNode drives offsets in transactions through a real node: TxnOffsetCommit is
// verified with the transaction coordinator (AddOffsetsToTxn first), stays pending (require_stable
// answers UNSTABLE_OFFSET_COMMIT) until EndTxn's marker reaches the group's partition, COMMIT makes it
// the committed offset and ABORT drops it, a fenced producer is refused, the markers carry the first
// offset of the transaction's batch, and pending offsets survive a restart.
func TestTxnOffsetCommitNode(t *testing.T) {
	dir := t.TempDir()
	gn := startGroupTxnNode(t, dir, true)
	m := gn.join(t)
	p := gn.initProducer(t, "app")

	// Without AddOffsetsToTxn the transaction coordinator refuses (KIP-890 verification).
	if err := gn.commit(t, p, m, 3); !errors.Is(err, rerr.ErrInvalidTxnState) {
		t.Fatalf("TxnOffsetCommit before AddOffsetsToTxn: %v, want INVALID_TXN_STATE", err)
	}
	gn.addOffsets(t, p)
	// Member fencing is the group's: an epoch the member never had is fenced.
	if err := gn.commit(t, p, &runnelv1.GroupHeartbeatResponse{MemberId: m.MemberId, MemberEpoch: m.MemberEpoch + 5}, 3); !errors.Is(err, &rerr.Error{Code: runnelv1.ErrorCode_FENCED_MEMBER_EPOCH}) {
		t.Fatalf("TxnOffsetCommit at a future member epoch: %v", err)
	}
	if err := gn.commit(t, p, m, 3); err != nil {
		t.Fatalf("TxnOffsetCommit: %v", err)
	}
	if off, err := gn.offset(t, false); err != nil || off != -1 {
		t.Fatalf("offset while the transaction is open: %d %v, want -1", off, err)
	}
	if _, err := gn.offset(t, true); !errors.Is(err, rerr.ErrUnstableOffsetCommit) {
		t.Fatalf("require_stable while the transaction is open: %v", err)
	}
	gn.endTxn(t, p, true)
	gn.waitOffset(t, 3)

	// Abort: the offset stays where the commit put it.
	gn.addOffsets(t, p)
	if err := gn.commit(t, p, m, 7); err != nil {
		t.Fatal(err)
	}
	gn.endTxn(t, p, false)
	gn.waitOffset(t, 3)

	// Every transactional batch is followed by its producer's marker, whose first offset is the batch's.
	var txnBatches, markers []seenBatch
	for _, b := range gn.offsetsLog(t) {
		switch {
		case b.control:
			markers = append(markers, b)
		case b.pid == p.ProducerId:
			txnBatches = append(txnBatches, b)
		}
	}
	if len(txnBatches) != 2 || len(markers) != 2 || !markers[0].marker.Commit || markers[1].marker.Commit {
		t.Fatalf("__consumer_offsets holds transactional batches %+v and markers %+v, want 2 and COMMIT, ABORT", txnBatches, markers)
	}
	for i, mk := range markers {
		if mk.pid != p.ProducerId || mk.marker.FirstOffset != txnBatches[i].base || mk.base < txnBatches[i].next {
			t.Fatalf("marker %+v for transactional batch %+v", mk, txnBatches[i])
		}
	}

	// A new incarnation of the transactional id fences the old producer.
	p2 := gn.initProducer(t, "app")
	if err := gn.commit(t, p, m, 5); !errors.Is(err, rerr.ErrProducerFenced) {
		t.Fatalf("TxnOffsetCommit of a fenced producer: %v, want PRODUCER_FENCED", err)
	}

	// Pending offsets survive a restart: the transactional batch is replayed as pending, and the
	// marker written after the restart commits it.
	gn.addOffsets(t, p2)
	if err := gn.commit(t, p2, m, 9); err != nil {
		t.Fatal(err)
	}
	if err := gn.n.Close(); err != nil {
		t.Fatal(err)
	}
	gn = startGroupTxnNode(t, dir, false)
	if _, err := gn.offset(t, true); !errors.Is(err, rerr.ErrUnstableOffsetCommit) {
		t.Fatalf("require_stable after a restart with the transaction open: %v", err)
	}
	if off, err := gn.offset(t, false); err != nil || off != 3 {
		t.Fatalf("offset after a restart: %d %v, want 3", off, err)
	}
	// The group refuses deletion while the transaction holds its offsets (its member left first).
	if err := gtRetry(t, func() error {
		_, err := gn.groups.Heartbeat(gtCtx(t), &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: m.MemberId, MemberEpoch: group.LeaveEpoch})
		return err
	}); err != nil {
		t.Fatalf("leave: %v", err)
	}
	del, err := gn.groups.DeleteGroups(gtCtx(t), &runnelv1.DeleteGroupsRequest{GroupIds: []string{"g"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := rerr.FromInfo(del.Groups[0].Error); !errors.Is(err, &rerr.Error{Code: runnelv1.ErrorCode_NON_EMPTY_GROUP}) {
		t.Fatalf("delete of a group with offsets in an open transaction: %v", err)
	}
	gn.endTxn(t, p2, true)
	gn.waitOffset(t, 9)
}
