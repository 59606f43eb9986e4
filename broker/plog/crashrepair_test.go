package plog

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReopenAfterKillAtValueLogCreation: a value-log file of 0 bytes, what a kill between Badger's
// creation of the file and its sizing leaves, no longer stops the store from opening; the empty file is
// removed (Badger's open creates it anew) with a warning naming it, every batch written before is read
// back, and appends go on past the next rotation.
func TestReopenAfterKillAtValueLogCreation(t *testing.T) {
	o := testOptions(t, true)
	o.ValueLogFileSize = 1 << 20
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	p := mustPartition(t, s, pid)
	const n = 30 // 3 MB: a few rotations
	for i := range n {
		mustAppend(t, p, sizedBatch(t, 100_000, int64(i)), syncAppend)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(o.Dir, vlogName(newestVlog(o.Dir)+1))
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	var logged bytes.Buffer
	o.Logger = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s = openStore(t, o)
	if !strings.Contains(logged.String(), "deleted an empty value-log file") || !strings.Contains(logged.String(), empty) {
		t.Fatalf("the open did not log the deletion of %s; log:\n%s", empty, logged.String())
	}
	// Badger's open creates its next value log anew, under the same name.
	if fi, err := os.Stat(empty); err == nil && fi.Size() == 0 {
		t.Fatalf("the empty value log %s is still empty after the open", empty)
	}
	p = mustPartition(t, s, pid)
	if got := readAll(t, p, 0); len(got) != n {
		t.Fatalf("read %d batches after the reopen, want %d", len(got), n)
	}
	for i := range 2 * n {
		mustAppend(t, p, sizedBatch(t, 100_000, int64(n+i)), syncAppend)
	}
	if got := readAll(t, p, 0); len(got) != 3*n {
		t.Fatalf("read %d batches after appending past a rotation, want %d", len(got), 3*n)
	}
}
