package plog

import (
	"os"

	"golang.org/x/sys/unix"
)

// fsyncCoversMmap: on Linux an fsync or fdatasync of a file writes back the dirty pages of its shared
// memory maps too (they are the page cache's pages), so syncToDisk needs no msync of Badger's.
const fsyncCoversMmap = true

// datasync is fdatasync(2): the file's data and what reading it back needs (its size), not its
// timestamps, which is what Badger's msync(MS_SYNC) of a mapped file does too.
func datasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
