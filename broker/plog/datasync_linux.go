package plog

import (
	"os"

	"golang.org/x/sys/unix"
)

// datasync is fdatasync(2): the file's data and what reading it back needs (its size), not its
// timestamps, which is what Badger's msync(MS_SYNC) of a mapped file does too.
func datasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
