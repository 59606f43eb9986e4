package plog

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/snappy"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
)

// maxDecompressed caps the bytes decompressing one stored batch may produce (256 MiB). Compressed records
// are not checked on append (only consumers decompress), so a stored batch can be a decompression bomb;
// records are scanned as a stream, so this bounds CPU time, not memory.
const maxDecompressed = 256 << 20

// maxZstdMemory caps the memory a zstd frame may ask for (its window): 64 MiB, far above the 8 MiB
// windows producers use, far below what a hostile frame could claim.
const maxZstdMemory = 64 << 20

// xerialMagic starts snappy data in the framing of the Java snappy library ("xerial"), which Kafka's Java
// producer uses; franz-go and librdkafka write raw snappy blocks.
var xerialMagic = []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

// findTimestamp returns the offset and timestamp of the first record in b (one whole batch with header
// h) whose timestamp is >= ts. Only the fields ahead of the key are decoded; the rest of each record is
// skipped.
func findTimestamp(b []byte, h batch.Header, ts int64) (offset, timestamp int64, found bool, err error) {
	if h.Attributes&batch.AttrLogAppendTime != 0 {
		// The broker's time applies to every record; the record fields keep the producer's.
		if h.MaxTimestamp >= ts {
			return h.BaseOffset, h.MaxTimestamp, true, nil
		}
		return 0, 0, false, nil
	}
	src, closer, err := recordStream(h.Compression(), b[batch.HeaderSize:])
	if err != nil {
		return 0, 0, false, corrupt(h, "%v", err)
	}
	defer closer()
	r := &countingReader{r: bufio.NewReaderSize(io.LimitReader(src, maxDecompressed), 16<<10)}
	for i := int32(0); i < h.RecordCount; i++ {
		length, err := binary.ReadVarint(r)
		if err != nil || length < 3 {
			return 0, 0, false, corrupt(h, "record %d: bad length %d (%v)", i, length, err)
		}
		start := r.n
		if _, err := r.ReadByte(); err != nil { // attributes, unused
			return 0, 0, false, corrupt(h, "record %d: %v", i, err)
		}
		tsDelta, err := binary.ReadVarint(r)
		if err != nil {
			return 0, 0, false, corrupt(h, "record %d timestamp: %v", i, err)
		}
		offDelta, err := binary.ReadVarint(r)
		if err != nil {
			return 0, 0, false, corrupt(h, "record %d offset delta: %v", i, err)
		}
		if rts := h.BaseTimestamp + tsDelta; rts >= ts {
			return h.BaseOffset + offDelta, rts, true, nil
		}
		skip := length - (r.n - start)
		if skip < 0 {
			return 0, 0, false, corrupt(h, "record %d: length %d shorter than its fields", i, length)
		}
		if err := r.discard(skip); err != nil {
			return 0, 0, false, corrupt(h, "record %d: %v", i, err)
		}
	}
	return 0, 0, false, nil
}

func corrupt(h batch.Header, format string, args ...any) error {
	return rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "batch at %d (%d records, codec %d): %s",
		h.BaseOffset, h.RecordCount, h.Compression(), fmt.Sprintf(format, args...))
}

// countingReader counts the bytes read, to skip the rest of a record after its first fields.
type countingReader struct {
	r *bufio.Reader
	n int64
}

func (c *countingReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.n++
	}
	return b, err
}

func (c *countingReader) discard(n int64) error {
	for n > 0 {
		step := int(min(n, 1<<30))
		d, err := c.r.Discard(step)
		c.n += int64(d)
		n -= int64(d)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// recordStream returns the records area of a batch decompressed with codec, and a function that frees
// the decoder.
func recordStream(codec batch.Compression, area []byte) (io.Reader, func(), error) {
	nop := func() {}
	switch codec {
	case batch.CompressionNone:
		return bytes.NewReader(area), nop, nil
	case batch.CompressionGzip:
		zr, err := gzip.NewReader(bytes.NewReader(area))
		if err != nil {
			return nil, nop, fmt.Errorf("gzip: %w", err)
		}
		return zr, func() { _ = zr.Close() }, nil
	case batch.CompressionSnappy:
		out, err := decodeSnappy(area)
		if err != nil {
			return nil, nop, fmt.Errorf("snappy: %w", err)
		}
		return bytes.NewReader(out), nop, nil
	case batch.CompressionLZ4:
		return lz4.NewReader(bytes.NewReader(area)), nop, nil
	case batch.CompressionZstd:
		zr, err := zstd.NewReader(bytes.NewReader(area), zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxMemory(maxZstdMemory))
		if err != nil {
			return nil, nop, fmt.Errorf("zstd: %w", err)
		}
		return zr, zr.Close, nil
	}
	return nil, nop, fmt.Errorf("unknown compression codec %d", codec)
}

// decodeSnappy decodes a raw snappy block or xerial-framed snappy chunks (magic, two 4-byte versions,
// then 4-byte big-endian length + block, repeated).
func decodeSnappy(src []byte) ([]byte, error) {
	if !bytes.HasPrefix(src, xerialMagic) {
		return decodeSnappyBlock(nil, src)
	}
	if len(src) < 16 {
		return nil, errors.New("xerial header truncated")
	}
	var out []byte
	for rest := src[16:]; len(rest) > 0; {
		if len(rest) < 4 {
			return nil, errors.New("xerial chunk length truncated")
		}
		n := binary.BigEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(n) > uint64(len(rest)) {
			return nil, fmt.Errorf("xerial chunk of %d bytes, %d left", n, len(rest))
		}
		var err error
		if out, err = decodeSnappyBlock(out, rest[:n]); err != nil {
			return nil, err
		}
		rest = rest[n:]
	}
	return out, nil
}

// decodeSnappyBlock appends the decoded block to dst. Snappy decodes a whole block at once, into a
// buffer of the length the block claims, so the claim is checked first: at most maxDecompressed in all,
// and at most 32 times the block (snappy's copies expand at most ~21 times), so a few bytes cannot make
// us allocate 256 MiB.
func decodeSnappyBlock(dst, block []byte) ([]byte, error) {
	n, err := snappy.DecodedLen(block)
	if err != nil {
		return nil, err
	}
	if n > 32*len(block)+64<<10 || len(dst)+n > maxDecompressed {
		return nil, fmt.Errorf("block of %d bytes claims to decompress to %d bytes", len(block), n)
	}
	out, err := snappy.Decode(nil, block)
	if err != nil {
		return nil, err
	}
	if dst == nil {
		return out, nil
	}
	return append(dst, out...), nil
}
