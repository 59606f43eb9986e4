package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/batch"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Idempotent producer (KIP-98) against a real node. Each test first asks the node for a producer id and
// is skipped only when the broker does not implement InitProducerId (codes.Unimplemented), so they run
// as soon as the broker side exists.

// recordsClient returns a raw Records client of the node at addr.
func recordsClient(t *testing.T, addr string) runnelv1.RecordsClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return runnelv1.NewRecordsClient(cc)
}

// initProducerID asks the node for a producer id, skipping the test when the broker does not
// implement idempotence yet.
func initProducerID(t *testing.T, rc runnelv1.RecordsClient) (int64, int16) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := rc.InitProducerId(ctx, &runnelv1.InitProducerIdRequest{})
	if status.Code(err) == codes.Unimplemented {
		t.Skipf("the broker does not implement InitProducerId yet: %v", err)
	}
	if err != nil {
		t.Fatalf("InitProducerId: %v", err)
	}
	if resp.ProducerId < 0 || resp.ProducerEpoch != 0 {
		t.Fatalf("InitProducerId answered producer id %d epoch %d, want a fresh id with epoch 0", resp.ProducerId, resp.ProducerEpoch)
	}
	return resp.ProducerId, int16(resp.ProducerEpoch)
}

// idemBatch builds a batch of values carrying producer id, epoch and base sequence.
func idemBatch(id int64, epoch int16, seq int32, values ...string) []byte {
	var b batch.Builder
	for _, v := range values {
		b.Append(time.Now().UnixMilli(), nil, []byte(v), nil)
	}
	b.SetProducer(id, epoch, seq)
	return bytes.Clone(b.Build(batch.CompressionNone))
}

// produceRaw sends one batch to topic-0 with acks=all and returns the partition's result.
func produceRaw(t *testing.T, rc runnelv1.RecordsClient, topic string, wire []byte) (int64, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := rc.Produce(ctx, &runnelv1.ProduceRequest{CorrelationId: 1, Acks: runnelv1.Acks_ACKS_ALL,
		Partitions: []*runnelv1.ProducePartition{{Topic: topic, Partition: 0, Records: wire}}})
	if err != nil {
		t.Fatalf("produce: %v", err)
	}
	if len(resp.Partitions) != 1 {
		t.Fatalf("produce answered %d partitions", len(resp.Partitions))
	}
	r := resp.Partitions[0]
	return r.BaseOffset, rerr.FromInfo(r.Error)
}

// values consumes topic-0 from the start until n records came, checks nothing follows, and returns
// their values by offset.
func values(t *testing.T, addr, topic string, n int) map[int64]string {
	t.Helper()
	c := newConsumer(t, addr)
	if err := c.Assign(topic, 0, client.OffsetEarliest()); err != nil {
		t.Fatal(err)
	}
	out := map[int64]string{}
	for _, r := range consume(t, c, n, 30*time.Second) {
		out[r.Offset] = string(r.Value)
	}
	expectNothing(t, c)
	return out
}

// The broker's side of the contract, with raw requests: the same batch sent twice is answered with its
// first base offset and stored once (also when it comes back after a later batch), a gap is refused
// with OUT_OF_ORDER_SEQUENCE_NUMBER without changing what the broker expects, and another producer id
// has its own sequence.
func TestIdempotentBrokerDedupesAndRefusesGaps(t *testing.T) {
	addr := startNode(t)
	createTopic(t, addr, "idem-raw", 1, nil)
	rc := recordsClient(t, addr)
	id, epoch := initProducerID(t, rc)

	b0 := idemBatch(id, epoch, 0, "a", "b", "c")
	base, err := produceRaw(t, rc, "idem-raw", b0)
	if err != nil {
		t.Fatalf("first batch: %v", err)
	}
	if again, err := produceRaw(t, rc, "idem-raw", b0); err != nil || again != base {
		t.Fatalf("the same batch again: base offset %d, err %v; want %d, nil", again, err, base)
	}
	if got, err := produceRaw(t, rc, "idem-raw", idemBatch(id, epoch, 3, "d")); err != nil || got != base+3 {
		t.Fatalf("next batch: base offset %d, err %v; want %d", got, err, base+3)
	}
	// A retry that arrives after a later batch is still recognised (the broker keeps the last 5).
	if again, err := produceRaw(t, rc, "idem-raw", b0); err != nil || again != base {
		t.Fatalf("the first batch after the second: base offset %d, err %v; want %d", again, err, base)
	}
	// A gap is refused, and changes nothing.
	if _, err := produceRaw(t, rc, "idem-raw", idemBatch(id, epoch, 10, "gap")); !errors.Is(err, rerr.ErrOutOfOrderSequence) {
		t.Fatalf("a batch after a gap: %v, want OUT_OF_ORDER_SEQUENCE_NUMBER", err)
	}
	if got, err := produceRaw(t, rc, "idem-raw", idemBatch(id, epoch, 4, "e")); err != nil || got != base+4 {
		t.Fatalf("the expected batch after a refused gap: base offset %d, err %v; want %d", got, err, base+4)
	}
	// Another producer id starts its own sequence at 0; its records are new records.
	id2, epoch2 := initProducerID(t, rc)
	if id2 == id {
		t.Fatalf("InitProducerId gave the same id %d twice", id)
	}
	if got, err := produceRaw(t, rc, "idem-raw", idemBatch(id2, epoch2, 0, "a")); err != nil || got != base+5 {
		t.Fatalf("another producer's first batch: base offset %d, err %v; want %d", got, err, base+5)
	}
	got := values(t, addr, "idem-raw", 6)
	for i, want := range []string{"a", "b", "c", "d", "e", "a"} {
		if got[base+int64(i)] != want {
			t.Fatalf("log %v, want a b c d e a from offset %d", got, base)
		}
	}
}

// Answers lost after the broker wrote the batch (the producer is told REQUEST_TIMED_OUT or
// NOT_ENOUGH_REPLICAS_AFTER_APPEND and retries): with idempotence on (the default) every record is stored
// once, in order, at the offset its promise reported, and the stored batches carry the producer id and
// contiguous sequences. The node may answer a later request before an earlier one; the producer must
// still never let the leader write more than 4 of a partition's batches after one it may re-send (it
// counted only batches in flight, and under load about 1 run in 100 had a retry refused with
// OUT_OF_ORDER_SEQUENCE_NUMBER).
func TestIdempotentProducerRetriesWriteOnce(t *testing.T) {
	addr := startNode(t)
	const parts, n = 3, 20000
	createTopic(t, addr, "idem-retry", parts, nil)
	initProducerID(t, recordsClient(t, addr))
	px := startProxy(t, addr)
	var (
		mu      sync.Mutex
		seen    = map[string]int{} // first value of a batch → times forwarded
		lost    int
		batches int
	)
	px.lose = func(pp *runnelv1.ProducePartition) *runnelv1.ErrorInfo {
		mu.Lock()
		defer mu.Unlock()
		first := firstValue(pp)
		seen[first]++
		if seen[first] > 1 {
			return nil // the retry goes through
		}
		batches++
		if batches%4 != 1 {
			return nil
		}
		lost++
		code := runnelv1.ErrorCode_REQUEST_TIMED_OUT
		if lost%2 == 0 {
			code = runnelv1.ErrorCode_NOT_ENOUGH_REPLICAS_AFTER_APPEND
		}
		return rerr.ToInfo(rerr.New(code, "answer lost"))
	}
	p := newProducer(t, px.addr, client.WithBatchBytes(8<<10), client.WithLinger(time.Millisecond),
		client.WithRetryBackoff(5*time.Millisecond, 20*time.Millisecond))
	ctx := context.Background()
	ps := newPromises()
	offsets := make([]int64, n)
	for i := range n {
		fn := ps.fn(i)
		p.Produce(ctx, client.NewRecord("idem-retry", keyOf(i), []byte(strconv.Itoa(i))), func(r *client.Record, err error) {
			offsets[i] = r.Offset
			fn(r, err)
		})
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ps.check(t, n)
	// Every batch sent was counted once and released once (batches are recycled: a count carried
	// over from a batch's previous use would leave the limit on open batches, below, ineffective).
	if open := p.OpenBatches(); open != 0 {
		t.Fatalf("%d batches counted open after Flush, want 0", open)
	}
	id, _ := p.ProducerID()
	if id < 0 {
		t.Fatalf("producer id %d after producing with idempotence on", id)
	}
	mu.Lock()
	if lost == 0 {
		t.Fatal("no answer was lost")
	}
	t.Logf("%d of %d batches had their answer lost and were sent again", lost, batches)
	mu.Unlock()

	c := newConsumer(t, addr)
	for i := range int32(parts) {
		c.Assign("idem-retry", i, client.OffsetEarliest())
	}
	recs := consume(t, c, n, 30*time.Second)
	checkKeyedOrder(t, recs, n, parts, keyOf) // fails on a record stored twice
	expectNothing(t, c)
	for _, r := range recs {
		i, _ := strconv.Atoi(string(r.Value))
		if offsets[i] != r.Offset {
			t.Fatalf("record %d stored at %d, its promise said %d", i, r.Offset, offsets[i])
		}
	}

	// The stored batches carry the producer id and, per partition, contiguous sequences from 0.
	rc := recordsClient(t, addr)
	for part := range int32(parts) {
		next, seq := int64(0), int32(0)
		for {
			resp, err := rc.Fetch(ctx, &runnelv1.FetchRequest{Partitions: []*runnelv1.FetchPartition{{Topic: "idem-retry", Partition: part, FetchOffset: next}}})
			if err != nil || len(resp.Partitions) != 1 || resp.Partitions[0].Error != nil {
				t.Fatalf("fetch: %v %v", err, resp)
			}
			if len(resp.Partitions[0].Records) == 0 {
				break
			}
			err = batch.Split(resp.Partitions[0].Records, func(_ []byte, h batch.Header) error {
				if h.ProducerID != id || h.BaseSequence != seq {
					return fmt.Errorf("partition %d batch at %d: producer id %d sequence %d, want %d and %d", part, h.BaseOffset, h.ProducerID, h.BaseSequence, id, seq)
				}
				seq = batch.NextSequence(seq, h.RecordCount)
				next = h.BaseOffset + int64(h.LastOffsetDelta) + 1
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A batch the producer was told failed for good (MESSAGE_TOO_LARGE, injected without forwarding it)
// leaves a gap: the broker refuses the next batch, already in flight, with OUT_OF_ORDER_SEQUENCE_NUMBER,
// and that batch fails with the first error wrapped. The producer then takes a new producer id and the
// partition goes on.
func TestIdempotentProducerGap(t *testing.T) {
	addr := startNode(t)
	createTopic(t, addr, "idem-gap", 1, nil)
	initProducerID(t, recordsClient(t, addr))
	px := startProxy(t, addr)
	var (
		mu        sync.Mutex
		forwarded []string
		refused   []runnelv1.ErrorCode
	)
	px.filter = func(pp *runnelv1.ProducePartition) *runnelv1.ErrorInfo {
		mu.Lock()
		defer mu.Unlock()
		v := firstValue(pp)
		forwarded = append(forwarded, v)
		if v == "bad" {
			return rerr.ToInfo(rerr.New(runnelv1.ErrorCode_MESSAGE_TOO_LARGE, "injected"))
		}
		return nil
	}
	px.observe = func(res *runnelv1.ProducePartitionResult) {
		if res.Error != nil {
			mu.Lock()
			refused = append(refused, res.Error.Code)
			mu.Unlock()
		}
	}
	seenBy := func(v string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, f := range forwarded {
				if f == v {
					return true
				}
			}
			return false
		}
	}
	// A linger (of a microsecond) sends a batch whenever a slot is free, so "after" goes while "bad" is
	// unanswered; with linger 0 it would wait for that answer (natural batching).
	p := newProducer(t, px.addr, client.WithLinger(time.Microsecond))
	ctx := context.Background()
	if err := p.ProduceSync(ctx, client.NewRecord("idem-gap", nil, []byte("w0"))); err != nil {
		t.Fatal(err)
	}
	id1, _ := p.ProducerID()
	if id1 < 0 {
		t.Fatalf("producer id %d", id1)
	}
	px.holdAnswers() // so that "after" is in flight before "bad" is answered
	errs := make(chan error, 2)
	p.Produce(ctx, client.NewRecord("idem-gap", nil, []byte("bad")), func(_ *client.Record, err error) { errs <- err })
	waitFor(t, 10*time.Second, func() string { return "bad not sent" }, seenBy("bad"))
	p.Produce(ctx, client.NewRecord("idem-gap", nil, []byte("after")), func(_ *client.Record, err error) { errs <- err })
	waitFor(t, 10*time.Second, func() string { return "after not sent" }, seenBy("after"))
	px.release()
	badErr, afterErr := <-errs, <-errs
	if !errors.Is(badErr, rerr.ErrMessageTooLarge) || strings.Contains(badErr.Error(), "earlier batch") {
		t.Fatalf("bad: %v", badErr)
	}
	if !errors.Is(afterErr, rerr.ErrMessageTooLarge) || !strings.Contains(afterErr.Error(), "after an earlier batch failed") {
		t.Fatalf("after: %v", afterErr)
	}
	mu.Lock()
	if len(refused) != 1 || refused[0] != runnelv1.ErrorCode_OUT_OF_ORDER_SEQUENCE_NUMBER {
		t.Fatalf("broker errors %v, want one OUT_OF_ORDER_SEQUENCE_NUMBER", refused)
	}
	mu.Unlock()
	// The partition goes on under a new producer id.
	if err := p.ProduceSync(ctx, client.NewRecord("idem-gap", nil, []byte("next"))); err != nil {
		t.Fatalf("after the gap: %v", err)
	}
	if id2, _ := p.ProducerID(); id2 < 0 || id2 == id1 {
		t.Fatalf("producer id %d after the gap, was %d", id2, id1)
	}
	got := values(t, addr, "idem-gap", 2)
	if len(got) != 2 || got[0] != "w0" || got[1] != "next" {
		t.Fatalf("log %v, want w0 next", got)
	}
}

// A cluster without InitProducerId (Unimplemented): a producer with idempotence at its default goes on
// without it, one with WithIdempotence(true) fails its records at once with UNSUPPORTED_VERSION.
func TestIdempotenceUnsupportedByCluster(t *testing.T) {
	addr := startNode(t)
	createTopic(t, addr, "idem-none", 1, nil)
	px := startProxy(t, addr)
	px.noInitProducerID = true
	ctx := context.Background()

	p := newProducer(t, px.addr)
	if err := p.ProduceSync(ctx, client.NewRecord("idem-none", nil, []byte("a")), client.NewRecord("idem-none", nil, []byte("b"))); err != nil {
		t.Fatalf("default producer: %v", err)
	}
	if id, epoch := p.ProducerID(); id != -1 || epoch != -1 {
		t.Fatalf("ProducerID() = %d, %d without idempotence", id, epoch)
	}
	resp, err := recordsClient(t, addr).Fetch(ctx, &runnelv1.FetchRequest{Partitions: []*runnelv1.FetchPartition{{Topic: "idem-none", Partition: 0}}})
	if err != nil || len(resp.Partitions) != 1 {
		t.Fatalf("fetch: %v", err)
	}
	if h, err := batch.Validate(resp.Partitions[0].Records); err != nil || h.ProducerID != -1 || h.BaseSequence != -1 {
		t.Fatalf("stored batch %+v, err %v: want producer id and sequence -1", h, err)
	}

	strict := newProducer(t, px.addr, client.WithIdempotence(true))
	start := time.Now()
	err = strict.ProduceSync(ctx, client.NewRecord("idem-none", nil, []byte("c")))
	if !errors.Is(err, rerr.ErrUnsupportedVersion) || time.Since(start) > 30*time.Second {
		t.Fatalf("WithIdempotence(true): %v after %v, want UNSUPPORTED_VERSION at once", err, time.Since(start))
	}
	if got := values(t, addr, "idem-none", 2); got[0] != "a" || got[1] != "b" {
		t.Fatalf("log %v", got)
	}
}
