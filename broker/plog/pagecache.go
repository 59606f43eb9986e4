package plog

import (
	"errors"
	"fmt"
)

// Badger writes the value log through a shared mapping, so every page it writes is a new page-cache
// page, and nothing ever frees them: the kernel evicts page cache only when free memory runs out. On a
// machine with free memory to spare each new page therefore comes from free memory that was never
// touched, or that the guest of a virtual machine handed back to its host (virtio-balloon free page
// reporting frees it there about two seconds after the guest freed it). Touching such a page is a
// fault in the host as well: on the 2-core machine of issue 9 writing to fresh memory ran at about
// 450 MB/s of one core against 4,400 MB/s to memory the guest had freed a moment before, so the
// node spent most of its kernel time, and most of the produce p99, providing page-cache memory.
//
// The prefetch goroutine therefore also drops what lies more than Options.PageCacheWindow behind the
// write position, once it is clean: the kernel puts those pages back on its free lists, and the pages
// it allocates for the next writes (and for the prefetcher's read-ahead) are then the ones just freed,
// which the host still backs. Writes leave the newest PageCacheWindow bytes of the log cached, where
// tailing consumers and followers read; a consumer further behind reads from the disk, as it would on
// a node whose page cache is full, and what it reads stays cached as any file read does until the
// kernel needs the memory (only what was written is dropped). Dropping never changes what is stored:
// a dropped page is read back from the file when it is next touched.
//
// Badger's mapping is not ours to unmap, so the drop (dropPages) asks the kernel to reclaim the range of
// Badger's mapping (madvise MADV_PAGEOUT, found by the file's name in /proc/self/maps), which evicts
// only clean pages and never changes memory; zaps the prefetcher's own mapping of the range first (a
// page mapped twice is not reclaimed); and then evicts clean pages that no mapping maps
// (POSIX_FADV_DONTNEED).

// dropChunk is the least the prefetcher drops at a time, so /proc/self/maps is read at most once per
// dropChunk bytes written.
const dropChunk = 8 << 20

// folioAlign is the largest page-cache folio (2 MiB): a drop that does not reach a file's end ends on
// a multiple of it, so the next starts page-aligned (as madvise needs) and no drop covers part of a
// folio (which the kernel would have to split or skip).
const folioAlign = 2 << 20

// errNoDrop is returned where the system cannot drop pages from another mapping (not Linux, or a
// kernel before 5.4 without MADV_PAGEOUT); the store then keeps everything, as with
// PageCacheWindow < 0.
var errNoDrop = errors.New("dropping value-log pages is not supported on this system")

// retainedFile is a value-log file the prefetcher has moved past (Badger rotated to a newer one) whose
// pages are not all dropped yet.
type retainedFile struct {
	path    string
	dropped int64 // offset up to which its pages were dropped
	end     int64 // its length: Badger truncates the file it leaves to its written data
}

// dropBehind drops the pages of the value log more than p.window bytes behind end, the active file's
// written end: those of older files first, oldest first, then the active file's from its start, in runs of
// at least dropChunk. It returns how many bytes it asked the kernel to drop. An error is the system's
// (the maps cannot be read, madvise failed) or errNoDrop; the caller only reports it.
func (p *vlogPrefetcher) dropBehind(end int64) (int64, error) {
	if p.window <= 0 || p.f == nil {
		return 0, nil
	}
	retained := end - p.dropped
	for _, r := range p.behind {
		retained += r.end - r.dropped
	}
	excess := retained - p.window
	if excess < dropChunk {
		return 0, nil
	}
	var asked int64
	for len(p.behind) > 0 && excess > 0 {
		r := &p.behind[0]
		n := r.end - r.dropped
		if n > excess {
			// Part of the file: up to a folio boundary, so the next drop starts page-aligned (madvise
			// needs that) on a folio.
			if n = (r.dropped+excess)&^(folioAlign-1) - r.dropped; n <= 0 {
				break
			}
		}
		err := dropPages(r.path, nil, r.dropped, n)
		r.dropped += n
		excess -= n
		asked += n
		if r.dropped >= r.end {
			p.behind = p.behind[1:]
		}
		if err != nil {
			return asked, fmt.Errorf("drop pages of %s: %w", r.path, err)
		}
	}
	upto := (p.dropped + excess) &^ (folioAlign - 1)
	if upto <= p.dropped {
		return asked, nil
	}
	err := dropPages(p.path, p.f, p.dropped, upto-p.dropped)
	asked += upto - p.dropped
	p.dropped = upto
	if err != nil {
		return asked, fmt.Errorf("drop pages of %s: %w", p.path, err)
	}
	return asked, nil
}
