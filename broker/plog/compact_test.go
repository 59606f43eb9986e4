package plog

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/runnel-io/runnel/api/rerr"
	"github.com/runnel-io/runnel/client/batch"
)

// t0 is the fake clock's start (ms), far from 0 so lags and horizons never go negative.
const t0 = int64(1_700_000_000_000)

// fakeClock is the writer's clock in compaction tests; Compact gets its time passed in.
type fakeClock struct{ ms atomic.Int64 }

func (c *fakeClock) now() time.Time  { return time.UnixMilli(c.ms.Load()) }
func (c *fakeClock) set(ms int64)    { c.ms.Store(ms) }
func (c *fakeClock) advance(d int64) { c.ms.Add(d) }

// useClock makes s's writer read c; call it before the first append (the queue's lock orders it before
// the writer's reads).
func useClock(s *Store) *fakeClock {
	c := &fakeClock{}
	c.set(t0)
	s.now = c.now
	return c
}

// kv is one record of a keyed test batch; tomb makes it a tombstone (null value), noKey a keyless record.
type kv struct {
	key, value  string
	tomb, noKey bool
}

// keyedBatch builds a batch of recs at timestamp ts with codec (the Builder falls back to none when
// compression does not pay, so callers wanting a codec give compressible values).
func keyedBatch(ts int64, codec batch.Compression, recs ...kv) []byte {
	var b batch.Builder
	for _, r := range recs {
		var k, v []byte
		if !r.noKey {
			k = []byte(r.key)
		}
		if !r.tomb {
			v = []byte(r.value)
		}
		b.Append(ts, k, v, nil)
	}
	return append([]byte(nil), b.Build(codec)...)
}

// rec1 is a one-record batch.
func rec1(ts int64, key, value string) []byte {
	return keyedBatch(ts, batch.CompressionNone, kv{key: key, value: value})
}

// tomb1 is a one-tombstone batch.
func tomb1(ts int64, key string) []byte {
	return keyedBatch(ts, batch.CompressionNone, kv{key: key, tomb: true})
}

// rollEvery rolls the active segment before every batch after its first: each batch is a segment, and
// only the last one is active.
var rollEvery = AppendOptions{Sync: true, LogAppendTime: -1, SegmentBytes: 1}

// record is one record as read back.
type record struct {
	off        int64
	key, value string
	tomb       bool
}

func (r record) String() string {
	if r.tomb {
		return fmt.Sprintf("%d:%s=∅", r.off, r.key)
	}
	return fmt.Sprintf("%d:%s=%s", r.off, r.key, r.value)
}

// readLog reads the partition from its log start to the HW with Read, checks every batch (CRC,
// framing) and that offsets rise strictly, and returns the records and batch headers.
func readLog(t testing.TB, p *Partition) ([]record, []batch.Header) {
	t.Helper()
	var recs []record
	var hs []batch.Header
	last := int64(-1)
	for off := p.LogStartOffset(); off < p.HighWatermark(); {
		b, err := p.Read(nil, off, 64<<10)
		if err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		if len(b) == 0 {
			t.Fatalf("read at %d below HW %d returned nothing", off, p.HighWatermark())
		}
		for len(b) > 0 {
			h, err := batch.DecodeBatch(b, func(r batch.Record) error {
				if r.Offset <= last {
					return fmt.Errorf("offset %d after %d", r.Offset, last)
				}
				last = r.Offset
				recs = append(recs, record{off: r.Offset, key: string(r.Key), value: string(r.Value), tomb: r.Value == nil})
				return nil
			})
			if err != nil {
				t.Fatalf("batch read at %d: %v", off, err)
			}
			hs = append(hs, h)
			off = h.NextOffset()
			b = b[h.Size():]
		}
	}
	return recs, hs
}

func sizeOf(hs []batch.Header) int64 {
	var n int64
	for _, h := range hs {
		n += int64(h.Size())
	}
	return n
}

func mustCompact(t testing.TB, p *Partition, nowMs int64, cfg CompactConfig) CompactStats {
	t.Helper()
	st, err := p.Compact(context.Background(), time.UnixMilli(nowMs), cfg)
	if err != nil {
		t.Fatalf("compact: %v", err)
	}
	return st
}

// eagerCfg cleans whenever anything is dirty and keeps tombstones for an hour.
var eagerCfg = CompactConfig{DeleteRetentionMs: 3_600_000, MinCleanableDirtyRatio: 0, MaxCompactionLagMs: math.MaxInt64}

// expectCompacted is what a clean up to end must leave of all (in offset order): below end the latest
// record of each key over all of all; from end on, everything.
func expectCompacted(all []record, end int64) []record {
	latest := map[string]int64{}
	for _, r := range all {
		latest[r.key] = r.off
	}
	var out []record
	for _, r := range all {
		if r.off >= end || latest[r.key] == r.off {
			out = append(out, r)
		}
	}
	return out
}

func sameRecords(t testing.TB, what string, got, want []record) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s:\n got %v\nwant %v", what, got, want)
	}
}

// TestCompactKeepsLatestPerKey: after a clean, the closed segments hold exactly the latest record per
// key (a key rewritten in the active tail counts), every surviving record keeps its offset, rewritten
// batches keep base offset, last offset delta and codec, Size matches the bytes read, and all of it
// survives a restart. With every codec, since rewritten batches are compressed again.
func TestCompactKeepsLatestPerKey(t *testing.T) {
	for _, codec := range []batch.Compression{batch.CompressionNone, batch.CompressionGzip, batch.CompressionSnappy,
		batch.CompressionLZ4, batch.CompressionZstd} {
		t.Run(codec.String(), func(t *testing.T) {
			o := testOptions(t, false)
			s, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Close() }()
			useClock(s)
			p := mustPartition(t, s, pid)
			var all []record
			orig := map[int64]batch.Header{} // by base offset
			ver := 0
			for round := range 8 {
				var recs []kv
				for i := range 6 {
					key := fmt.Sprintf("k%d", (round*4+i*3)%9) // repeats within and across batches
					ver++
					recs = append(recs, kv{key: key, value: strings.Repeat(key+"-v"+strconv.Itoa(ver)+";", 12)})
				}
				b := keyedBatch(t0+int64(round), codec, recs...)
				h, _ := batch.ParseHeader(b)
				res := mustAppend(t, p, b, rollEvery)
				h.BaseOffset = res.BaseOffset
				orig[res.BaseOffset] = h
				for i, r := range recs {
					all = append(all, record{off: res.BaseOffset + int64(i), key: r.key, value: r.value})
				}
			}
			lastBase := all[len(all)-1].off - 5
			if got := p.ActiveSegmentStart(); got != lastBase {
				t.Fatalf("active segment starts at %d, want %d (the last batch)", got, lastBase)
			}
			leo, sizeBefore := p.LogEndOffset(), p.Size()

			st := mustCompact(t, p, t0+100, eagerCfg)
			if st.Reason != ReasonDirtyRatio || st.CleanableEnd != lastBase || st.FirstDirty != 0 || st.DirtyRatio != 1 {
				t.Fatalf("stats %+v", st)
			}
			want := expectCompacted(all, lastBase)
			if st.RecordsRemoved != int64(len(all)-len(want)) || st.Keys != 9 || st.BytesRemoved != sizeBefore-p.Size() {
				t.Fatalf("stats %+v; %d records removed, size %d → %d", st, len(all)-len(want), sizeBefore, p.Size())
			}
			got, hs := readLog(t, p)
			sameRecords(t, "after compaction", got, want)
			for _, h := range hs {
				o, ok := orig[h.BaseOffset]
				if !ok || o.LastOffsetDelta != h.LastOffsetDelta || o.Compression() != h.Compression() ||
					o.BaseTimestamp != h.BaseTimestamp || o.MaxTimestamp != h.MaxTimestamp || o.ProducerID != h.ProducerID {
					t.Fatalf("batch %+v rewritten from %+v", h, o)
				}
			}
			if codec != batch.CompressionNone && hs[0].Compression() != codec {
				t.Fatalf("first batch codec %v, want %v", hs[0].Compression(), codec)
			}
			if p.Size() != sizeOf(hs) || p.LogStartOffset() != 0 || p.LogEndOffset() != leo || p.HighWatermark() != leo {
				t.Fatalf("size %d (read %d), start %d, LEO %d HW %d (want %d)", p.Size(), sizeOf(hs), p.LogStartOffset(), p.LogEndOffset(), p.HighWatermark(), leo)
			}
			if again := mustCompact(t, p, t0+200, eagerCfg); again.Reason != "" || again.DirtyBytes != 0 {
				t.Fatalf("second run without new data: %+v", again)
			}

			size := p.Size()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, o)
			p = mustPartition(t, s, pid)
			got, _ = readLog(t, p)
			sameRecords(t, "after restart", got, want)
			if p.Size() != size || p.LogStartOffset() != 0 || p.LogEndOffset() != leo || p.ActiveSegmentStart() != lastBase {
				t.Fatalf("after restart: size %d (want %d), start %d, LEO %d, segment %d", p.Size(), size, p.LogStartOffset(), p.LogEndOffset(), p.ActiveSegmentStart())
			}
			if again := mustCompact(t, p, t0+300, eagerCfg); again.Reason != "" {
				t.Fatalf("the checkpoint did not survive the restart: %+v", again)
			}
		})
	}
}

// TestCompactGaps: offsets never move and readers skip gaps. Read from an offset the cleaner removed
// (including the log start) returns the next batch; OFFSET_OUT_OF_RANGE stays for offsets below the log
// start (after retention) or above the HW; the log start stays after the first batch is removed, also
// across a restart; timestamp look-ups skip gaps.
func TestCompactGaps(t *testing.T) {
	o := testOptions(t, false)
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	useClock(s)
	p := mustPartition(t, s, pid)
	for _, b := range [][]byte{
		rec1(1000, "a", "a1"), // 0: obsolete
		keyedBatch(1001, 0, kv{key: "b", value: "b1"}, kv{key: "b", value: "b2"}), // 1-2: obsolete
		rec1(1002, "a", "a2"), // 3
		rec1(1003, "c", "c1"), // 4
		keyedBatch(1004, 0, kv{key: "d", value: "d1"}, kv{key: "e", value: "e1"}, kv{key: "d", value: "d2"}), // 5-7: 5 obsolete
		rec1(1005, "b", "b3"), // 8: the last batch
	} {
		mustAppend(t, p, b, rollEvery)
	}
	st := mustCompact(t, p, t0, eagerCfg)
	if st.BatchesRemoved != 2 || st.BatchesRewritten != 1 || st.RecordsRemoved != 4 {
		t.Fatalf("stats %+v", st)
	}
	check := func(when string) {
		t.Helper()
		for off, wantBase := range map[int64]int64{0: 3, 1: 3, 2: 3, 3: 3, 4: 4, 5: 5, 6: 5, 7: 5, 8: 8} {
			b, err := p.Read(nil, off, 1)
			if err != nil {
				t.Fatalf("%s: read at %d: %v", when, off, err)
			}
			if h, err := batch.ParseHeader(b); err != nil || h.BaseOffset != wantBase {
				t.Fatalf("%s: read at %d returned batch %d (%v), want %d", when, off, h.BaseOffset, err, wantBase)
			}
		}
		if b, err := p.Read(nil, 9, 1<<20); err != nil || len(b) != 0 {
			t.Fatalf("%s: read at HW: %d bytes, %v", when, len(b), err)
		}
		if _, err := p.Read(nil, 10, 1<<20); !errors.Is(err, rerr.ErrOffsetOutOfRange) {
			t.Fatalf("%s: read above HW: %v", when, err)
		}
		if p.LogStartOffset() != 0 {
			t.Fatalf("%s: log start moved to %d", when, p.LogStartOffset())
		}
		if off, ts, err := p.OffsetForTimestamp(999); err != nil || off != 3 || ts != 1002 {
			t.Fatalf("%s: OffsetForTimestamp = %d %d %v", when, off, ts, err)
		}
	}
	check("after compaction")
	got, _ := readLog(t, p)
	sameRecords(t, "records", got, []record{{3, "a", "a2", false}, {4, "c", "c1", false}, {6, "e", "e1", false}, {7, "d", "d2", false}, {8, "b", "b3", false}})

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	check("after restart")

	// Retention (compact,delete) deletes the batch at 3: the log start moves past the gap before it.
	if n, err := p.ApplyRetention(time.UnixMilli(1003+1000), 1000, -1); err != nil || n != 1 {
		t.Fatalf("retention deleted %d: %v", n, err)
	}
	if p.LogStartOffset() != 4 {
		t.Fatalf("log start %d after retention, want 4", p.LogStartOffset())
	}
	for off := range int64(4) {
		if _, err := p.Read(nil, off, 1<<20); !errors.Is(err, rerr.ErrOffsetOutOfRange) {
			t.Fatalf("read at %d below the log start: %v", off, err)
		}
	}
	got, hs := readLog(t, p)
	sameRecords(t, "after retention", got, []record{{4, "c", "c1", false}, {6, "e", "e1", false}, {7, "d", "d2", false}, {8, "b", "b3", false}})
	if p.Size() != sizeOf(hs) {
		t.Fatalf("size %d, read %d", p.Size(), sizeOf(hs))
	}
}

// TestCompactTombstones: a tombstone that is the latest of its key removes the older records at once
// and is kept for delete.retention.ms after the clean that first kept it; the first clean after that
// removes it even with nothing dirty. A tombstone made obsolete by a later record goes at once.
func TestCompactTombstones(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	useClock(s)
	p := mustPartition(t, s, pid)
	for _, b := range [][]byte{
		rec1(1, "a", "a1"), // 0
		rec1(2, "b", "b1"), // 1
		tomb1(3, "a"),      // 2: latest of a
		tomb1(4, "b"),      // 3: obsolete (b comes back at 4)
		rec1(5, "b", "b2"), // 4
		rec1(6, "c", "c1"), // 5: the last batch
	} {
		mustAppend(t, p, b, rollEvery)
	}
	cfg := eagerCfg
	cfg.DeleteRetentionMs = 60_000
	first := t0 + 10
	if st := mustCompact(t, p, first, cfg); st.TombstonesRemoved != 0 || st.RecordsRemoved != 3 {
		t.Fatalf("first clean %+v", st)
	}
	got, _ := readLog(t, p)
	sameRecords(t, "after the first clean", got, []record{{2, "a", "", true}, {4, "b", "b2", false}, {5, "c", "c1", false}})

	// More dirty data arrives; a clean before the horizon keeps the tombstone.
	mustAppend(t, p, rec1(7, "d", "d1"), rollEvery)
	if st := mustCompact(t, p, first+cfg.DeleteRetentionMs-1, cfg); st.Reason != ReasonDirtyRatio || st.TombstonesRemoved != 0 {
		t.Fatalf("clean before the horizon %+v", st)
	}
	got, _ = readLog(t, p)
	sameRecords(t, "before the horizon", got, []record{{2, "a", "", true}, {4, "b", "b2", false}, {5, "c", "c1", false}, {6, "d", "d1", false}})
	if st := mustCompact(t, p, first+cfg.DeleteRetentionMs-1, cfg); st.Reason != "" {
		t.Fatalf("nothing dirty and no horizon passed, yet %+v", st)
	}
	// At the horizon the tombstone goes, though nothing is dirty, and with it its horizon entry.
	st := mustCompact(t, p, first+cfg.DeleteRetentionMs, cfg)
	if st.Reason != ReasonTombstones || st.TombstonesRemoved != 1 || st.BatchesRemoved != 1 {
		t.Fatalf("clean at the horizon %+v", st)
	}
	got, hs := readLog(t, p)
	sameRecords(t, "after the horizon", got, []record{{4, "b", "b2", false}, {5, "c", "c1", false}, {6, "d", "d1", false}})
	if p.Size() != sizeOf(hs) {
		t.Fatalf("size %d, read %d", p.Size(), sizeOf(hs))
	}
	if n := countKeys(t, s, partPrefix(kindHoriz, pid)); n != 0 {
		t.Fatalf("%d delete horizons left", n)
	}
	if st := mustCompact(t, p, first+cfg.DeleteRetentionMs+1, cfg); st.Reason != "" {
		t.Fatalf("after the tombstones went: %+v", st)
	}
}

func countKeys(t testing.TB, s *Store, prefix []byte) int {
	t.Helper()
	n := 0
	if err := s.DB().View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: false})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCompactDirtyRatio: the cleaner waits until the bytes written since the last clean reach
// min.cleanable.dirty.ratio of the closed segments, unless max.compaction.lag.ms forces it.
func TestCompactDirtyRatio(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	useClock(s)
	p := mustPartition(t, s, pid)
	ts := int64(1000)
	var all []record
	put := func(key string) {
		ts++
		res := mustAppend(t, p, rec1(ts, key, "value-"+key), rollEvery) // equal sizes for equal key lengths
		all = append(all, record{off: res.BaseOffset, key: key, value: "value-" + key})
	}
	for i := range 10 {
		put(fmt.Sprintf("u%d", i))
	}
	put("zz") // the last batch
	cfg := eagerCfg
	cfg.MinCleanableDirtyRatio = 0.5
	if st := mustCompact(t, p, t0, cfg); st.Reason != ReasonDirtyRatio || st.DirtyRatio != 1 || st.CleanableEnd != 10 {
		t.Fatalf("first clean %+v", st)
	}
	for i := range 4 {
		put(fmt.Sprintf("u%d", i)) // 11-14
	}
	put("zz") // 15
	// Dirty: 10 ("zz"), 11-14 = 5 batches; clean: 10 batches → 1/3.
	st := mustCompact(t, p, t0, cfg)
	if st.Reason != "" || st.FirstDirty != 10 || st.CleanableEnd != 15 || math.Abs(st.DirtyRatio-1.0/3) > 1e-9 {
		t.Fatalf("below the ratio %+v", st)
	}
	for i := 4; i < 9; i++ {
		put(fmt.Sprintf("u%d", i)) // 16-20
	}
	put("zz") // 21
	// Dirty: 10-20 = 11 batches; clean 10 → 11/21 ≥ 0.5. Removed: u0-u8 at 0-8, zz at 10 and 15.
	if st := mustCompact(t, p, t0, cfg); st.Reason != ReasonDirtyRatio || st.BatchesRemoved != 11 || st.FirstDirty != 10 || st.CleanableEnd != 21 {
		t.Fatalf("above the ratio %+v", st)
	}
	got, _ := readLog(t, p)
	sameRecords(t, "after the second clean", got, expectCompacted(all, 21))

	// Now only a little is dirty; max.compaction.lag.ms forces the clean once the first dirty batch
	// (the one at 21) is older than the lag.
	firstDirtyTs := ts
	put("u0") // 22
	put("zz") // 23
	lag := cfg
	lag.MaxCompactionLagMs = 5000
	if st := mustCompact(t, p, firstDirtyTs+5000, lag); st.Reason != "" || st.DirtyRatio >= 0.5 {
		t.Fatalf("at the max lag %+v", st)
	}
	if st := mustCompact(t, p, firstDirtyTs+5001, lag); st.Reason != ReasonMaxCompactionLag || st.BatchesRemoved != 2 {
		t.Fatalf("past the max lag %+v", st)
	}
	got, _ = readLog(t, p)
	sameRecords(t, "after the forced clean", got, expectCompacted(all, 23))
}

// TestCompactMinLag: batches younger than min.compaction.lag.ms are left as they are, even when a later
// record made one of their records obsolete; older ones are cleaned.
func TestCompactMinLag(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	useClock(s)
	p := mustPartition(t, s, pid)
	for i := range 10 {
		key := fmt.Sprintf("k%d", i%3)
		mustAppend(t, p, rec1(int64(1000+i), key, fmt.Sprintf("v%d", i)), rollEvery)
	}
	cfg := eagerCfg
	cfg.MinCompactionLagMs = 5
	// At 1010 the batches with timestamp > 1005 (offsets 6-9) are too young.
	st := mustCompact(t, p, 1010, cfg)
	if st.CleanableEnd != 6 {
		t.Fatalf("stats %+v", st)
	}
	got, _ := readLog(t, p)
	// Offsets 0-5 keep only the latest per key (k0: 9, k1: 7, k2: 8 all in the young part → all go);
	// 6-9 stay untouched although 6 (k0) is superseded by 9.
	sameRecords(t, "after the clean", got, []record{{6, "k0", "v6", false}, {7, "k1", "v7", false}, {8, "k2", "v8", false}, {9, "k0", "v9", false}})
}

// TestCompactActiveSegment: the cleaner never touches the active segment. With Kafka's default
// segment.bytes and segment.ms nothing rolls and nothing is cleaned; once the segment is older than
// segment.ms, Compact rolls it (nothing in flight) and cleans all but the last batch. Segments roll by
// bytes on append, and the segment start and age survive a restart.
func TestCompactActiveSegment(t *testing.T) {
	o := testOptions(t, false)
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	clock := useClock(s)
	p := mustPartition(t, s, pid)
	for i := range 6 {
		mustAppend(t, p, rec1(int64(i), "k", fmt.Sprintf("v%d", i)), syncAppend)
	}
	cfg := eagerCfg
	cfg.SegmentMs = 10_000
	if st := mustCompact(t, p, t0+10_000, cfg); st.Reason != "" || st.CleanableEnd != 0 || p.ActiveSegmentStart() != 0 {
		t.Fatalf("clean of the active segment: %+v, segment at %d", st, p.ActiveSegmentStart())
	}
	if got, _ := readLog(t, p); len(got) != 6 {
		t.Fatalf("active segment changed: %v", got)
	}
	st := mustCompact(t, p, t0+10_001, cfg)
	if st.Reason != ReasonDirtyRatio || st.CleanableEnd != 5 || p.ActiveSegmentStart() != 6 {
		t.Fatalf("after the idle roll: %+v, segment at %d", st, p.ActiveSegmentStart())
	}
	got, _ := readLog(t, p)
	sameRecords(t, "after the idle roll", got, []record{{5, "k", "v5", false}})

	// Rolls by bytes: segments of 3 batches of equal size.
	one := int64(len(rec1(0, "k", "v0")))
	byBytes := AppendOptions{Sync: true, LogAppendTime: -1, SegmentBytes: 3 * one}
	clock.advance(1)
	for i := range 7 {
		mustAppend(t, p, rec1(int64(10+i), "k", fmt.Sprintf("v%d", i)), byBytes)
		if want := int64(6 + i/3*3); p.ActiveSegmentStart() != want {
			t.Fatalf("after batch %d the segment starts at %d, want %d", 6+i, p.ActiveSegmentStart(), want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s2.Close() }()
	clock = useClock(s2)
	clock.set(t0 + 20_000)
	p = mustPartition(t, s2, pid)
	if p.ActiveSegmentStart() != 12 {
		t.Fatalf("after restart the segment starts at %d, want 12", p.ActiveSegmentStart())
	}
	// The stored first-write time (t0+1) ages the segment: an append 20 s later rolls it by time.
	mustAppend(t, p, rec1(20, "k", "late"), AppendOptions{Sync: true, LogAppendTime: -1, SegmentMs: 10_000})
	if p.ActiveSegmentStart() != 13 {
		t.Fatalf("the segment did not roll by time: starts at %d", p.ActiveSegmentStart())
	}
}

// TestCompactDropsKeyless: records without a key (produce refuses them on compacted topics,
// but a topic switched from delete to compact can hold them) are dropped, as Kafka's cleaner does.
func TestCompactDropsKeyless(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	useClock(s)
	p := mustPartition(t, s, pid)
	mustAppend(t, p, keyedBatch(1, 0, kv{noKey: true, value: "x"}, kv{key: "a", value: "a1"}), rollEvery)
	mustAppend(t, p, rec1(2, "b", "b1"), rollEvery)
	if st := mustCompact(t, p, t0, eagerCfg); st.RecordsRemoved != 1 {
		t.Fatalf("stats %+v", st)
	}
	got, _ := readLog(t, p)
	sameRecords(t, "records", got, []record{{1, "a", "a1", false}, {2, "b", "b1", false}})
}

// TestCompactInterrupted: a clean stopped between two of its transactions (as by a crash; here by its
// ctx, after the first group) leaves a valid log with every latest record, also after a restart; the
// checkpoint has not moved, so the next run finishes the job.
func TestCompactInterrupted(t *testing.T) {
	defer func(n int) { cleanGroupBatches = n }(cleanGroupBatches)
	cleanGroupBatches = 2
	o := testOptions(t, false)
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	useClock(s)
	p := mustPartition(t, s, pid)
	var all []record
	for i := range 12 {
		key := fmt.Sprintf("k%d", i%4)
		res := mustAppend(t, p, rec1(int64(i), key, fmt.Sprintf("v%d", i)), rollEvery)
		all = append(all, record{off: res.BaseOffset, key: key, value: fmt.Sprintf("v%d", i)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	testHookCleanGroup = cancel
	defer func() { testHookCleanGroup = nil }()
	if _, err := p.Compact(ctx, time.UnixMilli(t0), eagerCfg); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted compact: %v", err)
	}
	testHookCleanGroup = nil
	got, hs := readLog(t, p)
	// The first group (batches 0 and 1, both obsolete) is gone, the rest is untouched.
	sameRecords(t, "after the interrupted clean", got, all[2:])
	if p.Size() != sizeOf(hs) {
		t.Fatalf("size %d, read %d", p.Size(), sizeOf(hs))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	p = mustPartition(t, s, pid)
	if got, _ := readLog(t, p); fmt.Sprint(got) != fmt.Sprint(all[2:]) || p.LogStartOffset() != 0 {
		t.Fatalf("after restart (log start %d): %v", p.LogStartOffset(), got)
	}
	st := mustCompact(t, p, t0, eagerCfg)
	if st.FirstDirty != 0 {
		t.Fatalf("the interrupted clean moved the checkpoint: %+v", st)
	}
	got, hs = readLog(t, p)
	sameRecords(t, "after the next clean", got, expectCompacted(all, 11))
	if p.Size() != sizeOf(hs) {
		t.Fatalf("size %d, read %d", p.Size(), sizeOf(hs))
	}
}

// TestCompactDeletePartition: a partition deleted while the cleaner runs on it is gone for good: the
// cleaner stops with ErrPartitionDeleted (or finished before), and no key of it (batches, horizons,
// segment, state) outlives DeletePartition.
func TestCompactDeletePartition(t *testing.T) {
	defer func(n int) { cleanGroupBatches = n }(cleanGroupBatches)
	cleanGroupBatches = 1
	s := openStore(t, testOptions(t, false))
	useClock(s)
	for round := range 3 {
		p := mustPartition(t, s, pid)
		for i := range 40 {
			b := tomb1(int64(i), fmt.Sprintf("k%d", i%5))
			if i%3 == 0 {
				b = rec1(int64(i), fmt.Sprintf("k%d", i%5), "v")
			}
			mustAppend(t, p, b, rollEvery)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := p.Compact(context.Background(), time.UnixMilli(t0), eagerCfg)
			errc <- err
		}()
		if err := s.DeletePartition(pid); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil && !errors.Is(err, ErrPartitionDeleted) {
			t.Fatalf("round %d: compact: %v", round, err)
		}
		for _, kind := range []byte{kindBatch, kindTime, kindState, kindSeg, kindHoriz} {
			if n := countKeys(t, s, partPrefix(kind, pid)); n != 0 {
				t.Fatalf("round %d: %d keys of kind %c left", round, n, kind)
			}
		}
	}
}

// TestCompactConcurrentReaders: while one goroutine appends (rolling segments often) and the cleaner
// runs again and again, readers iterate the partition from the start over and over: each pass sees
// strictly increasing offsets and, per key, never an older version after a newer one, and every pass
// sees every key's latest version as of its start. In the end the closed segments hold each key once.
func TestCompactConcurrentReaders(t *testing.T) {
	for _, fsync := range []bool{false, true} {
		t.Run(fmt.Sprintf("fsync=%v", fsync), func(t *testing.T) { testCompactConcurrentReaders(t, fsync) })
	}
}

func testCompactConcurrentReaders(t *testing.T, fsync bool) {
	s := openStore(t, testOptions(t, fsync))
	clock := useClock(s)
	p := mustPartition(t, s, pid)
	const keys, batches = 20, 300
	seg := AppendOptions{Sync: true, LogAppendTime: -1, SegmentBytes: 2000}
	var written atomic.Int64 // batches appended
	latestMu := sync.Mutex{}
	latest := map[string]int{} // key → last version acknowledged

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	stop := make(chan struct{})
	wg.Add(1)
	go func() { // the producer
		defer wg.Done()
		defer close(stop)
		rng := rand.New(rand.NewPCG(1, 2))
		version := 0
		for range batches {
			var recs []kv
			vers := map[string]int{}
			for range 1 + rng.IntN(5) {
				version++
				key := fmt.Sprintf("key-%02d", rng.IntN(keys))
				recs = append(recs, kv{key: key, value: fmt.Sprintf("%s@%06d", key, version)})
				vers[key] = version
			}
			codec := batch.Compression(rng.IntN(5))
			if _, err := p.Append(context.Background(), keyedBatch(clock.now().UnixMilli(), codec, recs...), seg); err != nil {
				errs <- err
				return
			}
			latestMu.Lock()
			for k, v := range vers {
				latest[k] = v
			}
			latestMu.Unlock()
			written.Add(1)
			clock.advance(10)
		}
	}()
	wg.Add(1)
	cleans := 0
	go func() { // the cleaner
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := p.Compact(context.Background(), clock.now(), eagerCfg)
			if err != nil {
				errs <- err
				return
			}
			if st.Reason != "" {
				cleans++
			}
		}
	}()
	passes := atomic.Int64{}
	for r := range 3 {
		wg.Add(1)
		go func() { // readers
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				latestMu.Lock()
				before := maps2(latest)
				latestMu.Unlock()
				if err := readPass(p, r, before); err != nil {
					errs <- err
					return
				}
				passes.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if cleans == 0 || passes.Load() == 0 {
		t.Fatalf("%d cleans, %d read passes", cleans, passes.Load())
	}
	t.Logf("%d batches, %d cleans, %d read passes", written.Load(), cleans, passes.Load())

	// A final clean: each key at most once below the active segment, and the latest version of each.
	clock.advance(1)
	mustCompact(t, p, clock.now().UnixMilli(), eagerCfg)
	got, hs := readLog(t, p)
	end := p.ActiveSegmentStart()
	seen := map[string]bool{}
	last := map[string]string{}
	for _, r := range got {
		if r.off < end {
			if seen[r.key] {
				t.Fatalf("key %s twice below the active segment at %d", r.key, end)
			}
			seen[r.key] = true
		}
		last[r.key] = r.value
	}
	for k, v := range latest {
		if want := fmt.Sprintf("%s@%06d", k, v); last[k] != want {
			t.Fatalf("key %s ends at %q, want %q", k, last[k], want)
		}
	}
	if p.Size() != sizeOf(hs) {
		t.Fatalf("size %d, read %d", p.Size(), sizeOf(hs))
	}
}

func maps2(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// readPass reads p from its start until it catches up with the HW, as a consumer does (next offset =
// the batch's next offset; small reads so passes interleave with the cleaner), and checks the stream:
// offsets rise strictly, per key versions rise, and every key's version acknowledged before the pass
// (before) or a later one shows up.
func readPass(p *Partition, reader int, before map[string]int) error {
	lastOff := int64(-1)
	lastVer := map[string]int{}
	// Read on to the current HW, as a consumer does: the cleaner may remove a version acknowledged
	// before the pass because a newer one arrived after the pass began, which the pass then reads.
	for off := p.LogStartOffset(); ; {
		hw := p.HighWatermark()
		if off >= hw {
			break
		}
		b, err := p.Read(nil, off, 1+reader*700)
		if err != nil {
			return fmt.Errorf("reader %d: read at %d: %w", reader, off, err)
		}
		if len(b) == 0 {
			return fmt.Errorf("reader %d: read at %d below HW %d returned nothing", reader, off, hw)
		}
		for len(b) > 0 {
			h, err := batch.DecodeBatch(b, func(r batch.Record) error {
				if r.Offset <= lastOff {
					return fmt.Errorf("offset %d after %d", r.Offset, lastOff)
				}
				lastOff = r.Offset
				key, vs, ok := strings.Cut(string(r.Value), "@")
				if !ok || key != string(r.Key) {
					return fmt.Errorf("record %d: key %q value %q", r.Offset, r.Key, r.Value)
				}
				v, _ := strconv.Atoi(vs)
				if v <= lastVer[key] {
					return fmt.Errorf("key %s: version %d at offset %d after version %d", key, v, r.Offset, lastVer[key])
				}
				lastVer[key] = v
				return nil
			})
			if err != nil {
				return fmt.Errorf("reader %d: batch at %d: %w", reader, off, err)
			}
			off = h.NextOffset()
			b = b[h.Size():]
		}
	}
	for k, v := range before {
		if lastVer[k] < v {
			return fmt.Errorf("reader %d: key %s: last version seen %d, acknowledged before the pass %d", reader, k, lastVer[k], v)
		}
	}
	return nil
}

// TestReadGapAfterRetention: a reader that took its bounds before retention moved the log start, and its
// snapshot after retention's commit, finds no batch at its offset, as in a compaction gap. The log start
// stored in its snapshot tells them apart: OFFSET_OUT_OF_RANGE, not the next batch. (Retention's commit
// is simulated here without telling the partition, which is the window a real reader can hit.)
func TestReadGapAfterRetention(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	useClock(s)
	p := mustPartition(t, s, pid)
	for i := range 4 {
		mustAppend(t, p, rec1(int64(i), fmt.Sprintf("k%d", i), "v"), rollEvery)
	}
	if err := s.DB().Update(func(txn *badger.Txn) error {
		if err := txn.Set(p.sprefix, encodeState(partState{logStart: 2, floor: 2})); err != nil {
			return err
		}
		for _, base := range []int64{0, 1} {
			if err := txn.Delete(batchKey(p.lprefix, base)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if p.LogStartOffset() != 0 {
		t.Fatal("the partition learnt of the simulated retention")
	}
	for _, off := range []int64{0, 1} {
		if _, err := p.Read(nil, off, 1<<20); !errors.Is(err, rerr.ErrOffsetOutOfRange) {
			t.Fatalf("read at %d deleted by retention: %v, want OFFSET_OUT_OF_RANGE", off, err)
		}
	}
	if b, err := p.Read(nil, 2, 1<<20); err != nil || len(decode(t, b)) != 2 {
		t.Fatalf("read at 2: %d bytes, %v", len(b), err)
	}
}

// TestReadCleanerOvertakesBounds: a read takes the HW, then (before its snapshot) new versions of every
// key are appended above it and the cleaner removes all batches from the read's offset up to that HW.
// The read must not answer empty below the HW, which would leave a consumer stuck there (a CI failure of
// TestCompactConcurrentReaders); it reads again with the new HW and returns the newer versions.
func TestReadCleanerOvertakesBounds(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	clock := useClock(s)
	p := mustPartition(t, s, pid)
	mustAppend(t, p, rec1(clock.now().UnixMilli(), "a", "a@1"), rollEvery) // offset 0
	mustAppend(t, p, rec1(clock.now().UnixMilli(), "b", "b@2"), rollEvery) // offset 1
	hooked := false
	testHookAfterBounds = func() {
		if hooked {
			return
		}
		hooked = true
		mustAppend(t, p, keyedBatch(clock.now().UnixMilli(), batch.CompressionNone,
			kv{key: "a", value: "a@3"}, kv{key: "b", value: "b@4"}), rollEvery) // offsets 2-3
		mustAppend(t, p, rec1(clock.now().UnixMilli(), "c", "c@5"), rollEvery) // offset 4, the last batch
		clock.advance(1)
		mustCompact(t, p, clock.now().UnixMilli(), eagerCfg)
	}
	t.Cleanup(func() { testHookAfterBounds = nil })
	b, err := p.Read(nil, 1, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if !hooked {
		t.Fatal("the hook did not run")
	}
	// The cleaner must have removed offsets 0 and 1 for the test to mean anything.
	testHookAfterBounds = nil
	if got, _ := readLog(t, p); len(got) != 3 || got[0].off != 2 {
		t.Fatalf("after the clean the log holds %v, want offsets 2, 3, 4", got)
	}
	got := decode(t, b)
	if len(got) == 0 || got[0].h.BaseOffset != 2 {
		t.Fatalf("read at 1 returned %d batches (first %+v), want the batch at 2", len(got), got)
	}
}

// txnBatch is a one-record transactional batch of producer pid (epoch 0).
func txnBatch(ts int64, pid int64, seq int32, key, value string) []byte {
	var b batch.Builder
	b.Append(ts, []byte(key), []byte(value), nil)
	b.SetProducer(pid, 0, seq)
	b.SetTransactional(true)
	return append([]byte(nil), b.Build(batch.CompressionNone)...)
}

// TestCompactTransactions: the cleaner drops the records of an aborted transaction (they never
// supersede the committed version of their key) and does not map or clean at or past the stable end,
// so a record of a still-open transaction does not make an older committed one obsolete (Kafka's
// cleaner: aborted records are removed, cleaning stops at the first unstable offset).
func TestCompactTransactions(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	clock := useClock(s)
	p := mustPartition(t, s, pid)
	ts := clock.now().UnixMilli()
	mustAppend(t, p, rec1(ts, "k1", "committed"), rollEvery)                                       // 0
	mustAppend(t, p, txnBatch(ts, 7, 0, "k1", "aborted"), rollEvery)                               // 1
	mustAppend(t, p, batch.BuildControl(7, 0, ts, batch.ControlMarker{FirstOffset: 1}), rollEvery) // 2: ABORT
	mustAppend(t, p, rec1(ts, "k2", "committed"), rollEvery)                                       // 3
	mustAppend(t, p, txnBatch(ts, 8, 0, "k2", "open"), rollEvery)                                  // 4: transaction still open
	mustAppend(t, p, rec1(ts, "k9", "last"), rollEvery)                                            // 5
	stableCalls := 0
	cfg := eagerCfg
	cfg.StableEnd = func() (int64, error) { stableCalls++; return 4, nil }
	clock.advance(1)
	st := mustCompact(t, p, clock.now().UnixMilli(), cfg)
	if stableCalls == 0 || st.CleanableEnd > 4 {
		t.Fatalf("stable end asked %d times, cleanable end %d (want <= 4)", stableCalls, st.CleanableEnd)
	}
	got, _ := readLog(t, p)
	var offs []int64
	vals := map[int64]string{}
	for _, r := range got {
		offs = append(offs, r.off)
		vals[r.off] = r.value
	}
	// Offset 1 (aborted) is gone; 0 stays (the aborted k1 does not supersede it); 3 stays (the open
	// transaction's k2 at 4 is past the stable end); the marker at 2 stays.
	want := []int64{0, 2, 3, 4, 5}
	if !slices.Equal(offs, want) || vals[0] != "committed" || vals[3] != "committed" {
		t.Fatalf("after the clean: offsets %v values %v, want offsets %v with the committed k1 and k2 kept", offs, vals, want)
	}
	// The marker survives the clean.
	b, err := p.Read(nil, 2, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := batch.ParseControl(b); err != nil || m.Commit || m.FirstOffset != 1 {
		t.Fatalf("the ABORT marker at 2: %+v, %v", m, err)
	}
}
