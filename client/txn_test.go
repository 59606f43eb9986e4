package client_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Integration tests of transactions (KIP-98/447/890) against a real in-process node: the transactional
// producer, read_committed consumers, fencing and consume-transform-produce.

// requireTransactions skips the test when the node does not serve the Transactions service yet (the
// broker side is built separately); any other answer lets the test run.
func requireTransactions(t *testing.T, addr string) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = runnelv1.NewTransactionsClient(cc).ListTransactions(ctx, &runnelv1.ListTransactionsRequest{})
	if status.Code(err) == codes.Unimplemented {
		t.Skipf("the node does not serve runnel.v1.Transactions (broker side of transactions missing): %v", err)
	}
}

// newTxnProducer returns an initialized transactional producer.
func newTxnProducer(t *testing.T, addr, id string, opts ...client.ProducerOption) *client.Producer {
	t.Helper()
	p := newProducer(t, addr, append([]client.ProducerOption{client.WithTransactionalID(id), client.WithLinger(time.Millisecond)}, opts...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.InitTransactions(ctx); err != nil {
		t.Fatalf("InitTransactions(%q): %v", id, err)
	}
	return p
}

// produceValues produces one record per value to topic (keyed by the value, so they spread over the
// partitions) and waits for all of them.
func produceValues(t *testing.T, p *client.Producer, topic string, values ...string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs := make([]*client.Record, len(values))
	for i, v := range values {
		recs[i] = client.NewRecord(topic, []byte(v), []byte(v))
	}
	return p.ProduceSync(ctx, recs...)
}

func seq(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// assignAll assigns every partition of topic from the earliest offset.
func assignAll(t *testing.T, c *client.Consumer, topic string, partitions int32) {
	t.Helper()
	for p := range partitions {
		if err := c.Assign(topic, p, client.OffsetEarliest()); err != nil {
			t.Fatal(err)
		}
	}
}

func sortedValues(recs []*client.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = string(r.Value)
	}
	sort.Strings(out)
	return out
}

// waitAtEnd polls until the consumer's position in every partition reaches its high watermark
// (markers included: positions move past control batches).
func waitAtEnd(t *testing.T, c *client.Consumer, a *client.Admin, topic string) {
	t.Helper()
	ends := topicEnds(t, a, topic)
	waitFor(t, 15*time.Second, func() string {
		var s []string
		for k, end := range ends {
			s = append(s, fmt.Sprintf("%v at %d of %d", k, c.Position(k.Topic, k.Partition), end))
		}
		return "consumer positions: " + strings.Join(s, ", ")
	}, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if recs, err := c.Poll(ctx); len(recs) > 0 || (err != nil && !errors.Is(err, context.DeadlineExceeded)) {
			t.Fatalf("unexpected %d records (err %v) while waiting for the end", len(recs), err)
		}
		for k, end := range ends {
			if c.Position(k.Topic, k.Partition) < end {
				return false
			}
		}
		return true
	})
}

// TestTxnCommitVisibleToReadCommitted: records of an open transaction are held back from a
// read_committed consumer (and shown to a read_uncommitted one), and appear, all of them, once it
// commits; the markers are never returned, and the position moves past them.
func TestTxnCommitVisibleToReadCommitted(t *testing.T) {
	addr := startNode(t)
	requireTransactions(t, addr)
	createTopic(t, addr, "txc", 3, nil)
	p := newTxnProducer(t, addr, "commit-1")
	committed := newConsumer(t, addr, client.WithIsolationLevel(client.ReadCommitted))
	assignAll(t, committed, "txc", 3)
	uncommitted := newConsumer(t, addr)
	assignAll(t, uncommitted, "txc", 3)

	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	values := seq("c", 30)
	if err := produceValues(t, p, "txc", values...); err != nil {
		t.Fatalf("produce in the transaction: %v", err)
	}
	// Written and acknowledged, not committed: read_uncommitted sees them, read_committed does not.
	if got := sortedValues(consume(t, uncommitted, len(values), 15*time.Second)); !slices.Equal(got, values) {
		t.Fatalf("read_uncommitted before commit: %v", got)
	}
	expectNothing(t, committed)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.CommitTransaction(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if got := sortedValues(consume(t, committed, len(values), 15*time.Second)); !slices.Equal(got, values) {
		t.Fatalf("read_committed after commit: %v", got)
	}
	waitAtEnd(t, committed, newAdmin(t, addr), "txc")
	expectNothing(t, uncommitted) // the COMMIT markers are not records

	// The next transaction of the same producer works too, and the id is listed.
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	more := seq("d", 5)
	if err := produceValues(t, p, "txc", more...); err != nil {
		t.Fatal(err)
	}
	if err := p.CommitTransaction(ctx); err != nil {
		t.Fatalf("second commit: %v", err)
	}
	if got := sortedValues(consume(t, committed, len(more), 15*time.Second)); !slices.Equal(got, more) {
		t.Fatalf("second transaction: %v", got)
	}
	ts, err := newAdmin(t, addr).ListTransactions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ts, func(s client.TransactionSummary) bool { return s.TransactionalID == "commit-1" }) {
		t.Fatalf("ListTransactions without commit-1: %+v", ts)
	}
}

// TestTxnAbortInvisibleToReadCommitted: an aborted transaction's records are never returned to a
// read_committed consumer, while a read_uncommitted one returns them; the committed transaction after
// it is returned to both.
func TestTxnAbortInvisibleToReadCommitted(t *testing.T) {
	addr := startNode(t)
	requireTransactions(t, addr)
	createTopic(t, addr, "txa", 2, nil)
	p := newTxnProducer(t, addr, "abort-1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	aborted := seq("aborted", 20)
	if err := produceValues(t, p, "txa", aborted...); err != nil {
		t.Fatal(err)
	}
	if err := p.AbortTransaction(ctx); err != nil {
		t.Fatalf("abort: %v", err)
	}
	// Records produced and aborted before being sent fail with ErrTransactionAborted, never written.
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 10)
	for _, v := range seq("dropped", 10) {
		p.Produce(ctx, client.NewRecord("txa", nil, []byte(v)), func(_ *client.Record, err error) { errc <- err })
	}
	if err := p.AbortTransaction(ctx); err != nil {
		t.Fatalf("second abort: %v", err)
	}
	var dropped []error
	for range 10 {
		dropped = append(dropped, <-errc) // AbortTransaction returned: every promise has run
	}
	// Each either made it out before the abort (nil: written, then aborted) or was dropped.
	for _, err := range dropped {
		if err != nil && !errors.Is(err, client.ErrTransactionAborted) {
			t.Fatalf("record of an aborted transaction failed with %v", err)
		}
	}

	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	committed := seq("committed", 20)
	if err := produceValues(t, p, "txa", committed...); err != nil {
		t.Fatal(err)
	}
	if err := p.CommitTransaction(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}

	rc := newConsumer(t, addr, client.WithIsolationLevel(client.ReadCommitted))
	assignAll(t, rc, "txa", 2)
	if got := sortedValues(consume(t, rc, len(committed), 15*time.Second)); !slices.Equal(got, committed) {
		t.Fatalf("read_committed: %v", got)
	}
	waitAtEnd(t, rc, newAdmin(t, addr), "txa")

	ru := newConsumer(t, addr)
	assignAll(t, ru, "txa", 2)
	got := consume(t, ru, len(aborted)+len(committed)+countNil(dropped), 15*time.Second)
	var sawAborted, sawCommitted int
	for _, r := range got {
		switch v := string(r.Value); {
		case strings.HasPrefix(v, "aborted-"):
			sawAborted++
		case strings.HasPrefix(v, "committed-"):
			sawCommitted++
		}
	}
	if sawAborted != len(aborted) || sawCommitted != len(committed) {
		t.Fatalf("read_uncommitted saw %d aborted and %d committed records, want %d and %d", sawAborted, sawCommitted, len(aborted), len(committed))
	}
}

func countNil(errs []error) int {
	n := 0
	for _, err := range errs {
		if err == nil {
			n++
		}
	}
	return n
}

// TestTxnZombieFencing: a second producer with the same transactional id fences the first. The
// first's open transaction is aborted, its later writes and commit fail with ErrProducerFenced (and
// every call after), and none of its records become visible to read_committed consumers.
func TestTxnZombieFencing(t *testing.T) {
	addr := startNode(t)
	requireTransactions(t, addr)
	createTopic(t, addr, "txz", 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	zombie := newTxnProducer(t, addr, "zombie")
	if err := zombie.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := produceValues(t, zombie, "txz", seq("zombie-before", 10)...); err != nil {
		t.Fatal(err)
	}
	zid, zepoch := zombie.ProducerID()

	fresh := newTxnProducer(t, addr, "zombie") // fences the first, aborting its open transaction
	fid, fepoch := fresh.ProducerID()
	if fid != zid || fepoch <= zepoch {
		t.Fatalf("the new producer has id %d epoch %d; the fenced one had %d/%d", fid, fepoch, zid, zepoch)
	}
	if err := fresh.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := produceValues(t, fresh, "txz", seq("fresh", 10)...); err != nil {
		t.Fatal(err)
	}

	// The zombie goes on as if nothing happened: its writes are refused, its commit fails.
	werr := produceValues(t, zombie, "txz", seq("zombie-after", 10)...)
	if !errors.Is(werr, client.ErrProducerFenced) {
		t.Fatalf("zombie write: %v, want ErrProducerFenced", werr)
	}
	if err := zombie.CommitTransaction(ctx); !errors.Is(err, client.ErrProducerFenced) {
		t.Fatalf("zombie commit: %v, want ErrProducerFenced", err)
	}
	if err := zombie.BeginTransaction(); !errors.Is(err, client.ErrProducerFenced) {
		t.Fatalf("zombie begin after fencing: %v, want ErrProducerFenced", err)
	}
	if err := zombie.AbortTransaction(ctx); !errors.Is(err, client.ErrProducerFenced) {
		t.Fatalf("zombie abort after fencing: %v, want ErrProducerFenced", err)
	}

	if err := fresh.CommitTransaction(ctx); err != nil {
		t.Fatalf("the new producer's commit: %v", err)
	}
	rc := newConsumer(t, addr, client.WithIsolationLevel(client.ReadCommitted))
	assignAll(t, rc, "txz", 2)
	if got := sortedValues(consume(t, rc, 10, 15*time.Second)); !slices.Equal(got, seq("fresh", 10)) {
		t.Fatalf("read_committed: %v", got)
	}
	waitAtEnd(t, rc, newAdmin(t, addr), "txz")

	// The coordinator answers EndTxn once PREPARE_COMMIT is durable and completes the transaction
	// (COMPLETE_COMMIT, start time cleared) only after every marker is written, which is after the
	// consumer can see them: poll for the completion.
	adm := newAdmin(t, addr)
	var d *client.TransactionDescription
	waitFor(t, 15*time.Second, func() string { return fmt.Sprintf("describe after the commit: %+v, want CompleteCommit", d) }, func() bool {
		got, err := adm.DescribeTransaction(ctx, "zombie")
		if err != nil {
			t.Fatal(err)
		}
		d = got
		return d.State == "CompleteCommit"
	})
	// The commit bumped the epoch (KIP-890 part 2); the producer moved to it.
	if id, epoch := fresh.ProducerID(); d.ProducerID != fid || d.ProducerEpoch != fepoch+1 || id != fid || epoch != fepoch+1 || !d.StartTime.IsZero() {
		t.Fatalf("describe after the commit: %+v, producer at %d/%d (want producer %d epoch %d, no open transaction)", d, id, epoch, fid, fepoch+1)
	}
}

// TestTxnConsumeTransformProduce: a group member reads an input topic read_committed, writes a
// transformed record per input record and commits the input offsets in the same transaction
// (SendOffsetsToTransaction). An aborted attempt leaves neither output records nor offsets behind;
// the committed one leaves both, exactly once.
func TestTxnConsumeTransformProduce(t *testing.T) {
	addr := startGroupNode(t)
	requireTransactions(t, addr)
	createTopic(t, addr, "ctp-in", 2, nil)
	createTopic(t, addr, "ctp-out", 2, nil)
	inputs := seq("in", 40)
	if err := produceValues(t, newProducer(t, addr), "ctp-in", inputs...); err != nil {
		t.Fatal(err)
	}
	adm := newAdmin(t, addr)
	ends := topicEnds(t, adm, "ctp-in")

	gc, err := client.NewGroupConsumer([]string{addr}, "ctp", client.WithAutoCommit(false),
		client.WithIsolationLevel(client.ReadCommitted), client.WithAutoOffsetReset(client.OffsetEarliest()),
		client.WithFetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	if err := gc.Subscribe("ctp-in"); err != nil {
		t.Fatal(err)
	}
	p := newTxnProducer(t, addr, "ctp-writer")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// process writes the transformed records of recs and their offsets in one transaction.
	process := func(recs []*client.Record, commit bool) {
		t.Helper()
		if err := p.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		offsets := map[client.TopicPartition]client.OffsetAndMetadata{}
		var out []string
		for _, r := range recs {
			out = append(out, "out-"+strings.TrimPrefix(string(r.Value), "in-"))
			k := client.TopicPartition{Topic: r.Topic, Partition: r.Partition}
			offsets[k] = client.OffsetAndMetadata{Offset: max(offsets[k].Offset, r.Offset+1)}
		}
		if err := produceValues(t, p, "ctp-out", out...); err != nil {
			t.Fatal(err)
		}
		if err := p.SendOffsetsToTransaction(ctx, offsets, gc.GroupMetadata()); err != nil {
			t.Fatalf("send offsets: %v", err)
		}
		if !commit {
			if err := p.AbortTransaction(ctx); err != nil {
				t.Fatal(err)
			}
			return
		}
		if err := p.CommitTransaction(ctx); err != nil {
			t.Fatalf("commit: %v", err)
		}
	}

	// First attempt: processed, then aborted. Nothing is committed; the member seeks back.
	first, err := gc.Poll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	process(first, false)
	for k, off := range committedAll(t, adm, "ctp") {
		if off >= 0 {
			t.Fatalf("offset %d of %v committed by an aborted transaction", off, k)
		}
	}
	rewind := map[client.TopicPartition]int64{}
	for _, r := range first {
		k := client.TopicPartition{Topic: r.Topic, Partition: r.Partition}
		if o, ok := rewind[k]; !ok || r.Offset < o {
			rewind[k] = r.Offset
		}
	}
	for k, o := range rewind {
		gc.Seek(k.Topic, k.Partition, o)
	}

	// Then every input record, committed transaction by transaction.
	done := 0
	for done < len(inputs) {
		recs, err := gc.Poll(ctx)
		if err != nil {
			t.Fatalf("poll after %d records: %v", done, err)
		}
		process(recs, true)
		done += len(recs)
	}
	if done != len(inputs) {
		t.Fatalf("processed %d input records, want %d", done, len(inputs))
	}

	// The group's committed offsets are the input's ends, through the transactions' markers.
	waitFor(t, 15*time.Second, func() string { return fmt.Sprintf("committed %v, want %v", committedAll(t, adm, "ctp"), ends) }, func() bool {
		c := committedAll(t, adm, "ctp")
		for k, end := range ends {
			if c[k] != end {
				return false
			}
		}
		return true
	})
	rc := newConsumer(t, addr, client.WithIsolationLevel(client.ReadCommitted))
	assignAll(t, rc, "ctp-out", 2)
	want := make([]string, len(inputs))
	for i, v := range inputs {
		want[i] = "out-" + strings.TrimPrefix(v, "in-")
	}
	sort.Strings(want)
	if got := sortedValues(consume(t, rc, len(want), 15*time.Second)); !slices.Equal(got, want) {
		t.Fatalf("output read_committed: %v", got)
	}
	waitAtEnd(t, rc, adm, "ctp-out")

	// A new member of the group (read_committed, require_stable) starts after the committed offsets:
	// nothing is left to read.
	if err := gc.Close(); err != nil {
		t.Fatal(err)
	}
	gc2, err := client.NewGroupConsumer([]string{addr}, "ctp", client.WithAutoCommit(false),
		client.WithIsolationLevel(client.ReadCommitted), client.WithAutoOffsetReset(client.OffsetEarliest()))
	if err != nil {
		t.Fatal(err)
	}
	defer gc2.Close()
	if err := gc2.Subscribe("ctp-in"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, func() string { return fmt.Sprintf("assignment %v", gc2.Assignment()) }, func() bool {
		pctx, pcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer pcancel()
		recs, err := gc2.Poll(pctx)
		if len(recs) > 0 {
			t.Fatalf("a new member re-read %d committed input records (first %s)", len(recs), recs[0].Value)
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		return len(gc2.Assignment()) == 2
	})
	for k, end := range ends {
		if pos := gc2.Position(k.Topic, k.Partition); pos != end {
			t.Fatalf("new member starts %v at %d, want the committed %d", k, pos, end)
		}
	}
}
