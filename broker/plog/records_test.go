package plog

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/runnel-io/runnel/api/rerr"
	"github.com/runnel-io/runnel/client/batch"
)

// TestFindTimestampCorrupt: damaged records give CORRUPT_MESSAGE, never a panic or a wrong answer.
func TestFindTimestampCorrupt(t *testing.T) {
	recs := []rec{{ts: 10, value: []byte("a")}, {ts: 20, value: []byte("b")}}
	for _, codec := range []batch.Compression{batch.CompressionNone, batch.CompressionGzip, batch.CompressionSnappy,
		batch.CompressionLZ4, batch.CompressionZstd} {
		good := makeBatch(t, codec, recs...)
		h, err := batch.ParseHeader(good)
		if err != nil {
			t.Fatal(err)
		}
		if off, ts, found, err := findTimestamp(good, h, 15); err != nil || !found || off != 1 || ts != 20 {
			t.Fatalf("codec %d: %d %d %v %v", codec, off, ts, found, err)
		}
		bad := append([]byte{}, good[:batch.HeaderSize]...)
		bad = append(bad, bytes.Repeat([]byte{0xff}, 20)...)
		if _, _, _, err := findTimestamp(bad, h, 15); !isErr(err, rerr.ErrCorruptMessage) {
			t.Errorf("codec %d, garbage records: %v", codec, err)
		}
		if _, _, _, err := findTimestamp(good[:batch.HeaderSize+(len(good)-batch.HeaderSize)/2], h, 100); !isErr(err, rerr.ErrCorruptMessage) {
			t.Errorf("codec %d, truncated records: %v", codec, err)
		}
	}
	// A snappy block claiming a huge output is refused before allocating it.
	bomb := binary.AppendUvarint(nil, 200<<20)
	if _, err := decodeSnappy(append(bomb, 0)); err == nil {
		t.Error("snappy length bomb accepted")
	}
}

// FuzzFindTimestamp feeds damaged stored batches to the record scanner (stored compressed records are
// not validated on append, so they are untrusted bytes).
func FuzzFindTimestamp(f *testing.F) {
	recs := []rec{{ts: 10, key: []byte("k"), value: []byte("a")}, {ts: 20, value: bytes.Repeat([]byte("b"), 100)}}
	for _, codec := range []batch.Compression{batch.CompressionNone, batch.CompressionGzip, batch.CompressionSnappy,
		codecXerialSnappy, batch.CompressionLZ4, batch.CompressionZstd} {
		f.Add(makeBatch(f, codec, recs...), int64(15))
	}
	f.Fuzz(func(t *testing.T, b []byte, ts int64) {
		h, err := batch.ParseHeader(b)
		if err != nil {
			return
		}
		_, _, _, _ = findTimestamp(b[:h.Size()], h, ts)
	})
}
