package profile

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// readProfile returns the decompressed bytes of the pprof profile at path (gzip-compressed protobuf,
// as pprof writes it), failing t when it is not one.
func readProfile(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s is not gzip-compressed, as pprof writes a profile: %v", path, err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWriteAllocs checks that the profile holds an allocation made just before it was written.
func TestWriteAllocs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "allocs.pprof")
	rate := runtime.MemProfileRate
	runtime.MemProfileRate = 1 // every allocation sampled
	defer func() { runtime.MemProfileRate = rate }()
	runtime.GC()
	kept := allocForProfileTest()
	if err := WriteAllocs(path); err != nil {
		t.Fatal(err)
	}
	runtime.KeepAlive(kept)
	if b := readProfile(t, path); !bytes.Contains(b, []byte("allocForProfileTest")) {
		t.Errorf("the profile (%d bytes) does not hold the allocation made just before it was written", len(b))
	}
}

// allocForProfileTest makes one allocation that TestWriteAllocs looks for by this function's name.
//
//go:noinline
func allocForProfileTest() []byte { return make([]byte, 4096) }

// TestStartCPU checks that stop leaves a profile, that a second profile cannot start while one runs,
// and that an empty path or a file that cannot be created writes nothing.
func TestStartCPU(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cpu.pprof")
	stop, err := StartCPU(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := StartCPU(filepath.Join(dir, "second.pprof")); err == nil {
		t.Error("a second CPU profile started while one ran")
	}
	stop()
	readProfile(t, path)

	stop, err = StartCPU("")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if err := WriteAllocs(""); err != nil {
		t.Fatal(err)
	}
	if _, err := StartCPU(filepath.Join(dir, "missing", "cpu.pprof")); err == nil {
		t.Error("StartCPU into a directory that does not exist did not fail")
	}
	if err := WriteAllocs(filepath.Join(dir, "missing", "allocs.pprof")); err == nil {
		t.Error("WriteAllocs into a directory that does not exist did not fail")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the directory holds %d entries, want only cpu.pprof", len(entries))
	}
}
