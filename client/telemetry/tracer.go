package telemetry

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/runnel-io/runnel/api/rerr"
	"github.com/runnel-io/runnel/client/batch"
)

// Option configures NewTracer and NewBroker.
type Option func(*options)

type options struct {
	tp        trace.TracerProvider
	mp        metric.MeterProvider
	prop      propagation.TextMapPropagator
	unsampled bool
}

// WithTracerProvider sets where spans go. NewTracer defaults to the global provider
// (otel.GetTracerProvider); NewBroker defaults to none: tracing off.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(o *options) { o.tp = tp } }

// WithMeterProvider sets where the broker's metrics go (NewBroker only). Default: none, no metrics.
func WithMeterProvider(mp metric.MeterProvider) Option { return func(o *options) { o.mp = mp } }

// WithPropagator sets the propagator that writes and reads trace context in record headers and in
// ProducePartition.trace_context. Default: DefaultPropagator, resolved once when the Tracer or Broker
// is made (set the global propagator first).
func WithPropagator(p propagation.TextMapPropagator) Option { return func(o *options) { o.prop = p } }

// WithUnsampledPropagation makes NewTracer's batch spans put their context into records even when the
// span is not sampled (trace flags 00), as W3C propagation does by default, so consumers' parent-based
// samplers drop those records' spans too instead of sampling them on their own. It costs every record of
// an unsampled batch its traceparent header (about 70 bytes, stored with the record until retention
// deletes it); off by default, so a 1% sample rate adds headers to about 1% of the records.
func WithUnsampledPropagation() Option { return func(o *options) { o.unsampled = true } }

func buildOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.prop == nil {
		o.prop = DefaultPropagator()
	}
	return o
}

// Tracer starts the spans of Runnel's producers and consumers after the OpenTelemetry messaging semantic
// conventions: one "send" span per produced batch (kind producer) whose context travels in every
// record's headers, and "process" (kind consumer) and "receive" (kind client) spans that link to it.
// It is the one piece the SDK's producer and consumer, stream functions and connectors call, so a
// record's journey reads the same everywhere.
//
// A nil *Tracer is valid and traces nothing: every method returns at once, so "tracing off" costs a
// nil check.
type Tracer struct {
	tracer    trace.Tracer
	prop      propagation.TextMapPropagator
	unsampled bool // propagate unsampled batch spans too
}

// NewTracer returns a Tracer over the global tracer provider and DefaultPropagator unless options say
// otherwise. With the global provider left as it is (a no-op), spans are not recorded, and trace
// context is propagated only when the caller's context already carries a sampled one.
func NewTracer(opts ...Option) *Tracer {
	o := buildOptions(opts)
	if o.tp == nil {
		o.tp = otel.GetTracerProvider()
	}
	return &Tracer{tracer: o.tp.Tracer(ScopeName), prop: o.prop, unsampled: o.unsampled}
}

// Propagator returns the propagator the Tracer writes and reads headers with (nil for a nil Tracer).
func (t *Tracer) Propagator() propagation.TextMapPropagator {
	if t == nil {
		return nil
	}
	return t.prop
}

// SendSpan is the span of one produced batch: one topic-partition, from the batch's first record to the
// broker's answer. Its context goes into every record of the batch (Headers) and into the produce
// request (TraceContext, ContextWith), so the broker's spans are its children and consumers link to it.
//
// A nil *SendSpan is valid (tracing off, or nothing to propagate) and every method is a no-op that
// returns its input.
type SendSpan struct {
	span    trace.Span
	parent  trace.SpanContext      // of the context the batch span was started in
	carrier propagation.MapCarrier // the span's context as the propagator writes it
	headers []batch.RecordHeader   // the same, as record headers, sorted by key
}

// StartSend starts the span of a batch for topic and partition, as a child of ctx's span (the first
// record's Produce context). It returns nil when there is nothing to propagate: no recording tracer
// provider and no span context in ctx, or a span that is not sampled (unless WithUnsampledPropagation).
// A non-nil SendSpan must be ended once the batch has its outcome.
func (t *Tracer) StartSend(ctx context.Context, topic string, partition int32) *SendSpan {
	if t == nil {
		return nil
	}
	parent := trace.SpanContextFromContext(ctx)
	// Name and attributes are set once the span is known to record: a no-op or unsampled span then
	// costs no string building. Samplers see the operation ("send") as the name.
	sctx, span := t.tracer.Start(ctx, OpSend, producerKind)
	if sc := span.SpanContext(); !sc.IsValid() || !sc.IsSampled() && !t.unsampled {
		// A no-op provider without a parent, or a trace nobody keeps: nothing to propagate. An
		// unsampled SDK span records nothing, so it needs no End.
		return nil
	}
	if span.IsRecording() {
		span.SetName(OpSend + " " + topic)
		span.SetAttributes(semconv.MessagingSystemKey.String(SystemName), semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName(OpSend), AttrTopic.String(topic), AttrPartition.String(partitionID(partition)))
	}
	s := &SendSpan{span: span, parent: parent, carrier: propagation.MapCarrier{}}
	t.prop.Inject(sctx, s.carrier)
	keys := s.carrier.Keys()
	slices.Sort(keys) // stable header order, so identical batches encode identically
	s.headers = make([]batch.RecordHeader, len(keys))
	for i, k := range keys {
		s.headers[i] = batch.RecordHeader{Key: k, Value: []byte(s.carrier[k])}
	}
	return s
}

// SpanContext returns the batch span's context (invalid for nil).
func (s *SendSpan) SpanContext() trace.SpanContext {
	if s == nil {
		return trace.SpanContext{}
	}
	return s.span.SpanContext()
}

// Headers returns hs with the batch span's trace context headers ("traceparent", "tracestate", and
// "baggage" when there is some) in place of any of the same keys, for a record going into the batch. hs
// itself is never modified; the result shares the header values of the span, which must not be
// changed. For a nil SendSpan it returns hs.
func (s *SendSpan) Headers(hs []batch.RecordHeader) []batch.RecordHeader {
	if s == nil {
		return hs
	}
	out := make([]batch.RecordHeader, 0, len(hs)+len(s.headers))
	for _, h := range hs {
		if _, replaced := s.carrier[h.Key]; !replaced {
			out = append(out, h)
		}
	}
	return append(out, s.headers...)
}

// Link records that a record produced in ctx went into the batch: when ctx's span is another than the
// one the batch span was started in, the batch span links to it, so that trace finds the batch too (a
// span has one parent; the batch's first record chose it). Bounded by the SDK's link limit (128).
func (s *SendSpan) Link(ctx context.Context) {
	if s == nil {
		return
	}
	sc := trace.SpanContextFromContext(ctx)
	if sc.IsValid() && !sc.Equal(s.parent) && s.span.IsRecording() {
		s.span.AddLink(trace.Link{SpanContext: sc})
	}
}

// TraceContext returns the batch span's context as ProducePartition.trace_context wants it (read-only;
// nil for a nil SendSpan).
func (s *SendSpan) TraceContext() map[string]string {
	if s == nil {
		return nil
	}
	return s.carrier
}

// ContextWith returns ctx carrying the batch span, for a unary gRPC call instrumented with otelgrpc:
// the call's span becomes the batch span's child.
func (s *SendSpan) ContextWith(ctx context.Context) context.Context {
	if s == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, s.span)
}

// End ends the span with the batch's outcome: its base offset (-1 when unknown, e.g. acks=none), its
// record count, and err when it failed.
func (s *SendSpan) End(baseOffset int64, records int, err error) {
	if s == nil {
		return
	}
	if s.span.IsRecording() {
		s.span.SetAttributes(semconv.MessagingBatchMessageCount(records))
		if baseOffset >= 0 {
			s.span.SetAttributes(AttrBaseOffset.Int64(baseOffset))
		}
		setError(s.span, err)
	}
	s.span.End()
}

// Message is what a consumer's span needs of one record.
type Message struct {
	Topic     string
	Partition int32
	Offset    int64
	// Key goes on process spans when it is valid UTF-8 of at most 256 bytes.
	Key     []byte
	Headers []batch.RecordHeader
}

// StartProcess starts the span (kind consumer, operation process) of processing one record by a member
// of group ("" for a consumer outside groups). It links to the producer's batch span found in the
// record's headers; when ctx has no span of its own, it is also that span's child, so producer, broker
// and consumer show as one trace. Baggage in the headers is added to the returned context. End the span
// when processing is done. A nil Tracer returns ctx and a no-op span.
func (t *Tracer) StartProcess(ctx context.Context, group string, m Message) (context.Context, trace.Span) {
	if t == nil {
		return ctx, noop.Span{}
	}
	ambient := trace.SpanFromContext(ctx)
	pctx := Extract(ctx, t.prop, m.Headers)
	producer := trace.SpanContextFromContext(pctx)
	if !producer.IsValid() || producer.Equal(ambient.SpanContext()) {
		producer = trace.SpanContext{}
	}
	if ambient.SpanContext().IsValid() {
		pctx = trace.ContextWithSpan(pctx, ambient) // the caller's span stays the parent; link only
	}
	var sctx context.Context
	var span trace.Span
	if producer.IsValid() {
		sctx, span = t.tracer.Start(pctx, OpProcess, consumerKind, trace.WithLinks(trace.Link{SpanContext: producer}))
	} else {
		sctx, span = t.tracer.Start(pctx, OpProcess, consumerKind)
	}
	if span.IsRecording() { // as in StartSend: names and attributes only for spans that record
		span.SetName(OpProcess + " " + m.Topic)
		attrs := make([]attribute.KeyValue, 0, 8)
		attrs = append(attrs, semconv.MessagingSystemKey.String(SystemName), semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName(OpProcess), AttrTopic.String(m.Topic), AttrPartition.String(partitionID(m.Partition)),
			AttrOffset.Int64(m.Offset))
		if group != "" {
			attrs = append(attrs, AttrGroup.String(group))
		}
		if m.Key != nil && len(m.Key) <= 256 && utf8.Valid(m.Key) {
			attrs = append(attrs, AttrMessageKey.String(string(m.Key)))
		}
		span.SetAttributes(attrs...)
	}
	return sctx, span
}

// Span kinds as start options, allocated once.
var (
	producerKind = trace.WithSpanKind(trace.SpanKindProducer)
	consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)
)

// StartProcessBatch starts the span (kind consumer, operation process) of processing several records at
// once, e.g. a function's input batch, as a child of ctx, with a link to each distinct producer span
// (records of one produced batch share one). Name and destination come from the first record; ms must
// not be empty. A nil Tracer returns ctx and a no-op span.
func (t *Tracer) StartProcessBatch(ctx context.Context, group string, ms []Message) (context.Context, trace.Span) {
	if t == nil || len(ms) == 0 {
		return ctx, noop.Span{}
	}
	return t.tracer.Start(ctx, OpProcess+" "+ms[0].Topic, t.batchOptions(trace.SpanKindConsumer, semconv.MessagingOperationTypeProcess, OpProcess, group, ms[0].Topic, len(ms), ms)...)
}

// Receive records a finished span (kind client, operation receive) for a poll by a member of group
// that started at start and returned ms, with a link to each distinct producer span. It is the span of
// the wait and the fetch, which process spans do not cover. Nothing happens for a nil Tracer or no
// records.
func (t *Tracer) Receive(ctx context.Context, group string, start time.Time, ms []Message) {
	if t == nil || len(ms) == 0 {
		return
	}
	t.ReceiveCount(ctx, group, start, ms[0].Topic, len(ms), ms)
}

// ReceiveCount is Receive for a poll that returned n records, the first of them from topic, given
// only those that may carry a producer's span context (records with headers; the others cannot
// link): the same span, without a Message per record. Nothing happens for a nil Tracer or n = 0.
func (t *Tracer) ReceiveCount(ctx context.Context, group string, start time.Time, topic string, n int, ms []Message) {
	if t == nil || n == 0 {
		return
	}
	opts := append(t.batchOptions(trace.SpanKindClient, semconv.MessagingOperationTypeReceive, OpReceive, group, topic, n, ms), trace.WithTimestamp(start))
	_, span := t.tracer.Start(ctx, OpReceive+" "+topic, opts...)
	span.End()
}

// batchOptions are the start options of a span over n records of topic, linked to the producer spans
// named in ms's headers.
func (t *Tracer) batchOptions(kind trace.SpanKind, op attribute.KeyValue, name, group, topic string, n int, ms []Message) []trace.SpanStartOption {
	attrs := []attribute.KeyValue{semconv.MessagingSystemKey.String(SystemName), op, semconv.MessagingOperationName(name),
		AttrTopic.String(topic), semconv.MessagingBatchMessageCount(n)}
	if group != "" {
		attrs = append(attrs, AttrGroup.String(group))
	}
	var links []trace.Link
	var last trace.SpanContext
	for i := range ms {
		sc := ProducerSpanContext(t.prop, ms[i].Headers)
		if sc.IsValid() && !sc.Equal(last) {
			links = append(links, trace.Link{SpanContext: sc})
			last = sc
		}
	}
	return []trace.SpanStartOption{trace.WithSpanKind(kind), trace.WithAttributes(attrs...), trace.WithLinks(links...)}
}

// setError marks span failed with err's catalogue code as error.type.
func setError(span trace.Span, err error) {
	if err == nil {
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(AttrErrorType.String(errorType(err)))
}

// errorType is the value of error.type for err: its catalogue code name, also when err is the gRPC
// status a handler returns, or "_OTHER".
func errorType(err error) string {
	var e *rerr.Error
	if errors.As(err, &e) || errors.As(rerr.FromStatus(err), &e) {
		return e.Code.String()
	}
	return "_OTHER"
}

// partitionID formats a partition as messaging.destination.partition.id wants it.
func partitionID(p int32) string { return strconv.FormatInt(int64(p), 10) }
