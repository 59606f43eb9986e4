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

// closeGoneEnv, when set to "MODE:DIR", turns the test binary into the child of
// TestCloseGivesUpWhenDirectoryIsGone. A child because the store it leaves behind keeps Badger's
// goroutines running, which goleak would count against the package's other tests.
const closeGoneEnv = "PLOG_CLOSE_GONE_DIR"

// closeGoneTimeout is the child's Options.CloseTimeout.
const closeGoneTimeout = 2 * time.Second

// closeGoneChild opens a store in DIR and appends a batch, then makes Badger's memtable flushes fail,
// which Badger retries once a second without end:
//   - mode "gone" removes DIR, so Close gets stuck in Badger's close (the flush of the memtable);
//   - mode "tables" takes the names of Badger's next table files (Badger creates them with O_EXCL)
//     and appends until an append no longer completes: Badger holds writes once no memtable can be
//     flushed, so the store's writer never returns and Close gets stuck before it closes the store.
//     Without fsync, so no sync notices anything first.
//
// It prints "close <is ErrCloseTimeout> <milliseconds> <error>", then "after <a read fails with
// ErrClosed> <the partition's Changed is closed> <opening another partition fails with ErrClosed>",
// and exits 0; a Close that never returns leaves the parent to kill it.
func closeGoneChild(spec string) {
	mode, dir, _ := strings.Cut(spec, ":")
	fail := func(what string, err error) {
		fmt.Fprintf(os.Stderr, "child %s: %v\n", what, err)
		os.Exit(2)
	}
	o := DefaultOptions(dir)
	o.MemTableSize, o.NumMemtables = 1<<20, 1
	o.BlockCacheSize, o.IndexCacheSize = 4<<20, 2<<20
	o.GCInterval = -1
	o.Fsync = mode != "tables"
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
	batch := func(i int) []byte { return makeBatch(panicTB{}, 0, rec{ts: int64(i + 1), value: []byte("v")}) }
	if _, err := p.Append(context.Background(), batch(0), syncAppend); err != nil {
		fail("append", err)
	}
	switch mode {
	case "gone":
		if err := os.RemoveAll(dir); err != nil {
			fail("remove", err)
		}
	case "tables":
		for id := 1; id <= 300; id++ { // a flush takes a new file ID each try: 300 s of failures
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%06d.sst", id)), nil, 0o644); err != nil {
				fail("take table names", err)
			}
		}
		for i := 1; ; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := p.Append(ctx, batch(i), AppendOptions{LogAppendTime: -1})
			cancel()
			if errors.Is(err, context.DeadlineExceeded) {
				break // the writer is held in Badger
			}
			if err != nil {
				fail(fmt.Sprintf("append %d (want it to complete or be held)", i), err)
			}
			if i == 1_000_000 {
				fail("appends", errors.New("a million appends completed: Badger no longer holds writes when it cannot flush"))
			}
		}
	default:
		fail("mode", fmt.Errorf("unknown mode %q", mode))
	}
	start := time.Now()
	err = s.Close()
	fmt.Printf("close %t %d %v\n", errors.Is(err, ErrCloseTimeout), time.Since(start).Milliseconds(), err)
	_, rerr := p.Read(nil, 0, 1<<20) // must not block where the shutdown is stuck
	changed := false
	select {
	case <-p.Changed():
		changed = true
	default:
	}
	_, oerr := s.Partition(PartitionID{TopicNum: 1, Partition: 1}) // a call on the store, not on a partition
	fmt.Printf("after %t %t %t\n", errors.Is(rerr, ErrClosed), changed, errors.Is(oerr, ErrClosed))
	os.Exit(0)
}

// TestCloseGivesUpWhenDirectoryIsGone: Badger retries the flush of its memtable without end when it
// cannot write the table (its directory was removed, or the disk fails table writes), so a Close
// without a bound never returns and a stopping node never exits. Close must give up after
// CloseTimeout with ErrCloseTimeout (not some other bound), and the store must then refuse calls with
// ErrClosed and have woken long-polls (its Changed channels closed), wherever the shutdown is stuck:
// in Badger's close, or behind a write Badger holds.
func TestCloseGivesUpWhenDirectoryIsGone(t *testing.T) {
	for _, mode := range []string{"gone", "tables"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "store")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), closeGoneEnv+"="+mode+":"+dir)
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
			var timedOut, readClosed, changed, openClosed bool
			var ms int64
			if _, err := fmt.Sscanf(lines[0], "close %t %d", &timedOut, &ms); err != nil {
				t.Fatalf("child printed %q: %v", lines[0], err)
			}
			if !timedOut {
				t.Fatalf("Close returned %q, want an error wrapping ErrCloseTimeout (does Badger still retry a failed flush without end?)", lines[0])
			}
			// The upper bound is far below DefaultCloseTimeout: a Close on some other bound fails it.
			if ms < closeGoneTimeout.Milliseconds() || ms > 5*closeGoneTimeout.Milliseconds() {
				t.Fatalf("Close gave up after %d ms, want about its CloseTimeout of %s", ms, closeGoneTimeout)
			}
			if !strings.Contains(lines[0], dir) {
				t.Fatalf("Close's error %q does not name the store's directory %s", lines[0], dir)
			}
			if _, err := fmt.Sscanf(lines[1], "after %t %t %t", &readClosed, &changed, &openClosed); err != nil {
				t.Fatalf("child printed %q: %v", lines[1], err)
			}
			if !readClosed || !changed || !openClosed {
				t.Fatalf("after Close gave up: a read failed with ErrClosed %t, the partition's Changed closed %t, opening a partition failed with ErrClosed %t; want all three",
					readClosed, changed, openClosed)
			}
		})
	}
}
