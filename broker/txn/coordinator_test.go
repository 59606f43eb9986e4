package txn

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/group"
)

// harness drives one core the way the shell does: records returned by a call are "appended" to log and
// applied at once (or later, when a test holds them back), and every step can be checked against a
// core rebuilt from the log alone.
type harness struct {
	t       *testing.T
	c       *Coordinator
	now     time.Time
	log     []Record
	nextPID int64
}

func newHarness(t *testing.T) *harness {
	return &harness{t: t, c: New(Config{}), now: time.UnixMilli(1_700_000_000_000), nextPID: 1000}
}

func (h *harness) alloc() (int64, error) {
	h.nextPID++
	return h.nextPID - 1, nil
}

// write appends recs to the log and applies them, as the shell does once they are durable.
func (h *harness) write(recs []Record) {
	h.log = append(h.log, recs...)
	h.c.Apply(recs)
}

// checkReplay rebuilds a core from the log and checks it holds the same state.
func (h *harness) checkReplay() {
	h.t.Helper()
	c2 := New(Config{})
	for _, r := range h.log {
		if err := c2.Load(r); err != nil {
			h.t.Fatalf("load: %v", err)
		}
	}
	if got, want := c2.String(), h.c.String(); got != want {
		h.t.Fatalf("replayed state differs:\n got %s\nwant %s", got, want)
	}
}

func (h *harness) init(id string, timeoutMs int32) *runnelv1.TxnProducer {
	h.t.Helper()
	resp, recs, err := h.c.InitProducerId(h.now, &runnelv1.InitTxnProducerIdRequest{TransactionalId: id, TransactionTimeoutMs: timeoutMs}, h.alloc)
	if err != nil {
		h.t.Fatalf("InitProducerId(%q): %v", id, err)
	}
	h.write(recs)
	return &runnelv1.TxnProducer{TransactionalId: id, ProducerId: resp.ProducerId, ProducerEpoch: resp.ProducerEpoch}
}

func (h *harness) add(p *runnelv1.TxnProducer, topic string, parts ...int32) *runnelv1.AddPartitionsToTxnResponse {
	h.t.Helper()
	resp, recs, err := h.c.AddPartitionsToTxn(h.now, &runnelv1.AddPartitionsToTxnRequest{Producer: p,
		Partitions: []*runnelv1.TopicPartitions{{Topic: topic, Partitions: parts}}}, topicsABC)
	if err != nil {
		h.t.Fatalf("AddPartitionsToTxn: %v", err)
	}
	h.write(recs)
	return resp
}

// end ends p's transaction and moves p to the epoch the answer gives, as the SDK does.
func (h *harness) end(p *runnelv1.TxnProducer, commit bool) []Record {
	h.t.Helper()
	resp, recs, err := h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: p, Commit: commit})
	if err != nil {
		h.t.Fatalf("EndTxn(commit=%v): %v", commit, err)
	}
	if resp.ProducerId != p.ProducerId {
		h.t.Fatalf("EndTxn answered producer id %d, not %d", resp.ProducerId, p.ProducerId)
	}
	h.write(recs)
	p.ProducerEpoch = resp.ProducerEpoch
	return recs
}

// completeAll writes the markers of every durable PREPARE_* (here: nothing to write) and completes.
func (h *harness) completeAll() []Marker {
	h.t.Helper()
	ms := h.c.TakePrepared()
	for _, m := range ms {
		h.write(h.c.Complete(h.now, m))
	}
	return ms
}

func (h *harness) state(id string) *runnelv1.TransactionDescription {
	return h.c.DescribeTransaction(id)
}

// topicsABC knows topics a, b and c of 3 partitions each.
func topicsABC(topic string, p int32) error {
	if (topic == "a" || topic == "b" || topic == "c") && p < 3 {
		return nil
	}
	return rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "%s-%d", topic, p)
}

func wantCode(t *testing.T, err error, code runnelv1.ErrorCode) {
	t.Helper()
	if e := rerr.FromError(err); e == nil || e.Code != code {
		t.Fatalf("error %v, want %v", err, code)
	}
}

func TestInitAndFence(t *testing.T) {
	h := newHarness(t)
	p0 := h.init("t1", 0)
	if p0.ProducerId != 1000 || p0.ProducerEpoch != 0 {
		t.Fatalf("first init: %v", p0)
	}
	if d := h.state("t1"); d.State != runnelv1.TxnState_TXN_EMPTY || d.TransactionTimeoutMs != 60000 {
		t.Fatalf("after init: %v", d)
	}
	p1 := h.init("t1", 5000)
	if p1.ProducerId != 1000 || p1.ProducerEpoch != 1 {
		t.Fatalf("second init: %v", p1)
	}
	if d := h.state("t1"); d.TransactionTimeoutMs != 5000 {
		t.Fatalf("the new producer's timeout is not taken: %v", d)
	}
	// The old producer is fenced everywhere; other producer ids and unknown ids are not mapped.
	_, _, err := h.c.AddPartitionsToTxn(h.now, &runnelv1.AddPartitionsToTxnRequest{Producer: p0,
		Partitions: []*runnelv1.TopicPartitions{{Topic: "a", Partitions: []int32{0}}}}, topicsABC)
	wantCode(t, err, runnelv1.ErrorCode_PRODUCER_FENCED)
	_, _, err = h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: p0, Commit: true})
	wantCode(t, err, runnelv1.ErrorCode_PRODUCER_FENCED)
	_, err = h.c.AddOffsetsToTxn(h.now, &runnelv1.AddOffsetsToTxnRequest{Producer: p0, GroupId: "g"}, 50)
	wantCode(t, err, runnelv1.ErrorCode_PRODUCER_FENCED)
	_, _, err = h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: &runnelv1.TxnProducer{TransactionalId: "t1", ProducerId: 7, ProducerEpoch: 1}})
	wantCode(t, err, runnelv1.ErrorCode_INVALID_PRODUCER_ID_MAPPING)
	_, _, err = h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: &runnelv1.TxnProducer{TransactionalId: "nope", ProducerId: 1000}})
	wantCode(t, err, runnelv1.ErrorCode_INVALID_PRODUCER_ID_MAPPING)
	// A second id gets its own producer id.
	if q := h.init("t2", 0); q.ProducerId != 1001 || q.ProducerEpoch != 0 {
		t.Fatalf("second id: %v", q)
	}
	h.checkReplay()
}

func TestEpochExhaustionAllocatesNewProducerID(t *testing.T) {
	h := newHarness(t)
	h.init("t", 0)
	h.c.txns["t"].epoch = MaxProducerEpoch - 1
	if p := h.init("t", 0); p.ProducerId != 1000 || p.ProducerEpoch != MaxProducerEpoch {
		t.Fatalf("init below the max epoch: %v", p)
	}
	p := h.init("t", 0)
	if p.ProducerId != 1001 || p.ProducerEpoch != 0 {
		t.Fatalf("init past the max epoch: %v, want a new producer id at epoch 0", p)
	}
	// An ongoing transaction at the max epoch is still fenced by its abort: the bump fits in int16.
	h.c.txns["t"].epoch = MaxProducerEpoch
	p.ProducerEpoch = MaxProducerEpoch
	h.add(p, "a", 0)
	_, recs, err := h.c.InitProducerId(h.now, &runnelv1.InitTxnProducerIdRequest{TransactionalId: "t"}, h.alloc)
	wantCode(t, err, runnelv1.ErrorCode_CONCURRENT_TRANSACTIONS)
	h.write(recs)
	if d := h.state("t"); d.ProducerEpoch != math.MaxInt16 || d.State != runnelv1.TxnState_TXN_PREPARE_ABORT {
		t.Fatalf("abort at the max epoch: %v", d)
	}
	h.completeAll()

	// EndTxn's bump (KIP-890 part 2) at the max epoch gives 32767, the last epoch; the producer then
	// calls InitProducerId, which gives it a new producer id. A transaction at 32767 cannot be ended
	// with a bump and is refused.
	p = h.init("t", 0)
	h.c.txns["t"].epoch = MaxProducerEpoch
	p.ProducerEpoch = MaxProducerEpoch
	h.add(p, "a", 0)
	h.end(p, true)
	if p.ProducerEpoch != math.MaxInt16 {
		t.Fatalf("EndTxn at the max epoch answered epoch %d", p.ProducerEpoch)
	}
	h.completeAll()
	h.checkReplay()
	if q := h.init("t", 0); q.ProducerId == p.ProducerId || q.ProducerEpoch != 0 {
		t.Fatalf("init after the last epoch: %v, want a new producer id at epoch 0", q)
	}
	h.c.txns["t"].epoch = math.MaxInt16
	p = &runnelv1.TxnProducer{TransactionalId: "t", ProducerId: h.c.txns["t"].producerID, ProducerEpoch: math.MaxInt16}
	h.add(p, "a", 0)
	_, _, err = h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: p, Commit: true})
	wantCode(t, err, runnelv1.ErrorCode_INVALID_TXN_STATE)
}

func TestCommitAndAbort(t *testing.T) {
	for _, commit := range []bool{true, false} {
		h := newHarness(t)
		p := h.init("t", 0)
		resp := h.add(p, "a", 0, 2)
		for _, r := range resp.Partitions {
			if r.Error != nil {
				t.Fatalf("add: %v", r)
			}
		}
		start := h.now.UnixMilli()
		h.now = h.now.Add(time.Second)
		h.add(p, "b", 1)
		recs, err := h.c.AddOffsetsToTxn(h.now, &runnelv1.AddOffsetsToTxnRequest{Producer: p, GroupId: "g1"}, 50)
		if err != nil {
			t.Fatal(err)
		}
		h.write(recs)
		d := h.state("t")
		gp := group.PartitionFor("g1", 50)
		if d.State != runnelv1.TxnState_TXN_ONGOING || d.TransactionStartMs != start || len(d.Groups) != 1 || len(d.Partitions) != 3 {
			t.Fatalf("ongoing: %v", d)
		}
		h.checkReplay()
		// The decision is returned, at a bumped epoch (KIP-890 part 2), but no marker is due until its
		// record is durable.
		end, recs, err := h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: p, Commit: commit})
		if err != nil || len(recs) != 1 {
			t.Fatalf("EndTxn: %v %v", recs, err)
		}
		if end.ProducerId != p.ProducerId || end.ProducerEpoch != p.ProducerEpoch+1 {
			t.Fatalf("EndTxn answered %v, want producer %d at epoch %d", end, p.ProducerId, p.ProducerEpoch+1)
		}
		old := &runnelv1.TxnProducer{TransactionalId: p.TransactionalId, ProducerId: p.ProducerId, ProducerEpoch: p.ProducerEpoch}
		p.ProducerEpoch = end.ProducerEpoch
		if ms := h.c.TakePrepared(); len(ms) != 0 {
			t.Fatalf("markers before the decision is durable: %v", ms)
		}
		h.write(recs)
		ms := h.c.TakePrepared()
		if len(ms) != 1 || ms[0].Commit != commit || ms[0].ProducerID != p.ProducerId || ms[0].ProducerEpoch != int16(p.ProducerEpoch) {
			t.Fatalf("markers: %v", ms)
		}
		want := []*runnelv1.TopicPartitions{{Topic: group.OffsetsTopic, Partitions: []int32{gp}}, {Topic: "a", Partitions: []int32{0, 2}}, {Topic: "b", Partitions: []int32{1}}}
		if got := ms[0].Partitions; len(got) != len(want) || got[0].String() != want[0].String() || got[1].String() != want[1].String() || got[2].String() != want[2].String() {
			t.Fatalf("marker partitions %v, want %v", got, want)
		}
		h.checkReplay()
		h.write(h.c.Complete(h.now, ms[0]))
		d = h.state("t")
		wantState := runnelv1.TxnState_TXN_COMPLETE_ABORT
		if commit {
			wantState = runnelv1.TxnState_TXN_COMPLETE_COMMIT
		}
		if d.State != wantState || len(d.Partitions) != 0 || len(d.Groups) != 0 || d.TransactionStartMs != -1 {
			t.Fatalf("completed: %v", d)
		}
		if recs := h.c.Complete(h.now, ms[0]); recs != nil {
			t.Fatalf("a second completion wrote %v", recs)
		}
		// A late write of the ended transaction, at the old epoch, is refused wherever it lands: a
		// partition of the transaction (its marker carries the new epoch) or another one.
		for _, part := range []string{"a", "c"} {
			v, err := h.c.VerifyPartitions(&runnelv1.VerifyPartitionsRequest{Producer: old, Partitions: []*runnelv1.TopicPartitions{{Topic: part, Partitions: []int32{0}}}})
			if err != nil {
				t.Fatal(err)
			}
			wantCode(t, rerr.FromInfo(v.Partitions[0].Error), runnelv1.ErrorCode_PRODUCER_FENCED)
		}
		_, _, err = h.c.AddPartitionsToTxn(h.now, &runnelv1.AddPartitionsToTxnRequest{Producer: old,
			Partitions: []*runnelv1.TopicPartitions{{Topic: "c", Partitions: []int32{0}}}}, topicsABC)
		wantCode(t, err, runnelv1.ErrorCode_PRODUCER_FENCED)
		// The next transaction starts afresh at the new epoch.
		h.now = h.now.Add(time.Second)
		h.add(p, "c", 0)
		if d = h.state("t"); d.State != runnelv1.TxnState_TXN_ONGOING || d.TransactionStartMs != h.now.UnixMilli() || len(d.Partitions) != 1 {
			t.Fatalf("next transaction: %v", d)
		}
		h.checkReplay()
	}
}

func TestRetriedEndTxn(t *testing.T) {
	h := newHarness(t)
	p := h.init("t", 0)
	h.add(p, "a", 0)
	old := &runnelv1.TxnProducer{TransactionalId: p.TransactionalId, ProducerId: p.ProducerId, ProducerEpoch: p.ProducerEpoch}
	h.end(p, true)
	// The retry of an EndTxn whose answer was lost carries the epoch the bump replaced: it is answered
	// with the new epoch and writes nothing, before and after the markers; the other decision is
	// refused.
	for _, complete := range []bool{false, true} {
		if complete {
			h.completeAll()
		}
		resp, recs, err := h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: old, Commit: true})
		if err != nil || recs != nil || resp.ProducerEpoch != p.ProducerEpoch {
			t.Fatalf("retried EndTxn at the old epoch (completed %v): %v %v %v, want epoch %d", complete, resp, recs, err, p.ProducerEpoch)
		}
		_, _, err = h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: old, Commit: false})
		wantCode(t, err, runnelv1.ErrorCode_INVALID_TXN_STATE)
	}
	h.checkReplay()
	// Once the producer began its next transaction at the new epoch, the old epoch is fenced.
	h.add(p, "a", 0)
	_, _, err := h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: old, Commit: true})
	wantCode(t, err, runnelv1.ErrorCode_PRODUCER_FENCED)
	h.end(p, true)
	// While the markers are written: the same decision again is success and writes nothing; the
	// opposite one is refused; the state stays.
	if recs := h.end(p, true); recs != nil {
		t.Fatalf("retried commit wrote %v", recs)
	}
	before := h.c.String()
	_, _, err = h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: p, Commit: false})
	wantCode(t, err, runnelv1.ErrorCode_INVALID_TXN_STATE)
	if h.c.String() != before {
		t.Fatal("a refused EndTxn changed the state")
	}
	h.completeAll()
	if recs := h.end(p, true); recs != nil {
		t.Fatalf("commit after completion wrote %v", recs)
	}
	// An abort of the transaction that just committed is refused, as in Kafka: a producer whose commit
	// timed out must not be told its records were aborted, or it would produce them again.
	_, _, err = h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: p, Commit: false})
	wantCode(t, err, runnelv1.ErrorCode_INVALID_TXN_STATE)
	// An aborted transaction: a retried abort is success, a commit of it is refused.
	h.add(p, "a", 1)
	h.end(p, false)
	h.end(p, false)
	_, _, err = h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: p, Commit: true})
	wantCode(t, err, runnelv1.ErrorCode_INVALID_TXN_STATE)
	h.checkReplay()
}

func TestConcurrentTransactions(t *testing.T) {
	h := newHarness(t)
	p := h.init("t", 0)
	h.add(p, "a", 0)
	h.end(p, true)
	before := h.c.String()
	_, _, err := h.c.AddPartitionsToTxn(h.now, &runnelv1.AddPartitionsToTxnRequest{Producer: p,
		Partitions: []*runnelv1.TopicPartitions{{Topic: "b", Partitions: []int32{0}}}}, topicsABC)
	wantCode(t, err, runnelv1.ErrorCode_CONCURRENT_TRANSACTIONS)
	_, err = h.c.AddOffsetsToTxn(h.now, &runnelv1.AddOffsetsToTxnRequest{Producer: p, GroupId: "g"}, 50)
	wantCode(t, err, runnelv1.ErrorCode_CONCURRENT_TRANSACTIONS)
	_, recs, err := h.c.InitProducerId(h.now, &runnelv1.InitTxnProducerIdRequest{TransactionalId: "t"}, h.alloc)
	wantCode(t, err, runnelv1.ErrorCode_CONCURRENT_TRANSACTIONS)
	if recs != nil || h.c.String() != before {
		t.Fatalf("refused calls changed the state or wrote %v", recs)
	}
	h.completeAll()

	// A new producer taking the id over while a transaction is ongoing: the transaction is aborted at a
	// bumped epoch first (the old producer is fenced at once), then the new producer gets the next one.
	h.add(p, "a", 1)
	_, recs, err = h.c.InitProducerId(h.now, &runnelv1.InitTxnProducerIdRequest{TransactionalId: "t"}, h.alloc)
	wantCode(t, err, runnelv1.ErrorCode_CONCURRENT_TRANSACTIONS)
	if len(recs) != 1 {
		t.Fatalf("takeover wrote %v", recs)
	}
	h.write(recs)
	if d := h.state("t"); d.State != runnelv1.TxnState_TXN_PREPARE_ABORT || d.ProducerEpoch != p.ProducerEpoch+1 {
		t.Fatalf("after takeover: %v", d)
	}
	_, _, err = h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: p, Commit: true})
	wantCode(t, err, runnelv1.ErrorCode_PRODUCER_FENCED)
	// Retrying before the markers are written still answers CONCURRENT_TRANSACTIONS, writing nothing.
	_, recs, err = h.c.InitProducerId(h.now, &runnelv1.InitTxnProducerIdRequest{TransactionalId: "t"}, h.alloc)
	wantCode(t, err, runnelv1.ErrorCode_CONCURRENT_TRANSACTIONS)
	if recs != nil {
		t.Fatalf("retry wrote %v", recs)
	}
	ms := h.completeAll()
	if len(ms) != 1 || ms[0].Commit || ms[0].ProducerEpoch != int16(p.ProducerEpoch+1) || ms[0].Partitions[0].Partitions[0] != 1 {
		t.Fatalf("abort markers: %v", ms)
	}
	q := h.init("t", 0)
	if q.ProducerId != p.ProducerId || q.ProducerEpoch != p.ProducerEpoch+2 {
		t.Fatalf("new producer: %v", q)
	}
	h.checkReplay()
}

func TestTimeoutAbort(t *testing.T) {
	h := newHarness(t)
	p := h.init("t", 1000)
	h.add(p, "a", 0)
	h.now = h.now.Add(time.Second)
	if recs := h.c.Tick(h.now); len(recs) != 0 {
		t.Fatalf("tick at the timeout wrote %v", recs)
	}
	h.now = h.now.Add(time.Millisecond)
	recs := h.c.Tick(h.now)
	if len(recs) != 1 {
		t.Fatalf("tick past the timeout wrote %v", recs)
	}
	h.write(recs)
	if d := h.state("t"); d.State != runnelv1.TxnState_TXN_PREPARE_ABORT || d.ProducerEpoch != 1 {
		t.Fatalf("timed out: %v", d)
	}
	// The zombie can neither commit nor write: it is fenced.
	_, _, err := h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: p, Commit: true})
	wantCode(t, err, runnelv1.ErrorCode_PRODUCER_FENCED)
	v, err := h.c.VerifyPartitions(&runnelv1.VerifyPartitionsRequest{Producer: p, Partitions: []*runnelv1.TopicPartitions{{Topic: "a", Partitions: []int32{0}}}})
	if err != nil || v.Partitions[0].Error.GetCode() != runnelv1.ErrorCode_PRODUCER_FENCED {
		t.Fatalf("verify of the zombie: %v %v", v, err)
	}
	ms := h.completeAll()
	if len(ms) != 1 || ms[0].Commit || ms[0].ProducerEpoch != 1 {
		t.Fatalf("timeout markers: %v", ms)
	}
	if recs := h.c.Tick(h.now.Add(time.Hour)); len(recs) != 0 {
		t.Fatalf("a completed transaction timed out again: %v", recs)
	}
	h.checkReplay()
}

func TestOperatorAbort(t *testing.T) {
	h := newHarness(t)
	p := h.init("t", 0)
	_, _, err := h.c.AbortTransaction(h.now, &runnelv1.AbortTransactionRequest{TransactionalId: "t"})
	wantCode(t, err, runnelv1.ErrorCode_INVALID_TXN_STATE)
	_, _, err = h.c.AbortTransaction(h.now, &runnelv1.AbortTransactionRequest{TransactionalId: "other"})
	wantCode(t, err, runnelv1.ErrorCode_TRANSACTIONAL_ID_NOT_FOUND)
	h.add(p, "a", 0)
	resp, recs, err := h.c.AbortTransaction(h.now, &runnelv1.AbortTransactionRequest{TransactionalId: "t"})
	if err != nil || resp.ProducerId != p.ProducerId || resp.ProducerEpoch != p.ProducerEpoch+1 {
		t.Fatalf("abort: %v %v", resp, err)
	}
	h.write(recs)
	_, _, err = h.c.AbortTransaction(h.now, &runnelv1.AbortTransactionRequest{TransactionalId: "t"})
	wantCode(t, err, runnelv1.ErrorCode_CONCURRENT_TRANSACTIONS)
	_, _, err = h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: p, Commit: true})
	wantCode(t, err, runnelv1.ErrorCode_PRODUCER_FENCED)
	if ms := h.completeAll(); len(ms) != 1 || ms[0].Commit {
		t.Fatalf("markers: %v", ms)
	}
	h.checkReplay()
}

func TestVerifyPartitions(t *testing.T) {
	h := newHarness(t)
	p := h.init("t", 0)
	verify := func(p *runnelv1.TxnProducer, topic string, part int32) runnelv1.ErrorCode {
		t.Helper()
		v, err := h.c.VerifyPartitions(&runnelv1.VerifyPartitionsRequest{Producer: p, Partitions: []*runnelv1.TopicPartitions{{Topic: topic, Partitions: []int32{part}}}})
		if err != nil {
			t.Fatal(err)
		}
		return v.Partitions[0].Error.GetCode()
	}
	if c := verify(p, "a", 0); c != runnelv1.ErrorCode_INVALID_TXN_STATE {
		t.Fatalf("no transaction: %v", c)
	}
	h.add(p, "a", 0)
	if c := verify(p, "a", 0); c != runnelv1.ErrorCode_NONE {
		t.Fatalf("added: %v", c)
	}
	if c := verify(p, "a", 1); c != runnelv1.ErrorCode_INVALID_TXN_STATE {
		t.Fatalf("not added: %v", c)
	}
	if c := verify(&runnelv1.TxnProducer{TransactionalId: "t", ProducerId: 1, ProducerEpoch: 0}, "a", 0); c != runnelv1.ErrorCode_INVALID_TXN_STATE {
		t.Fatalf("another producer id: %v", c)
	}
	if c := verify(&runnelv1.TxnProducer{TransactionalId: "u", ProducerId: p.ProducerId}, "a", 0); c != runnelv1.ErrorCode_INVALID_TXN_STATE {
		t.Fatalf("unknown id: %v", c)
	}
	// A late write after EndTxn must not open a hanging transaction (KIP-890).
	h.end(p, true)
	if c := verify(p, "a", 0); c != runnelv1.ErrorCode_INVALID_TXN_STATE {
		t.Fatalf("after EndTxn: %v", c)
	}
	_, err := h.c.VerifyPartitions(&runnelv1.VerifyPartitionsRequest{Producer: &runnelv1.TxnProducer{}})
	wantCode(t, err, runnelv1.ErrorCode_INVALID_REQUEST)
}

func TestExpiry(t *testing.T) {
	h := newHarness(t)
	h.init("idle", 0)
	p := h.init("busy", int32(time.Duration(15*time.Minute).Milliseconds()))
	h.add(p, "a", 0)
	h.write(h.c.Tick(h.now)) // the first tick schedules the next expiry check an hour ahead
	h.now = h.now.Add(7 * 24 * time.Hour)
	// The busy id's transaction times out (an abort at a bumped epoch) but the id, in a transaction
	// being ended, does not expire; the idle one does (a tombstone).
	recs := h.c.Tick(h.now)
	if len(recs) != 2 || recs[0].Value == nil || recs[1].Value != nil {
		t.Fatalf("expiry wrote %v", recs)
	}
	h.write(recs)
	if d := h.state("idle"); d.Error.GetCode() != runnelv1.ErrorCode_TRANSACTIONAL_ID_NOT_FOUND {
		t.Fatalf("expired id: %v", d)
	}
	if d := h.state("busy"); d.State != runnelv1.TxnState_TXN_PREPARE_ABORT {
		t.Fatalf("busy id: %v", d)
	}
	if l := h.c.ListTransactions(nil); len(l) != 1 || l[0].TransactionalId != "busy" {
		t.Fatalf("list: %v", l)
	}
	h.checkReplay()
	// An expired id starts over with a new producer id.
	if q := h.init("idle", 0); q.ProducerId == 1000 || q.ProducerEpoch != 0 {
		t.Fatalf("re-registered: %v", q)
	}
}

func TestListAndDescribe(t *testing.T) {
	h := newHarness(t)
	p := h.init("b", 0)
	h.init("a", 0)
	h.add(p, "a", 1)
	all := h.c.ListTransactions(nil)
	if len(all) != 2 || all[0].TransactionalId != "a" || all[1].TransactionalId != "b" {
		t.Fatalf("list: %v", all)
	}
	if l := h.c.ListTransactions([]runnelv1.TxnState{runnelv1.TxnState_TXN_ONGOING}); len(l) != 1 || l[0].TransactionalId != "b" {
		t.Fatalf("list ongoing: %v", l)
	}
	d := h.state("b")
	if d.TransactionalId != "b" || d.ProducerId != p.ProducerId || d.State != runnelv1.TxnState_TXN_ONGOING ||
		d.TransactionStartMs != h.now.UnixMilli() || d.LastUpdateMs != h.now.UnixMilli() || len(d.Partitions) != 1 {
		t.Fatalf("describe: %v", d)
	}
	if ids, open := h.c.Stats(); ids != 2 || open != 1 {
		t.Fatalf("stats: %d ids, %d open", ids, open)
	}
}

// TestBadInput checks that every refused call answers its error and leaves the state and the log as
// they were.
func TestBadInput(t *testing.T) {
	h := newHarness(t)
	p := h.init("t", 0)
	h.add(p, "a", 0)
	long := string(make([]byte, MaxIDBytes+1))
	many := make([]int32, MaxPartitions+1)
	for i := range many {
		many[i] = int32(i)
	}
	failAlloc := func() (int64, error) { return 0, errors.New("controller down") }
	cases := []struct {
		name string
		call func() ([]Record, error)
		code runnelv1.ErrorCode
	}{
		{"init: empty id", func() ([]Record, error) {
			_, r, err := h.c.InitProducerId(h.now, &runnelv1.InitTxnProducerIdRequest{}, h.alloc)
			return r, err
		}, runnelv1.ErrorCode_INVALID_REQUEST},
		{"init: long id", func() ([]Record, error) {
			_, r, err := h.c.InitProducerId(h.now, &runnelv1.InitTxnProducerIdRequest{TransactionalId: long}, h.alloc)
			return r, err
		}, runnelv1.ErrorCode_INVALID_REQUEST},
		{"init: negative timeout", func() ([]Record, error) {
			_, r, err := h.c.InitProducerId(h.now, &runnelv1.InitTxnProducerIdRequest{TransactionalId: "x", TransactionTimeoutMs: -1}, h.alloc)
			return r, err
		}, runnelv1.ErrorCode_INVALID_TRANSACTION_TIMEOUT},
		{"init: timeout above the max", func() ([]Record, error) {
			_, r, err := h.c.InitProducerId(h.now, &runnelv1.InitTxnProducerIdRequest{TransactionalId: "x", TransactionTimeoutMs: 900_001}, h.alloc)
			return r, err
		}, runnelv1.ErrorCode_INVALID_TRANSACTION_TIMEOUT},
		{"init: allocation fails", func() ([]Record, error) {
			_, r, err := h.c.InitProducerId(h.now, &runnelv1.InitTxnProducerIdRequest{TransactionalId: "x"}, failAlloc)
			return r, err
		}, runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR},
		{"add: no producer", func() ([]Record, error) {
			_, r, err := h.c.AddPartitionsToTxn(h.now, &runnelv1.AddPartitionsToTxnRequest{}, topicsABC)
			return r, err
		}, runnelv1.ErrorCode_INVALID_REQUEST},
		{"add: too many partitions", func() ([]Record, error) {
			_, r, err := h.c.AddPartitionsToTxn(h.now, &runnelv1.AddPartitionsToTxnRequest{Producer: p,
				Partitions: []*runnelv1.TopicPartitions{{Topic: "a", Partitions: many}}}, topicsABC)
			return r, err
		}, runnelv1.ErrorCode_INVALID_REQUEST},
		{"offsets: empty group", func() ([]Record, error) {
			return h.c.AddOffsetsToTxn(h.now, &runnelv1.AddOffsetsToTxnRequest{Producer: p}, 50)
		}, runnelv1.ErrorCode_INVALID_GROUP_ID},
		{"offsets: no offsets topic", func() ([]Record, error) {
			return h.c.AddOffsetsToTxn(h.now, &runnelv1.AddOffsetsToTxnRequest{Producer: p, GroupId: "g"}, 0)
		}, runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE},
		{"end: unknown id", func() ([]Record, error) {
			_, r, err := h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: &runnelv1.TxnProducer{TransactionalId: "u"}})
			return r, err
		}, runnelv1.ErrorCode_INVALID_PRODUCER_ID_MAPPING},
		{"end: newer epoch", func() ([]Record, error) {
			_, r, err := h.c.EndTxn(h.now, &runnelv1.EndTxnRequest{Producer: &runnelv1.TxnProducer{TransactionalId: "t", ProducerId: p.ProducerId, ProducerEpoch: 9}})
			return r, err
		}, runnelv1.ErrorCode_PRODUCER_FENCED},
		{"abort: empty id", func() ([]Record, error) {
			_, r, err := h.c.AbortTransaction(h.now, &runnelv1.AbortTransactionRequest{})
			return r, err
		}, runnelv1.ErrorCode_INVALID_REQUEST},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, pid := h.c.String(), h.nextPID
			recs, err := tc.call()
			wantCode(t, err, tc.code)
			if recs != nil || h.c.String() != before || (tc.name != "init: allocation fails" && h.nextPID != pid) {
				t.Fatalf("refused call changed the state or wrote %v:\n%s", recs, h.c.String())
			}
		})
	}
	// Unknown partitions are refused one by one; the good ones of the same request are added.
	resp, recs, err := h.c.AddPartitionsToTxn(h.now, &runnelv1.AddPartitionsToTxnRequest{Producer: p,
		Partitions: []*runnelv1.TopicPartitions{{Topic: "a", Partitions: []int32{1, 7, -1}}, {Topic: "", Partitions: []int32{0}}}}, topicsABC)
	if err != nil {
		t.Fatal(err)
	}
	h.write(recs)
	codes := []runnelv1.ErrorCode{}
	for _, r := range resp.Partitions {
		codes = append(codes, r.Error.GetCode())
	}
	if len(codes) != 4 || codes[0] != runnelv1.ErrorCode_NONE || codes[1] != runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION ||
		codes[2] != runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION || codes[3] != runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION {
		t.Fatalf("per-partition answers %v", codes)
	}
	if d := h.state("t"); len(d.Partitions) != 1 || len(d.Partitions[0].Partitions) != 2 {
		t.Fatalf("after a partly refused add: %v", d)
	}
	// Adding only what is in already writes nothing.
	if _, recs, _ := h.c.AddPartitionsToTxn(h.now, &runnelv1.AddPartitionsToTxnRequest{Producer: p,
		Partitions: []*runnelv1.TopicPartitions{{Topic: "a", Partitions: []int32{0, 1}}}}, topicsABC); recs != nil {
		t.Fatalf("re-adding wrote %v", recs)
	}
	h.checkReplay()
}

func TestLoadSkipsCorruptRecords(t *testing.T) {
	h := newHarness(t)
	p := h.init("t", 0)
	h.add(p, "a", 0)
	c2 := New(Config{})
	bad := []Record{{Key: []byte{0, 9, 'x'}, Value: []byte{0, 1}}, {Key: encodeKey("t"), Value: []byte{0, 1, 0xff}}, {Key: encodeKey("t"), Value: []byte{0, 2}}}
	for _, r := range bad {
		if err := c2.Load(r); !errors.Is(err, errCorrupt) {
			t.Fatalf("load of %v: %v, want errCorrupt", r, err)
		}
	}
	for _, r := range h.log {
		if err := c2.Load(r); err != nil {
			t.Fatal(err)
		}
	}
	if c2.String() != h.c.String() {
		t.Fatalf("state after corrupt records:\n%s\nwant\n%s", c2, h.c)
	}
}
