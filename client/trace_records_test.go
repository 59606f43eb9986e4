package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/telemetry"
)

// TestTraceEveryRecordOfBatch: every record of a traced batch carries the batch's trace context after
// its own headers, the records that joined the open batch as well as the one that opened it.
func TestTraceEveryRecordOfBatch(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	addr := startNode(t)
	createTopic(t, addr, "traced", 1, nil)
	// The linger outlasts the test: the records share one batch, sent by the Flush.
	p := newProducer(t, addr, client.WithLinger(time.Minute), client.WithTelemetry(telemetry.NewTracer(telemetry.WithTracerProvider(tp))))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 50
	for i := range n {
		r := client.NewRecord("traced", nil, fmt.Appendf(nil, "v%d", i))
		if i%2 == 0 {
			r.Headers = []client.Header{{Key: "app", Value: fmt.Appendf(nil, "%d", i)}}
		}
		p.Produce(ctx, r, nil)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c := newConsumer(t, addr)
	if err := c.Assign("traced", 0, client.OffsetEarliest()); err != nil {
		t.Fatal(err)
	}
	var first string
	for i, r := range consume(t, c, n, 30*time.Second) {
		tp, ok := header(r, "traceparent")
		if !ok || (first != "" && tp != first) {
			t.Fatalf("record %d: traceparent %q (present %v), the batch's first record had %q", i, tp, ok, first)
		}
		first = tp
		if i%2 == 0 && (len(r.Headers) != 2 || r.Headers[0].Key != "app" || string(r.Headers[0].Value) != fmt.Sprint(i)) {
			t.Fatalf("record %d: headers %v, want its own app=%d first", i, r.Headers, i)
		}
	}
}
