package telemetry

import (
	"context"
	"math"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9*math.Max(1, math.Abs(b)) }

// TestRateRing drives the per-minute ring through minutes: counts land in their minute, old minutes are
// reset when their slot is reused, and the rates weight the oldest minute by its overlap.
func TestRateRing(t *testing.T) {
	var r rateRing
	const m0 = 1_000_000 * minuteMs // a minute boundary
	start := int64(m0 - 10*minuteMs)
	r.add(m0+1000, 600, 6)            // minute 0
	r.add(m0+minuteMs+5000, 1200, 12) // minute 1
	r.add(m0+minuteMs+9000, 1200, 12) // minute 1
	now := int64(m0 + minuteMs + 15_000)
	bytes, records := r.perMinute(now)
	if bytes != [rateSlots]int64{2400, 600, 0, 0, 0, 0} || records != [rateSlots]int64{24, 6, 0, 0, 0, 0} {
		t.Fatalf("per minute %v %v", bytes, records)
	}
	// 15 s into minute 1: the last minute is minute 1 (2400) and 3/4 of minute 0 (450).
	if got, want := windowRate(bytes, now, start, 1), (2400+600*0.75)/60; !near(got, want) {
		t.Fatalf("1m rate %v, want %v", got, want)
	}
	if got, want := windowRate(bytes, now, start, 5), 3000.0/300; !near(got, want) {
		t.Fatalf("5m rate %v, want %v", got, want)
	}
	// Six minutes later minute 1's slot is reused: old counts do not leak into the new minute.
	later := int64(m0 + 7*minuteMs + 1000)
	r.add(later, 60, 1)
	bytes, _ = r.perMinute(later)
	if bytes != [rateSlots]int64{60, 0, 0, 0, 0, 0} {
		t.Fatalf("after six minutes %v", bytes)
	}
	// Right after the start, rates divide by the time since the start, at least a second.
	var fresh rateRing
	fresh.add(m0+500, 1000, 10)
	b2, rc2 := fresh.perMinute(m0 + 20_000)
	if got := windowRate(b2, m0+20_000, m0, 5); !near(got, 1000.0/20) {
		t.Fatalf("rate 20 s after start %v", got)
	}
	if got := windowRate(rc2, m0+200, m0, 1); !near(got, 10) {
		t.Fatalf("rate 200 ms after start %v (one-second floor)", got)
	}
	st := fresh.stats(m0+20_000, m0, 1000, 10)
	if st.WindowMs != 20_000 || len(st.BytesInPerMinute) != rateSlots || st.BytesInTotal != 1000 || !near(st.LastMinute.RecordsInPerSec, 0.5) {
		t.Fatalf("stats %v", st)
	}
}

// testBroker returns a Broker recording into a manual reader and an in-memory span exporter.
func testBroker(t *testing.T) (*Broker, *sdkmetric.ManualReader, *tracetest.InMemoryExporter, *sdktrace.TracerProvider) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { mp.Shutdown(context.Background()); tp.Shutdown(context.Background()) })
	b, err := NewBroker(WithMeterProvider(mp), WithTracerProvider(tp), WithPropagator(propagation.TraceContext{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, reader, exp, tp
}

// collect returns every data point of the reader as name → "attr=value,..." → value (sums and gauges
// as int64, histograms as their count).
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]int64{}
	key := func(s attribute.Set) string {
		k := ""
		for _, kv := range s.ToSlice() {
			k += string(kv.Key) + "=" + kv.Value.Emit() + ","
		}
		return k
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			pts := map[string]int64{}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					pts[key(p.Attributes)] = p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					pts[key(p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					pts[key(p.Attributes)] = int64(p.Count)
				}
			}
			out[m.Name] = pts
		}
	}
	return out
}

func records(n int, size int) []byte {
	var b batch.Builder
	for i := 0; i < n; i++ {
		b.Append(1, nil, make([]byte, size), nil)
	}
	return append([]byte(nil), b.Build(batch.CompressionNone)...)
}

// TestBrokerPartitionCounters: appends count in only when they succeed, fetches count out, made-up
// topics create no series, ForgetTopic drops a topic's series, and rates follow the appends.
func TestBrokerPartitionCounters(t *testing.T) {
	b, reader, _, _ := testBroker(t)
	two := append(records(3, 10), records(2, 10)...) // two batches: 5 records
	pp := &runnelv1.ProducePartition{Topic: "orders", Partition: 1, Records: two}
	b.StartAppend(context.Background(), pp).Done(0, nil)
	b.StartAppend(context.Background(), pp).Done(5, nil)
	b.StartAppend(context.Background(), &runnelv1.ProducePartition{Topic: "nope", Partition: 0, Records: two}).
		Done(-1, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "no"))
	b.ProduceDone(time.Now(), runnelv1.Acks_ACKS_ALL, &runnelv1.ProduceResponse{Partitions: []*runnelv1.ProducePartitionResult{{}}})
	req := &runnelv1.FetchRequest{Partitions: []*runnelv1.FetchPartition{{Topic: "orders", Partition: 1}}}
	b.FetchDone(context.Background(), time.Now(), req, &runnelv1.FetchResponse{Partitions: []*runnelv1.FetchPartitionResult{{Topic: "orders", Partition: 1, Records: records(3, 10)}}}, nil)

	got := collect(t, reader)
	k := "messaging.destination.name=orders,messaging.destination.partition.id=1,"
	want := map[string]int64{MetricBytesIn: 2 * int64(len(two)), MetricRecordsIn: 10, MetricBytesOut: int64(len(records(3, 10))), MetricRecordsOut: 3}
	for name, v := range want {
		if got[name][k] != v || len(got[name]) != 1 {
			t.Errorf("%s = %v, want {%s: %d}", name, got[name], k, v)
		}
	}
	if got[MetricProduceDuration]["runnel.acks=all,"] != 1 || got[MetricFetchDuration][""] != 1 {
		t.Errorf("latency histograms %v %v", got[MetricProduceDuration], got[MetricFetchDuration])
	}
	if st := b.PartitionStats("orders", 1, true); st.RecordsInTotal != 10 || st.BytesInPerMinute[0] != 2*int64(len(two)) {
		t.Errorf("stats %v", st)
	}
	if b.PartitionStats("orders", 1, false) != nil {
		t.Error("stats without include_stats")
	}
	if st := b.PartitionStats("orders", 0, true); st == nil || st.RecordsInTotal != 0 {
		t.Errorf("stats of an idle partition %v", st)
	}
	b.ForgetTopic("orders")
	if got := collect(t, reader); len(got[MetricBytesIn]) != 0 {
		t.Errorf("series after ForgetTopic: %v", got[MetricBytesIn])
	}
}

// TestBrokerAppendSpan: an append continues the producer's trace from ProducePartition.trace_context
// (stream requests), from ctx (unary), and starts nothing without either.
func TestBrokerAppendSpan(t *testing.T) {
	b, _, exp, tp := testBroker(t)
	prodCtx, prod := tp.Tracer("test").Start(context.Background(), "send")
	tc := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(prodCtx, tc)
	pp := &runnelv1.ProducePartition{Topic: "t", Partition: 2, Records: records(4, 1), TraceContext: tc}
	b.StartAppend(context.Background(), pp).Done(40, nil)
	b.StartAppend(prodCtx, &runnelv1.ProducePartition{Topic: "t", Partition: 2, Records: records(1, 1)}).Done(44, nil)
	b.StartAppend(context.Background(), &runnelv1.ProducePartition{Topic: "t", Partition: 2, Records: records(1, 1)}).Done(45, nil)
	prod.End()
	spans := exp.GetSpans()
	var appends []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == "append t" {
			appends = append(appends, s)
		}
	}
	if len(appends) != 2 {
		t.Fatalf("append spans %d of %d", len(appends), len(spans))
	}
	if appends[0].Parent.SpanID() != prod.SpanContext().SpanID() || appends[0].SpanKind != trace.SpanKindServer || !appends[0].Parent.IsRemote() {
		t.Fatalf("append from trace_context: parent %v kind %v", appends[0].Parent, appends[0].SpanKind)
	}
	if appends[1].Parent.SpanID() != prod.SpanContext().SpanID() || appends[1].SpanKind != trace.SpanKindInternal {
		t.Fatalf("append from ctx: parent %v kind %v", appends[1].Parent, appends[1].SpanKind)
	}
	for _, a := range appends[0].Attributes {
		switch a.Key {
		case AttrBaseOffset:
			if a.Value.AsInt64() != 40 {
				t.Errorf("base offset %v", a.Value)
			}
		case "messaging.batch.message_count":
			if a.Value.AsInt64() != 4 {
				t.Errorf("records %v", a.Value)
			}
		}
	}
}

// TestBrokerGroups: epoch bumps count as rebalances, from the loaded epoch for loaded groups and from 0
// for new ones; a rebalance's duration runs from the first bump of a settled group to settled again.
func TestBrokerGroups(t *testing.T) {
	b, reader, _, _ := testBroker(t)
	t0 := time.Unix(1000, 0)
	b.GroupLoaded("old", 7, true, t0)
	b.GroupObserved("old", 7, true, t0.Add(time.Second)) // no change
	b.GroupObserved("old", 8, false, t0.Add(2*time.Second))
	b.GroupObserved("old", 9, false, t0.Add(3*time.Second))
	b.GroupObserved("old", 9, true, t0.Add(5*time.Second)) // one rebalance of 3 s, two bumps
	b.GroupObserved("new", 1, true, t0)                    // created and settled at once
	b.GroupDeleted("new")
	b.GroupObserved("new", 1, true, t0) // created again
	got := collect(t, reader)
	if got[MetricRebalances]["messaging.consumer.group.name=old,"] != 2 || got[MetricRebalances]["messaging.consumer.group.name=new,"] != 2 {
		t.Fatalf("rebalances %v", got[MetricRebalances])
	}
	if got[MetricRebalanceDuration]["messaging.consumer.group.name=old,"] != 1 || got[MetricRebalanceDuration]["messaging.consumer.group.name=new,"] != 2 {
		t.Fatalf("rebalance durations %v", got[MetricRebalanceDuration])
	}
	// Groups and lags come from the coordinator's report at collection; a tracked group missing from it
	// (expired) is forgotten.
	b.ObserveGroups(func(o GroupObserver) {
		o.Group("old", 3)
		o.Lag("old", "t", 0, 12)
		o.Lag("old", "t", 1, -1) // committed past the HW: 0
	})
	got = collect(t, reader)
	if got[MetricGroupMembers]["messaging.consumer.group.name=old,"] != 3 {
		t.Fatalf("members %v", got[MetricGroupMembers])
	}
	lag := got[MetricConsumerLag]
	if lag["messaging.consumer.group.name=old,messaging.destination.name=t,messaging.destination.partition.id=0,"] != 12 ||
		lag["messaging.consumer.group.name=old,messaging.destination.name=t,messaging.destination.partition.id=1,"] != 0 || len(lag) != 2 {
		t.Fatalf("lag %v", lag)
	}
	b.groups.mu.Lock()
	_, kept := b.groups.m["new"]
	b.groups.mu.Unlock()
	if kept {
		t.Fatal("a group the coordinator no longer reports is still tracked")
	}
}

// TestNilBroker: a nil Broker is the uninstrumented broker.
func TestNilBroker(t *testing.T) {
	var b *Broker
	a := b.StartAppend(context.Background(), &runnelv1.ProducePartition{Topic: "t", Records: records(1, 1)})
	a.Done(0, nil)
	b.ProduceDone(time.Now(), runnelv1.Acks_ACKS_ALL, &runnelv1.ProduceResponse{})
	b.FetchDone(context.Background(), time.Now(), nil, nil, nil)
	b.GroupObserved("g", 1, true, time.Now())
	b.GroupLoaded("g", 1, true, time.Now())
	b.GroupDeleted("g")
	b.ObserveGroups(nil)
	b.ObserveStorage(nil)
	b.ForgetTopic("t")
	if b.PartitionStats("t", 0, true) != nil || b.Tracing() || b.Close() != nil {
		t.Fatal("nil broker did something")
	}
}

// BenchmarkAppendObserved is the per-partition cost a produce pays for metrics and rates with tracing
// off: the header walk, the counters and the rate ring.
func BenchmarkAppendObserved(b *testing.B) {
	br, err := NewBroker(WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))))
	if err != nil {
		b.Fatal(err)
	}
	pp := &runnelv1.ProducePartition{Topic: "orders", Partition: 3, Records: records(100, 100)}
	b.ReportAllocs()
	for b.Loop() {
		br.StartAppend(context.Background(), pp).Done(0, nil)
	}
}

// BenchmarkProduceDone is the per-request cost of the produce latency histogram.
func BenchmarkProduceDone(b *testing.B) {
	br, err := NewBroker(WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))))
	if err != nil {
		b.Fatal(err)
	}
	resp := &runnelv1.ProduceResponse{Partitions: []*runnelv1.ProducePartitionResult{{}}}
	start := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		br.ProduceDone(start, runnelv1.Acks_ACKS_ALL, resp)
	}
}

// TestFetchErrorType: a fetch refused as a whole records its latency with the catalogue code, read
// from the gRPC status the handler returns.
func TestFetchErrorType(t *testing.T) {
	b, reader, _, _ := testBroker(t)
	err := rerr.ToStatus(rerr.New(runnelv1.ErrorCode_INVALID_FETCH_SIZE, "negative"))
	b.FetchDone(context.Background(), time.Now(), &runnelv1.FetchRequest{}, nil, err)
	if got := collect(t, reader)[MetricFetchDuration]; got["error.type=INVALID_FETCH_SIZE,"] != 1 {
		t.Fatalf("fetch latency points %v", got)
	}
}
