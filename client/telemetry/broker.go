package telemetry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
)

// Broker is the instrumentation of a broker: the metrics of names.go, the broker's spans, and the
// per-partition produce rates behind DescribeTopics' stats. The broker's handlers call it at one line
// each (broker/produce.go, fetch.go, groups.go; replication: replica_rpc.go and fetcher.go,
// replication.go here; transactions: txns.go, txns.go here); later parts (functions, connectors) add
// their calls the same way.
//
// Per-partition byte and record counts are plain atomic counters, read by observable instruments when
// metrics are collected, so the produce and fetch paths never build attribute sets nor call the metric
// SDK per partition; a deleted topic's series disappear with ForgetTopic.
//
// A nil *Broker is valid: every method returns at once and DescribeTopics gets no stats. That is the
// uninstrumented baseline the benchmarks compare with.
type Broker struct {
	tracer  trace.Tracer // nil: tracing off
	prop    propagation.TextMapPropagator
	startMs int64 // when counting began (Unix ms), the start of the rate windows

	produceDur   metric.Float64Histogram
	fetchDur     metric.Float64Histogram
	rebalances   metric.Int64Counter
	rebalanceDur metric.Float64Histogram
	isrShrinks   metric.Int64Counter
	isrExpands   metric.Int64Counter
	acksOpts     map[runnelv1.Acks]metric.MeasurementOption
	noAttrs      metric.MeasurementOption

	bytesIn, recordsIn, bytesOut, recordsOut metric.Int64ObservableCounter
	lag, members, lsmSize, vlogSize          metric.Int64ObservableGauge
	leaders, underReplicated, offline        metric.Int64ObservableGauge
	followerLag                              metric.Int64ObservableGauge
	txns                                     txnMetrics // txns.go
	gcRuns                                   metric.Int64ObservableCounter
	gcOpts                                   [3]metric.ObserveOption // rewritten, nothing, error
	reg                                      metric.Registration

	parts  sync.Map // partKey → *partStats
	groups groupTracker
	rings  sync.Map      // partKey → *traceRing: recent traced appends, for the followers (replication.go)
	tokens atomic.Uint64 // numbers traced appends in their ring

	groupSrc   atomic.Pointer[func(GroupObserver)]
	storageSrc atomic.Pointer[func() StorageStats]
	replicaSrc atomic.Pointer[func() ReplicaStats]
}

// partKey names one topic-partition.
type partKey struct {
	topic     string
	partition int32
}

// partStats are one partition's counters since the broker started.
type partStats struct {
	attrs                                    metric.MeasurementOption // topic and partition
	bytesIn, recordsIn, bytesOut, recordsOut atomic.Int64
	rates                                    rateRing
}

// NewBroker returns the broker's instrumentation. Without WithMeterProvider metrics go nowhere; without
// WithTracerProvider the broker starts no spans at all (not even no-op ones). Close unregisters its
// metric callbacks.
func NewBroker(opts ...Option) (*Broker, error) {
	o := buildOptions(opts)
	b := &Broker{prop: o.prop, startMs: nowMs()}
	if o.tp != nil {
		b.tracer = o.tp.Tracer(ScopeName)
	}
	mp := o.mp
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	m := mp.Meter(ScopeName)
	errs := make([]error, 0, 16)
	add := func(err error) { errs = append(errs, err) }
	var err error
	b.produceDur, err = m.Float64Histogram(MetricProduceDuration, metric.WithUnit("s"),
		metric.WithDescription("Time from a produce request's arrival to its answer."), metric.WithExplicitBucketBoundaries(latencyBuckets...))
	add(err)
	b.fetchDur, err = m.Float64Histogram(MetricFetchDuration, metric.WithUnit("s"),
		metric.WithDescription("Time from a fetch request's arrival to its answer, long-poll wait included."), metric.WithExplicitBucketBoundaries(latencyBuckets...))
	add(err)
	b.rebalances, err = m.Int64Counter(MetricRebalances, metric.WithUnit("{rebalance}"),
		metric.WithDescription("Group epoch bumps: changes of membership, subscriptions, subscribed topics or assignor."))
	add(err)
	b.rebalanceDur, err = m.Float64Histogram(MetricRebalanceDuration, metric.WithUnit("s"),
		metric.WithDescription("Time from a settled group's epoch bump until every member owns its target again."), metric.WithExplicitBucketBoundaries(rebalanceBuckets...))
	add(err)
	b.isrShrinks, err = m.Int64Counter(MetricISRShrinks, metric.WithUnit("{change}"),
		metric.WithDescription("ISR shrinks made by this broker as leader: a follower did not catch up within replica.lag.time.max.ms."))
	add(err)
	b.isrExpands, err = m.Int64Counter(MetricISRExpands, metric.WithUnit("{change}"),
		metric.WithDescription("ISR expands made by this broker as leader: a follower caught up again."))
	add(err)
	b.bytesIn, err = m.Int64ObservableCounter(MetricBytesIn, metric.WithUnit("By"), metric.WithDescription("Bytes of record batches appended to the partition."))
	add(err)
	b.recordsIn, err = m.Int64ObservableCounter(MetricRecordsIn, metric.WithUnit("{record}"), metric.WithDescription("Records appended to the partition."))
	add(err)
	b.bytesOut, err = m.Int64ObservableCounter(MetricBytesOut, metric.WithUnit("By"), metric.WithDescription("Bytes of record batches fetched from the partition."))
	add(err)
	b.recordsOut, err = m.Int64ObservableCounter(MetricRecordsOut, metric.WithUnit("{record}"), metric.WithDescription("Records of the batches fetched from the partition."))
	add(err)
	b.lag, err = m.Int64ObservableGauge(MetricConsumerLag, metric.WithUnit("{record}"), metric.WithDescription("High watermark minus the group's committed offset."))
	add(err)
	b.members, err = m.Int64ObservableGauge(MetricGroupMembers, metric.WithUnit("{member}"), metric.WithDescription("Members of the consumer group."))
	add(err)
	b.leaders, err = m.Int64ObservableGauge(MetricLeaderPartitions, metric.WithUnit("{partition}"), metric.WithDescription("Partitions this broker leads."))
	add(err)
	b.underReplicated, err = m.Int64ObservableGauge(MetricUnderReplicated, metric.WithUnit("{partition}"),
		metric.WithDescription("Partitions this broker leads whose ISR is shorter than their replica list."))
	add(err)
	b.offline, err = m.Int64ObservableGauge(MetricOfflinePartitions, metric.WithUnit("{partition}"),
		metric.WithDescription("Partitions without a leader, reported by the controller leader only (0 elsewhere)."))
	add(err)
	b.followerLag, err = m.Int64ObservableGauge(MetricFollowerLag, metric.WithUnit("{record}"),
		metric.WithDescription("Offsets a follower is behind its leader's log end, on the leader."))
	add(err)
	b.lsmSize, err = m.Int64ObservableGauge(MetricLSMSize, metric.WithUnit("By"), metric.WithDescription("Size of Badger's LSM tree files (.sst)."))
	add(err)
	b.vlogSize, err = m.Int64ObservableGauge(MetricVlogSize, metric.WithUnit("By"), metric.WithDescription("Size of Badger's value-log files (.vlog)."))
	add(err)
	b.gcRuns, err = m.Int64ObservableCounter(MetricVlogGCRuns, metric.WithUnit("{run}"), metric.WithDescription("Value-log GC passes by result."))
	add(err)
	add(b.txns.init(m))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	b.acksOpts = map[runnelv1.Acks]metric.MeasurementOption{
		runnelv1.Acks_ACKS_ALL:    metric.WithAttributeSet(attribute.NewSet(AttrAcks.String("all"))),
		runnelv1.Acks_ACKS_LEADER: metric.WithAttributeSet(attribute.NewSet(AttrAcks.String("leader"))),
		runnelv1.Acks_ACKS_NONE:   metric.WithAttributeSet(attribute.NewSet(AttrAcks.String("none"))),
	}
	b.noAttrs = metric.WithAttributeSet(*attribute.EmptySet())
	for i, r := range []string{"rewritten", "nothing", "error"} {
		b.gcOpts[i] = metric.WithAttributeSet(attribute.NewSet(AttrGCResult.String(r)))
	}
	b.reg, err = m.RegisterCallback(b.observe, b.bytesIn, b.recordsIn, b.bytesOut, b.recordsOut, b.lag, b.members,
		b.lsmSize, b.vlogSize, b.gcRuns, b.leaders, b.underReplicated, b.offline, b.followerLag, b.txns.open)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Close unregisters the metric callbacks; recording afterwards is harmless.
func (b *Broker) Close() error {
	if b == nil {
		return nil
	}
	return b.reg.Unregister()
}

// Tracing reports whether the broker starts spans.
func (b *Broker) Tracing() bool { return b != nil && b.tracer != nil }

// part returns the counters of topic-partition, creating them. Only partitions that exist are passed
// (after a successful append or read), so requests naming made-up topics create nothing.
func (b *Broker) part(topic string, partition int32) *partStats {
	k := partKey{topic, partition}
	if p, ok := b.parts.Load(k); ok {
		return p.(*partStats)
	}
	p := &partStats{attrs: metric.WithAttributeSet(attribute.NewSet(AttrTopic.String(topic), AttrPartition.String(partitionID(partition))))}
	actual, _ := b.parts.LoadOrStore(k, p)
	return actual.(*partStats)
}

// ForgetTopic drops the counters of every partition of topic, when it is deleted: its series leave
// /metrics, and a topic created again under the name starts from zero. The traced appends remembered
// for followers go too.
func (b *Broker) ForgetTopic(topic string) {
	if b == nil {
		return
	}
	for _, m := range []*sync.Map{&b.parts, &b.rings} {
		m.Range(func(k, _ any) bool {
			if k.(partKey).topic == topic {
				m.Delete(k)
			}
			return true
		})
	}
}

// Append observes one partition of a produce request, from StartAppend to Done. It is a value, so
// observing costs no allocation; the zero Append (from a nil Broker) does nothing.
type Append struct {
	b              *Broker
	part           *partStats // found by StartAppend; nil for a partition not seen yet
	topic          string
	partition      int32
	bytes, records int64
	atMs           int64      // when the request came, for the rate minute
	span           trace.Span // nil when not traced
	ring           *traceRing // where the traced append's batches are remembered for the followers
	token          uint64     // their number in ring
}

// StartAppend begins observing the append of pp's batches, before the broker validates and enqueues
// them. It counts the records from the batch headers (the broker never decodes records), and, with
// tracing on, starts an "append <topic>" span when there is a trace to continue: pp.TraceContext when
// set (the producer's batch span, which is how requests on a ProduceStream carry it), else ctx's span
// (unary Produce, continued by otelgrpc from gRPC metadata). Requests without either start no span, so
// the broker never makes root spans per produce. Done must follow.
func (b *Broker) StartAppend(ctx context.Context, pp *runnelv1.ProducePartition) Append {
	if b == nil {
		return Append{}
	}
	a := Append{b: b, topic: pp.Topic, partition: pp.Partition, bytes: int64(len(pp.Records)), records: countRecords(pp.Records), atMs: nowMs()}
	// The look-up happens here, on the handler's goroutine, and only finds: Done runs on a fresh
	// goroutine of the store for every append, where the hashing would grow its stack (a copy per
	// append), and a partition is created only once an append to it succeeded.
	if p, ok := b.parts.Load(partKey{pp.Topic, pp.Partition}); ok {
		a.part = p.(*partStats)
	}
	if b.tracer == nil {
		return a
	}
	kind := trace.SpanKindInternal
	if len(pp.TraceContext) > 0 {
		ctx = b.prop.Extract(ctx, propagation.MapCarrier(pp.TraceContext))
		kind = trace.SpanKindServer // continued from the producer, across the network
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return a
	}
	_, span := b.tracer.Start(ctx, OpAppend+" "+pp.Topic, trace.WithSpanKind(kind),
		trace.WithAttributes(semconv.MessagingSystemKey.String(SystemName), semconv.MessagingOperationName(OpAppend),
			AttrTopic.String(pp.Topic), AttrPartition.String(partitionID(pp.Partition)),
			AttrBatchBytes.Int64(a.bytes), semconv.MessagingBatchMessageCount(int(a.records))))
	if span.IsRecording() {
		a.span = span
		b.rememberAppend(ctx, &a, pp.Records, span)
	} else {
		span.End()
	}
	return a
}

// Done ends the observation with the append's outcome: on success the partition's bytes and records
// in (metrics and rates) grow, and the span gets the base offset; on failure the span gets the error.
func (a Append) Done(baseOffset int64, err error) {
	if a.b == nil {
		return
	}
	if err == nil {
		p := a.part
		if p == nil {
			p = a.b.part(a.topic, a.partition) // the partition's first append
		}
		p.bytesIn.Add(a.bytes)
		p.recordsIn.Add(a.records)
		p.rates.add(a.atMs, a.bytes, a.records)
	}
	if a.span != nil {
		if err == nil {
			a.span.SetAttributes(AttrBaseOffset.Int64(baseOffset))
		}
		setError(a.span, err)
		a.span.End()
	}
	if err != nil && a.ring != nil {
		a.b.forgetAppend(a)
	}
}

// ProduceDone records a produce request's latency from start to its answer (resp, nil for acks=none,
// which is answered once enqueued), with its acks and, when a partition failed, the first failure's
// code as error.type. Call it on the goroutine that answers, not on the store's completion goroutines:
// those are fresh for each append, and the metric SDK's call would grow their stacks every time.
func (b *Broker) ProduceDone(start time.Time, acks runnelv1.Acks, resp *runnelv1.ProduceResponse) {
	if b == nil {
		return
	}
	opt, ok := b.acksOpts[acks]
	if !ok {
		opt = b.noAttrs
	}
	for _, r := range resp.GetPartitions() {
		if r.Error != nil {
			opt = metric.WithAttributes(AttrAcks.String(ackName(acks)), AttrErrorType.String(r.Error.Code.String()))
			break
		}
	}
	b.produceDur.Record(context.Background(), time.Since(start).Seconds(), opt)
}

func ackName(a runnelv1.Acks) string {
	switch a {
	case runnelv1.Acks_ACKS_ALL:
		return "all"
	case runnelv1.Acks_ACKS_LEADER:
		return "leader"
	case runnelv1.Acks_ACKS_NONE:
		return "none"
	}
	return "invalid"
}

// FetchDone records a fetch's answer: the bytes and records out of every partition that returned
// batches, its latency from start, and, when ctx's span records, one "partition" event per partition
// (topic, partition, fetch offset, bytes, records, high watermark). err is the request's error, if the
// whole request failed (resp is then nil).
func (b *Broker) FetchDone(ctx context.Context, start time.Time, req *runnelv1.FetchRequest, resp *runnelv1.FetchResponse, err error) {
	if b == nil {
		return
	}
	span := trace.SpanFromContext(ctx)
	recording := span.IsRecording()
	if resp != nil {
		for i, r := range resp.Partitions {
			var recs int64
			if len(r.Records) > 0 {
				recs = countRecords(r.Records)
				p := b.part(r.Topic, r.Partition)
				p.bytesOut.Add(int64(len(r.Records)))
				p.recordsOut.Add(recs)
			}
			if recording {
				attrs := []attribute.KeyValue{AttrTopic.String(r.Topic), AttrPartition.String(partitionID(r.Partition)),
					AttrBatchBytes.Int(len(r.Records)), semconv.MessagingBatchMessageCount(int(recs)), AttrHighWatermark.Int64(r.HighWatermark)}
				if i < len(req.Partitions) {
					attrs = append(attrs, AttrFetchOffset.Int64(req.Partitions[i].FetchOffset))
				}
				if r.Error != nil {
					attrs = append(attrs, AttrErrorType.String(r.Error.Code.String()))
				}
				span.AddEvent("partition", trace.WithAttributes(attrs...))
			}
		}
	}
	opt := b.noAttrs
	if err != nil {
		opt = metric.WithAttributes(AttrErrorType.String(errorType(err)))
	}
	b.fetchDur.Record(context.Background(), time.Since(start).Seconds(), opt)
}

// PartitionStats returns topic-partition's produce rates for DescribeTopics, or nil for a nil Broker or
// when include is false. A partition nothing was appended to since the start gets zeros.
func (b *Broker) PartitionStats(topic string, partition int32, include bool) *runnelv1.PartitionStats {
	if b == nil || !include {
		return nil
	}
	now := nowMs()
	v, ok := b.parts.Load(partKey{topic, partition})
	if !ok {
		var empty rateRing
		return empty.stats(now, b.startMs, 0, 0)
	}
	p := v.(*partStats)
	return p.rates.stats(now, b.startMs, p.bytesIn.Load(), p.recordsIn.Load())
}

// GroupObserver receives, at metric collection, what the group coordinator knows.
type GroupObserver interface {
	// Group reports a group with membership state and its member count.
	Group(group string, members int)
	// Lag reports the lag of group's committed offset on topic-partition (high watermark minus
	// committed offset, at least 0).
	Lag(group, topic string, partition int32, lag int64)
}

// ObserveGroups sets the function that reports groups and lags at each metric collection (the group
// coordinator's). It runs on the collecting goroutine (a /metrics scrape, an OTLP export) and should
// take no longer than a walk over the committed offsets. nil stops the reports (the coordinator
// closed).
func (b *Broker) ObserveGroups(fn func(GroupObserver)) {
	if b == nil {
		return
	}
	if fn == nil {
		b.groupSrc.Store(nil)
		return
	}
	b.groupSrc.Store(&fn)
}

// StorageStats are the storage numbers observed at metric collection.
type StorageStats struct {
	// LSMBytes and VlogBytes are the sizes of Badger's .sst and .vlog files.
	LSMBytes, VlogBytes int64
	// GCRewritten, GCNothing and GCErrors count value-log GC passes since the start by result.
	GCRewritten, GCNothing, GCErrors int64
}

// ObserveStorage sets the function that reports storage numbers at each metric collection; nil stops
// the reports.
func (b *Broker) ObserveStorage(fn func() StorageStats) {
	if b == nil {
		return
	}
	if fn == nil {
		b.storageSrc.Store(nil)
		return
	}
	b.storageSrc.Store(&fn)
}

// ReplicaStats are the partition-health numbers observed at metric collection.
type ReplicaStats struct {
	// Leaders counts the partitions this broker leads; UnderReplicated those of them whose ISR is
	// shorter than their replica list (Kafka's UnderReplicatedPartitions). Offline counts partitions
	// without a leader, on the controller leader (Kafka's OfflinePartitionsCount), else 0.
	Leaders, UnderReplicated, Offline int64
	// FollowerLags are, for each follower of each partition led here, how far it is behind.
	FollowerLags []FollowerLag
}

// FollowerLag is how many offsets follower is behind the leader's log end of topic-partition.
type FollowerLag struct {
	Topic     string
	Partition int32
	Follower  int32
	Lag       int64
}

// ObserveReplicas sets the function that reports partition health at each metric collection; nil
// stops the reports.
func (b *Broker) ObserveReplicas(fn func() ReplicaStats) {
	if b == nil {
		return
	}
	if fn == nil {
		b.replicaSrc.Store(nil)
		return
	}
	b.replicaSrc.Store(&fn)
}

// observe is the one callback of the observable instruments.
func (b *Broker) observe(_ context.Context, o metric.Observer) error {
	b.parts.Range(func(_, v any) bool {
		p := v.(*partStats)
		o.ObserveInt64(b.bytesIn, p.bytesIn.Load(), p.attrs)
		o.ObserveInt64(b.recordsIn, p.recordsIn.Load(), p.attrs)
		o.ObserveInt64(b.bytesOut, p.bytesOut.Load(), p.attrs)
		o.ObserveInt64(b.recordsOut, p.recordsOut.Load(), p.attrs)
		return true
	})
	if fn := b.storageSrc.Load(); fn != nil {
		s := (*fn)()
		o.ObserveInt64(b.lsmSize, s.LSMBytes)
		o.ObserveInt64(b.vlogSize, s.VlogBytes)
		o.ObserveInt64(b.gcRuns, s.GCRewritten, b.gcOpts[0])
		o.ObserveInt64(b.gcRuns, s.GCNothing, b.gcOpts[1])
		o.ObserveInt64(b.gcRuns, s.GCErrors, b.gcOpts[2])
	}
	if fn := b.replicaSrc.Load(); fn != nil {
		s := (*fn)()
		o.ObserveInt64(b.leaders, s.Leaders)
		o.ObserveInt64(b.underReplicated, s.UnderReplicated)
		o.ObserveInt64(b.offline, s.Offline)
		for _, f := range s.FollowerLags {
			o.ObserveInt64(b.followerLag, f.Lag, metric.WithAttributes(AttrTopic.String(f.Topic),
				AttrPartition.String(partitionID(f.Partition)), AttrFollower.Int(int(f.Follower))))
		}
	}
	b.txns.observe(o)
	if fn := b.groupSrc.Load(); fn != nil {
		start := time.Now()
		gob := &groupObservation{b: b, o: o, seen: map[string]bool{}}
		(*fn)(gob)
		b.groups.retain(gob.seen, start)
	}
	return nil
}

// groupObservation forwards a GroupObserver's reports to the metric observer.
type groupObservation struct {
	b    *Broker
	o    metric.Observer
	seen map[string]bool
}

func (g *groupObservation) Group(group string, members int) {
	g.seen[group] = true
	g.o.ObserveInt64(g.b.members, int64(members), metric.WithAttributes(AttrGroup.String(group)))
}

func (g *groupObservation) Lag(group, topic string, partition int32, lag int64) {
	g.o.ObserveInt64(g.b.lag, max(lag, 0), metric.WithAttributes(AttrGroup.String(group), AttrTopic.String(topic),
		AttrPartition.String(partitionID(partition))))
}

// countRecords sums the record counts of the batch headers in b, up to the first that does not parse
// (validation reports that one; here it only ends the count).
func countRecords(b []byte) int64 {
	var n int64
	for len(b) >= batch.HeaderSize {
		h, err := batch.ParseHeader(b)
		if err != nil {
			break
		}
		n += int64(h.RecordCount)
		b = b[h.Size():]
	}
	return n
}
