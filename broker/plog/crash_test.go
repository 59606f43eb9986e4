package plog

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// kill9Env, when set to a directory, turns the test binary into the child of TestKill9Recovery.
const kill9Env = "PLOG_KILL9_DIR"

const (
	kill9Parts   = 3
	kill9Writers = 6
)

// kill9Pad makes records big enough that the child's value log rotates.
var kill9Pad = make([]byte, 2000)

// kill9Payload is the deterministic content of writer w's append number seq to partition part, so the
// parent can check what it reads back without being told.
func kill9Payload(part, w, seq int) string { return fmt.Sprintf("p%d-w%d-s%d", part, w, seq) }

// kill9Child appends with Sync (acks=all) from several goroutines to several partitions and prints one
// line per acknowledged append: "ack <partition> <writer> <seq> <base> <last>". It runs until killed,
// or exits after 30 s so an orphan never lingers.
func kill9Child(dir string) {
	o := DefaultOptions(dir)
	o.MemTableSize, o.NumMemtables = 4<<20, 2
	o.BlockCacheSize, o.IndexCacheSize = 4<<20, 2<<20
	o.ValueLogFileSize = 1 << 20 // rotate value-log files during the run, to exercise the rotation fsync
	o.GCInterval = -1
	o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := Open(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		os.Exit(2)
	}
	var out sync.Mutex
	for w := range kill9Writers {
		go func() {
			for seq := 0; ; seq++ {
				part := (w + seq) % kill9Parts
				p, err := s.Partition(PartitionID{TopicNum: 3, Partition: int32(part)})
				if err != nil {
					fmt.Fprintln(os.Stderr, "child partition:", err)
					os.Exit(2)
				}
				recs := make([]rec, 1+seq%4)
				for i := range recs {
					recs[i] = rec{ts: int64(seq), key: kill9Pad, value: []byte(kill9Payload(part, w, seq) + fmt.Sprintf("#%d", i))}
				}
				b := makeBatch(panicTB{}, 0, recs...)
				res, err := p.Append(context.Background(), b, syncAppend)
				if err != nil {
					fmt.Fprintln(os.Stderr, "child append:", err)
					os.Exit(2)
				}
				out.Lock()
				// One write(2) per line, so a kill never leaves a torn acknowledgement behind a whole one.
				_, _ = fmt.Fprintf(os.Stdout, "ack %d %d %d %d %d\n", part, w, seq, res.BaseOffset, res.LastOffset)
				out.Unlock()
			}
		}()
	}
	time.Sleep(30 * time.Second) // a lifetime cap for an orphaned child, not a wait for a condition
	os.Exit(3)
}

// panicTB lets makeBatch run outside a test (in the child).
type panicTB struct{ testing.TB }

func (panicTB) Helper()                   {}
func (panicTB) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (panicTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

type kill9Ack struct {
	part, w, seq, recs int
	base, last         int64
}

// TestKill9Recovery kills a process that appends with acks=all and checks that every acknowledged
// append is there after reopening, intact and at the acknowledged offsets, with offsets contiguous.
func TestKill9Recovery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	dir := t.TempDir()
	for round := range 2 { // the second round appends to a store that was itself recovered from a kill
		acks := runKill9Child(t, dir, 400)
		t.Logf("round %d: %d acknowledged appends before SIGKILL", round, len(acks))

		o := testOptions(t, true)
		o.Dir = dir
		s, err := Open(o)
		if err != nil {
			t.Fatalf("reopen after kill: %v", err)
		}
		byPart := map[int]map[int64]kill9Ack{}
		for _, a := range acks {
			if byPart[a.part] == nil {
				byPart[a.part] = map[int64]kill9Ack{}
			}
			byPart[a.part][a.base] = a
		}
		for part := range kill9Parts {
			p := mustPartition(t, s, PartitionID{TopicNum: 3, Partition: int32(part)})
			got := readAll(t, p, 0)
			next, seen := int64(0), 0
			for _, g := range got {
				if g.h.BaseOffset != next {
					t.Fatalf("partition %d: batch at %d, want %d: offsets not contiguous", part, g.h.BaseOffset, next)
				}
				next = g.h.NextOffset()
				a, ok := byPart[part][g.h.BaseOffset]
				if !ok {
					continue // written but not acknowledged before the kill, or from the earlier round
				}
				seen++
				if g.h.LastOffset() != a.last || len(g.values) != a.recs {
					t.Fatalf("partition %d: acknowledged %d-%d, stored %d-%d with %d records", part, a.base, a.last, g.h.BaseOffset, g.h.LastOffset(), len(g.values))
				}
				for i, v := range g.values {
					if want := kill9Payload(part, a.w, a.seq) + fmt.Sprintf("#%d", i); string(v) != want {
						t.Fatalf("partition %d offset %d: %q, want %q", part, g.h.BaseOffset+int64(i), v, want)
					}
				}
			}
			if seen != len(byPart[part]) {
				t.Fatalf("partition %d: %d of %d acknowledged appends survived", part, seen, len(byPart[part]))
			}
			if p.LogEndOffset() != next {
				t.Fatalf("partition %d: LEO %d, batches end at %d", part, p.LogEndOffset(), next)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// runKill9Child starts the child on dir, SIGKILLs it after n acknowledgements and returns every
// acknowledgement it printed.
func runKill9Child(t *testing.T, dir string, n int) []kill9Ack {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKill9Recovery$")
	cmd.Env = append(os.Environ(), kill9Env+"="+dir)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	var acks []kill9Ack
	sc := bufio.NewScanner(stdout)
	deadline := time.Now().Add(20 * time.Second)
	for sc.Scan() {
		var a kill9Ack
		if _, err := fmt.Sscanf(sc.Text(), "ack %d %d %d %d %d", &a.part, &a.w, &a.seq, &a.base, &a.last); err != nil {
			t.Fatalf("child printed %q: %v", sc.Text(), err)
		}
		a.recs = 1 + a.seq%4
		acks = append(acks, a)
		if len(acks) == n {
			// Kill in the middle of the stream: the other writers have appends in flight.
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
		if time.Now().After(deadline) {
			t.Fatalf("child too slow: %d acknowledgements in 20 s", len(acks))
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	err = cmd.Wait()
	if !killed {
		t.Fatalf("child exited before the kill after %d acknowledgements: %v", len(acks), err)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL", err)
	}
	return acks
}
