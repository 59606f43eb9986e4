package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// maxLineBytes bounds one input line (one record); longer lines are an error rather than a silent split.
const maxLineBytes = 64 << 20

// input is a source of lines: a file (plain, .zst or .gz, decompressed on the fly) or stdin.
type input struct {
	name string
	r    io.Reader
	// size is the file's size on disk, or -1 for stdin and pipes.
	size int64
	// read counts the bytes consumed from the file (compressed bytes for .zst/.gz), for "% of file".
	read   *atomic.Int64
	closer func() error
}

// openInput opens path for reading lines; "" or "-" reads stdin. Files ending in .zst or .zstd are
// zstd-decompressed, .gz gzip-decompressed.
func openInput(path string, stdin io.Reader) (*input, error) {
	in := &input{name: path, size: -1, read: new(atomic.Int64), closer: func() error { return nil }}
	if path == "" || path == "-" {
		in.name = "stdin"
		in.r = &countingReader{r: stdin, n: in.read}
		return in, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		in.size = st.Size()
	}
	cr := &countingReader{r: bufio.NewReaderSize(f, 1<<20), n: in.read}
	switch lower := strings.ToLower(path); {
	case strings.HasSuffix(lower, ".zst"), strings.HasSuffix(lower, ".zstd"):
		zr, err := zstd.NewReader(cr, zstd.WithDecoderConcurrency(1))
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		in.r = zr
		in.closer = func() error { zr.Close(); return f.Close() }
	case strings.HasSuffix(lower, ".gz"):
		zr, err := gzip.NewReader(cr)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		in.r = zr
		in.closer = func() error { zr.Close(); return f.Close() }
	default:
		in.r = cr
		in.closer = f.Close
	}
	return in, nil
}

// Close closes the file.
func (in *input) Close() error { return in.closer() }

// fraction is how much of the file has been read, in [0,1], or -1 when the size is unknown.
func (in *input) fraction() float64 {
	if in == nil || in.size <= 0 {
		return -1
	}
	return min(1, float64(in.read.Load())/float64(in.size))
}

// lines calls fn with each non-empty line (without its \n or \r\n) and its 1-based line number, until
// the input ends, fn returns false, or reading fails. The slice is only valid during the call.
func (in *input) lines(fn func(line []byte, n int64) bool) error {
	sc := bufio.NewScanner(in.r)
	sc.Buffer(make([]byte, 1<<20), maxLineBytes)
	var n int64
	for sc.Scan() {
		n++
		line := sc.Bytes()
		if len(line) > 0 && line[len(line)-1] == '\r' {
			line = line[:len(line)-1]
		}
		if len(line) == 0 {
			continue
		}
		if !fn(line, n) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("%s: line %d is longer than %d bytes", in.name, n+1, maxLineBytes)
		}
		return fmt.Errorf("%s: %w", in.name, err)
	}
	return nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// slab hands out copies of small byte slices from large shared chunks, so a million records do not
// cost a million allocations. A chunk is freed once no record refers to it.
type slab struct{ buf []byte }

// copy returns a copy of b (nil for nil).
func (s *slab) copy(b []byte) []byte {
	if b == nil {
		return nil
	}
	if len(b) > len(s.buf) {
		if len(b) > 64<<10 {
			return append([]byte(nil), b...)
		}
		s.buf = make([]byte, 1<<20)
	}
	out := s.buf[:len(b):len(b)]
	copy(out, b)
	s.buf = s.buf[len(b):]
	return out
}
