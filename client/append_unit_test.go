package client

import (
	"bytes"
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/client/telemetry"
)

// A traced batch's records carry its trace context headers after their own (SendSpan.Headers), and
// whether a record fits the batch (AppendWithin, as Producer.append calls it) counts them: a record
// that would fit without them is refused, and one that fits with them is encoded with them.
func TestAppendWithinTraceHeaders(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	send := telemetry.NewTracer(telemetry.WithTracerProvider(tp)).StartSend(context.Background(), "t", 0)
	if send == nil {
		t.Fatal("no send span from a sampling provider")
	}
	own := []batch.RecordHeader{{Key: "app", Value: []byte("1")}}
	hs := send.Headers(own)
	if len(hs) <= len(own) {
		t.Fatalf("trace headers %v add nothing to %v", hs, own)
	}
	v := bytes.Repeat([]byte("v"), 100)
	var b batch.Builder
	b.Append(1000, nil, v, hs)
	without, with := b.RecordSize(1001, nil, v, own), b.RecordSize(1001, nil, v, hs)
	size, n := b.Size(), b.Len()
	if got, ok := b.AppendWithin(size+without, 1001, nil, v, hs); ok || got != with || b.Size() != size || b.Len() != n {
		t.Fatalf("record over the limit with its trace headers: %d bytes, appended %v; batch %d bytes, %d records", got, ok, b.Size(), b.Len())
	}
	if got, ok := b.AppendWithin(size+with, 1001, nil, v, hs); !ok || got != with || b.Size() != size+with {
		t.Fatalf("record within the limit with its trace headers: %d bytes (want %d), appended %v", got, with, ok)
	}
	var recs []batch.Record
	if err := batch.DecodeRecords(b.Build(batch.CompressionNone), func(r batch.Record) error {
		recs = append(recs, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("%d records decoded, want 2", len(recs))
	}
	got := recs[1].Headers
	if len(got) != len(hs) || got[0].Key != "app" || string(got[0].Value) != "1" {
		t.Fatalf("headers %v, want the record's own first, then %v", got, hs[len(own):])
	}
	for i, h := range hs {
		if got[i].Key != h.Key || !bytes.Equal(got[i].Value, h.Value) {
			t.Fatalf("header %d: %s=%q, want %s=%q", i, got[i].Key, got[i].Value, h.Key, h.Value)
		}
	}
	if got[len(own)].Key != "traceparent" || !bytes.Contains(got[len(own)].Value, []byte(send.SpanContext().TraceID().String())) {
		t.Fatalf("trace header %s=%q does not carry the batch span's trace %s", got[len(own)].Key, got[len(own)].Value, send.SpanContext().TraceID())
	}
	send.End(0, 2, nil)
}
