package plog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Badger writes every batch into its active value-log file through a shared memory mapping of a sparse
// file (twice ValueLogFileSize long). The first write to each page of it faults, and the kernel's fault
// path reads the page in around the fault, up to a 2 MiB folio at a time: it allocates page-cache memory
// and zeroes it (the file is a hole there) while Badger's one write goroutine waits, and with it every
// append of every partition. Zeroing fresh memory is cheap on bare metal, but on a virtual machine
// whose free memory the host has taken back (virtio-balloon free page reporting, as on the 2-core
// machine of issue 9) each newly touched page is also a fault in the host: there the writer stalled up
// to 40 ms per fault, and zeroing took over half of the node's CPU at 170 MB/s.
//
// The prefetcher moves that work off the write path: it keeps the active file's pages ahead of Badger's
// write position in the page cache by faulting them in through a read-only mapping of its own, the same
// read-in, done by its own goroutine (on another core when there is one). Badger's write then finds the
// folio cached and only maps it writable. Nothing is written: the file's contents and what is durable do not change, so a failed
// or late prefetch costs only the faults it meant to spare.
const (
	// prefetchWindow is how far past the end of the written data the prefetcher keeps pages cached: at
	// 200 MB/s of appends, 160 ms of writing, so a prefetcher held up by a busy machine still runs ahead.
	prefetchWindow = 32 << 20
	// prefetchChunk is the size of one populate call.
	prefetchChunk = 4 << 20
	// prefetchTrigger is how many bytes the writer appends before it wakes the prefetcher.
	prefetchTrigger = 1 << 20
	// writebackLag is how far behind the end of the written data a writeback stops (writebackBytes):
	// the folio Badger is writing into (up to 2 MiB) is left alone, so its writes never wait for it.
	writebackLag = 4 << 20
)

// errNoPrefetch is returned where the system has no way to ask for pages ahead (not Linux).
var errNoPrefetch = errors.New("page-cache prefetch not supported on this system")

// vlogPrefetcher is the prefetcher's state; only the prefetch goroutine uses it. It also drops the pages
// more than the window behind the written end (dropBehind, pagecache.go), and without fsync it
// starts the writebacks of the active value log (writebackBytes) and hands it to the flusher every
// flushInterval (flush.go).
type vlogPrefetcher struct {
	dir      string
	fileSize int64 // Badger's ValueLogFileSize: it rotates to a new file once the active one passes it
	// writeback starts writing back n bytes of f at off; nil: the store fsyncs (Options.Fsync), so
	// nothing is left dirty for long.
	writeback func(f *prefetchFile, off, n int64) error

	// window is how many bytes of the newest value log stay in the page cache (Options.PageCacheWindow,
	// pagecache.go); 0: nothing is dropped.
	window int64

	f       *prefetchFile // the active value-log file; nil before the first step
	fid     uint64
	path    string // f's path
	ahead   int64  // offset of f up to which pages were asked for
	wbDone  int64  // offset of f up to which a writeback was started
	dropped int64  // offset of f up to which pages were dropped
	// behind are the files before f whose pages are not all dropped yet, oldest first.
	behind []retainedFile
	// flush hands a flush of f to the flusher unless it is busy, and reports whether it took it
	// (Store.requestFlush); nil with Options.Fsync. flushed: f's written end at the last flush taken.
	flush   func(flushReq) bool
	flushed int64
}

// writebackError is a failed writeback: the kernel may have dropped pages it could not write
// (fsyncgate), so records already acknowledged may be gone, and the store fails as after a failed
// fsync.
type writebackError struct{ err error }

func (e *writebackError) Error() string { return e.err.Error() }
func (e *writebackError) Unwrap() error { return e.err }

// stepResult is what a step did: bytes asked for ahead, whether a writeback started and whether the
// flusher took a flush of the file, bytes dropped behind (pagecache.go), and why dropping failed
// (reported, never fatal).
type stepResult struct {
	asked, dropped    int64
	wrote, flushTaken bool
	dropErr           error
}

// step drops the pages more than the window behind the end of the active value-log file
// (dropBehind), asks for the pages from the end of its written data to prefetchWindow past it, and then,
// without Options.Fsync, starts a writeback when writebackBytes or more were written since the last one
// (up to writebackLag short of the end) and hands the file to the flusher when flushInterval or more
// were written since the last flush it took.
// The prefetch goes first because the writer waits for what it misses, and nothing waits for a
// writeback, which on a new file took 30-80 ms per call. Near the end of a file (within a window of
// fileSize) it looks for the next one, which Badger creates when it rotates, and moves to it. Errors
// are the system's (the directory cannot be read, a file cannot be opened or mapped, populating
// failed, or errNoPrefetch), which the caller only reports, since nothing depends on a prefetch; or a
// *writebackError, which fails the store.
func (p *vlogPrefetcher) step() (stepResult, error) {
	var res stepResult
	if p.f == nil || p.ahead+prefetchWindow > p.fileSize {
		if err := p.findActive(); err != nil {
			return res, err
		}
		if p.f == nil {
			return res, nil // Badger has not created a value-log file yet
		}
	}
	end, err := p.f.dataEnd()
	if err != nil {
		return res, fmt.Errorf("find the written end of value log %d: %w", p.fid, err)
	}
	// Dropped before the prefetch, so the pages the prefetch faults in are the ones just freed.
	res.dropped, res.dropErr = p.dropBehind(end)
	// The mapping Badger writes through is twice fileSize long; a write never goes past it.
	limit := min(end+prefetchWindow, 2*p.fileSize)
	var prefetchErr error
	for off := max(p.ahead, end); off < limit; off += prefetchChunk {
		n := min(int64(prefetchChunk), limit-off)
		if err := p.f.populate(off, n); err != nil {
			prefetchErr = fmt.Errorf("prefetch value log %d at %d: %w", p.fid, off, err)
			break
		}
		res.asked += n
		p.ahead = off + n
	}
	if upto := end - writebackLag; p.writeback != nil && upto-p.wbDone >= writebackBytes {
		if err := p.writeback(p.f, p.wbDone, upto-p.wbDone); err != nil {
			return res, &writebackError{fmt.Errorf("write back value log %d from %d to %d: %w", p.fid, p.wbDone, upto, err)}
		}
		p.wbDone, res.wrote = upto, true
	}
	// The writebacks go on beside the flushes: while the flusher is busy with a slow flush they still
	// start writing back what is written meanwhile; while it keeps up they mostly cover pages a flush
	// already wrote, which costs a walk of the page cache and no I/O.
	if p.flush != nil && end-p.flushed >= flushInterval(p.fileSize) && p.flush(flushReq{path: p.path, fid: p.fid, end: end}) {
		p.flushed, res.flushTaken = end, true
	}
	return res, prefetchErr
}

// findActive moves to the newest value-log file if there is a newer one than f.
func (p *vlogPrefetcher) findActive() error {
	files, err := badgerLogFiles(p.dir)
	if err != nil {
		return err
	}
	var newest uint64
	found := false
	for _, f := range files {
		if f.vlog && (!found || f.fid > newest) {
			newest, found = f.fid, true
		}
	}
	if !found || (p.f != nil && newest <= p.fid) {
		return nil
	}
	path := filepath.Join(p.dir, vlogName(newest))
	f, err := openPrefetchFile(path, 2*p.fileSize)
	if err != nil {
		return fmt.Errorf("open value log %d for prefetch: %w", newest, err)
	}
	if p.f != nil && p.window > 0 {
		// Badger truncated the file it left to its written length before it created the next one; the
		// pages it had past that are gone with the truncation.
		end := p.ahead
		if fi, err := os.Stat(p.path); err == nil {
			end = fi.Size()
		}
		if end > p.dropped {
			p.behind = append(p.behind, retainedFile{path: p.path, dropped: p.dropped, end: end})
		}
	}
	p.close()
	p.f, p.fid, p.path, p.ahead, p.wbDone, p.dropped, p.flushed = f, newest, path, 0, 0, 0, 0
	return nil
}

// close releases the file (Badger may have deleted it meanwhile; the descriptor kept it open).
func (p *vlogPrefetcher) close() {
	if p.f != nil {
		p.f.close()
		p.f = nil
	}
}

// badgerLogFile is one of Badger's value-log (NNNNNN.vlog) or memtable WAL (NNNNN.mem) files.
type badgerLogFile struct {
	name string
	fid  uint64
	vlog bool
}

// badgerLogFiles lists the value-log and memtable WAL files in dir, in no particular order.
func badgerLogFiles(dir string) ([]badgerLogFile, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []badgerLogFile
	for _, e := range ents {
		name := e.Name()
		var ext string
		switch {
		case strings.HasSuffix(name, ".vlog"):
			ext = ".vlog"
		case strings.HasSuffix(name, ".mem"):
			ext = ".mem"
		default:
			continue
		}
		fid, err := strconv.ParseUint(strings.TrimSuffix(name, ext), 10, 64)
		if err != nil {
			continue
		}
		files = append(files, badgerLogFile{name, fid, ext == ".vlog"})
	}
	return files, nil
}

// vlogName is Badger's name for value-log file fid.
func vlogName(fid uint64) string { return fmt.Sprintf("%06d.vlog", fid) }

// prefetchLoop is the prefetch goroutine: it runs a step whenever the writer wakes it, until stop is
// closed. A failed writeback fails the store. Another failing step is logged once per kind of failure
// run, at debug level: the writer then takes the faults itself, as it would without the prefetcher.
func (s *Store) prefetchLoop() {
	defer close(s.prefetchDone)
	p := &vlogPrefetcher{dir: s.opts.Dir, fileSize: s.opts.ValueLogFileSize, window: max(s.opts.PageCacheWindow, 0)}
	// The drops find Badger's mappings in /proc/self/maps by path, which the kernel gives absolute and
	// with symbolic links resolved.
	if dir, err := filepath.Abs(p.dir); err == nil {
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			dir = real
		}
		p.dir = dir
	}
	if !s.opts.Fsync {
		// Read at each call, not here: a test sets writebackFn after Open, before its first append
		// (which wakes this goroutine).
		p.writeback = func(f *prefetchFile, off, n int64) error { return s.writebackFn(f, off, n) }
		p.flush = s.requestFlush
	}
	defer p.close()
	var lastErr, lastDropErr string
	for {
		select {
		case <-s.stopPrefetch:
			return
		case <-s.prefetchWake:
		}
		res, err := p.step()
		s.prefetched.Add(res.asked)
		s.pageCacheDropped.Add(res.dropped)
		if res.wrote {
			s.writebacks.Add(1)
		}
		if res.flushTaken {
			s.flushesTaken.Add(1)
		}
		// Counted after the step's other counters: a test that waits for a step then reads them whole.
		s.prefetchSteps.Add(1)
		if res.dropErr != nil {
			if errors.Is(res.dropErr, errNoDrop) {
				p.window, p.behind = 0, nil
			}
			if res.dropErr.Error() != lastDropErr {
				s.log.Debug("value-log page drop failed; those pages stay cached", "dir", s.opts.Dir, "err", res.dropErr)
			}
			lastDropErr = res.dropErr.Error()
		}
		if err != nil {
			if wbErr := (*writebackError)(nil); errors.As(err, &wbErr) {
				s.fail(fmt.Errorf("%s: %w", s.opts.Dir, err))
				return
			}
			if errors.Is(err, errNoPrefetch) {
				return
			}
			if err.Error() != lastErr {
				s.log.Debug("value-log prefetch failed", "dir", s.opts.Dir, "err", err)
			}
			lastErr = err.Error()
		} else {
			lastErr = ""
		}
	}
}

// wakePrefetch tells the prefetcher that n more bytes were written (writer goroutine only).
func (s *Store) wakePrefetch(n int64) {
	s.unprefetched += n
	if s.unprefetched < prefetchTrigger {
		return
	}
	s.unprefetched = 0
	select {
	case s.prefetchWake <- struct{}{}:
	default:
	}
}
