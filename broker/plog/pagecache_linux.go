//go:build linux

package plog

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// dropPages asks the kernel to evict the clean page-cache pages of the file at path in [off, off+n)
// (pagecache.go): it zaps own's mapping of the range (own is the prefetcher's mapping of the file, or
// nil), reclaims the range from every shared mapping of the file in this process (madvise
// MADV_PAGEOUT: Badger's), then evicts what no mapping maps any more (POSIX_FADV_DONTNEED). Dirty pages
// and pages under writeback stay. The file's contents never change.
//
// MADV_PAGEOUT is the one call here applied to memory this package does not own: if Badger unmapped
// the file after /proc/self/maps was read and something else was mapped there, it only asks the kernel
// to reclaim that memory, which moves no data (file pages are read back, anonymous ones swapped in).
// MADV_DONTNEED, which would discard an anonymous page, is only used on own.
func dropPages(path string, own *prefetchFile, off, n int64) error {
	if own != nil {
		end := min(off+n, int64(len(own.m)))
		if off < end {
			if err := unix.Madvise(own.m[off:end], unix.MADV_DONTNEED); err != nil {
				return fmt.Errorf("unmap the prefetch mapping: %w", err)
			}
		}
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return err
	}
	for _, m := range fileMappings(maps, path) {
		a, b := max(off, m.offset), min(off+n, m.offset+int64(m.end-m.start))
		if a >= b {
			continue
		}
		_, _, errno := unix.Syscall(unix.SYS_MADVISE, m.start+uintptr(a-m.offset), uintptr(b-a), unix.MADV_PAGEOUT)
		switch {
		case errno == 0, errno == unix.ENOMEM: // ENOMEM: part of the range is no longer mapped
		case errno == unix.EINVAL:
			return fmt.Errorf("%w: madvise(MADV_PAGEOUT) needs Linux 5.4: %v", errNoDrop, errno)
		default:
			return fmt.Errorf("madvise(MADV_PAGEOUT): %w", errno)
		}
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil // deleted: its pages go when the last mapping does
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), off, n, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("fadvise(POSIX_FADV_DONTNEED): %w", err)
	}
	return nil
}

// mapping is a shared mapping of a file: addresses [start, end) map the file from offset.
type mapping struct {
	start, end uintptr
	offset     int64
}

// fileMappings returns the shared mappings of the file at path in maps, the text of
// /proc/<pid>/maps (proc(5): "start-end perms offset dev inode path", path absolute with symbolic links
// resolved, " (deleted)" appended once the file is unlinked). Lines it cannot parse are skipped.
func fileMappings(maps []byte, path string) []mapping {
	var out []mapping
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		line := sc.Bytes()
		// Five space-separated fields, then spaces up to the path (which may itself hold spaces).
		var fields [5][]byte
		rest := line
		ok := true
		for i := range fields {
			rest = bytes.TrimLeft(rest, " ")
			j := bytes.IndexByte(rest, ' ')
			if j < 0 {
				ok = false
				break
			}
			fields[i], rest = rest[:j], rest[j:]
		}
		if !ok || string(bytes.TrimLeft(rest, " ")) != path {
			continue
		}
		perms := fields[1]
		if len(perms) != 4 || perms[3] != 's' {
			continue
		}
		lo, hi, found := bytes.Cut(fields[0], []byte{'-'})
		if !found {
			continue
		}
		start, err1 := strconv.ParseUint(string(lo), 16, 64)
		end, err2 := strconv.ParseUint(string(hi), 16, 64)
		offset, err3 := strconv.ParseInt(string(fields[2]), 16, 64)
		if err1 != nil || err2 != nil || err3 != nil || end <= start || offset < 0 {
			continue
		}
		out = append(out, mapping{start: uintptr(start), end: uintptr(end), offset: offset})
	}
	return out
}
