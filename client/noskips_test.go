package client_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/platform/platformtest"
)

// The "No skips" test of consumer groups (issue 3): a group of 4 members processes the flight records
// while members are killed (abandoned without committing or leaving, as a crashed process) and
// restarted. Every record must be processed at least once, and a record processed twice only when
// the member that processed it first died before committing it: the re-delivered ranges are exactly
// those the dead member had processed beyond the group's committed offset at its death.
//
// TestGroupNoSkips runs it on the first 300,000 flights, within `make test`; TestGroupNoSkipsFull on
// all 3 million when RUNNEL_LONG=1 (`make test-long`).

func TestGroupNoSkips(t *testing.T) { runNoSkips(t, 300_000) }

func TestGroupNoSkipsFull(t *testing.T) {
	if os.Getenv("RUNNEL_LONG") != "1" {
		t.Skip("the 3-million-record run is for RUNNEL_LONG=1 (make test-long)")
	}
	runNoSkips(t, 0)
}

// flightsPath returns ../shared/data/flights-3m.ndjson.zst beside the repository, skipping the test
// when it is absent.
func flightsPath(t testing.TB) string {
	return platformtest.SharedData(t, "flights-3m.ndjson.zst")
}

// produceFlights writes the first limit flights (all when 0) to topic keyed by origin airport, as
// `runnel demo flights` does, and returns how many it wrote.
func produceFlights(t testing.TB, addr, topic string, limit int) int {
	t.Helper()
	f, err := os.Open(flightsPath(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := zstd.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	p := newProducer(t, addr, client.WithLinger(5*time.Millisecond))
	ctx := context.Background()
	var mu sync.Mutex
	var firstErr error
	promise := func(_ *client.Record, err error) {
		if err != nil {
			mu.Lock()
			if firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
		}
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	origin := []byte(`"origin":"`)
	n := 0
	for sc.Scan() && (limit == 0 || n < limit) {
		line := bytes.Clone(sc.Bytes())
		var key []byte
		if i := bytes.Index(line, origin); i >= 0 {
			rest := line[i+len(origin):]
			if j := bytes.IndexByte(rest, '"'); j >= 0 {
				key = rest[:j]
			}
		}
		p.Produce(ctx, client.NewRecord(topic, key, line), promise)
		n++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if firstErr != nil {
		t.Fatalf("produce flights: %v", firstErr)
	}
	return n
}

// death is what a crashed member leaves behind: the group's committed offsets right after it died.
type death struct {
	committed map[client.TopicPartition]int64
	fenced    bool // lost its partitions to the coordinator rather than crashed
}

func runNoSkips(t *testing.T, limit int) {
	flightsPath(t) // skip early when the data is absent
	addr := startGroupNode(t)
	createTopic(t, addr, "flights", 12, nil)
	start := time.Now()
	n := produceFlights(t, addr, "flights", limit)
	t.Logf("produced %d flights in %v", n, time.Since(start).Round(time.Millisecond))
	adm := newAdmin(t, addr)
	ends := topicEnds(t, adm, "flights")
	if sum(ends) != int64(n) {
		t.Fatalf("topic holds %d records, want %d", sum(ends), n)
	}

	l := newLedger()
	var mu sync.Mutex
	deaths := map[string]death{}
	var live []*worker
	next := 0
	logBuf := &syncBuf{}
	opts := []client.GroupOption{
		client.WithLogger(slog.New(slog.NewTextHandler(logBuf, &slog.HandlerOptions{Level: slog.LevelInfo}))),
		client.WithSessionTimeout(3 * time.Second), // a crashed member's partitions move on after 3s
		client.WithAutoCommitInterval(100 * time.Millisecond),
	}
	spawn := func() *worker {
		next++
		w := startWorker(t, addr, "nightly", fmt.Sprintf("m%d", next), l, []string{"flights"}, opts...)
		w.onCrash = func(w *worker) {
			// The committed offsets as the member leaves them: its last commit has ended (Crash waits
			// for it), so nothing it does later can move them.
			c := committedAll(t, adm, "nightly")
			mu.Lock()
			deaths[w.label()] = death{committed: c}
			mu.Unlock()
		}
		// A member the coordinator fenced (its heartbeats starved past the session timeout on a
		// loaded machine) also dies, as far as the group is concerned: it loses its partitions
		// without committing, and joins again as a new incarnation.
		w.onLost = func(w *worker, label string) {
			c := committedAll(t, adm, "nightly")
			mu.Lock()
			deaths[label] = death{committed: c, fenced: true}
			mu.Unlock()
		}
		return w
	}
	for range 4 {
		live = append(live, spawn())
	}

	// Kill a random member at each step (one step stops a member cleanly instead), mid-batch at a
	// random record, and start a new one in its place at once.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	steps := []float64{0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75}
	cleanStep := 3
	consumeStart := time.Now()
	timeout := 30*time.Second + time.Duration(n/10_000)*time.Second
	for i, frac := range steps {
		target := int(frac * float64(n))
		waitFor(t, timeout, func() string { return fmt.Sprintf("%d of %d distinct records processed", l.distinct(), n) },
			func() bool { return l.distinct() >= target })
		j := rng.IntN(len(live))
		w := live[j]
		if i == cleanStep {
			if err := w.stop(); err != nil {
				t.Fatalf("%s: %v", w.name, err)
			}
		} else {
			w.crashAfter(rng.IntN(3000))
			<-w.done
			if w.err != nil {
				t.Fatalf("%s: %v", w.name, w.err)
			}
		}
		live[j] = spawn()
	}
	waitFor(t, timeout, func() string { return fmt.Sprintf("%d of %d distinct records processed", l.distinct(), n) },
		func() bool { return l.distinct() == n })
	elapsed := time.Since(consumeStart)
	// Records a crashed member processed beyond the commit are processed again by their new owner,
	// and the group commits them then: wait until the committed offsets reach the ends.
	var committed map[client.TopicPartition]int64
	waitFor(t, timeout, func() string {
		var b strings.Builder
		fmt.Fprintf(&b, "committed %d of %d\n", sum(committed), n)
		for _, k := range sortedKeys(ends) {
			fmt.Fprintf(&b, "  %v committed %d end %d\n", k, committed[k], ends[k])
		}
		d, err := adm.DescribeGroup(context.Background(), "nightly")
		if err == nil {
			for _, m := range d.Members {
				fmt.Fprintf(&b, "  member %s epoch %d owns %v target %v\n", m.ClientID+"/"+m.MemberID[:6], m.MemberEpoch, m.Assignment, m.TargetAssignment)
			}
		}
		for _, w := range live {
			fmt.Fprintf(&b, "  worker %s member %.6s epoch %d assignment %v\n", w.name, w.gc.MemberID(), w.gc.MemberEpoch(), w.gc.Assignment())
			for _, k := range w.gc.Assignment() {
				fmt.Fprintf(&b, "    %v position %d hw %d\n", k, w.gc.Position(k.Topic, k.Partition), w.gc.HighWatermark(k.Topic, k.Partition))
			}
		}
		fmt.Fprintf(&b, "log:\n%s", logBuf.String())
		l.mu.Lock()
		fmt.Fprintf(&b, "  ledger owners %v\n  last events %v\n", l.owner, l.events[max(0, len(l.events)-20):])
		l.mu.Unlock()
		return b.String()
	}, func() bool {
		committed = committedAll(t, adm, "nightly")
		return sum(committed) == int64(n)
	})
	for _, w := range live {
		if err := w.stop(); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
	}
	l.check(t)

	// Every record at least once; a record processed again only where its earlier processor died
	// with the group's commit at or below it.
	mu.Lock()
	defer mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	redelivered := 0
	for _, k := range sortedKeys(ends) {
		end := ends[k]
		by := make([]string, end) // offset → last member to process it
		for _, p := range l.logs[k] {
			if p.offset >= end {
				t.Fatalf("%v: processed offset %d beyond the end %d", k, p.offset, end)
			}
			if prev := by[p.offset]; prev != "" {
				d, dead := deaths[prev]
				switch {
				case !dead:
					t.Fatalf("%v@%d processed by %s and again by %s, though %s neither crashed nor lost its partitions", k, p.offset, prev, p.member, prev)
				case d.committed[k] > p.offset:
					t.Fatalf("%v@%d processed by %s and again by %s, though the group had committed %d when %s died", k, p.offset, prev, p.member, d.committed[k], prev)
				}
				redelivered++
			}
			by[p.offset] = p.member
		}
		for o, m := range by {
			if m == "" {
				t.Fatalf("%v@%d never processed: skipped", k, o)
			}
		}
	}
	committed = committedAll(t, adm, "nightly")
	for k, end := range ends {
		if committed[k] != end {
			t.Errorf("%v: committed %d after the last members closed, want %d", k, committed[k], end)
		}
	}
	fenced := 0
	for _, d := range deaths {
		if d.fenced {
			fenced++
		}
	}
	t.Logf("%d records, %d members over the run, %d crashes, %d fenced, %d re-deliveries (all from uncommitted ranges of dead members), consumed in %v (%.0f records/s with the race detector's overhead)",
		n, next, len(deaths)-fenced, fenced, redelivered, elapsed.Round(time.Millisecond), float64(l.total)/elapsed.Seconds())
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
