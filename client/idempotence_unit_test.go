package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
)

// Unit tests of the idempotent producer's client side, without a broker: the producer's sink is driven
// by hand (collect takes what would be sent, batchResult plays the broker's answers). Nothing here
// starts a goroutine.

func TestIdempotenceOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []ProducerOption
		want bool   // idempotence after resolving
		err  string // NewProducer's error, if any
	}{
		{"default", nil, true, ""},
		{"explicit on", []ProducerOption{WithIdempotence(true)}, true, ""},
		{"explicit off", []ProducerOption{WithIdempotence(false)}, false, ""},
		{"acks=all explicit", []ProducerOption{WithAcks(AcksAll)}, true, ""},
		// Kafka 3.x: acks other than all switch implicit idempotence off...
		{"acks=1 implicit", []ProducerOption{WithAcks(AcksLeader)}, false, ""},
		{"acks=0 implicit", []ProducerOption{WithAcks(AcksNone)}, false, ""},
		{"acks=1 off", []ProducerOption{WithAcks(AcksLeader), WithIdempotence(false)}, false, ""},
		// ...and refuse explicit idempotence, whatever the order of the options.
		{"acks=1 on", []ProducerOption{WithAcks(AcksLeader), WithIdempotence(true)}, false, "WithIdempotence(true): needs WithAcks(AcksAll), not acks=1"},
		{"on acks=0", []ProducerOption{WithIdempotence(true), WithAcks(AcksNone)}, false, "WithIdempotence(true): needs WithAcks(AcksAll), not acks=0"},
	} {
		cfg, err := newProducerConfig(tc.opts)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err %v, want %q", tc.name, err, tc.err)
			}
			if _, err := NewProducer([]string{"127.0.0.1:1"}, tc.opts...); err == nil {
				t.Errorf("%s: NewProducer accepted it", tc.name)
			}
			continue
		}
		if err != nil || cfg.idempotence != tc.want {
			t.Errorf("%s: idempotence %v (err %v), want %v", tc.name, cfg.idempotence, err, tc.want)
		}
	}
	// ProducerID is -1 before InitProducerId, and for good without idempotence.
	for _, opts := range [][]ProducerOption{nil, {WithIdempotence(false)}, {WithAcks(AcksLeader)}} {
		p, err := NewProducer([]string{"127.0.0.1:1"}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if id, epoch := p.ProducerID(); id != -1 || epoch != -1 {
			t.Errorf("ProducerID() = %d, %d before any batch", id, epoch)
		}
		if got := p.ident.Load() == noIdentity; got != (len(opts) > 0) {
			t.Errorf("options %d: non-idempotent %v", len(opts), got)
		}
		p.Close()
	}
}

// idemHarness is a Producer with one partition whose sink is driven by hand.
type idemHarness struct {
	t  *testing.T
	p  *Producer
	pp *ppart
	s  *sink

	mu      sync.Mutex
	results map[string]error // record value → promise error
	offsets map[string]int64
}

func newIdemHarness(t *testing.T, opts ...ProducerOption) *idemHarness {
	t.Helper()
	cfg, err := newProducerConfig(append([]ProducerOption{WithRetryBackoff(time.Millisecond, time.Millisecond)}, opts...))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := newCluster([]string{"127.0.0.1:1"}, cfg.common)
	if err != nil {
		t.Fatal(err)
	}
	p := &Producer{cfg: cfg, cl: cl, acks: runnelv1.Acks_ACKS_ALL, sinks: map[int32]*sink{}, metaWake: make(chan struct{}, 1), drained: make(chan struct{})}
	p.buf.max = cfg.maxBuffered
	p.ctx, p.cancel = context.WithCancel(context.Background())
	t.Cleanup(func() {
		p.cancel()
		p.wg.Wait()
		p.cl.close()
	})
	if !cfg.idempotence {
		p.ident.Store(noIdentity)
	}
	s := &sink{p: p, node: -1, wakeCh: make(chan struct{}, 1), inflight: map[int64]*request{}}
	pp := &ppart{topic: "t", id: 0, leader: -1, sink: s} // leader -1: never moved to a real sink
	p.topics.Store(&map[string]*ptopic{})
	p.allParts.Store(&[]*ppart{pp})
	return &idemHarness{t: t, p: p, pp: pp, s: s, results: map[string]error{}, offsets: map[string]int64{}}
}

// seal adds a sealed batch of the given record values to the partition's queue.
func (h *idemHarness) seal(values ...string) *pbatch {
	h.t.Helper()
	h.pp.mu.Lock()
	defer h.pp.mu.Unlock()
	b := h.p.newBatch(h.pp)
	for _, v := range values {
		r := &Record{Topic: "t", Partition: 0, Value: []byte(v)}
		b.bld.Append(1000, nil, r.Value, nil)
		b.recs = append(b.recs, pending{r: r, fn: func(r *Record, err error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.results[string(r.Value)] = err
			h.offsets[string(r.Value)] = r.Offset
		}})
		h.p.outstanding.Add(1)
	}
	h.pp.cur = b
	h.pp.sealLocked(h.p)
	return b
}

// send collects until nothing more is taken twice in a row (a collect that fails batches wakes the
// sink for another) and returns the batches "sent", in order.
func (h *idemHarness) send() []*pbatch {
	var out []*pbatch
	for idle := 0; idle < 2; {
		req, _, _ := h.s.collect(time.Now(), 0, false)
		if req == nil {
			idle++
			continue
		}
		idle = 0
		out = append(out, req.batches...)
	}
	return out
}

func (h *idemHarness) header(b *pbatch) batch.Header {
	h.t.Helper()
	hd, err := batch.Validate(b.wire)
	if err != nil {
		h.t.Fatal(err)
	}
	return hd
}

func (h *idemHarness) result(v string) (error, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	err, ok := h.results[v]
	return err, ok
}

func setIdent(p *Producer, id int64, epoch int16) *producerIdentity {
	pi := &producerIdentity{id: id, epoch: epoch}
	p.ident.Store(pi)
	return pi
}

// Base sequences are given at seal time in order, advance by the record count, wrap after MaxInt32,
// start at 0 under a new producer id, and wait for the id when sealed before it is known.
func TestSequenceAssignment(t *testing.T) {
	h := newIdemHarness(t)
	// Sealed before InitProducerId answered: not built, nothing sent.
	b0 := h.seal("a", "b", "c")
	if b0.wire != nil || b0.ident != nil {
		t.Fatal("a batch was built without a producer id")
	}
	h.p.identMu.Lock()
	h.p.identBusy = true // as if InitProducerId were under way (there is no broker to ask)
	h.p.identMu.Unlock()
	if got := h.send(); len(got) != 0 {
		t.Fatalf("%d batches sent without a producer id", len(got))
	}
	x := setIdent(h.p, 42, 3)
	if id, epoch := h.p.ProducerID(); id != 42 || epoch != 3 {
		t.Fatalf("ProducerID() = %d, %d", id, epoch)
	}
	b1 := h.seal("d", "e") // builds the waiting batch first, then itself
	if b0.wire == nil || b1.wire == nil {
		t.Fatal("batches not built once the producer id is known")
	}
	for _, tc := range []struct {
		b    *pbatch
		want int32
	}{{b0, 0}, {b1, 3}} {
		hd := h.header(tc.b)
		if hd.ProducerID != 42 || hd.ProducerEpoch != 3 || hd.BaseSequence != tc.want || tc.b.baseSeq != tc.want || tc.b.ident != x {
			t.Fatalf("header %+v, batch seq %d, want sequence %d", hd, tc.b.baseSeq, tc.want)
		}
	}
	// Wrapping: the sequence after MaxInt32 is 0.
	h.pp.mu.Lock()
	h.pp.nextSequence = math.MaxInt32 - 1
	h.pp.mu.Unlock()
	b2 := h.seal("f", "g", "h")
	b3 := h.seal("i")
	if s2, s3 := h.header(b2).BaseSequence, h.header(b3).BaseSequence; s2 != math.MaxInt32-1 || s3 != 1 {
		t.Fatalf("sequences %d, %d around the wrap, want %d, 1", s2, s3, int32(math.MaxInt32-1))
	}
	// A new producer id starts the partition again at 0.
	setIdent(h.p, 43, 0)
	b4 := h.seal("j")
	if hd := h.header(b4); hd.ProducerID != 43 || hd.BaseSequence != 0 {
		t.Fatalf("under a new id: %+v", hd)
	}
	// Without idempotence the header says -1.
	h2 := newIdemHarness(t, WithIdempotence(false))
	if hd := h2.header(h2.seal("a")); hd.ProducerID != -1 || hd.ProducerEpoch != -1 || hd.BaseSequence != -1 {
		t.Fatalf("non-idempotent header %+v", hd)
	}
}

// An idempotent partition has at most 5 batches in flight, all under one producer id; a
// non-idempotent one is bounded by the request slots only.
func TestIdempotentInFlightCap(t *testing.T) {
	h := newIdemHarness(t)
	x := setIdent(h.p, 1, 0)
	for i := range 8 {
		h.seal(fmt.Sprint(i))
	}
	sent := h.send()
	if len(sent) != maxIdempotentInFlight || h.pp.inflight != maxIdempotentInFlight {
		t.Fatalf("%d batches in flight (%d sent), want %d", h.pp.inflight, len(sent), maxIdempotentInFlight)
	}
	h.p.batchResult(h.pp, sent[0], true, 0, -1, nil)
	if more := h.send(); len(more) != 1 {
		t.Fatalf("%d sent after an answer, want 1", len(more))
	}
	// Batches of a newer producer id wait until the older id's batches are all answered.
	for _, b := range sent[1:] {
		h.p.batchResult(h.pp, b, true, 0, -1, nil)
	}
	setIdent(h.p, 2, 0)
	h.seal("new") // queued behind the two remaining batches of x
	if more := h.send(); len(more) != 2 || more[0].ident != x || more[1].ident != x {
		t.Fatalf("sent %d batches, want the 2 remaining of the old id", len(more))
	}
	if more := h.send(); len(more) != 0 {
		t.Fatal("a batch of a new producer id was sent while batches of the old one are in flight")
	}

	h2 := newIdemHarness(t, WithIdempotence(false), WithMaxInFlight(8))
	for i := range 8 {
		h2.seal(fmt.Sprint(i))
	}
	if sent := h2.send(); len(sent) != 8 {
		t.Fatalf("non-idempotent: %d in flight, want 8", len(sent))
	}
}

// A retriable error re-sends the same bytes, in order; an out-of-order answer behind a batch that is
// being retried is retried too; a duplicate counts as written.
func TestIdempotentRetryKeepsSequence(t *testing.T) {
	h := newIdemHarness(t)
	x := setIdent(h.p, 7, 0)
	h.seal("a", "b")
	h.seal("c")
	h.seal("d")
	sent := h.send()
	if len(sent) != 3 {
		t.Fatalf("sent %d", len(sent))
	}
	wires := make([][]byte, len(sent))
	for i, b := range sent {
		wires[i] = bytes.Clone(b.wire)
	}
	h.p.batchResult(h.pp, sent[0], true, -1, -1, rerr.New(runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER, "moved"))
	h.p.batchResult(h.pp, sent[1], true, -1, -1, rerr.New(runnelv1.ErrorCode_OUT_OF_ORDER_SEQUENCE_NUMBER, "expected 0"))
	h.p.batchResult(h.pp, sent[2], true, -1, -1, rerr.New(runnelv1.ErrorCode_OUT_OF_ORDER_SEQUENCE_NUMBER, "expected 0"))
	if len(h.pp.breaks) != 0 || h.p.ident.Load() != x {
		t.Fatal("out-of-order answers behind a retried batch broke the sequence")
	}
	time.Sleep(5 * time.Millisecond) // the retry backoff (1ms)
	again := h.send()
	if len(again) != 3 {
		t.Fatalf("re-sent %d batches, want 3", len(again))
	}
	for i, b := range again {
		if b != sent[i] || !bytes.Equal(b.wire, wires[i]) {
			t.Fatalf("retry %d is not the same batch with the same bytes", i)
		}
	}
	h.p.batchResult(h.pp, again[0], true, 10, -1, nil)
	h.p.batchResult(h.pp, again[1], true, -1, -1, rerr.New(runnelv1.ErrorCode_DUPLICATE_SEQUENCE_NUMBER, "dup"))
	h.p.batchResult(h.pp, again[2], true, 13, -1, nil)
	for v, want := range map[string]int64{"a": 10, "b": 11, "c": -1, "d": 13} {
		if err, ok := h.result(v); !ok || err != nil {
			t.Fatalf("record %s: done %v, err %v", v, ok, err)
		}
		if h.offsets[v] != want {
			t.Fatalf("record %s at offset %d, want %d", v, h.offsets[v], want)
		}
	}
}

// A sequence error fails the batch and the partition's later batches of its producer id (in flight
// and queued) with the error wrapped, resets the producer id, and the partition starts again at 0
// under the next one.
func TestSequenceErrorFailsRestOfPartition(t *testing.T) {
	for _, code := range []runnelv1.ErrorCode{runnelv1.ErrorCode_OUT_OF_ORDER_SEQUENCE_NUMBER,
		runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH, runnelv1.ErrorCode_UNKNOWN_PRODUCER_ID} {
		t.Run(code.String(), func(t *testing.T) {
			h := newIdemHarness(t)
			setIdent(h.p, 7, 0)
			for _, v := range []string{"a", "b", "c", "d", "e", "f", "g"} {
				h.seal(v)
			}
			sent := h.send() // a..e in flight, f and g queued
			if len(sent) != 5 {
				t.Fatalf("sent %d", len(sent))
			}
			h.p.batchResult(h.pp, sent[0], true, 0, -1, nil)
			h.p.batchResult(h.pp, sent[1], true, -1, -1, rerr.New(code, "refused"))
			if id, _ := h.p.ProducerID(); id != -1 {
				t.Fatalf("producer id %d kept after a sequence error", id)
			}
			// The later in-flight batches come back refused too (or with anything else).
			h.p.batchResult(h.pp, sent[2], true, -1, -1, rerr.New(runnelv1.ErrorCode_OUT_OF_ORDER_SEQUENCE_NUMBER, "gap"))
			h.p.batchResult(h.pp, sent[3], true, -1, -1, rerr.New(runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER, "moved"))
			h.p.batchResult(h.pp, sent[4], true, -1, -1, rerr.New(runnelv1.ErrorCode_OUT_OF_ORDER_SEQUENCE_NUMBER, "gap"))
			// The queued ones fail without being sent.
			if more := h.send(); len(more) != 0 {
				t.Fatalf("%d doomed batches sent", len(more))
			}
			sentinel := &rerr.Error{Code: code}
			if err, _ := h.result("a"); err != nil {
				t.Fatalf("a: %v", err)
			}
			if err, ok := h.result("b"); !ok || !errors.Is(err, sentinel) || strings.Contains(err.Error(), "earlier batch") {
				t.Fatalf("b: %v", err)
			}
			for _, v := range []string{"c", "d", "e", "f", "g"} {
				err, ok := h.result(v)
				if !ok || !errors.Is(err, sentinel) || !strings.Contains(err.Error(), "after an earlier batch failed") {
					t.Fatalf("%s: done %v, err %v", v, ok, err)
				}
				if retriable(err) {
					t.Fatalf("%s: retriable %v", v, err)
				}
			}
			if n := h.p.outstanding.Load(); n != 0 {
				t.Fatalf("%d records outstanding", n)
			}
			if len(h.pp.breaks) != 0 {
				t.Fatalf("%d sequence breaks kept after every batch of the id finished", len(h.pp.breaks))
			}
			// The partition goes on under the next producer id, from sequence 0.
			setIdent(h.p, 8, 0)
			b := h.seal("h")
			if hd := h.header(b); hd.ProducerID != 8 || hd.BaseSequence != 0 {
				t.Fatalf("after the reset: %+v", hd)
			}
			if more := h.send(); len(more) != 1 {
				t.Fatalf("sent %d after the reset", len(more))
			}
			h.p.batchResult(h.pp, b, true, 20, -1, nil)
			if err, ok := h.result("h"); !ok || err != nil {
				t.Fatalf("h: %v", err)
			}
		})
	}
}

// A numbered batch that expires unsent leaves a gap: the partition's later batches of its id fail, and
// the id is reset. An open batch that expires was never numbered and breaks nothing.
func TestExpiredNumberedBatchBreaksSequence(t *testing.T) {
	h := newIdemHarness(t, WithDeliveryTimeout(time.Hour))
	x := setIdent(h.p, 9, 0)
	h.seal("a")
	h.seal("b")
	h.pp.mu.Lock()
	h.pp.queue[0].deadline = time.Now().Add(-time.Second) // "a" expired in the queue
	h.pp.mu.Unlock()
	if sent := h.send(); len(sent) != 0 {
		t.Fatalf("sent %d", len(sent))
	}
	if err, ok := h.result("a"); !ok || !errors.Is(err, rerr.ErrRequestTimedOut) {
		t.Fatalf("a: %v", err)
	}
	if err, ok := h.result("b"); !ok || !errors.Is(err, rerr.ErrRequestTimedOut) || !strings.Contains(err.Error(), "after an earlier batch failed") {
		t.Fatalf("b: %v", err)
	}
	if h.p.ident.Load() != nil {
		t.Fatal("producer id kept after a gap")
	}

	// An open batch that expires is not numbered: nothing breaks.
	h.p.ident.Store(x)
	h.pp.mu.Lock()
	c := h.p.newBatch(h.pp)
	c.bld.Append(1, nil, []byte("c"), nil)
	c.recs = append(c.recs, pending{r: &Record{Value: []byte("c")}, fn: func(*Record, error) {}})
	h.p.outstanding.Add(1)
	c.deadline = time.Now().Add(-time.Second)
	h.pp.cur = c
	next := h.pp.nextSequence
	h.pp.mu.Unlock()
	h.send()
	if h.p.ident.Load() != x || h.pp.nextSequence != next || len(h.pp.breaks) != 0 {
		t.Fatal("an expired open batch broke the sequence")
	}
}

// A non-retriable InitProducerId failure fails the batches waiting for the id, open ones included.
func TestFailUnbuilt(t *testing.T) {
	h := newIdemHarness(t)
	h.seal("a")
	h.seal("b")
	h.seal("c")
	h.pp.mu.Lock()
	h.pp.cur, h.pp.queue = h.pp.queue[2], h.pp.queue[:2] // "c" is still open
	h.pp.mu.Unlock()
	h.p.failUnbuilt(rerr.New(runnelv1.ErrorCode_UNSUPPORTED_VERSION, "no idempotence here"))
	for _, v := range []string{"a", "b", "c"} {
		if err, ok := h.result(v); !ok || !errors.Is(err, rerr.ErrUnsupportedVersion) {
			t.Fatalf("%s: %v", v, err)
		}
	}
	if len(h.pp.queue) != 0 || h.pp.cur != nil || h.p.outstanding.Load() != 0 {
		t.Fatal("batches left behind")
	}
}
