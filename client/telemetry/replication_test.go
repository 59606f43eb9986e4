package telemetry

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
)

// stored returns records as the leader's log holds them after the append: batches from base on,
// stamped with consecutive base offsets and the leader epoch, and with LogAppendTime when logTime >= 0.
func stored(records []byte, base int64, logTime int64) []byte {
	out := bytes.Clone(records)
	for rest := out; len(rest) > 0; {
		h, err := batch.ParseHeader(rest)
		if err != nil {
			panic(err)
		}
		b := rest[:h.Size()]
		batch.SetBaseOffset(b, base)
		batch.SetPartitionLeaderEpoch(b, 3)
		if logTime >= 0 {
			batch.SetLogAppendTime(b, logTime)
		}
		base += int64(h.LastOffsetDelta) + 1
		rest = rest[h.Size():]
	}
	return out
}

func oneBatch(v string, n int) []byte {
	var bb batch.Builder
	for i := 0; i < n; i++ {
		bb.Append(1000, nil, []byte(v), nil)
	}
	return bytes.Clone(bb.Build(batch.CompressionNone))
}

// tracedRequest returns a produce partition of records continuing a producer span of tp.
func tracedRequest(tp trace.TracerProvider, records []byte) (*runnelv1.ProducePartition, trace.Span) {
	_, send := tp.Tracer("test").Start(context.Background(), "send")
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpan(context.Background(), send), carrier)
	return &runnelv1.ProducePartition{Topic: "orders", Partition: 2, Records: records, TraceContext: carrier}, send
}

// TestReplicaTraces: the leader finds a traced append's batches in a follower's answer, before the
// append has completed (the store makes batches readable before it reports the append done), also
// with LogAppendTime stamped; untraced batches get nothing; a failed append is forgotten, and with it
// the partition's ring; a broker without tracing, or nil, answers nil.
func TestReplicaTraces(t *testing.T) {
	b, _, exp, tp := testBroker(t)
	traced := append(oneBatch("a", 2), oneBatch("b", 3)...)
	pp, send := tracedRequest(tp, traced)
	a := b.StartAppend(context.Background(), pp)
	plain := oneBatch("c", 1)
	b.StartAppend(context.Background(), &runnelv1.ProducePartition{Topic: "orders", Partition: 2, Records: plain}).Done(0, nil)

	// The log: the untraced batch at 0, the traced ones at 1 and 3.
	log := append(stored(plain, 0, -1), stored(traced, 1, -1)...)
	got := b.ReplicaTraces("orders", 2, log)
	if len(got) != 2 || got[0].BaseOffset != 1 || got[1].BaseOffset != 3 {
		t.Fatalf("traces %v, want the batches at 1 and 3", got)
	}
	a.Done(1, nil)
	spans := exp.GetSpans()
	if len(spans) != 1 || spans[0].Name != "append orders" {
		t.Fatalf("spans %v", spans)
	}
	app := spans[0].SpanContext
	for _, tr := range got {
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(tr.TraceContext)))
		if sc.SpanID() != app.SpanID() || sc.TraceID() != send.SpanContext().TraceID() {
			t.Fatalf("batch %d carries %v, want the append span %v", tr.BaseOffset, sc, app)
		}
	}
	if got := b.ReplicaTraces("orders", 2, stored(traced, 1, -1)[:len(oneBatch("a", 2))]); len(got) != 1 || got[0].BaseOffset != 1 {
		t.Fatalf("one batch of the answer: %v", got)
	}
	// Pinned at offset 1: the same bytes at another offset are another batch.
	if got := b.ReplicaTraces("orders", 2, stored(traced, 40, -1)); len(got) != 0 {
		t.Fatalf("the traced batches at other offsets: %v", got)
	}
	if got := b.ReplicaTraces("orders", 1, log); got != nil {
		t.Fatalf("another partition: %v", got)
	}

	// LogAppendTime rewrites the CRC; a failed append is forgotten, ring and all.
	pp2, _ := tracedRequest(tp, oneBatch("d", 1))
	a2 := b.StartAppend(context.Background(), &runnelv1.ProducePartition{Topic: "logtime", Partition: 0, Records: pp2.Records, TraceContext: pp2.TraceContext})
	if got := b.ReplicaTraces("logtime", 0, stored(pp2.Records, 7, 123456)); len(got) != 1 || got[0].BaseOffset != 7 {
		t.Fatalf("with LogAppendTime: %v", got)
	}
	a2.Done(-1, errors.New("timed out"))
	if _, ok := b.rings.Load(partKey{"logtime", 0}); ok {
		t.Fatal("the ring of a partition whose only traced append failed is still there")
	}
	b.ForgetTopic("orders")
	if got := b.ReplicaTraces("orders", 2, log); got != nil {
		t.Fatalf("after ForgetTopic: %v", got)
	}

	off, err := NewBroker()
	if err != nil {
		t.Fatal(err)
	}
	pp3, _ := tracedRequest(tp, oneBatch("e", 1))
	off.StartAppend(context.Background(), pp3).Done(0, nil)
	if got := off.ReplicaTraces("orders", 2, stored(pp3.Records, 0, -1)); got != nil {
		t.Fatalf("tracing off: %v", got)
	}
	var nilB *Broker
	if nilB.ReplicaTraces("orders", 2, log) != nil || nilB.StartReplicate("orders", 2, 1, 2, got, log) != nil {
		t.Fatal("a nil Broker traces")
	}
}

// fakeLog is a DurableLog whose durable end a test moves.
type fakeLog struct {
	mu      sync.Mutex
	durable int64
	ch      chan struct{}
}

func newFakeLog(durable int64) *fakeLog { return &fakeLog{durable: durable, ch: make(chan struct{})} }

func (l *fakeLog) DurableEnd() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.durable
}

func (l *fakeLog) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ch
}

func (l *fakeLog) advance(to int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.durable = to
	close(l.ch)
	l.ch = make(chan struct{})
}

// TestStartReplicate: the follower starts one replicate span per traced batch it appends, the child
// of the leader's append span, and ends each when the log's durable end passes its batch; spans still
// waiting when the broker stops end with an error, and a failed append ends them with its error.
func TestStartReplicate(t *testing.T) {
	leader, _, _, ltp := testBroker(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	f, err := NewBroker(WithTracerProvider(tp), WithPropagator(propagation.TraceContext{}))
	if err != nil {
		t.Fatal(err)
	}

	traced := append(oneBatch("a", 2), oneBatch("b", 3)...)
	pp, _ := tracedRequest(ltp, traced)
	a := leader.StartAppend(context.Background(), pp)
	log := append(stored(oneBatch("c", 1), 0, -1), stored(traced, 1, -1)...)
	traces := leader.ReplicaTraces("orders", 2, log)
	a.Done(1, nil)
	appendSC := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(traces[0].TraceContext)))

	// The follower had offset 0 already: it appends the batches at 1 and 3, durable in two steps.
	rs := f.StartReplicate("orders", 2, 1, 2, traces, log[len(stored(oneBatch("c", 1), 0, -1)):])
	fl := newFakeLog(1)
	if rs.Appended(fl, nil) {
		t.Fatal("Appended reports everything durable at durable end 1")
	}
	done := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(done)
		rs.Durable(stop, fl)
	}()
	fl.advance(3) // the first batch [1, 3)
	waitUntil(t, func() bool { return len(exp.GetSpans()) == 1 })
	fl.advance(6)
	<-done
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	for i, s := range spans {
		if s.Name != "replicate orders" || s.SpanKind != trace.SpanKindConsumer || s.Parent.SpanID() != appendSC.SpanID() ||
			s.SpanContext.TraceID() != appendSC.TraceID() || !s.Parent.IsRemote() {
			t.Fatalf("span %d: %s/%v parent %v, want a child of the append span %v", i, s.Name, s.SpanKind, s.Parent, appendSC)
		}
		if s.Status.Code != codes.Unset || len(s.Events) != 1 || s.Events[0].Name != "durable" {
			t.Fatalf("span %d: status %v events %v", i, s.Status, s.Events)
		}
		if got := attrOf(s, AttrBaseOffset).AsInt64(); got != []int64{1, 3}[i] {
			t.Fatalf("span %d base offset %d", i, got)
		}
		if attrOf(s, AttrLeader).AsInt64() != 1 || attrOf(s, AttrFollower).AsInt64() != 2 {
			t.Fatalf("span %d attributes %v", i, s.Attributes)
		}
	}

	// Already durable: ended by Appended. The broker stopping: ended with an error. A failed append:
	// ended with its error.
	exp.Reset()
	if rs := f.StartReplicate("orders", 2, 1, 2, traces, log[len(stored(oneBatch("c", 1), 0, -1)):]); !rs.Appended(newFakeLog(6), nil) {
		t.Fatal("not all durable at durable end 6")
	}
	rs = f.StartReplicate("orders", 2, 1, 2, traces, log[len(stored(oneBatch("c", 1), 0, -1)):])
	if rs.Appended(newFakeLog(0), nil) {
		t.Fatal("durable at 0")
	}
	close(stop)
	rs.Durable(stop, newFakeLog(0))
	rs = f.StartReplicate("orders", 2, 1, 2, traces, log[len(stored(oneBatch("c", 1), 0, -1)):])
	rs.Appended(newFakeLog(0), errors.New("offset mismatch"))
	spans = exp.GetSpans()
	if len(spans) != 6 {
		t.Fatalf("%d spans", len(spans))
	}
	for i, s := range spans {
		if failed := i >= 2; (s.Status.Code == codes.Error) != failed {
			t.Fatalf("span %d status %v", i, s.Status)
		}
	}

	// Nothing traced in the answer, or a broker without tracing: nil, and a nil Replicate is a no-op.
	if rs := f.StartReplicate("orders", 2, 1, 2, nil, log); rs != nil || !rs.Appended(fl, nil) {
		t.Fatal("no traces: spans")
	}
	off, _ := NewBroker()
	if off.StartReplicate("orders", 2, 1, 2, traces, log) != nil {
		t.Fatal("tracing off: spans")
	}
	var none *Replicate
	none.Durable(stop, fl)
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func attrOf(s tracetest.SpanStub, k attribute.Key) attribute.Value {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value
		}
	}
	return attribute.Value{}
}
