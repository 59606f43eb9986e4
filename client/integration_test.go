package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/platform"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Badger and its cache keep process-wide goroutines after the node closes.
		goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreAnyFunction("github.com/dgraph-io/ristretto/v2/z.(*AllocatorPool).freeupAllocators"),
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

// startNode starts a node on free ports with its data in a temporary directory and returns its gRPC
// address; it is closed when the test ends.
func startNode(t testing.TB) string {
	t.Helper()
	cfg := platform.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.RaftAddr = "127.0.0.1:0"
	cfg.SerfAddr = ""
	n, err := platform.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n.GRPCAddr()
}

func newAdmin(t testing.TB, addr string) *client.Admin {
	t.Helper()
	a, err := client.NewAdmin([]string{addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func createTopic(t testing.TB, addr, name string, partitions int32, configs map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a := newAdmin(t, addr)
	if _, err := a.CreateTopic(ctx, name, partitions, 1, configs); err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
}

func newProducer(t testing.TB, addr string, opts ...client.ProducerOption) *client.Producer {
	t.Helper()
	p, err := client.NewProducer([]string{addr}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func newConsumer(t testing.TB, addr string, opts ...client.ConsumerOption) *client.Consumer {
	t.Helper()
	c, err := client.NewConsumer([]string{addr}, append([]client.ConsumerOption{client.WithFetchMaxWait(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// consume polls until n records have come (or the deadline passes) and returns them.
func consume(t testing.TB, c *client.Consumer, n int, timeout time.Duration) []*client.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []*client.Record
	for len(out) < n {
		recs, err := c.Poll(ctx)
		if err != nil {
			t.Fatalf("poll after %d of %d records: %v", len(out), n, err)
		}
		out = append(out, recs...)
	}
	if len(out) > n {
		t.Fatalf("consumed %d records, want %d", len(out), n)
	}
	return out
}

// expectNothing checks that Poll returns nothing more for a short while.
func expectNothing(t testing.TB, c *client.Consumer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if recs, err := c.Poll(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Poll returned %d more records (err %v)", len(recs), err)
	}
}

// promises collects promise outcomes and checks each partition's promises ran in produce order.
type promises struct {
	mu      sync.Mutex
	errs    []error
	ok      int
	lastSeq map[int32]int
	misord  int
	// unordered: records were produced concurrently, so seq is not produce order
	unordered bool
	done      sync.WaitGroup
}

func newPromises() *promises { return &promises{lastSeq: map[int32]int{}} }

// fn returns the promise of the record with sequence seq (produce order).
func (ps *promises) fn(seq int) func(*client.Record, error) {
	ps.done.Add(1)
	return func(r *client.Record, err error) {
		defer ps.done.Done()
		ps.mu.Lock()
		defer ps.mu.Unlock()
		if err != nil {
			ps.errs = append(ps.errs, err)
			return
		}
		ps.ok++
		if last, ok := ps.lastSeq[r.Partition]; ok && seq < last && !ps.unordered {
			ps.misord++
		}
		ps.lastSeq[r.Partition] = seq
	}
}

func (ps *promises) finished() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.ok + len(ps.errs)
}

func (ps *promises) check(t testing.TB, want int) {
	t.Helper()
	ps.done.Wait()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if len(ps.errs) > 0 {
		t.Fatalf("%d promises failed, first: %v", len(ps.errs), ps.errs[0])
	}
	if ps.ok != want || ps.misord != 0 {
		t.Fatalf("%d promises succeeded (want %d), %d out of order", ps.ok, want, ps.misord)
	}
}

// checkKeyedOrder checks that recs hold exactly the values "0".."n-1", each on its key's partition, in
// increasing order per partition (hence per key), with consecutive offsets.
func checkKeyedOrder(t testing.TB, recs []*client.Record, n int, partitions int32, keyOf func(int) []byte) {
	t.Helper()
	seen := make([]bool, n)
	last := map[int32]*client.Record{}
	for _, r := range recs {
		seq, err := strconv.Atoi(string(r.Value))
		if err != nil || seq < 0 || seq >= n {
			t.Fatalf("unexpected value %q", r.Value)
		}
		if seen[seq] {
			t.Fatalf("record %d twice", seq)
		}
		seen[seq] = true
		if key := keyOf(seq); !bytes.Equal(r.Key, key) || r.Partition != client.KeyPartition(key, partitions) {
			t.Fatalf("record %d: key %q partition %d, want %q on %d", seq, r.Key, r.Partition, key, client.KeyPartition(key, partitions))
		}
		if prev := last[r.Partition]; prev != nil {
			pseq, _ := strconv.Atoi(string(prev.Value))
			if seq < pseq || r.Offset != prev.Offset+1 {
				t.Fatalf("partition %d: record %d at offset %d after record %d at %d", r.Partition, seq, r.Offset, pseq, prev.Offset)
			}
		}
		last[r.Partition] = r
	}
}

func keyOf(i int) []byte { return fmt.Appendf(nil, "key-%d", i%37) }

func TestProduceConsumeKeyedOrder(t *testing.T) {
	addr := startNode(t)
	const parts, n = 4, 20000
	createTopic(t, addr, "orders", parts, nil)
	p := newProducer(t, addr, client.WithLinger(2*time.Millisecond), client.WithBatchBytes(16<<10))
	ctx := context.Background()
	ps := newPromises()
	for i := range n {
		p.Produce(ctx, client.NewRecord("orders", keyOf(i), []byte(strconv.Itoa(i))), ps.fn(i))
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ps.check(t, n)

	c := newConsumer(t, addr)
	for i := range int32(parts) {
		if err := c.Assign("orders", i, client.OffsetEarliest()); err != nil {
			t.Fatal(err)
		}
	}
	recs := consume(t, c, n, 30*time.Second)
	checkKeyedOrder(t, recs, n, parts, keyOf)
	expectNothing(t, c)
	var total int64
	for i := range int32(parts) {
		if c.Position("orders", i) != c.HighWatermark("orders", i) {
			t.Errorf("partition %d: position %d, high watermark %d", i, c.Position("orders", i), c.HighWatermark("orders", i))
		}
		total += c.Position("orders", i)
	}
	if total != n {
		t.Errorf("positions add up to %d, want %d", total, n)
	}
}

// Several goroutines produce at once, each with its own keys; keyless records spread by the sticky
// partitioner; ProduceSync fills offsets.
func TestConcurrentProducersAndSticky(t *testing.T) {
	addr := startNode(t)
	createTopic(t, addr, "mixed", 3, nil)
	p := newProducer(t, addr, client.WithBatchBytes(4<<10), client.WithLinger(time.Millisecond))
	ctx := context.Background()
	const goroutines, per = 4, 2000
	var wg sync.WaitGroup
	var failed atomic.Int64
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				seq := g*per + i
				var key []byte
				if i%2 == 0 {
					key = fmt.Appendf(nil, "g%d-%d", g, i%10)
				}
				p.Produce(ctx, client.NewRecord("mixed", key, []byte(strconv.Itoa(seq))), func(_ *client.Record, err error) {
					if err != nil {
						failed.Add(1)
					}
				})
			}
		}()
	}
	wg.Wait()
	rs := []*client.Record{client.NewRecord("mixed", nil, []byte("sync-a")), client.NewRecord("mixed", []byte("k"), []byte("sync-b"))}
	if err := p.ProduceSync(ctx, rs...); err != nil {
		t.Fatal(err)
	}
	if rs[0].Offset < 0 || rs[1].Partition != client.KeyPartition([]byte("k"), 3) || rs[1].Offset < 0 {
		t.Fatalf("ProduceSync left %+v %+v", rs[0], rs[1])
	}
	if err := p.Flush(ctx); err != nil || failed.Load() != 0 {
		t.Fatalf("flush %v, %d failed", err, failed.Load())
	}
	c := newConsumer(t, addr)
	for i := range int32(3) {
		c.Assign("mixed", i, client.OffsetEarliest())
	}
	recs := consume(t, c, goroutines*per+2, 30*time.Second)
	perPart := map[int32]int{}
	lastSeq := map[string]int{}
	for _, r := range recs {
		perPart[r.Partition]++
		if r.Key == nil {
			continue
		}
		seq, err := strconv.Atoi(string(r.Value))
		if err != nil {
			continue
		}
		if prev, ok := lastSeq[string(r.Key)]; ok && seq < prev {
			t.Fatalf("key %s: %d after %d", r.Key, seq, prev)
		}
		lastSeq[string(r.Key)] = seq
	}
	if len(perPart) != 3 {
		t.Fatalf("records reached partitions %v; keyless ones should move between all three", perPart)
	}
}

func TestAcksVariants(t *testing.T) {
	addr := startNode(t)
	createTopic(t, addr, "acks", 1, nil)
	c := newConsumer(t, addr)
	if err := c.Assign("acks", 0, client.OffsetEarliest()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, acks := range []client.Acks{client.AcksAll, client.AcksLeader, client.AcksNone} {
		t.Run(acks.String(), func(t *testing.T) {
			p := newProducer(t, addr, client.WithAcks(acks))
			var rs []*client.Record
			for i := range 500 {
				rs = append(rs, client.NewRecord("acks", nil, fmt.Appendf(nil, "%s-%d", acks, i)))
			}
			if err := p.ProduceSync(ctx, rs...); err != nil {
				t.Fatal(err)
			}
			for i, r := range rs {
				if acks == client.AcksNone && r.Offset != -1 || acks != client.AcksNone && (r.Offset < 0 || i > 0 && r.Offset != rs[i-1].Offset+1) {
					t.Fatalf("acks %v: record %d offset %d", acks, i, r.Offset)
				}
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			got := consume(t, c, len(rs), 30*time.Second)
			for i, r := range got {
				if !bytes.Equal(r.Value, rs[i].Value) {
					t.Fatalf("record %d = %q, want %q", i, r.Value, rs[i].Value)
				}
			}
		})
	}
}

// Every codec round-trips through the broker: null and empty keys, tombstones, headers.
func TestCompressionCodecs(t *testing.T) {
	addr := startNode(t)
	ctx := context.Background()
	for _, codec := range []batch.Compression{batch.CompressionNone, batch.CompressionGzip, batch.CompressionSnappy, batch.CompressionLZ4, batch.CompressionZstd} {
		t.Run(codec.String(), func(t *testing.T) {
			topic := "codec-" + codec.String()
			createTopic(t, addr, topic, 1, nil)
			p := newProducer(t, addr, client.WithCompression(codec), client.WithAcks(client.AcksLeader))
			var want []*client.Record
			ps := newPromises()
			for i := range 3000 {
				r := client.NewRecord(topic, nil, bytes.Repeat(fmt.Appendf(nil, "value %d;", i), 1+i%5))
				switch i % 4 {
				case 1:
					r.Key = fmt.Appendf(nil, "key-%d", i%13)
				case 2:
					r.Key, r.Value = []byte{}, nil // tombstone with an empty key
				case 3:
					r.Headers = []client.Header{{Key: "traceparent", Value: []byte("00-1-2-01")}, {Key: "null", Value: nil}}
				}
				r.Timestamp = time.UnixMilli(1_700_000_000_000 + int64(i))
				want = append(want, r)
				p.Produce(ctx, r, ps.fn(i))
			}
			if err := p.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			ps.check(t, len(want))
			c := newConsumer(t, addr)
			c.Assign(topic, 0, client.OffsetEarliest())
			got := consume(t, c, len(want), 30*time.Second)
			for i, r := range got {
				w := want[i]
				if r.Offset != w.Offset || !r.Timestamp.Equal(w.Timestamp) || !bytes.Equal(r.Key, w.Key) || (r.Key == nil) != (w.Key == nil) ||
					!bytes.Equal(r.Value, w.Value) || (r.Value == nil) != (w.Value == nil) || len(r.Headers) != len(w.Headers) {
					t.Fatalf("record %d = %+v, want %+v", i, r, w)
				}
				for j := range r.Headers {
					if r.Headers[j].Key != w.Headers[j].Key || (r.Headers[j].Value == nil) != (w.Headers[j].Value == nil) {
						t.Fatalf("record %d header %d = %+v, want %+v", i, j, r.Headers[j], w.Headers[j])
					}
				}
			}
		})
	}
}

func TestFlushAndClose(t *testing.T) {
	addr := startNode(t)
	createTopic(t, addr, "fc", 2, nil)
	p, err := client.NewProducer([]string{addr}, client.WithLinger(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ps := newPromises()
	for i := range 100 {
		p.Produce(ctx, client.NewRecord("fc", nil, []byte("a")), ps.fn(i))
	}
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := p.Flush(fctx); err != nil { // a linger of an hour must not hold Flush up
		t.Fatal(err)
	}
	ps.check(t, 100)

	ps = newPromises()
	for i := range 100 {
		p.Produce(ctx, client.NewRecord("fc", nil, []byte("b")), ps.fn(i))
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	ps.check(t, 100) // Close flushed
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	var after error
	p.Produce(ctx, client.NewRecord("fc", nil, nil), func(_ *client.Record, err error) { after = err })
	if !errors.Is(after, client.ErrClosed) {
		t.Fatalf("Produce after Close: %v", after)
	}
	if err := p.ProduceSync(ctx, client.NewRecord("fc", nil, nil)); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("ProduceSync after Close: %v", err)
	}
}

func TestUnknownTopic(t *testing.T) {
	addr := startNode(t)
	p := newProducer(t, addr, client.WithDeliveryTimeout(time.Second), client.WithRetryBackoff(20*time.Millisecond, 100*time.Millisecond))
	start := time.Now()
	err := p.ProduceSync(context.Background(), client.NewRecord("no-such-topic", nil, []byte("x")))
	if !errors.Is(err, rerr.ErrUnknownTopicOrPartition) {
		t.Fatalf("err %v, want UNKNOWN_TOPIC_OR_PARTITION", err)
	}
	if el := time.Since(start); el < time.Second || el > 10*time.Second {
		t.Fatalf("gave up after %v; want the delivery timeout (1s)", el)
	}
	// A partition beyond the topic's count fails too, without waiting for the delivery timeout.
	createTopic(t, addr, "two", 2, nil)
	r := &client.Record{Topic: "two", Partition: 5, Value: []byte("x")}
	if err := p.ProduceSync(context.Background(), r); !errors.Is(err, rerr.ErrUnknownTopicOrPartition) {
		t.Fatalf("partition 5 of 2: %v", err)
	}
	// Produce's context ends the wait for metadata.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.ProduceSync(ctx, client.NewRecord("still-missing", nil, nil)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctx during metadata wait: %v", err)
	}
}

// A topic created after producing started is found by the metadata retries.
func TestTopicCreatedLate(t *testing.T) {
	addr := startNode(t)
	p := newProducer(t, addr, client.WithRetryBackoff(20*time.Millisecond, 100*time.Millisecond))
	done := make(chan error, 1)
	go func() { done <- p.ProduceSync(context.Background(), client.NewRecord("late", nil, []byte("x"))) }()
	time.Sleep(100 * time.Millisecond) // let the producer see the topic missing at least once
	createTopic(t, addr, "late", 1, nil)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("record to a late topic never completed")
	}
}

func TestMessageTooLarge(t *testing.T) {
	addr := startNode(t)
	createTopic(t, addr, "small", 1, map[string]string{"max.message.bytes": "2048"})
	p := newProducer(t, addr, client.WithMaxRequestBytes(1<<20), client.WithDeliveryTimeout(30*time.Second))
	ctx := context.Background()

	// Over the producer's own request cap: refused before sending.
	start := time.Now()
	err := p.ProduceSync(ctx, client.NewRecord("small", nil, make([]byte, 2<<20)))
	if !errors.Is(err, rerr.ErrMessageTooLarge) || time.Since(start) > time.Second {
		t.Fatalf("2 MiB record: %v after %v", err, time.Since(start))
	}
	// Over the topic's max.message.bytes: the broker refuses it and the producer does not retry.
	start = time.Now()
	err = p.ProduceSync(ctx, client.NewRecord("small", nil, make([]byte, 4096)))
	if !errors.Is(err, rerr.ErrMessageTooLarge) || time.Since(start) > 5*time.Second {
		t.Fatalf("4 KiB record to a 2 KiB topic: %v after %v", err, time.Since(start))
	}
	// The partition goes on working.
	if err := p.ProduceSync(ctx, client.NewRecord("small", nil, []byte("fits"))); err != nil {
		t.Fatal(err)
	}
}

func TestConsumerPositions(t *testing.T) {
	addr := startNode(t)
	createTopic(t, addr, "pos", 1, nil)
	p := newProducer(t, addr)
	ctx := context.Background()
	produce := func(from, to int, ts time.Time) {
		t.Helper()
		var rs []*client.Record
		for i := from; i < to; i++ {
			r := client.NewRecord("pos", nil, []byte(strconv.Itoa(i)))
			r.Timestamp = ts
			rs = append(rs, r)
		}
		if err := p.ProduceSync(ctx, rs...); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.UnixMilli(1_700_000_000_000)
	produce(0, 10, t0)
	produce(10, 20, t0.Add(time.Hour))

	c := newConsumer(t, addr)
	if err := c.Assign("pos", 0, client.OffsetLatest()); err != nil {
		t.Fatal(err)
	}
	if c.Position("pos", 0) != 20 {
		t.Fatalf("latest resolved to %d", c.Position("pos", 0))
	}
	produce(20, 25, t0.Add(2*time.Hour))
	if got := consume(t, c, 5, 10*time.Second); string(got[0].Value) != "20" || got[0].Offset != 20 {
		t.Fatalf("after latest: first %q at %d", got[0].Value, got[0].Offset)
	}
	if c.HighWatermark("pos", 0) != 25 || c.Position("pos", 0) != 25 {
		t.Fatalf("hw %d position %d", c.HighWatermark("pos", 0), c.Position("pos", 0))
	}

	// Seek into the middle of a batch: records before the position are skipped.
	c.Seek("pos", 0, 13)
	if got := consume(t, c, 12, 10*time.Second); got[0].Offset != 13 || got[11].Offset != 24 {
		t.Fatalf("after seek: %d..%d", got[0].Offset, got[len(got)-1].Offset)
	}
	// Assign again by time: the first record at or after t0+1h is offset 10.
	if err := c.Assign("pos", 0, client.OffsetAfterTime(t0.Add(30*time.Minute))); err != nil || c.Position("pos", 0) != 10 {
		t.Fatalf("after time: position %d err %v", c.Position("pos", 0), err)
	}
	if got := consume(t, c, 15, 10*time.Second); got[0].Offset != 10 {
		t.Fatalf("after time: first offset %d", got[0].Offset)
	}
	// A time after every record starts at the end.
	if err := c.Assign("pos", 0, client.OffsetAfterTime(t0.Add(24*time.Hour))); err != nil || c.Position("pos", 0) != 25 {
		t.Fatalf("future time: position %d err %v", c.Position("pos", 0), err)
	}

	// Out of range: Poll reports it (every time) until Seek.
	c.Seek("pos", 0, 1_000_000)
	for range 2 {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := c.Poll(pctx)
		cancel()
		var pe *client.PartitionError
		if !errors.Is(err, rerr.ErrOffsetOutOfRange) || !errors.As(err, &pe) || pe.Topic != "pos" || pe.Partition != 0 {
			t.Fatalf("poll beyond the log: %v", err)
		}
	}
	c.Seek("pos", 0, 0)
	if got := consume(t, c, 25, 10*time.Second); got[0].Offset != 0 || got[24].Offset != 24 {
		t.Fatal("re-read after out of range")
	}
	c.Unassign("pos", 0)
	if c.Position("pos", 0) != -1 {
		t.Fatal("position of an unassigned partition")
	}
	// A missing topic is retried (it may be new) within the request timeout, then reported.
	short := newConsumer(t, addr, client.WithRequestTimeout(500*time.Millisecond))
	if err := short.Assign("nope", 0, client.OffsetEarliest()); !errors.Is(err, rerr.ErrUnknownTopicOrPartition) {
		t.Fatalf("assign of a missing topic: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Poll(ctx); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Poll after Close: %v", err)
	}
}

func TestAdmin(t *testing.T) {
	addr := startNode(t)
	a := newAdmin(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := a.CreateTopic(ctx, "adm", 3, 1, map[string]string{"retention.ms": "3600000"})
	if err != nil || id == "" {
		t.Fatalf("create: %q %v", id, err)
	}
	if _, err := a.CreateTopic(ctx, "adm", 3, 1, nil); !errors.Is(err, rerr.ErrTopicAlreadyExists) {
		t.Fatalf("create twice: %v", err)
	}
	if _, err := a.CreateTopic(ctx, "bad/name", 1, 1, nil); !errors.Is(err, rerr.ErrInvalidTopic) {
		t.Fatalf("bad name: %v", err)
	}
	ts, err := a.ListTopics(ctx, false)
	if err != nil || len(ts) != 1 || ts[0].Name != "adm" || ts[0].Partitions != 3 || ts[0].TopicID != id {
		t.Fatalf("list: %+v %v", ts, err)
	}
	d, err := a.DescribeTopic(ctx, "adm")
	if err != nil || d.TopicID != id || len(d.Partitions) != 3 {
		t.Fatalf("describe: %+v %v", d, err)
	}
	if v := config(d.Configs, "retention.ms"); v == nil || v.Value != "3600000" || v.IsDefault {
		t.Fatalf("retention.ms: %+v", v)
	}
	cs, err := a.AlterTopicConfig(ctx, "adm", map[string]string{"max.message.bytes": "4096"}, []string{"retention.ms"})
	if err != nil {
		t.Fatal(err)
	}
	if v := config(cs, "max.message.bytes"); v == nil || v.Value != "4096" {
		t.Fatalf("altered max.message.bytes: %+v", v)
	}
	if v := config(cs, "retention.ms"); v == nil || !v.IsDefault {
		t.Fatalf("deleted retention.ms: %+v", v)
	}
	if _, err := a.AlterTopicConfig(ctx, "adm", map[string]string{"retention.ms": "soon"}, nil); !errors.Is(err, rerr.ErrInvalidConfig) {
		t.Fatalf("bad config: %v", err)
	}

	p := newProducer(t, addr)
	r := &client.Record{Topic: "adm", Partition: 1, Value: []byte("x"), Timestamp: time.UnixMilli(5000)}
	if err := p.ProduceSync(ctx, r, &client.Record{Topic: "adm", Partition: 1, Value: []byte("y"), Timestamp: time.UnixMilli(9000)}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec     client.Offset
		off, ts  int64
		checkTS  bool
		wantText string
	}{
		{client.OffsetEarliest(), 0, 0, false, "earliest"},
		{client.OffsetLatest(), 2, 0, false, "latest"},
		{client.OffsetAfterTime(time.UnixMilli(6000)), 1, 9000, true, "time"},
		{client.OffsetAfterTime(time.UnixMilli(99000)), -1, -1, true, "future"},
	} {
		off, ts, err := a.ListOffsets(ctx, "adm", 1, tc.spec)
		if err != nil || off != tc.off || tc.checkTS && ts != tc.ts {
			t.Fatalf("ListOffsets %s: %d %d %v", tc.wantText, off, ts, err)
		}
	}
	if _, _, err := a.ListOffsets(ctx, "nope", 0, client.OffsetLatest()); !errors.Is(err, rerr.ErrUnknownTopicOrPartition) {
		t.Fatalf("ListOffsets of a missing topic: %v", err)
	}
	md, err := a.Metadata(ctx, "adm")
	if err != nil || len(md.Brokers) != 1 || md.Brokers[0].GrpcAddr != addr || len(md.Topics) != 1 || len(md.Topics[0].Partitions) != 3 {
		t.Fatalf("metadata: %v %v", md, err)
	}
	if err := a.DeleteTopic(ctx, "adm"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.DescribeTopic(ctx, "adm"); !errors.Is(err, rerr.ErrUnknownTopicOrPartition) {
		t.Fatalf("describe deleted: %v", err)
	}
	if err := a.DeleteTopic(ctx, "adm"); !errors.Is(err, rerr.ErrUnknownTopicOrPartition) {
		t.Fatalf("delete twice: %v", err)
	}
}

func config(cs []client.ConfigEntry, name string) *client.ConfigEntry {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

// proxy sits between a client and a node, forwarding every call. Its produce hooks inject errors into
// or hold back answers, to drive the client's retry and backpressure paths against the real broker.
type proxy struct {
	runnelv1.UnimplementedRecordsServer
	runnelv1.UnimplementedAdminServer
	addr  string
	conn  *grpc.ClientConn
	up    runnelv1.RecordsClient
	admin runnelv1.AdminClient

	// filter decides, per partition of a produce request, to forward it (nil) or answer with an error.
	filter func(pp *runnelv1.ProducePartition) *runnelv1.ErrorInfo
	// lose decides, per forwarded partition, to replace the broker's answer with an error (nil: keep
	// it): the batch is written but the producer is told otherwise, as when an answer is lost.
	lose func(pp *runnelv1.ProducePartition) *runnelv1.ErrorInfo
	// observe sees each answer of the broker (before lose replaces it).
	observe func(res *runnelv1.ProducePartitionResult)
	// requests sees each produce request as the proxy reads it, before filter.
	requests func(req *runnelv1.ProduceRequest)
	// noInitProducerID answers InitProducerId as a broker without idempotence does (Unimplemented).
	noInitProducerID bool
	// hold, while open, keeps answers back.
	holdMu sync.Mutex
	hold   chan struct{}
}

func startProxy(t *testing.T, nodeAddr string) *proxy {
	t.Helper()
	cc, err := grpc.NewClient(nodeAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(128<<20), grpc.MaxCallSendMsgSize(128<<20)))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	px := &proxy{addr: ln.Addr().String(), conn: cc, up: runnelv1.NewRecordsClient(cc), admin: runnelv1.NewAdminClient(cc)}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(128<<20), grpc.MaxSendMsgSize(128<<20))
	runnelv1.RegisterRecordsServer(srv, px)
	runnelv1.RegisterAdminServer(srv, px)
	go srv.Serve(ln)
	t.Cleanup(func() {
		px.release()
		srv.Stop()
		cc.Close()
	})
	return px
}

func (px *proxy) holdAnswers() {
	px.holdMu.Lock()
	px.hold = make(chan struct{})
	px.holdMu.Unlock()
}

func (px *proxy) holding() bool {
	px.holdMu.Lock()
	defer px.holdMu.Unlock()
	return px.hold != nil
}

func (px *proxy) release() {
	px.holdMu.Lock()
	if px.hold != nil {
		close(px.hold)
		px.hold = nil
	}
	px.holdMu.Unlock()
}

func (px *proxy) wait(ctx context.Context) {
	px.holdMu.Lock()
	h := px.hold
	px.holdMu.Unlock()
	if h != nil {
		select {
		case <-h:
		case <-ctx.Done():
		}
	}
}

func (px *proxy) Metadata(ctx context.Context, req *runnelv1.MetadataRequest) (*runnelv1.MetadataResponse, error) {
	resp, err := px.up.Metadata(ctx, req)
	if err == nil {
		for _, b := range resp.Brokers {
			b.GrpcAddr = px.addr // keep the client talking to the proxy
		}
	}
	return resp, err
}

func (px *proxy) Fetch(ctx context.Context, req *runnelv1.FetchRequest) (*runnelv1.FetchResponse, error) {
	return px.up.Fetch(ctx, req)
}

func (px *proxy) ListOffsets(ctx context.Context, req *runnelv1.ListOffsetsRequest) (*runnelv1.ListOffsetsResponse, error) {
	return px.up.ListOffsets(ctx, req)
}

func (px *proxy) CreateTopics(ctx context.Context, req *runnelv1.CreateTopicsRequest) (*runnelv1.CreateTopicsResponse, error) {
	return px.admin.CreateTopics(ctx, req)
}

func (px *proxy) InitProducerId(ctx context.Context, req *runnelv1.InitProducerIdRequest) (*runnelv1.InitProducerIdResponse, error) {
	if px.noInitProducerID {
		return px.UnimplementedRecordsServer.InitProducerId(ctx, req)
	}
	return px.up.InitProducerId(ctx, req)
}

func (px *proxy) ProduceStream(st grpc.BidiStreamingServer[runnelv1.ProduceRequest, runnelv1.ProduceResponse]) error {
	up, err := px.up.ProduceStream(st.Context())
	if err != nil {
		return err
	}
	var (
		held     sync.WaitGroup // answers sent from aside
		mu       sync.Mutex
		injected = map[int64][]*runnelv1.ProducePartitionResult{}
		lost     = map[int64]map[string]*runnelv1.ErrorInfo{} // correlation id → topic/partition → error
		sendMu   sync.Mutex
	)
	send := func(resp *runnelv1.ProduceResponse) error {
		px.wait(st.Context())
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.Send(resp)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			resp, err := up.Recv()
			if err != nil {
				return
			}
			mu.Lock()
			for _, r := range resp.Partitions {
				if px.observe != nil {
					px.observe(r)
				}
				if info := lost[resp.CorrelationId][fmt.Sprintf("%s/%d", r.Topic, r.Partition)]; info != nil {
					r.Error, r.BaseOffset = info, -1
				}
			}
			delete(lost, resp.CorrelationId)
			resp.Partitions = append(resp.Partitions, injected[resp.CorrelationId]...)
			delete(injected, resp.CorrelationId)
			mu.Unlock()
			if send(resp) != nil {
				return
			}
		}
	}()
	defer func() { <-done; held.Wait() }()
	for {
		req, err := st.Recv()
		if err != nil {
			up.CloseSend()
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if px.requests != nil {
			px.requests(req)
		}
		fwd := &runnelv1.ProduceRequest{CorrelationId: req.CorrelationId, Acks: req.Acks, TimeoutMs: req.TimeoutMs}
		var inj []*runnelv1.ProducePartitionResult
		for _, pp := range req.Partitions {
			if px.filter != nil {
				if info := px.filter(pp); info != nil {
					inj = append(inj, &runnelv1.ProducePartitionResult{Topic: pp.Topic, Partition: pp.Partition, Error: info, BaseOffset: -1})
					continue
				}
			}
			if px.lose != nil {
				if info := px.lose(pp); info != nil {
					mu.Lock()
					if lost[req.CorrelationId] == nil {
						lost[req.CorrelationId] = map[string]*runnelv1.ErrorInfo{}
					}
					lost[req.CorrelationId][fmt.Sprintf("%s/%d", pp.Topic, pp.Partition)] = info
					mu.Unlock()
				}
			}
			fwd.Partitions = append(fwd.Partitions, pp)
		}
		if len(fwd.Partitions) == 0 {
			resp := &runnelv1.ProduceResponse{CorrelationId: req.CorrelationId, Partitions: inj}
			if px.holding() {
				// Answer from aside, so that held answers do not stop the proxy reading requests.
				held.Add(1)
				go func() {
					defer held.Done()
					send(resp)
				}()
				continue
			}
			if err := send(resp); err != nil {
				return err
			}
			continue
		}
		mu.Lock()
		injected[req.CorrelationId] = inj
		mu.Unlock()
		if err := up.Send(fwd); err != nil {
			return err
		}
	}
}

// firstValue returns the value of the first record of the batches in pp.
func firstValue(pp *runnelv1.ProducePartition) string {
	var v string
	batch.DecodeRecords(pp.Records, func(r batch.Record) error {
		if v == "" {
			v = string(r.Value)
		}
		return nil
	})
	return v
}

// Retriable errors in the middle of pipelined requests: the failing partition's later in-flight batches
// fail too (as with a real leader change), and the producer re-sends from the first failed batch once
// they are all answered. Every record arrives exactly once, each partition in order, and promises run in
// order.
func TestRetriableErrorsKeepOrder(t *testing.T) {
	addr := startNode(t)
	const parts, n = 3, 30000
	createTopic(t, addr, "retry", parts, nil)
	px := startProxy(t, addr)
	var (
		mu      sync.Mutex
		failing = map[int32]string{} // partition → value of the first record of the batch that must come back
		batches = map[int32]int{}
		faults  int
	)
	px.filter = func(pp *runnelv1.ProducePartition) *runnelv1.ErrorInfo {
		mu.Lock()
		defer mu.Unlock()
		first := firstValue(pp)
		if want, ok := failing[pp.Partition]; ok {
			if first != want {
				return rerr.ToInfo(rerr.New(runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER, "still failing"))
			}
			delete(failing, pp.Partition) // the retry of the first failed batch: the partition recovers
			return nil
		}
		batches[pp.Partition]++
		if batches[pp.Partition]%7 == 3 && faults < 40 {
			faults++
			failing[pp.Partition] = first
			code := runnelv1.ErrorCode_NOT_ENOUGH_REPLICAS
			if faults%2 == 0 {
				code = runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER
			}
			return rerr.ToInfo(rerr.New(code, "injected"))
		}
		return nil
	}
	p := newProducer(t, px.addr, client.WithBatchBytes(8<<10), client.WithLinger(time.Millisecond), client.WithMaxInFlight(5),
		client.WithRetryBackoff(5*time.Millisecond, 20*time.Millisecond))
	ctx := context.Background()
	ps := newPromises()
	for i := range n {
		p.Produce(ctx, client.NewRecord("retry", keyOf(i), []byte(strconv.Itoa(i))), ps.fn(i))
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ps.check(t, n)
	mu.Lock()
	if faults == 0 {
		t.Fatal("no fault was injected")
	}
	t.Logf("%d faults injected", faults)
	mu.Unlock()
	c := newConsumer(t, addr)
	for i := range int32(parts) {
		c.Assign("retry", i, client.OffsetEarliest())
	}
	checkKeyedOrder(t, consume(t, c, n, 30*time.Second), n, parts, keyOf)
	expectNothing(t, c)
}

// While answers are held back the buffer fills, Produce blocks, and its context ends the wait; once
// answers flow again everything completes.
func TestBufferBackpressure(t *testing.T) {
	addr := startNode(t)
	createTopic(t, addr, "bp", 1, nil)
	px := startProxy(t, addr)
	p := newProducer(t, px.addr, client.WithBatchBytes(8<<10), client.WithMaxBufferedBytes(64<<10), client.WithLinger(time.Hour))
	ctx := context.Background()
	p.Produce(ctx, client.NewRecord("bp", nil, []byte("warm")), nil) // metadata and stream up
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	px.holdAnswers()
	ps := newPromises()
	value := make([]byte, 1000)
	buffered := 0
	var blockedErr error
	for i := 0; blockedErr == nil && i < 1000; i++ {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		failed := make(chan error, 1)
		p.Produce(pctx, client.NewRecord("bp", nil, value), func(_ *client.Record, err error) {
			if err != nil {
				failed <- err
			}
		})
		cancel()
		select {
		case blockedErr = <-failed:
		default:
			buffered++
		}
	}
	if !errors.Is(blockedErr, context.DeadlineExceeded) {
		t.Fatalf("Produce never blocked on the buffer cap (err %v)", blockedErr)
	}
	if buffered < 40 || buffered > 64 {
		t.Fatalf("%d records of 1 KB buffered under a 64 KiB cap", buffered)
	}
	fctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if err := p.Flush(fctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush with answers held: %v", err)
	}
	cancel()
	// More producers block; releasing the answers lets them through. (They race, so no order.)
	ps = newPromises()
	ps.unordered = true
	for i := range 20 {
		go p.Produce(ctx, client.NewRecord("bp", nil, value), ps.fn(i))
	}
	px.release()
	deadline := time.Now().Add(30 * time.Second)
	for ps.finished() < 20 { // the goroutines may not have produced yet when a Flush starts
		if err := p.Flush(ctx); err != nil || time.Now().After(deadline) {
			t.Fatalf("flush %v; %d of 20 finished", err, ps.finished())
		}
		time.Sleep(time.Millisecond)
	}
	ps.check(t, 20)
}

// Answers that never come: the request times out, is retried, and the records fail once the delivery
// timeout has passed.
func TestRequestAndDeliveryTimeout(t *testing.T) {
	addr := startNode(t)
	createTopic(t, addr, "rt", 1, nil)
	px := startProxy(t, addr)
	p := newProducer(t, px.addr, client.WithRequestTimeout(200*time.Millisecond), client.WithDeliveryTimeout(1500*time.Millisecond),
		client.WithRetryBackoff(20*time.Millisecond, 50*time.Millisecond))
	ctx := context.Background()
	if err := p.ProduceSync(ctx, client.NewRecord("rt", nil, []byte("warm"))); err != nil {
		t.Fatal(err)
	}
	px.holdAnswers()
	start := time.Now()
	err := p.ProduceSync(ctx, client.NewRecord("rt", nil, []byte("lost")))
	if !errors.Is(err, rerr.ErrRequestTimedOut) {
		t.Fatalf("err %v, want REQUEST_TIMED_OUT", err)
	}
	if el := time.Since(start); el < 1500*time.Millisecond || el > 15*time.Second {
		t.Fatalf("failed after %v, want about the delivery timeout", el)
	}
	px.release()
	if err := p.ProduceSync(ctx, client.NewRecord("rt", nil, []byte("again"))); err != nil {
		t.Fatalf("after the answers flow again: %v", err)
	}
}

// BenchmarkProduce measures producer throughput of 100-byte values to a local node (acks=1 with three
// codecs, and acks=all, which waits for the fsync), in records per second. Run:
// go test ./client -run '^$' -bench Produce -benchtime 2000000x
func BenchmarkProduce(b *testing.B) {
	for _, tc := range []struct {
		codec batch.Compression
		acks  client.Acks
	}{{batch.CompressionNone, client.AcksLeader}, {batch.CompressionLZ4, client.AcksLeader}, {batch.CompressionZstd, client.AcksLeader},
		{batch.CompressionNone, client.AcksAll}} {
		b.Run(fmt.Sprintf("%s/acks=%s", tc.codec, tc.acks), func(b *testing.B) {
			addr := startNode(b)
			createTopic(b, addr, "bench", 1, nil)
			p := newProducer(b, addr, client.WithAcks(tc.acks), client.WithCompression(tc.codec))
			ctx := context.Background()
			value := bytes.Repeat([]byte("0123456789"), 10)
			ring := newRecordRing(1 << 17)
			b.SetBytes(int64(len(value)))
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				r, promise := ring.next(ctx, p, i)
				*r = client.Record{Topic: "bench", Partition: -1, Value: value}
				p.Produce(ctx, r, promise)
			}
			if err := p.Flush(ctx); err != nil || ring.failed.Load() > 0 {
				b.Fatalf("flush %v, %d failed", err, ring.failed.Load())
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
		})
	}
}

// recordRing reuses produce benchmarks' records round a ring: a slot is taken again only once the
// promise of its previous record ran, so records are neither allocated per send nor overwritten while
// the producer still holds them.
type recordRing struct {
	recs     []client.Record
	done     []atomic.Bool
	promises []func(*client.Record, error)
	failed   atomic.Int64 // promises that reported an error
}

func newRecordRing(n int) *recordRing {
	g := &recordRing{recs: make([]client.Record, n), done: make([]atomic.Bool, n), promises: make([]func(*client.Record, error), n)}
	for i := range g.promises {
		g.done[i].Store(true)
		g.promises[i] = func(_ *client.Record, err error) {
			if err != nil {
				g.failed.Add(1)
			}
			g.done[i].Store(true)
		}
	}
	return g
}

// next returns the record and promise of send i, flushing p first when that slot is still in use.
func (g *recordRing) next(ctx context.Context, p *client.Producer, i int) (*client.Record, func(*client.Record, error)) {
	slot := i % len(g.recs)
	if !g.done[slot].Load() {
		p.Flush(ctx)
	}
	g.done[slot].Store(false)
	return &g.recs[slot], g.promises[slot]
}

// BenchmarkConsume measures consumer throughput of 100-byte records from a local node, in records per
// second (the records are produced first, untimed). Run: go test ./client -run '^$' -bench Consume
func BenchmarkConsume(b *testing.B) {
	addr := startNode(b)
	createTopic(b, addr, "bench", 1, nil)
	p := newProducer(b, addr) // acks=all: the high watermark covers everything once Flush returns
	ctx := context.Background()
	value := bytes.Repeat([]byte("0123456789"), 10)
	const chunk = 1 << 16
	recs := make([]client.Record, chunk)
	for i := 0; i < b.N; i += chunk {
		for j := range min(chunk, b.N-i) {
			recs[j] = client.Record{Topic: "bench", Partition: 0, Value: value}
			p.Produce(ctx, &recs[j], nil)
		}
		if err := p.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	c := newConsumer(b, addr)
	b.SetBytes(int64(len(value)))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	if err := c.Assign("bench", 0, client.OffsetEarliest()); err != nil {
		b.Fatal(err)
	}
	consume(b, c, b.N, time.Minute)
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
}

// With no broker to talk to, records fail within the delivery timeout and nothing is left running.
func TestUnreachableBroker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	p, err := client.NewProducer([]string{addr}, client.WithDeliveryTimeout(500*time.Millisecond),
		client.WithRequestTimeout(200*time.Millisecond), client.WithRetryBackoff(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = p.ProduceSync(context.Background(), client.NewRecord("t", nil, []byte("x")))
	if !errors.Is(err, rerr.ErrLeaderNotAvailable) || time.Since(start) > 10*time.Second {
		t.Fatalf("err %v after %v, want LEADER_NOT_AVAILABLE within the delivery timeout", err, time.Since(start))
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := client.NewConsumer([]string{addr}, client.WithRequestTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Assign("t", 0, client.OffsetEarliest()); !errors.Is(err, rerr.ErrLeaderNotAvailable) {
		t.Fatalf("assign: %v", err)
	}
	c.Close()
	a, err := client.NewAdmin([]string{addr}, client.WithRequestTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.ListTopics(context.Background(), false); !errors.Is(err, rerr.ErrLeaderNotAvailable) {
		t.Fatalf("list topics: %v", err)
	}
	a.Close()
}

// Close does not wait out the delivery timeout of a Produce call stuck waiting for a missing topic.
func TestCloseDuringMetadataWait(t *testing.T) {
	addr := startNode(t)
	p, err := client.NewProducer([]string{addr})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.ProduceSync(context.Background(), client.NewRecord("missing", nil, nil)) }()
	deadline := time.After(5 * time.Second)
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-done:
		if !errors.Is(err, client.ErrClosed) {
			t.Fatalf("produce: %v", err)
		}
	case <-deadline:
		t.Fatal("Close left Produce waiting for metadata")
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

// Close while goroutines produce: every promise runs exactly once, with success or ErrClosed, Close
// returns, and once the producing goroutines have returned every Produce call has had its promise (a
// record appended to a batch behind Close's back would never get one).
func TestCloseWhileProducing(t *testing.T) {
	addr := startNode(t)
	createTopic(t, addr, "cwp", 3, nil)
	p, err := client.NewProducer([]string{addr}, client.WithBatchBytes(4<<10), client.WithMaxBufferedBytes(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	var ok, closed, other, calls, produced atomic.Int64
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				var once, stop atomic.Bool
				produced.Add(1)
				p.Produce(context.Background(), client.NewRecord("cwp", fmt.Appendf(nil, "%d-%d", g, i%5), make([]byte, 200)), func(_ *client.Record, err error) {
					if once.Swap(true) {
						t.Error("promise called twice")
					}
					calls.Add(1)
					switch {
					case err == nil:
						ok.Add(1)
					case errors.Is(err, client.ErrClosed):
						closed.Add(1)
						stop.Store(true)
					default:
						other.Add(1)
					}
				})
				if stop.Load() {
					return
				}
			}
		}()
	}
	deadline := time.Now().Add(30 * time.Second)
	for ok.Load() < 2000 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Calls still in Produce when Close returned fail with ErrClosed before they return, and later ones
	// at once: after the goroutines' last calls return, each Produce call has had its promise.
	wg.Wait()
	if ok.Load() < 2000 || closed.Load() < 4 || other.Load() != 0 {
		t.Fatalf("ok %d closed %d other %d", ok.Load(), closed.Load(), other.Load())
	}
	if calls.Load() != produced.Load() {
		t.Fatalf("%d Produce calls, %d promises: records that never got an outcome", produced.Load(), calls.Load())
	}
}

// On a LogAppendTime topic the broker's append time replaces the producer's, in the promise and on
// consume.
func TestLogAppendTime(t *testing.T) {
	addr := startNode(t)
	createTopic(t, addr, "lat", 1, map[string]string{"message.timestamp.type": "LogAppendTime"})
	p := newProducer(t, addr)
	before := time.Now().Add(-time.Second)
	rs := []*client.Record{client.NewRecord("lat", nil, []byte("a")), client.NewRecord("lat", nil, []byte("b"))}
	rs[0].Timestamp = time.UnixMilli(1000)
	rs[1].Timestamp = time.UnixMilli(2000)
	if err := p.ProduceSync(context.Background(), rs...); err != nil {
		t.Fatal(err)
	}
	if rs[0].Timestamp.Before(before) || !rs[0].Timestamp.Equal(rs[1].Timestamp) {
		t.Fatalf("promise timestamps %v %v, want the append time", rs[0].Timestamp, rs[1].Timestamp)
	}
	c := newConsumer(t, addr)
	c.Assign("lat", 0, client.OffsetEarliest())
	for _, r := range consume(t, c, 2, 10*time.Second) {
		if !r.Timestamp.Equal(rs[0].Timestamp) {
			t.Fatalf("consumed timestamp %v, want %v", r.Timestamp, rs[0].Timestamp)
		}
	}
}

// TestSilentBrokerInBootstrap: a bootstrap address that accepts connections but never answers (a
// paused broker: the kernel completes the TCP handshake, the process says nothing) costs one connection
// attempt, not the whole request timeout: the call goes on to the next address and succeeds.
func TestSilentBrokerInBootstrap(t *testing.T) {
	addr := startNode(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() { // accept and hold every connection, answering nothing
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	adm, err := client.NewAdmin([]string{ln.Addr().String(), addr, ln.Addr().String()}, client.WithRequestTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	for i := range 3 { // whichever address the rotation starts with
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := adm.ListTopics(ctx, false)
		cancel()
		if err != nil {
			t.Fatalf("list topics %d with a silent broker first: %v after %v", i, err, time.Since(start))
		}
		if d := time.Since(start); d > 15*time.Second {
			t.Fatalf("list topics %d took %v: the silent broker held the call", i, d)
		}
	}
}
