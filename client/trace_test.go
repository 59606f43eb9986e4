package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/telemetry"
	"github.com/runnel-io/runnel/platform"
	"github.com/runnel-io/runnel/platform/platformtest"
)

// spanNamed returns the one exported span with name and kind, waiting for it: the broker's spans end
// on its goroutines, after the client has its answer.
func spanNamed(t *testing.T, exp *tracetest.InMemoryExporter, name string, kind trace.SpanKind) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	waitFor(t, 5*time.Second, func() string {
		var all []string
		for _, s := range exp.GetSpans() {
			all = append(all, s.Name+"/"+s.SpanKind.String())
		}
		return fmt.Sprintf("%d spans %q of kind %v among %v", len(found), name, kind, all)
	}, func() bool {
		found = found[:0]
		for _, s := range exp.GetSpans() {
			if s.Name == name && s.SpanKind == kind {
				found = append(found, s)
			}
		}
		return len(found) == 1
	})
	return found[0]
}

func linksTo(s tracetest.SpanStub, sc trace.SpanContext) bool {
	for _, l := range s.Links {
		if l.SpanContext.TraceID() == sc.TraceID() && l.SpanContext.SpanID() == sc.SpanID() {
			return true
		}
	}
	return false
}

func header(r *client.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func attr(s tracetest.SpanStub, k attribute.Key) string {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value.Emit()
		}
	}
	return ""
}

// TestTraceProduceConsume: a record produced by the SDK with acks=all and consumed by a group member
// yields one trace. The producer's batch span ("send") is the parent of the broker's append span (the
// request travelled on a ProduceStream, so through ProducePartition.trace_context); the record carries
// the send span's traceparent; the member's poll records a receive span and its process span is a
// child of, and linked to, the send span. Node and clients share one in-memory exporter.
//
// Single node: once replication lands, the followers' spans hang under the leader's append span.
func TestTraceProduceConsume(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	addr := startGroupNode(t, func(c *platform.Config) { c.Telemetry.TracerProvider = tp })
	createTopic(t, addr, "orders", 2, nil)
	tr := telemetry.NewTracer(telemetry.WithTracerProvider(tp), telemetry.WithPropagator(propagation.TraceContext{}))

	p := newProducer(t, addr, client.WithAcks(client.AcksAll), client.WithTelemetry(tr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := &client.Record{Topic: "orders", Partition: 1, Key: []byte("k1"), Value: []byte("v1"),
		Headers: []client.Header{{Key: "app", Value: []byte("x")}}}
	if err := p.ProduceSync(ctx, rec); err != nil {
		t.Fatal(err)
	}
	send := spanNamed(t, exp, "send orders", trace.SpanKindProducer)
	if got := attr(send, telemetry.AttrPartition); got != "1" {
		t.Errorf("send span partition %q", got)
	}
	if got := attr(send, telemetry.AttrBaseOffset); got != "0" {
		t.Errorf("send span base offset %q, want 0", got)
	}
	app := spanNamed(t, exp, "append orders", trace.SpanKindServer)
	if app.Parent.SpanID() != send.SpanContext.SpanID() || app.SpanContext.TraceID() != send.SpanContext.TraceID() {
		t.Fatalf("append span's parent %s, want the send span %s", app.Parent.SpanID(), send.SpanContext.SpanID())
	}

	gc, err := client.NewGroupConsumer([]string{addr}, "billing", client.WithAutoOffsetReset(client.OffsetEarliest()),
		client.WithTelemetry(tr))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	if err := gc.Subscribe("orders"); err != nil {
		t.Fatal(err)
	}
	recs, err := gc.Poll(ctx)
	if err != nil || len(recs) != 1 {
		t.Fatalf("poll: %d records, %v", len(recs), err)
	}
	got := recs[0]
	want := fmt.Sprintf("00-%s-%s-01", send.SpanContext.TraceID(), send.SpanContext.SpanID())
	if tp, _ := header(got, "traceparent"); tp != want {
		t.Fatalf("traceparent %q, want %q", tp, want)
	}
	if v, _ := header(got, "app"); v != "x" || len(got.Headers) != 2 {
		t.Fatalf("headers %v: the application's header must stay", got.Headers)
	}
	pctx, span := gc.StartProcess(context.Background(), got)
	if !trace.SpanContextFromContext(pctx).Equal(span.SpanContext()) {
		t.Fatal("StartProcess's context does not carry its span")
	}
	span.End()
	proc := spanNamed(t, exp, "process orders", trace.SpanKindConsumer)
	if !linksTo(proc, send.SpanContext) {
		t.Errorf("process span links %v, want the send span", proc.Links)
	}
	if proc.Parent.SpanID() != send.SpanContext.SpanID() || proc.SpanContext.TraceID() != send.SpanContext.TraceID() {
		t.Errorf("process span's parent %s, want the send span %s (no ambient span)", proc.Parent.SpanID(), send.SpanContext.SpanID())
	}
	if g := attr(proc, telemetry.AttrGroup); g != "billing" {
		t.Errorf("process span group %q", g)
	}
	recv := spanNamed(t, exp, "receive orders", trace.SpanKindClient)
	if !linksTo(recv, send.SpanContext) {
		t.Errorf("receive span links %v, want the send span", recv.Links)
	}
}

// TestTraceOff: without a tracer provider (the default global one is a no-op), with WithTelemetry(nil),
// and with a provider that samples nothing, records carry no trace context header, and the
// application's headers are produced as they were.
func TestTraceOff(t *testing.T) {
	addr := platformtest.StartNode(t, t.TempDir()).GRPCAddr()
	createTopic(t, addr, "plain", 1, nil)
	never := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	t.Cleanup(func() { never.Shutdown(context.Background()) })
	cases := []struct {
		name string
		opts []client.ProducerOption
	}{
		{"default", nil},
		{"nil tracer", []client.ProducerOption{client.WithTelemetry(nil)}},
		{"unsampled", []client.ProducerOption{client.WithTelemetry(telemetry.NewTracer(telemetry.WithTracerProvider(never)))}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range cases {
		p := newProducer(t, addr, tc.opts...)
		if err := p.ProduceSync(ctx, &client.Record{Topic: "plain", Partition: 0, Value: []byte(tc.name),
			Headers: []client.Header{{Key: "app", Value: []byte("x")}}}); err != nil {
			t.Fatal(err)
		}
	}
	c := newConsumer(t, addr)
	if err := c.Assign("plain", 0, client.OffsetEarliest()); err != nil {
		t.Fatal(err)
	}
	for i, r := range consume(t, c, len(cases), 10*time.Second) {
		if len(r.Headers) != 1 || r.Headers[0].Key != "app" {
			t.Errorf("%s: headers %v, want only the application's", cases[i].name, r.Headers)
		}
		_, span := c.StartProcess(ctx, r) // no provider: a span that records nothing
		if span.IsRecording() {
			t.Errorf("%s: process span records without a provider", cases[i].name)
		}
		span.End()
	}
}

// TestTraceBatchFull: with tracing on, whether a record fits its batch counts its traceparent header
// (about 70 bytes a record), so full batches stay within the batch bytes and a topic whose
// max.message.bytes equals them takes every batch.
func TestTraceBatchFull(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	addr := platformtest.StartNode(t, t.TempDir()).GRPCAddr()
	createTopic(t, addr, "full", 1, map[string]string{"max.message.bytes": "2048"})
	p := newProducer(t, addr, client.WithBatchBytes(2048), client.WithLinger(time.Second),
		client.WithTelemetry(telemetry.NewTracer(telemetry.WithTracerProvider(tp))))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Values of many sizes, so that some record would fit a batch without its header and not with it.
	recs := make([]*client.Record, 300)
	for i := range recs {
		recs[i] = &client.Record{Topic: "full", Partition: 0, Value: make([]byte, 50+i*7%101)}
	}
	if err := p.ProduceSync(ctx, recs...); err != nil {
		t.Fatalf("traced batches over the batch bytes: %v", err)
	}
}
