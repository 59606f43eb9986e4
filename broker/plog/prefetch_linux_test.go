//go:build linux

package plog

import (
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cachedPages reports how many of the pages of path in [off, off+n) are in the page cache (mincore of
// a mapping of the file), and how many pages that range has.
func cachedPages(t *testing.T, path string, off, n int64) (cached, pages int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ps := int64(os.Getpagesize())
	off &^= ps - 1
	m, err := unix.Mmap(int(f.Fd()), off, int(n), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("map %s: %v", path, err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (n+ps-1)/ps)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	for _, v := range vec {
		if v&1 != 0 {
			cached++
		}
	}
	return cached, len(vec)
}

// mostlyCached reports whether more than half of pages are cached. Tests that expect pages to be (or
// to stay) cached ask for that, not for all of them: the kernel may reclaim a few clean pages under
// memory pressure (a CI run lost 8 of 4,152), while a missing prefetch or a drop of the range leaves
// almost none. A partial prefetch or drop is caught by the byte counts the tests also check.
func mostlyCached(cached, pages int) bool { return 2*cached > pages }

// sparseVlog makes a file as Badger makes an active value-log file: sparse, twice size long, written
// at the start through a shared mapping (byte i holds byte(i)); it returns the file's path.
func sparseVlog(t *testing.T, dir string, fid uint64, size, written int64) string {
	t.Helper()
	path, _ := mappedVlog(t, dir, fid, size, written, func(i int64) byte { return byte(i) })
	return path
}

// TestPrefetcherCachesAheadOfWrites: a step puts the window past the written data of the newest value
// log in the page cache, where nothing was cached before (the file is a hole there), and leaves the
// written data as it was; at the end of a file it moves to the next one Badger created.
func TestPrefetcherCachesAheadOfWrites(t *testing.T) {
	dir := t.TempDir()
	const size = 64 << 20
	const written = 3<<20 + 123
	sparseVlog(t, dir, 1, size, size) // a full, older file the prefetcher must skip
	path := sparseVlog(t, dir, 2, size, written)
	// Past the first folio after the written data (Badger's own faults read around the write).
	probeOff, probeLen := int64(8<<20), int64(prefetchWindow-(8<<20))
	if c, _ := cachedPages(t, path, probeOff, probeLen); c != 0 {
		t.Fatalf("%d pages of the window cached before any prefetch: the test cannot tell", c)
	}

	p := &vlogPrefetcher{dir: dir, fileSize: size}
	defer p.close()
	res, err := p.step()
	n := res.asked
	if err != nil {
		t.Fatalf("step: %v", err)
	}
	if p.fid != 2 {
		t.Fatalf("prefetching value log %d, want the newest, 2", p.fid)
	}
	if n < prefetchWindow-(2<<20) || p.ahead < written+prefetchWindow-(2<<20) {
		t.Fatalf("asked for %d bytes up to offset %d; want the %d bytes past the written end %d", n, p.ahead, prefetchWindow, written)
	}
	if c, pages := cachedPages(t, path, probeOff, probeLen); !mostlyCached(c, pages) {
		t.Fatalf("%d of %d pages of the window cached after a step", c, pages)
	}
	if res, err := p.step(); err != nil || res.asked != 0 {
		n := res.asked
		t.Fatalf("a second step with nothing written asked for %d bytes (err %v), want none", n, err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range int64(written) {
		if got[i] != byte(i) {
			t.Fatalf("byte %d changed by the prefetch: %d", i, got[i])
		}
	}
	for i := int64(written); i < int64(len(got)); i++ {
		if got[i] != 0 {
			t.Fatalf("byte %d past the written end is %d after the prefetch, want 0", i, got[i])
		}
	}

	// Badger fills file 2 and rotates: the prefetcher follows it to file 3.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, size-written+1), written); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := p.step(); err != nil {
		t.Fatalf("step at the end of a file: %v", err)
	}
	next := sparseVlog(t, dir, 3, size, 1<<20)
	if _, err := p.step(); err != nil {
		t.Fatalf("step after the rotation: %v", err)
	}
	if p.fid != 3 {
		t.Fatalf("prefetching value log %d after the rotation, want 3", p.fid)
	}
	if c, pages := cachedPages(t, next, probeOff, probeLen); !mostlyCached(c, pages) {
		t.Fatalf("%d of %d pages of the new file's window cached", c, pages)
	}
}

// TestPrefetcherWithoutValueLog: before Badger created a value-log file a step does nothing.
func TestPrefetcherWithoutValueLog(t *testing.T) {
	p := &vlogPrefetcher{dir: t.TempDir(), fileSize: 1 << 20}
	if res, err := p.step(); err != nil || res.asked != 0 || p.f != nil {
		t.Fatalf("step in an empty directory: %d bytes, err %v", res.asked, err)
	}
}

// TestStorePrefetchesValueLog: a store's writer wakes the prefetcher as it writes, so the pages past
// the end of the active value log are cached before Badger writes them.
func TestStorePrefetchesValueLog(t *testing.T) {
	for _, fsync := range []bool{false, true} {
		o := testOptions(t, fsync)
		o.ValueLogFileSize = 64 << 20
		s := openStore(t, o)
		p := mustPartition(t, s, pid)
		for i := range 8 {
			mustAppend(t, p, sizedBatch(t, 500_000, int64(i)), syncAppend)
		}
		waitFor(t, 10*time.Second, "a prefetch", func() bool { return s.prefetched.Load() > 0 })
		files, err := badgerLogFiles(o.Dir)
		if err != nil {
			t.Fatal(err)
		}
		var newest uint64
		for _, f := range files {
			if f.vlog {
				newest = max(newest, f.fid)
			}
		}
		path := filepath.Join(o.Dir, vlogName(newest))
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		end, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_HOLE)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		// The last step ran after at most prefetchTrigger bytes fewer than were written.
		waitFor(t, 10*time.Second, "the window cached", func() bool {
			c, pages := cachedPages(t, path, end, prefetchWindow/2)
			return mostlyCached(c, pages)
		})
	}
}
