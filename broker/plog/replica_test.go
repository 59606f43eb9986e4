package plog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/runnel-io/runnel/api/rerr"
	"github.com/runnel-io/runnel/client/batch"
)

// epochAppend is an acks=all append in leader epoch e, keeping producer time.
func epochAppend(e int32) AppendOptions {
	return AppendOptions{Sync: true, LogAppendTime: -1, LeaderEpoch: e}
}

// readLocalAll returns the stored bytes of every batch from offset from up to DurableEnd.
func readLocalAll(t testing.TB, p *Partition, from int64) []byte {
	t.Helper()
	var out []byte
	for off := from; off < p.DurableEnd(); {
		n := len(out)
		var err error
		out, err = p.ReadLocal(out, off, 1<<20)
		if err != nil {
			t.Fatalf("read local at %d: %v", off, err)
		}
		if len(out) == n {
			break // a gap up to the end
		}
		got := decode(t, out[n:])
		off = got[len(got)-1].h.NextOffset()
	}
	return out
}

// derivedEpochs is the leader-epoch cache that the stored batches b imply: an entry where a batch's
// epoch rises above the latest.
func derivedEpochs(t testing.TB, b []byte) []EpochEntry {
	t.Helper()
	var out []EpochEntry
	for _, s := range decode(t, b) {
		if e := s.h.PartitionLeaderEpoch; e >= 0 && (len(out) == 0 || e > out[len(out)-1].Epoch) {
			out = append(out, EpochEntry{e, s.h.BaseOffset})
		}
	}
	return out
}

// storedHW returns the HW checkpoint key's value, or -1 when there is none.
func storedHW(t testing.TB, s *Store, id PartitionID) int64 {
	t.Helper()
	hw := int64(-1)
	err := s.DB().View(func(txn *badger.Txn) error {
		item, err := txn.Get(partPrefix(kindHW, id))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			hw, err = decodeHW(v)
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return hw
}

func TestReplicatedHighWatermark(t *testing.T) {
	for _, fsync := range []bool{false, true} {
		t.Run(fmt.Sprintf("fsync=%v", fsync), func(t *testing.T) {
			o := testOptions(t, fsync)
			s := openStore(t, o)
			p := mustPartition(t, s, pid)
			r0 := mustAppend(t, p, valueBatch(t, "a", 3, 1), syncAppend)
			if p.Replicated() {
				t.Fatal("replicated before SetReplicated")
			}
			if err := p.SetHighWatermark(1); err == nil {
				t.Fatal("SetHighWatermark on a partition not in replicated mode")
			}
			p.SetReplicated()
			p.SetReplicated() // idempotent
			if !p.Replicated() || p.HighWatermark() != 3 || storedHW(t, s, pid) != 3 {
				t.Fatalf("replicated %v HW %d stored %d, want the HW the partition had (3)", p.Replicated(), p.HighWatermark(), storedHW(t, s, pid))
			}

			// Appends advance DurableEnd (and wake Changed), not the HW.
			ch := p.Changed()
			r1 := mustAppend(t, p, valueBatch(t, "b", 2, 2), syncAppend)
			r2 := mustAppend(t, p, valueBatch(t, "c", 4, 3), syncAppend)
			if !closedWithin(ch, 5*time.Second) {
				t.Fatal("Changed not closed when DurableEnd advanced")
			}
			if p.DurableEnd() != r2.LastOffset+1 || p.LogEndOffset() != r2.LastOffset+1 || p.HighWatermark() != r0.LastOffset+1 {
				t.Fatalf("durable %d LEO %d HW %d", p.DurableEnd(), p.LogEndOffset(), p.HighWatermark())
			}
			// Read caps at the HW, ReadLocal at DurableEnd.
			if b, err := p.Read(nil, 3, 1<<20); err != nil || len(b) != 0 {
				t.Fatalf("read at the HW: %d bytes, %v", len(b), err)
			}
			if _, err := p.Read(nil, 4, 1<<20); !isErr(err, rerr.ErrOffsetOutOfRange) {
				t.Fatalf("read above the HW: %v", err)
			}
			if got := decode(t, readLocalAll(t, p, 0)); len(got) != 3 || got[2].h.NextOffset() != 9 {
				t.Fatalf("read local: %d batches", len(got))
			}
			if _, err := p.ReadLocal(nil, 10, 1<<20); !isErr(err, rerr.ErrOffsetOutOfRange) {
				t.Fatalf("read local above the durable end: %v", err)
			}
			if off, _, err := p.OffsetForTimestamp(2); err != nil || off != -1 {
				t.Fatalf("offset for a timestamp above the HW: %d %v", off, err)
			}

			// SetHighWatermark: forward only, clamped to DurableEnd, wakes Changed, checkpointed.
			ch = p.Changed()
			if err := p.SetHighWatermark(r1.LastOffset + 1); err != nil {
				t.Fatal(err)
			}
			if !closedWithin(ch, 0) || p.HighWatermark() != 5 {
				t.Fatalf("HW %d after SetHighWatermark(5), Changed closed %v", p.HighWatermark(), closedWithin(ch, 0))
			}
			if got := decode(t, must(p.Read(nil, 0, 1<<20))); len(got) != 2 {
				t.Fatalf("read up to HW 5: %d batches", len(got))
			}
			waitFor(t, 5*time.Second, "HW checkpoint", func() bool { return storedHW(t, s, pid) == 5 })
			ch = p.Changed()
			if err := p.SetHighWatermark(4); err != nil || p.HighWatermark() != 5 || closedWithin(ch, 0) {
				t.Fatalf("SetHighWatermark(4) after 5: HW %d, %v", p.HighWatermark(), err)
			}
			if err := p.SetHighWatermark(-1); err == nil {
				t.Fatal("negative HW accepted")
			}
			if err := p.SetHighWatermark(1000); err != nil || p.HighWatermark() != 9 {
				t.Fatalf("SetHighWatermark above DurableEnd: HW %d, %v", p.HighWatermark(), err)
			}

			// Survives a restart; a checkpoint above what the log holds is clamped to the LEO.
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, o)
			p = mustPartition(t, s, pid)
			if !p.Replicated() || p.HighWatermark() != 9 || p.DurableEnd() != 9 {
				t.Fatalf("after reopen: replicated %v HW %d durable %d", p.Replicated(), p.HighWatermark(), p.DurableEnd())
			}
			if err := p.SetHighWatermark(1); err != nil || p.HighWatermark() != 9 {
				t.Fatalf("HW moved back after reopen: %d %v", p.HighWatermark(), err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			db, err := badger.Open(o.badgerOptions())
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(func(txn *badger.Txn) error { return txn.Set(partPrefix(kindHW, pid), encodeOffset(50)) }); err != nil {
				t.Fatal(err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, o)
			p = mustPartition(t, s, pid)
			if p.HighWatermark() != 9 {
				t.Fatalf("checkpoint 50 above LEO 9 recovered as HW %d", p.HighWatermark())
			}
			// A partition never put in replicated mode comes back as before: HW = LEO.
			q := mustPartition(t, s, PartitionID{TopicNum: 8})
			mustAppend(t, q, valueBatch(t, "q", 2, 1), syncAppend)
			if q.Replicated() || q.HighWatermark() != 2 || storedHW(t, s, q.ID()) != -1 {
				t.Fatalf("plain partition: replicated %v HW %d", q.Replicated(), q.HighWatermark())
			}
		})
	}
}

// TestAppendReplicaCopiesLeader copies a leader's log into a follower batch by batch and in chunks: the
// follower's log is byte-identical, with the same offsets, epochs, epoch cache and time index.
func TestAppendReplicaCopiesLeader(t *testing.T) {
	for _, fsync := range []bool{false, true} {
		t.Run(fmt.Sprintf("fsync=%v", fsync), func(t *testing.T) {
			o := testOptions(t, fsync)
			s := openStore(t, o)
			leader := mustPartition(t, s, PartitionID{TopicNum: 1})
			follower := mustPartition(t, s, PartitionID{TopicNum: 1, Partition: 1})
			follower.SetReplicated()
			for i, e := range []int32{0, 0, 2, 2, 2, 5} {
				b := makeBatch(t, []batch.Compression{batch.CompressionNone, batch.CompressionZstd, batch.CompressionLZ4}[i%3],
					rec{ts: int64(100 + i), key: []byte("k"), value: fmt.Appendf(nil, "v%d", i)}, rec{ts: int64(100 + i), value: []byte("w")})
				opts := epochAppend(e)
				if i == 4 {
					opts.LogAppendTime = 5000
				}
				mustAppend(t, leader, b, opts)
			}
			want := readLocalAll(t, leader, 0)

			// Batch by batch for the first half, then the rest in one call.
			var first [][]byte
			if err := batch.Split(want, func(b []byte, _ batch.Header) error { first = append(first, b); return nil }); err != nil {
				t.Fatal(err)
			}
			for _, b := range first[:3] {
				leo, err := follower.AppendReplica(context.Background(), append([]byte(nil), b...), AppendOptions{Sync: true})
				if err != nil {
					t.Fatal(err)
				}
				if h, _ := batch.ParseHeader(b); leo != h.NextOffset() || follower.LogEndOffset() != leo {
					t.Fatalf("AppendReplica returned LEO %d, want %d", leo, h.NextOffset())
				}
			}
			rest := bytes.Join(first[3:], nil)
			if _, err := follower.AppendReplica(context.Background(), rest, AppendOptions{Sync: true, LogAppendTime: 1, LeaderEpoch: 99}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 5*time.Second, "durable end", func() bool { return follower.DurableEnd() == leader.LogEndOffset() })
			if got := readLocalAll(t, follower, 0); !bytes.Equal(got, want) {
				t.Fatalf("follower's log differs from the leader's (%d vs %d bytes)", len(got), len(want))
			}
			if !slices.Equal(follower.EpochEntries(), leader.EpochEntries()) ||
				!slices.Equal(follower.EpochEntries(), []EpochEntry{{0, 0}, {2, 4}, {5, 10}}) {
				t.Fatalf("epoch caches: follower %v leader %v", follower.EpochEntries(), leader.EpochEntries())
			}
			if follower.Size() != leader.Size() || follower.HighWatermark() != 0 {
				t.Fatalf("follower size %d (leader %d), HW %d", follower.Size(), leader.Size(), follower.HighWatermark())
			}
			for _, ts := range []int64{0, 101, 104, 105, 5000} {
				lo, lts, _ := leader.OffsetForTimestamp(ts)
				if err := follower.SetHighWatermark(follower.DurableEnd()); err != nil {
					t.Fatal(err)
				}
				fo, fts, _ := follower.OffsetForTimestamp(ts)
				if lo != fo || lts != fts {
					t.Fatalf("OffsetForTimestamp(%d): leader %d/%d follower %d/%d", ts, lo, lts, fo, fts)
				}
			}

			// Mismatches change nothing: a gap, an overlap, a gap between two batches, a wrong start.
			leo, size := follower.LogEndOffset(), follower.Size()
			next := valueBatch(t, "n", 2, 200)
			for name, b := range map[string][]byte{
				"gap":           withBase(next, leo+1),
				"overlap":       withBase(next, leo-1),
				"rewrite":       withBase(next, 0),
				"inner gap":     append(withBase(next, leo), withBase(next, leo+3)...),
				"inner overlap": append(withBase(next, leo), withBase(next, leo+1)...),
			} {
				if _, err := follower.AppendReplica(context.Background(), b, AppendOptions{Sync: true}); !errors.Is(err, ErrOffsetMismatch) {
					t.Fatalf("%s: %v, want ErrOffsetMismatch", name, err)
				}
			}
			corrupt := withBase(next, leo)
			corrupt[len(corrupt)-1] ^= 1
			if _, err := follower.AppendReplica(context.Background(), corrupt, AppendOptions{Sync: true}); !isErr(err, rerr.ErrCorruptMessage) {
				t.Fatalf("corrupt CRC: %v", err)
			}
			if _, err := follower.AppendReplica(context.Background(), nil, AppendOptions{Sync: true}); !isErr(err, rerr.ErrCorruptMessage) {
				t.Fatalf("no batch: %v", err)
			}
			if follower.LogEndOffset() != leo || follower.Size() != size || !bytes.Equal(readLocalAll(t, follower, 0), want) {
				t.Fatal("a refused AppendReplica changed the log")
			}

			// AllowGaps takes a compacted leader's gaps, never an overlap; epochs below the latest and
			// negative ones add no cache entry.
			g := withBase(next, leo+5)
			batch.SetPartitionLeaderEpoch(g, 3)
			if end, err := follower.AppendReplica(context.Background(), g, AppendOptions{AllowGaps: true}); err != nil || end != leo+7 {
				t.Fatalf("AllowGaps: %d %v", end, err)
			}
			ov := withBase(next, leo+6)
			if _, err := follower.AppendReplica(context.Background(), ov, AppendOptions{AllowGaps: true}); !errors.Is(err, ErrOffsetMismatch) {
				t.Fatalf("overlap with AllowGaps: %v", err)
			}
			neg := withBase(next, leo+7) // epoch -1, as makeBatch leaves it
			if _, err := follower.AppendReplica(context.Background(), neg, AppendOptions{}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(follower.EpochEntries(), []EpochEntry{{0, 0}, {2, 4}, {5, 10}}) {
				t.Fatalf("epoch cache after lower epochs: %v", follower.EpochEntries())
			}
			waitFor(t, 5*time.Second, "durable end", func() bool { return follower.DurableEnd() == leo+9 })
			if got := decode(t, readLocalAll(t, follower, leo)); len(got) != 2 || got[0].h.BaseOffset != leo+5 {
				t.Fatalf("read across the gap: %+v", got)
			}
		})
	}
}

// withBase returns a copy of b with base offset base (outside the CRC).
func withBase(b []byte, base int64) []byte {
	c := append([]byte(nil), b...)
	batch.SetBaseOffset(c, base)
	return c
}

func TestTruncate(t *testing.T) {
	for _, fsync := range []bool{false, true} {
		t.Run(fmt.Sprintf("fsync=%v", fsync), func(t *testing.T) { testTruncate(t, fsync) })
	}
}

func testTruncate(t *testing.T, fsync bool) {
	o := testOptions(t, fsync)
	s := openStore(t, o)
	p := mustPartition(t, s, pid)
	// [0,3) e0 ts 10, [3,5) e0 ts 20, [5,8) e1 ts 30, [8,9) e2 ts 40, [9,11) e2 ts 50.
	for i, b := range []struct {
		n     int
		epoch int32
	}{{3, 0}, {2, 0}, {3, 1}, {1, 2}, {2, 2}} {
		mustAppend(t, p, valueBatch(t, fmt.Sprint(i), b.n, int64(10*(i+1))), epochAppend(b.epoch))
	}
	p.SetReplicated()
	if err := p.SetHighWatermark(9); err != nil {
		t.Fatal(err)
	}
	sizeOf := func(from int64) int64 { return int64(len(readLocalAll(t, p, from))) }
	check := func(what string, leo int64, epochs []EpochEntry, batches int) {
		t.Helper()
		if p.LogEndOffset() != leo || p.DurableEnd() != leo {
			t.Fatalf("%s: LEO %d durable %d, want %d", what, p.LogEndOffset(), p.DurableEnd(), leo)
		}
		if got := decode(t, readLocalAll(t, p, p.LogStartOffset())); len(got) != batches {
			t.Fatalf("%s: %d batches, want %d", what, len(got), batches)
		}
		if !slices.Equal(p.EpochEntries(), epochs) {
			t.Fatalf("%s: epochs %v, want %v", what, p.EpochEntries(), epochs)
		}
		if p.Size() != sizeOf(p.LogStartOffset()) {
			t.Fatalf("%s: size %d, batches take %d", what, p.Size(), sizeOf(p.LogStartOffset()))
		}
		if p.HighWatermark() > leo || p.HighWatermark() < p.LogStartOffset() {
			t.Fatalf("%s: HW %d outside [%d, %d]", what, p.HighWatermark(), p.LogStartOffset(), leo)
		}
	}
	check("before", 11, []EpochEntry{{0, 0}, {1, 5}, {2, 8}}, 5)

	// At the LEO: nothing changes.
	if end, err := p.Truncate(11); err != nil || end != 11 {
		t.Fatalf("Truncate(11) = %d, %v", end, err)
	}
	check("no-op", 11, []EpochEntry{{0, 0}, {1, 5}, {2, 8}}, 5)
	if _, err := p.Truncate(-1); err == nil {
		t.Fatal("Truncate(-1) accepted")
	}

	// At a batch boundary: the epoch-2 batches go with their cache entry, the HW follows down.
	ch := p.Changed()
	if end, err := p.Truncate(8); err != nil || end != 8 {
		t.Fatalf("Truncate(8) = %d, %v", end, err)
	}
	if !closedWithin(ch, 0) {
		t.Fatal("Changed not closed by Truncate")
	}
	check("boundary", 8, []EpochEntry{{0, 0}, {1, 5}}, 3)
	if p.HighWatermark() != 8 || storedHW(t, s, pid) != 8 {
		t.Fatalf("HW %d stored %d after truncation to 8", p.HighWatermark(), storedHW(t, s, pid))
	}
	if off, ts, err := p.OffsetForTimestamp(35); err != nil || off != -1 {
		t.Fatalf("time index still points at a truncated batch: %d %d %v", off, ts, err)
	}
	if _, err := p.Read(nil, 9, 100); !isErr(err, rerr.ErrOffsetOutOfRange) {
		t.Fatalf("read past the new end: %v", err)
	}

	// Inside a batch: from its base.
	if end, err := p.Truncate(4); err != nil || end != 3 {
		t.Fatalf("Truncate(4) = %d, %v", end, err)
	}
	check("inside", 3, []EpochEntry{{0, 0}}, 1)
	if p.HighWatermark() != 3 {
		t.Fatalf("HW %d", p.HighWatermark())
	}

	// Appends continue at the new end, in a new epoch; a smaller timestamp than the removed ones gets
	// its time-index entry again.
	res := mustAppend(t, p, valueBatch(t, "n", 2, 15), epochAppend(3))
	if res.BaseOffset != 3 {
		t.Fatalf("append after truncate at %d, want 3", res.BaseOffset)
	}
	check("append", 5, []EpochEntry{{0, 0}, {3, 3}}, 2)
	if err := p.SetHighWatermark(5); err != nil {
		t.Fatal(err)
	}
	if off, ts, err := p.OffsetForTimestamp(12); err != nil || off != 3 || ts != 15 {
		t.Fatalf("OffsetForTimestamp(12) = %d %d %v", off, ts, err)
	}
	if end, found := p.EndOffsetForEpoch(2); end != 3 || found != 0 {
		t.Fatalf("EndOffsetForEpoch(2) = %d %d", end, found)
	}

	// Survives a restart.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	check("reopen", 5, []EpochEntry{{0, 0}, {3, 3}}, 2)
	if p.HighWatermark() != 5 {
		t.Fatalf("HW %d after reopen", p.HighWatermark())
	}

	// Below the log start: retention moves it to 3, then a truncation to 1 empties the log at 1.
	if n, err := p.ApplyRetention(time.Now(), -1, sizeOf(3)); err != nil || n != 1 || p.LogStartOffset() != 3 {
		t.Fatalf("retention: %d %v, start %d", n, err, p.LogStartOffset())
	}
	if end, err := p.Truncate(1); err != nil || end != 1 {
		t.Fatalf("Truncate(1) below log start 3 = %d, %v", end, err)
	}
	check("below start", 1, nil, 0)
	if p.LogStartOffset() != 1 || p.HighWatermark() != 1 || p.LatestEpoch() != -1 || p.Size() != 0 {
		t.Fatalf("start %d HW %d epoch %d size %d", p.LogStartOffset(), p.HighWatermark(), p.LatestEpoch(), p.Size())
	}
	if _, err := p.Read(nil, 0, 100); !isErr(err, rerr.ErrOffsetOutOfRange) {
		t.Fatalf("read below the new start: %v", err)
	}
	if b, err := p.ReadLocal(nil, 1, 100); err != nil || len(b) != 0 {
		t.Fatalf("read at the new start: %d %v", len(b), err)
	}
	for _, kind := range []byte{kindBatch, kindTime, kindEpoch} {
		if n := countKeys(t, s, partPrefix(kind, pid)); n != 0 {
			t.Fatalf("%d keys of kind %c left in an emptied log", n, kind)
		}
	}
	res = mustAppend(t, p, valueBatch(t, "m", 1, 5), epochAppend(4))
	if res.BaseOffset != 1 {
		t.Fatalf("append after emptying at %d", res.BaseOffset)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	check("reopen after emptying", 2, []EpochEntry{{4, 1}}, 1)
	if p.LogStartOffset() != 1 {
		t.Fatalf("log start %d after reopen", p.LogStartOffset())
	}
	// Truncating to the log start of a log with batches empties it too.
	if end, err := p.Truncate(1); err != nil || end != 1 {
		t.Fatalf("Truncate(1) = %d %v", end, err)
	}
	check("to start", 1, nil, 0)

	// Above the LEO: the log restarts there (a follower behind the leader's log start).
	mustAppend(t, p, valueBatch(t, "z", 3, 5), epochAppend(6))
	if end, err := p.Truncate(30); err != nil || end != 30 {
		t.Fatalf("Truncate(30) above LEO 4 = %d %v", end, err)
	}
	check("above", 30, nil, 0)
	if p.LogStartOffset() != 30 || p.HighWatermark() != 30 || p.Size() != 0 {
		t.Fatalf("start %d HW %d size %d", p.LogStartOffset(), p.HighWatermark(), p.Size())
	}
	if n, err := p.AppendReplica(context.Background(), withBase(valueBatch(t, "r", 2, 6), 30), AppendOptions{Sync: true}); err != nil || n != 32 {
		t.Fatalf("AppendReplica at the new start: %d %v", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	check("above, reopened", 32, nil, 1)
	if p.LogStartOffset() != 30 || p.HighWatermark() != 30 {
		t.Fatalf("start %d HW %d after reopen", p.LogStartOffset(), p.HighWatermark())
	}
}

// TestTruncateNonReplicated: a partition not in replicated mode keeps HW = DurableEnd through truncation.
func TestTruncateNonReplicated(t *testing.T) {
	s := openStore(t, testOptions(t, true))
	p := mustPartition(t, s, pid)
	for i := range 4 {
		mustAppend(t, p, valueBatch(t, "x", 2, int64(i)), syncAppend)
	}
	if end, err := p.Truncate(3); err != nil || end != 2 {
		t.Fatalf("Truncate(3) = %d %v", end, err)
	}
	if p.HighWatermark() != 2 || p.DurableEnd() != 2 || p.Replicated() || storedHW(t, s, pid) != -1 {
		t.Fatalf("HW %d durable %d", p.HighWatermark(), p.DurableEnd())
	}
	res := mustAppend(t, p, valueBatch(t, "y", 1, 9), AppendOptions{LogAppendTime: -1})
	waitFor(t, 5*time.Second, "HW", func() bool { return p.HighWatermark() == res.LastOffset+1 })
}

// TestTruncateConcurrent truncates while appends and reads run: appends land contiguously (those
// queued after a truncation at its new end), reads only ever see valid batches at rising offsets, and
// the log's bookkeeping matches its batches in the end and after a restart.
func TestTruncateConcurrent(t *testing.T) {
	for _, fsync := range []bool{false, true} {
		t.Run(fmt.Sprintf("fsync=%v", fsync), func(t *testing.T) {
			o := testOptions(t, fsync)
			s := openStore(t, o)
			p := mustPartition(t, s, pid)
			var stop atomic.Bool
			var wg sync.WaitGroup
			errc := make(chan error, 8)
			for w := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; !stop.Load(); i++ {
						opts := epochAppend(int32(i / 20))
						opts.Sync = i%2 == 0
						if _, err := p.Append(context.Background(), valueBatch(t, fmt.Sprintf("w%d-%d", w, i), 1+i%3, int64(i)), opts); err != nil {
							errc <- err
							return
						}
					}
				}()
			}
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !stop.Load() {
						for _, local := range []bool{false, true} {
							off := p.LogStartOffset()
							for range 5 {
								b, err := p.read(nil, off, 4096, local)
								if isErr(err, rerr.ErrOffsetOutOfRange) {
									break // truncated under us
								}
								if err != nil {
									errc <- err
									return
								}
								if len(b) == 0 {
									break
								}
								var bad error
								_ = batch.Split(b, func(_ []byte, h batch.Header) error {
									if h.BaseOffset+int64(h.LastOffsetDelta) < off {
										bad = fmt.Errorf("read at %d returned a batch ending at %d", off, h.LastOffset())
									}
									off = h.NextOffset()
									return nil
								})
								if err := batch.Split(b, func([]byte, batch.Header) error { return nil }); err != nil || bad != nil {
									errc <- errors.Join(err, bad)
									return
								}
							}
						}
					}
				}()
			}
			for i := range 8 {
				waitFor(t, 10*time.Second, "appends", func() bool { return p.LogEndOffset() > int64(16*(i+1)) })
				end, err := p.Truncate(p.LogEndOffset() / 2)
				if err != nil {
					t.Fatal(err)
				}
				if end > p.LogEndOffset() && len(errc) == 0 {
					t.Fatalf("Truncate returned %d above the LEO %d", end, p.LogEndOffset())
				}
			}
			stop.Store(true)
			wg.Wait()
			select {
			case err := <-errc:
				t.Fatal(err)
			default:
			}
			waitFor(t, 5*time.Second, "durable end", func() bool { return p.DurableEnd() == p.LogEndOffset() })
			verify := func(p *Partition) {
				t.Helper()
				all := readLocalAll(t, p, 0)
				next := int64(0)
				for _, g := range decode(t, all) {
					if g.h.BaseOffset != next {
						t.Fatalf("batch at %d, want %d", g.h.BaseOffset, next)
					}
					next = g.h.NextOffset()
				}
				if next != p.LogEndOffset() || int64(len(all)) != p.Size() || p.HighWatermark() != next {
					t.Fatalf("batches end at %d with %d bytes; LEO %d size %d HW %d", next, len(all), p.LogEndOffset(), p.Size(), p.HighWatermark())
				}
				if want := derivedEpochs(t, all); !slices.Equal(p.EpochEntries(), want) {
					t.Fatalf("epoch cache %v, batches say %v", p.EpochEntries(), want)
				}
			}
			verify(p)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, o)
			verify(mustPartition(t, s, pid))
		})
	}
}

// TestTruncateTooBigForOneTransaction truncates more keys than one Badger transaction holds (the
// truncation record path), and finishes a truncation whose record a crash left behind on reopen.
func TestTruncateTooBigForOneTransaction(t *testing.T) {
	o := testOptions(t, false)
	o.MemTableSize = 1 << 20 // a transaction holds ~1,500 entries
	s := openStore(t, o)
	p := mustPartition(t, s, pid)
	var all []byte
	for i := range 2500 {
		all = append(all, valueBatch(t, "x", 1, int64(i))...) // every batch raises the time index
	}
	// One AppendReplica of them all: the writer splits the group into several transactions.
	if _, err := p.AppendReplica(context.Background(), withBases(t, all, 0), AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	records := 0
	testHookTruncRecord = func() { records++ }
	defer func() { testHookTruncRecord = nil }()
	if end, err := p.Truncate(100); err != nil || end != 100 {
		t.Fatalf("Truncate(100) = %d %v", end, err)
	}
	if records != 1 {
		t.Fatal("the truncation fit in one transaction; the test wants it not to")
	}
	if n := countKeys(t, s, partPrefix(kindTime, pid)); n != 100 {
		t.Fatalf("%d time-index keys after the truncation, want 100", n)
	}
	if n := countKeys(t, s, partPrefix(kindTrunc, pid)); n != 0 {
		t.Fatal("truncation record left behind")
	}
	if p.Size() != int64(len(readLocalAll(t, p, 0))) {
		t.Fatal("size")
	}

	// A crash after the record and the state were written, before the deletes.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := badger.Open(o.badgerOptions())
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(txn *badger.Txn) error {
		if err := txn.Set(partPrefix(kindTrunc, pid), encodeTrunc(0, 40)); err != nil {
			return err
		}
		return txn.Set(partPrefix(kindState, pid), encodeState(partState{floor: 40}))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	if p.LogEndOffset() != 40 || len(decode(t, readLocalAll(t, p, 0))) != 40 || countKeys(t, s, partPrefix(kindTime, pid)) != 40 ||
		countKeys(t, s, partPrefix(kindTrunc, pid)) != 0 {
		t.Fatalf("after finishing the truncation: LEO %d", p.LogEndOffset())
	}
}

// withBases returns a copy of the concatenated batches b renumbered from base on.
func withBases(t testing.TB, b []byte, base int64) []byte {
	out := append([]byte(nil), b...)
	rest := out
	for len(rest) > 0 {
		h, err := batch.ParseHeader(rest)
		if err != nil {
			t.Fatal(err)
		}
		batch.SetBaseOffset(rest, base)
		base += int64(h.LastOffsetDelta) + 1
		rest = rest[h.Size():]
	}
	return out
}

func TestEpochCache(t *testing.T) {
	o := testOptions(t, true)
	s := openStore(t, o)
	p := mustPartition(t, s, pid)
	if p.LatestEpoch() != -1 || len(p.EpochEntries()) != 0 {
		t.Fatal("empty log has epochs")
	}
	if end, e := p.EndOffsetForEpoch(0); end != -1 || e != -1 {
		t.Fatalf("empty log: EndOffsetForEpoch(0) = %d %d", end, e)
	}
	// Epochs 0,0,2,2,5 over batches of 2 records: [0,2) [2,4) [4,6) [6,8) [8,10).
	for i, e := range []int32{0, 0, 2, 2, 5} {
		mustAppend(t, p, valueBatch(t, fmt.Sprint(i), 2, int64(i)), epochAppend(e))
	}
	want := []EpochEntry{{0, 0}, {2, 4}, {5, 8}}
	checkEpochs := func(what string, want []EpochEntry) {
		t.Helper()
		if !slices.Equal(p.EpochEntries(), want) || p.LatestEpoch() != want[len(want)-1].Epoch {
			t.Fatalf("%s: epochs %v latest %d, want %v", what, p.EpochEntries(), p.LatestEpoch(), want)
		}
		if n := countKeys(t, s, partPrefix(kindEpoch, pid)); n != len(want) {
			t.Fatalf("%s: %d stored entries, want %d", what, n, len(want))
		}
	}
	checkEpochs("appended", want)
	for _, c := range []struct {
		epoch, found int32
		end          int64
	}{{-1, -1, -1}, {0, 0, 4}, {1, 0, 4}, {2, 2, 8}, {3, 2, 8}, {4, 2, 8}, {5, 5, 10}, {6, 5, 10}} {
		if end, found := p.EndOffsetForEpoch(c.epoch); end != c.end || found != c.found {
			t.Fatalf("EndOffsetForEpoch(%d) = (%d, %d), want (%d, %d)", c.epoch, end, found, c.end, c.found)
		}
	}
	// Persisted with the batches, recovered without reading them.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	checkEpochs("reopened", want)
	if end, found := p.EndOffsetForEpoch(4); end != 8 || found != 2 {
		t.Fatalf("after reopen: EndOffsetForEpoch(4) = %d %d", end, found)
	}
	// Lower epochs than the latest add nothing; a newer one does.
	mustAppend(t, p, valueBatch(t, "low", 1, 9), epochAppend(3))
	mustAppend(t, p, valueBatch(t, "new", 1, 9), epochAppend(7))
	want = append(want, EpochEntry{7, 11})
	checkEpochs("more", want)

	// Retention: deleting [0,4) keeps the entry covering the new log start, moved up to it.
	batchBytes := int64(len(valueBatch(t, "0", 2, 0)))
	if n, err := p.ApplyRetention(time.Now(), -1, p.Size()-2*batchBytes); err != nil || n != 2 || p.LogStartOffset() != 4 {
		t.Fatalf("retention: %d %v start %d", n, err, p.LogStartOffset())
	}
	checkEpochs("retention to 4", []EpochEntry{{2, 4}, {5, 8}, {7, 11}})
	if n, err := p.ApplyRetention(time.Now(), -1, p.Size()-batchBytes); err != nil || n != 1 || p.LogStartOffset() != 6 {
		t.Fatalf("retention: %d %v start %d", n, err, p.LogStartOffset())
	}
	want = []EpochEntry{{2, 6}, {5, 8}, {7, 11}}
	checkEpochs("retention to 6", want)
	if end, found := p.EndOffsetForEpoch(1); end != -1 || found != -1 {
		t.Fatalf("below the first entry: (%d, %d)", end, found)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	checkEpochs("reopened after retention", want)
	// A log retention empties keeps its latest entry, at the new log start.
	if _, err := p.ApplyRetention(time.Now(), -1, 0); err != nil || p.LogStartOffset() != 12 {
		t.Fatalf("retention of everything: %v start %d", err, p.LogStartOffset())
	}
	checkEpochs("emptied", []EpochEntry{{7, 12}})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	checkEpochs("emptied, reopened", []EpochEntry{{7, 12}})
}

// TestRecoverEpochsRepairs: recovery prunes entries a crash left below the log start or past the LEO.
func TestRecoverEpochsRepairs(t *testing.T) {
	o := testOptions(t, false)
	s := openStore(t, o)
	p := mustPartition(t, s, pid)
	for i, e := range []int32{1, 2, 3} {
		mustAppend(t, p, valueBatch(t, fmt.Sprint(i), 2, int64(i)), epochAppend(e))
	}
	if _, err := p.ApplyRetention(time.Now(), -1, p.Size()-int64(len(valueBatch(t, "0", 2, 0)))); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := badger.Open(o.badgerOptions())
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(txn *badger.Txn) error {
		for _, e := range []EpochEntry{{0, 0}, {1, 0}, {9, 6}} { // a retention and a write group cut short
			if err := txn.Set(epochKey(partPrefix(kindEpoch, pid), e.Epoch), encodeOffset(e.StartOffset)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	want := []EpochEntry{{2, 2}, {3, 4}}
	if !slices.Equal(p.EpochEntries(), want) || countKeys(t, s, partPrefix(kindEpoch, pid)) != 2 {
		t.Fatalf("recovered epochs %v, want %v", p.EpochEntries(), want)
	}
	if res := mustAppend(t, p, valueBatch(t, "9", 1, 9), epochAppend(9)); res.BaseOffset != 6 {
		t.Fatal(res)
	}
	if !slices.Equal(p.EpochEntries(), append(want, EpochEntry{9, 6})) {
		t.Fatalf("epochs %v", p.EpochEntries())
	}

	// A corrupt entry is refused, strictly.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = badger.Open(o.badgerOptions())
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(txn *badger.Txn) error {
		return txn.Set(epochKey(partPrefix(kindEpoch, pid), 10), []byte{1, 2, 3})
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	if _, err := s.Partition(pid); err == nil {
		t.Fatal("a corrupt leader-epoch entry was accepted")
	}
}

func TestDeletePartitionDropsReplicationKeys(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	p := mustPartition(t, s, pid)
	p.SetReplicated()
	mustAppend(t, p, valueBatch(t, "x", 2, 1), epochAppend(3))
	if err := p.SetHighWatermark(2); err != nil {
		t.Fatal(err)
	}
	// A partition with nothing but an HW checkpoint is stored too.
	other := PartitionID{TopicNum: 9, Partition: 2}
	mustPartition(t, s, other).SetReplicated()
	if got, err := s.StoredPartitions(); err != nil || !slices.Equal(got, []PartitionID{pid, other}) {
		t.Fatalf("stored partitions %v %v", got, err)
	}
	waitFor(t, 5*time.Second, "HW checkpoint", func() bool { return storedHW(t, s, pid) == 2 })
	for _, id := range []PartitionID{pid, other} {
		if err := s.DeletePartition(id); err != nil {
			t.Fatal(err)
		}
		for _, kind := range partKinds {
			if n := countKeys(t, s, partPrefix(kind, id)); n != 0 {
				t.Fatalf("%d keys of kind %c left", n, kind)
			}
		}
	}
	if got, _ := s.StoredPartitions(); len(got) != 0 {
		t.Fatalf("stored partitions after deleting: %v", got)
	}
	if _, err := p.Truncate(0); !isErr(err, ErrPartitionDeleted) {
		t.Fatalf("truncate after delete: %v", err)
	}
	if err := p.SetHighWatermark(3); !isErr(err, ErrPartitionDeleted) {
		t.Fatalf("SetHighWatermark after delete: %v", err)
	}
	if _, err := p.AppendReplica(context.Background(), valueBatch(t, "y", 1, 1), AppendOptions{}); !isErr(err, ErrPartitionDeleted) {
		t.Fatalf("AppendReplica after delete: %v", err)
	}
	p = mustPartition(t, s, pid)
	if p.Replicated() || p.LatestEpoch() != -1 || p.LogEndOffset() != 0 {
		t.Fatal("a recreated partition inherited state")
	}
}

// TestTruncationOffset walks the follower's side of the leader-epoch exchange (KIP-101, KIP-279) over
// two logs that share epoch 0 only: the leader wrote epochs 1 and 3, the follower 2 and 5 (each led or
// followed while the other was away). Asking about its latest epoch (5) gets the leader's epoch 3,
// which the follower lacks; stopping there with min(leader's end, LEO), as a single round does, would
// keep the follower's epoch-2 and -5 batches at offsets where the leader has epoch 1's. The exchange
// must go on until the follower is cut back to what both wrote under epoch 0.
func TestTruncationOffset(t *testing.T) {
	s := openStore(t, testOptions(t, true))
	leader := mustPartition(t, s, PartitionID{TopicNum: 7, Partition: 0})
	follower := mustPartition(t, s, PartitionID{TopicNum: 7, Partition: 1})
	// Batches of 2 records. Leader: epoch 0 [0,4), 1 [4,10), 3 [10,12). Follower: 0 [0,4), 2 [4,8), 5 [8,10).
	for i, e := range []int32{0, 0, 1, 1, 1, 3} {
		mustAppend(t, leader, valueBatch(t, fmt.Sprint("l", i), 2, int64(i)), epochAppend(e))
	}
	for i, e := range []int32{0, 0, 2, 2, 5} {
		tag := fmt.Sprint("f", i)
		if i < 2 {
			tag = fmt.Sprint("l", i) // the shared epoch-0 prefix
		}
		mustAppend(t, follower, valueBatch(t, tag, 2, int64(i)), epochAppend(e))
	}

	for _, c := range []struct {
		leaderEpoch int32
		leaderEnd   int64
		off         int64
		complete    bool
	}{
		{-1, -1, 0, true}, // the leader has no epoch at or below ours: nothing in common
		{5, 9, 9, true},   // same epoch, the leader's ends first
		{5, 12, 10, true}, // same epoch, ours ends first
		{2, 6, 6, true},   // an earlier epoch of ours, answered as the leader's largest at or below 5
		{3, 12, 8, false}, // epoch 3 is not ours: back to the end of our epoch 2, ask again
		{1, 10, 4, false}, // epoch 1 is not ours: back to the end of our epoch 0, ask again
		{0, 4, 4, true},   // the shared epoch
	} {
		off, complete := follower.TruncationOffset(c.leaderEpoch, c.leaderEnd)
		if off != c.off || complete != c.complete {
			t.Errorf("TruncationOffset(%d, %d) = (%d, %v), want (%d, %v)", c.leaderEpoch, c.leaderEnd, off, complete, c.off, c.complete)
		}
	}

	// The whole exchange, as the broker's fetcher runs it.
	rounds := 0
	for complete := false; !complete; rounds++ {
		if rounds == 5 {
			t.Fatal("the exchange did not end")
		}
		end, epoch := leader.EndOffsetForEpoch(follower.LatestEpoch())
		var off int64
		off, complete = follower.TruncationOffset(epoch, end)
		if _, err := follower.Truncate(off); err != nil {
			t.Fatal(err)
		}
	}
	if rounds != 3 || follower.LogEndOffset() != 4 {
		t.Fatalf("after %d rounds the follower ends at %d, want 3 rounds and 4", rounds, follower.LogEndOffset())
	}
	if got, want := readLocalAll(t, follower, 0), readLocalAll(t, leader, 0); !bytes.HasPrefix(want, got) || len(got) == 0 {
		t.Fatalf("the follower's log (%d bytes) is not a prefix of the leader's (%d bytes)", len(got), len(want))
	}

	empty := mustPartition(t, s, PartitionID{TopicNum: 7, Partition: 2})
	if off, complete := empty.TruncationOffset(3, 12); off != 0 || !complete {
		t.Fatalf("empty log: TruncationOffset = (%d, %v), want (0, true)", off, complete)
	}
}

// TestFenceLeaderAppends: once a replica follows epoch 5, an append of its own ended leadership (epoch
// 4) is refused NOT_LEADER_OR_FOLLOWER and stores nothing; appends under epoch 5 and later, and the
// follower's own AppendReplica, go on. Once it leads at 6, a truncation decided while following 5 is
// refused.
func TestFenceLeaderAppends(t *testing.T) {
	s := openStore(t, testOptions(t, true))
	p := mustPartition(t, s, pid)
	mustAppend(t, p, valueBatch(t, "a", 2, 1), epochAppend(4))
	p.FenceLeaderAppends(5)
	p.FenceLeaderAppends(3) // lowering does nothing
	_, err := p.Append(context.Background(), valueBatch(t, "b", 2, 2), epochAppend(4))
	if !errors.Is(err, rerr.ErrNotLeaderOrFollower) {
		t.Fatalf("append under epoch 4 after the fence at 5: %v, want NOT_LEADER_OR_FOLLOWER", err)
	}
	done := make(chan error, 1)
	p.AppendAsync(valueBatch(t, "c", 2, 3), epochAppend(4), func(_ AppendResult, err error) { done <- err })
	if err := <-done; !errors.Is(err, rerr.ErrNotLeaderOrFollower) {
		t.Fatalf("AppendAsync under epoch 4 after the fence at 5: %v", err)
	}
	if p.LogEndOffset() != 2 || !slices.Equal(p.EpochEntries(), []EpochEntry{{4, 0}}) {
		t.Fatalf("refused appends changed the log: LEO %d, epochs %v", p.LogEndOffset(), p.EpochEntries())
	}
	rb := valueBatch(t, "r", 2, 2) // as the new leader stored it: offsets 2-3, epoch 5
	batch.SetBaseOffset(rb, 2)
	batch.SetPartitionLeaderEpoch(rb, 5)
	if _, err := p.AppendReplica(context.Background(), rb, AppendOptions{Sync: true}); err != nil {
		t.Fatalf("AppendReplica after the fence: %v", err)
	}
	p.BeginLeadership(6)
	if res := mustAppend(t, p, valueBatch(t, "d", 2, 4), epochAppend(6)); res.BaseOffset != 4 {
		t.Fatalf("append under epoch 6 at %d, want 4", res.BaseOffset)
	}

	// A cut decided while following epoch 5 is refused once the replica leads at 6; one decided at
	// 6 runs; one with nothing at or above it returns at once.
	if _, err := p.TruncateAsFollower(2, 5); !errors.Is(err, rerr.ErrNotLeaderOrFollower) || p.LogEndOffset() != 6 {
		t.Fatalf("truncation for epoch 5 after leading at 6: %v, LEO %d; want NOT_LEADER_OR_FOLLOWER and 6", err, p.LogEndOffset())
	}
	if end, err := p.TruncateAsFollower(4, 6); err != nil || end != 4 || p.LogEndOffset() != 4 {
		t.Fatalf("truncation for epoch 6: end %d, %v, LEO %d", end, err, p.LogEndOffset())
	}
	if end, err := p.TruncateAsFollower(4, 5); err != nil || end != 4 {
		t.Fatalf("truncation at the end: %d %v", end, err)
	}
}
