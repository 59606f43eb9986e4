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
