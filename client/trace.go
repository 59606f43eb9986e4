package client

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/runnel-io/runnel/client/telemetry"
)

// The consumer side of tracing: the SDK only calls package telemetry, which owns the spans' names,
// attributes and links, so that the SDK, stream functions and connectors trace records alike.

// received records the receive span of a poll by a member of group ("" outside groups) that started at
// start and returned recs. The telemetry view of the records goes into a slice the consumer keeps
// between polls (a sync.Pool would be emptied by every GC, which a busy consumer causes often), so a
// poll costs no allocation per record; concurrent polls, which are rare, use a slice of their own.
func (c *Consumer) received(ctx context.Context, group string, start time.Time, recs []*Record) {
	if c.tr == nil || len(recs) == 0 {
		return
	}
	mine := c.msgMu.TryLock()
	var ms []telemetry.Message
	if mine {
		ms = c.msgs[:0]
	}
	for _, r := range recs {
		if len(r.Headers) > 0 { // only a record with headers can name its producer's span
			ms = append(ms, message(r))
		}
	}
	c.tr.ReceiveCount(ctx, group, start, recs[0].Topic, len(recs), ms)
	if mine {
		clear(ms) // drop the references to the fetched records' memory
		c.msgs = ms[:0]
		c.msgMu.Unlock()
	}
}

func message(r *Record) telemetry.Message {
	return telemetry.Message{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Headers: r.Headers}
}

// StartProcess starts the span of processing rec, a record Poll returned (kind consumer, operation
// process). The span links to the producer's batch span named by the record's traceparent header and,
// when ctx carries no span of its own, is that span's child, so producer, broker and consumer read as
// one trace. Use the returned context for the work the record causes (records produced from it join
// the trace) and end the span when the record is processed:
//
//	ctx, span := consumer.StartProcess(ctx, rec)
//	err := handle(ctx, rec)
//	span.End()
//
// With tracing off (WithTelemetry(nil)) it returns ctx and a no-op span.
func (c *Consumer) StartProcess(ctx context.Context, rec *Record) (context.Context, trace.Span) {
	return c.tr.StartProcess(ctx, "", message(rec))
}

// StartProcess starts the span of processing rec, as Consumer.StartProcess does, with the group's id
// (messaging.consumer.group.name) on it.
func (g *GroupConsumer) StartProcess(ctx context.Context, rec *Record) (context.Context, trace.Span) {
	return g.c.tr.StartProcess(ctx, g.group, message(rec))
}
