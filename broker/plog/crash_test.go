package plog

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
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
	go kill9Replication(s, &out)
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

// Replication in the child: a leader partition (topic 4 partition 0) takes acks=all appends in rising
// leader epochs, and a follower partition in replicated mode (topic 4 partition 1) copies it with
// ReadLocal → AppendReplica, moves its HW, and every few rounds truncates back to the start of one of
// its latest epochs (as after a leader change) and copies again.
var (
	kill9Leader   = PartitionID{TopicNum: 4, Partition: 0}
	kill9Follower = PartitionID{TopicNum: 4, Partition: 1}
)

// kill9Replication runs the leader's writer and the follower's fetch loop, printing for the follower
// "rep <hw> <leo>" when an AppendReplica queued after setting the HW to <hw> returned with LEO <leo>
// (so the HW checkpoint is committed), "cut <offset>" before a Truncate and "trunc <leo>" after it.
func kill9Replication(s *Store, out *sync.Mutex) {
	die := func(what string, err error) {
		fmt.Fprintln(os.Stderr, "child "+what+":", err)
		os.Exit(2)
	}
	say := func(format string, a ...any) {
		out.Lock()
		_, _ = fmt.Fprintf(os.Stdout, format+"\n", a...)
		out.Unlock()
	}
	l, err := s.Partition(kill9Leader)
	if err != nil {
		die("leader", err)
	}
	f, err := s.Partition(kill9Follower)
	if err != nil {
		die("follower", err)
	}
	f.SetReplicated()
	go func() {
		base := l.LatestEpoch() + 1 // a new round has a new leader epoch
		for seq := 0; ; seq++ {
			recs := make([]rec, 1+seq%3)
			for i := range recs {
				recs[i] = rec{ts: int64(seq), key: kill9Pad[:100], value: []byte(fmt.Sprintf("l%d#%d", seq, i))}
			}
			opts := AppendOptions{Sync: true, LogAppendTime: -1, LeaderEpoch: base + int32(seq/10)}
			if _, err := l.Append(context.Background(), makeBatch(panicTB{}, 0, recs...), opts); err != nil {
				die("leader append", err)
			}
		}
	}()
	for i := 1; ; i++ {
		if es := f.EpochEntries(); i%6 == 0 && len(es) > 0 {
			cut := es[max(len(es)-1-i/6%2, 0)].StartOffset
			say("cut %d", cut)
			end, err := f.Truncate(cut)
			if err != nil {
				die("truncate", err)
			}
			say("trunc %d", end)
		}
		if err := f.SetHighWatermark(min(f.DurableEnd(), l.HighWatermark())); err != nil {
			die("set HW", err)
		}
		hw := f.HighWatermark()
		changed := l.Changed()
		b, err := l.ReadLocal(nil, f.LogEndOffset(), 8<<10)
		if err != nil {
			die("leader read", err)
		}
		if len(b) == 0 {
			select {
			case <-changed:
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		leo, err := f.AppendReplica(context.Background(), b, AppendOptions{Sync: true})
		if err != nil {
			die("append replica", err)
		}
		say("rep %d %d", hw, leo)
	}
}

// kill9CheckReplication checks the replicated pair after a kill: the follower is in replicated mode,
// its log is a prefix of the leader's (bytes, offsets, epochs) with an epoch cache that matches its
// batches, every acknowledged append and truncation of it survived, and its HW lies between the last
// checkpointed HW and its LEO.
func kill9CheckReplication(t *testing.T, s *Store, events []string) {
	t.Helper()
	l, f := mustPartition(t, s, kill9Leader), mustPartition(t, s, kill9Follower)
	var lb, acked, cut int64 = 0, 0, -1
	reps, truncs := 0, 0
	for _, e := range events {
		var a, b int64
		switch {
		case strings.HasPrefix(e, "rep "):
			_, err := fmt.Sscanf(e, "rep %d %d", &a, &b)
			if err != nil {
				t.Fatal(err)
			}
			lb, acked = max(lb, a), b
			reps++
		case strings.HasPrefix(e, "cut "):
			if _, err := fmt.Sscanf(e, "cut %d", &cut); err != nil {
				t.Fatal(err)
			}
		case strings.HasPrefix(e, "trunc "):
			if _, err := fmt.Sscanf(e, "trunc %d", &a); err != nil {
				t.Fatal(err)
			}
			if a != cut {
				t.Fatalf("truncated to %d at the epoch boundary %d", a, cut)
			}
			lb, acked, cut = min(lb, a), a, -1
			truncs++
		}
	}
	if cut >= 0 { // a truncation was under way: it may or may not have happened
		lb, acked = min(lb, cut), min(acked, cut)
	}
	t.Logf("follower: %d acknowledged copies, %d truncations; LEO %d HW %d (at least %d), leader LEO %d",
		reps, truncs, f.LogEndOffset(), f.HighWatermark(), lb, l.LogEndOffset())
	if !f.Replicated() {
		t.Fatal("follower not in replicated mode after the kill")
	}
	if f.LogEndOffset() < acked {
		t.Fatalf("follower LEO %d below its acknowledged end %d", f.LogEndOffset(), acked)
	}
	if hw := f.HighWatermark(); hw > f.LogEndOffset() || hw < lb {
		t.Fatalf("follower HW %d outside [%d, LEO %d]", hw, lb, f.LogEndOffset())
	}
	fl := readLocalAll(t, f, 0)
	next := int64(0)
	for _, g := range decode(t, fl) {
		if g.h.BaseOffset != next {
			t.Fatalf("follower batch at %d, want %d", g.h.BaseOffset, next)
		}
		next = g.h.NextOffset()
	}
	if next != f.LogEndOffset() || int64(len(fl)) != f.Size() {
		t.Fatalf("follower batches end at %d (%d bytes), LEO %d size %d", next, len(fl), f.LogEndOffset(), f.Size())
	}
	if ll := readLocalAll(t, l, 0); !bytes.HasPrefix(ll, fl) {
		t.Fatal("the follower's log is not a prefix of the leader's")
	}
	if want := derivedEpochs(t, fl); !slices.Equal(f.EpochEntries(), want) {
		t.Fatalf("follower epoch cache %v, its batches say %v", f.EpochEntries(), want)
	}
	if want := derivedEpochs(t, readLocalAll(t, l, 0)); !slices.Equal(l.EpochEntries(), want) {
		t.Fatalf("leader epoch cache %v, its batches say %v", l.EpochEntries(), want)
	}
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
// append is there after reopening, intact and at the acknowledged offsets, with offsets contiguous; and
// that a follower copying a leader (AppendReplica, Truncate, the leader-epoch cache, the HW checkpoint)
// comes back consistent (kill9CheckReplication).
func TestKill9Recovery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	dir := t.TempDir()
	for round := range 2 { // the second round appends to a store that was itself recovered from a kill
		acks, events := runKill9Child(t, dir, 400)
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
		kill9CheckReplication(t, s, events)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// runKill9Child starts the child on dir, SIGKILLs it after n acknowledgements and returns every
// acknowledgement it printed, and the replication lines.
func runKill9Child(t *testing.T, dir string, n int) ([]kill9Ack, []string) {
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
	var events []string
	sc := bufio.NewScanner(stdout)
	deadline := time.Now().Add(20 * time.Second)
	for sc.Scan() {
		if !strings.HasPrefix(sc.Text(), "ack ") {
			events = append(events, sc.Text())
			continue
		}
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
	return acks, events
}
