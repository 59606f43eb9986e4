package client_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/platform"
	"github.com/runnel-io/runnel/platform/platformtest"
)

// startGroupNode starts a node whose group coordinator runs on short timers, so tests of rebalances
// and crashes take seconds: heartbeats every 250ms (100ms while reconciling), session timeouts down to
// 500ms allowed. It returns the gRPC address.
func startGroupNode(t testing.TB, tune ...func(*platform.Config)) string {
	t.Helper()
	fast := func(cfg *platform.Config) {
		cfg.Groups.HeartbeatInterval = 250 * time.Millisecond
		cfg.Groups.ReconcilingHeartbeatInterval = 100 * time.Millisecond
		cfg.Groups.MinSessionTimeout = 500 * time.Millisecond
		cfg.Groups.TickInterval = 50 * time.Millisecond
	}
	return platformtest.StartNode(t, t.TempDir(), append([]func(*platform.Config){fast}, tune...)...).GRPCAddr()
}

// waitFor polls cond every 10ms until it holds, failing the test with what() after timeout.
func waitFor(t testing.TB, timeout time.Duration, what func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v: %s", timeout, what())
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, not waiting for time to pass
	}
}

// ledger records, for a group's test, who owns which partition (from the rebalance callbacks) and
// every record processed, and collects violations: a partition assigned while another member still
// owns it, a record processed by a member that does not own its partition, offsets of one partition
// going backwards within one member's ownership.
type ledger struct {
	mu     sync.Mutex
	owner  map[client.TopicPartition]string
	last   map[string]map[client.TopicPartition]int64 // member → partition → last offset processed
	logs   map[client.TopicPartition][]proc           // processing order per partition
	seen   map[client.TopicPartition][]bool           // offsets processed at least once
	total  int
	unique int
	errs   []string
	events []string // rebalance history, for failure messages
}

// proc is one processing of a record.
type proc struct {
	member string
	offset int64
}

func newLedger() *ledger {
	return &ledger{owner: map[client.TopicPartition]string{}, last: map[string]map[client.TopicPartition]int64{},
		logs: map[client.TopicPartition][]proc{}, seen: map[client.TopicPartition][]bool{}}
}

func (l *ledger) fail(format string, args ...any) {
	l.errs = append(l.errs, fmt.Sprintf(format, args...))
}

func (l *ledger) assigned(member string, ps []client.TopicPartition) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, fmt.Sprintf("%s assigned %v", member, ps))
	for _, k := range ps {
		if o := l.owner[k]; o != "" && o != member {
			l.fail("%v assigned to %s while %s still owns it", k, member, o)
		}
		l.owner[k] = member
		delete(l.last[member], k) // a new ownership interval
	}
}

func (l *ledger) released(member, how string, ps []client.TopicPartition) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, fmt.Sprintf("%s %s %v", member, how, ps))
	for _, k := range ps {
		if o := l.owner[k]; o != member {
			l.fail("%s: %v %s, but its owner is %q", member, k, how, o)
			continue
		}
		delete(l.owner, k)
	}
}

// died releases everything a crashed member owned: it processes nothing more.
func (l *ledger) died(member string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, member+" crashed")
	for k, o := range l.owner {
		if o == member {
			delete(l.owner, k)
		}
	}
}

// processed records a batch a member has processed.
func (l *ledger) processed(member string, recs []*client.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	last := l.last[member]
	if last == nil {
		last = map[client.TopicPartition]int64{}
		l.last[member] = last
	}
	for _, r := range recs {
		k := client.TopicPartition{Topic: r.Topic, Partition: r.Partition}
		if o := l.owner[k]; o != member && len(l.errs) < 20 {
			l.fail("%s processed %v@%d while its owner is %q", member, k, r.Offset, o)
		}
		if prev, ok := last[k]; ok && r.Offset <= prev && len(l.errs) < 20 {
			l.fail("%s processed %v@%d after @%d", member, k, r.Offset, prev)
		}
		last[k] = r.Offset
		l.logs[k] = append(l.logs[k], proc{member, r.Offset})
		seen := l.seen[k]
		if int64(len(seen)) <= r.Offset {
			seen = append(seen, make([]bool, int(r.Offset)+1-len(seen)+len(seen)/2)...)
			l.seen[k] = seen
		}
		if !seen[r.Offset] {
			seen[r.Offset] = true
			l.unique++
		}
	}
	l.total += len(recs)
}

// count returns how many records were processed, re-deliveries included.
func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// distinct returns how many different records were processed.
func (l *ledger) distinct() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unique
}

// check fails the test with the violations seen.
func (l *ledger) check(t testing.TB) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) > 0 {
		hist := l.events
		if len(hist) > 40 {
			hist = hist[len(hist)-40:]
		}
		t.Fatalf("%d violations, first: %v\nrebalances (last 40):\n%v", len(l.errs), l.errs[:min(5, len(l.errs))], hist)
	}
}

// exactlyOnce checks that every partition's records [0, ends[k]) were processed exactly once, in order.
func (l *ledger) exactlyOnce(t testing.TB, ends map[client.TopicPartition]int64) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, end := range ends {
		log := l.logs[k]
		if int64(len(log)) != end {
			t.Errorf("%v: %d records processed, want %d", k, len(log), end)
		}
		for i, p := range log {
			if p.offset != int64(i) {
				t.Fatalf("%v: processing #%d was offset %d (by %s): a record skipped or processed twice", k, i, p.offset, p.member)
			}
		}
	}
}

// worker is one group member processing records in a goroutine: Poll, then hand the batch to the
// ledger (or, with pollFunc, PollFunc handing each record to it). stop ends it cleanly (its Poll returns, then Close commits and leaves); crashAfter makes it
// crash (abandon the consumer without committing or leaving) after processing n records of the batch
// its next Poll returns, or at once if that Poll finds nothing buffered.
type worker struct {
	name string
	gc   *client.GroupConsumer
	l    *ledger

	cancel context.CancelFunc // ends the current and every later Poll
	done   chan struct{}
	err    error

	mu      sync.Mutex
	crashAt int             // when >= 0: crash after this many records of the next batch
	crashed bool            // crashed rather than closed
	inc     int             // incarnation: bumps when the member loses its partitions (OnLost)
	onCrash func(w *worker) // runs after the crash, before the worker's goroutine ends
	// onLost runs in OnLost with the label of the incarnation that lost its partitions.
	onLost func(w *worker, label string)
	// pollFunc: read with PollFunc, each record processed inside fn (crashAt is not used then).
	pollFunc bool
}

// label names the worker's current incarnation in the ledger: a member that lost its partitions and
// joined again is, for ownership and re-delivery accounting, a new one.
func (w *worker) label() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.inc == 0 {
		return w.name
	}
	return fmt.Sprintf("%s.%d", w.name, w.inc)
}

// startWorker creates a group member named name, subscribes it to topics and runs its poll loop.
func startWorker(t testing.TB, addr, group, name string, l *ledger, topics []string, opts ...client.GroupOption) *worker {
	t.Helper()
	return startWorkerMode(t, addr, group, name, l, topics, false, opts...)
}

// newGroupConsumer returns a member of group subscribed to topics, closed when the test ends (Close
// may come earlier too).
func newGroupConsumer(t testing.TB, addr, group string, topics []string, opts ...client.GroupOption) *client.GroupConsumer {
	t.Helper()
	gc, err := client.NewGroupConsumer([]string{addr}, group, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gc.Close() })
	if err := gc.Subscribe(topics...); err != nil {
		t.Fatal(err)
	}
	return gc
}

// startFuncWorker is startWorker for a member that reads with PollFunc.
func startFuncWorker(t testing.TB, addr, group, name string, l *ledger, topics []string, opts ...client.GroupOption) *worker {
	t.Helper()
	return startWorkerMode(t, addr, group, name, l, topics, true, opts...)
}

func startWorkerMode(t testing.TB, addr, group, name string, l *ledger, topics []string, pollFunc bool, opts ...client.GroupOption) *worker {
	t.Helper()
	w := &worker{name: name, l: l, done: make(chan struct{}), crashAt: -1, pollFunc: pollFunc}
	base := []client.GroupOption{
		client.WithAutoOffsetReset(client.OffsetEarliest()),
		client.WithFetchMaxWait(100 * time.Millisecond),
		client.WithClientID(name),
		client.WithOnAssigned(func(_ context.Context, _ *client.GroupConsumer, ps []client.TopicPartition) {
			l.assigned(w.label(), ps)
		}),
		client.WithOnRevoked(func(_ context.Context, _ *client.GroupConsumer, ps []client.TopicPartition) {
			l.released(w.label(), "revoked", ps)
		}),
		client.WithOnLost(func(_ context.Context, _ *client.GroupConsumer, ps []client.TopicPartition) {
			label := w.label()
			l.released(label, "lost", ps)
			if w.onLost != nil {
				w.onLost(w, label)
			}
			w.mu.Lock()
			w.inc++
			w.mu.Unlock()
		}),
	}
	gc, err := client.NewGroupConsumer([]string{addr}, group, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := gc.Subscribe(topics...); err != nil {
		t.Fatal(err)
	}
	w.gc = gc
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go w.run(ctx)
	t.Cleanup(func() { w.stop() })
	return w
}

func (w *worker) run(ctx context.Context) {
	defer close(w.done)
	if w.pollFunc {
		w.runFunc(ctx)
		return
	}
	for {
		recs, err := w.gc.Poll(ctx)
		w.mu.Lock()
		crashAt := w.crashAt
		w.mu.Unlock()
		if crashAt >= 0 {
			w.l.processed(w.label(), recs[:min(crashAt, len(recs))])
			w.gc.Crash()
			w.l.died(w.label())
			w.mu.Lock()
			w.crashed = true
			w.mu.Unlock()
			if w.onCrash != nil {
				w.onCrash(w)
			}
			return
		}
		if err != nil {
			if ctx.Err() == nil {
				w.err = err
			}
			if cerr := w.gc.Close(); cerr != nil && w.err == nil {
				w.err = cerr
			}
			return
		}
		w.l.processed(w.label(), recs)
	}
}

// runFunc is run with PollFunc: each record goes to the ledger from inside fn, while the member owns
// its partition (the ledger checks that), as a copy of what the ledger reads.
func (w *worker) runFunc(ctx context.Context) {
	one := make([]*client.Record, 1)
	fn := func(r *client.Record) {
		one[0] = &client.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}
		w.l.processed(w.label(), one)
	}
	for {
		if _, err := w.gc.PollFunc(ctx, fn); err != nil {
			if ctx.Err() == nil {
				w.err = err
			}
			if cerr := w.gc.Close(); cerr != nil && w.err == nil {
				w.err = cerr
			}
			return
		}
	}
}

// crashAfter makes the worker crash after processing n records of the batch its next Poll returns.
func (w *worker) crashAfter(n int) {
	w.mu.Lock()
	w.crashAt = n
	w.mu.Unlock()
	w.cancel() // an idle Poll returns now; one with records buffered returns them first
}

// stop ends the worker cleanly (its Poll returns, then Close commits and leaves) and waits.
func (w *worker) stop() error {
	w.cancel()
	<-w.done
	return w.err
}

// producerLoop produces n records with keys key-0..key-(keys-1) to topic in the background; the
// returned func waits for all to be acknowledged.
func producerLoop(t testing.TB, addr, topic string, n, keys int, pace time.Duration) func() {
	t.Helper()
	p := newProducer(t, addr, client.WithLinger(2*time.Millisecond))
	errc := make(chan error, 1)
	go func() {
		ctx := context.Background()
		var failed error
		var mu sync.Mutex
		for i := range n {
			r := client.NewRecord(topic, fmt.Appendf(nil, "key-%d", i%keys), fmt.Appendf(nil, "%d", i))
			p.Produce(ctx, r, func(_ *client.Record, err error) {
				if err != nil {
					mu.Lock()
					failed = errors.Join(failed, err)
					mu.Unlock()
				}
			})
			if pace > 0 && i%100 == 99 {
				time.Sleep(pace) // spread the records over the test's rebalances
			}
		}
		err := p.Flush(ctx)
		mu.Lock()
		errc <- errors.Join(failed, err)
		mu.Unlock()
	}()
	return func() {
		t.Helper()
		if err := <-errc; err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
}

// topicEnds returns the high watermark of every partition of topic.
func topicEnds(t testing.TB, a *client.Admin, topic string) map[client.TopicPartition]int64 {
	t.Helper()
	d, err := a.DescribeTopic(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	ends := map[client.TopicPartition]int64{}
	for _, p := range d.Partitions {
		ends[client.TopicPartition{Topic: topic, Partition: p.Partition}] = p.HighWatermark
	}
	return ends
}

func sum(m map[client.TopicPartition]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// committedAll returns the group's committed offsets by partition.
func committedAll(t testing.TB, a *client.Admin, group string) map[client.TopicPartition]int64 {
	t.Helper()
	offs, err := a.FetchOffsets(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	out := map[client.TopicPartition]int64{}
	for _, o := range offs {
		out[client.TopicPartition{Topic: o.Topic, Partition: o.Partition}] = o.Offset
	}
	return out
}

func sortedKeys(m map[client.TopicPartition]int64) []client.TopicPartition {
	var ks []client.TopicPartition
	for k := range m {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b client.TopicPartition) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Partition - b.Partition)
	})
	return ks
}
