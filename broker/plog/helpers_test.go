package plog

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/snappy"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/runnel-io/runnel/client/batch"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(kill9Env); dir != "" {
		kill9Child(dir) // never returns
	}
	if dir := os.Getenv(closeGoneEnv); dir != "" {
		closeGoneChild(dir) // never returns
	}
	goleak.VerifyTestMain(m)
}

// rec is one record to encode into a test batch.
type rec struct {
	ts         int64
	key, value []byte
}

// codecXerialSnappy asks makeBatch for snappy in the Java client's xerial framing.
const codecXerialSnappy batch.Compression = 100

// makeBatch encodes recs as a valid RecordBatch v2 (CRC set, base offset 0) compressed with codec.
func makeBatch(t testing.TB, codec batch.Compression, recs ...rec) []byte {
	t.Helper()
	if len(recs) == 0 {
		t.Fatal("makeBatch without records")
	}
	baseTs, maxTs := recs[0].ts, recs[0].ts
	for _, r := range recs {
		maxTs = max(maxTs, r.ts)
	}
	var area []byte
	for i, r := range recs {
		kr := kmsg.Record{TimestampDelta64: r.ts - baseTs, OffsetDelta: int32(i), Key: r.key, Value: r.value}
		kr.Length = int32(len(kr.AppendTo(nil)) - 1) // the zero length took one byte
		area = kr.AppendTo(area)
	}
	attrs := int16(codec)
	switch codec {
	case batch.CompressionNone:
	case codecXerialSnappy:
		attrs = int16(batch.CompressionSnappy)
		area = xerialSnappy(area)
	default:
		area = compress(t, codec, area)
	}
	rb := kmsg.RecordBatch{
		FirstOffset:          0,
		PartitionLeaderEpoch: -1,
		Magic:                batch.Magic,
		Attributes:           attrs,
		LastOffsetDelta:      int32(len(recs) - 1),
		FirstTimestamp:       baseTs,
		MaxTimestamp:         maxTs,
		ProducerID:           -1,
		ProducerEpoch:        -1,
		FirstSequence:        -1,
		NumRecords:           int32(len(recs)),
		Records:              area,
	}
	rb.Length = int32(batch.HeaderSize - 12 + len(area))
	b := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(b[17:], batch.Checksum(b))
	if _, err := batch.Validate(b); err != nil {
		t.Fatalf("test batch does not validate: %v", err)
	}
	return b
}

func compress(t testing.TB, codec batch.Compression, in []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.WriteCloser
	switch codec {
	case batch.CompressionGzip:
		w = gzip.NewWriter(&buf)
	case batch.CompressionSnappy:
		return snappy.Encode(nil, in)
	case batch.CompressionLZ4:
		w = lz4.NewWriter(&buf)
	case batch.CompressionZstd:
		zw, err := zstd.NewWriter(&buf)
		if err != nil {
			t.Fatal(err)
		}
		w = zw
	default:
		t.Fatalf("codec %d", codec)
	}
	if _, err := w.Write(in); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// xerialSnappy frames in as the Java snappy library does, in two chunks to exercise the chunk loop.
func xerialSnappy(in []byte) []byte {
	out := append([]byte{}, xerialMagic...)
	out = binary.BigEndian.AppendUint32(out, 1)
	out = binary.BigEndian.AppendUint32(out, 1)
	half := len(in) / 2
	for _, part := range [][]byte{in[:half], in[half:]} {
		c := snappy.Encode(nil, part)
		out = binary.BigEndian.AppendUint32(out, uint32(len(c)))
		out = append(out, c...)
	}
	return out
}

// valueBatch is an uncompressed batch of n records with values "<tag>#<i>" and timestamp ts.
func valueBatch(t testing.TB, tag string, n int, ts int64) []byte {
	recs := make([]rec, n)
	for i := range recs {
		recs[i] = rec{ts: ts, value: []byte(tag + "#" + strconv.Itoa(i))}
	}
	return makeBatch(t, batch.CompressionNone, recs...)
}

// sizedBatch is an uncompressed one-record batch of size bytes (>= 80) with timestamp ts.
func sizedBatch(t testing.TB, size int, ts int64) []byte {
	t.Helper()
	v := size - 70
	for range 8 {
		b := makeBatch(t, batch.CompressionNone, rec{ts: ts, value: make([]byte, v)})
		if len(b) == size {
			return b
		}
		v += size - len(b)
	}
	t.Fatalf("no batch of exactly %d bytes", size)
	return nil
}

// stored is one batch as read back.
type stored struct {
	h      batch.Header
	values [][]byte
}

// decode splits read output into validated batches (CRC checked) and decodes uncompressed records.
func decode(t testing.TB, b []byte) []stored {
	t.Helper()
	var out []stored
	err := batch.Split(b, func(one []byte, h batch.Header) error {
		s := stored{h: h}
		if h.Compression() == batch.CompressionNone {
			area := one[batch.HeaderSize:]
			for len(area) > 0 {
				var r kmsg.Record
				if err := r.ReadFrom(area); err != nil {
					return err
				}
				l, n := binary.Varint(area)
				area = area[n+int(l):]
				s.values = append(s.values, r.Value)
			}
		}
		out = append(out, s)
		return nil
	})
	if err != nil {
		t.Fatalf("decode read output: %v", err)
	}
	return out
}

// testOptions are small options for a store in a fresh temporary directory.
func testOptions(t testing.TB, fsync bool) Options {
	o := DefaultOptions(t.TempDir())
	o.MemTableSize = 4 << 20
	o.NumMemtables = 2
	o.BlockCacheSize = 4 << 20
	o.IndexCacheSize = 2 << 20
	o.ValueLogFileSize = 16 << 20
	o.Fsync = fsync
	o.GCInterval = -1
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return o
}

func openStore(t testing.TB, o Options) *Store {
	t.Helper()
	s, err := Open(o)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustPartition(t testing.TB, s *Store, id PartitionID) *Partition {
	t.Helper()
	p, err := s.Partition(id)
	if err != nil {
		t.Fatalf("partition %s: %v", id, err)
	}
	return p
}

func mustAppend(t testing.TB, p *Partition, b []byte, opts AppendOptions) AppendResult {
	t.Helper()
	res, err := p.Append(context.Background(), b, opts)
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	return res
}

var syncAppend = AppendOptions{Sync: true, LogAppendTime: -1}

// readAll reads every batch from offset to the HW.
func readAll(t testing.TB, p *Partition, from int64) []stored {
	t.Helper()
	var out []stored
	for off := from; off < p.HighWatermark(); {
		b, err := p.Read(nil, off, 1<<20)
		if err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		got := decode(t, b)
		if len(got) == 0 {
			t.Fatalf("read at %d below HW %d returned nothing", off, p.HighWatermark())
		}
		out = append(out, got...)
		off = got[len(got)-1].h.NextOffset()
	}
	return out
}

// waitFor polls cond until it holds or timeout passes (tests poll, never sleep for a condition).
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// closed reports whether ch is closed within timeout.
func closedWithin(ch <-chan struct{}, timeout time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	select {
	case <-ch:
		return true
	case <-time.After(timeout):
		return false
	}
}

func isErr(err, target error) bool { return errors.Is(err, target) }

// newestVlog returns the highest value-log file number in dir: the active file (0 when it has none).
func newestVlog(dir string) uint64 {
	var fid uint64
	if fs, err := badgerLogFiles(dir); err == nil {
		for _, lf := range fs {
			if lf.vlog {
				fid = max(fid, lf.fid)
			}
		}
	}
	return fid
}
