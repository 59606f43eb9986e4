package batch

import (
	"bytes"
	"errors"
	"testing"

	"github.com/runnel-io/runnel/api/rerr"
)

// fuzzSeeds are valid batches of every codec plus a few damaged ones, so the fuzzer starts from inputs
// that reach the record and decompression code.
func fuzzSeeds(f *testing.F) {
	var b Builder
	for i, c := range codecs {
		f.Add(build(f, &b, sampleRecords(1+i*7, uint64(i)), c))
	}
	two := append(build(f, &b, sampleRecords(2, 9), CompressionNone), build(f, &b, sampleRecords(3, 10), CompressionLZ4)...)
	f.Add(two)
	f.Add(build(f, &b, sampleRecords(5, 11), CompressionGzip)[:70])
	f.Add([]byte{})
}

// FuzzParseHeader checks that header parsing and validation never panic and that an accepted header
// describes bytes that are really there.
func FuzzParseHeader(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b)
		if err != nil {
			if !errors.Is(err, rerr.ErrCorruptMessage) && !errors.Is(err, rerr.ErrUnsupportedForFormat) {
				t.Fatalf("ParseHeader error outside the catalogue: %v", err)
			}
			return
		}
		if h.Size() > len(b) || h.Size() < HeaderSize {
			t.Fatalf("accepted header of size %d over %d bytes", h.Size(), len(b))
		}
		if _, err := Validate(b); err == nil {
			_ = Split(b, func(bt []byte, h Header) error {
				if len(bt) != h.Size() {
					t.Fatalf("Split gave %d bytes for a %d-byte batch", len(bt), h.Size())
				}
				return nil
			})
		}
	})
}

// FuzzDecodeRecords checks that decoding never panics, that errors are catalogue errors, and that a batch
// that decodes re-encodes (uncompressed) to a batch that decodes to the same records.
func FuzzDecodeRecords(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		var recs []Record
		h, err := DecodeBatch(b, func(r Record) error { recs = append(recs, r); return nil })
		if err != nil {
			if !errors.Is(err, rerr.ErrCorruptMessage) && !errors.Is(err, rerr.ErrUnsupportedForFormat) {
				t.Fatalf("DecodeBatch error outside the catalogue: %v", err)
			}
			return
		}
		if len(recs) != int(h.RecordCount) {
			t.Fatalf("decoded %d records from a header saying %d", len(recs), h.RecordCount)
		}
		if h.Attributes&AttrLogAppendTime != 0 || len(recs) == 0 {
			return // timestamps of LogAppendTime batches do not survive a re-encode
		}
		var bl Builder
		bl.Reset()
		for _, r := range recs {
			bl.Append(r.Timestamp, r.Key, r.Value, r.Headers)
		}
		raw := bl.Build(CompressionNone)
		SetBaseOffset(raw, h.BaseOffset)
		i := 0
		err = DecodeRecords(raw, func(r Record) error {
			w := recs[i]
			i++
			if r.Timestamp != w.Timestamp || !bytes.Equal(r.Key, w.Key) || (r.Key == nil) != (w.Key == nil) ||
				!bytes.Equal(r.Value, w.Value) || (r.Value == nil) != (w.Value == nil) || len(r.Headers) != len(w.Headers) {
				t.Fatalf("re-encoded record %d = %+v, want %+v", i-1, r, w)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
	})
}
