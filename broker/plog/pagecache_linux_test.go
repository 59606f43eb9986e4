//go:build linux

package plog

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runnel-io/runnel/client/batch"
)

// mappedVlog makes a value-log file as Badger does (sparse, twice size long, mapped shared and
// writable), writes its first written bytes through the mapping (byte i holds fill(i)) and fsyncs;
// it returns the path and the mapping, which stays mapped until the test ends, as Badger's does.
func mappedVlog(t *testing.T, dir string, fid uint64, size, written int64, fill func(int64) byte) (string, []byte) {
	t.Helper()
	path := filepath.Join(dir, vlogName(fid))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(2 * size); err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(2*size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	for i := range written {
		m[i] = fill(i)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return path, m
}

// badgerLikeVlog is mappedVlog with a pattern of seed: byte i holds byte(i>>12)+seed, so every page
// differs from its neighbours and from the other files'.
func badgerLikeVlog(t *testing.T, dir string, fid uint64, size, written int64, seed byte) (string, []byte) {
	t.Helper()
	return mappedVlog(t, dir, fid, size, written, func(i int64) byte { return byte(i>>12) + seed })
}

// checkPattern fails unless the first n bytes of path hold badgerLikeVlog's pattern for seed.
func checkPattern(t *testing.T, path string, n int64, seed byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(got)) < n {
		t.Fatalf("%s is %d bytes, want at least %d", path, len(got), n)
	}
	for i := range n {
		if got[i] != byte(i>>12)+seed {
			t.Fatalf("%s: byte %d is %d after the drop, want %d", path, i, got[i], byte(i>>12)+seed)
		}
	}
}

// TestPrefetcherDropsBehindWindow: a step drops the pages more than the window behind the written
// end, those of the file Badger rotated away from first, and the active file's up to a folio boundary;
// the pages inside the window stay cached, and the files' contents do not change.
func TestPrefetcherDropsBehindWindow(t *testing.T) {
	dir := t.TempDir()
	const size = 16 << 20
	first, m1 := badgerLikeVlog(t, dir, 1, size, 10<<20, 1)
	p := &vlogPrefetcher{dir: dir, fileSize: size, window: 8 << 20}
	defer p.close()
	res, err := p.step()
	if err != nil || res.dropErr != nil {
		t.Fatalf("step: %v, drop: %v", err, res.dropErr)
	}
	if res.dropped != 0 {
		t.Fatalf("dropped %d bytes with 10 MiB written and an 8 MiB window: less than a dropChunk is over", res.dropped)
	}

	// Badger fills file 1, truncates it to its written length and goes on in file 2.
	const firstLen = size + 100
	for i := int64(10 << 20); i < firstLen; i++ {
		m1[i] = byte(i>>12) + 1
	}
	if err := unix.Msync(m1, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(first, firstLen); err != nil {
		t.Fatal(err)
	}
	second, _ := badgerLikeVlog(t, dir, 2, size, 12<<20, 2)
	if c, pages := cachedPages(t, first, 0, firstLen); !mostlyCached(c, pages) {
		t.Fatalf("%d of %d pages of file 1 cached before the drop: the test cannot tell", c, pages)
	}

	res, err = p.step()
	if err != nil || res.dropErr != nil {
		t.Fatalf("step after the rotation: %v, drop: %v", err, res.dropErr)
	}
	// 28 MiB + 100 bytes retained, 8 MiB window: all of file 1, then the first 4 MiB of file 2.
	if want := int64(firstLen + 4<<20); res.dropped != want {
		t.Fatalf("dropped %d bytes, want %d (file 1 and the first 4 MiB of file 2)", res.dropped, want)
	}
	// The last page, which the truncation cut inside, is left out: the truncation zeroes its tail
	// past the new end and so dirties it again, and a dirty page stays cached until its writeback,
	// which the drop starts but does not wait for (1 run in 10 kept it).
	if c, _ := cachedPages(t, first, 0, size); c != 0 {
		t.Fatalf("%d pages of file 1 still cached", c)
	}
	if c, _ := cachedPages(t, second, 0, 4<<20); c != 0 {
		t.Fatalf("%d pages of file 2's first 4 MiB still cached", c)
	}
	if c, pages := cachedPages(t, second, 4<<20, 8<<20); !mostlyCached(c, pages) {
		t.Fatalf("%d of %d pages of file 2 inside the window cached", c, pages)
	}
	// The kernel's reclaim takes pages here and there; a drop past the boundary takes the folio right
	// after it, which the check of the whole window above would let through.
	if c, pages := cachedPages(t, second, 4<<20, 2<<20); !mostlyCached(c, pages) {
		t.Fatalf("%d of %d pages of file 2's first folio inside the window cached", c, pages)
	}
	if len(p.behind) != 0 || p.dropped != 4<<20 {
		t.Fatalf("after the drop: %d files behind, active dropped to %d", len(p.behind), p.dropped)
	}
	checkPattern(t, first, firstLen, 1)
	checkPattern(t, second, 12<<20, 2)
}

// TestStoreDropsPagesBehindWindow: a store keeps PageCacheWindow bytes of the newest value log cached
// and drops the older pages, which read back unchanged; with a negative window it drops nothing (the
// oldest file stays mostly cached: only the kernel's own reclaim takes pages then).
func TestStoreDropsPagesBehindWindow(t *testing.T) {
	for _, window := range []int64{16 << 20, -1} {
		o := testOptions(t, true) // fsync: the pages are clean once an append returns
		o.PageCacheWindow = window
		s := openStore(t, o)
		// 80 MB written is less than the default window: a negative window taken for the default
		// would drop nothing either, so the test checks the store kept the window it was given.
		if s.opts.PageCacheWindow != window {
			t.Fatalf("store opened with window %d uses %d", window, s.opts.PageCacheWindow)
		}
		p := mustPartition(t, s, pid)
		var want [][]byte
		for i := range 160 { // 80 MB: five value-log files of 16 MiB
			v := bytes.Repeat([]byte{byte(i), byte(i >> 8), 'v'}, 500_000/3)
			mustAppend(t, p, makeBatch(t, batch.CompressionNone, rec{ts: int64(i), value: v}), syncAppend)
			want = append(want, v)
		}
		files, err := badgerLogFiles(o.Dir)
		if err != nil {
			t.Fatal(err)
		}
		var vlogs []uint64
		for _, f := range files {
			if f.vlog {
				vlogs = append(vlogs, f.fid)
			}
		}
		if len(vlogs) < 4 {
			t.Fatalf("%d value-log files after 80 MB: the test needs rotations", len(vlogs))
		}
		oldest := filepath.Join(o.Dir, vlogName(min(vlogs[0], vlogs[1])))
		fi, err := os.Stat(oldest)
		if err != nil {
			t.Fatal(err)
		}
		if window < 0 {
			if n := s.pageCacheDropped.Load(); n != 0 {
				t.Fatalf("window %d: dropped %d bytes", window, n)
			}
			if c, pages := cachedPages(t, oldest, 0, fi.Size()); !mostlyCached(c, pages) {
				t.Fatalf("window %d: %d of %d pages of the oldest value log cached", window, c, pages)
			}
		} else {
			// The oldest file ends over 48 MiB behind the end: dropped by a step before the last appends.
			// The prefetcher goroutine adds a step's bytes to the counter after the step's drops, so
			// the pages can be gone before the counter says so: wait for both.
			waitFor(t, 10*time.Second, fmt.Sprintf("the oldest value log (%d bytes) dropped and counted", fi.Size()), func() bool {
				c, _ := cachedPages(t, oldest, 0, fi.Size())
				return c == 0 && s.pageCacheDropped.Load() >= fi.Size()
			})
		}
		got := readAll(t, p, 0)
		if len(got) != len(want) {
			t.Fatalf("window %d: read %d batches back, want %d", window, len(got), len(want))
		}
		for i, b := range got {
			if len(b.values) != 1 || !bytes.Equal(b.values[0], want[i]) {
				t.Fatalf("window %d: batch %d reads back changed", window, i)
			}
		}
	}
}

// TestFileMappings: the shared mappings of one path are found in /proc/<pid>/maps text, whatever the
// spacing, with paths holding spaces, and not private mappings, other files or deleted ones.
func TestFileMappings(t *testing.T) {
	maps := []byte(`00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon
7f0000000000-7f0020000000 rw-s 00000000 fe:00 9978881                    /data/dir one/000013.vlog
7f0020000000-7f0030000000 r--s 00100000 fe:00 9978881                    /data/dir one/000013.vlog
7f0030000000-7f0031000000 rw-p 00000000 fe:00 9978881                    /data/dir one/000013.vlog
7f0031000000-7f0032000000 rw-s 00000000 fe:00 9978882                    /data/dir one/000013.vlog (deleted)
7f0032000000-7f0033000000 rw-s 00000000 fe:00 9978883                    /data/dir one/000014.vlog
garbage line
7f0033000000-7f0032000000 rw-s 00000000 fe:00 9978881 /data/dir one/000013.vlog
7ffd2b3a5000-7ffd2b3c6000 rw-p 00000000 00:00 0                          [stack]
`)
	got := fileMappings(maps, "/data/dir one/000013.vlog")
	want := []mapping{
		{start: 0x7f0000000000, end: 0x7f0020000000, offset: 0},
		{start: 0x7f0020000000, end: 0x7f0030000000, offset: 0x100000},
	}
	if len(got) != len(want) {
		t.Fatalf("found %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("mapping %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// FuzzFileMappings: any text parses without a panic into mappings that are non-empty ranges at
// non-negative offsets.
func FuzzFileMappings(f *testing.F) {
	f.Add([]byte("7f0000000000-7f0020000000 rw-s 00000000 fe:00 9978881   /d/000001.vlog\n"), "/d/000001.vlog")
	f.Add([]byte("a-b rw-s 0 0 0 x\n1-0 rw-s 0 0 0 x\n-1 rw-s -5 0 0 x"), "x")
	f.Fuzz(func(t *testing.T, maps []byte, path string) {
		for _, m := range fileMappings(maps, path) {
			if m.end <= m.start || m.offset < 0 {
				t.Fatalf("bad mapping %+v", m)
			}
		}
	})
}
