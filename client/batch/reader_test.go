package batch

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/runnel-io/runnel/api/rerr"
)

// readAll reads b with a Reader: OpenBatch, Check, then Next until the end. It
// returns the records and the first error (of OpenBatch, Check, or Next after a Check that passed,
// which must not happen).
func readAll(t testing.TB, b []byte) ([]Record, error) {
	rd, err := OpenBatch(b)
	if err != nil {
		return nil, err
	}
	if err := rd.Check(); err != nil {
		return nil, err
	}
	var out []Record
	for {
		var r Record
		ok, err := rd.Next(&r)
		if err != nil {
			t.Fatalf("Next failed after Check accepted the batch: %v", err)
		}
		if !ok {
			return out, nil
		}
		out = append(out, r)
	}
}

// decodeOrErr is DecodeBatch's verdict: all records, or its error (and none).
func decodeOrErr(b []byte) ([]Record, error) {
	var out []Record
	_, err := DecodeBatch(b, func(r Record) error { out = append(out, r); return nil })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// sameVerdict fails unless the Reader and DecodeBatch agree on b: the same records, or the same error.
func sameVerdict(t testing.TB, b []byte) {
	want, werr := decodeOrErr(b)
	got, gerr := readAll(t, b)
	if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() {
		t.Fatalf("Reader error %v, DecodeBatch error %v", gerr, werr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Reader read %+v, DecodeBatch %+v", got, want)
	}
}

// TestReaderMatchesDecodeBatch checks Reader against DecodeBatch on valid batches of every codec,
// control and LogAppendTime batches, and on damaged copies of them: the same records, or the same error.
func TestReaderMatchesDecodeBatch(t *testing.T) {
	var bl Builder
	var inputs [][]byte
	for i, c := range codecs {
		inputs = append(inputs, build(t, &bl, sampleRecords(1+i*13, uint64(i)), c))
	}
	ctl := append([]byte(nil), build(t, &bl, sampleRecords(3, 7), CompressionNone)...)
	binary.BigEndian.PutUint16(ctl[21:], AttrControl|AttrLogAppendTime)
	binary.BigEndian.PutUint32(ctl[17:], Checksum(ctl))
	inputs = append(inputs, ctl)

	rnd := rand.New(rand.NewPCG(1, 2))
	for _, b := range inputs {
		sameVerdict(t, b)
		// Damage inside the records, with the CRC fixed up so the damage reaches the record code.
		for range 300 {
			d := append([]byte(nil), b...)
			for range 1 + rnd.IntN(3) {
				d[HeaderSize+rnd.IntN(len(d)-HeaderSize)] = byte(rnd.Uint32())
			}
			binary.BigEndian.PutUint32(d[17:], Checksum(d))
			sameVerdict(t, d)
		}
		// Damage anywhere, CRC left as it is.
		d := append([]byte(nil), b...)
		d[rnd.IntN(len(d))] ^= 0x40
		sameVerdict(t, d)
	}
}

// TestCheckRecordMatchesRead holds checkRecord (Check's walk, which decodes nothing) to
// readRecord on mutated record bodies: the same verdict, in the same words.
func TestCheckRecordMatchesRead(t *testing.T) {
	var bl Builder
	raw := build(t, &bl, sampleRecords(40, 3), CompressionNone)
	area := raw[HeaderSize:]
	var bodies [][]byte
	for pos := 0; pos < len(area); {
		n, w := binary.Varint(area[pos:])
		bodies = append(bodies, area[pos+w:pos+w+int(n)])
		pos += w + int(n)
	}
	// Multi-byte varints (large deltas and lengths, negative timestamps deltas) and headers too.
	var big Builder
	big.Append(1<<40, make([]byte, 300), nil, []RecordHeader{{Key: "k", Value: []byte("v")}, {Key: "n"}})
	big.Append(1<<40-5000, nil, make([]byte, 70), nil)
	braw := big.Build(CompressionNone)
	for pos, a := 0, braw[HeaderSize:]; pos < len(a); {
		n, w := binary.Varint(a[pos:])
		bodies = append(bodies, a[pos+w:pos+w+int(n)])
		pos += w + int(n)
	}
	rnd := rand.New(rand.NewPCG(3, 4))
	for _, body := range bodies {
		for range 200 {
			d := append([]byte(nil), body...)
			for range 1 + rnd.IntN(2) {
				d[rnd.IntN(len(d))] = byte(rnd.Uint32())
			}
			if rnd.IntN(4) == 0 {
				d = d[:max(6, rnd.IntN(len(d)+1))]
			}
			var rec Record
			_, _, wp := readRecord(d, &rec)
			if p := checkRecord(d); p != wp {
				t.Fatalf("body %x: checkRecord %q, readRecord %q", d, p, wp)
			}
		}
	}
}

// FuzzReader checks that Reader never panics and agrees with DecodeBatch on any input, and that
// PeekOffset and Skip, the consumer's way past a record that does not decode, never panic, never loop,
// and give a record that decodes its own offset.
func FuzzReader(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, werr := decodeOrErr(b)
		_, gerr := readAll(t, b)
		if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() {
			t.Fatalf("Reader error %v, DecodeBatch error %v", gerr, werr)
		}
		rd, err := OpenBatch(b)
		if err != nil {
			return
		}
		for i := int32(0); ; i++ {
			if i > rd.Header().RecordCount {
				t.Fatalf("more than the header's %d records walked", rd.Header().RecordCount)
			}
			off, more := rd.PeekOffset()
			if !more {
				return
			}
			next := rd // a copy: Next moves it when the record decodes
			var r Record
			h := rd.Header()
			// A delta that cannot be right (below the index, past LastOffsetDelta) is replaced by the index.
			if ok, err := next.Next(&r); err == nil && ok {
				want := r.Offset
				if d := r.Offset - h.BaseOffset; d < int64(i) || d > int64(h.LastOffsetDelta) {
					want = h.BaseOffset + int64(i)
				}
				if off != want {
					t.Fatalf("record %d: PeekOffset %d, want %d (Next read %d)", i, off, want, r.Offset)
				}
			}
			if err := rd.Skip(); err != nil {
				return // its length is damaged: nothing after it can be found
			}
		}
	})
}

// TestCompressedRecordCountMustFit: a compressed batch's record count is not bounded by its framing
// (Validate cannot walk compressed records), and a consumer sizes memory by it before decoding, so
// OpenBatch and DecodeBatch refuse a count its decompressed records cannot hold.
func TestCompressedRecordCountMustFit(t *testing.T) {
	var bl Builder
	for _, c := range []Compression{CompressionGzip, CompressionSnappy, CompressionLZ4, CompressionZstd} {
		raw := append([]byte(nil), build(t, &bl, sampleRecords(40, 7), c)...)
		if h, err := OpenBatch(raw); err != nil || h.Header().Compression() != c {
			t.Fatalf("%v: the intact batch: %v, compression %v", c, err, h.Header().Compression())
		}
		binary.BigEndian.PutUint32(raw[57:], 1<<30) // record count
		binary.BigEndian.PutUint32(raw[23:], 1<<30) // last offset delta, which must cover it
		binary.BigEndian.PutUint32(raw[17:], Checksum(raw))
		_, oerr := OpenBatch(raw)
		_, derr := DecodeBatch(raw, func(Record) error { return nil })
		for _, err := range []error{oerr, derr} {
			if !errors.Is(err, rerr.ErrCorruptMessage) || !strings.Contains(err.Error(), "cannot fit") {
				t.Fatalf("%v: a count of 2^30 records: %v, want CORRUPT_MESSAGE (cannot fit)", c, err)
			}
		}
	}
}

// TestSkipShortRecord: Validate accepts any record length that fits the batch, so an uncompressed
// batch can hold a record too short to decode; Skip, which a consumer uses to resume past such a
// record, must pass over it by its length alone.
func TestSkipShortRecord(t *testing.T) {
	var bl Builder
	for _, v := range []string{"a", "b", "c"} {
		bl.Append(1_700_000_000_000, nil, []byte(v), nil)
	}
	raw := append([]byte(nil), bl.Build(CompressionNone)...)
	// Each record here is 8 bytes: its length (1) and a 7-byte body. Record 1 becomes 2 bytes of body.
	area := raw[HeaderSize:]
	short := slices.Concat(raw[:HeaderSize], area[:8], []byte{0x04, 0, 0}, area[16:])
	binary.BigEndian.PutUint32(short[8:], uint32(len(short)-12))
	binary.BigEndian.PutUint32(short[17:], Checksum(short))
	rd, err := OpenBatch(short)
	if err != nil {
		t.Fatalf("the broker's checks accept the batch, OpenBatch must too: %v", err)
	}
	var r Record
	if ok, err := rd.Next(&r); !ok || err != nil || string(r.Value) != "a" {
		t.Fatalf("record 0: %v %v %q", ok, err, r.Value)
	}
	if off, more := rd.PeekOffset(); !more || off != r.Offset+1 {
		t.Fatalf("PeekOffset of the short record: %d %v, want %d", off, more, r.Offset+1)
	}
	if _, err := rd.Next(&r); !errors.Is(err, rerr.ErrCorruptMessage) {
		t.Fatalf("Next on the short record: %v, want CORRUPT_MESSAGE", err)
	}
	if err := rd.Skip(); err != nil {
		t.Fatalf("Skip over the short record: %v", err)
	}
	if ok, err := rd.Next(&r); !ok || err != nil || string(r.Value) != "c" {
		t.Fatalf("record 2 after the skip: %v %v %q", ok, err, r.Value)
	}
}
