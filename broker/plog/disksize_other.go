//go:build !unix

package plog

import "io/fs"

// fileDiskSize returns the file's length: this system does not say how much of it is allocated.
func fileDiskSize(info fs.FileInfo) int64 { return info.Size() }

// freeBytes returns -1: this build does not check free space (no free-space guard).
func freeBytes(string) int64 { return -1 }
