package client_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/batch"
)

// Natural batching (the default linger 0): a record is sent as soon as a request slot is free, and the
// records produced while every slot is taken go together in one batch once an answer frees one; they
// are all stored, in order.
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
