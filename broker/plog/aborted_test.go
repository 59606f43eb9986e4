package plog

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/runnel-io/runnel/api/rerr"
	"github.com/runnel-io/runnel/client/batch"
)

// marker is an end-transaction control batch of producer pid (epoch 0) at timestamp ts.
func marker(pid int64, commit bool, first, ts int64) []byte {
	return batch.BuildControl(pid, 0, ts, batch.ControlMarker{Commit: commit, CoordinatorEpoch: 3, FirstOffset: first})
}

func wantAborted(t *testing.T, p *Partition, from, upto int64, want ...AbortedTxn) {
	t.Helper()
	got := p.AbortedTransactions(from, upto)
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("AbortedTransactions(%d, %d) = %+v, want %+v", from, upto, got, want)
	}
}

// abortKeys counts the partition's aborted-transaction keys in Badger.
func abortKeys(t *testing.T, s *Store, id PartitionID) int {
	t.Helper()
	n := 0
	err := s.DB().View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: partPrefix(kindAbort, id), PrefetchValues: false})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAbortedIndex: Append indexes ABORT markers only (not COMMIT, not an ABORT of a transaction that
// wrote nothing), AbortedTransactions answers by overlap sorted by first offset, the index survives a
// reopen, and ReadUpTo stops at its cap.
func TestAbortedIndex(t *testing.T) {
	o := testOptions(t, true)
	s := openStore(t, o)
	id := PartitionID{TopicNum: 1, Partition: 0}
	p := mustPartition(t, s, id)
	for _, b := range [][]byte{
		valueBatch(t, "a", 3, 1000),     // 0..2: producer 7's aborted records
		marker(7, false, 0, 1000),       // 3: ABORT [0, 3]
		marker(8, true, 1, 1000),        // 4: COMMIT: not indexed
		marker(9, false, -1, 1000),      // 5: ABORT of nothing: not indexed
		valueBatch(t, "b", 2, 1000),     // 6..7
		marker(10, false, 6, 1000),      // 8: ABORT [6, 8]
		marker(11, false, 1, 1000),      // 9: ABORT [1, 9]: overlaps both
		valueBatch(t, "c", 1, 1000),     // 10
		marker(12, false, 10, 1000),     // 11
		valueBatch(t, "tail", 1, 1000),  // 12
		marker(13, true, 12, 1000),      // 13: COMMIT
		valueBatch(t, "tail2", 1, 1000), // 14
	} {
		mustAppend(t, p, b, syncAppend)
	}
	check := func(p *Partition) {
		t.Helper()
		a7, a10, a11, a12 := AbortedTxn{7, 0, 3}, AbortedTxn{10, 6, 8}, AbortedTxn{11, 1, 9}, AbortedTxn{12, 10, 11}
		wantAborted(t, p, 0, 100, a7, a11, a10, a12)
		wantAborted(t, p, 4, 100, a11, a10, a12) // a7's marker is before 4
		wantAborted(t, p, 0, 6, a7, a11)         // a10 starts at 6
		wantAborted(t, p, 9, 10, a11)            // a12 starts at 10
		wantAborted(t, p, 3, 4, a7, a11)
		wantAborted(t, p, 12, 100)
	}
	check(p)
	if n := abortKeys(t, s, id); n != 4 {
		t.Fatalf("%d index keys stored, want 4", n)
	}

	// ReadUpTo: the cap is a batch boundary in practice (an LSO); batches reaching it are not returned.
	got, err := p.ReadUpTo(nil, 0, 1<<20, 3)
	if err != nil {
		t.Fatal(err)
	}
	if bs := decode(t, got); len(bs) != 1 || bs[0].h.BaseOffset != 0 {
		t.Fatalf("ReadUpTo(0, end 3) = %d batches, want the one at 0", len(bs))
	}
	got, err = p.ReadUpTo(nil, 0, 1<<20, 9)
	if err != nil {
		t.Fatal(err)
	}
	if bs := decode(t, got); len(bs) != 6 || bs[5].h.NextOffset() != 9 {
		t.Fatalf("ReadUpTo(0, end 9) = %d batches, want 6 ending at 9", len(bs))
	}
	for _, off := range []int64{3, 5, 15} { // in [end, HW]: nothing stable to read yet
		got, err := p.ReadUpTo(nil, off, 1<<20, 3)
		if err != nil || len(got) != 0 {
			t.Fatalf("ReadUpTo(%d, end 3) = %d bytes, %v; want nothing", off, len(got), err)
		}
	}
	if _, err := p.ReadUpTo(nil, 16, 1<<20, 3); !errors.Is(err, rerr.ErrOffsetOutOfRange) {
		t.Fatalf("ReadUpTo above the HW: %v, want OFFSET_OUT_OF_RANGE", err)
	}
	got, err = p.ReadUpTo(nil, 0, 1<<20, 100) // a cap above the HW is the HW
	if err != nil {
		t.Fatal(err)
	}
	if bs := decode(t, got); bs[len(bs)-1].h.NextOffset() != 15 {
		t.Fatalf("ReadUpTo with a cap above the HW ends at %d, want 15", bs[len(bs)-1].h.NextOffset())
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	check(mustPartition(t, s, id))
}

// TestAbortedIndexRetentionAndTruncate: retention drops the entries whose marker it deletes, Truncate
// those whose marker it removes (also when it empties the log), DeletePartition all; each survives a
// reopen.
func TestAbortedIndexRetentionAndTruncate(t *testing.T) {
	o := testOptions(t, false)
	s := openStore(t, o)
	id := PartitionID{TopicNum: 2, Partition: 1}
	p := mustPartition(t, s, id)
	for _, b := range [][]byte{
		valueBatch(t, "a", 2, 1000), // 0..1
		marker(1, false, 0, 1000),   // 2
		valueBatch(t, "b", 2, 5000), // 3..4
		marker(2, false, 3, 5000),   // 5
		valueBatch(t, "c", 1, 5000), // 6
		marker(3, false, 6, 9000),   // 7
		valueBatch(t, "d", 1, 9000), // 8
	} {
		mustAppend(t, p, b, syncAppend)
	}
	a1, a2, a3 := AbortedTxn{1, 0, 2}, AbortedTxn{2, 3, 5}, AbortedTxn{3, 6, 7}
	wantAborted(t, p, 0, 100, a1, a2, a3)

	// Retention deletes the batches older than 4000 ms: [0, 1] and a1's marker at 2.
	if n, err := p.ApplyRetention(time.UnixMilli(6000), 2000, -1); err != nil || n != 2 {
		t.Fatalf("retention deleted %d batches, %v; want 2", n, err)
	}
	if p.LogStartOffset() != 3 {
		t.Fatalf("log start %d, want 3", p.LogStartOffset())
	}
	wantAborted(t, p, 0, 100, a2, a3)
	if n := abortKeys(t, s, id); n != 2 {
		t.Fatalf("%d index keys after retention, want 2", n)
	}

	// Truncate inside the transaction of a3: its marker goes, a2 stays.
	if end, err := p.Truncate(6); err != nil || end != 6 {
		t.Fatalf("truncate: %d, %v", end, err)
	}
	wantAborted(t, p, 0, 100, a2)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, id)
	wantAborted(t, p, 0, 100, a2)
	if n := abortKeys(t, s, id); n != 1 {
		t.Fatalf("%d index keys after truncation and reopen, want 1", n)
	}

	// A follower's log appended again after the cut is indexed again.
	mustAppend(t, p, marker(4, false, 4, 9000), syncAppend) // 6
	a4 := AbortedTxn{4, 4, 6}
	wantAborted(t, p, 0, 100, a2, a4)

	// Truncate at the marker of a2 (offset 5) removes a2 and a4.
	if _, err := p.Truncate(5); err != nil {
		t.Fatal(err)
	}
	wantAborted(t, p, 0, 100)
	mustAppend(t, p, marker(5, false, 3, 9000), syncAppend) // 5
	wantAborted(t, p, 0, 100, AbortedTxn{5, 3, 5})
	// Truncating below the log start empties the log and the index.
	if _, err := p.Truncate(1); err != nil {
		t.Fatal(err)
	}
	wantAborted(t, p, 0, 100)
	if n := abortKeys(t, s, id); n != 0 {
		t.Fatalf("%d index keys after emptying truncation, want 0", n)
	}

	mustAppend(t, p, valueBatch(t, "e", 1, 9000), syncAppend) // 1
	mustAppend(t, p, marker(6, false, 1, 9000), syncAppend)   // 2
	wantAborted(t, p, 0, 100, AbortedTxn{6, 1, 2})
	if err := s.DeletePartition(id); err != nil {
		t.Fatal(err)
	}
	if n := abortKeys(t, s, id); n != 0 {
		t.Fatalf("%d index keys after DeletePartition, want 0", n)
	}
	wantAborted(t, mustPartition(t, s, id), 0, 100)
}

// TestAbortedIndexFollower: a follower that copies the leader's log with AppendReplica holds the same
// index, from the markers' bytes alone, also after a reopen.
func TestAbortedIndexFollower(t *testing.T) {
	leader := openStore(t, testOptions(t, false))
	fo := testOptions(t, false)
	follower := openStore(t, fo)
	id := PartitionID{TopicNum: 3, Partition: 0}
	lp, fp := mustPartition(t, leader, id), mustPartition(t, follower, id)
	lp.SetReplicated()
	fp.SetReplicated()
	for _, b := range [][]byte{
		valueBatch(t, "a", 2, 1000),
		marker(1, false, 0, 1000),
		valueBatch(t, "b", 2, 1000),
		marker(2, true, 3, 1000),
		valueBatch(t, "c", 1, 1000),
		marker(3, false, 6, 1000),
	} {
		if _, err := lp.Append(context.Background(), b, AppendOptions{LogAppendTime: -1, LeaderEpoch: 2}); err != nil {
			t.Fatal(err)
		}
	}
	for fp.LogEndOffset() < lp.DurableEnd() {
		data, err := lp.ReadLocal(nil, fp.LogEndOffset(), 100)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fp.AppendReplica(context.Background(), data, AppendOptions{Sync: true}); err != nil {
			t.Fatal(err)
		}
	}
	want := []AbortedTxn{{1, 0, 2}, {3, 6, 7}}
	wantAborted(t, lp, 0, 100, want...)
	wantAborted(t, fp, 0, 100, want...)
	if err := follower.Close(); err != nil {
		t.Fatal(err)
	}
	follower = openStore(t, fo)
	wantAborted(t, mustPartition(t, follower, id), 0, 100, want...)
}

// TestAbortedIndexRecoveryDropsOrphans: an entry left without its marker (at or past the LEO, as a
// crash between the transactions of one write group leaves it) or below the log start is deleted on
// open; a malformed entry fails the open.
func TestAbortedIndexRecoveryDropsOrphans(t *testing.T) {
	o := testOptions(t, false)
	s := openStore(t, o)
	id := PartitionID{TopicNum: 4, Partition: 0}
	p := mustPartition(t, s, id)
	mustAppend(t, p, valueBatch(t, "a", 2, 1000), syncAppend)
	mustAppend(t, p, marker(1, false, 0, 1000), syncAppend) // 2
	prefix := partPrefix(kindAbort, id)
	err := s.DB().Update(func(txn *badger.Txn) error {
		return txn.Set(batchKey(prefix, 3), encodeAborted(AbortedTxn{ProducerID: 2, FirstOffset: 0, LastOffset: 3}))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, id)
	wantAborted(t, p, 0, 100, AbortedTxn{1, 0, 2})
	if n := abortKeys(t, s, id); n != 1 {
		t.Fatalf("%d index keys after recovery, want 1", n)
	}

	id2 := PartitionID{TopicNum: 4, Partition: 1}
	err = s.DB().Update(func(txn *badger.Txn) error {
		return txn.Set(batchKey(partPrefix(kindAbort, id2), 3), []byte{1, 2, 3})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Partition(id2); err == nil {
		t.Fatal("open with a malformed aborted-transaction entry succeeded")
	}
}
