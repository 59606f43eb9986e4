//go:build linux

package plog

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
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
// there is nothing left for a writeback or a flush to do (the appends pass two rotations of the
// 8 MiB value-log files).
func TestNoWritebackWithFsync(t *testing.T) {
	o := testOptions(t, true)
	o.ValueLogFileSize = 8 << 20
	s := openStore(t, o)
	ranges := recordWritebacks(t, s)
	flushes := recordFlushes(t, s)
	p := mustPartition(t, s, pid)
	// Paced, so the prefetcher steps every flushInterval or less, where it would flush without fsync.
	appendPaced(t, s, p, 3*int(o.ValueLogFileSize)/100_000+10, 100_000, syncAppend)
	if newestVlog(o.Dir) < 3 {
		t.Fatalf("the appends ended in value log %d: want them to pass two rotations", newestVlog(o.Dir))
	}
	if n := len(ranges()); n != 0 || s.writebacks.Load() != 0 || s.fsyncs.Load() == 0 {
		t.Fatalf("%d writebacks (counted %d), %d fsyncs with Options.Fsync", n, s.writebacks.Load(), s.fsyncs.Load())
	}
	if n := len(flushes()); n != 0 || s.flushesTaken.Load() != 0 || s.flushes.Load() != 0 {
		t.Fatalf("%d flushes (%d taken, %d made) with Options.Fsync", n, s.flushesTaken.Load(), s.flushes.Load())
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

// recordFlushes makes s record the flushes its flusher makes (and still make them).
func recordFlushes(t *testing.T, s *Store) func() []flushReq {
	var mu sync.Mutex
	var got []flushReq
	s.datasyncFn = func(r flushReq) error {
		mu.Lock()
		got = append(got, r)
		mu.Unlock()
		return datasyncFile(r.path)
	}
	return func() []flushReq {
		mu.Lock()
		defer mu.Unlock()
		return append([]flushReq(nil), got...)
	}
}

// appendPaced appends n batches of size bytes with opts, waiting after every prefetchTrigger bytes until the
// prefetch goroutine has stepped since the last wait (the writer woke it meanwhile, having written
// as much) and the flusher has made every flush it took, so that the prefetcher sees every file near
// its end and finds the flusher idle, as it does when the writer does not outrun them.
func appendPaced(t *testing.T, s *Store, p *Partition, n, size int, opts AppendOptions) {
	t.Helper()
	steps, since := s.prefetchSteps.Load(), 0
	for i := range n {
		mustAppend(t, p, sizedBatch(t, size, int64(i)), opts)
		if since += size; since >= prefetchTrigger {
			waitFor(t, 10*time.Second, "a prefetch step and the flushes it asked for", func() bool {
				return s.prefetchSteps.Load() > steps && s.flushes.Load() == s.flushesTaken.Load()
			})
			steps, since = s.prefetchSteps.Load(), 0
		}
	}
}

// TestFlushesWithoutFsync: without Options.Fsync the flusher flushes the active value-log file every
// flushInterval, so Badger's msync when it leaves the file (on its write path) finds at most about
// that much to write back and flush (flush.go). Paced appends across three rotations of 8 MiB files
// (flushInterval 2 MiB) must see each file flushed in order, every flushInterval to flushInterval
// plus one prefetch step (two, at most twice: one step may find the flusher busy), with no more than
// that left unflushed at its rotation.
func TestFlushesWithoutFsync(t *testing.T) {
	o := testOptions(t, false)
	o.ValueLogFileSize = 8 << 20
	s := openStore(t, o)
	flushes := recordFlushes(t, s)
	p := mustPartition(t, s, pid)
	const size = 100_000
	n := int(3*o.ValueLogFileSize/size) + 10 // three rotations
	appendPaced(t, s, p, n, size, plainAppend)
	if got := readAll(t, p, 0); len(got) != n {
		t.Fatalf("read %d batches of %d", len(got), n)
	}
	// Closed, the store has stopped the prefetcher and the flusher: every flush taken was made and counted.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got := flushes()
	interval := flushInterval(o.ValueLogFileSize)
	// A step comes at most prefetchTrigger plus one batch (and its header) after the last. The flusher
	// counts a flush just before it waits for the next request, so a step in between finds it busy
	// and the next step asks (as TestFlushOffThePrefetcher allows for): a flush may come one step
	// later, rarely, so at most twice in the run.
	slack := int64(prefetchTrigger + 2*size)
	late := 0
	if len(got) < 3*int(o.ValueLogFileSize/interval)-3 || s.flushes.Load() != int64(len(got)) || s.flushesTaken.Load() != int64(len(got)) {
		t.Fatalf("%d flushes (%d taken, %d made) over three %d-byte value-log files: want one every %d bytes",
			len(got), s.flushesTaken.Load(), s.flushes.Load(), o.ValueLogFileSize, interval)
	}
	files := map[uint64]int64{} // fid → written end at its last flush
	for i, r := range got {
		last, seen := files[r.fid]
		if i > 0 && r.fid < got[i-1].fid {
			t.Fatalf("flushes %+v: file %d flushed after file %d", got, r.fid, got[i-1].fid)
		}
		d := r.end - last
		if d > interval+slack && d <= interval+2*slack && late < 2 {
			late++
		} else if d < interval || d > interval+slack {
			t.Fatalf("flush %d of file %d at %d, %d bytes after its last (seen %v): want %d to %d (%d to %d twice at most: %d so far)",
				i, r.fid, r.end, d, seen, interval, interval+slack, interval+slack, interval+2*slack, late)
		}
		if filepath.Base(r.path) != vlogName(r.fid) {
			t.Fatalf("flush %d of file %d names %s", i, r.fid, r.path)
		}
		files[r.fid] = r.end
	}
	if len(files) < 3 {
		t.Fatalf("flushes %+v: want three value-log files flushed", got)
	}
	// Every file Badger left was flushed up to within one interval and two steps (one if no flush was
	// late) of its rotation point.
	for fid, end := range files {
		if bound := interval + slack + int64(min(late, 1))*slack; fid < newestVlog(o.Dir) && end < o.ValueLogFileSize-bound {
			t.Fatalf("file %d was last flushed at %d, more than %d bytes before its rotation at %d", fid, end, bound, o.ValueLogFileSize)
		}
	}
}

// TestFlushOffThePrefetcher: a flush runs in the flusher's goroutine, so while one is held the
// prefetcher goes on stepping and starting writebacks, and asks for no second flush to be queued
// behind it; once it ends, the next flush is taken.
func TestFlushOffThePrefetcher(t *testing.T) {
	o := testOptions(t, false)
	o.ValueLogFileSize = 64 << 20
	s := openStore(t, o)
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce) // before the store closes: a failed test must not leave the flush held
	held := make(chan flushReq, 1)
	var mu sync.Mutex
	var made []flushReq
	s.datasyncFn = func(r flushReq) error {
		mu.Lock()
		made = append(made, r)
		first := len(made) == 1
		mu.Unlock()
		if first {
			held <- r
			<-release
		}
		return datasyncFile(r.path)
	}
	p := mustPartition(t, s, pid)
	const size = 100_000
	interval := flushInterval(o.ValueLogFileSize)
	i := 0
	appendBytes := func(n int64) {
		for target := int64(i)*size + n; int64(i)*size < target; i++ {
			mustAppend(t, p, sizedBatch(t, size, int64(i)), plainAppend)
		}
	}
	appendBytes(interval + prefetchTrigger)
	var first flushReq
	select {
	case first = <-held:
	case <-time.After(10 * time.Second):
		t.Fatalf("no flush after %d bytes (flushInterval %d)", int64(i)*size, interval)
	}
	steps, wbs := s.prefetchSteps.Load(), s.writebacks.Load()
	appendBytes(2*interval + 2*writebackBytes) // two more intervals are due meanwhile
	waitFor(t, 10*time.Second, "prefetch steps and writebacks while a flush is held", func() bool {
		return s.prefetchSteps.Load() > steps+2 && s.writebacks.Load() > wbs
	})
	if n := s.flushesTaken.Load(); n != 1 {
		t.Fatalf("%d flushes taken while the first (at %d) was held: want none queued behind it", n, first.end)
	}
	releaseOnce()
	waitFor(t, 10*time.Second, "the held flush", func() bool { return s.flushes.Load() == 1 })
	// A step between the flusher counting the held flush and its next receive finds it busy: append
	// until one finds it idle.
	for deadline := time.Now().Add(10 * time.Second); s.flushes.Load() < 2 && time.Now().Before(deadline); {
		appendBytes(size)
	}
	waitFor(t, 10*time.Second, "the next flush", func() bool { return s.flushes.Load() >= 2 })
	mu.Lock()
	second := made[1]
	mu.Unlock()
	if second.fid != first.fid || second.end < first.end+2*interval {
		t.Fatalf("flush after the held one: %+v after %+v: want the same file, at least %d bytes on", second, first, 2*interval)
	}
}

// TestFlushFailureFailsStore: a failed flush is a failed fsync, as a failed writeback is.
func TestFlushFailureFailsStore(t *testing.T) {
	o := testOptions(t, false)
	o.ValueLogFileSize = 8 << 20
	s := openStore(t, o)
	s.datasyncFn = func(flushReq) error { return errors.New("injected EIO") }
	i, err := appendUntilFailure(t, mustPartition(t, s, pid))
	if !isErr(err, rerr.ErrStorage) {
		t.Fatalf("append %d after a failed flush: %v", i, err)
	}
	if f := s.failure(); f == nil || !strings.Contains(f.Error(), "flush value log") || !strings.Contains(f.Error(), "injected EIO") {
		t.Fatalf("the store's failure %v: want the failed flush", f)
	}
	if int64(i)*100_000 < flushInterval(o.ValueLogFileSize) {
		t.Fatalf("the store failed after %d appends, before a flush was due", i)
	}
}

// TestFlushOfDeletedFileSkipped: a value-log file gone by the time the flusher gets to it held nothing
// left to keep, so that flush is skipped, not a failure.
func TestFlushOfDeletedFileSkipped(t *testing.T) {
	o := testOptions(t, false)
	o.ValueLogFileSize = 8 << 20
	s := openStore(t, o)
	s.datasyncFn = func(r flushReq) error {
		return fmt.Errorf("open %s: %w", r.path, fs.ErrNotExist)
	}
	p := mustPartition(t, s, pid)
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; s.flushesTaken.Load() < 2 && time.Now().Before(deadline); i++ {
		mustAppend(t, p, sizedBatch(t, 100_000, int64(i)), plainAppend)
	}
	if s.flushesTaken.Load() < 2 || s.flushes.Load() != 0 {
		t.Fatalf("%d flushes taken, %d made: want some taken and none counted as made", s.flushesTaken.Load(), s.flushes.Load())
	}
	if err := s.failure(); err != nil {
		t.Fatalf("the store failed: %v", err)
	}
	// What the flusher checks for is what datasyncFile returns for a file that is gone.
	if err := datasyncFile(filepath.Join(t.TempDir(), vlogName(7))); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("datasyncFile of a missing file: %v, want fs.ErrNotExist", err)
	}
}
