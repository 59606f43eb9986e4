//go:build linux

package plog

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
)

var plainAppend = AppendOptions{LogAppendTime: -1}

// wbRange is one writeback the store started: n bytes of value-log file fid at off.
type wbRange struct {
	fid     uint64
	off, n  int64
	dataEnd int64 // the file's written end when it started
}

// vlogPosition returns the active value-log file of s (the one f is) and f's written end.
func vlogPosition(t *testing.T, s *Store, f *prefetchFile) (fid uint64, end int64) {
	end, err := f.dataEnd()
	if err != nil {
		t.Errorf("data end: %v", err)
	}
	return newestVlog(s.opts.Dir), end
}

// appendUntilFailure appends 100,000-byte batches to p until one fails or 10 s pass, and returns how
// many succeeded and the error that ended it (nil when none failed).
func appendUntilFailure(t *testing.T, p *Partition) (int, error) {
	deadline := time.Now().Add(10 * time.Second)
	i := 0
	for ; time.Now().Before(deadline); i++ {
		if _, err := p.Append(context.Background(), sizedBatch(t, 100_000, int64(i)), plainAppend); err != nil {
			return i, err
		}
	}
	return i, nil
}

// recordWritebacks makes s record its writebacks (and still start them).
func recordWritebacks(t *testing.T, s *Store) func() []wbRange {
	var mu sync.Mutex
	var got []wbRange
	s.writebackFn = func(f *prefetchFile, off, n int64) error {
		fid, end := vlogPosition(t, s, f)
		mu.Lock()
		got = append(got, wbRange{fid, off, n, end})
		mu.Unlock()
		return f.writeback(off, n)
	}
	return func() []wbRange {
		mu.Lock()
		defer mu.Unlock()
		return append([]wbRange(nil), got...)
	}
}

// TestWritebackWithoutFsync: without Options.Fsync the store still starts writing the value log back
// every writebackBytes, so Badger's msync at a value-log rotation finds the file nearly clean (issue
// 9: that msync stalled every write for 75-450 ms). Each writeback starts where the last one ended
// and stops writebackLag short of the written end, away from the folio Badger is writing into (an
// msync of it held Badger's writes for 5-45 ms); appends do not wait for it.
func TestWritebackWithoutFsync(t *testing.T) {
	o := testOptions(t, false)
	o.ValueLogFileSize = 64 << 20
	s := openStore(t, o)
	ranges := recordWritebacks(t, s)
	p := mustPartition(t, s, pid)
	const size = 100_000
	n := 4*writebackBytes/size + writebackLag/size + 1
	var written int64
	for i := range n {
		b := sizedBatch(t, size, int64(i))
		written += int64(len(b))
		mustAppend(t, p, b, plainAppend)
	}
	waitFor(t, 10*time.Second, "writebacks", func() bool { return len(ranges()) >= 3 })
	got := ranges()
	if max := written / writebackBytes; int64(len(got)) > max || s.writebacks.Load() != int64(len(got)) {
		t.Fatalf("%d writebacks (counted %d) for %d bytes: at most one per %d bytes wanted", len(got), s.writebacks.Load(), written, writebackBytes)
	}
	var next int64
	for i, r := range got {
		if r.off != next || r.n < writebackBytes {
			t.Fatalf("writeback %d covers [%d, %d): want it to start at %d, the end of the last, and cover at least %d bytes", i, r.off, r.off+r.n, next, writebackBytes)
		}
		if r.off+r.n > r.dataEnd-writebackLag {
			t.Fatalf("writeback %d ends at %d, within %d bytes of the written end %d: Badger's folio would wait for it", i, r.off+r.n, writebackLag, r.dataEnd)
		}
		next = r.off + r.n
	}
	if s.fsyncs.Load() != 0 {
		t.Fatalf("%d acknowledgement fsyncs without Options.Fsync", s.fsyncs.Load())
	}
	if got := readAll(t, p, 0); len(got) != n {
		t.Fatalf("read %d batches of %d", len(got), n)
	}
}

// TestNoWritebackWithFsync: with Options.Fsync every group is fsynced before it is acknowledged, so
// there is nothing left for a writeback or a presync to do (the appends pass two rotations of the
// 8 MiB value-log files).
func TestNoWritebackWithFsync(t *testing.T) {
	o := testOptions(t, true)
	o.ValueLogFileSize = 8 << 20
	s := openStore(t, o)
	ranges := recordWritebacks(t, s)
	syncs := recordPresyncs(t, s)
	p := mustPartition(t, s, pid)
	// Paced, so the prefetcher steps near the end of each file, where it would sync one without fsync.
	appendPaced(t, s, p, 3*int(o.ValueLogFileSize)/100_000+10, 100_000, syncAppend)
	if newestVlog(o.Dir) < 3 {
		t.Fatalf("the appends ended in value log %d: want them to pass two rotations", newestVlog(o.Dir))
	}
	if n := len(ranges()); n != 0 || s.writebacks.Load() != 0 || s.fsyncs.Load() == 0 {
		t.Fatalf("%d writebacks (counted %d), %d fsyncs with Options.Fsync", n, s.writebacks.Load(), s.fsyncs.Load())
	}
	if n := len(syncs()); n != 0 || s.presyncs.Load() != 0 {
		t.Fatalf("%d presyncs (counted %d) with Options.Fsync, across a rotation", n, s.presyncs.Load())
	}
}

// TestWritebackFailureFailsStore: a failed writeback is a failed fsync (the kernel may have dropped
// the pages it could not write, records already acknowledged among them), so the store refuses
// appends from then on, as after a failed fsync with Options.Fsync.
func TestWritebackFailureFailsStore(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	s.writebackFn = func(*prefetchFile, int64, int64) error { return errors.New("injected EIO") }
	i, err := appendUntilFailure(t, mustPartition(t, s, pid))
	if !isErr(err, rerr.ErrStorage) {
		t.Fatalf("append %d after a failed writeback: %v", i, err)
	}
	if int64(i)*100_000 < writebackBytes {
		t.Fatalf("the store failed after %d appends, before a writeback was due", i)
	}
}

// presync is one sync of a value-log file before its rotation: the file and its written end then.
type presync struct {
	fid     uint64
	dataEnd int64
}

// recordPresyncs makes s record its presyncs (and still make them).
func recordPresyncs(t *testing.T, s *Store) func() []presync {
	var mu sync.Mutex
	var got []presync
	s.presyncFn = func(f *prefetchFile) error {
		fid, end := vlogPosition(t, s, f)
		mu.Lock()
		got = append(got, presync{fid, end})
		mu.Unlock()
		return f.datasync()
	}
	return func() []presync {
		mu.Lock()
		defer mu.Unlock()
		return append([]presync(nil), got...)
	}
}

// appendPaced appends n batches of size bytes with opts, waiting after every prefetchTrigger bytes until the
// prefetch goroutine has stepped since the last wait (the writer woke it meanwhile, having written
// as much), so that it sees every file near its end, as it does when the writer does not outrun it.
func appendPaced(t *testing.T, s *Store, p *Partition, n, size int, opts AppendOptions) {
	t.Helper()
	steps, since := s.prefetchSteps.Load(), 0
	for i := range n {
		mustAppend(t, p, sizedBatch(t, size, int64(i)), opts)
		if since += size; since >= prefetchTrigger {
			waitFor(t, 10*time.Second, "a prefetch step", func() bool { return s.prefetchSteps.Load() > steps })
			steps, since = s.prefetchSteps.Load(), 0
		}
	}
}

// TestPresyncBeforeRotation: without Options.Fsync the prefetcher syncs each value-log file once,
// within presyncMargin of its rotation point, so Badger's msync when it leaves the file (on its write
// path) finds little to write or commit; after the sync the writebacks go on from where it ended.
func TestPresyncBeforeRotation(t *testing.T) {
	o := testOptions(t, false)
	o.ValueLogFileSize = 8 << 20
	s := openStore(t, o)
	syncs := recordPresyncs(t, s)
	ranges := recordWritebacks(t, s)
	p := mustPartition(t, s, pid)
	const size = 100_000
	n := int(3*o.ValueLogFileSize/size) + 10 // three rotations
	appendPaced(t, s, p, n, size, plainAppend)
	got := syncs()
	if len(got) < 2 || s.presyncs.Load() != int64(len(got)) {
		t.Fatalf("presyncs %+v (counted %d) over three value-log files: want one for each file rotated", got, s.presyncs.Load())
	}
	margin := presyncMargin(o.ValueLogFileSize)
	for i, ps := range got {
		if i > 0 && ps.fid <= got[i-1].fid {
			t.Fatalf("presyncs %+v: a file synced twice", got)
		}
		if ps.dataEnd < o.ValueLogFileSize-margin {
			t.Fatalf("presync of file %d at %d: want it within %d bytes of the rotation at %d", ps.fid, ps.dataEnd, margin, o.ValueLogFileSize)
		}
	}
	// No writeback straddles a presynced end: after the sync they start at it.
	for _, r := range ranges() {
		for _, ps := range got {
			if r.fid == ps.fid && r.off < ps.dataEnd && r.off+r.n > ps.dataEnd {
				t.Fatalf("writeback %+v overlaps the presynced data of file %d up to %d", r, ps.fid, ps.dataEnd)
			}
		}
	}
	if got := readAll(t, p, 0); len(got) != n {
		t.Fatalf("read %d batches of %d", len(got), n)
	}
}

// TestPresyncFailureFailsStore: a failed presync is a failed fsync, as a failed writeback is.
func TestPresyncFailureFailsStore(t *testing.T) {
	o := testOptions(t, false)
	o.ValueLogFileSize = 8 << 20
	s := openStore(t, o)
	s.presyncFn = func(*prefetchFile) error { return errors.New("injected EIO") }
	i, err := appendUntilFailure(t, mustPartition(t, s, pid))
	if !isErr(err, rerr.ErrStorage) {
		t.Fatalf("append %d after a failed presync: %v", i, err)
	}
	if int64(i)*100_000 < o.ValueLogFileSize-presyncMargin(o.ValueLogFileSize) {
		t.Fatalf("the store failed after %d appends, before a presync was due", i)
	}
}
