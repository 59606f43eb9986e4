// Package telemetry is Runnel's OpenTelemetry instrumentation, shared by every part that produces,
// stores or consumes records: the SDK (client), the broker, and later stream functions and connectors.
// It lives under client/ because dependencies point inward (platform → broker → client → api): this is
// the innermost place both the SDK and the broker can import.
//
// # Traces: one record's journey
//
// A producer starts one span per batch (Tracer.StartSend, kind producer, operation "send") and puts
// its context into every record of the batch as W3C trace context headers ("traceparent",
// "tracestate"; SendSpan.Headers) and into the produce request (SendSpan.TraceContext for
// ProducePartition.trace_context, SendSpan.ContextWith for unary calls through otelgrpc). The broker
// continues the trace with an "append <topic>" span per partition (Broker.StartAppend), and its gRPC
// server spans come from otelgrpc. The broker never decodes records, so it reads trace context from the
// request, not from record headers. A consumer starts a "process" span per record (Tracer.StartProcess,
// kind consumer) that links to the producer's batch span found in the record's headers, and is its
// child when the consumer has no span of its own, so producer → broker → consumer is one trace. A batch
// of records processed at once gets one span with a link per producer span (StartProcessBatch), and a
// poll a "receive" span (Receive). Attributes follow the OpenTelemetry messaging semantic conventions
// (messaging.system "runnel", messaging.destination.name, messaging.destination.partition.id,
// messaging.operation.type, messaging.consumer.group.name), with messaging.runnel.* for offsets as
// the Kafka conventions have messaging.kafka.*.
//
// All records of a batch carry the batch span's context, rather than one span per record: a span per
// batch is what the broker appends and what the network carries, and it keeps tracing's cost per batch
// rather than per record. A record produced in another trace than the batch's first record is linked
// from the batch span (SendSpan.Link).
//
// # Off at no cost
//
// A nil *Tracer, *SendSpan or *Broker is valid and does nothing, so "tracing off" is a nil check. The
// broker makes no span at all without a tracer provider, not even no-op ones, and never starts root
// spans per produce. Metrics of the hot paths are atomic counters read at collection time (see Broker).
//
// # Metrics
//
// names.go is the one list of instrument names, units and attributes. Only instruments that something
// records exist; replication and transactions add theirs when they land.
package telemetry
