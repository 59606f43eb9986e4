package broker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/client/batch"
)

// pbatch is a batch of producer pid (epoch, base sequence seq) holding vals, transactional or not.
func pbatch(pid int64, epoch int16, seq int32, txn bool, vals ...string) []byte {
	var bb batch.Builder
	for _, v := range vals {
		bb.Append(1000, nil, []byte(v), nil)
	}
	bb.SetProducer(pid, epoch, seq)
	bb.SetTransactional(txn)
	return append([]byte(nil), bb.Build(batch.CompressionNone)...)
}

func header(t *testing.T, b []byte) batch.Header {
	t.Helper()
	h, err := batch.ParseHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// settle completes the append of pb (a batch of producer pid's transaction txn) at base with err, as
// produce's append callback does.
func settle(ps *producerState, pid int64, txn *ongoingTxn, pb *producerBatch, base int64, err error) {
	pb.base, pb.err = base, err
	ps.txnBatchDone(pid, txn, pb)
}

func newTestState() *producerState {
	return &producerState{loaded: true, producers: map[int64]*producerEntry{}, ongoing: map[int64]*ongoingTxn{}}
}

// TestProducerStateLSO: the LSO is the least first offset of an ongoing transaction, held by a lower
// bound (the LEO at admission) until the first batch is stored, then exact; a transaction whose marker
// is queued holds it until the HW passes the marker; a transaction none of whose batches was stored
// keeps holding it and its marker says it wrote nothing.
func TestProducerStateLSO(t *testing.T) {
	ps := newTestState()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if got := ps.lsoLocked(100); got != 100 {
		t.Fatalf("LSO without transactions = %d, want the HW 100", got)
	}
	admit := func(pid int64, seq int32, leo int64) (*producerBatch, *ongoingTxn) {
		t.Helper()
		_, pb, err := ps.admit("t", 0, header(t, pbatch(pid, 0, seq, true, "v")))
		if err != nil {
			t.Fatal(err)
		}
		return pb, ps.beginTxnLocked(pid, pb, leo)
	}
	// Producer 1: admitted at LEO 40, stored at 42.
	pb1, txn1 := admit(1, 0, 40)
	if got := ps.lsoLocked(100); got != 40 {
		t.Fatalf("LSO with a first batch in flight = %d, want the LEO at admission 40", got)
	}
	if got := ps.lsoLocked(30); got != 30 {
		t.Fatalf("LSO below the HW = %d, want 30", got)
	}
	ps.mu.Unlock()
	settle(ps, 1, txn1, pb1, 42, nil)
	ps.mu.Lock()
	if got := ps.lsoLocked(100); got != 42 {
		t.Fatalf("LSO once stored = %d, want 42", got)
	}
	// A later batch of the same transaction changes nothing.
	if _, txn := admit(1, 1, 60); txn != nil {
		t.Fatal("a later batch of a transaction with an exact first offset is tracked")
	}

	// Producer 2 begins at 55.
	pb2, txn2 := admit(2, 0, 50)
	ps.mu.Unlock()
	settle(ps, 2, txn2, pb2, 55, nil)
	ps.mu.Lock()

	// Producer 1's marker is queued: it carries 42 and holds the LSO until the HW passes it.
	first, done := ps.endTxnLocked(1, 0, 7)
	if first != 42 || done == nil {
		t.Fatalf("endTxn = %d, %v; want 42 and a completing entry", first, done)
	}
	if got := ps.lsoLocked(100); got != 42 {
		t.Fatalf("LSO with the marker in flight = %d, want 42", got)
	}
	done.marker = 60
	if got := ps.lsoLocked(60); got != 42 {
		t.Fatalf("LSO with the HW at the marker = %d, want 42", got)
	}
	if got := ps.lsoLocked(61); got != 55 {
		t.Fatalf("LSO with the HW past the marker = %d, want producer 2's 55", got)
	}
	if len(ps.completing) != 0 {
		t.Fatalf("%d completing transactions left after the HW passed their marker", len(ps.completing))
	}
	e := ps.producers[1]
	if e.verified != -1 || e.coordEpoch != 7 || e.markers != 1 {
		t.Fatalf("producer 1 after its marker: %+v", e)
	}

	// Producer 3: its only batch fails; the LSO stays at the lower bound until its marker, which says
	// the transaction wrote nothing here.
	pb3, txn3 := admit(3, 0, 70)
	ps.mu.Unlock()
	settle(ps, 3, txn3, pb3, -1, errors.New("store failed"))
	ps.mu.Lock()
	if got := ps.lsoLocked(100); got != 55 {
		t.Fatalf("LSO = %d, want 55", got)
	}
	ps.endTxnLocked(2, 0, 7)
	if got := ps.lsoLocked(100); got != 55 {
		t.Fatalf("LSO with producer 2's marker in flight = %d, want 55", got)
	}
	ps.completing = nil
	if got := ps.lsoLocked(100); got != 70 {
		t.Fatalf("LSO with producer 3's failed batch = %d, want its lower bound 70", got)
	}
	if first, _ := ps.endTxnLocked(3, 1, 7); first != -1 {
		t.Fatalf("marker of a transaction that stored nothing carries %d, want -1", first)
	}
	if e := ps.producers[3]; e.epoch != 1 || e.batches != nil {
		t.Fatalf("a marker of a newer epoch left producer 3 at %+v", e)
	}

	// Producer 4: the first of two batches fails, the second gives the first offset.
	pb4a, txn4 := admit(4, 0, 80)
	pb4b, again := admit(4, 1, 80)
	if again != txn4 || len(txn4.inflight) != 2 {
		t.Fatalf("second batch in flight: txn %p (want %p), %d in flight", again, txn4, len(txn4.inflight))
	}
	ps.mu.Unlock()
	settle(ps, 4, txn4, pb4a, -1, errors.New("failed"))
	settle(ps, 4, txn4, pb4b, 85, nil)
	ps.mu.Lock()
	if !txn4.exact || txn4.first != 85 || txn4.inflight != nil {
		t.Fatalf("producer 4's transaction: %+v, want exact at 85", txn4)
	}
	ps.completing = nil
	if got := ps.lsoLocked(100); got != 85 {
		t.Fatalf("LSO = %d, want 85", got)
	}

	// Producer 5: two batches stored at 90 and 95 whose completions arrive in the other order (each
	// append's callback runs on its own goroutine). The later batch must not stand for the
	// transaction's start: the LSO stays at the lower bound until the earlier one settles, then the
	// first offset is 90, and the marker carries 90 (an ABORT marker carrying 95 would leave the
	// records at 90 visible to read_committed readers).
	ps.endTxnLocked(4, 1, 7)
	ps.completing = nil
	pb5a, txn5 := admit(5, 0, 88)
	pb5b, _ := admit(5, 1, 88)
	ps.mu.Unlock()
	settle(ps, 5, txn5, pb5b, 95, nil)
	ps.mu.Lock()
	if txn5.exact || ps.lsoLocked(100) != 88 {
		t.Fatalf("after the later batch settled first: %+v, LSO %d; want the lower bound 88 kept", txn5, ps.lsoLocked(100))
	}
	ps.mu.Unlock()
	settle(ps, 5, txn5, pb5a, 90, nil)
	ps.mu.Lock()
	if !txn5.exact || txn5.first != 90 || ps.lsoLocked(100) != 90 {
		t.Fatalf("after both settled: %+v, LSO %d; want exact at 90", txn5, ps.lsoLocked(100))
	}
	if first, _ := ps.endTxnLocked(5, 1, 7); first != 90 {
		t.Fatalf("producer 5's marker carries %d, want 90", first)
	}
}

// TestRebuildProducersTransactions: rebuilding from a real log finds the ongoing transactions (a
// transactional batch without a later marker of its producer), the completed ones whose marker the HW
// may not have passed, markers' epochs and coordinator epochs.
func TestRebuildProducersTransactions(t *testing.T) {
	o := plog.DefaultOptions(t.TempDir())
	o.MemTableSize, o.BlockCacheSize, o.IndexCacheSize, o.GCInterval = 4<<20, 4<<20, 2<<20, -1
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := plog.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := s.Partition(plog.PartitionID{TopicNum: 1, Partition: 0})
	if err != nil {
		t.Fatal(err)
	}
	marker := func(pid int64, epoch int16, commit bool, coord int32, first int64) []byte {
		return batch.BuildControl(pid, epoch, 1000, batch.ControlMarker{Commit: commit, CoordinatorEpoch: coord, FirstOffset: first})
	}
	for _, b := range [][]byte{
		pbatch(1, 0, 0, false, "idem"),   // 0: idempotent, no transaction
		pbatch(2, 0, 0, true, "a", "b"),  // 1..2: producer 2's transaction begins
		pbatch(3, 0, 0, true, "c"),       // 3: producer 3's
		marker(3, 0, true, 5, 3),         // 4: ... commits
		pbatch(2, 0, 2, true, "d"),       // 5: producer 2 goes on
		marker(4, 2, false, 6, -1),       // 6: an abort of a producer that wrote nothing here, epoch 2
		pbatch(5, 1, 0, true, "e"),       // 7: producer 5's transaction
		marker(6, 0, false, 1, 8),        // 8: (a marker without data of producer 6)
		pbatch(3, 0, 1, true, "f"),       // 9: producer 3's next transaction
		pbatch(7, 0, 0, false, "plain2"), // 10
	} {
		if _, err := p.Append(context.Background(), b, plog.AppendOptions{Sync: true, LogAppendTime: -1}); err != nil {
			t.Fatal(err)
		}
	}
	rb, err := rebuildProducers(p)
	if err != nil {
		t.Fatal(err)
	}
	wantOngoing := map[int64]int64{2: 1, 5: 7, 3: 9}
	if len(rb.ongoing) != len(wantOngoing) {
		t.Fatalf("ongoing transactions %v, want %v", rb.ongoing, wantOngoing)
	}
	for pid, first := range wantOngoing {
		if txn := rb.ongoing[pid]; txn == nil || !txn.exact || txn.first != first {
			t.Fatalf("producer %d's ongoing transaction %+v, want exact at %d", pid, txn, first)
		}
	}
	if len(rb.completing) != 1 || *rb.completing[0] != (completingTxn{first: 3, marker: 4}) {
		t.Fatalf("completing %v, want producer 3's [3, marker 4]", rb.completing)
	}
	if e := rb.producers[3]; e.coordEpoch != 5 || e.verified != 0 || len(e.batches) != 2 {
		t.Fatalf("producer 3: %+v, want coordinator epoch 5, verified at epoch 0, 2 batches", e)
	}
	if e := rb.producers[4]; e.epoch != 2 || e.coordEpoch != 6 || e.verified != -1 {
		t.Fatalf("producer 4: %+v, want epoch 2 from its marker, coordinator epoch 6", e)
	}
	if e := rb.producers[1]; e.verified != -1 || len(e.batches) != 1 {
		t.Fatalf("idempotent producer 1: %+v", e)
	}
	ps := &producerState{producers: rb.producers, ongoing: rb.ongoing, completing: rb.completing}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if got := ps.lsoLocked(p.HighWatermark()); got != 1 {
		t.Fatalf("LSO = %d, want producer 2's first offset 1", got)
	}
	// Retried batches of the rebuilt producers are recognised as duplicates.
	if dup := ps.duplicateLocked(header(t, pbatch(2, 0, 2, true, "d"))); dup == nil || dup.base != 5 {
		t.Fatalf("retry of producer 2's batch at 5: %+v", dup)
	}
}
