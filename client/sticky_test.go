package client_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/batch"
)

// KIP-480 through the producer: keyless records of a topic stay on one partition until its batch is
// full, then move to another partition, so every batch but the last is full; each topic has its own
// sticky partition, and records produced to two topics in turn (one producer) each reach their own. A
// batch sealed by the sink rather than by a record that does not fit moves the sticky partition too.
func TestProducerStickyBatches(t *testing.T) {
	addr := startNode(t)
	topics := map[string]int32{"sticky-a": 4, "sticky-b": 3}
	for name, n := range topics {
		createTopic(t, addr, name, n, nil)
	}
	const batchBytes = 2048
	// The linger outlasts the test, so batches are sealed only when full (or by the final Flush).
	p := newProducer(t, addr, client.WithBatchBytes(batchBytes), client.WithLinger(time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ts := time.UnixMilli(1_700_000_000_000)
	value := func(topic string, i int) []byte {
		return append(fmt.Appendf(nil, "%s-%05d-", topic, i), bytes.Repeat([]byte("x"), 90)...)
	}
	// How many of these records a batch holds, as the builder counts (same timestamp for all).
	var bl batch.Builder
	perBatch := 0
	for bl.Size()+bl.RecordSize(ts.UnixMilli(), nil, value("sticky-a", perBatch), nil) <= batchBytes {
		bl.Append(ts.UnixMilli(), nil, value("sticky-a", perBatch), nil)
		perBatch++
	}
	const per = 200
	recs := map[string][]*client.Record{}
	for i := range per {
		for _, name := range []string{"sticky-a", "sticky-b"} {
			r := &client.Record{Topic: name, Partition: -1, Value: value(name, i), Timestamp: ts}
			recs[name] = append(recs[name], r)
			p.Produce(ctx, r, nil)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for name, rs := range recs {
		// Runs of consecutive records on one partition: each a batch.
		var runs []int
		var parts []int32
		for i, r := range rs {
			if i == 0 || r.Partition != rs[i-1].Partition {
				runs = append(runs, 0)
				parts = append(parts, r.Partition)
			}
			runs[len(runs)-1]++
		}
		for i, n := range runs[:len(runs)-1] {
			if n != perBatch {
				t.Fatalf("%s: runs of records per partition %v (partitions %v), want %d (a full batch) but for the last", name, runs, parts, perBatch)
			}
			if i > 0 && parts[i] == parts[i-1] {
				t.Fatalf("%s: consecutive batches on partition %d", name, parts[i])
			}
		}
		if runs[len(runs)-1] > perBatch || len(runs) != (per+perBatch-1)/perBatch {
			t.Fatalf("%s: runs %v for %d records of %d a batch", name, runs, per, perBatch)
		}
	}
	// A batch the sink seals before it is full (no linger: the batch goes as soon as it can) moves the
	// sticky partition too, so records produced one at a time change partition every time.
	p0 := newProducer(t, addr)
	prev := int32(-1)
	for i := range 20 {
		r := &client.Record{Topic: "sticky-a", Partition: -1, Value: value("sticky-a", per+i), Timestamp: ts}
		if err := p0.ProduceSync(ctx, r); err != nil {
			t.Fatal(err)
		}
		if r.Partition == prev {
			t.Fatalf("record %d produced alone on partition %d, as the one before", i, prev)
		}
		prev = r.Partition
		recs["sticky-a"] = append(recs["sticky-a"], r)
	}
	c := newConsumer(t, addr)
	total := 0
	for name, n := range topics {
		for i := range n {
			if err := c.Assign(name, i, client.OffsetEarliest()); err != nil {
				t.Fatal(err)
			}
		}
		total += len(recs[name])
	}
	for _, r := range consume(t, c, total, 30*time.Second) {
		if !strings.HasPrefix(string(r.Value), r.Topic+"-") {
			t.Fatalf("record %.20q read from topic %s", r.Value, r.Topic)
		}
	}
}
