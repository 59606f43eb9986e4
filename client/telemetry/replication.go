package telemetry

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
)

// Replication continues a produced batch's trace on the followers: producer → leader → followers →
// consumer. The leader remembers, for its recent traced appends, which batches they were and the
// context of their append span (a small ring per partition); when a follower's ReplicaFetch answer
// carries one of those batches, the leader sends the span context along
// (ReplicaFetchPartitionResult.batch_traces, ReplicaTraces), and the follower starts a "replicate" span
// per traced batch as the append span's child, ended once the batch is durable in its log
// (StartReplicate).
//
// A batch is remembered by its header (length, CRC, record count, timestamps, producer id, epoch and
// sequence) rather than its offset, because the offset is assigned by the store's writer and the batch
// becomes readable by followers before the append's completion reaches the broker: an offset learnt at
// completion would often come after the follower's fetch. The header is known before the append is
// queued, so a follower's fetch always finds it. The first fetch that finds a batch also pins its base
// offset, so a later batch with an identical header (a retry of a non-idempotent producer within the
// same millisecond) is not taken for it.
//
// Memory is bounded: traceRingSize batches per partition that had traced appends, the oldest
// forgotten first. A follower more than that many traced batches behind replicates the older ones
// without spans. A failed append forgets its batches (Done), so the traces of appends that timed out
// waiting for the ISR end at the leader. With tracing off nothing is remembered and the answer's
// lookup is a nil check.

// traceRingSize is how many traced batches each partition's leader remembers for its followers.
const traceRingSize = 128

// replicateTimeout bounds how long a follower's replicate span waits for its batch to become
// durable; after it the span ends with an error (the log was truncated, or the store stalled).
const replicateTimeout = 30 * time.Second

// batchPrint identifies a produced batch by the header fields the broker does not rewrite. The CRC
// covers everything from the attributes on, so it tells batches apart, except when the broker stamped
// LogAppendTime, which recomputes it (matches ignores it then).
type batchPrint struct {
	length, lastDelta, count, seq int32
	crc                           uint32
	baseTs, pid                   int64
	epoch                         int16
}

func printOf(h batch.Header) batchPrint {
	return batchPrint{length: h.Length, lastDelta: h.LastOffsetDelta, count: h.RecordCount, seq: h.BaseSequence, crc: h.CRC,
		baseTs: h.BaseTimestamp, pid: h.ProducerID, epoch: h.ProducerEpoch}
}

// matches reports whether the stored batch with header h is the produced batch p.
func (p batchPrint) matches(h batch.Header) bool {
	q := printOf(h)
	if h.Attributes&batch.AttrLogAppendTime != 0 {
		q.crc = p.crc
	}
	return p == q
}

// traceEntry is one remembered batch of a traced append.
type traceEntry struct {
	print   batchPrint
	base    int64 // the batch's base offset once a fetch found it, else -1
	token   uint64
	context map[string]string // the append span's context as the propagator writes it; nil: empty slot
}

// traceRing holds a partition's recent traced batches, oldest overwritten first.
type traceRing struct {
	mu      sync.Mutex
	entries [traceRingSize]traceEntry
	next    int // slot of the next entry
	live    int // entries with a context
}

// remember adds the batches of one traced append (their headers in hs) under token.
func (r *traceRing) remember(hs []batchPrint, token uint64, carrier map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range hs {
		e := &r.entries[r.next]
		if e.context == nil {
			r.live++
		}
		*e = traceEntry{print: p, base: -1, token: token, context: carrier}
		r.next = (r.next + 1) % traceRingSize
	}
}

// forget drops the batches of the append token; it reports whether the ring is empty after.
func (r *traceRing) forget(token uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.entries {
		if e := &r.entries[i]; e.context != nil && e.token == token {
			*e = traceEntry{}
			r.live--
		}
	}
	return r.live == 0
}

// find returns the context of the stored batch with header h, pinning the entry's base offset.
func (r *traceRing) find(h batch.Header) map[string]string {
	// Newest first: a fetch usually carries the latest appends.
	for i := 1; i <= traceRingSize; i++ {
		e := &r.entries[(r.next-i+traceRingSize)%traceRingSize]
		if e.context == nil || e.base >= 0 && e.base != h.BaseOffset || !e.print.matches(h) {
			continue
		}
		e.base = h.BaseOffset
		return e.context
	}
	return nil
}

// rememberAppend notes the batches of a traced append (pp's records, the append span in span) for the
// followers' fetches. It runs before the batches are queued, on the produce handler's goroutine.
func (b *Broker) rememberAppend(ctx context.Context, a *Append, records []byte, span trace.Span) {
	var prints []batchPrint
	for rest := records; len(rest) >= batch.HeaderSize; {
		h, err := batch.ParseHeader(rest)
		if err != nil {
			break // validation refuses the request; the append fails and forgets nothing it needs
		}
		prints = append(prints, printOf(h))
		rest = rest[h.Size():]
	}
	if len(prints) == 0 {
		return
	}
	carrier := propagation.MapCarrier{}
	b.prop.Inject(trace.ContextWithSpan(ctx, span), carrier)
	if len(carrier) == 0 {
		return // a propagator that writes nothing (OTEL_PROPAGATORS=none): nothing to send
	}
	k := partKey{a.topic, a.partition}
	v, ok := b.rings.Load(k)
	if !ok {
		v, _ = b.rings.LoadOrStore(k, &traceRing{})
	}
	a.ring, a.token = v.(*traceRing), b.tokens.Add(1)
	a.ring.remember(prints, a.token, carrier)
}

// forgetAppend drops the batches of a failed traced append, and the partition's ring when that empties
// it (a request naming a partition that does not exist leaves nothing behind).
func (b *Broker) forgetAppend(a Append) {
	if a.ring.forget(a.token) {
		b.rings.CompareAndDelete(partKey{a.topic, a.partition}, a.ring)
	}
}

// ReplicaTraces returns, for the records of a ReplicaFetch answer of topic-partition (one or more
// batches as the leader's log stores them), the trace context of each batch that a traced produce
// request appended here recently: the leader's append span, which the follower's replicate span
// continues. It returns nil when the broker does not trace (at the cost of a nil check), when the
// partition had no traced appends, or when none of the batches is among them.
func (b *Broker) ReplicaTraces(topic string, partition int32, records []byte) []*runnelv1.BatchTrace {
	if b == nil || b.tracer == nil || len(records) == 0 {
		return nil
	}
	v, ok := b.rings.Load(partKey{topic, partition})
	if !ok {
		return nil
	}
	r := v.(*traceRing)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.live == 0 {
		return nil
	}
	var out []*runnelv1.BatchTrace
	for rest := records; len(rest) >= batch.HeaderSize; {
		h, err := batch.ParseHeader(rest)
		if err != nil {
			break
		}
		if c := r.find(h); c != nil {
			out = append(out, &runnelv1.BatchTrace{BaseOffset: h.BaseOffset, TraceContext: c})
		}
		rest = rest[h.Size():]
	}
	return out
}

// DurableLog is what a follower's replicate spans watch to end: the log's durable end (an offset) and
// a channel closed when it may have moved. broker/plog.Partition is one.
type DurableLog interface {
	DurableEnd() int64
	Changed() <-chan struct{}
}

// Replicate is a follower's spans for the traced batches of one ReplicaFetch answer it appends: one
// "replicate <topic>" span per batch (kind consumer: the follower pulled it), the child of the
// leader's append span. A nil *Replicate (nothing traced, or tracing off) is valid and does nothing.
type Replicate struct {
	spans []replicateSpan
}

type replicateSpan struct {
	span trace.Span
	end  int64 // the batch's next offset: durable once the log's durable end reaches it
}

// StartReplicate starts the replicate spans of the batches in records (what follower appends of the
// answer of leader for topic-partition) that traces (the answer's batch_traces) names. It returns nil
// at the cost of a nil check when the broker does not trace or traces is empty. End them with
// Appended, then Durable.
func (b *Broker) StartReplicate(topic string, partition, leader, follower int32, traces []*runnelv1.BatchTrace, records []byte) *Replicate {
	if b == nil || b.tracer == nil || len(traces) == 0 || len(records) == 0 {
		return nil
	}
	var rs *Replicate
	for rest := records; len(rest) >= batch.HeaderSize; {
		h, err := batch.ParseHeader(rest)
		if err != nil {
			break // the append refuses the answer; its error ends the spans started so far
		}
		rest = rest[h.Size():]
		var tc map[string]string
		for _, t := range traces {
			if t.GetBaseOffset() == h.BaseOffset {
				tc = t.GetTraceContext()
				break
			}
		}
		if len(tc) == 0 {
			continue
		}
		ctx := b.prop.Extract(context.Background(), propagation.MapCarrier(tc))
		if !trace.SpanContextFromContext(ctx).IsValid() {
			continue
		}
		_, span := b.tracer.Start(ctx, OpReplicate+" "+topic, trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(semconv.MessagingSystemKey.String(SystemName), semconv.MessagingOperationName(OpReplicate),
				AttrTopic.String(topic), AttrPartition.String(partitionID(partition)), AttrBaseOffset.Int64(h.BaseOffset),
				semconv.MessagingBatchMessageCount(int(h.RecordCount)), AttrBatchBytes.Int(h.Size()),
				AttrLeader.Int(int(leader)), AttrFollower.Int(int(follower))))
		if !span.IsRecording() {
			span.End()
			continue
		}
		if rs == nil {
			rs = &Replicate{}
		}
		rs.spans = append(rs.spans, replicateSpan{span: span, end: h.NextOffset()})
	}
	return rs
}

// Appended records the outcome of the follower's append of the batches. On failure every span ends
// with err and Appended returns false; on success it ends the spans of the batches that are durable in
// log already and reports whether all are (Durable must then wait for the others).
func (rs *Replicate) Appended(log DurableLog, err error) (allDurable bool) {
	if rs == nil {
		return true
	}
	if err != nil {
		for _, s := range rs.spans {
			setError(s.span, err)
			s.span.End()
		}
		rs.spans = nil
		return true
	}
	rs.endDurable(log.DurableEnd())
	return len(rs.spans) == 0
}

// endDurable ends the spans of the batches below durable.
func (rs *Replicate) endDurable(durable int64) {
	kept := rs.spans[:0]
	for _, s := range rs.spans {
		if s.end <= durable {
			s.span.AddEvent("durable")
			s.span.End()
			continue
		}
		kept = append(kept, s)
	}
	rs.spans = kept
}

// Durable waits until the batches are durable in log (the follower's group commit fsynced them) and
// ends their spans, each when its batch got there. It returns when all are ended: durable, stop closed
// (the broker stops; the spans end marked as not seen durable) or after replicateTimeout (an error:
// the log was truncated under the batch, or the store stalled). Run it on a goroutine the caller owns,
// after Appended returned false.
func (rs *Replicate) Durable(stop <-chan struct{}, log DurableLog) {
	if rs == nil {
		return
	}
	timeout := time.NewTimer(replicateTimeout)
	defer timeout.Stop()
	for len(rs.spans) > 0 {
		ch := log.Changed()
		rs.endDurable(log.DurableEnd())
		if len(rs.spans) == 0 {
			return
		}
		select {
		case <-ch:
		case <-stop:
			rs.fail(errReplicateStopped, "stopped before the batch was durable")
			return
		case <-timeout.C:
			rs.fail(errReplicateTimeout, "not durable within "+replicateTimeout.String())
			return
		}
	}
}

var (
	errReplicateTimeout = errors.New("replicated batch not durable in time")
	errReplicateStopped = errors.New("broker stopped before the replicated batch was durable")
)

func (rs *Replicate) fail(err error, msg string) {
	for _, s := range rs.spans {
		s.span.RecordError(err)
		s.span.SetStatus(codes.Error, msg)
		s.span.End()
	}
	rs.spans = nil
}
