package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
)

// Vectors from Kafka's own UtilsTest.testMurmur2: keys must land where the Java client puts them.
func TestMurmur2KafkaVectors(t *testing.T) {
	for key, want := range map[string]int32{
		"21":                         -973932308,
		"foobar":                     -790332482,
		"a-little-bit-long-string":   -985981536,
		"a-little-bit-longer-string": -1486304829,
		"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
		"abc": 479470107,
		"":    275646681,
	} {
		if got := Murmur2([]byte(key)); got != want {
			t.Errorf("Murmur2(%q) = %d, want %d", key, got, want)
		}
	}
	// toPositive(-790332482) = 1357151166; % 50 = 16, as Kafka's BuiltInPartitioner computes.
	if got := KeyPartition([]byte("foobar"), 50); got != 16 {
		t.Errorf("KeyPartition(foobar, 50) = %d, want 16", got)
	}
}

func TestKafkaPartitionerKeyed(t *testing.T) {
	p := NewKafkaPartitioner()
	for i := range 1000 {
		key := fmt.Appendf(nil, "key-%d", i)
		want := int32(uint32(Murmur2(key))&0x7fffffff) % 7
		if got := p.Partition(&Record{Topic: "t", Key: key}, 7); got != want {
			t.Fatalf("key %s: partition %d, want %d", key, got, want)
		}
	}
	// An empty key is a key (hashed), not a missing one: always the same partition.
	empty := KeyPartition([]byte{}, 7)
	for range 20 {
		if got := p.Partition(&Record{Topic: "t", Key: []byte{}}, 7); got != empty {
			t.Fatalf("empty key went to %d and %d", got, empty)
		}
		p.OnBatchSealed("t", empty, 7)
	}
}

// KIP-480: keyless records stick to one partition until its batch is sealed, then move to another;
// sealing another partition's batch changes nothing; each topic has its own sticky partition.
func TestStickyPartitioner(t *testing.T) {
	p := NewKafkaPartitioner()
	r := &Record{Topic: "t"}
	first := p.Partition(r, 5)
	for range 100 {
		if got := p.Partition(r, 5); got != first {
			t.Fatalf("sticky partition moved from %d to %d without a sealed batch", first, got)
		}
	}
	p.OnBatchSealed("t", (first+1)%5, 5)
	if got := p.Partition(r, 5); got != first {
		t.Fatalf("sealing another partition moved the sticky one to %d", got)
	}
	seen := map[int32]bool{first: true}
	cur := first
	for range 200 {
		p.OnBatchSealed("t", cur, 5)
		next := p.Partition(r, 5)
		if next == cur {
			t.Fatalf("sticky partition stayed at %d after its batch was sealed", cur)
		}
		seen[next] = true
		cur = next
	}
	if len(seen) != 5 {
		t.Fatalf("sticky partition visited %v of 5 partitions", seen)
	}
	// One partition: stays, and never goes out of range.
	for range 10 {
		p.OnBatchSealed("one", 0, 1)
		if got := p.Partition(&Record{Topic: "one"}, 1); got != 0 {
			t.Fatalf("partition %d of a one-partition topic", got)
		}
	}
	// A topic that grew keeps a valid sticky partition; concurrent use is safe.
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				n := int32(1 + (i+g)%9)
				if got := p.Partition(&Record{Topic: "g"}, n); got < 0 || got >= n {
					t.Errorf("partition %d of %d", got, n)
					return
				}
				p.OnBatchSealed("g", int32(i%9), n)
			}
		}()
	}
	wg.Wait()
}

func TestOptionValidation(t *testing.T) {
	if _, err := newProducerConfig(nil); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if _, err := newConsumerConfig(nil); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if _, err := newAdminConfig(nil); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cfg, err := newProducerConfig([]ProducerOption{WithAcks(AcksLeader), WithLinger(0), WithBatchBytes(64 << 10),
		WithMaxBufferedBytes(1 << 20), WithMaxRequestBytes(1 << 20), WithCompression(batch.CompressionZstd),
		WithDeliveryTimeout(time.Second), WithMaxInFlight(1), WithClientID("x"), WithRequestTimeout(time.Second),
		WithRetryBackoff(time.Millisecond, time.Second), WithMetadataMaxAge(time.Minute)})
	if err != nil {
		t.Fatalf("valid options refused: %v", err)
	}
	if cfg.acks != AcksLeader || cfg.linger != 0 || cfg.batchBytes != 64<<10 || cfg.compression != batch.CompressionZstd || cfg.common.clientID != "x" {
		t.Fatalf("options not applied: %+v", cfg)
	}
	for _, tc := range []struct {
		opt  ProducerOption
		want string
	}{
		{WithAcks(3), "WithAcks"},
		{WithLinger(-time.Second), "WithLinger"},
		{WithBatchBytes(10), "WithBatchBytes"},
		{WithBatchBytes(100 << 20), "WithBatchBytes"},
		{WithMaxBufferedBytes(1000), "WithMaxBufferedBytes"},
		{WithMaxRequestBytes(65 << 20), "WithMaxRequestBytes"},
		{WithCompression(9), "WithCompression"},
		{WithPartitioner(nil), "WithPartitioner"},
		{WithDeliveryTimeout(0), "WithDeliveryTimeout"},
		{WithMaxInFlight(0), "WithMaxInFlight"},
		{WithRequestTimeout(-1), "WithRequestTimeout"},
		{WithRetryBackoff(time.Second, time.Millisecond), "WithRetryBackoff"},
		{WithMetadataMaxAge(0), "WithMetadataMaxAge"},
		{WithLogger(nil), "WithLogger"},
		{nil, "nil ProducerOption"},
	} {
		_, err := newProducerConfig([]ProducerOption{tc.opt})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v", tc.want, err)
		}
	}
	for _, tc := range []struct {
		opt  ConsumerOption
		want string
	}{
		{WithFetchMaxBytes(0), "WithFetchMaxBytes"},
		{WithFetchMinBytes(-1), "WithFetchMinBytes"},
		{WithFetchMaxWait(2 * time.Minute), "WithFetchMaxWait"},
		{WithPartitionMaxBytes(100 << 20), "WithPartitionMaxBytes"},
		{WithRequestTimeout(0), "WithRequestTimeout"},
	} {
		_, err := newConsumerConfig([]ConsumerOption{tc.opt})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v", tc.want, err)
		}
	}
	if _, err := NewAdmin([]string{"x:1"}, WithRequestTimeout(0)); err == nil {
		t.Error("NewAdmin took a zero request timeout")
	}
	if _, err := NewProducer(nil); err == nil {
		t.Error("NewProducer took no brokers")
	}
}

// TestDefaultProducer: the defaults tools print (bench/peers' report, the CLI's help) are the ones a
// producer without options gets.
func TestDefaultProducer(t *testing.T) {
	cfg, err := newProducerConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	got := DefaultProducer()
	want := ProducerDefaults{Acks: cfg.acks, Linger: cfg.linger, BatchBytes: cfg.batchBytes, MaxBufferedBytes: cfg.maxBuffered,
		MaxRequestBytes: cfg.maxRequestBytes, MaxInFlight: cfg.maxInFlight, DeliveryTimeout: cfg.deliveryTimeout, Idempotence: cfg.idempotence}
	if got != want {
		t.Fatalf("DefaultProducer() = %+v, a producer without options has %+v", got, want)
	}
	if got.MaxBufferedBytes != 32<<20 || got.BatchBytes != 1<<20 || got.MaxInFlight != 5 || got.Acks != AcksAll || !got.Idempotence {
		t.Fatalf("defaults changed: %+v; update docs/benchmarks.md and docs/configuration.md with them", got)
	}
}

func TestOffsetsRecordsErrors(t *testing.T) {
	if (Offset{}) != OffsetEarliest() || OffsetAt(-5) != OffsetEarliest() {
		t.Error("zero or negative offset is not earliest")
	}
	for o, want := range map[Offset]string{OffsetEarliest(): "earliest", OffsetLatest(): "latest", OffsetAt(42): "42",
		OffsetAfterTime(time.UnixMilli(0)): "time 1970-01-01T00:00:00Z"} {
		if o.String() != want {
			t.Errorf("%v.String() = %q", want, o.String())
		}
	}
	if r := NewRecord("t", nil, []byte("v")); r.Partition != -1 || r.Topic != "t" {
		t.Errorf("NewRecord = %+v", r)
	}
	err := error(&PartitionError{Topic: "t", Partition: 3, Err: rerr.New(runnelv1.ErrorCode_OFFSET_OUT_OF_RANGE, "x")})
	if !errors.Is(err, rerr.ErrOffsetOutOfRange) || !strings.Contains(err.Error(), "t-3") {
		t.Errorf("PartitionError %v does not unwrap", err)
	}
	if AcksAll.String() != "all" || AcksLeader.String() != "1" || AcksNone.String() != "0" {
		t.Error("Acks names")
	}
}

func TestRetryPolicy(t *testing.T) {
	cfg := defaultCommon()
	cfg.retryBackoff, cfg.retryBackoffMax, cfg.requestTimeout = 10*time.Millisecond, 80*time.Millisecond, time.Second
	cl, _ := newCluster([]string{"x:1"}, cfg)
	for attempt, want := range []time.Duration{10, 20, 40, 80, 80, 80} {
		want *= time.Millisecond
		for range 20 {
			if d := cl.backoff(attempt); d < want*8/10 || d > want*12/10 {
				t.Fatalf("backoff(%d) = %v, want %v ±20%%", attempt, d, want)
			}
		}
	}
	if !retriable(rerr.New(runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER, "")) || retriable(rerr.ErrMessageTooLarge) ||
		retriable(context.Canceled) || retriable(final{rerr.ErrUnknownTopicOrPartition}) ||
		!retriable(fmt.Errorf("wrapped: %w", rerr.ErrUnknownTopicOrPartition)) {
		t.Error("retriable classification")
	}
	n := 0
	err := cl.retry(context.Background(), func(context.Context) error {
		n++
		if n < 3 {
			return rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "not yet")
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Errorf("retry: %v after %d calls", err, n)
	}
	n = 0
	err = cl.retry(context.Background(), func(context.Context) error { n++; return rerr.ErrMessageTooLarge })
	if n != 1 || !errors.Is(err, rerr.ErrMessageTooLarge) {
		t.Errorf("non-retriable error retried %d times: %v", n, err)
	}
	start := time.Now()
	err = cl.retry(context.Background(), func(context.Context) error { return rerr.ErrLeaderNotAvailable })
	if !errors.Is(err, rerr.ErrLeaderNotAvailable) || time.Since(start) > 3*time.Second {
		t.Errorf("retry did not give up within the request timeout: %v after %v", err, time.Since(start))
	}
}

func TestBufLimiter(t *testing.T) {
	l := bufLimiter{max: 100}
	waits := 0
	if err := l.acquire(context.Background(), 60, func() { waits++ }); err != nil || waits != 0 {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := l.acquire(ctx, 60, func() { waits++ }); !errors.Is(err, context.DeadlineExceeded) || waits != 1 {
		t.Fatalf("acquire over the cap: %v (waits %d)", err, waits)
	}
	got := make(chan error)
	go func() { got <- l.acquire(context.Background(), 60, func() {}) }()
	select {
	case err := <-got:
		t.Fatalf("acquire returned %v while the cap is reached", err)
	case <-time.After(10 * time.Millisecond):
	}
	l.release(60)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("release did not wake the waiter")
	}
	if l.used.Load() != 60 {
		t.Fatalf("used %d", l.used.Load())
	}
}

func buildBatch(t *testing.T, base int64, c batch.Compression, values ...string) []byte {
	t.Helper()
	var b batch.Builder
	for i, v := range values {
		b.Append(int64(1000+i), nil, []byte(v), []Header{{Key: "h", Value: []byte(v)}})
	}
	raw := append([]byte(nil), b.Build(c)...)
	batch.SetBaseOffset(raw, base)
	return raw
}

func TestDecodeFetched(t *testing.T) {
	b1 := buildBatch(t, 10, batch.CompressionNone, "a", "b", "c")
	b2 := buildBatch(t, 13, batch.CompressionLZ4, "d", "e")
	all := append(append([]byte(nil), b1...), b2...)

	// Records below the fetch offset share its batch and are skipped.
	recs, next, err := decodeFetched(all, "t", 2, 11, nil)
	if err != nil || next != 15 || len(recs) != 4 || recs[0].Offset != 11 || string(recs[0].Value) != "b" ||
		recs[3].Offset != 14 || recs[3].Partition != 2 || recs[3].Topic != "t" || string(recs[3].Headers[0].Value) != "e" ||
		!recs[0].Timestamp.Equal(time.UnixMilli(1001)) {
		t.Fatalf("decode: %v next %d err %v", recs, next, err)
	}
	// A trailing batch cut short is left for the next fetch.
	recs, next, err = decodeFetched(all[:len(all)-5], "t", 2, 10, nil)
	if err != nil || next != 13 || len(recs) != 3 {
		t.Fatalf("truncated tail: %d records next %d err %v", len(recs), next, err)
	}
	// Damage in the middle: the records before it come back with the error.
	bad := append([]byte(nil), all...)
	bad[len(b1)+len(b2)-1] ^= 0xff
	recs, next, err = decodeFetched(bad, "t", 2, 10, nil)
	if !errors.Is(err, rerr.ErrCorruptMessage) || next != 13 || len(recs) != 3 {
		t.Fatalf("damaged batch: %d records next %d err %v", len(recs), next, err)
	}
	// Bytes after the last record of a compressed batch (the broker cannot see them): every record
	// decodes, so all come back and nothing stops the partition.
	plain := buildBatch(t, 20, batch.CompressionNone, "p", "q", "r")
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	packed := enc.EncodeAll(append(append([]byte(nil), plain[batch.HeaderSize:]...), 0, 0, 0), nil)
	enc.Close()
	surplus := append(append([]byte(nil), plain[:batch.HeaderSize]...), packed...)
	surplus[22] = surplus[22]&^batch.AttrCompressionMask | byte(batch.CompressionZstd)
	binary.BigEndian.PutUint32(surplus[8:], uint32(len(surplus)-12))
	putCRC(surplus)
	recs, next, err = decodeFetched(surplus, "t", 2, 20, nil)
	if err != nil || next != 23 || len(recs) != 3 || string(recs[2].Value) != "r" {
		t.Fatalf("surplus bytes after the last record: %d records next %d err %v", len(recs), next, err)
	}
	// A control batch advances the position but yields no record.
	ctl := buildBatch(t, 15, batch.CompressionNone, "marker")
	ctl[22] |= batch.AttrControl
	putCRC(ctl)
	recs, next, err = decodeFetched(ctl, "t", 2, 15, nil)
	if err != nil || next != 16 || len(recs) != 0 {
		t.Fatalf("control batch: %v next %d err %v", recs, next, err)
	}
}

func putCRC(b []byte) {
	c := batch.Checksum(b)
	b[17], b[18], b[19], b[20] = byte(c>>24), byte(c>>16), byte(c>>8), byte(c)
}

// TestFetcherInterruptCancelsOnlyThatPartitionsFetches: a Seek, Assign or Unassign of one partition
// cancels the fetches in flight that carry it, not the others (a group member assigned partitions
// one by one threw away every answer on its way for each), except that when none carries it and
// every slot is taken the oldest fetch is cancelled so the partition gets one (not after an Unassign,
// which needs none).
func TestFetcherInterruptCancelsOnlyThatPartitionsFetches(t *testing.T) {
	f := &fetcher{wakeCh: make(chan struct{}, 1), slots: make(chan struct{}, maxFetchesInFlight)}
	cancelled := map[string]bool{}
	call := func(name string, started time.Time, parts ...tp) *fetchCall {
		fc := &fetchCall{started: started, cancel: func() { cancelled[name] = true }}
		for _, k := range parts {
			fc.items = append(fc.items, fetchItem{p: &cpart{tp: k}})
		}
		return fc
	}
	now := time.Now()
	a, b, c := tp{"t", 0}, tp{"t", 1}, tp{"t", 2}
	ca, cb := call("a", now, a, c), call("b", now.Add(-time.Second), b)
	f.calls = map[*fetchCall]struct{}{ca: {}, cb: {}}
	f.slots <- struct{}{}
	f.slots <- struct{}{}
	f.interrupt(c, true)
	if !cancelled["a"] || !ca.interrupted || cancelled["b"] || cb.interrupted {
		t.Errorf("interrupt of %v with free slots: cancelled %v (a interrupted %v, b %v), want only a's fetch", c, cancelled, ca.interrupted, cb.interrupted)
	}
	if len(f.wakeCh) != 1 {
		t.Errorf("interrupt did not wake the fetcher")
	}

	// Every slot taken (one by a fetch not registered yet: the slot counts, not the calls).
	full := func() []*fetchCall {
		clear(cancelled)
		select {
		case <-f.wakeCh:
		default:
		}
		f.calls = map[*fetchCall]struct{}{}
		var calls []*fetchCall
		for i := range maxFetchesInFlight - 1 {
			cl := call(fmt.Sprint(i), now.Add(time.Duration(i)*time.Second), b, tp{"t", int32(10 + i)})
			calls = append(calls, cl)
			f.calls[cl] = struct{}{}
		}
		for len(f.slots) < cap(f.slots) {
			f.slots <- struct{}{}
		}
		return calls
	}
	calls := full()
	f.interrupt(a, true) // in none of them
	if len(cancelled) != 1 || !cancelled["0"] || !calls[0].interrupted {
		t.Errorf("interrupt of %v with every slot taken by other partitions: cancelled %v, want only the oldest (0)", a, cancelled)
	}
	if len(f.wakeCh) != 1 {
		t.Errorf("interrupt did not wake the fetcher")
	}
	full()
	f.interrupt(tp{"t", 11}, true) // carried by fetch 1: cancelling it frees a slot
	if len(cancelled) != 1 || !cancelled["1"] {
		t.Errorf("interrupt of a partition one fetch carries, every slot taken: cancelled %v, want only that fetch (1)", cancelled)
	}
	full()
	f.interrupt(a, false) // an Unassign: no slot needed
	if len(cancelled) != 0 {
		t.Errorf("interrupt after an Unassign of a partition no fetch carries: cancelled %v, want none", cancelled)
	}
}
