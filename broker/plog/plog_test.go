package plog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/runnel-io/runnel/api/rerr"
	"github.com/runnel-io/runnel/client/batch"
)

var pid = PartitionID{TopicNum: 7, Partition: 0}

func TestPartitionIDString(t *testing.T) {
	if got := (PartitionID{TopicNum: 12, Partition: 3}).String(); got != "12-3" {
		t.Fatalf("String() = %q", got)
	}
}

func TestAppendReadRoundTrip(t *testing.T) {
	for _, fsync := range []bool{false, true} {
		t.Run(fmt.Sprintf("fsync=%v", fsync), func(t *testing.T) {
			s := openStore(t, testOptions(t, fsync))
			p := mustPartition(t, s, pid)
			if p2 := mustPartition(t, s, pid); p2 != p {
				t.Fatal("Partition twice returned different logs")
			}

			r1 := mustAppend(t, p, valueBatch(t, "a", 3, 1000), syncAppend)
			two := append(valueBatch(t, "b", 2, 1001), valueBatch(t, "c", 4, 1002)...)
			r2 := mustAppend(t, p, two, AppendOptions{Sync: true, LogAppendTime: -1, LeaderEpoch: 5})
			if r1.BaseOffset != 0 || r1.LastOffset != 2 || r2.BaseOffset != 3 || r2.LastOffset != 8 {
				t.Fatalf("offsets: %+v %+v", r1, r2)
			}
			if p.LogEndOffset() != 9 || p.HighWatermark() != 9 || p.LogStartOffset() != 0 {
				t.Fatalf("LEO %d HW %d start %d", p.LogEndOffset(), p.HighWatermark(), p.LogStartOffset())
			}
			wantSize := int64(len(valueBatch(t, "a", 3, 1000)) + len(two))
			if p.Size() != wantSize {
				t.Fatalf("Size %d, want %d", p.Size(), wantSize)
			}
			b, err := p.Read(nil, 0, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			got := decode(t, b)
			if len(got) != 3 {
				t.Fatalf("%d batches", len(got))
			}
			wantBase := []int64{0, 3, 5}
			wantEpoch := []int32{0, 5, 5}
			wantTag := []string{"a", "b", "c"}
			for i, g := range got {
				if g.h.BaseOffset != wantBase[i] || g.h.PartitionLeaderEpoch != wantEpoch[i] {
					t.Errorf("batch %d: base %d epoch %d", i, g.h.BaseOffset, g.h.PartitionLeaderEpoch)
				}
				for j, v := range g.values {
					if want := fmt.Sprintf("%s#%d", wantTag[i], j); string(v) != want {
						t.Errorf("batch %d record %d = %q, want %q", i, j, v, want)
					}
				}
			}
			// Read appends to dst.
			prefix := []byte("keep")
			b, err = p.Read(prefix, 3, 1<<20)
			if err != nil || !bytes.HasPrefix(b, []byte("keep")) || len(decode(t, b[4:])) != 2 {
				t.Fatalf("read into dst: %v", err)
			}
			// At the HW: nothing, no error.
			b, err = p.Read(nil, 9, 1<<20)
			if err != nil || len(b) != 0 {
				t.Fatalf("read at HW: %d bytes, %v", len(b), err)
			}
		})
	}
}

func TestLogAppendTime(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	p := mustPartition(t, s, pid)
	mustAppend(t, p, valueBatch(t, "x", 2, 10), AppendOptions{LogAppendTime: 5000})
	got := decode(t, must(p.Read(nil, 0, 1<<20)))
	h := got[0].h
	if h.MaxTimestamp != 5000 || h.Attributes&batch.AttrLogAppendTime == 0 {
		t.Fatalf("header %+v", h)
	}
	off, ts, err := p.OffsetForTimestamp(4000)
	if err != nil || off != 0 || ts != 5000 {
		t.Fatalf("OffsetForTimestamp = %d, %d, %v", off, ts, err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestReadFromMidBatch(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	p := mustPartition(t, s, pid)
	for _, tag := range []string{"a", "b", "c"} {
		mustAppend(t, p, valueBatch(t, tag, 5, 1), syncAppend)
	}
	for off, wantBase := range map[int64]int64{0: 0, 4: 0, 5: 5, 7: 5, 9: 5, 10: 10, 14: 10} {
		got := decode(t, must(p.Read(nil, off, 1)))
		if len(got) != 1 || got[0].h.BaseOffset != wantBase {
			t.Errorf("Read(%d) gave %d batches, first at %d; want the batch at %d", off, len(got), got[0].h.BaseOffset, wantBase)
		}
	}
}

func TestReadMaxBytes(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	p := mustPartition(t, s, pid)
	const size = 1000
	for range 5 {
		mustAppend(t, p, sizedBatch(t, size, 1), syncAppend)
	}
	for _, tc := range []struct{ maxBytes, want int }{
		{0, 1}, {1, 1}, {size - 1, 1}, {size, 1}, {2*size - 1, 1}, {2 * size, 2}, {2*size + size/2, 2}, {5 * size, 5}, {1 << 30, 5},
	} {
		b := must(p.Read(nil, 0, tc.maxBytes))
		if got := len(decode(t, b)); got != tc.want {
			t.Errorf("maxBytes %d: %d batches, want %d", tc.maxBytes, got, tc.want)
		}
		if tc.want > 1 && len(b) > tc.maxBytes {
			t.Errorf("maxBytes %d: %d bytes", tc.maxBytes, len(b))
		}
	}
	// The first batch even when larger than maxBytes (KIP-74).
	big := sizedBatch(t, 100_000, 1)
	res := mustAppend(t, p, big, syncAppend)
	if b := must(p.Read(nil, res.BaseOffset, 10)); len(b) != len(big) {
		t.Fatalf("oversized first batch: %d bytes", len(b))
	}
}

func TestReadOutOfRange(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	p := mustPartition(t, s, pid)
	for range 4 {
		mustAppend(t, p, valueBatch(t, "x", 2, 1), syncAppend)
	}
	for _, off := range []int64{-1, 9, 100} {
		dst := []byte("dst")
		b, err := p.Read(dst, off, 1<<20)
		if !isErr(err, rerr.ErrOffsetOutOfRange) {
			t.Errorf("Read(%d): %v, want OFFSET_OUT_OF_RANGE", off, err)
		}
		if string(b) != "dst" {
			t.Errorf("Read(%d) changed dst", off)
		}
	}
	// Below the log start, after retention deleted the first two batches.
	if n, err := p.ApplyRetention(time.Now(), -1, int64(p.Size()/2)); err != nil || n != 2 {
		t.Fatalf("retention: %d, %v", n, err)
	}
	if p.LogStartOffset() != 4 {
		t.Fatalf("log start %d", p.LogStartOffset())
	}
	for _, off := range []int64{0, 3} {
		if _, err := p.Read(nil, off, 1<<20); !isErr(err, rerr.ErrOffsetOutOfRange) {
			t.Errorf("Read(%d) below log start: %v", off, err)
		}
	}
	if got := decode(t, must(p.Read(nil, 4, 1<<20))); len(got) != 2 || got[0].h.BaseOffset != 4 {
		t.Fatalf("read at log start: %d batches", len(got))
	}
}

func TestAppendErrors(t *testing.T) {
	o := testOptions(t, false)
	o.ValueLogFileSize = 1 << 20
	s := openStore(t, o)
	p := mustPartition(t, s, pid)
	ctx := context.Background()
	if _, err := p.Append(ctx, nil, syncAppend); !isErr(err, rerr.ErrCorruptMessage) {
		t.Errorf("empty append: %v", err)
	}
	b := valueBatch(t, "x", 2, 1)
	if _, err := p.Append(ctx, b[:len(b)-1], syncAppend); !isErr(err, rerr.ErrCorruptMessage) {
		t.Errorf("truncated batch: %v", err)
	}
	if _, err := p.Append(ctx, sizedBatch(t, 1<<20+100, 1), syncAppend); !isErr(err, rerr.ErrMessageTooLarge) {
		t.Errorf("batch above the value-log file size: %v", err)
	}
	if p.LogEndOffset() != 0 {
		t.Fatalf("failed appends took offsets: LEO %d", p.LogEndOffset())
	}
	if _, err := s.Partition(PartitionID{TopicNum: 1, Partition: -1}); !isErr(err, rerr.ErrUnknownTopicOrPartition) {
		t.Errorf("negative partition: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := p.Append(cctx, valueBatch(t, "x", 1, 1), syncAppend); err == nil {
		// A cancelled ctx may still win the race with a fast write; only a hang or a wrong error is wrong.
		t.Log("append with cancelled ctx completed")
	} else if !isErr(err, context.Canceled) {
		t.Errorf("cancelled append: %v", err)
	}
}

func TestConcurrentAppends(t *testing.T) {
	for _, fsync := range []bool{false, true} {
		t.Run(fmt.Sprintf("fsync=%v", fsync), func(t *testing.T) {
			s := openStore(t, testOptions(t, fsync))
			const writers, parts, appends = 8, 3, 40
			ps := make([]*Partition, parts)
			for i := range ps {
				ps[i] = mustPartition(t, s, PartitionID{TopicNum: 1, Partition: int32(i)})
			}
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range appends {
						p := ps[(w+i)%parts]
						n := 1 + (w+i)%3
						b := valueBatch(t, fmt.Sprintf("w%d-%03d", w, i), n, int64(i))
						res, err := p.Append(context.Background(), b, AppendOptions{Sync: i%2 == 0, LogAppendTime: -1})
						if err != nil {
							errs <- err
							return
						}
						if res.LastOffset-res.BaseOffset != int64(n-1) {
							errs <- fmt.Errorf("result %+v for %d records", res, n)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			total := 0
			for _, p := range ps {
				waitFor(t, 5*time.Second, "HW to reach LEO", func() bool { return p.HighWatermark() == p.LogEndOffset() })
				got := readAll(t, p, 0)
				next := int64(0)
				lastSeq := map[string]string{}
				for _, g := range got {
					if g.h.BaseOffset != next {
						t.Fatalf("%s: batch at %d, want %d (offsets not contiguous)", p.ID(), g.h.BaseOffset, next)
					}
					next = g.h.NextOffset()
					tag, _, _ := strings.Cut(string(g.values[0]), "#")
					w, seq, _ := strings.Cut(tag, "-")
					if prev, ok := lastSeq[w]; ok && prev >= seq {
						t.Fatalf("%s: writer %s's append %s stored after %s", p.ID(), w, seq, prev)
					}
					lastSeq[w] = seq
					total++
				}
				if next != p.LogEndOffset() {
					t.Fatalf("%s: batches end at %d, LEO %d", p.ID(), next, p.LogEndOffset())
				}
			}
			if total != writers*appends {
				t.Fatalf("%d batches stored, want %d", total, writers*appends)
			}
		})
	}
}

// TestTailingReader follows the log as a long-polling consumer does, while writers append: every read
// below the HW succeeds, returns contiguous whole batches and nothing at or above the HW.
func TestTailingReader(t *testing.T) {
	for _, fsync := range []bool{false, true} {
		t.Run(fmt.Sprintf("fsync=%v", fsync), func(t *testing.T) {
			s := openStore(t, testOptions(t, fsync))
			p := mustPartition(t, s, pid)
			const writers, appends = 4, 50
			var wg sync.WaitGroup
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range appends {
						if _, err := p.Append(context.Background(), valueBatch(t, "x", 1+i%3, 1), AppendOptions{Sync: w%2 == 0, LogAppendTime: -1}); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			pos, batches := int64(0), 0
			for batches < writers*appends {
				ch := p.Changed()
				hw := p.HighWatermark()
				b, err := p.Read(nil, pos, 300)
				if err != nil {
					t.Fatalf("read at %d (HW %d): %v", pos, hw, err)
				}
				for _, g := range decode(t, b) {
					if g.h.BaseOffset != pos {
						t.Fatalf("batch at %d, want %d", g.h.BaseOffset, pos)
					}
					if g.h.NextOffset() > p.HighWatermark() {
						t.Fatalf("read batch ending at %d above the HW %d", g.h.NextOffset(), p.HighWatermark())
					}
					pos = g.h.NextOffset()
					batches++
				}
				if len(b) == 0 {
					select {
					case <-ch:
					case <-time.After(10 * time.Second):
						t.Fatalf("no change for 10 s at %d", pos)
					}
				}
			}
			<-done
		})
	}
}

func TestHWAndSyncSemantics(t *testing.T) {
	for _, fsync := range []bool{false, true} {
		t.Run(fmt.Sprintf("fsync=%v", fsync), func(t *testing.T) {
			s := openStore(t, testOptions(t, fsync))
			p := mustPartition(t, s, pid)
			// acks=all: the HW covers the append when it returns.
			res := mustAppend(t, p, valueBatch(t, "x", 3, 1), syncAppend)
			if hw := p.HighWatermark(); hw < res.LastOffset+1 {
				t.Fatalf("HW %d after a Sync append ending at %d", hw, res.LastOffset)
			}
			// acks=1: written (LEO) when it returns; the HW follows after the fsync.
			res = mustAppend(t, p, valueBatch(t, "y", 2, 1), AppendOptions{LogAppendTime: -1})
			if leo := p.LogEndOffset(); leo < res.LastOffset+1 {
				t.Fatalf("LEO %d after an append ending at %d", leo, res.LastOffset)
			}
			waitFor(t, 5*time.Second, "HW", func() bool { return p.HighWatermark() == res.LastOffset+1 })
		})
	}
}

func TestOffsetForTimestamp(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	p := mustPartition(t, s, pid)
	if off, ts, err := p.OffsetForTimestamp(0); err != nil || off != -1 || ts != -1 {
		t.Fatalf("empty log: %d %d %v", off, ts, err)
	}
	// Offsets: A 0-2, B 3-4, C 5-6 (older than B: no index entry), D 7.
	mustAppend(t, p, makeBatch(t, batch.CompressionNone, rec{ts: 100}, rec{ts: 105}, rec{ts: 110}), syncAppend)
	mustAppend(t, p, makeBatch(t, batch.CompressionGzip, rec{ts: 120}, rec{ts: 115}), syncAppend)
	mustAppend(t, p, makeBatch(t, batch.CompressionZstd, rec{ts: 90}, rec{ts: 95}), syncAppend)
	mustAppend(t, p, makeBatch(t, batch.CompressionLZ4, rec{ts: 200}), syncAppend)
	for _, tc := range []struct{ ts, off, recTs int64 }{
		{-5, 0, 100}, {50, 0, 100}, {100, 0, 100}, {101, 1, 105}, {110, 2, 110}, {111, 3, 120},
		{116, 3, 120}, {120, 3, 120}, {121, 7, 200}, {200, 7, 200}, {201, -1, -1},
	} {
		off, ts, err := p.OffsetForTimestamp(tc.ts)
		if err != nil || off != tc.off || ts != tc.recTs {
			t.Errorf("OffsetForTimestamp(%d) = %d, %d, %v; want %d, %d", tc.ts, off, ts, err, tc.off, tc.recTs)
		}
	}
}

func TestOffsetForTimestampCodecs(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	for i, codec := range []batch.Compression{batch.CompressionNone, batch.CompressionGzip, batch.CompressionSnappy,
		codecXerialSnappy, batch.CompressionLZ4, batch.CompressionZstd} {
		p := mustPartition(t, s, PartitionID{TopicNum: 2, Partition: int32(i)})
		mustAppend(t, p, valueBatch(t, "pad", 2, 1), syncAppend)
		recs := make([]rec, 50)
		for j := range recs {
			recs[j] = rec{ts: int64(1000 + 10*j), key: []byte("k"), value: bytes.Repeat([]byte{'v'}, j*7)}
		}
		mustAppend(t, p, makeBatch(t, codec, recs...), syncAppend)
		off, ts, err := p.OffsetForTimestamp(1235)
		if err != nil || off != 2+24 || ts != 1240 {
			t.Errorf("codec %d: OffsetForTimestamp = %d, %d, %v; want 26, 1240", codec, off, ts, err)
		}
	}
}

func TestChangedFires(t *testing.T) {
	s := openStore(t, testOptions(t, true))
	p := mustPartition(t, s, pid)
	ch := p.Changed()
	if closedWithin(ch, 0) {
		t.Fatal("Changed closed before any change")
	}
	mustAppend(t, p, valueBatch(t, "x", 1, 1), syncAppend)
	if !closedWithin(ch, 5*time.Second) {
		t.Fatal("Changed not closed by an append")
	}
	mustAppend(t, p, valueBatch(t, "y", 1, 1), syncAppend)
	ch = p.Changed()
	if n, err := p.ApplyRetention(time.Now(), -1, 0); err != nil || n != 2 {
		t.Fatalf("retention: %d %v", n, err)
	}
	if !closedWithin(ch, 5*time.Second) {
		t.Fatal("Changed not closed by retention")
	}
	ch = p.Changed()
	if err := s.DeletePartition(pid); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(ch, 5*time.Second) || !closedWithin(p.Changed(), 0) {
		t.Fatal("Changed not closed by delete")
	}
	if _, err := p.Append(context.Background(), valueBatch(t, "z", 1, 1), syncAppend); !isErr(err, ErrPartitionDeleted) {
		t.Errorf("append after delete: %v", err)
	}
	if _, err := p.Read(nil, 0, 100); !isErr(err, ErrPartitionDeleted) {
		t.Errorf("read after delete: %v", err)
	}
	if _, err := p.ApplyRetention(time.Now(), 0, 0); !isErr(err, ErrPartitionDeleted) {
		t.Errorf("retention after delete: %v", err)
	}
}

func TestDeletePartition(t *testing.T) {
	o := testOptions(t, true)
	s := openStore(t, o)
	other := mustPartition(t, s, PartitionID{TopicNum: 7, Partition: 1})
	mustAppend(t, other, valueBatch(t, "other", 2, 1), syncAppend)
	p := mustPartition(t, s, pid)
	for range 5 {
		mustAppend(t, p, valueBatch(t, "x", 3, 50), syncAppend)
	}
	if _, err := p.ApplyRetention(time.Now(), -1, p.Size()/2); err != nil { // writes the state key too
		t.Fatal(err)
	}
	if err := s.DeletePartition(pid); err != nil {
		t.Fatal(err)
	}
	if err := s.DeletePartition(PartitionID{TopicNum: 99, Partition: 0}); err != nil {
		t.Fatalf("deleting a partition without data: %v", err)
	}
	check := func(s *Store) {
		t.Helper()
		q := mustPartition(t, s, pid)
		if q == p {
			t.Fatal("Partition after delete returned the deleted log")
		}
		if q.LogStartOffset() != 0 || q.LogEndOffset() != 0 || q.HighWatermark() != 0 || q.Size() != 0 {
			t.Fatalf("recreated log: start %d LEO %d HW %d size %d", q.LogStartOffset(), q.LogEndOffset(), q.HighWatermark(), q.Size())
		}
		if b, err := q.Read(nil, 0, 100); err != nil || len(b) != 0 {
			t.Fatalf("read of recreated log: %d bytes %v", len(b), err)
		}
		if off, _, _ := q.OffsetForTimestamp(0); off != -1 {
			t.Fatalf("time index survived delete: %d", off)
		}
		o := mustPartition(t, s, PartitionID{TopicNum: 7, Partition: 1})
		if got := readAll(t, o, 0); len(got) != 1 || string(got[0].values[1]) != "other#1" {
			t.Fatal("neighbour partition damaged")
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, o)
	check(s2)
	q := mustPartition(t, s2, pid)
	if res := mustAppend(t, q, valueBatch(t, "new", 1, 1), syncAppend); res.BaseOffset != 0 {
		t.Fatalf("first append after delete at %d", res.BaseOffset)
	}
}

func TestDeleteDuringAppends(t *testing.T) {
	s := openStore(t, testOptions(t, true))
	p := mustPartition(t, s, pid)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				_, err := p.Append(ctx, valueBatch(t, "x", 2, 1), syncAppend)
				if err != nil {
					if !isErr(err, ErrPartitionDeleted) {
						errs <- err
					}
					return
				}
			}
		}()
	}
	waitFor(t, 5*time.Second, "some appends", func() bool { return p.HighWatermark() > 20 })
	if err := s.DeletePartition(pid); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("append racing a delete: %v", err)
	}
	q := mustPartition(t, s, pid)
	if q.LogEndOffset() != 0 || q.Size() != 0 {
		t.Fatalf("after delete: LEO %d size %d (an append landed after the drop)", q.LogEndOffset(), q.Size())
	}
}

func TestCloseFailsPendingAppends(t *testing.T) {
	o := testOptions(t, true)
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	p := mustPartition(t, s, pid)
	type ack struct{ base, last int64 }
	var acksMu sync.Mutex
	var acks []ack
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				res, err := p.Append(context.Background(), valueBatch(t, fmt.Sprintf("w%d-%d", w, i), 1, 1), syncAppend)
				if err != nil {
					if !isErr(err, ErrClosed) || !isErr(err, rerr.ErrStorage) {
						errs <- err
					}
					return
				}
				acksMu.Lock()
				acks = append(acks, ack{res.BaseOffset, res.LastOffset})
				acksMu.Unlock()
			}
		}()
	}
	waitFor(t, 5*time.Second, "some appends", func() bool { return p.HighWatermark() > 50 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait() // every append returned: none hangs on a closed store
	close(errs)
	for err := range errs {
		t.Fatalf("append during close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := p.Read(nil, 0, 1); !isErr(err, ErrClosed) {
		t.Errorf("read after close: %v", err)
	}
	if _, err := s.Partition(pid); !isErr(err, ErrClosed) {
		t.Errorf("partition after close: %v", err)
	}
	s2 := openStore(t, o)
	q := mustPartition(t, s2, pid)
	for _, a := range acks {
		got := decode(t, must(q.Read(nil, a.base, 1)))
		if got[0].h.BaseOffset != a.base || got[0].h.LastOffset() != a.last {
			t.Fatalf("acknowledged batch %d-%d read back as %d-%d", a.base, a.last, got[0].h.BaseOffset, got[0].h.LastOffset())
		}
	}
}

func TestRestartRecovery(t *testing.T) {
	o := testOptions(t, true)
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	p := mustPartition(t, s, pid)
	// Sizes around the varint boundaries of Badger's entry header (128, 16 KiB, 2 MiB).
	for _, size := range []int{100, 127, 128, 129, 200, 16383, 16384, 16385, 40000, 2<<20 + 5} {
		mustAppend(t, p, sizedBatch(t, size, int64(size)), syncAppend)
	}
	mustAppend(t, p, makeBatch(t, batch.CompressionNone, rec{ts: 50}, rec{ts: 60}), syncAppend) // no index entry
	wantLEO, wantSize := p.LogEndOffset(), p.Size()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	if p.LogEndOffset() != wantLEO || p.HighWatermark() != wantLEO || p.LogStartOffset() != 0 {
		t.Fatalf("recovered LEO %d HW %d start %d, want LEO %d", p.LogEndOffset(), p.HighWatermark(), p.LogStartOffset(), wantLEO)
	}
	if p.Size() != wantSize {
		t.Fatalf("recovered size %d, want %d", p.Size(), wantSize)
	}
	if got := readAll(t, p, 0); len(got) != 11 {
		t.Fatalf("%d batches after restart", len(got))
	}
	// The running max timestamp came back: a batch below it gets no index entry, so a search for 70
	// still lands on the batch with timestamp 100 (offset 0).
	mustAppend(t, p, makeBatch(t, batch.CompressionNone, rec{ts: 70}), syncAppend)
	if off, ts, err := p.OffsetForTimestamp(70); err != nil || off != 0 || ts != 100 {
		t.Fatalf("OffsetForTimestamp(70) = %d %d %v", off, ts, err)
	}
	if res := mustAppend(t, p, valueBatch(t, "next", 1, 1), syncAppend); res.BaseOffset != wantLEO+1 {
		t.Fatalf("append after restart at %d, want %d", res.BaseOffset, wantLEO+1)
	}
}

func TestRetentionByTime(t *testing.T) {
	o := testOptions(t, true)
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	p := mustPartition(t, s, pid)
	now := time.UnixMilli(1_000_000)
	// Batch timestamps (ms before now): 900, 800, 500 (older than the running max), 700, 100.
	for _, age := range []int64{900, 800, 500, 700, 100} {
		mustAppend(t, p, valueBatch(t, "x", 2, now.UnixMilli()-age), syncAppend)
	}
	sizeBefore := p.Size()
	ch := p.Changed()
	// Older than 750 ms: the first two; the third (500) is younger, so retention stops there.
	n, err := p.ApplyRetention(now, 750, -1)
	if err != nil || n != 2 {
		t.Fatalf("retention: %d %v", n, err)
	}
	if p.LogStartOffset() != 4 || !closedWithin(ch, time.Second) {
		t.Fatalf("log start %d", p.LogStartOffset())
	}
	if p.Size() != sizeBefore*3/5 {
		t.Fatalf("size %d, want %d", p.Size(), sizeBefore*3/5)
	}
	// Nothing more expires at the same time.
	if n, err := p.ApplyRetention(now, 750, -1); err != nil || n != 0 {
		t.Fatalf("second retention: %d %v", n, err)
	}
	// Older than 650: the batch aged 700 (offsets 6-7) is, but it sits behind the younger one aged 500
	// (offsets 4-5), which raised the running max: it waits, as a Kafka segment does.
	if n, err := p.ApplyRetention(now, 650, -1); err != nil || n != 0 {
		t.Fatalf("third retention: %d %v", n, err)
	}
	// Older than 400: both go.
	if n, err := p.ApplyRetention(now, 400, -1); err != nil || n != 2 {
		t.Fatalf("fourth retention: %d %v", n, err)
	}
	if _, err := p.Read(nil, 0, 100); !isErr(err, rerr.ErrOffsetOutOfRange) {
		t.Fatalf("deleted data readable: %v", err)
	}
	wantStart, wantSize := p.LogStartOffset(), p.Size()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	if p.LogStartOffset() != wantStart || p.Size() != wantSize || p.LogEndOffset() != 10 {
		t.Fatalf("after restart: start %d size %d LEO %d; want start %d size %d LEO 10", p.LogStartOffset(), p.Size(), p.LogEndOffset(), wantStart, wantSize)
	}
	if got := readAll(t, p, wantStart); len(got) != 1 || got[0].h.BaseOffset != 8 {
		t.Fatalf("retained batches: %d", len(got))
	}
	// Everything expires: the log empties, keeps its offsets, and the next append continues them.
	if n, err := p.ApplyRetention(now.Add(time.Hour), 1000, -1); err != nil || n != 1 {
		t.Fatalf("retention of all: %d %v", n, err)
	}
	if p.LogStartOffset() != 10 || p.Size() != 0 {
		t.Fatalf("emptied: start %d size %d", p.LogStartOffset(), p.Size())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	if p.LogStartOffset() != 10 || p.LogEndOffset() != 10 || p.Size() != 0 {
		t.Fatalf("emptied log after restart: start %d LEO %d size %d", p.LogStartOffset(), p.LogEndOffset(), p.Size())
	}
	if res := mustAppend(t, p, valueBatch(t, "y", 1, now.UnixMilli()), syncAppend); res.BaseOffset != 10 || res.LogStartOffset != 10 {
		t.Fatalf("append to emptied log: %+v", res)
	}
}

func TestRetentionByBytes(t *testing.T) {
	o := testOptions(t, false)
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	p := mustPartition(t, s, pid)
	const size = 2000
	for i := range 10 {
		mustAppend(t, p, sizedBatch(t, size, int64(1000+i)), syncAppend)
	}
	n, err := p.ApplyRetention(time.Now(), -1, 3*size+size/2)
	if err != nil || n != 7 {
		t.Fatalf("retention: %d %v", n, err)
	}
	if p.Size() != 3*size || p.LogStartOffset() != 7 {
		t.Fatalf("size %d start %d", p.Size(), p.LogStartOffset())
	}
	// The batch that set the time index's running max is gone; the index still finds the retained ones.
	if off, ts, err := p.OffsetForTimestamp(0); err != nil || off != 7 || ts != 1007 {
		t.Fatalf("OffsetForTimestamp after retention: %d %d %v", off, ts, err)
	}
	if n, err := p.ApplyRetention(time.Now(), -1, 3*size); err != nil || n != 0 {
		t.Fatalf("at the limit: %d %v", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	if p.Size() != 3*size || p.LogStartOffset() != 7 || p.LogEndOffset() != 10 {
		t.Fatalf("after restart: size %d start %d LEO %d", p.Size(), p.LogStartOffset(), p.LogEndOffset())
	}
	if off, _, err := p.OffsetForTimestamp(1008); err != nil || off != 8 {
		t.Fatalf("OffsetForTimestamp after restart: %d %v", off, err)
	}
}

func TestRetentionTimeIndexRepoint(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	p := mustPartition(t, s, pid)
	// 0: ts 500 (raises the max), 1: ts 300, 2: ts 400 (neither raises it), 3: ts 600.
	for _, ts := range []int64{500, 300, 400, 600} {
		mustAppend(t, p, sizedBatch(t, 1000, ts), syncAppend)
	}
	if n, err := p.ApplyRetention(time.Now(), -1, 3000); err != nil || n != 1 {
		t.Fatalf("retention: %d %v", n, err)
	}
	// Offset 1 (ts 300) must still be found from the index, which lost its entry for offset 0.
	for _, tc := range []struct{ ts, off int64 }{{100, 1}, {350, 2}, {450, 3}, {601, -1}} {
		if off, _, err := p.OffsetForTimestamp(tc.ts); err != nil || off != tc.off {
			t.Errorf("OffsetForTimestamp(%d) = %d %v, want %d", tc.ts, off, err, tc.off)
		}
	}
}

func TestValueLogGC(t *testing.T) {
	o := testOptions(t, false)
	o.ValueLogFileSize = 1 << 20 // the minimum: many files
	o.MemTableSize = 1 << 20     // flushes (and so compactions, which tell GC what is garbage) come early
	o.GCInterval = 10 * time.Millisecond
	s := openStore(t, o)
	short := mustPartition(t, s, PartitionID{TopicNum: 1, Partition: 0})
	kept := mustPartition(t, s, PartitionID{TopicNum: 2, Partition: 0})
	one := sizedBatch(t, 200, 1)
	// Three batches of the short-retention partition for each kept one, interleaved in the value log,
	// so GC has to move live batches out of mostly-garbage files.
	write := func(n int) {
		for i := 0; i < n; i += 100 {
			var a, b []byte
			for j := range 100 {
				if j%4 == 3 {
					b = append(b, one...)
				} else {
					a = append(a, one...)
				}
			}
			mustAppend(t, short, a, AppendOptions{LogAppendTime: -1})
			mustAppend(t, kept, b, AppendOptions{LogAppendTime: -1})
		}
	}
	vlogBytes := func() (n int64) {
		ents, err := os.ReadDir(o.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if fi, err := e.Info(); err == nil && strings.HasSuffix(e.Name(), ".vlog") {
				n += fi.Size()
			}
		}
		return n
	}
	if err := s.RunValueLogGC(); err != nil { // nothing to collect yet
		t.Fatalf("value-log GC: %v", err)
	}
	var peak int64
	reclaimed := false
	// Badger learns what is garbage from compactions, which follow memtable flushes, which follow
	// writes: keep writing and deleting until GC gave space back.
	for round := 0; round < 40 && !reclaimed; round++ {
		write(4000)
		if _, err := short.ApplyRetention(time.Now(), -1, 50_000); err != nil {
			t.Fatal(err)
		}
		if err := s.RunValueLogGC(); err != nil {
			t.Fatalf("value-log GC: %v", err)
		}
		n := vlogBytes()
		peak = max(peak, n)
		reclaimed = n < peak*2/3
	}
	if !reclaimed {
		t.Fatalf("value log never shrank (peak %d bytes)", peak)
	}
	// The batches GC moved are intact (CRC checked) and where they were.
	got := readAll(t, kept, 0)
	if int64(len(got)) != kept.LogEndOffset() || kept.Size() != int64(len(got)*len(one)) {
		t.Fatalf("kept partition: %d batches, LEO %d, size %d", len(got), kept.LogEndOffset(), kept.Size())
	}
	if got := readAll(t, short, short.LogStartOffset()); len(got) != 250 {
		t.Fatalf("short partition: %d batches retained", len(got))
	}
}

// TestFsyncAcrossRotation: when Badger rotates to a new value-log file between fsyncs, the syncer also
// fsyncs the file it left (Badger's Sync covers only the active one).
func TestFsyncAcrossRotation(t *testing.T) {
	o := testOptions(t, true)
	o.ValueLogFileSize = 1 << 20
	s := openStore(t, o)
	p := mustPartition(t, s, pid)
	for i := range 40 {
		mustAppend(t, p, sizedBatch(t, 100_000, int64(i)), syncAppend)
	}
	s.smu.Lock() // the syncer is idle: every Sync append returned after its fsync
	last := s.lastVlogFid
	s.smu.Unlock()
	if last < 3 {
		t.Fatalf("syncer saw value-log files up to %d after writing 4 MB into 1 MiB files", last)
	}
	if got := readAll(t, p, 0); len(got) != 40 {
		t.Fatalf("%d batches", len(got))
	}
}

// TestSyncCoversActiveLogFiles: the sync that acknowledges an fsynced append covers every value-log and
// memtable WAL file active at the sync before (it may hold writes since; Badger never syncs a memtable
// WAL when it starts the next) or created since, and the directory when files were created. The
// syncer syncs them by path, without Badger's db.Sync and its lock.
func TestSyncCoversActiveLogFiles(t *testing.T) {
	var mu sync.Mutex
	var synced []string
	testHookSyncPath = func(path string) {
		mu.Lock()
		synced = append(synced, path)
		mu.Unlock()
	}
	t.Cleanup(func() { testHookSyncPath = nil })
	o := testOptions(t, true)
	o.ValueLogFileSize = 1 << 20
	o.MemTableSize = 1 << 20
	s := openStore(t, o)
	p := mustPartition(t, s, pid)
	list := func() []badgerLogFile {
		files, err := badgerLogFiles(o.Dir)
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	active := func(files []badgerLogFile) (vlog, mem uint64) {
		for _, f := range files {
			if f.vlog {
				vlog = max(vlog, f.fid)
			} else {
				mem = max(mem, f.fid)
			}
		}
		return vlog, mem
	}
	prevVlog, prevMem := active(list())
	vlogRotations, memRotations := 0, 0
	for i := range 60 {
		if i%5 == 4 {
			// Small entries stay in the LSM tree, so they fill the memtable and its WAL: Badger starts
			// new WALs between the fsynced appends, as the index entries of many small batches would.
			wb := s.DB().NewWriteBatch()
			for j := range 5000 {
				if err := wb.Set(fmt.Appendf(nil, "m/test/%d/%d", i, j), []byte("small value, in the memtable WAL")); err != nil {
					t.Fatal(err)
				}
			}
			if err := wb.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		mu.Lock()
		synced = nil
		mu.Unlock()
		mustAppend(t, p, sizedBatch(t, 100_000, int64(i)), syncAppend) // answered after its sync
		files := list()
		vlog, mem := active(files)
		mu.Lock()
		got := slices.Clone(synced)
		mu.Unlock()
		var want []string
		for _, f := range files {
			if (f.vlog && f.fid >= prevVlog) || (!f.vlog && f.fid >= prevMem) {
				want = append(want, filepath.Join(o.Dir, f.name))
			}
		}
		if vlog != prevVlog || mem != prevMem {
			want = append(want, o.Dir)
		}
		if vlog != prevVlog {
			vlogRotations++
		}
		if mem != prevMem {
			memRotations++
		}
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Fatalf("append %d: the sync that answered it synced %v, not %s", i, got, w)
			}
		}
		prevVlog, prevMem = vlog, mem
	}
	if vlogRotations < 3 || memRotations < 2 {
		t.Fatalf("%d value-log and %d memtable WAL rotations: the test crossed too few", vlogRotations, memRotations)
	}
}

// TestLargeGroupSplitsTransactions: a group with more keys than one Badger transaction holds is
// written in several, in order.
func TestLargeGroupSplitsTransactions(t *testing.T) {
	o := testOptions(t, true)
	o.MemTableSize = 1 << 20 // a transaction holds ~1,500 keys
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	p := mustPartition(t, s, pid)
	var many []byte
	for i := range 5000 {
		many = append(many, makeBatch(t, batch.CompressionNone, rec{ts: int64(i), value: []byte{byte(i)}})...)
	}
	if res := mustAppend(t, p, many, syncAppend); res.BaseOffset != 0 || res.LastOffset != 4999 {
		t.Fatalf("result %+v", res)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	got := readAll(t, p, 0)
	if len(got) != 5000 || p.LogEndOffset() != 5000 || p.Size() != int64(len(many)) {
		t.Fatalf("%d batches, LEO %d, size %d", len(got), p.LogEndOffset(), p.Size())
	}
	for i, g := range got {
		if g.h.BaseOffset != int64(i) || g.values[0][0] != byte(i) {
			t.Fatalf("batch %d at %d holds %d", i, g.h.BaseOffset, g.values[0][0])
		}
	}
}

// TestRecoveryDropsBelowLogStart: retention writes the new log start first; if a crash cut it off before
// the deletions, the next open finishes them.
func TestRecoveryDropsBelowLogStart(t *testing.T) {
	o := testOptions(t, false)
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	p := mustPartition(t, s, pid)
	for i := range 5 {
		mustAppend(t, p, valueBatch(t, "x", 2, int64(100+i)), syncAppend)
	}
	one := p.Size() / 5
	// The state of a retention to offset 6 whose deletions were lost, in the 16-byte form stores wrote
	// before the cleaner checkpoint was added (still read).
	if err := s.DB().Update(func(txn *badger.Txn) error {
		return txn.Set(partPrefix(kindState, pid), encodeState(partState{logStart: 6, floor: 6})[:stateValueLenV1])
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	if p.LogStartOffset() != 6 || p.LogEndOffset() != 10 || p.Size() != 2*one {
		t.Fatalf("start %d LEO %d size %d", p.LogStartOffset(), p.LogEndOffset(), p.Size())
	}
	var left []int64
	if err := s.DB().View(func(txn *badger.Txn) error {
		for _, prefix := range [][]byte{partPrefix(kindBatch, pid), partPrefix(kindTime, pid)} {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
			for it.Rewind(); it.Valid(); it.Next() {
				if prefix[0] == kindBatch {
					left = append(left, batchKeyOffset(it.Item().Key()))
				} else {
					_, base := timeKeyParts(it.Item().Key())
					left = append(left, base)
				}
			}
			it.Close()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(left) != "[6 8 6 8]" {
		t.Fatalf("keys left (batches, then time index): %v", left)
	}
	if off, ts, err := p.OffsetForTimestamp(0); err != nil || off != 6 || ts != 103 {
		t.Fatalf("OffsetForTimestamp = %d %d %v", off, ts, err)
	}
}

// TestFsyncFailureIsSticky: after a failed fsync nothing written since can be trusted to be on disk, so
// the store refuses appends (KAFKA_STORAGE_ERROR) and the HW stays where the last good fsync left it;
// reads of what was durable go on.
func TestFsyncFailureIsSticky(t *testing.T) {
	s := openStore(t, testOptions(t, true))
	p := mustPartition(t, s, pid)
	mustAppend(t, p, valueBatch(t, "good", 2, 1), syncAppend)
	s.syncFn = func() error { return errors.New("injected EIO") }
	if _, err := p.Append(context.Background(), valueBatch(t, "lost", 2, 1), syncAppend); !isErr(err, rerr.ErrStorage) {
		t.Fatalf("append whose fsync failed: %v", err)
	}
	if p.HighWatermark() != 2 || p.LogEndOffset() != 4 {
		t.Fatalf("HW %d LEO %d after the failed fsync, want HW 2 LEO 4", p.HighWatermark(), p.LogEndOffset())
	}
	for _, sync := range []bool{true, false} {
		if _, err := p.Append(context.Background(), valueBatch(t, "later", 1, 1), AppendOptions{Sync: sync, LogAppendTime: -1}); !isErr(err, rerr.ErrStorage) {
			t.Fatalf("append after the failure: %v", err)
		}
	}
	if got := readAll(t, p, 0); len(got) != 1 || string(got[0].values[0]) != "good#0" {
		t.Fatalf("read after the failure: %d batches", len(got))
	}
}

// TestAppendAsync: appends queued one after another are stored in that order; done is called once per
// append, on a goroutine of its own (a blocked done holds up nothing), with errors found before queueing too.
func TestAppendAsync(t *testing.T) {
	s := openStore(t, testOptions(t, true))
	p := mustPartition(t, s, pid)
	const n = 50
	type result struct {
		i   int
		res AppendResult
		err error
	}
	results := make(chan result, n+1)
	release := make(chan struct{})
	for i := range n {
		p.AppendAsync(valueBatch(t, fmt.Sprintf("a%02d", i), 2, 1), AppendOptions{Sync: i%2 == 0, LogAppendTime: -1}, func(res AppendResult, err error) {
			if i == 0 {
				<-release // a blocked callback: the others still complete
			}
			results <- result{i, res, err}
		})
	}
	for range n - 1 {
		r := <-results
		if r.err != nil || r.res.BaseOffset != int64(2*r.i) || r.res.LastOffset != int64(2*r.i+1) {
			t.Fatalf("append %d: %+v %v", r.i, r.res, r.err)
		}
	}
	close(release)
	if r := <-results; r.i != 0 || r.err != nil || r.res.BaseOffset != 0 {
		t.Fatalf("append 0: %+v %v", r.res, r.err)
	}
	p.AppendAsync([]byte("short"), syncAppend, func(res AppendResult, err error) { results <- result{-1, res, err} })
	if r := <-results; !isErr(r.err, rerr.ErrCorruptMessage) {
		t.Fatalf("corrupt batch: %v", r.err)
	}
	if len(results) != 0 {
		t.Fatal("a callback ran twice")
	}
}

func TestStoredPartitions(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	for _, id := range []PartitionID{{3, 2}, {1, 7}, {1 << 40, 1}, {1, 0}} {
		mustAppend(t, mustPartition(t, s, id), valueBatch(t, "v", 3, 1), AppendOptions{LogAppendTime: -1})
	}
	got, err := s.StoredPartitions()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []PartitionID{{1, 0}, {1, 7}, {3, 2}, {1 << 40, 1}}) {
		t.Fatalf("stored partitions %v", got)
	}
	if err := s.DeletePartition(PartitionID{1, 7}); err != nil {
		t.Fatal(err)
	}
	if got, _ = s.StoredPartitions(); !slices.Equal(got, []PartitionID{{1, 0}, {3, 2}, {1 << 40, 1}}) {
		t.Fatalf("after a delete: %v", got)
	}
}

// TestDiskGuard: a store whose filesystem has less free space than MinFreeBytes refuses appends with
// KAFKA_STORAGE_ERROR (retriable) and stores nothing, instead of letting Badger's memory-mapped value
// log run into a full disk (SIGBUS); with room, the same append goes through.
func TestDiskGuard(t *testing.T) {
	o := testOptions(t, false)
	free := freeBytes(o.Dir)
	if free < 0 {
		t.Skip("this system does not report free space")
	}
	o.MinFreeBytes = free + 1<<40 // more than the filesystem will ever have
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := mustPartition(t, s, pid)
	_, err = p.Append(context.Background(), valueBatch(t, "full", 3, 1), AppendOptions{Sync: true, LogAppendTime: -1})
	if !isErr(err, rerr.ErrStorage) || !rerr.Retriable(rerr.FromError(err).Code) {
		t.Fatalf("append on a full disk: %v, want a retriable KAFKA_STORAGE_ERROR", err)
	}
	if p.LogEndOffset() != 0 {
		t.Fatalf("a refused append moved the log end to %d", p.LogEndOffset())
	}

	o2 := testOptions(t, false)
	o2.MinFreeBytes = 1 << 20
	s2, err := Open(o2)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, err := mustPartition(t, s2, pid).Append(context.Background(), valueBatch(t, "room", 3, 1), AppendOptions{Sync: true, LogAppendTime: -1}); err != nil {
		t.Fatalf("append with room: %v", err)
	}
}
