package batch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/snappy"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// MaxUncompressedSize caps the decompressed record area of one batch (64 MiB, the largest answer a fetch
// may carry). A batch that inflates beyond it is reported corrupt rather than exhausting memory: a few
// hostile bytes must not make a reader allocate gigabytes.
const MaxUncompressedSize = 64 << 20

// String returns Kafka's name of the codec (compression.type): none, gzip, snappy, lz4 or zstd.
func (c Compression) String() string {
	switch c {
	case CompressionNone:
		return "none"
	case CompressionGzip:
		return "gzip"
	case CompressionSnappy:
		return "snappy"
	case CompressionLZ4:
		return "lz4"
	case CompressionZstd:
		return "zstd"
	}
	return fmt.Sprintf("compression(%d)", int8(c))
}

// Valid reports whether c is one of the five codecs of the format.
func (c Compression) Valid() bool { return c >= CompressionNone && c <= CompressionZstd }

// appendWriter is an io.Writer appending to a slice, so stream compressors write straight into the
// batch buffer.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

var (
	gzipWriters = sync.Pool{New: func() any {
		w, _ := gzip.NewWriterLevel(nil, gzip.DefaultCompression) // Kafka's default gzip level
		return w
	}}
	gzipReaders sync.Pool // *gzip.Reader; made on first use since NewReader needs a valid stream
	lz4Writers  = sync.Pool{New: func() any {
		w := lz4.NewWriter(nil)
		// 64 KiB blocks as Kafka's Java client writes them; no concurrency, so no goroutines.
		_ = w.Apply(lz4.BlockSizeOption(lz4.Block64Kb), lz4.ConcurrencyOption(1))
		return w
	}}
	lz4Readers = sync.Pool{New: func() any {
		r := lz4.NewReader(nil)
		_ = r.Apply(lz4.ConcurrencyOption(1))
		return r
	}}

	// One zstd encoder and one decoder serve every goroutine: EncodeAll and DecodeAll are safe for
	// concurrent use and keep up to GOMAXPROCS internal states, which is the pooling the library offers
	// (its stream mode, which would start goroutines, is never used).
	zstdOnce sync.Once
	zstdEnc  *zstd.Encoder
	zstdDec  *zstd.Decoder
)

func zstdCodecs() (*zstd.Encoder, *zstd.Decoder) {
	zstdOnce.Do(func() {
		n := runtime.GOMAXPROCS(0)
		var err error
		zstdEnc, err = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(n), zstd.WithEncoderLevel(zstd.SpeedDefault),
			zstd.WithZeroFrames(true))
		if err != nil {
			panic("batch: zstd encoder: " + err.Error())
		}
		zstdDec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(n), zstd.WithDecoderMaxMemory(MaxUncompressedSize),
			zstd.WithDecoderLowmem(true))
		if err != nil {
			panic("batch: zstd decoder: " + err.Error())
		}
	})
	return zstdEnc, zstdDec
}

// compress appends src compressed with c to dst.
func compress(c Compression, dst, src []byte) []byte {
	switch c {
	case CompressionGzip:
		zw := gzipWriters.Get().(*gzip.Writer)
		aw := appendWriter{b: dst}
		zw.Reset(&aw)
		_, _ = zw.Write(src) // appendWriter never fails
		_ = zw.Close()
		zw.Reset(nil)
		gzipWriters.Put(zw)
		return aw.b
	case CompressionSnappy:
		// Raw block snappy, which every Kafka client reads (Java's also reads its xerial framing).
		n := len(dst)
		need := n + snappy.MaxEncodedLen(len(src))
		if cap(dst) < need {
			grown := make([]byte, n, need)
			copy(grown, dst)
			dst = grown
		}
		enc := snappy.Encode(dst[n:need], src)
		return dst[:n+len(enc)]
	case CompressionLZ4:
		zw := lz4Writers.Get().(*lz4.Writer)
		aw := appendWriter{b: dst}
		zw.Reset(&aw)
		_, _ = zw.Write(src)
		_ = zw.Close()
		zw.Reset(nil)
		lz4Writers.Put(zw)
		return aw.b
	case CompressionZstd:
		enc, _ := zstdCodecs()
		return enc.EncodeAll(src, dst)
	}
	panic(fmt.Sprintf("batch: Build with unknown compression codec %d", int8(c)))
}

// decompress returns the record area src decompressed with c, at most MaxUncompressedSize bytes.
// Errors are CORRUPT_MESSAGE.
func decompress(c Compression, src []byte) ([]byte, error) {
	switch c {
	case CompressionGzip:
		var zr *gzip.Reader
		if v := gzipReaders.Get(); v != nil {
			zr = v.(*gzip.Reader)
			if err := zr.Reset(bytes.NewReader(src)); err != nil {
				return nil, corrupt("gzip records: %v", err)
			}
		} else {
			var err error
			if zr, err = gzip.NewReader(bytes.NewReader(src)); err != nil {
				return nil, corrupt("gzip records: %v", err)
			}
		}
		out, err := readCapped(zr, len(src))
		gzipReaders.Put(zr)
		if err != nil {
			return nil, corrupt("gzip records: %v", err)
		}
		return out, nil
	case CompressionSnappy:
		out, err := decodeSnappy(src)
		if err != nil {
			return nil, corrupt("snappy records: %v", err)
		}
		return out, nil
	case CompressionLZ4:
		zr := lz4Readers.Get().(*lz4.Reader)
		zr.Reset(bytes.NewReader(src))
		out, err := readCapped(zr, len(src))
		zr.Reset(nil)
		lz4Readers.Put(zr)
		if err != nil {
			return nil, corrupt("lz4 records: %v", err)
		}
		return out, nil
	case CompressionZstd:
		_, dec := zstdCodecs()
		out, err := dec.DecodeAll(src, nil)
		if err != nil {
			return nil, corrupt("zstd records: %v", err)
		}
		return out, nil
	}
	return nil, corrupt("unknown compression codec %d", int8(c))
}

var errTooLarge = fmt.Errorf("decompressed records exceed %d bytes", MaxUncompressedSize)

// readCapped reads r to its end into a buffer that grows with what is actually decompressed (never with
// a size the input claims), failing beyond MaxUncompressedSize.
func readCapped(r io.Reader, srcLen int) ([]byte, error) {
	buf := make([]byte, 0, min(max(4*srcLen, 512), MaxUncompressedSize))
	for {
		if len(buf) == cap(buf) {
			if len(buf) >= MaxUncompressedSize {
				// Full at the cap: fine only if the stream ends here.
				var one [1]byte
				n, err := io.ReadFull(r, one[:])
				if n > 0 {
					return nil, errTooLarge
				}
				if errors.Is(err, io.EOF) {
					return buf, nil
				}
				return nil, err
			}
			grown := make([]byte, len(buf), min(2*cap(buf), MaxUncompressedSize))
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// xerialHeader starts snappy data framed by snappy-java (Kafka's Java client): the magic, then version
// and compatible version (4 bytes each), then chunks of a 4-byte big-endian length and a raw block.
var xerialHeader = []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

// maxSnappyRatio bounds how much raw snappy can inflate: the best element, a 3-byte copy, yields 64
// bytes. A block claiming more than this is refused before its claimed size is allocated.
const maxSnappyRatio = 22

func decodeSnappy(src []byte) ([]byte, error) {
	if !bytes.HasPrefix(src, xerialHeader) {
		return decodeSnappyBlock(nil, src)
	}
	if len(src) < 16 {
		return nil, errors.New("truncated xerial header")
	}
	src = src[16:]
	var out []byte
	for len(src) > 0 {
		if len(src) < 4 {
			return nil, errors.New("truncated xerial chunk length")
		}
		n := binary.BigEndian.Uint32(src)
		src = src[4:]
		if uint64(n) > uint64(len(src)) {
			return nil, errors.New("xerial chunk runs past the data")
		}
		var err error
		if out, err = decodeSnappyBlock(out, src[:n]); err != nil {
			return nil, err
		}
		src = src[n:]
	}
	if out == nil {
		out = []byte{}
	}
	return out, nil
}

// decodeSnappyBlock appends the raw snappy block src, decoded, to dst.
func decodeSnappyBlock(dst, src []byte) ([]byte, error) {
	n, err := snappy.DecodedLen(src)
	if err != nil {
		return nil, err
	}
	if n > (len(src)+1)*maxSnappyRatio || len(dst)+n > MaxUncompressedSize {
		return nil, fmt.Errorf("snappy block claims %d decoded bytes from %d", n, len(src))
	}
	start := len(dst)
	if cap(dst)-start < n {
		grown := make([]byte, start, start+n+start) // room for further chunks
		copy(grown, dst)
		dst = grown
	}
	dec, err := snappy.Decode(dst[start:start+n], src)
	if err != nil {
		return nil, err
	}
	if len(dec) != n {
		return nil, errors.New("snappy block decoded to another length than it claims")
	}
	return dst[:start+n], nil
}
