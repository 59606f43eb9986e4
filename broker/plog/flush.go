package plog

import (
	"errors"
	"fmt"
	"io/fs"
)

// Without Options.Fsync nothing waits for the disk but Badger, once per value-log file: when it rotates
// to the next file it truncates the one it leaves (z.MmapFile.Truncate), which msyncs the whole mapping
// first, on its one write goroutine, so every append of every partition waits for it. That msync waits
// for the file's writebacks still in flight and then flushes the disk's write cache, and writes queued
// behind a flush wait for it. A flush costs more the more was written since the last one: on the 2-core
// machine of issue 9 (ext4 without a journal on a virtual disk, 2026-11-30) an fdatasync of a value-log
// file flushed 240 MiB after its last flush took 300 ms, one every 16 MiB took 20-25 ms.
//
// So the flusher keeps the active value-log file flushed every flushInterval, in a goroutine of its own,
// off the write path and off the prefetch goroutine (which must keep prefetching meanwhile), and Badger's
// msync at the rotation finds little to write back and flush. It replaced one sync per file, made by
// the prefetch goroutine 16 MiB before the rotation: when the disk flushed slowly, the rotation came
// while that sync was still flushing the whole file, and Badger's msync waited 140-170 ms for it. The
// produce p99 at 1.1-1.2 M records/s was 200-290 ms with it; with a flush every 16 MiB 28-46 ms, every
// 8 MiB 20-34 ms, every 4 MiB 17-24 ms, every 2 MiB 18-25 ms, and full-speed throughput did not change
// beyond the noise (docs/performance.md). Nobody waits for a flush, so acknowledgements promise what
// they did without it; a failed one fails the store, as a failed writeback does (the kernel may have
// dropped the pages it could not write). With Options.Fsync every group is synced before it is
// acknowledged and the flusher has nothing to do.

// flushBytes is how many bytes of the active value-log file may be written since the last flush the
// flusher took before the prefetcher hands it another. Each flush has about that much to flush, and so
// has the rotation's msync, with what was written while the last flush ran. Swept on the machine above at 1.2 M records/s: the p99 with 16 MiB
// was 32-36 ms, 8 MiB 20-34 ms, 4 MiB 17-24 ms and 2 MiB 18-25 ms. A flush also writes back the folio
// Badger is writing into, which the writebacks avoid (writebackLag) because an msync of it once held
// Badger's writes for 5-45 ms on a machine whose ext4 had a journal to commit; at 4 MiB that did not
// show here, in the p99s above or in the sched_switch stacks.
const flushBytes = 4 << 20

// flushInterval is flushBytes, or a quarter of value-log files smaller than 16 MiB (tests).
func flushInterval(fileSize int64) int64 { return min(flushBytes, fileSize/4) }

// flushReq asks the flusher to flush value-log file fid, at path, whose written end was end when the
// prefetcher asked (for error messages and tests: the flush covers whatever is written by then).
type flushReq struct {
	path string
	fid  uint64
	end  int64
}

// flushLoop is the flusher goroutine: it flushes each file it is handed (datasyncFn), one at a time,
// until stopFlusher is closed. A flush of a file that is gone is skipped (Badger deleted it, so
// nothing of it is left to keep); any other failure fails the store and ends the goroutine.
func (s *Store) flushLoop() {
	defer close(s.flusherDone)
	for {
		var r flushReq
		select {
		case <-s.stopFlusher:
			return
		case r = <-s.flushReqs:
		}
		err := s.datasyncFn(r)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		s.flushes.Add(1) // failed or not: a test waits for every flush taken to be counted
		if err != nil {
			s.fail(fmt.Errorf("%s: flush value log %d written to %d: %w", s.opts.Dir, r.fid, r.end, err))
			return
		}
	}
}

// requestFlush hands r to the flusher if it is idle and reports whether it took it (prefetch goroutine
// only). A busy flusher is not queued for: the prefetcher asks again at its next step, for the file's
// end then.
func (s *Store) requestFlush(r flushReq) bool {
	select {
	case s.flushReqs <- r:
		return true
	default:
		return false
	}
}
