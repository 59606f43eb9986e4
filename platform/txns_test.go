package platform_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/txn"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/platform"
	"github.com/runnel-io/runnel/platform/platformtest"
)

// txnBatch builds a transactional batch of n records of producer p from sequence seq.
func txnBatch(p *runnelv1.TxnProducer, prefix string, n int, seq int32) []byte {
	var b batch.Builder
	for i := range n {
		b.Append(int64(i), nil, []byte(fmt.Sprintf("%s-%d", prefix, i)), nil)
	}
	b.SetProducer(p.ProducerId, int16(p.ProducerEpoch), seq)
	b.SetTransactional(true)
	return append([]byte(nil), b.Build(batch.CompressionNone)...)
}

// retry calls fn until it returns nil or an error that is not retriable, or the test's deadline.
func retry(t *testing.T, fn func() error) error {
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

// markers returns the control batches of a partition's log, in order, with their producer.
func markers(t *testing.T, tn *testNode, topic string, partition int32) (ms []batch.ControlMarker, epochs []int16, offsets []int64) {
	t.Helper()
	for next := int64(0); ; {
		r, err := tn.fetch(t, topic, partition, next, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Records) == 0 {
			return
		}
		err = batch.Split(r.Records, func(b []byte, h batch.Header) error {
			next = h.NextOffset()
			if !h.IsControl() {
				return nil
			}
			m, err := batch.ParseControl(b)
			if err != nil {
				return err
			}
			ms, epochs, offsets = append(ms, m), append(epochs, h.ProducerEpoch), append(offsets, h.BaseOffset)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestTransactionsSingleNode drives the Transactions service of one node: a committed and an aborted
// transaction leave COMMIT and ABORT markers (with the coordinator epoch and the transaction's first
// offset) in the data partitions' logs; a second InitProducerId fences the first producer; a
// transaction past its timeout is aborted with a bumped epoch; the state survives a restart.
func TestTransactionsSingleNode(t *testing.T) {
	dir := t.TempDir()
	tn := startNode(t, dir, func(c *platform.Config) { c.Transactions.TickInterval = 50 * time.Millisecond })
	tn.createTopic(t, "tx", 2, nil)
	txns := runnelv1.NewTransactionsClient(tn.conn)

	var init *runnelv1.InitTxnProducerIdResponse
	if err := retry(t, func() (err error) {
		init, err = txns.InitProducerId(ctxT(t), &runnelv1.InitTxnProducerIdRequest{TransactionalId: "app"})
		return err
	}); err != nil {
		t.Fatalf("InitProducerId: %v", err)
	}
	p := &runnelv1.TxnProducer{TransactionalId: "app", ProducerId: init.ProducerId, ProducerEpoch: init.ProducerEpoch}
	describe := func(id string) *runnelv1.TransactionDescription {
		t.Helper()
		resp, err := txns.DescribeTransactions(ctxT(t), &runnelv1.DescribeTransactionsRequest{TransactionalIds: []string{id}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Transactions[0]
	}
	waitState := func(id string, want runnelv1.TxnState) *runnelv1.TransactionDescription {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			d := describe(id)
			if d.State == want {
				return d
			}
			if time.Now().After(deadline) {
				t.Fatalf("transactional id %q: %v, want %v", id, d, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	produce := func(p *runnelv1.TxnProducer, partition int32, recs []byte) error {
		t.Helper()
		resp, err := tn.records.Produce(ctxT(t), &runnelv1.ProduceRequest{Acks: runnelv1.Acks_ACKS_ALL, TransactionalId: p.TransactionalId,
			Partitions: []*runnelv1.ProducePartition{{Topic: "tx", Partition: partition, Records: recs}}})
		if err != nil {
			return rerr.FromStatus(err)
		}
		return rerr.FromInfo(resp.Partitions[0].Error)
	}
	add := func(p *runnelv1.TxnProducer, parts ...int32) error {
		resp, err := txns.AddPartitionsToTxn(ctxT(t), &runnelv1.AddPartitionsToTxnRequest{Producer: p,
			Partitions: []*runnelv1.TopicPartitions{{Topic: "tx", Partitions: parts}}})
		if err != nil {
			return rerr.FromStatus(err)
		}
		for _, r := range resp.Partitions {
			if err := rerr.FromInfo(r.Error); err != nil {
				return err
			}
		}
		return nil
	}

	// A produce before AddPartitionsToTxn is refused by verification (KIP-890).
	if err := produce(p, 0, txnBatch(p, "early", 1, 0)); !errors.Is(err, rerr.ErrInvalidTxnState) {
		t.Fatalf("produce outside a transaction: %v, want INVALID_TXN_STATE", err)
	}
	// Commit: both partitions get a COMMIT marker after the data.
	if err := add(p, 0, 1); err != nil {
		t.Fatal(err)
	}
	if err := produce(p, 0, txnBatch(p, "c", 3, 0)); err != nil {
		t.Fatal(err)
	}
	if err := produce(p, 1, txnBatch(p, "c", 2, 0)); err != nil {
		t.Fatal(err)
	}
	// EndTxn bumps the epoch (KIP-890 part 2): the markers carry the new one, the producer moves to it.
	old := &runnelv1.TxnProducer{TransactionalId: p.TransactionalId, ProducerId: p.ProducerId, ProducerEpoch: p.ProducerEpoch}
	end, err := txns.EndTxn(ctxT(t), &runnelv1.EndTxnRequest{Producer: p, Commit: true})
	if err != nil {
		t.Fatal(err)
	}
	if end.ProducerId != p.ProducerId || end.ProducerEpoch != p.ProducerEpoch+1 {
		t.Fatalf("EndTxn answered %v, want producer %d at epoch %d", end, p.ProducerId, p.ProducerEpoch+1)
	}
	p.ProducerEpoch = end.ProducerEpoch
	waitState("app", runnelv1.TxnState_TXN_COMPLETE_COMMIT)
	topics, err := tn.admin.DescribeTopics(ctxT(t), &runnelv1.DescribeTopicsRequest{Topics: []string{txn.StateTopic}})
	if err != nil {
		t.Fatal(err)
	}
	stateTopic := topics.Topics[0]
	if !stateTopic.Internal || len(stateTopic.Partitions) != 50 {
		t.Fatalf("%s: %v", txn.StateTopic, stateTopic)
	}
	coordEpoch := stateTopic.Partitions[txn.PartitionFor("app", int32(len(stateTopic.Partitions)))].LeaderEpoch
	for part, firstOffset := range map[int32]int64{0: 0, 1: 0} {
		ms, epochs, _ := markers(t, tn, "tx", part)
		if len(ms) != 1 || !ms[0].Commit || ms[0].FirstOffset != firstOffset || ms[0].CoordinatorEpoch != coordEpoch || epochs[0] != int16(p.ProducerEpoch) {
			t.Fatalf("tx-%d markers %+v epochs %v, want one COMMIT from offset %d at coordinator epoch %d", part, ms, epochs, firstOffset, coordEpoch)
		}
	}
	// A retried EndTxn of the transaction just ended succeeds, at the old epoch (its answer was lost)
	// as at the new one, and answers the new epoch.
	for _, q := range []*runnelv1.TxnProducer{old, p} {
		if r, err := txns.EndTxn(ctxT(t), &runnelv1.EndTxnRequest{Producer: q, Commit: true}); err != nil || r.ProducerEpoch != p.ProducerEpoch {
			t.Fatalf("retried EndTxn at epoch %d: %v %v", q.ProducerEpoch, r, err)
		}
	}
	// A late write of the committed transaction, at its epoch, is refused by the partition.
	if err := produce(old, 0, txnBatch(old, "late", 1, 3)); !errors.Is(err, rerr.ErrInvalidProducerEpoch) {
		t.Fatalf("late write at the old epoch: %v, want INVALID_PRODUCER_EPOCH", err)
	}

	// Abort: an ABORT marker on the one partition, from the transaction's first offset (after the
	// COMMIT marker at offset 3).
	if err := add(p, 0); err != nil {
		t.Fatal(err)
	}
	if err := produce(p, 0, txnBatch(p, "a", 2, 0)); err != nil { // a new epoch: sequences from 0
		t.Fatal(err)
	}
	if end, err = txns.EndTxn(ctxT(t), &runnelv1.EndTxnRequest{Producer: p, Commit: false}); err != nil {
		t.Fatal(err)
	}
	p.ProducerEpoch = end.ProducerEpoch
	waitState("app", runnelv1.TxnState_TXN_COMPLETE_ABORT)
	if ms, _, offs := markers(t, tn, "tx", 0); len(ms) != 2 || ms[1].Commit || ms[1].FirstOffset != 4 || offs[1] != 6 {
		t.Fatalf("tx-0 markers %+v at %v, want an ABORT from offset 4 at offset 6", ms, offs)
	}
	if ms, _, _ := markers(t, tn, "tx", 1); len(ms) != 1 {
		t.Fatalf("tx-1 got a marker of a transaction it was not in: %+v", ms)
	}

	// A second producer with the same id fences the first.
	var init2 *runnelv1.InitTxnProducerIdResponse
	if err := retry(t, func() (err error) {
		init2, err = txns.InitProducerId(ctxT(t), &runnelv1.InitTxnProducerIdRequest{TransactionalId: "app"})
		return err
	}); err != nil || init2.ProducerId != p.ProducerId || init2.ProducerEpoch != p.ProducerEpoch+1 {
		t.Fatalf("second InitProducerId: %v %v", init2, err)
	}
	if err := add(p, 1); !errors.Is(err, rerr.ErrProducerFenced) {
		t.Fatalf("fenced producer's add: %v, want PRODUCER_FENCED", err)
	}

	// A transaction past its timeout is aborted by the coordinator with a bumped epoch.
	var initZ *runnelv1.InitTxnProducerIdResponse
	if err := retry(t, func() (err error) {
		initZ, err = txns.InitProducerId(ctxT(t), &runnelv1.InitTxnProducerIdRequest{TransactionalId: "zombie", TransactionTimeoutMs: 300})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	z := &runnelv1.TxnProducer{TransactionalId: "zombie", ProducerId: initZ.ProducerId, ProducerEpoch: initZ.ProducerEpoch}
	if err := add(z, 1); err != nil {
		t.Fatal(err)
	}
	if err := produce(z, 1, txnBatch(z, "z", 1, 0)); err != nil {
		t.Fatal(err)
	}
	d := waitState("zombie", runnelv1.TxnState_TXN_COMPLETE_ABORT)
	if d.ProducerEpoch != z.ProducerEpoch+1 {
		t.Fatalf("timed-out transaction: %v, want the epoch bumped", d)
	}
	if ms, epochs, _ := markers(t, tn, "tx", 1); len(ms) != 2 || ms[1].Commit || epochs[1] != int16(z.ProducerEpoch+1) {
		t.Fatalf("tx-1 markers %+v epochs %v, want an ABORT at the bumped epoch", ms, epochs)
	}
	if _, err := txns.EndTxn(ctxT(t), &runnelv1.EndTxnRequest{Producer: z, Commit: true}); !errors.Is(rerr.FromStatus(err), rerr.ErrProducerFenced) {
		t.Fatalf("the zombie's commit: %v, want PRODUCER_FENCED", err)
	}
	list, err := txns.ListTransactions(ctxT(t), &runnelv1.ListTransactionsRequest{})
	if err != nil || len(list.Transactions) != 2 || list.Transactions[0].TransactionalId != "app" || list.Transactions[1].CoordinatorId != platformtest.Config(dir).NodeID {
		t.Fatalf("list: %v %v", list, err)
	}

	// The coordinator's state is the log's: a restarted node answers the same.
	before := describe("app")
	tn.close()
	tn = startNode(t, dir)
	txns = runnelv1.NewTransactionsClient(tn.conn)
	var after *runnelv1.TransactionDescription
	if err := retry(t, func() error {
		after = describe("app")
		return rerr.FromInfo(after.Error)
	}); err != nil {
		t.Fatal(err)
	}
	if after.State != before.State || after.ProducerId != before.ProducerId || after.ProducerEpoch != before.ProducerEpoch || after.LastUpdateMs != before.LastUpdateMs {
		t.Fatalf("after a restart: %v, before %v", after, before)
	}
}
