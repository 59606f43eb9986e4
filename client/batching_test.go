package client_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/batch"
)

// Natural batching (the default linger 0): a record is sent at once when nothing is in flight, and the
// records produced while the one request slot is taken go together in one batch once its answer frees
// it; they are all stored, in order.
func TestNaturalBatching(t *testing.T) {
	addr := startNode(t)
	createTopic(t, addr, "nb", 1, nil)
	px := startProxy(t, addr)
	var (
		mu     sync.Mutex
		counts []int // records per batch, in the order the proxy read them
	)
	px.filter = func(pp *runnelv1.ProducePartition) *runnelv1.ErrorInfo {
		n := 0
		batch.DecodeRecords(pp.Records, func(batch.Record) error { n++; return nil })
		mu.Lock()
		counts = append(counts, n)
		mu.Unlock()
		return nil
	}
	seen := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(counts)
	}
	p := newProducer(t, px.addr, client.WithMaxInFlight(1))
	ctx := context.Background()
	px.holdAnswers()
	ps := newPromises()
	p.Produce(ctx, client.NewRecord("nb", nil, []byte("v-0")), ps.fn(0))
	// Sent without waiting for more records, nor for a Flush.
	deadline := time.Now().Add(30 * time.Second)
	for len(seen()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first record was not sent while no request was in flight")
		}
		time.Sleep(time.Millisecond)
	}
	// Its answer is held, so the one request slot stays taken: these accumulate in one batch.
	for i := 1; i <= 10; i++ {
		p.Produce(ctx, client.NewRecord("nb", nil, fmt.Appendf(nil, "v-%d", i)), ps.fn(i))
	}
	px.release()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ps.check(t, 11)
	if got := seen(); !slices.Equal(got, []int{1, 10}) {
		t.Fatalf("batches of %v records, want [1 10]", got)
	}
	c := newConsumer(t, addr)
	if err := c.Assign("nb", 0, client.OffsetEarliest()); err != nil {
		t.Fatal(err)
	}
	recs := consume(t, c, 11, 30*time.Second)
	for i, r := range recs {
		if want := fmt.Sprintf("v-%d", i); string(r.Value) != want || r.Offset != int64(i) {
			t.Fatalf("record %d: %q at offset %d, want %q at %d", i, r.Value, r.Offset, want, i)
		}
	}
}

// requestLog records, per produce request the proxy read, how many records each partition's batch
// held.
type requestLog struct {
	mu   sync.Mutex
	reqs []map[int32]int
}

func (l *requestLog) observe(req *runnelv1.ProduceRequest) {
	m := map[int32]int{}
	for _, pp := range req.Partitions {
		batch.DecodeRecords(pp.Records, func(batch.Record) error { m[pp.Partition]++; return nil })
	}
	l.mu.Lock()
	l.reqs = append(l.reqs, m)
	l.mu.Unlock()
}

func (l *requestLog) seen() []map[int32]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs)
}

// waitRequests polls until the proxy has read n produce requests.
func (l *requestLog) waitRequests(t *testing.T, n int) []map[int32]int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := l.seen()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d produce requests within 30s, want %d: %v", len(got), n, got)
		}
		time.Sleep(time.Millisecond)
	}
}

// startHeldProducer starts a node with topic (2 partitions) and a producer talking to it through a
// proxy that logs every produce request and holds every answer back until released (at the latest in
// the test's cleanup, before the producer's Close, which waits for the answers).
func startHeldProducer(t *testing.T, topic string, opts ...client.ProducerOption) (string, *proxy, *requestLog, *client.Producer) {
	t.Helper()
	addr := startNode(t)
	createTopic(t, addr, topic, 2, nil)
	px := startProxy(t, addr)
	log := &requestLog{}
	px.requests = log.observe
	p := newProducer(t, px.addr, opts...)
	t.Cleanup(px.release)
	px.holdAnswers()
	return addr, px, log, p
}

// producerTo returns a function that produces a record of value to partition of topic with p, its
// promise the next of ps, and one that says how many it produced.
func producerTo(ctx context.Context, p *client.Producer, topic string, ps *promises) (produce func(partition int32, value []byte), produced func() int) {
	seq := 0
	produce = func(partition int32, value []byte) {
		r := client.NewRecord(topic, nil, value)
		r.Partition = partition
		p.Produce(ctx, r, ps.fn(seq))
		seq++
	}
	return produce, func() int { return seq }
}

// Natural batching keeps one request in flight below full speed: with a request unanswered and slots
// free (the default 5), records for another partition wait in their open batch instead of going in a
// request of their own, and ride along with the next request that goes anyway, here one a full batch
// makes. Then everything is stored, in order.
func TestNaturalBatchingOneRequestInFlight(t *testing.T) {
	addr, px, log, p := startHeldProducer(t, "nb1", client.WithBatchBytes(1024), client.WithOpenHold(time.Hour))
	ctx := context.Background()
	ps := newPromises()
	produce, produced := producerTo(ctx, p, "nb1", ps)
	produce(0, []byte("a-0"))
	log.waitRequests(t, 1) // nothing was in flight: sent at once
	for i := range 3 {
		produce(1, fmt.Appendf(nil, "b-%d", i))
	}
	// Three records of 300 bytes fill partition 0's 1 KiB batch; the fourth seals it, and the full
	// batch goes at once with a slot free, taking partition 1's open batch along.
	big := make([]byte, 300)
	for range 4 {
		produce(0, big)
	}
	got := log.waitRequests(t, 2)
	if want := (map[int32]int{0: 3, 1: 3}); len(got) != 2 || !maps.Equal(got[1], want) {
		t.Fatalf("requests %v, want the second to carry %v (partition 1's records were not to go on their own)", got, want)
	}
	px.release()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ps.check(t, produced())
	c := newConsumer(t, addr)
	for part, n := range map[int32]int{0: 5, 1: 3} {
		if err := c.Assign("nb1", part, client.OffsetEarliest()); err != nil {
			t.Fatal(err)
		}
		recs := consume(t, c, n, 30*time.Second)
		for i, r := range recs {
			if r.Partition != part || r.Offset != int64(i) {
				t.Fatalf("partition %d record %d: partition %d offset %d", part, i, r.Partition, r.Offset)
			}
		}
		c.Unassign("nb1", part)
	}
}

// An open batch that a request full of full batches has no room for (WithMaxRequestBytes) goes in a
// request of its own while answers are still held, instead of waiting until nothing is in flight.
func TestNaturalBatchingCrowdedOpenBatch(t *testing.T) {
	_, px, log, p := startHeldProducer(t, "nb3", client.WithBatchBytes(1024), client.WithMaxRequestBytes(1024),
		client.WithMaxInFlight(10), client.WithAcks(client.AcksLeader), client.WithOpenHold(time.Hour))
	ctx := context.Background()
	ps := newPromises()
	produce, produced := producerTo(ctx, p, "nb3", ps)
	produce(0, []byte("a-0"))
	log.waitRequests(t, 1)
	produce(1, []byte("cold"))
	big := make([]byte, 300)
	for range 10 { // three full batches of partition 0, each alone filling a request
		produce(0, big)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !slices.ContainsFunc(log.seen(), func(m map[int32]int) bool { return m[1] == 1 }) {
		if time.Now().After(deadline) {
			t.Fatalf("partition 1's record not sent while answers were held; requests %v", log.seen())
		}
		time.Sleep(time.Millisecond)
	}
	px.release()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ps.check(t, produced())
}

// A batch that is not full waits for an answer that does not come at most defaultOpenHold (5 ms),
// then takes a slot of its own: a stalled request holds up no other partition for longer.
func TestNaturalBatchingOpenHoldBound(t *testing.T) {
	_, px, log, p := startHeldProducer(t, "nb4")
	ctx := context.Background()
	ps := newPromises()
	produce, _ := producerTo(ctx, p, "nb4", ps)
	produce(0, []byte("a"))
	log.waitRequests(t, 1)
	start := time.Now()
	produce(1, []byte("b"))
	got := log.waitRequests(t, 2) // while the first answer is still held
	if waited := time.Since(start); waited < 5*time.Millisecond {
		t.Fatalf("partition 1's batch went after %v, before the 5 ms hold", waited)
	}
	if want := (map[int32]int{1: 1}); !maps.Equal(got[1], want) {
		t.Fatalf("second request %v, want %v", got[1], want)
	}
	px.release()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ps.check(t, 2)
}

// Flush does not wait for the requests in flight before sending the open batches: with the one request
// unanswered, a Flush sends the other partition's records at once.
func TestNaturalBatchingFlushSendsOpenBatches(t *testing.T) {
	_, px, log, p := startHeldProducer(t, "nb2", client.WithOpenHold(time.Hour))
	ctx := context.Background()
	ps := newPromises()
	produce, _ := producerTo(ctx, p, "nb2", ps)
	produce(0, []byte("a"))
	log.waitRequests(t, 1)
	produce(1, []byte("b"))
	flushed := make(chan error, 1)
	go func() { flushed <- p.Flush(ctx) }()
	got := log.waitRequests(t, 2) // while the first answer is still held
	if want := (map[int32]int{1: 1}); !maps.Equal(got[1], want) {
		t.Fatalf("second request %v, want %v", got[1], want)
	}
	px.release()
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	ps.check(t, 2)
}

// A nil promise is allowed: the record is written all the same, and Flush waits for it.
func TestProduceWithoutPromise(t *testing.T) {
	addr := startNode(t)
	createTopic(t, addr, "np", 2, nil)
	p := newProducer(t, addr)
	ctx := context.Background()
	recs := make([]*client.Record, 100)
	for i := range recs {
		recs[i] = client.NewRecord("np", fmt.Appendf(nil, "k%d", i), []byte("v"))
		p.Produce(ctx, recs[i], nil)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		if r.Offset < 0 || r.Partition < 0 {
			t.Fatalf("record %d: partition %d, offset %d after Flush", i, r.Partition, r.Offset)
		}
	}
	p.Produce(ctx, &client.Record{Partition: -1}, nil) // fails at once (no topic): nothing to call
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}
