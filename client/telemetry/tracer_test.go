package telemetry_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/client/telemetry"
)

// newTracer returns a Tracer that records every span into the returned exporter.
func newTracer(t *testing.T) (*telemetry.Tracer, *tracetest.InMemoryExporter, *sdktrace.TracerProvider) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return telemetry.NewTracer(telemetry.WithTracerProvider(tp), telemetry.WithPropagator(propagation.TraceContext{})), exp, tp
}

func spanNamed(t *testing.T, exp *tracetest.InMemoryExporter, name string) tracetest.SpanStub {
	t.Helper()
	for _, s := range exp.GetSpans() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no span %q among %v", name, names(exp.GetSpans()))
	return tracetest.SpanStub{}
}

func names(ss tracetest.SpanStubs) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Name)
	}
	return out
}

func attr(s tracetest.SpanStub, k attribute.Key) (attribute.Value, bool) {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

// TestHeaderCarrier: inject writes traceparent into a record's headers without touching the caller's
// slice, replaces a stale one, and extract reads back the same span context.
func TestHeaderCarrier(t *testing.T) {
	_, _, tp := newTracer(t)
	ctx, span := tp.Tracer("test").Start(context.Background(), "parent")
	defer span.End()
	orig := []batch.RecordHeader{{Key: "a", Value: []byte("1")}, {Key: "traceparent", Value: []byte("stale")}}
	keep := slices.Clone(orig)
	hs := telemetry.Inject(ctx, propagation.TraceContext{}, orig)
	if !slices.EqualFunc(orig, keep, func(a, b batch.RecordHeader) bool { return a.Key == b.Key && string(a.Value) == string(b.Value) }) {
		t.Fatalf("Inject changed the caller's headers: %v", orig)
	}
	n := 0
	for _, h := range hs {
		if h.Key == "traceparent" {
			n++
		}
	}
	if n != 1 || hs[0].Key != "a" {
		t.Fatalf("headers after inject: %v", hs)
	}
	got := telemetry.ProducerSpanContext(propagation.TraceContext{}, hs)
	if got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("extracted %v, want %v", got, span.SpanContext())
	}
	if !got.IsRemote() {
		t.Fatal("extracted span context is not remote")
	}
	// No span in the context: nothing is added, and the same slice comes back.
	if out := telemetry.Inject(context.Background(), nil, orig); &out[0] != &orig[0] || len(out) != len(orig) {
		t.Fatal("Inject without a span context changed the headers")
	}
	if sc := telemetry.ProducerSpanContext(nil, nil); sc.IsValid() {
		t.Fatal("span context from no headers")
	}
}

// TestSendProcessOneTrace: a batch span's context goes into the records; a consumer without a span of
// its own processes a record as the batch span's child, linked to it; a consumer with its own span keeps
// it as the parent and only links.
func TestSendProcessOneTrace(t *testing.T) {
	tr, exp, tp := newTracer(t)
	appCtx, app := tp.Tracer("test").Start(context.Background(), "app")
	send := tr.StartSend(appCtx, "orders", 3)
	if send == nil {
		t.Fatal("no send span with a recording provider")
	}
	other, otherSpan := tp.Tracer("test").Start(context.Background(), "other-request")
	send.Link(other)  // a second record from another trace
	send.Link(appCtx) // the first record's own context: no link
	hs := send.Headers([]batch.RecordHeader{{Key: "k", Value: []byte("v")}})
	if tc := send.TraceContext(); tc["traceparent"] == "" {
		t.Fatalf("trace context %v", tc)
	}
	send.End(42, 2, nil)
	otherSpan.End()
	app.End()

	_, proc := tr.StartProcess(context.Background(), "g1", telemetry.Message{Topic: "orders", Partition: 3, Offset: 42, Key: []byte("key"), Headers: hs})
	proc.End()
	consumerCtx, loop := tp.Tracer("test").Start(context.Background(), "consumer-loop")
	_, proc2 := tr.StartProcess(consumerCtx, "g1", telemetry.Message{Topic: "orders", Partition: 3, Offset: 43, Headers: hs})
	proc2.End()
	loop.End()

	sendStub := spanNamed(t, exp, "send orders")
	if sendStub.SpanKind != trace.SpanKindProducer || sendStub.Parent.SpanID() != app.SpanContext().SpanID() {
		t.Fatalf("send span kind %v parent %v", sendStub.SpanKind, sendStub.Parent)
	}
	if len(sendStub.Links) != 1 || sendStub.Links[0].SpanContext.SpanID() != otherSpan.SpanContext().SpanID() {
		t.Fatalf("send span links %v", sendStub.Links)
	}
	for k, want := range map[attribute.Key]string{"messaging.system": "runnel", "messaging.operation.type": "send",
		"messaging.destination.name": "orders", "messaging.destination.partition.id": "3"} {
		if v, _ := attr(sendStub, k); v.AsString() != want {
			t.Errorf("send span %s = %q, want %q", k, v.AsString(), want)
		}
	}
	if v, _ := attr(sendStub, telemetry.AttrBaseOffset); v.AsInt64() != 42 {
		t.Errorf("base offset %v", v)
	}
	var procs []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "process orders" {
			procs = append(procs, s)
		}
	}
	if len(procs) != 2 {
		t.Fatalf("process spans: %v", names(exp.GetSpans()))
	}
	for i, p := range procs {
		if p.SpanKind != trace.SpanKindConsumer || len(p.Links) != 1 || p.Links[0].SpanContext.SpanID() != sendStub.SpanContext.SpanID() {
			t.Fatalf("process span %d: kind %v links %v", i, p.SpanKind, p.Links)
		}
		if v, _ := attr(p, telemetry.AttrGroup); v.AsString() != "g1" {
			t.Errorf("process span %d group %v", i, v)
		}
	}
	if procs[0].Parent.SpanID() != sendStub.SpanContext.SpanID() || procs[0].SpanContext.TraceID() != sendStub.SpanContext.TraceID() {
		t.Fatalf("process span without an ambient span is not the send span's child: parent %v", procs[0].Parent)
	}
	if v, _ := attr(procs[0], telemetry.AttrOffset); v.AsInt64() != 42 {
		t.Errorf("offset attribute %v", v)
	}
	if procs[1].Parent.SpanID() != loop.SpanContext().SpanID() {
		t.Fatalf("process span with an ambient span: parent %v, want the consumer loop", procs[1].Parent)
	}
}

// TestSendError: a failed batch's span carries the catalogue code as error.type.
func TestSendError(t *testing.T) {
	tr, exp, _ := newTracer(t)
	s := tr.StartSend(context.Background(), "t", 0)
	s.End(-1, 1, rerr.New(runnelv1.ErrorCode_MESSAGE_TOO_LARGE, "too large"))
	stub := spanNamed(t, exp, "send t")
	if v, _ := attr(stub, telemetry.AttrErrorType); v.AsString() != "MESSAGE_TOO_LARGE" {
		t.Fatalf("error.type %v", v)
	}
	if stub.Status.Code != 1 { // codes.Error
		t.Fatalf("status %v", stub.Status)
	}
	s2 := tr.StartSend(context.Background(), "t", 0)
	s2.End(-1, 1, errors.New("boom"))
	if v, _ := attr(exp.GetSpans()[1], telemetry.AttrErrorType); v.AsString() != "_OTHER" {
		t.Fatalf("error.type %v", v)
	}
}

// TestBatchAndReceive: a batch process span and a receive span link each distinct producer span once.
func TestBatchAndReceive(t *testing.T) {
	tr, exp, _ := newTracer(t)
	a := tr.StartSend(context.Background(), "t", 0)
	b := tr.StartSend(context.Background(), "t", 0)
	ha, hb := a.Headers(nil), b.Headers(nil)
	a.End(0, 2, nil)
	b.End(2, 1, nil)
	ms := []telemetry.Message{{Topic: "t", Offset: 0, Headers: ha}, {Topic: "t", Offset: 1, Headers: ha}, {Topic: "t", Offset: 2, Headers: hb}, {Topic: "t", Offset: 3}}
	_, span := tr.StartProcessBatch(context.Background(), "g", ms)
	span.End()
	tr.Receive(context.Background(), "g", time.Now().Add(-time.Millisecond), ms)
	for _, name := range []string{"process t", "receive t"} {
		s := spanNamed(t, exp, name)
		if len(s.Links) != 2 {
			t.Fatalf("%s links %v", name, s.Links)
		}
		if v, _ := attr(s, "messaging.batch.message_count"); v.AsInt64() != 4 {
			t.Fatalf("%s count %v", name, v)
		}
	}
	if s := spanNamed(t, exp, "receive t"); s.SpanKind != trace.SpanKindClient {
		t.Fatalf("receive kind %v", s.SpanKind)
	}
}

// TestTracingOff: a nil Tracer and a no-op provider do nothing and propagate nothing; with a no-op
// provider a batch or a processed record costs the no-op span and its context (2 or 3 allocations),
// no names or attributes.
func TestTracingOff(t *testing.T) {
	var nilTracer *telemetry.Tracer
	hs := []batch.RecordHeader{{Key: "a"}}
	if s := nilTracer.StartSend(context.Background(), "t", 0); s != nil {
		t.Fatal("nil tracer made a send span")
	}
	var s *telemetry.SendSpan
	if out := s.Headers(hs); len(out) != 1 || s.TraceContext() != nil || s.SpanContext().IsValid() {
		t.Fatal("nil send span changed something")
	}
	s.Link(context.Background())
	s.End(0, 1, nil)
	ctx, span := nilTracer.StartProcess(context.Background(), "g", telemetry.Message{Topic: "t", Headers: hs})
	span.End()
	if ctx != context.Background() || span.SpanContext().IsValid() {
		t.Fatal("nil tracer process span")
	}

	noopTracer := telemetry.NewTracer(telemetry.WithTracerProvider(tracenoop.NewTracerProvider()))
	if s := noopTracer.StartSend(context.Background(), "t", 0); s != nil {
		t.Fatal("no-op provider without a parent made a send span")
	}
	allocs := testing.AllocsPerRun(100, func() {
		s := noopTracer.StartSend(context.Background(), "topic", 7)
		_ = s.Headers(hs)
		s.End(0, 1, nil)
	})
	if allocs > 2 {
		t.Fatalf("tracing off: %v allocations per batch, want at most 2", allocs)
	}
	m := telemetry.Message{Topic: "topic", Partition: 1, Offset: 5}
	allocs = testing.AllocsPerRun(100, func() {
		_, span := noopTracer.StartProcess(context.Background(), "g", m)
		span.End()
	})
	if allocs > 3 {
		t.Fatalf("tracing off: %v allocations per processed record, want at most 3", allocs)
	}
}

// BenchmarkStartSendOff measures the SDK's per-batch cost with tracing off (a no-op provider).
func BenchmarkStartSendOff(b *testing.B) {
	tr := telemetry.NewTracer(telemetry.WithTracerProvider(tracenoop.NewTracerProvider()))
	hs := []batch.RecordHeader{{Key: "a"}}
	b.ReportAllocs()
	for b.Loop() {
		s := tr.StartSend(context.Background(), "topic", 7)
		_ = s.Headers(hs)
		s.End(0, 1, nil)
	}
}

// TestUnsampledPropagation: by default an unsampled batch puts nothing into its records (no bytes for
// a trace nobody keeps); WithUnsampledPropagation propagates it with trace flags 00.
func TestUnsampledPropagation(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	defer tp.Shutdown(context.Background())
	if s := telemetry.NewTracer(telemetry.WithTracerProvider(tp)).StartSend(context.Background(), "t", 0); s != nil {
		t.Fatalf("unsampled batch span propagated: %v", s.TraceContext())
	}
	s := telemetry.NewTracer(telemetry.WithTracerProvider(tp), telemetry.WithUnsampledPropagation()).StartSend(context.Background(), "t", 0)
	if s == nil {
		t.Fatal("no send span with WithUnsampledPropagation")
	}
	defer s.End(0, 1, nil)
	hs := s.Headers(nil)
	if len(hs) != 1 || hs[0].Key != "traceparent" || !strings.HasSuffix(string(hs[0].Value), "-00") {
		t.Fatalf("headers %v", hs)
	}
}

// BenchmarkStartSendSampled1pct measures the SDK's per-batch cost at a 1% sample rate: the sampler's
// decision and an unsampled span for 99 batches in 100, a recorded span, its headers and its export
// for the hundredth.
func BenchmarkStartSendSampled1pct(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))),
		sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer tp.Shutdown(context.Background())
	tr := telemetry.NewTracer(telemetry.WithTracerProvider(tp), telemetry.WithPropagator(propagation.TraceContext{}))
	b.ReportAllocs()
	for b.Loop() {
		s := tr.StartSend(context.Background(), "topic", 7)
		for range 100 {
			_ = s.Headers(nil)
		}
		_ = s.TraceContext()
		s.End(0, 100, nil)
	}
}
