//go:build !linux

package plog

import "os"

// fsyncCoversMmap is false: POSIX leaves it to msync to write back a shared mapping's changes, so
// syncToDisk calls db.Sync (Badger's msyncs) before it fsyncs the files.
const fsyncCoversMmap = false

// datasync is fsync(2) where fdatasync is not available.
func datasync(f *os.File) error { return f.Sync() }
