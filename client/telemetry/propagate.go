package telemetry

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/runnel-io/runnel/client/batch"
)

// HeaderCarrier adapts a record's header list to propagation.TextMapCarrier, so any TextMapPropagator
// can read and write trace context in records. Keys are matched exactly: W3C keys are lowercase, and
// record header keys are case-sensitive strings.
type HeaderCarrier struct {
	// Headers is the list read by Get and Keys and changed by Set.
	Headers *[]batch.RecordHeader
}

var _ propagation.TextMapCarrier = HeaderCarrier{}

// Get returns the value of the last header named key ("" when there is none): a record that was
// forwarded and given a new context carries its newest one last.
func (c HeaderCarrier) Get(key string) string {
	hs := *c.Headers
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == key {
			return string(hs[i].Value)
		}
	}
	return ""
}

// Set replaces every header named key by one with value, at the end of the list. The list's backing
// array is never written: a record's headers belong to the application until its promise runs.
func (c HeaderCarrier) Set(key, value string) {
	hs := *c.Headers
	out := make([]batch.RecordHeader, 0, len(hs)+1)
	for _, h := range hs {
		if h.Key != key {
			out = append(out, h)
		}
	}
	*c.Headers = append(out, batch.RecordHeader{Key: key, Value: []byte(value)})
}

// Keys returns the header keys, in order, with repeats.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, len(*c.Headers))
	for i, h := range *c.Headers {
		keys[i] = h.Key
	}
	return keys
}

// DefaultPropagator returns the propagator used when none is given: the global one
// (otel.SetTextMapPropagator) when it was set to one that propagates something, else W3C trace context
// and baggage. Runnel promises W3C trace context in record headers (DESIGN.md), and the global
// propagator propagates nothing until an application sets it; that fallback keeps the promise without
// overriding an application's choice.
func DefaultPropagator() propagation.TextMapPropagator {
	if p := otel.GetTextMapPropagator(); len(p.Fields()) > 0 {
		return p
	}
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Inject returns headers with ctx's trace context added by p (DefaultPropagator when nil), replacing
// headers of the same keys; headers itself is not modified. With no valid span context in ctx it
// returns headers as they are, at no cost.
func Inject(ctx context.Context, p propagation.TextMapPropagator, headers []batch.RecordHeader) []batch.RecordHeader {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return headers
	}
	if p == nil {
		p = DefaultPropagator()
	}
	// A copy, because the carrier points at it: taking the parameter's address would move it to the
	// heap on entry, an allocation for every call, even those that return above.
	hs := headers
	p.Inject(ctx, HeaderCarrier{Headers: &hs})
	return hs
}

// Extract returns ctx with the trace context (and baggage, per p) that p (DefaultPropagator when nil)
// finds in headers. The span context it carries, trace.SpanContextFromContext(result), is the
// producer's and is remote; it is invalid when the record carries none.
func Extract(ctx context.Context, p propagation.TextMapPropagator, headers []batch.RecordHeader) context.Context {
	if len(headers) == 0 {
		return ctx // most records: nothing to look for
	}
	if p == nil {
		p = DefaultPropagator()
	}
	// A copy, because the carrier points at it: taking the parameter's address would move it to the
	// heap on entry, an allocation for every record a consumer looks at, headers or not.
	hs := headers
	return p.Extract(ctx, HeaderCarrier{Headers: &hs})
}

// ProducerSpanContext returns the span context carried by headers (invalid when none): the producer's
// batch span, to link a consumer's span to.
func ProducerSpanContext(p propagation.TextMapPropagator, headers []batch.RecordHeader) trace.SpanContext {
	return trace.SpanContextFromContext(Extract(context.Background(), p, headers))
}
