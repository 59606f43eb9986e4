// Package profile writes the CPU and allocation profiles of a benchmark's client process, for
// `runnel bench` (--cpuprofile, --memprofile) and the bench/peers harness (-cpuprofile, -memprofile).
// Open them with `go tool pprof BINARY FILE`.
package profile

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
)

// StartCPU starts a CPU profile of this process into the file at path, created or truncated, and
// returns the function that stops it and closes the file. With path "" it does nothing and returns a
// stop that does nothing. Errors are the file's, or pprof's when a CPU profile already runs (the file
// is then removed).
func StartCPU(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		os.Remove(path) // empty: no file is better than one that looks like a profile
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// WriteAllocs writes the allocation profile (every allocation since the process started, as sampled by
// the runtime; pprof shows alloc_space by default) into the file at path, created or truncated; with
// path "" it does nothing. It collects garbage first: the runtime's profile counts what was allocated
// up to the last completed collection. Call it after the measured work, since the collection is not
// the work's.
func WriteAllocs(path string) error {
	if path == "" {
		return nil
	}
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("allocation profile: %w", err)
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("write allocation profile %s: %w", path, err)
	}
	return f.Close()
}
