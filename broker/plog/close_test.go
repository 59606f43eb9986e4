package plog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// closeGoneEnv, when set to a directory, turns the test binary into the child of
// TestCloseGivesUpWhenDirectoryIsGone. A child because the store it leaves behind keeps Badger's
// goroutines running, which goleak would count against the package's other tests.
const closeGoneEnv = "PLOG_CLOSE_GONE_DIR"

// closeGoneTimeout is the child's Options.CloseTimeout.
const closeGoneTimeout = 2 * time.Second

// closeGoneChild opens a store in dir, appends a batch (so Badger's memtable has something to flush),
// removes dir and closes the store. It prints "close <is ErrCloseTimeout> <milliseconds> <error>", then
// "after <a read fails with ErrClosed> <the partition's Changed is closed>", and exits 0; a Close that
// never returns leaves the parent to kill it.
func closeGoneChild(dir string) {
	fail := func(what string, err error) {
		fmt.Fprintf(os.Stderr, "child %s: %v\n", what, err)
		os.Exit(2)
	}
	o := DefaultOptions(dir)
	o.MemTableSize, o.NumMemtables = 4<<20, 2
	o.BlockCacheSize, o.IndexCacheSize = 4<<20, 2<<20
	o.GCInterval = -1
	o.CloseTimeout = closeGoneTimeout
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil)) // Badger logs each failed flush, once a second
	s, err := Open(o)
	if err != nil {
		fail("open", err)
	}
	p, err := s.Partition(PartitionID{TopicNum: 1, Partition: 0})
	if err != nil {
		fail("partition", err)
	}
	if _, err := p.Append(context.Background(), makeBatch(panicTB{}, 0, rec{ts: 1, value: []byte("v")}), syncAppend); err != nil {
		fail("append", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		fail("remove", err)
	}
	start := time.Now()
	err = s.Close()
	fmt.Printf("close %t %d %v\n", errors.Is(err, ErrCloseTimeout), time.Since(start).Milliseconds(), err)
	_, rerr := p.Read(nil, 0, 1<<20) // must not block: the shutdown is stuck in Badger's close
	changed := false
	select {
	case <-p.Changed():
		changed = true
	default:
	}
	fmt.Printf("after %t %t\n", errors.Is(rerr, ErrClosed), changed)
	os.Exit(0)
}

// TestCloseGivesUpWhenDirectoryIsGone: Badger retries the flush of its memtable without end when it
// cannot write the table (here its directory was removed), so a Close without a bound never returns
// and a stopping node never exits. Close must give up after CloseTimeout with ErrCloseTimeout, and the
// store must then refuse calls with ErrClosed and have woken long-polls (its Changed channels closed).
func TestCloseGivesUpWhenDirectoryIsGone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), closeGoneEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if ctx.Err() != nil {
		t.Fatalf("the child's Close had not returned after 60 s (CloseTimeout %s)", closeGoneTimeout)
	}
	if err != nil {
		t.Fatalf("child: %v (stdout %q)", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("child printed %q, want two lines", out)
	}
	var timedOut, readClosed, changed bool
	var ms int64
	if _, err := fmt.Sscanf(lines[0], "close %t %d", &timedOut, &ms); err != nil {
		t.Fatalf("child printed %q: %v", lines[0], err)
	}
	if !timedOut {
		t.Fatalf("Close returned %q, want an error wrapping ErrCloseTimeout (does Badger still retry a failed flush without end?)", lines[0])
	}
	if ms < closeGoneTimeout.Milliseconds() {
		t.Fatalf("Close gave up after %d ms, before its CloseTimeout of %s", ms, closeGoneTimeout)
	}
	if !strings.Contains(lines[0], dir) {
		t.Fatalf("Close's error %q does not name the store's directory %s", lines[0], dir)
	}
	if _, err := fmt.Sscanf(lines[1], "after %t %t", &readClosed, &changed); err != nil {
		t.Fatalf("child printed %q: %v", lines[1], err)
	}
	if !readClosed || !changed {
		t.Fatalf("after Close gave up: a read failed with ErrClosed %t, the partition's Changed closed %t; want both", readClosed, changed)
	}
}
