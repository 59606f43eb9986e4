package plog

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
)

var plainAppend = AppendOptions{LogAppendTime: -1}

// TestWritebackWithoutFsync: without Options.Fsync the syncer still writes the data back every
// writebackBytes, so Badger's msync at a value-log rotation finds the file nearly clean (issue 9: that
// msync stalled every write for 75-450 ms). Appends do not wait for it, and it runs once per
// writebackBytes written, not once per group.
func TestWritebackWithoutFsync(t *testing.T) {
	o := testOptions(t, false)
	o.ValueLogFileSize = 64 << 20
	s := openStore(t, o)
	var calls atomic.Int64
	s.syncFn = func() error { calls.Add(1); return s.syncToDisk() }
	p := mustPartition(t, s, pid)
	const size = 100_000
	n := 3*writebackBytes/size + 1
	var written int64
	for i := range n {
		b := sizedBatch(t, size, int64(i))
		written += int64(len(b))
		mustAppend(t, p, b, plainAppend)
	}
	waitFor(t, 10*time.Second, "writebacks", func() bool { return calls.Load() >= 3 })
	if max := written / writebackBytes; calls.Load() > max || s.writebacks.Load() > max {
		t.Fatalf("%d writebacks (counted %d) for %d bytes: at most one per %d bytes wanted", calls.Load(), s.writebacks.Load(), written, writebackBytes)
	}
	if s.fsyncs.Load() != 0 {
		t.Fatalf("%d acknowledgement fsyncs without Options.Fsync", s.fsyncs.Load())
	}
	if got := readAll(t, p, 0); len(got) != n {
		t.Fatalf("read %d batches of %d", len(got), n)
	}
}

// TestNoWritebackWithFsync: with Options.Fsync every group is fsynced before it is acknowledged, so
// there is nothing left for a writeback to do.
func TestNoWritebackWithFsync(t *testing.T) {
	s := openStore(t, testOptions(t, true))
	p := mustPartition(t, s, pid)
	for i := range 3*writebackBytes/100_000 + 1 {
		mustAppend(t, p, sizedBatch(t, 100_000, int64(i)), AppendOptions{Sync: i%2 == 0, LogAppendTime: -1})
	}
	if s.writebacks.Load() != 0 || s.fsyncs.Load() == 0 {
		t.Fatalf("%d writebacks, %d fsyncs with Options.Fsync", s.writebacks.Load(), s.fsyncs.Load())
	}
}

// TestWritebackFailureFailsStore: a failed writeback is a failed fsync (the kernel may have dropped
// the pages it could not write, records already acknowledged among them), so the store refuses
// appends from then on, as after a failed fsync with Options.Fsync.
func TestWritebackFailureFailsStore(t *testing.T) {
	s := openStore(t, testOptions(t, false))
	s.syncFn = func() error { return errors.New("injected EIO") }
	p := mustPartition(t, s, pid)
	i := 0
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for ; time.Now().Before(deadline); i++ {
		if _, err = p.Append(context.Background(), sizedBatch(t, 100_000, int64(i)), plainAppend); err != nil {
			break
		}
	}
	if !isErr(err, rerr.ErrStorage) {
		t.Fatalf("append %d after a failed writeback: %v", i, err)
	}
	if int64(i)*100_000 < writebackBytes {
		t.Fatalf("the store failed after %d appends, before a writeback was due", i)
	}
}
