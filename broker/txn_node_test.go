package broker_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/platform"
	"github.com/runnel-io/runnel/platform/platformtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// txnBatch is a batch of producer pid (epoch, base sequence seq) holding vals, transactional or not
// (pid -1: a plain batch).
func txnBatch(pid int64, epoch int16, seq int32, txn bool, vals ...string) []byte {
	var bb batch.Builder
	for _, v := range vals {
		bb.Append(1000, nil, []byte(v), nil)
	}
	if pid >= 0 {
		bb.SetProducer(pid, epoch, seq)
	}
	bb.SetTransactional(txn)
	return append([]byte(nil), bb.Build(batch.CompressionNone)...)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, what string, err error, code runnelv1.ErrorCode) {
	t.Helper()
	var e *rerr.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("%s: %v, want %v", what, err, code)
	}
}

// txnNode is a real single-node cluster with a topic "txn" of two partitions, driven through its
// broker in-process.
type txnNode struct {
	n *platform.Node
	b *broker.Broker
}

func startTxnNode(t *testing.T, dir string, create bool) *txnNode {
	t.Helper()
	n := platformtest.StartNode(t, dir)
	tn := &txnNode{n: n, b: n.Broker()}
	// Transactions off whatever the node wires: these tests stage transactional data themselves.
	tn.b.SetTxnVerifier(nil)
	if create {
		resp, err := tn.b.CreateTopics(testCtx(t), &runnelv1.CreateTopicsRequest{Topics: []*runnelv1.NewTopic{{Name: "txn", Partitions: 2}}})
		if err != nil {
			t.Fatal(rerr.FromStatus(err))
		}
		if err := rerr.FromInfo(resp.Topics[0].Error); err != nil {
			t.Fatal(err)
		}
	}
	return tn
}

func (tn *txnNode) produce(t *testing.T, txnID string, records []byte) error {
	t.Helper()
	resp, err := tn.b.Produce(testCtx(t), &runnelv1.ProduceRequest{Acks: runnelv1.Acks_ACKS_ALL, TransactionalId: txnID,
		Partitions: []*runnelv1.ProducePartition{{Topic: "txn", Partition: 0, Records: records}}})
	if err != nil {
		return rerr.FromStatus(err)
	}
	return rerr.FromInfo(resp.Partitions[0].Error)
}

// stage appends batches to txn-0 as a leader that admitted them would have, and returns the base offset.
func (tn *txnNode) stage(t *testing.T, records []byte) int64 {
	t.Helper()
	res, err := tn.b.AppendForTest(testCtx(t), "txn", 0, records)
	if err != nil {
		t.Fatal(err)
	}
	return res.BaseOffset
}

func (tn *txnNode) fetch(t *testing.T, level runnelv1.IsolationLevel, offset int64) *runnelv1.FetchPartitionResult {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := tn.b.Fetch(testCtx(t), &runnelv1.FetchRequest{IsolationLevel: level,
			Partitions: []*runnelv1.FetchPartition{{Topic: "txn", Partition: 0, FetchOffset: offset}}})
		if err != nil {
			t.Fatal(rerr.FromStatus(err))
		}
		r := resp.Partitions[0]
		err = rerr.FromInfo(r.Error)
		if err == nil {
			return r
		}
		if !rerr.FromError(err).Retriable() || time.Now().After(deadline) {
			t.Fatalf("fetch at %d: %v", offset, err)
		}
		time.Sleep(20 * time.Millisecond) // a restarted node takes its leadership back
	}
}

func (tn *txnNode) latest(t *testing.T, level runnelv1.IsolationLevel) int64 {
	t.Helper()
	resp, err := tn.b.ListOffsets(testCtx(t), &runnelv1.ListOffsetsRequest{IsolationLevel: level,
		Partitions: []*runnelv1.ListOffsetsPartition{{Topic: "txn", Partition: 0, Spec: runnelv1.OffsetSpec_LATEST}}})
	if err != nil {
		t.Fatal(rerr.FromStatus(err))
	}
	if err := rerr.FromInfo(resp.Partitions[0].Error); err != nil {
		t.Fatal(err)
	}
	return resp.Partitions[0].Offset
}

// marker writes one marker to the listed partitions of txn and returns the per-partition errors.
func (tn *txnNode) marker(t *testing.T, pid int64, epoch int32, commit bool, coord int32, partitions ...int32) []error {
	t.Helper()
	resp, err := tn.b.WriteTxnMarkers(testCtx(t), &runnelv1.WriteTxnMarkersRequest{Markers: []*runnelv1.TxnMarker{{
		ProducerId: pid, ProducerEpoch: epoch, Commit: commit, CoordinatorEpoch: coord, TransactionalId: "tx",
		Partitions: []*runnelv1.TopicPartitions{{Topic: "txn", Partitions: partitions}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Markers) != 1 || resp.Markers[0].ProducerId != pid || len(resp.Markers[0].Partitions) != len(partitions) {
		t.Fatalf("WriteTxnMarkers answer %v", resp)
	}
	errs := make([]error, len(partitions))
	for i, r := range resp.Markers[0].Partitions {
		if r.Topic != "txn" || r.Partition != partitions[i] {
			t.Fatalf("result %d names %s-%d, want txn-%d", i, r.Topic, r.Partition, partitions[i])
		}
		errs[i] = rerr.FromInfo(r.Error)
	}
	return errs
}

func (tn *txnNode) mustMarker(t *testing.T, pid int64, epoch int32, commit bool, coord int32) {
	t.Helper()
	if err := tn.marker(t, pid, epoch, commit, coord, 0)[0]; err != nil {
		t.Fatalf("marker of producer %d: %v", pid, err)
	}
}

// batches lists base offset, producer and control flag of each batch in recs, and the marker of control
// batches.
type seenBatch struct {
	base, next int64
	pid        int64
	control    bool
	marker     batch.ControlMarker
}

func batches(t *testing.T, recs []byte) []seenBatch {
	t.Helper()
	var out []seenBatch
	err := batch.Split(recs, func(b []byte, h batch.Header) error {
		s := seenBatch{base: h.BaseOffset, next: h.NextOffset(), pid: h.ProducerID, control: h.IsControl()}
		if s.control {
			m, err := batch.ParseControl(b)
			if err != nil {
				return err
			}
			s.marker = m
		}
		out = append(out, s)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func aborted(r *runnelv1.FetchPartitionResult) [][2]int64 {
	var out [][2]int64
	for _, a := range r.AbortedTransactions {
		out = append(out, [2]int64{a.ProducerId, a.FirstOffset})
	}
	return out
}

// TestTransactionalProduceRefused: without a transaction coordinator (no TxnVerifier), transactional
// batches are refused, as are transactional batches without a transactional id, control batches from
// producers, and a transactional id on Records.InitProducerId.
func TestTransactionalProduceRefused(t *testing.T) {
	tn := startTxnNode(t, t.TempDir(), true)
	_, err := tn.b.InitProducerId(testCtx(t), &runnelv1.InitProducerIdRequest{TransactionalId: "tx"})
	wantCode(t, "InitProducerId with a transactional id", rerr.FromStatus(err), runnelv1.ErrorCode_INVALID_REQUEST)
	init, err := tn.b.InitProducerId(testCtx(t), &runnelv1.InitProducerIdRequest{})
	if err != nil {
		t.Fatal(err)
	}
	pid := init.ProducerId
	txn := txnBatch(pid, 0, 0, true, "a")
	wantCode(t, "transactional batch without transactional_id", tn.produce(t, "", txn), runnelv1.ErrorCode_INVALID_REQUEST)
	err = tn.produce(t, "tx", txn)
	wantCode(t, "transactional batch without a verifier", err, runnelv1.ErrorCode_INVALID_REQUEST)
	if e := rerr.FromError(err); !strings.Contains(e.Message, "transactions are not enabled") {
		t.Fatalf("refusal without a verifier says %q", e.Message)
	}
	ctl := batch.BuildControl(pid, 0, 1000, batch.ControlMarker{Commit: true, FirstOffset: -1})
	wantCode(t, "control batch", tn.produce(t, "tx", ctl), runnelv1.ErrorCode_INVALID_REQUEST)
	wantCode(t, "control batch", tn.produce(t, "", ctl), runnelv1.ErrorCode_INVALID_REQUEST)
	// Idempotent and plain produce work as before, and nothing refused was written.
	if err := tn.produce(t, "", txnBatch(pid, 0, 0, false, "i")); err != nil {
		t.Fatal(err)
	}
	if err := tn.produce(t, "", txnBatch(-1, 0, 0, false, "p")); err != nil {
		t.Fatal(err)
	}
	if got := tn.fetch(t, runnelv1.IsolationLevel_READ_UNCOMMITTED, 0); got.HighWatermark != 2 || got.LastStableOffset != 2 {
		t.Fatalf("HW %d, LSO %d after two accepted batches, want 2 and 2", got.HighWatermark, got.LastStableOffset)
	}
}

// TestTxnMarkersOnNode drives the leader's side of transactions on a real node: the LSO holds
// read_committed fetches and ListOffsets at the first offset of the oldest ongoing transaction;
// WriteTxnMarkers appends markers carrying the transaction's first offset, ends the transaction, and
// refuses older producer and coordinator epochs; read_committed answers list the aborted transactions
// they overlap; retried markers succeed; a restart rebuilds ongoing transactions and fencing epochs
// from the log, and the aborted-transaction index survives it.
func TestTxnMarkersOnNode(t *testing.T) {
	dir := t.TempDir()
	tn := startTxnNode(t, dir, true)
	const p1, p2, p3, p4, p5 = 200, 300, 400, 500, 100
	tn.stage(t, txnBatch(p5, 0, 0, false, "idem"))  // 0
	tn.stage(t, txnBatch(p1, 0, 0, true, "a", "b")) // 1..2: p1's transaction
	tn.stage(t, txnBatch(p2, 0, 0, true, "c"))      // 3: p2's transaction
	tn.stage(t, txnBatch(-1, 0, 0, false, "plain")) // 4

	rc, ru := runnelv1.IsolationLevel_READ_COMMITTED, runnelv1.IsolationLevel_READ_UNCOMMITTED
	r := tn.fetch(t, rc, 0)
	if bs := batches(t, r.Records); r.HighWatermark != 5 || r.LastStableOffset != 1 || len(bs) != 1 || bs[0].next != 1 || len(r.AbortedTransactions) != 0 {
		t.Fatalf("read_committed: HW %d LSO %d batches %+v aborted %v; want HW 5, LSO 1, the batch at 0", r.HighWatermark, r.LastStableOffset, bs, aborted(r))
	}
	r = tn.fetch(t, ru, 0)
	if bs := batches(t, r.Records); r.LastStableOffset != 1 || len(bs) != 4 || bs[3].next != 5 {
		t.Fatalf("read_uncommitted: LSO %d batches %+v; want LSO 1 reported, everything up to 5", r.LastStableOffset, bs)
	}
	if got := tn.latest(t, rc); got != 1 {
		t.Fatalf("ListOffsets LATEST read_committed = %d, want the LSO 1", got)
	}
	if got := tn.latest(t, ru); got != 5 {
		t.Fatalf("ListOffsets LATEST read_uncommitted = %d, want the HW 5", got)
	}

	// A marker at the epoch of p1's transaction is a late one of an earlier transaction (markers carry
	// the epoch EndTxn bumped to, KIP-890 part 2): refused, and the transaction stays open.
	wantCode(t, "marker at the ongoing transaction's epoch", tn.marker(t, p1, 0, false, 1, 0)[0], runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH)
	// p1 aborts: its marker (5) carries its first offset 1; the LSO moves to p2's 3.
	tn.mustMarker(t, p1, 1, false, 1)
	r = tn.fetch(t, rc, 0)
	if bs := batches(t, r.Records); r.LastStableOffset != 3 || len(bs) != 2 || bs[1].next != 3 {
		t.Fatalf("after p1's abort: LSO %d batches %+v; want LSO 3 and the batches up to 3", r.LastStableOffset, bs)
	}
	if got := aborted(r); !reflect.DeepEqual(got, [][2]int64{{p1, 1}}) {
		t.Fatalf("aborted transactions %v, want p1 from 1", got)
	}
	// p2 commits (6): nothing is open, the LSO is the HW.
	tn.mustMarker(t, p2, 1, true, 1)
	r = tn.fetch(t, rc, 0)
	bs := batches(t, r.Records)
	if r.LastStableOffset != 7 || r.HighWatermark != 7 || bs[len(bs)-1].next != 7 {
		t.Fatalf("after p2's commit: LSO %d HW %d batches %+v; want 7, 7, all", r.LastStableOffset, r.HighWatermark, bs)
	}
	want := []seenBatch{{base: 5, next: 6, pid: p1, control: true, marker: batch.ControlMarker{CoordinatorEpoch: 1, FirstOffset: 1}},
		{base: 6, next: 7, pid: p2, control: true, marker: batch.ControlMarker{Commit: true, CoordinatorEpoch: 1, FirstOffset: 3}}}
	if !reflect.DeepEqual(bs[len(bs)-2:], want) {
		t.Fatalf("markers %+v, want %+v", bs[len(bs)-2:], want)
	}
	if got := aborted(r); !reflect.DeepEqual(got, [][2]int64{{p1, 1}}) {
		t.Fatalf("aborted transactions %v, want p1 from 1", got)
	}
	if r := tn.fetch(t, rc, 6); len(r.AbortedTransactions) != 0 {
		t.Fatalf("fetch from 6 lists %v: p1's marker is before it", aborted(r))
	}

	// A retried marker succeeds and says nothing (no transaction ongoing: first offset -1).
	tn.mustMarker(t, p2, 1, true, 1) // 7
	// A marker may bump the producer's epoch (the coordinator fenced it); older epochs are refused then,
	// and so are markers of an older coordinator.
	tn.mustMarker(t, p1, 2, false, 1) // 8
	wantCode(t, "marker of an older producer epoch", tn.marker(t, p1, 1, false, 1, 0)[0], runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH)
	wantCode(t, "marker of an older coordinator", tn.marker(t, p2, 1, false, 0, 0)[0], runnelv1.ErrorCode_TRANSACTION_COORDINATOR_FENCED)
	// Per-partition results: txn-1 is fine, txn-9 does not exist.
	errs := tn.marker(t, p3, 0, true, 1, 1, 9)
	if errs[0] != nil {
		t.Fatalf("marker to txn-1: %v", errs[0])
	}
	wantCode(t, "marker to txn-9", errs[1], runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION)
	r = tn.fetch(t, rc, 0)
	bs = batches(t, r.Records)
	if r.LastStableOffset != 9 || len(bs) != 8 || bs[6].marker.FirstOffset != -1 || bs[7].marker.FirstOffset != -1 || !reflect.DeepEqual(aborted(r), [][2]int64{{p1, 1}}) {
		t.Fatalf("after the retries: LSO %d batches %+v aborted %v", r.LastStableOffset, bs, aborted(r))
	}

	// An ongoing transaction at a restart: the new leadership rebuilds it from the log.
	first := tn.stage(t, txnBatch(p4, 0, 0, true, "d", "e")) // 9..10
	tn.stage(t, txnBatch(-1, 0, 0, false, "after"))          // 11
	if err := tn.n.Close(); err != nil {
		t.Fatal(err)
	}
	tn = startTxnNode(t, dir, false)
	r = tn.fetch(t, rc, 0)
	if r.LastStableOffset != first || r.HighWatermark != 12 || !reflect.DeepEqual(aborted(r), [][2]int64{{p1, 1}}) {
		t.Fatalf("after a restart: LSO %d HW %d aborted %v; want LSO %d, HW 12, p1 from 1", r.LastStableOffset, r.HighWatermark, aborted(r), first)
	}
	wantCode(t, "marker of an older producer epoch after a restart", tn.marker(t, p1, 1, false, 1, 0)[0], runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH)
	wantCode(t, "marker at the rebuilt transaction's epoch", tn.marker(t, p4, 0, false, 2, 0)[0], runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH)
	tn.mustMarker(t, p4, 1, false, 2) // 12
	r = tn.fetch(t, rc, 0)
	if want := [][2]int64{{p1, 1}, {p4, first}}; r.LastStableOffset != 13 || !reflect.DeepEqual(aborted(r), want) {
		t.Fatalf("after p4's abort: LSO %d aborted %v; want 13, %v", r.LastStableOffset, aborted(r), want)
	}
	if r := tn.fetch(t, rc, 11); !reflect.DeepEqual(aborted(r), [][2]int64{{p4, first}}) {
		t.Fatalf("fetch from 11 lists %v, want p4's only", aborted(r))
	}
}

// TestTransactionalProduceVerified runs transactional produce against the node's own transaction
// coordinator (the TxnVerifier the node installs): the first batch of a transaction on a partition is
// verified (refused before AddPartitionsToTxn), the LSO holds read_committed readers at the
// transaction's first offset until its marker, an abort is listed in aborted_transactions, and after
// the marker a batch is verified again (refused until the partition is added to a new transaction).
func TestTransactionalProduceVerified(t *testing.T) {
	n := platformtest.StartNode(t, t.TempDir())
	conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tn := &txnNode{n: n, b: n.Broker()}
	resp, err := tn.b.CreateTopics(testCtx(t), &runnelv1.CreateTopicsRequest{Topics: []*runnelv1.NewTopic{{Name: "txn", Partitions: 1}}})
	if err != nil || rerr.FromInfo(resp.Topics[0].Error) != nil {
		t.Fatalf("create topic: %v %v", err, resp)
	}
	txns := runnelv1.NewTransactionsClient(conn)
	retry := func(fn func() error) error {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			err := rerr.FromStatus(fn())
			if err == nil || !rerr.FromError(err).Retriable() || time.Now().After(deadline) {
				return err
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var init *runnelv1.InitTxnProducerIdResponse
	if err := retry(func() (err error) {
		init, err = txns.InitProducerId(testCtx(t), &runnelv1.InitTxnProducerIdRequest{TransactionalId: "app"})
		return err
	}); err != nil {
		t.Fatalf("InitProducerId: %v", err)
	}
	p := &runnelv1.TxnProducer{TransactionalId: "app", ProducerId: init.ProducerId, ProducerEpoch: init.ProducerEpoch}
	epoch := int16(p.ProducerEpoch)
	add := func() {
		t.Helper()
		err := retry(func() error {
			resp, err := txns.AddPartitionsToTxn(testCtx(t), &runnelv1.AddPartitionsToTxnRequest{Producer: p,
				Partitions: []*runnelv1.TopicPartitions{{Topic: "txn", Partitions: []int32{0}}}})
			if err != nil {
				return err
			}
			return rerr.ToStatus(rerr.FromInfo(resp.Partitions[0].Error))
		})
		if err != nil {
			t.Fatalf("AddPartitionsToTxn: %v", err)
		}
	}
	end := func(commit bool) {
		t.Helper()
		var resp *runnelv1.EndTxnResponse
		if err := retry(func() (err error) {
			resp, err = txns.EndTxn(testCtx(t), &runnelv1.EndTxnRequest{Producer: p, Commit: commit})
			return err
		}); err != nil {
			t.Fatalf("EndTxn: %v", err)
		}
		if resp.ProducerEpoch != p.ProducerEpoch+1 {
			t.Fatalf("EndTxn answered epoch %d, want %d (KIP-890 part 2)", resp.ProducerEpoch, p.ProducerEpoch+1)
		}
		p.ProducerEpoch = resp.ProducerEpoch
	}
	rc := runnelv1.IsolationLevel_READ_COMMITTED

	wantCode(t, "transactional produce before AddPartitionsToTxn", tn.produce(t, "app", txnBatch(p.ProducerId, epoch, 0, true, "early")), runnelv1.ErrorCode_INVALID_TXN_STATE)
	if err := tn.produce(t, "", txnBatch(-1, 0, 0, false, "plain")); err != nil { // 0
		t.Fatal(err)
	}
	add()
	for i, v := range []string{"a", "b"} { // 1, 2
		if err := tn.produce(t, "app", txnBatch(p.ProducerId, epoch, int32(i), true, v)); err != nil {
			t.Fatalf("transactional produce %d: %v", i, err)
		}
	}
	if err := tn.produce(t, "", txnBatch(-1, 0, 0, false, "plain2")); err != nil { // 3
		t.Fatal(err)
	}
	if r := tn.fetch(t, rc, 0); r.LastStableOffset != 1 || r.HighWatermark != 4 || len(batches(t, r.Records)) != 1 {
		t.Fatalf("with the transaction open: LSO %d HW %d; want 1 and 4, one batch", r.LastStableOffset, r.HighWatermark)
	}
	end(false)
	deadline := time.Now().Add(20 * time.Second)
	r := tn.fetch(t, rc, 0)
	for r.LastStableOffset != r.HighWatermark || r.HighWatermark != 5 {
		if time.Now().After(deadline) {
			t.Fatalf("after the abort: LSO %d HW %d, want both 5 (the marker written)", r.LastStableOffset, r.HighWatermark)
		}
		time.Sleep(10 * time.Millisecond)
		r = tn.fetch(t, rc, 0)
	}
	if got := aborted(r); !reflect.DeepEqual(got, [][2]int64{{p.ProducerId, 1}}) {
		t.Fatalf("aborted transactions %v, want the producer's from 1", got)
	}
	// A late write of the aborted transaction, at its epoch, is refused: the marker carried the bumped
	// epoch (KIP-890 part 2), so it cannot slip into the next transaction.
	wantCode(t, "a late write of the aborted transaction", tn.produce(t, "app", txnBatch(p.ProducerId, epoch, 2, true, "late")), runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH)
	// The marker ended the verification: the next transaction's first batch, at the new epoch and
	// sequence 0, is verified again.
	epoch = int16(p.ProducerEpoch)
	wantCode(t, "transactional produce after the marker, before AddPartitionsToTxn", tn.produce(t, "app", txnBatch(p.ProducerId, epoch, 0, true, "early")), runnelv1.ErrorCode_INVALID_TXN_STATE)
	add()
	if err := tn.produce(t, "app", txnBatch(p.ProducerId, epoch, 0, true, "c")); err != nil { // 5
		t.Fatal(err)
	}
	if r := tn.fetch(t, rc, 0); r.LastStableOffset != 5 {
		t.Fatalf("second transaction: LSO %d, want 5", r.LastStableOffset)
	}
	end(true)
}

// TestTxnMarkerGivenUpIsNotWritten: a marker request the coordinator has given up on (its context
// ended) writes nothing, even when it reaches the producer state afterwards: the coordinator retries
// it, and a marker written late, after the retry's, could end the producer's next transaction on the
// partition instead of the one it was sent for.
func TestTxnMarkerGivenUpIsNotWritten(t *testing.T) {
	tn := startTxnNode(t, t.TempDir(), true)
	const pid = 700
	tn.stage(t, txnBatch(pid, 0, 0, true, "a")) // 0: the producer's transaction
	before := tn.fetch(t, runnelv1.IsolationLevel_READ_UNCOMMITTED, 0).HighWatermark
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	resp, err := tn.b.WriteTxnMarkers(ctx, &runnelv1.WriteTxnMarkersRequest{Markers: []*runnelv1.TxnMarker{{
		ProducerId: pid, ProducerEpoch: 1, Commit: true, TransactionalId: "tx",
		Partitions: []*runnelv1.TopicPartitions{{Topic: "txn", Partitions: []int32{0}}}}}})
	if err == nil && rerr.FromInfo(resp.Markers[0].Partitions[0].Error) == nil {
		t.Fatal("a marker request whose context had ended succeeded")
	}
	r := tn.fetch(t, runnelv1.IsolationLevel_READ_COMMITTED, 0)
	if r.HighWatermark != before || r.LastStableOffset != 0 {
		t.Fatalf("after the given-up marker: HW %d (before %d), LSO %d; want nothing written and the transaction still open", r.HighWatermark, before, r.LastStableOffset)
	}
	// The retry ends it.
	tn.mustMarker(t, pid, 1, true, 0)
	if r := tn.fetch(t, runnelv1.IsolationLevel_READ_COMMITTED, 0); r.LastStableOffset != r.HighWatermark || r.HighWatermark != before+1 {
		t.Fatalf("after the retry: HW %d LSO %d, want both %d", r.HighWatermark, r.LastStableOffset, before+1)
	}
}
