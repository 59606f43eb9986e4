//go:build unix

package plog

import (
	"io/fs"
	"syscall"
)

// fileDiskSize returns the bytes allocated to a file (512-byte blocks, as stat(2) counts them), which
// for a sparse file is less than its length.
func fileDiskSize(info fs.FileInfo) int64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return int64(st.Blocks) * 512
	}
	return info.Size()
}

// freeBytes returns the bytes of dir's filesystem available to this process (statfs f_bavail), or -1
// when the system does not say.
func freeBytes(dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return -1
	}
	return int64(st.Bavail) * int64(st.Bsize)
}
