package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/platform"
	"google.golang.org/grpc"
)

func isCode(err error, code runnelv1.ErrorCode) bool {
	var e *rerr.Error
	return errors.As(err, &e) && e.Code == code
}

// produceN produces n keyed records to topic and waits for their acknowledgements.
func produceN(t testing.TB, addr, topic string, n int) {
	t.Helper()
	producerLoop(t, addr, topic, n, 97, 0)()
}

// Members join and leave a group while records are produced: every record is processed exactly once
// (clean hand-overs commit on revocation, so nothing is re-read), in order per partition, and no
// partition is ever owned by two members at once. A and B read with Poll, C and D with PollFunc.
func TestGroupExactlyOnceThroughRebalances(t *testing.T) {
	addr := startGroupNode(t)
	createTopic(t, addr, "orders", 8, nil)
	const n = 20000
	produced := producerLoop(t, addr, "orders", n, 101, 20*time.Millisecond)
	l := newLedger()
	topics := []string{"orders"}
	opts := []client.GroupOption{client.WithAutoCommitInterval(100 * time.Millisecond)}
	a := startWorker(t, addr, "g", "A", l, topics, opts...)
	b := startWorker(t, addr, "g", "B", l, topics, opts...)
	progress := func(k int) {
		waitFor(t, 30*time.Second, func() string { return fmt.Sprintf("%d of %d processed", l.count(), k) }, func() bool { return l.count() >= k })
	}
	progress(3000)
	c := startFuncWorker(t, addr, "g", "C", l, topics, opts...)
	progress(7000)
	d := startFuncWorker(t, addr, "g", "D", l, topics, opts...)
	progress(11000)
	if err := a.stop(); err != nil {
		t.Fatalf("A: %v", err)
	}
	progress(15000)
	if err := b.stop(); err != nil {
		t.Fatalf("B: %v", err)
	}
	produced()
	progress(n)
	l.check(t)
	for _, w := range []*worker{c, d} {
		if err := w.stop(); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
	}
	adm := newAdmin(t, addr)
	ends := topicEnds(t, adm, "orders")
	if sum(ends) != n {
		t.Fatalf("topic holds %d records, want %d", sum(ends), n)
	}
	l.exactlyOnce(t, ends)
	l.check(t)
	committed := committedAll(t, adm, "g")
	for k, end := range ends {
		if committed[k] != end {
			t.Errorf("%v: committed %d after everyone closed, want the log end %d", k, committed[k], end)
		}
	}
}

// Partitions revoked in a rebalance are committed before they move (by auto-commit, or by the
// application in OnRevoked when auto-commit is off), so the new owner starts exactly after the last
// record the old owner processed. With auto-commit off, A reads with PollFunc.
func TestGroupCommitOnRevoke(t *testing.T) {
	for _, auto := range []bool{true, false} {
		t.Run(fmt.Sprintf("autocommit=%v", auto), func(t *testing.T) {
			addr := startGroupNode(t)
			createTopic(t, addr, "t", 4, nil)
			produceN(t, addr, "t", 2000)
			l := newLedger()
			var mu sync.Mutex
			var revokeErrs []string
			revoked := 0
			onRevoked := func(ctx context.Context, gc *client.GroupConsumer, ps []client.TopicPartition) {
				if !auto {
					if err := gc.CommitSync(ctx); err != nil {
						t.Errorf("commit in OnRevoked: %v", err)
					}
				}
				// Whatever commits, it is done by now: the group's offsets are the positions.
				c, err := gc.Committed(ctx, ps...)
				mu.Lock()
				defer mu.Unlock()
				revoked += len(ps)
				if err != nil {
					revokeErrs = append(revokeErrs, err.Error())
					return
				}
				for _, k := range ps {
					if pos := gc.Position(k.Topic, k.Partition); c[k].Offset != pos {
						revokeErrs = append(revokeErrs, fmt.Sprintf("%v: committed %d at revocation, position %d", k, c[k].Offset, pos))
					}
				}
				l.released("A", "revoked", ps)
			}
			// A reads everything, with auto-commit so rare it never fires on its own.
			opts := []client.GroupOption{client.WithAutoCommit(auto), client.WithAutoCommitInterval(time.Hour)}
			a := startWorkerMode(t, addr, "g", "A", l, []string{"t"}, !auto, append(opts, client.WithOnRevoked(onRevoked))...)
			waitFor(t, 20*time.Second, func() string { return fmt.Sprintf("%d processed", l.count()) }, func() bool { return l.count() == 2000 })
			if c := committedAll(t, newAdmin(t, addr), "g"); len(c) != 0 {
				t.Fatalf("committed before any revocation: %v", c)
			}
			b := startWorker(t, addr, "g", "B", l, []string{"t"}, opts...)
			waitFor(t, 20*time.Second, func() string { return "B never got partitions" }, func() bool { return len(b.gc.Assignment()) == 2 })
			mu.Lock()
			n, errs := revoked, revokeErrs
			mu.Unlock()
			if n != 2 || len(errs) > 0 {
				t.Fatalf("revoked %d partitions; errors: %v", n, errs)
			}
			produceN(t, addr, "t", 2000)
			waitFor(t, 20*time.Second, func() string { return fmt.Sprintf("%d processed", l.count()) }, func() bool { return l.count() == 4000 })
			// Close revokes what is left: with auto-commit on, everything gets committed (B commits
			// nothing itself when it is off).
			for _, w := range []*worker{a, b} {
				if err := w.stop(); err != nil {
					t.Fatalf("%s: %v", w.name, err)
				}
			}
			adm := newAdmin(t, addr)
			ends := topicEnds(t, adm, "t")
			l.exactlyOnce(t, ends)
			l.check(t)
			if c := committedAll(t, adm, "g"); auto && sum(c) != sum(ends) {
				t.Fatalf("committed %v after Close, want the ends %v", c, ends)
			}
		})
	}
}

// A consumer that stops and comes back resumes at the group's committed offsets: nothing is read
// twice and nothing is missed; a new group starts at the end by default (auto.offset.reset=latest).
func TestGroupResumeFromCommitted(t *testing.T) {
	addr := startGroupNode(t)
	createTopic(t, addr, "t", 3, nil)
	produceN(t, addr, "t", 3000)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seen := map[client.TopicPartition]map[int64]bool{}
	// consumeSome processes exactly want records; the rest of the last batch is given back with Seek, so
	// that Close commits only what was processed.
	consumeSome := func(gc *client.GroupConsumer, want int) int {
		n := 0
		for n < want {
			recs, err := gc.Poll(ctx)
			if err != nil {
				t.Fatalf("poll after %d of %d: %v", n, want, err)
			}
			if rest := want - n; len(recs) > rest {
				back := map[client.TopicPartition]int64{}
				for _, r := range recs[rest:] {
					k := client.TopicPartition{Topic: r.Topic, Partition: r.Partition}
					if _, ok := back[k]; !ok {
						back[k] = r.Offset
					}
				}
				for k, off := range back {
					gc.Seek(k.Topic, k.Partition, off)
				}
				recs = recs[:rest]
			}
			for _, r := range recs {
				k := client.TopicPartition{Topic: r.Topic, Partition: r.Partition}
				if seen[k] == nil {
					seen[k] = map[int64]bool{}
				}
				if seen[k][r.Offset] {
					t.Fatalf("%v@%d read twice", k, r.Offset)
				}
				seen[k][r.Offset] = true
			}
			n += len(recs)
		}
		return n
	}
	newGC := func(group string, opts ...client.GroupOption) *client.GroupConsumer {
		gc, err := client.NewGroupConsumer([]string{addr}, group, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := gc.Subscribe("t"); err != nil {
			t.Fatal(err)
		}
		return gc
	}
	total := 0
	for round := 0; round < 3; round++ {
		gc := newGC("g", client.WithAutoOffsetReset(client.OffsetEarliest()))
		total += consumeSome(gc, 500)
		if err := gc.Close(); err != nil {
			t.Fatal(err)
		}
	}
	gc := newGC("g", client.WithAutoOffsetReset(client.OffsetEarliest()))
	total += consumeSome(gc, 3000-total)
	if total != 3000 {
		t.Fatalf("read %d records, want 3000", total)
	}
	// A group new to the topic starts at the end: only records produced after it joined.
	fresh := newGC("fresh")
	waitFor(t, 10*time.Second, func() string { return "fresh member has no partitions" }, func() bool {
		pctx, c := context.WithTimeout(ctx, 20*time.Millisecond)
		defer c()
		fresh.Poll(pctx) // runs the assignment
		return len(fresh.Assignment()) == 3
	})
	before := topicEnds(t, newAdmin(t, addr), "t")
	produceN(t, addr, "t", 30)
	got := 0
	for got < 30 {
		recs, err := fresh.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Offset < before[client.TopicPartition{Topic: r.Topic, Partition: r.Partition}] {
				t.Fatalf("new group with the default reset read old record %d", r.Offset)
			}
		}
		got += len(recs)
	}
	total += consumeSome(gc, 30)
	for _, c := range []*client.GroupConsumer{gc, fresh} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A static member that closes (member epoch -2) and comes back with its instance id within the
// session timeout gets its partitions back, and the other member is not disturbed meanwhile.
func TestGroupStaticMemberRejoin(t *testing.T) {
	addr := startGroupNode(t)
	createTopic(t, addr, "t", 4, nil)
	produceN(t, addr, "t", 400)
	l := newLedger()
	opts := func(inst string) []client.GroupOption {
		return []client.GroupOption{client.WithInstanceID(inst), client.WithSessionTimeout(20 * time.Second)}
	}
	a := startWorker(t, addr, "g", "A", l, []string{"t"}, opts("ia")...)
	b := startWorker(t, addr, "g", "B", l, []string{"t"}, opts("ib")...)
	waitFor(t, 20*time.Second, func() string {
		return fmt.Sprintf("%d processed; A %v B %v", l.count(), a.gc.Assignment(), b.gc.Assignment())
	},
		func() bool { return l.count() == 400 && len(a.gc.Assignment()) == 2 && len(b.gc.Assignment()) == 2 })
	aParts, bParts := a.gc.Assignment(), b.gc.Assignment()
	l.mu.Lock()
	eventsBefore := len(l.events)
	l.mu.Unlock()
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	adm := newAdmin(t, addr)
	d, err := adm.DescribeGroup(context.Background(), "g")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Members) != 2 {
		t.Fatalf("members after the static leave: %+v", d.Members)
	}
	for _, m := range d.Members {
		if m.InstanceID == "ia" && m.MemberEpoch != -2 {
			t.Fatalf("static member that left shows epoch %d, want -2", m.MemberEpoch)
		}
	}
	produceN(t, addr, "t", 400) // its records wait for it
	a2 := startWorker(t, addr, "g", "A2", l, []string{"t"}, opts("ia")...)
	waitFor(t, 20*time.Second, func() string { return fmt.Sprintf("%d processed", l.count()) }, func() bool { return l.count() == 800 })
	if got := a2.gc.Assignment(); fmt.Sprint(got) != fmt.Sprint(aParts) {
		t.Fatalf("A came back with %v, had %v", got, aParts)
	}
	if got := b.gc.Assignment(); fmt.Sprint(got) != fmt.Sprint(bParts) {
		t.Fatalf("B's partitions moved from %v to %v", bParts, got)
	}
	l.mu.Lock()
	for _, e := range l.events[eventsBefore:] {
		if strings.HasPrefix(e, "B ") {
			t.Errorf("B saw a rebalance while A restarted: %s", e)
		}
	}
	l.mu.Unlock()
	a2.stop()
	b.stop()
	l.exactlyOnce(t, topicEnds(t, adm, "t"))
	l.check(t)
}

// Errors that end membership come out of Poll, every time; the consumer still closes.
func TestGroupFatalErrors(t *testing.T) {
	addr := startGroupNode(t, func(c *platform.Config) { c.Groups.MaxGroupSize = 1 })
	createTopic(t, addr, "t", 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	join := func(group string, opts ...client.GroupOption) *client.GroupConsumer {
		gc, err := client.NewGroupConsumer([]string{addr}, group, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { gc.Close() })
		return gc
	}
	pollErr := func(gc *client.GroupConsumer) error {
		for {
			pctx, c := context.WithTimeout(ctx, 100*time.Millisecond)
			_, err := gc.Poll(pctx)
			c()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			if ctx.Err() != nil {
				t.Fatal("no error from Poll")
			}
		}
	}
	first := join("full", client.WithInstanceID("i1"))
	first.Subscribe("t")
	waitFor(t, 10*time.Second, func() string { return "first member never joined" }, func() bool { return first.MemberEpoch() > 0 })
	second := join("full")
	second.Subscribe("t")
	err := pollErr(second)
	if !isCode(err, runnelv1.ErrorCode_GROUP_MAX_SIZE_REACHED) {
		t.Fatalf("second member of a group capped at 1: %v", err)
	}
	if _, err2 := second.Poll(ctx); !errors.Is(err2, err) && err2.Error() != err.Error() {
		t.Fatalf("fatal error not repeated: %v", err2)
	}
	if err := second.Close(); err != nil {
		t.Fatalf("close after a fatal error: %v", err)
	}

	// The same instance id twice.
	dup := join("full", client.WithInstanceID("i1"))
	dup.Subscribe("t")
	if err := pollErr(dup); !isCode(err, runnelv1.ErrorCode_UNRELEASED_INSTANCE_ID) {
		t.Fatalf("duplicate instance id: %v", err)
	}

	// A regular expression Go refuses fails at once; one the broker refuses (too long) from Poll.
	re := join("regex")
	if err := re.SubscribeRegex("a)("); !isCode(err, runnelv1.ErrorCode_INVALID_REGULAR_EXPRESSION) {
		t.Fatalf("bad regex: %v", err)
	}
	re.SubscribeRegex(strings.Repeat("a", 2000))
	if err := pollErr(re); !isCode(err, runnelv1.ErrorCode_INVALID_REGULAR_EXPRESSION) {
		t.Fatalf("regex over the broker's limit: %v", err)
	}

	// A session timeout outside the broker's bounds.
	st := join("session", client.WithSessionTimeout(100*time.Millisecond))
	st.Subscribe("t")
	if err := pollErr(st); !isCode(err, runnelv1.ErrorCode_INVALID_SESSION_TIMEOUT) {
		t.Fatalf("session timeout below the minimum: %v", err)
	}

	// Poll before Subscribe, and after Close.
	idle := join("idle")
	if _, err := idle.Poll(ctx); err == nil {
		t.Fatal("Poll before Subscribe worked")
	}
	idle.Close()
	if _, err := idle.Poll(ctx); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Poll after Close: %v", err)
	}
}

// A regex subscription follows topics as they are created.
func TestGroupRegexSubscription(t *testing.T) {
	addr := startGroupNode(t)
	createTopic(t, addr, "ev-a", 2, nil)
	createTopic(t, addr, "other", 2, nil)
	gc, err := client.NewGroupConsumer([]string{addr}, "g", client.WithAutoOffsetReset(client.OffsetEarliest()))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	if err := gc.SubscribeRegex(`ev-.*`); err != nil {
		t.Fatal(err)
	}
	produceN(t, addr, "ev-a", 50)
	produceN(t, addr, "other", 50)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	byTopic := map[string]int{}
	for byTopic["ev-a"] < 50 {
		recs, err := gc.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			byTopic[r.Topic]++
		}
	}
	createTopic(t, addr, "ev-b", 3, nil)
	produceN(t, addr, "ev-b", 60)
	for byTopic["ev-b"] < 60 {
		recs, err := gc.Poll(ctx)
		if err != nil {
			t.Fatalf("after %v: %v", byTopic, err)
		}
		for _, r := range recs {
			byTopic[r.Topic]++
		}
	}
	if byTopic["other"] != 0 || byTopic["ev-a"] != 50 {
		t.Fatalf("read %v", byTopic)
	}
	if got := len(gc.Assignment()); got != 5 {
		t.Fatalf("assignment %v", gc.Assignment())
	}
}

// Pause holds a partition back while the others go on; Resume returns it. Seek re-reads, and the
// position sought is what gets committed.
func TestGroupPauseResumeSeek(t *testing.T) {
	addr := startGroupNode(t)
	createTopic(t, addr, "t", 2, nil)
	p := newProducer(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 100 {
		r := &client.Record{Topic: "t", Partition: int32(i % 2), Value: fmt.Appendf(nil, "%d", i)}
		if err := p.ProduceSync(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	gc, err := client.NewGroupConsumer([]string{addr}, "g", client.WithAutoOffsetReset(client.OffsetEarliest()),
		client.WithOnAssigned(func(_ context.Context, gc *client.GroupConsumer, ps []client.TopicPartition) {
			gc.Pause(client.TopicPartition{Topic: "t", Partition: 0})
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	gc.Subscribe("t")
	n1 := 0
	for n1 < 50 {
		recs, err := gc.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Partition == 0 {
				t.Fatalf("record of paused partition 0 returned: @%d", r.Offset)
			}
		}
		n1 += len(recs)
	}
	if got := gc.Paused(); len(got) != 1 || got[0].Partition != 0 {
		t.Fatalf("Paused() = %v", got)
	}
	gc.Resume(client.TopicPartition{Topic: "t", Partition: 0})
	n0 := 0
	for n0 < 50 {
		recs, err := gc.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n0 += len(recs)
	}
	gc.Seek("t", 1, 10)
	recs, err := gc.Poll(ctx)
	if err != nil || len(recs) == 0 || recs[0].Partition != 1 || recs[0].Offset != 10 {
		t.Fatalf("after Seek to 10: %d records, err %v", len(recs), err)
	}
	// Commit what Poll returned: partition 1 at the position after the re-read records.
	if err := gc.CommitSync(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := gc.Committed(ctx, client.TopicPartition{Topic: "t", Partition: 0}, client.TopicPartition{Topic: "t", Partition: 1})
	if err != nil {
		t.Fatal(err)
	}
	if c[client.TopicPartition{Topic: "t", Partition: 0}].Offset != 50 || c[client.TopicPartition{Topic: "t", Partition: 1}].Offset != gc.Position("t", 1) {
		t.Fatalf("committed %+v, position of 1 is %d", c, gc.Position("t", 1))
	}
	// Explicit commits with metadata.
	if err := gc.CommitOffsets(ctx, map[client.TopicPartition]client.OffsetAndMetadata{{Topic: "t", Partition: 1}: {Offset: 42, Metadata: "checkpoint"}}); err != nil {
		t.Fatal(err)
	}
	c, _ = gc.Committed(ctx, client.TopicPartition{Topic: "t", Partition: 1})
	if got := c[client.TopicPartition{Topic: "t", Partition: 1}]; got.Offset != 42 || got.Metadata != "checkpoint" || got.CommitTime.IsZero() {
		t.Fatalf("explicit commit: %+v", got)
	}
	// Out of range: beyond the log end.
	err = gc.CommitOffsets(ctx, map[client.TopicPartition]client.OffsetAndMetadata{{Topic: "t", Partition: 1}: {Offset: 1000}})
	var pe *client.PartitionError
	if !errors.As(err, &pe) || !errors.Is(err, rerr.ErrOffsetOutOfRange) {
		t.Fatalf("commit beyond the log end: %v", err)
	}
	done := make(chan error, 1)
	gc.CommitAsync(func(_ map[client.TopicPartition]client.OffsetAndMetadata, err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatalf("CommitAsync: %v", err)
	}
}

// PollFunc hands fn the records in order (and refuses to run from fn), and a Seek from inside fn sets
// the position the next poll starts from: the move of the records still being handed out does not
// overwrite it. CommitSync after PollFunc commits what fn saw.
func TestGroupPollFuncSeekFromFn(t *testing.T) {
	addr := startGroupNode(t)
	createTopic(t, addr, "t", 1, nil)
	produceN(t, addr, "t", 100)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gc := newGroupConsumer(t, addr, "g", []string{"t"}, client.WithAutoOffsetReset(client.OffsetEarliest()), client.WithAutoCommit(false))
	var offs []int64
	sought := false
	var nested error // PollFunc called from fn: refused
	fn := func(r *client.Record) {
		offs = append(offs, r.Offset)
		if r.Offset == 0 && nested == nil {
			_, nested = gc.PollFunc(ctx, func(*client.Record) {})
		}
		if !sought && r.Offset == 20 {
			sought = true
			gc.Seek("t", 0, 5)
		}
	}
	for !sought {
		if _, err := gc.PollFunc(ctx, fn); err != nil {
			t.Fatal(err)
		}
	}
	for i, o := range offs {
		if o != int64(i) {
			t.Fatalf("record %d handed to fn has offset %d (offsets %v)", i, o, offs)
		}
	}
	if nested == nil || !strings.Contains(nested.Error(), "while another PollFunc runs") {
		t.Fatalf("PollFunc from fn: %v, want a refusal", nested)
	}
	if pos := gc.Position("t", 0); pos != 5 {
		t.Fatalf("Position after fn sought to 5 = %d (the call handed out offsets 0-%d)", pos, offs[len(offs)-1])
	}
	offs = offs[:0]
	for len(offs) == 0 || offs[len(offs)-1] < 99 {
		if _, err := gc.PollFunc(ctx, fn); err != nil {
			t.Fatal(err)
		}
	}
	for i, o := range offs {
		if o != int64(5+i) {
			t.Fatalf("after the Seek, record %d has offset %d, want %d", i, o, 5+i)
		}
	}
	if err := gc.CommitSync(ctx); err != nil {
		t.Fatal(err)
	}
	k := client.TopicPartition{Topic: "t", Partition: 0}
	c, err := gc.Committed(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if c[k].Offset != 100 || gc.Position("t", 0) != 100 {
		t.Fatalf("committed %d, position %d after fn saw offset 99, want 100 for both", c[k].Offset, gc.Position("t", 0))
	}
}

// produceTwoPartitions produces 400 records to topic t, 200 to each of its 2 partitions.
func produceTwoPartitions(ctx context.Context, t *testing.T, addr string) {
	t.Helper()
	var recs []*client.Record
	for i := range 400 {
		recs = append(recs, &client.Record{Topic: "t", Partition: int32(i % 2), Value: fmt.Appendf(nil, "%d", i)})
	}
	if err := newProducer(t, addr).ProduceSync(ctx, recs...); err != nil {
		t.Fatal(err)
	}
}

// inOneCall runs try with a new member (auto-commit off, from the earliest offsets) of a new group
// subscribed to t, until try reports that its PollFunc call handed out records of both partitions in
// the way it needs (that depends on the fetches: the first attempt nearly always does, as the data is
// there before the member's first fetch); it fails the test when no attempt of 10 did.
func inOneCall(t *testing.T, addr string, try func(gc *client.GroupConsumer) bool) {
	t.Helper()
	for attempt := range 10 {
		gc := newGroupConsumer(t, addr, fmt.Sprintf("g%d", attempt), []string{"t"}, client.WithAutoOffsetReset(client.OffsetEarliest()), client.WithAutoCommit(false))
		done := try(gc)
		gc.Close()
		if done {
			return
		}
		t.Logf("attempt %d: the call did not hand out both partitions' records as needed", attempt)
	}
	t.Fatal("no call of 10 had both partitions' records")
}

// A Seek from fn on another partition than the record's stands too, when that partition's fetched
// records come later in the same call (they are still handed to fn, and must not move its position
// past the Seek's offset).
func TestGroupPollFuncSeekOtherPartition(t *testing.T) {
	addr := startGroupNode(t)
	createTopic(t, addr, "t", 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	produceTwoPartitions(ctx, t, addr)
	inOneCall(t, addr, func(gc *client.GroupConsumer) bool {
		other := int32(-1)
		after := 0 // records of the other partition fn saw after the Seek
		fn := func(r *client.Record) {
			switch {
			case other < 0:
				other = 1 - r.Partition
				gc.Seek("t", other, 5)
			case r.Partition == other:
				after++
			}
		}
		if _, err := gc.PollFunc(ctx, fn); err != nil {
			t.Fatal(err)
		}
		if after == 0 {
			return false
		}
		if pos := gc.Position("t", other); pos != 5 {
			t.Fatalf("Position of partition %d after fn sought it to 5 and then saw %d of its records = %d", other, after, pos)
		}
		return true
	})
}

// A partition whose revocation starts while PollFunc hands out records (the heartbeat loop stops
// fetching it at once; the member owns it until the next poll) still has its position moved past the
// records fn saw, so the commit at the revocation does not make the next owner read them again.
func TestGroupPollFuncRevokedMidCall(t *testing.T) {
	addr := startGroupNode(t)
	createTopic(t, addr, "t", 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	produceTwoPartitions(ctx, t, addr)
	inOneCall(t, addr, func(gc *client.GroupConsumer) bool {
		other := int32(-1)
		last := int64(-1) // the last offset of the other partition fn saw after it stopped being fetched
		fn := func(r *client.Record) {
			switch {
			case other < 0:
				other = 1 - r.Partition
				gc.StopFetching("t", other)
			case r.Partition == other:
				last = r.Offset
			}
		}
		if _, err := gc.PollFunc(ctx, fn); err != nil {
			t.Fatal(err)
		}
		if last < 0 {
			return false
		}
		if pos := gc.Position("t", other); pos != last+1 {
			t.Fatalf("Position of partition %d = %d after fn saw its records up to %d", other, pos, last)
		}
		return true
	})
}

// Admin: list, describe with members and lag, reset offsets (plan, refusal while members exist,
// execute), and delete.
func TestGroupAdmin(t *testing.T) {
	addr := startGroupNode(t)
	createTopic(t, addr, "t", 3, nil)
	p := newProducer(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	for i := range 300 {
		r := &client.Record{Topic: "t", Partition: int32(i % 3), Value: []byte("x"), Timestamp: t0.Add(time.Duration(i/3) * time.Second)}
		if err := p.ProduceSync(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	adm := newAdmin(t, addr)
	if _, err := adm.DescribeGroup(ctx, "nope"); !isCode(err, runnelv1.ErrorCode_GROUP_ID_NOT_FOUND) {
		t.Fatalf("describe unknown group: %v", err)
	}
	l := newLedger()
	w := startWorker(t, addr, "g", "A", l, []string{"t"}, client.WithAutoCommitInterval(50*time.Millisecond))
	waitFor(t, 20*time.Second, func() string { return fmt.Sprintf("%d processed", l.count()) }, func() bool { return l.count() == 300 })
	// Auto-commit stores what was processed; the last batch counts once Poll is called again.
	waitFor(t, 10*time.Second, func() string { return fmt.Sprint(committedAll(t, adm, "g")) }, func() bool {
		c := committedAll(t, adm, "g")
		return c[client.TopicPartition{Topic: "t", Partition: 0}] == 100 && c[client.TopicPartition{Topic: "t", Partition: 1}] == 100 &&
			c[client.TopicPartition{Topic: "t", Partition: 2}] == 100
	})
	gs, err := adm.ListGroups(ctx)
	if err != nil || len(gs) != 1 || gs[0].GroupID != "g" || gs[0].Members != 1 {
		t.Fatalf("ListGroups = %+v, %v", gs, err)
	}
	d, err := adm.DescribeGroup(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	if d.State != "stable" || len(d.Members) != 1 || len(d.Members[0].Assignment) != 3 || d.Members[0].MemberID != w.gc.MemberID() {
		t.Fatalf("describe: %+v", d)
	}
	produceN(t, addr, "t", 30)
	lag, err := adm.GroupLag(ctx, "g")
	if err != nil || len(lag) != 3 {
		t.Fatalf("lag %+v, %v", lag, err)
	}
	for _, r := range lag {
		if r.MemberID != w.gc.MemberID() || r.LogEndOffset < 100 || r.Lag != r.LogEndOffset-r.Committed {
			t.Fatalf("lag row %+v", r)
		}
	}
	all := []client.TopicPartition{{Topic: "t", Partition: 0}, {Topic: "t", Partition: 1}, {Topic: "t", Partition: 2}}
	if _, err := adm.ResetOffsets(ctx, "g", all, client.ResetToEarliest(), true); !isCode(err, runnelv1.ErrorCode_NON_EMPTY_GROUP) {
		t.Fatalf("reset with a member: %v", err)
	}
	if err := adm.DeleteGroup(ctx, "g"); !isCode(err, runnelv1.ErrorCode_NON_EMPTY_GROUP) {
		t.Fatalf("delete with a member: %v", err)
	}
	plan, err := adm.ResetOffsets(ctx, "g", all, client.ResetToEarliest(), false)
	if err != nil || len(plan) != 3 || plan[0].Target != 0 {
		t.Fatalf("dry-run plan with a member: %+v, %v", plan, err)
	}
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() string { return "group never emptied" }, func() bool {
		d, err := adm.DescribeGroup(ctx, "g")
		return err == nil && len(d.Members) == 0 && d.State == "empty"
	})
	c := committedAll(t, adm, "g")
	ends := topicEnds(t, adm, "t")
	for _, tc := range []struct {
		spec client.ResetSpec
		want func(k client.TopicPartition) int64
	}{
		{client.ResetToEarliest(), func(client.TopicPartition) int64 { return 0 }},
		{client.ResetToLatest(), func(k client.TopicPartition) int64 { return ends[k] }},
		{client.ResetToOffset(50), func(client.TopicPartition) int64 { return 50 }},
		{client.ResetToOffset(1 << 40), func(k client.TopicPartition) int64 { return ends[k] }},
		{client.ResetShiftBy(-20), func(k client.TopicPartition) int64 { return c[k] - 20 }},
		{client.ResetShiftBy(-1000), func(client.TopicPartition) int64 { return 0 }},
		{client.ResetToDatetime(t0.Add(10 * time.Second)), func(client.TopicPartition) int64 { return 10 }},
		{client.ResetToDatetime(t0.Add(time.Hour)), func(k client.TopicPartition) int64 { return ends[k] }},
	} {
		plan, err := adm.ResetOffsets(ctx, "g", all, tc.spec, false)
		if err != nil {
			t.Fatalf("%v: %v", tc.spec, err)
		}
		for _, r := range plan {
			k := client.TopicPartition{Topic: r.Topic, Partition: r.Partition}
			if r.Target != tc.want(k) || r.Current != c[k] || r.LogEndOffset != ends[k] {
				t.Fatalf("%v: plan row %+v, want target %d current %d", tc.spec, r, tc.want(k), c[k])
			}
		}
	}
	if committedAll(t, adm, "g")[all[0]] != c[all[0]] {
		t.Fatal("a dry run changed the committed offsets")
	}
	if _, err := adm.ResetOffsets(ctx, "g", all, client.ResetToOffset(10), true); err != nil {
		t.Fatalf("execute: %v", err)
	}
	if got := committedAll(t, adm, "g"); got[all[0]] != 10 || got[all[2]] != 10 {
		t.Fatalf("after reset to 10: %v", got)
	}
	// A member now starts at the reset offsets.
	gc, err := client.NewGroupConsumer([]string{addr}, "g")
	if err != nil {
		t.Fatal(err)
	}
	gc.Subscribe("t")
	recs, err := gc.Poll(ctx)
	if err != nil || len(recs) == 0 || recs[0].Offset != 10 {
		t.Fatalf("after reset: %v", err)
	}
	gc.Close()
	// Shift of a partition without a commit is refused; unknown partitions too.
	if _, err := adm.ResetOffsets(ctx, "other", all, client.ResetShiftBy(1), false); err == nil {
		t.Fatal("shift without a committed offset worked")
	}
	if _, err := adm.ResetOffsets(ctx, "g", []client.TopicPartition{{Topic: "t", Partition: 7}}, client.ResetToEarliest(), false); !errors.Is(err, rerr.ErrUnknownTopicOrPartition) {
		t.Fatalf("reset of a missing partition: %v", err)
	}
	if err := adm.DeleteGroup(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	if gs, _ := adm.ListGroups(ctx); len(gs) != 0 {
		t.Fatalf("groups after delete: %+v", gs)
	}
	if err := adm.DeleteGroup(ctx, "g"); !isCode(err, runnelv1.ErrorCode_GROUP_ID_NOT_FOUND) {
		t.Fatalf("delete twice: %v", err)
	}
}

// cutter is a dialer whose connections can be cut and refused for a while: a network partition
// between one client and the node.
type cutter struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func (c *cutter) dial(ctx context.Context, addr string) (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return nil, errors.New("network cut (test)")
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err == nil {
		c.conns = append(c.conns, conn)
	}
	return conn, err
}

func (c *cutter) set(cut bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut = cut
	if cut {
		for _, conn := range c.conns {
			conn.Close()
		}
		c.conns = nil
	}
}

// A member cut off from the coordinator past its session timeout drops its partitions (OnLost, no
// commit) before the coordinator gives them to another member, so no partition has two owners; when
// the network returns it joins again. Records it processed without committing are read again by the
// new owner, and nothing is skipped.
func TestGroupMemberIsolated(t *testing.T) {
	addr := startGroupNode(t)
	createTopic(t, addr, "t", 4, nil)
	produceN(t, addr, "t", 2000)
	l := newLedger()
	cut := &cutter{}
	opts := []client.GroupOption{client.WithSessionTimeout(2 * time.Second), client.WithAutoCommitInterval(50 * time.Millisecond)}
	a := startWorker(t, addr, "g", "A", l, []string{"t"}, append(opts, client.WithDialOptions(grpc.WithContextDialer(cut.dial)))...)
	b := startWorker(t, addr, "g", "B", l, []string{"t"}, opts...)
	waitFor(t, 20*time.Second, func() string { return fmt.Sprintf("%d processed", l.count()) },
		func() bool { return l.distinct() == 2000 && len(a.gc.Assignment()) == 2 && len(b.gc.Assignment()) == 2 })
	cut.set(true)
	produceN(t, addr, "t", 2000)
	waitFor(t, 20*time.Second, func() string { return fmt.Sprintf("A still owns %v", a.gc.Assignment()) },
		func() bool { return len(a.gc.Assignment()) == 0 && len(b.gc.Assignment()) == 4 })
	waitFor(t, 20*time.Second, func() string { return fmt.Sprintf("%d of 4000 processed", l.distinct()) }, func() bool { return l.distinct() == 4000 })
	l.mu.Lock()
	lost := false
	for _, e := range l.events {
		lost = lost || strings.HasPrefix(e, "A lost")
	}
	l.mu.Unlock()
	if !lost {
		t.Fatal("A never ran OnLost")
	}
	cut.set(false)
	waitFor(t, 30*time.Second, func() string { return fmt.Sprintf("A back with %v, B %v", a.gc.Assignment(), b.gc.Assignment()) },
		func() bool { return len(a.gc.Assignment()) == 2 && len(b.gc.Assignment()) == 2 })
	produceN(t, addr, "t", 1000)
	waitFor(t, 20*time.Second, func() string { return fmt.Sprintf("%d of 5000 processed", l.distinct()) }, func() bool { return l.distinct() == 5000 })
	if err := a.stop(); err != nil {
		t.Fatalf("A: %v", err)
	}
	if err := b.stop(); err != nil {
		t.Fatalf("B: %v", err)
	}
	l.check(t)
}
