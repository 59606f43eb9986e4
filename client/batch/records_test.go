package batch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/snappy/xerial"
	"github.com/klauspost/compress/zstd"
	"github.com/runnel-io/runnel/api/rerr"
)

var codecs = []Compression{CompressionNone, CompressionGzip, CompressionSnappy, CompressionLZ4, CompressionZstd}

type testRecord struct {
	ts         int64
	key, value []byte
	headers    []RecordHeader
}

// sampleRecords covers null and empty keys and values (tombstones), headers with null and empty values,
// timestamps going backwards, and compressible and random payloads.
func sampleRecords(n int, seed uint64) []testRecord {
	rng := rand.New(rand.NewPCG(seed, seed))
	out := make([]testRecord, n)
	base := int64(1_700_000_000_000)
	for i := range out {
		r := &out[i]
		r.ts = base + int64(i) - int64(rng.IntN(50))
		switch i % 5 {
		case 0:
			r.key = nil
		case 1:
			r.key = []byte{}
		default:
			r.key = fmt.Appendf(nil, "key-%d", rng.IntN(20))
		}
		switch i % 7 {
		case 3:
			r.value = nil // tombstone
		case 4:
			r.value = []byte{}
		case 5:
			r.value = make([]byte, 300)
			for j := range r.value {
				r.value[j] = byte(rng.Uint32())
			}
		default:
			r.value = bytes.Repeat(fmt.Appendf(nil, "value %d ", i), 1+i%9)
		}
		if i%3 == 0 {
			r.headers = []RecordHeader{{Key: "traceparent", Value: []byte("00-abc-def-01")}, {Key: "", Value: nil}, {Key: "e", Value: []byte{}}}
		}
	}
	return out
}

func build(t testing.TB, b *Builder, recs []testRecord, c Compression) []byte {
	t.Helper()
	b.Reset()
	for _, r := range recs {
		want := b.RecordSize(r.ts, r.key, r.value, r.headers)
		before := b.Size()
		if got := b.Append(r.ts, r.key, r.value, r.headers); got != want || b.Size() != before+got {
			t.Fatalf("Append returned %d, RecordSize said %d, size went %d -> %d", got, want, before, b.Size())
		}
		if bound := RecordSize(r.key, r.value, r.headers); bound < want {
			t.Fatalf("RecordSize bound %d below exact size %d", bound, want)
		}
	}
	return bytes.Clone(b.Build(c))
}

func decodeAll(t testing.TB, raw []byte) (Header, []Record) {
	t.Helper()
	var got []Record
	h, err := DecodeBatch(raw, func(r Record) error { got = append(got, r); return nil })
	if err != nil {
		t.Fatalf("DecodeBatch: %v", err)
	}
	return h, got
}

func sameBytes(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }

func TestBuildDecodeRoundTrip(t *testing.T) {
	recs := sampleRecords(500, 1)
	var b Builder
	for _, c := range codecs {
		t.Run(c.String(), func(t *testing.T) {
			raw := build(t, &b, recs, c)
			h, err := Validate(raw)
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if h.Compression() != c {
				t.Fatalf("compression %v, want %v", h.Compression(), c)
			}
			if h.RecordCount != int32(len(recs)) || h.LastOffsetDelta != int32(len(recs)-1) || h.Size() != len(raw) {
				t.Fatalf("header %+v for %d records of %d bytes", h, len(recs), len(raw))
			}
			if h.ProducerID != -1 || h.ProducerEpoch != -1 || h.BaseSequence != -1 || h.PartitionLeaderEpoch != -1 || h.Magic != 2 {
				t.Fatalf("producer fields %+v", h)
			}
			maxTs := recs[0].ts
			for _, r := range recs {
				maxTs = max(maxTs, r.ts)
			}
			if h.BaseTimestamp != recs[0].ts || h.MaxTimestamp != maxTs {
				t.Fatalf("timestamps base %d max %d, want %d %d", h.BaseTimestamp, h.MaxTimestamp, recs[0].ts, maxTs)
			}
			// The broker assigns offsets by rewriting the header; decoding follows it.
			SetBaseOffset(raw, 1000)
			SetPartitionLeaderEpoch(raw, 7)
			_, got := decodeAll(t, raw)
			if len(got) != len(recs) {
				t.Fatalf("decoded %d records, want %d", len(got), len(recs))
			}
			for i, r := range got {
				w := recs[i]
				if r.Offset != 1000+int64(i) || r.Timestamp != w.ts || !sameBytes(r.Key, w.key) || !sameBytes(r.Value, w.value) || r.LeaderEpoch != 7 || r.Control {
					t.Fatalf("record %d = %+v, want %+v", i, r, w)
				}
				if len(r.Headers) != len(w.headers) {
					t.Fatalf("record %d headers %v, want %v", i, r.Headers, w.headers)
				}
				for j := range r.Headers {
					if r.Headers[j].Key != w.headers[j].Key || !sameBytes(r.Headers[j].Value, w.headers[j].Value) {
						t.Fatalf("record %d header %d = %+v, want %+v", i, j, r.Headers[j], w.headers[j])
					}
				}
			}
		})
	}
}

func TestCompressionShrinks(t *testing.T) {
	var b Builder
	recs := make([]testRecord, 1000)
	for i := range recs {
		recs[i] = testRecord{ts: 1, value: bytes.Repeat([]byte("abcdefgh"), 16)}
	}
	plain := len(build(t, &b, recs, CompressionNone))
	for _, c := range codecs[1:] {
		if n := len(build(t, &b, recs, c)); n*4 > plain {
			t.Errorf("%v: %d bytes from %d", c, n, plain)
		}
	}
}

// Incompressible records are sent uncompressed: attributes say none, and every reader copes.
func TestIncompressibleFallsBackToNone(t *testing.T) {
	var b Builder
	b.Reset()
	v := make([]byte, 64)
	for i := range v {
		v[i] = byte(rand.Uint32())
	}
	b.Append(5, nil, v, nil)
	raw := b.Build(CompressionGzip)
	h, err := Validate(raw)
	if err != nil || h.Compression() != CompressionNone {
		t.Fatalf("header %+v err %v", h, err)
	}
}

func TestBuilderReuseAndRebuild(t *testing.T) {
	var b Builder
	a := build(t, &b, sampleRecords(10, 2), CompressionZstd)
	c := build(t, &b, sampleRecords(3, 3), CompressionNone)
	if _, got := decodeAll(t, a); len(got) != 10 {
		t.Fatalf("first batch has %d records", len(got))
	}
	if _, got := decodeAll(t, c); len(got) != 3 {
		t.Fatalf("second batch has %d records", len(got))
	}
	// Build twice with another codec gives the same records.
	b.Reset()
	b.Append(1, []byte("k"), []byte("v"), nil)
	x := bytes.Clone(b.Build(CompressionLZ4))
	y := b.Build(CompressionNone)
	_, rx := decodeAll(t, x)
	_, ry := decodeAll(t, y)
	if string(rx[0].Value) != "v" || string(ry[0].Value) != "v" {
		t.Fatalf("rebuild lost the record")
	}
	// The zero Builder works, and Append after Build starts over.
	var z Builder
	z.Append(1, nil, []byte("a"), nil)
	z.Build(CompressionNone)
	z.Append(2, nil, []byte("b"), nil)
	if z.Len() != 1 {
		t.Fatalf("Append after Build kept %d records", z.Len())
	}
}

func TestLogAppendTimeAndControl(t *testing.T) {
	var b Builder
	raw := build(t, &b, sampleRecords(4, 4), CompressionSnappy)
	SetLogAppendTime(raw, 42)
	_, got := decodeAll(t, raw)
	for _, r := range got {
		if r.Timestamp != 42 {
			t.Fatalf("LogAppendTime batch gave timestamp %d", r.Timestamp)
		}
	}

	// A control batch (a COMMIT marker, as Kafka writes it) is reported so callers can skip it.
	b.Reset()
	b.Append(7, []byte{0, 0, 0, 1}, []byte{0, 0, 0, 0, 0, 0}, nil)
	ctl := bytes.Clone(b.Build(CompressionNone))
	attrs := binary.BigEndian.Uint16(ctl[21:]) | AttrControl | AttrTransactional
	binary.BigEndian.PutUint16(ctl[21:], attrs)
	binary.BigEndian.PutUint32(ctl[17:], Checksum(ctl))
	_, got = decodeAll(t, ctl)
	if len(got) != 1 || !got[0].Control || !got[0].Transactional {
		t.Fatalf("control batch decoded as %+v", got)
	}
}

// A snappy batch written by Kafka's Java client uses xerial framing; it must decode like raw snappy.
func TestSnappyXerialFraming(t *testing.T) {
	var b Builder
	recs := sampleRecords(300, 5)
	plain := build(t, &b, recs, CompressionNone)
	area := plain[HeaderSize:]
	framed := append(bytes.Clone(plain[:HeaderSize]), xerial.Encode(nil, area)...)
	binary.BigEndian.PutUint16(framed[21:], uint16(CompressionSnappy))
	binary.BigEndian.PutUint32(framed[8:], uint32(len(framed)-12))
	binary.BigEndian.PutUint32(framed[17:], Checksum(framed))
	_, got := decodeAll(t, framed)
	if len(got) != len(recs) || !sameBytes(got[299].Value, recs[299].value) {
		t.Fatalf("xerial batch decoded %d records", len(got))
	}
}

// withArea returns plain's header over a new record area (compressed with c), with length and CRC fixed.
func withArea(plain []byte, c Compression, area []byte) []byte {
	out := append(bytes.Clone(plain[:HeaderSize]), area...)
	binary.BigEndian.PutUint16(out[21:], uint16(c))
	binary.BigEndian.PutUint32(out[8:], uint32(len(out)-12))
	binary.BigEndian.PutUint32(out[17:], Checksum(out))
	return out
}

func TestDecompressionBombsAreRefused(t *testing.T) {
	var b Builder
	plain := build(t, &b, sampleRecords(1, 6), CompressionNone)
	huge := make([]byte, MaxUncompressedSize+1024)

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(huge)
	zw.Close()
	enc, _ := zstd.NewWriter(nil)
	zs := enc.EncodeAll(huge, nil)
	enc.Close()
	// A raw snappy block claiming 1 GiB in a few bytes.
	snap := binary.AppendUvarint(nil, 1<<30)
	snap = append(snap, 0, 0, 0)

	for _, tc := range []struct {
		c    Compression
		area []byte
	}{{CompressionGzip, gz.Bytes()}, {CompressionZstd, zs}, {CompressionSnappy, snap}} {
		err := DecodeRecords(withArea(plain, tc.c, tc.area), func(Record) error { return nil })
		if !errors.Is(err, rerr.ErrCorruptMessage) {
			t.Errorf("%v bomb: err %v, want CORRUPT_MESSAGE", tc.c, err)
		}
	}
}

func TestDecodeCorruptInputs(t *testing.T) {
	var b Builder
	good := build(t, &b, sampleRecords(20, 7), CompressionNone)
	gz := build(t, &b, sampleRecords(20, 7), CompressionGzip)
	cases := map[string][]byte{
		"empty":     nil,
		"short":     good[:30],
		"truncated": good[:len(good)-1],
		"bad crc":   func() []byte { x := bytes.Clone(good); x[len(x)-1] ^= 1; return x }(),
		"count too big": func() []byte {
			x := bytes.Clone(good)
			binary.BigEndian.PutUint32(x[57:], 21)
			binary.BigEndian.PutUint32(x[23:], 20)
			binary.BigEndian.PutUint32(x[17:], Checksum(x))
			return x
		}(),
		"garbage gzip": withArea(gz, CompressionGzip, []byte("not gzip at all")),
		"garbage lz4":  withArea(gz, CompressionLZ4, []byte("not lz4 at all")),
		"garbage zstd": withArea(gz, CompressionZstd, []byte("not zstd at all")),
		"garbage snap": withArea(gz, CompressionSnappy, []byte{0xff, 0xff, 0xff, 0xff, 0x0f, 1}),
		"bad codec": func() []byte {
			x := bytes.Clone(good)
			binary.BigEndian.PutUint16(x[21:], 6)
			binary.BigEndian.PutUint32(x[17:], Checksum(x))
			return x
		}(),
		// A compressed area whose records do not tile it.
		"short records": withArea(gz, CompressionSnappy, snappyOf(good[HeaderSize:len(good)-3])),
	}
	for name, raw := range cases {
		n := 0
		err := DecodeRecords(raw, func(Record) error { n++; return nil })
		if !errors.Is(err, rerr.ErrCorruptMessage) {
			t.Errorf("%s: err %v after %d records, want CORRUPT_MESSAGE", name, err, n)
		}
	}
	stop := errors.New("stop")
	if err := DecodeRecords(good, func(Record) error { return stop }); err != stop {
		t.Fatalf("callback error came back as %v", err)
	}
}

func snappyOf(b []byte) []byte { return compress(CompressionSnappy, nil, b) }

func BenchmarkBuilderAppend(b *testing.B) {
	var bl Builder
	bl.Reset()
	v := bytes.Repeat([]byte("x"), 100)
	b.ReportAllocs()
	b.SetBytes(100)
	for i := 0; b.Loop(); i++ {
		if bl.Size() > 1<<20 {
			bl.Build(CompressionNone)
			bl.Reset()
		}
		bl.Append(int64(i), nil, v, nil)
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, c := range codecs {
		b.Run(c.String(), func(b *testing.B) {
			var bl Builder
			raw := build(b, &bl, sampleRecords(5000, 9), c)
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if err := DecodeRecords(raw, func(Record) error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// SetProducer's fields land in the header under the CRC, for every codec, survive a second Build, and
// are cleared by Reset and by an Append after Build.
func TestSetProducer(t *testing.T) {
	recs := sampleRecords(40, 3)
	var b Builder
	for _, c := range codecs {
		t.Run(c.String(), func(t *testing.T) {
			b.Reset()
			for _, r := range recs {
				b.Append(r.ts, r.key, r.value, r.headers)
			}
			b.SetProducer(1<<40+7, 3, math.MaxInt32-5)
			for range 2 { // Build may be called again until the next Reset
				raw := bytes.Clone(b.Build(c))
				h, err := Validate(raw)
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				if h.ProducerID != 1<<40+7 || h.ProducerEpoch != 3 || h.BaseSequence != math.MaxInt32-5 || h.RecordCount != int32(len(recs)) {
					t.Fatalf("header %+v", h)
				}
				_, got := decodeAll(t, raw)
				if len(got) != len(recs) || got[0].ProducerID != 1<<40+7 {
					t.Fatalf("decoded %d records, producer id %d", len(got), got[0].ProducerID)
				}
				// The producer fields are covered by the CRC.
				for _, at := range []int{43, 51, 53, 56} {
					bad := bytes.Clone(raw)
					bad[at] ^= 1
					if _, err := Validate(bad); !errors.Is(err, rerr.ErrCorruptMessage) {
						t.Fatalf("byte %d changed, Validate: %v", at, err)
					}
				}
			}
			// Reset goes back to "no producer".
			b.Reset()
			b.Append(1, nil, []byte("x"), nil)
			if h, _ := Validate(b.Build(c)); h.ProducerID != -1 || h.ProducerEpoch != -1 || h.BaseSequence != -1 {
				t.Fatalf("after Reset: %+v", h)
			}
			// So does an Append after Build, which starts a new batch.
			b.SetProducer(9, 0, 0)
			b.Build(c)
			b.Append(2, nil, []byte("y"), nil)
			if h, _ := Validate(b.Build(c)); h.ProducerID != -1 || h.BaseSequence != -1 || h.RecordCount != 1 {
				t.Fatalf("after Append following Build: %+v", h)
			}
			// The zero Builder has no producer either.
			var z Builder
			z.Append(1, nil, nil, nil)
			if h, _ := Validate(z.Build(c)); h.ProducerID != -1 || h.ProducerEpoch != -1 || h.BaseSequence != -1 {
				t.Fatalf("zero Builder: %+v", h)
			}
		})
	}
}

// NextSequence wraps as Kafka's DefaultRecordBatch.incrementSequence: MaxInt32 is followed by 0.
func TestNextSequence(t *testing.T) {
	for _, tc := range []struct{ seq, count, want int32 }{
		{0, 0, 0},
		{0, 1, 1},
		{0, 500, 500},
		{100, 23, 123},
		{math.MaxInt32 - 5, 5, math.MaxInt32},
		{math.MaxInt32 - 4, 5, 0},
		{math.MaxInt32, 1, 0},
		{math.MaxInt32, 3, 2},
		{math.MaxInt32 - 2, 10, 7},
		{math.MaxInt32, math.MaxInt32, math.MaxInt32 - 1},
	} {
		if got := NextSequence(tc.seq, tc.count); got != tc.want {
			t.Errorf("NextSequence(%d, %d) = %d, want %d", tc.seq, tc.count, got, tc.want)
		}
	}
	// Record by record, the sequence visits every value and wraps after MaxInt32.
	seq := int32(math.MaxInt32 - 2)
	for _, want := range []int32{math.MaxInt32 - 1, math.MaxInt32, 0, 1} {
		if seq = NextSequence(seq, 1); seq != want {
			t.Fatalf("got %d, want %d", seq, want)
		}
	}
}
