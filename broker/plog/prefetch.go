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

// vlogPrefetcher is the prefetcher's state; only the prefetch goroutine uses it. Without fsync it also
// starts the writebacks of the active value log (writebackBytes).
type vlogPrefetcher struct {
	dir      string
	fileSize int64 // Badger's ValueLogFileSize: it rotates to a new file once the active one passes it
	// writeback starts writing back n bytes of f at off; nil: the store fsyncs (Options.Fsync), so
	// nothing is left dirty for long.
	writeback func(f *prefetchFile, off, n int64) error

	f      *prefetchFile // the active value-log file; nil before the first step
	fid    uint64
	ahead  int64 // offset of f up to which pages were asked for
	wbDone int64 // offset of f up to which a writeback was started
}

// writebackError is a failed writeback: the kernel may have dropped pages it could not write
// (fsyncgate), so records already acknowledged may be gone, and the store fails as after a failed
// fsync.
type writebackError struct{ err error }

func (e *writebackError) Error() string { return e.err.Error() }
func (e *writebackError) Unwrap() error { return e.err }

// step starts a writeback of the active value-log file when writebackBytes or more were written
// since the last one (up to writebackLag short of the end), then asks for the pages of the file from
// the end of its written data to prefetchWindow past it, and returns how many bytes it asked for and
// whether it started a writeback. Near the end of a file (within a window of fileSize) it looks for
// the next one, which Badger creates when it rotates, and moves to it. Errors are the system's (the
// directory cannot be read, a file cannot be opened or mapped, populating failed, or errNoPrefetch),
// which the caller only reports, since nothing depends on a prefetch; or a *writebackError, which
// fails the store.
func (p *vlogPrefetcher) step() (int64, bool, error) {
	if p.f == nil || p.ahead+prefetchWindow > p.fileSize {
		if err := p.findActive(); err != nil {
			return 0, false, err
		}
		if p.f == nil {
			return 0, false, nil // Badger has not created a value-log file yet
		}
	}
	end, err := p.f.dataEnd()
	if err != nil {
		return 0, false, fmt.Errorf("find the written end of value log %d: %w", p.fid, err)
	}
	wrote := false
	if upto := end - writebackLag; p.writeback != nil && upto-p.wbDone >= writebackBytes {
		if err := p.writeback(p.f, p.wbDone, upto-p.wbDone); err != nil {
			return 0, false, &writebackError{fmt.Errorf("write back value log %d from %d to %d: %w", p.fid, p.wbDone, upto, err)}
		}
		p.wbDone, wrote = upto, true
	}
	// The mapping Badger writes through is twice fileSize long; a write never goes past it.
	limit := min(end+prefetchWindow, 2*p.fileSize)
	start := max(p.ahead, end)
	var asked int64
	for off := start; off < limit; off += prefetchChunk {
		n := min(int64(prefetchChunk), limit-off)
		if err := p.f.populate(off, n); err != nil {
			return asked, wrote, fmt.Errorf("prefetch value log %d at %d: %w", p.fid, off, err)
		}
		asked += n
		p.ahead = off + n
	}
	return asked, wrote, nil
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
	f, err := openPrefetchFile(filepath.Join(p.dir, vlogName(newest)), 2*p.fileSize)
	if err != nil {
		return fmt.Errorf("open value log %d for prefetch: %w", newest, err)
	}
	p.close()
	p.f, p.fid, p.ahead, p.wbDone = f, newest, 0, 0
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
	p := &vlogPrefetcher{dir: s.opts.Dir, fileSize: s.opts.ValueLogFileSize}
	if !s.opts.Fsync {
		// Read at each call, not here: a test sets writebackFn after Open, before its first append
		// (which wakes this goroutine).
		p.writeback = func(f *prefetchFile, off, n int64) error { return s.writebackFn(f, off, n) }
	}
	defer p.close()
	var lastErr string
	for {
		select {
		case <-s.stopPrefetch:
			return
		case <-s.prefetchWake:
		}
		n, wrote, err := p.step()
		s.prefetched.Add(n)
		if wrote {
			s.writebacks.Add(1)
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
