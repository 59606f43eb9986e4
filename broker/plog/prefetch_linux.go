//go:build linux

package plog

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// prefetchFile is a value-log file open for prefetching: a descriptor and a read-only shared mapping
// of its first mapLen bytes, as long as Badger's own mapping of it.
type prefetchFile struct {
	f *os.File
	m []byte
}

// openPrefetchFile opens path and maps mapLen bytes of it read-only.
func openPrefetchFile(path string, mapLen int64) (*prefetchFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(mapLen), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("map %s: %w", path, err)
	}
	return &prefetchFile{f: f, m: m}, nil
}

// dataEnd returns where the written data ends: the first hole (SEEK_HOLE). ext4 counts pages written
// through a mapping but not yet allocated (delayed allocation) as data, rounded up to the page-cache
// folio (up to 2 MiB), and pages read into a hole as hole, so for an append-only file this is the
// write position, at most a folio high.
func (p *prefetchFile) dataEnd() (int64, error) {
	return unix.Seek(int(p.f.Fd()), 0, unix.SEEK_HOLE)
}

// populate faults n bytes at off into the page cache through the read-only mapping
// (madvise MADV_POPULATE_READ, Linux 5.14). The read fault is the one Badger's write would take: it
// reads the range in as large folios and zeroes them, so Badger's write fault later only maps the
// folio writable. (POSIX_FADV_WILLNEED would read the range in as 4 KiB pages, each a write fault of its
// own later, which cost more than it spared.) Past the end of a file Badger truncated meanwhile it
// fails with EFAULT instead of raising SIGBUS, as touching the mapping would.
func (p *prefetchFile) populate(off, n int64) error {
	err := unix.Madvise(p.m[off:off+n], unix.MADV_POPULATE_READ)
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("%w: madvise(MADV_POPULATE_READ) needs Linux 5.14: %v", errNoPrefetch, err)
	}
	return err
}

// writeback starts writing n bytes of the file at off back to the disk and waits for nothing
// (sync_file_range SYNC_FILE_RANGE_WRITE): no journal commit, no metadata, no promise of durability.
func (p *prefetchFile) writeback(off, n int64) error {
	return unix.SyncFileRange(int(p.f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}

// datasyncFile writes the data of the file at path back and waits for it and for the disk's cache
// flush (fdatasync), through a descriptor of its own: the flusher calls it while the prefetch goroutine
// may close its own (flush.go). A descriptor opened after a writeback failed still reports that failure
// if no caller has been told of it yet (errseq; Linux 4.17 and later report such an error to the next
// descriptor opened), so none is lost between two flushes. An error wrapping fs.ErrNotExist means the
// file is gone.
func datasyncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("fdatasync %s: %w", path, err)
	}
	return nil
}

// close unmaps and closes the file.
func (p *prefetchFile) close() {
	unix.Munmap(p.m)
	p.f.Close()
}
