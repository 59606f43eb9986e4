package client

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
)

// txnTestBatch builds a batch of values at offset base from producer pid, transactional or not.
func txnTestBatch(t testing.TB, base, pid int64, transactional bool, values ...string) []byte {
	t.Helper()
	var b batch.Builder
	for i, v := range values {
		b.Append(1000+int64(i), nil, []byte(v), nil)
	}
	b.SetProducer(pid, 0, int32(base))
	b.SetTransactional(transactional)
	out := append([]byte(nil), b.Build(batch.CompressionNone)...)
	batch.SetBaseOffset(out, base)
	if _, err := batch.Validate(out); err != nil {
		t.Fatal(err)
	}
	return out
}

// txnTestMarker builds an end-transaction control batch of pid at offset off.
func txnTestMarker(t testing.TB, off, pid int64, commit bool, first int64) []byte {
	t.Helper()
	out := batch.BuildControl(pid, 0, 2000, batch.ControlMarker{Commit: commit, FirstOffset: first})
	batch.SetBaseOffset(out, off)
	if m, err := batch.ParseControl(out); err != nil || m.Commit != commit {
		t.Fatalf("marker: %+v %v", m, err)
	}
	return out
}

func joinBatches(bs ...[]byte) []byte { return slices.Concat(bs...) }

func valuesOf(recs []*Record) string {
	var vs []string
	for _, r := range recs {
		vs = append(vs, string(r.Value))
	}
	return strings.Join(vs, ",")
}

func aborted(pairs ...int64) []*runnelv1.AbortedTransaction {
	var out []*runnelv1.AbortedTransaction
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, &runnelv1.AbortedTransaction{ProducerId: pairs[i], FirstOffset: pairs[i+1]})
	}
	return out
}

// TestAbortedTransactionFilter checks the read_committed filter on hand-built answers: records of
// aborted transactions are dropped, those of committed ones, of later transactions of the same producer
// and of non-transactional producers kept, control batches never returned, and the position moves past
// everything.
func TestAbortedTransactionFilter(t *testing.T) {
	// 0-1 plain; 2-3 txn of 7 (aborted); 4-5 txn of 8 (committed); 6 ABORT 7; 7 COMMIT 8;
	// 8-9 txn of 7 (its next transaction, committed); 10 COMMIT 7.
	log := joinBatches(
		txnTestBatch(t, 0, -1, false, "a", "b"),
		txnTestBatch(t, 2, 7, true, "t7-1", "t7-2"),
		txnTestBatch(t, 4, 8, true, "t8-1", "t8-2"),
		txnTestMarker(t, 6, 7, false, 2),
		txnTestMarker(t, 7, 8, true, 4),
		txnTestBatch(t, 8, 7, true, "t7-3", "t7-4"),
		txnTestMarker(t, 10, 7, true, 8),
	)
	cases := []struct {
		name    string
		from    int64
		aborted []*runnelv1.AbortedTransaction
		want    string
	}{
		{"read_uncommitted keeps every data record", 0, nil, "a,b,t7-1,t7-2,t8-1,t8-2,t7-3,t7-4"},
		{"read_committed drops the aborted transaction", 0, aborted(7, 2), "a,b,t8-1,t8-2,t7-3,t7-4"},
		{"fetch offset inside the aborted batch", 3, aborted(7, 2), "t8-1,t8-2,t7-3,t7-4"},
		{"entry of an aborted transaction the answer does not reach yet", 0, aborted(7, 2, 8, 100), "a,b,t8-1,t8-2,t7-3,t7-4"},
		{"unsorted entries", 0, aborted(9, 50, 7, 2), "a,b,t8-1,t8-2,t7-3,t7-4"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			recs, next, err := decodeFetched(log, "t", 0, c.from, c.aborted)
			if err != nil {
				t.Fatal(err)
			}
			if got := valuesOf(recs); got != c.want {
				t.Fatalf("records %q, want %q", got, c.want)
			}
			if next != 11 {
				t.Fatalf("next offset %d, want 11 (past the last marker)", next)
			}
			for _, r := range recs {
				if c.aborted != nil && strings.HasPrefix(string(r.Value), "t7-") && r.Offset < 8 {
					t.Fatalf("record of the aborted transaction at %d returned", r.Offset)
				}
			}
		})
	}
}

// TestAbortedTransactionFilterSpans covers an aborted transaction that began before the answer (its
// first offset below the answer's first batch), two aborted transactions of one producer back to back,
// and a non-transactional batch of an aborted producer id (kept: only transactional batches are
// dropped).
func TestAbortedTransactionFilterSpans(t *testing.T) {
	// The answer starts at 5: producer 9's transaction began at 0 and is aborted by the marker at 7.
	spanning := joinBatches(
		txnTestBatch(t, 5, 9, true, "t9-late"),
		txnTestBatch(t, 6, 4, true, "t4"),
		txnTestMarker(t, 7, 9, false, 0),
		txnTestMarker(t, 8, 4, true, 6),
	)
	recs, next, err := decodeFetched(spanning, "t", 0, 5, aborted(9, 0))
	if err != nil || valuesOf(recs) != "t4" || next != 9 {
		t.Fatalf("spanning: %q next %d err %v", valuesOf(recs), next, err)
	}

	// Producer 7 aborts twice, then commits.
	twice := joinBatches(
		txnTestBatch(t, 0, 7, true, "x1"),
		txnTestMarker(t, 1, 7, false, 0),
		txnTestBatch(t, 2, 7, true, "x2"),
		txnTestMarker(t, 3, 7, false, 2),
		txnTestBatch(t, 4, 7, true, "kept"),
		txnTestMarker(t, 5, 7, true, 4),
		txnTestBatch(t, 6, 7, false, "plain"),
	)
	recs, next, err = decodeFetched(twice, "t", 0, 0, aborted(7, 2, 7, 0))
	if err != nil || valuesOf(recs) != "kept,plain" || next != 7 {
		t.Fatalf("twice: %q next %d err %v", valuesOf(recs), next, err)
	}

	// Only control batches: nothing returned, the position moves past them.
	markers := joinBatches(txnTestMarker(t, 0, 7, false, -1), txnTestMarker(t, 1, 8, true, -1))
	for _, ab := range [][]*runnelv1.AbortedTransaction{nil, aborted(7, 0)} {
		recs, next, err = decodeFetched(markers, "t", 0, 0, ab)
		if err != nil || len(recs) != 0 || next != 2 {
			t.Fatalf("markers only (aborted %v): %q next %d err %v", ab, valuesOf(recs), next, err)
		}
	}

	// A batch cut short at the end is left for the next fetch, as without the filter.
	cut := joinBatches(txnTestBatch(t, 0, 7, true, "gone"), txnTestBatch(t, 1, 8, true, "half"))
	recs, next, err = decodeFetched(cut[:len(cut)-3], "t", 0, 0, aborted(7, 0))
	if err != nil || len(recs) != 0 || next != 1 {
		t.Fatalf("cut: %q next %d err %v", valuesOf(recs), next, err)
	}
}

// TestTxnPartitionFor checks the coordinator hash against Java's String.hashCode.
func TestTxnPartitionFor(t *testing.T) {
	if got := txnPartitionFor("hello", 50); got != 99162322%50 { // "hello".hashCode() == 99162322
		t.Fatalf("hello: %d", got)
	}
	if got := txnPartitionFor("polygenelubricants", 50); got != 0 { // hashCode() == Integer.MIN_VALUE
		t.Fatalf("MIN_VALUE hash: %d", got)
	}
	if got := txnPartitionFor("ab", 7); got != (31*97+98)%7 {
		t.Fatalf("ab: %d", got)
	}
}

// TestTransactionalOptions checks what NewProducer refuses with WithTransactionalID.
func TestTransactionalOptions(t *testing.T) {
	bad := []struct {
		opts []ProducerOption
		want string
	}{
		{[]ProducerOption{WithTransactionalID("x"), WithAcks(AcksLeader)}, "needs WithAcks(AcksAll)"},
		{[]ProducerOption{WithTransactionalID("x"), WithIdempotence(false)}, "is idempotent"},
		{[]ProducerOption{WithTransactionTimeout(time.Second)}, "add WithTransactionalID"},
		{[]ProducerOption{WithTransactionalID("x"), WithTransactionTimeout(0)}, "WithTransactionTimeout(0s)"},
	}
	for _, c := range bad {
		if _, err := NewProducer([]string{"127.0.0.1:1"}, c.opts...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("options %d: err %v, want it to contain %q", len(c.opts), err, c.want)
		}
	}
	p, err := NewProducer([]string{"127.0.0.1:1"}, WithTransactionalID("x"), WithTransactionTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !p.cfg.idempotence || p.cfg.acks != AcksAll || p.cfg.txnTimeout != 5*time.Second {
		t.Fatalf("config %+v", p.cfg)
	}
}

// TestTransactionalCallOrder checks the calls refused before any broker is involved (Kafka's
// IllegalStateException cases): no broker listens at the address, and none is needed.
func TestTransactionalCallOrder(t *testing.T) {
	ctx := context.Background()
	p, err := NewProducer([]string{"127.0.0.1:1"}, WithTransactionalID("order"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var got error
	p.Produce(ctx, NewRecord("t", nil, []byte("v")), func(_ *Record, err error) { got = err })
	if !errors.Is(got, ErrTxnState) {
		t.Fatalf("Produce before InitTransactions: %v", got)
	}
	if err := p.BeginTransaction(); !errors.Is(err, ErrTxnState) {
		t.Fatalf("BeginTransaction before InitTransactions: %v", err)
	}
	for name, call := range map[string]func() error{
		"commit": func() error { return p.CommitTransaction(ctx) },
		"abort":  func() error { return p.AbortTransaction(ctx) },
		"offsets": func() error {
			return p.SendOffsetsToTransaction(ctx, nil, GroupMetadata{GroupID: "g"})
		},
	} {
		if err := call(); !errors.Is(err, ErrTxnState) {
			t.Fatalf("%s before InitTransactions: %v", name, err)
		}
	}

	// The same calls on a producer without a transactional id.
	plain, err := NewProducer([]string{"127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.InitTransactions(ctx); !errors.Is(err, ErrTxnState) {
		t.Fatalf("InitTransactions without an id: %v", err)
	}
	if err := plain.BeginTransaction(); !errors.Is(err, ErrTxnState) {
		t.Fatalf("BeginTransaction without an id: %v", err)
	}
}

// TestIsolationLevelParse covers the spellings the CLI passes through.
func TestIsolationLevelParse(t *testing.T) {
	for s, want := range map[string]IsolationLevel{"read_committed": ReadCommitted, "read-uncommitted": ReadUncommitted} {
		if l, err := ParseIsolationLevel(s); err != nil || l != want || (l.String() != s && l.String() != strings.ReplaceAll(s, "-", "_")) {
			t.Fatalf("%s: %v %v", s, l, err)
		}
	}
	if _, err := ParseIsolationLevel("serializable"); err == nil {
		t.Fatal("serializable accepted")
	}
	if _, err := NewConsumer([]string{"127.0.0.1:1"}, WithIsolationLevel(5)); err == nil {
		t.Fatal("isolation level 5 accepted")
	}
}

// FuzzDecodeFetchedReadCommitted feeds arbitrary answer bytes and aborted-transaction lists to the
// read_committed decode path: it must not panic, must return records in offset order at or after the
// fetch offset, and must never move the position backwards.
func FuzzDecodeFetchedReadCommitted(f *testing.F) {
	seed := func(bs ...[]byte) []byte { return slices.Concat(bs...) }
	f.Add(seed(txnTestBatch(f, 0, 7, true, "a"), txnTestMarker(f, 1, 7, false, 0), txnTestBatch(f, 2, 8, true, "b")), int64(0), int64(7), int64(0))
	f.Add(seed(txnTestBatch(f, 3, -1, false, "x", "y"), txnTestMarker(f, 5, 9, true, -1)), int64(4), int64(9), int64(-5))
	f.Add([]byte{}, int64(0), int64(1), int64(1))
	f.Fuzz(func(t *testing.T, b []byte, from, pid, first int64) {
		if from < 0 {
			from = -from
		}
		recs, next, _ := decodeFetched(b, "t", 0, from, aborted(pid, first, pid+1, first+1))
		if next < from {
			t.Fatalf("next %d below the fetch offset %d", next, from)
		}
		last := int64(-1)
		for _, r := range recs {
			if r.Offset < from || r.Offset <= last || r.Offset >= next {
				t.Fatalf("record at %d (from %d, previous %d, next %d)", r.Offset, from, last, next)
			}
			last = r.Offset
		}
	})
}
