package platform_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/client/telemetry"
	"github.com/runnel-io/runnel/platform"
)

// tracedNode is a node whose spans, and those of a client instrumented like the SDK will be, go to
// one in-memory exporter.
type tracedNode struct {
	*testNode
	exp     *tracetest.InMemoryExporter
	tp      *sdktrace.TracerProvider
	tracer  *telemetry.Tracer
	records runnelv1.RecordsClient // over a connection with otelgrpc's client handler
}

func startTracedNode(t *testing.T) *tracedNode {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	tn := startNode(t, t.TempDir(), func(c *platform.Config) { c.Telemetry.TracerProvider = tp })
	prop := propagation.TraceContext{}
	conn, err := grpc.NewClient(tn.node.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(prop))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &tracedNode{testNode: tn, exp: exp, tp: tp, records: runnelv1.NewRecordsClient(conn),
		tracer: telemetry.NewTracer(telemetry.WithTracerProvider(tp), telemetry.WithPropagator(prop))}
}

// span returns the one span with name and kind, waiting for it: server spans end after the client has
// its answer.
func (tn *tracedNode) span(t *testing.T, name string, kind trace.SpanKind) tracetest.SpanStub {
	t.Helper()
	return tn.spanIn(t, name, kind, trace.TraceID{})
}

// spanIn is span within one trace (any trace for the zero id).
func (tn *tracedNode) spanIn(t *testing.T, name string, kind trace.SpanKind, in trace.TraceID) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	waitFor(t, 5*time.Second, func() string {
		found = found[:0]
		var all []string
		for _, s := range tn.exp.GetSpans() {
			all = append(all, s.Name+"/"+s.SpanKind.String())
			if s.Name == name && s.SpanKind == kind && (!in.IsValid() || s.SpanContext.TraceID() == in) {
				found = append(found, s)
			}
		}
		if len(found) != 1 {
			return fmt.Sprintf("%d spans %q of kind %v among %v", len(found), name, kind, all)
		}
		return ""
	})
	return found[0]
}

func attrOf(s tracetest.SpanStub, k attribute.Key) attribute.Value {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value
		}
	}
	return attribute.Value{}
}

func childOf(t *testing.T, child, parent tracetest.SpanStub) {
	t.Helper()
	if child.Parent.SpanID() != parent.SpanContext.SpanID() || child.SpanContext.TraceID() != parent.SpanContext.TraceID() {
		t.Fatalf("span %q (parent %s) is not a child of %q (%s)", child.Name, child.Parent.SpanID(), parent.Name, parent.SpanContext.SpanID())
	}
}

// TestTraceProducerBrokerConsumer: one record produced through raw gRPC with a traceparent header, as
// the SDK will produce it, and consumed with client/telemetry's process span, yields one trace:
// the producer's batch span → the gRPC client span → the broker's server span → its append span, and
// the consumer's process span, a child of the producer's span and linked to it. A second record sent on
// a ProduceStream continues its trace from ProducePartition.trace_context, since a stream's gRPC
// metadata cannot. A traced fetch gets one event per partition.
//
// Single node: the leader is the only broker. TestTraceReplicatedProduceConsume checks the followers'
// spans under the leader's append span on a three-node cluster.
func TestTraceProducerBrokerConsumer(t *testing.T) {
	tn := startTracedNode(t)
	tn.createTopic(t, "orders", 2, nil)
	ctx := ctxT(t)

	// Producer: the batch span, its context in the record's headers, the call made in its context.
	send := tn.tracer.StartSend(ctx, "orders", 1)
	var bb batch.Builder
	bb.Append(1000, []byte("k1"), []byte("v1"), send.Headers([]batch.RecordHeader{{Key: "app", Value: []byte("x")}}))
	recs := append([]byte(nil), bb.Build(batch.CompressionNone)...)
	resp, err := tn.records.Produce(send.ContextWith(ctx), &runnelv1.ProduceRequest{Acks: runnelv1.Acks_ACKS_ALL,
		Partitions: []*runnelv1.ProducePartition{{Topic: "orders", Partition: 1, Records: recs}}})
	if err != nil {
		t.Fatal(err)
	}
	send.End(resp.Partitions[0].BaseOffset, 1, rerr.FromInfo(resp.Partitions[0].Error))

	// Consumer: a raw fetch, the producer's context from the record's headers, a process span.
	fetched, err := tn.fetch(t, "orders", 1, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var msg telemetry.Message
	if err := batch.Split(fetched.Records, func(b []byte, _ batch.Header) error {
		return batch.DecodeRecords(b, func(r batch.Record) error {
			msg = telemetry.Message{Topic: "orders", Partition: 1, Offset: r.Offset, Key: r.Key, Headers: r.Headers}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	_, proc := tn.tracer.StartProcess(context.Background(), "billing", msg)
	proc.End()

	sendSpan := tn.span(t, "send orders", trace.SpanKindProducer)
	client := tn.span(t, "runnel.v1.Records/Produce", trace.SpanKindClient)
	server := tn.span(t, "runnel.v1.Records/Produce", trace.SpanKindServer)
	appendSpan := tn.span(t, "append orders", trace.SpanKindInternal)
	process := tn.span(t, "process orders", trace.SpanKindConsumer)
	childOf(t, client, sendSpan)
	childOf(t, server, client)
	childOf(t, appendSpan, server)
	childOf(t, process, sendSpan)
	if len(process.Links) != 1 || process.Links[0].SpanContext.SpanID() != sendSpan.SpanContext.SpanID() {
		t.Fatalf("process span links %v, want the send span", process.Links)
	}
	if v := attrOf(appendSpan, telemetry.AttrBaseOffset); v.AsInt64() != 0 {
		t.Fatalf("append span base offset %v", v.Emit())
	}
	if v := attrOf(appendSpan, "messaging.batch.message_count"); v.AsInt64() != 1 {
		t.Fatalf("append span record count %v", v.Emit())
	}
	if v := attrOf(appendSpan, telemetry.AttrBatchBytes); v.AsInt64() != int64(len(recs)) {
		t.Fatalf("append span bytes %v, want %d", v.Emit(), len(recs))
	}
	if v := attrOf(appendSpan, telemetry.AttrPartition); v.AsString() != "1" {
		t.Fatalf("append span partition %v", v.Emit())
	}

	// A stream request: no gRPC metadata per request, the context travels in the request.
	send2 := tn.tracer.StartSend(ctx, "orders", 0)
	var bb2 batch.Builder
	bb2.Append(1000, nil, []byte("v2"), send2.Headers(nil))
	stream, err := tn.records.ProduceStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&runnelv1.ProduceRequest{Acks: runnelv1.Acks_ACKS_ALL, Partitions: []*runnelv1.ProducePartition{{Topic: "orders",
		Partition: 0, Records: append([]byte(nil), bb2.Build(batch.CompressionNone)...), TraceContext: send2.TraceContext()}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	stream.CloseSend()
	send2.End(0, 1, nil)
	streamAppend := tn.span(t, "append orders", trace.SpanKindServer)
	if streamAppend.Parent.SpanID() != send2.SpanContext().SpanID() || !streamAppend.Parent.IsRemote() {
		t.Fatalf("stream append span's parent %v, want the remote send span %v", streamAppend.Parent, send2.SpanContext())
	}

	// A traced fetch: the server span has the partition's event.
	pollCtx, poll := tn.tp.Tracer("test").Start(ctx, "poll")
	if _, err := tn.records.Fetch(pollCtx, &runnelv1.FetchRequest{Partitions: []*runnelv1.FetchPartition{{Topic: "orders", Partition: 1}}}); err != nil {
		t.Fatal(err)
	}
	poll.End()
	fetchSpan := tn.spanIn(t, "runnel.v1.Records/Fetch", trace.SpanKindServer, poll.SpanContext().TraceID())
	if len(fetchSpan.Events) != 1 || fetchSpan.Events[0].Name != "partition" {
		t.Fatalf("fetch span events %v", fetchSpan.Events)
	}
	ev := tracetest.SpanStub{Attributes: fetchSpan.Events[0].Attributes}
	if attrOf(ev, telemetry.AttrBatchBytes).AsInt64() != int64(len(recs)) || attrOf(ev, telemetry.AttrHighWatermark).AsInt64() != 1 {
		t.Fatalf("fetch event %v", fetchSpan.Events[0].Attributes)
	}
}

// scrape returns the samples of /metrics whose name is name, by their label string ("{a="x",b="y"}"
// as printed, "" for none).
func scrape(t *testing.T, httpAddr, name string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		rest := line[len(name):]
		labels := ""
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			labels, rest = rest[:end+1], rest[end+1:]
		}
		f := strings.Fields(rest)
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		out[labels] = v
	}
	return out
}

func partLabels(topic string, partition int32) string {
	return fmt.Sprintf(`{messaging_destination_name=%q,messaging_destination_partition_id="%d"}`, topic, partition)
}

// TestMetricsPartitionCounters: after producing N records in batches of known bytes to one partition,
// /metrics shows exactly those amounts in for it, nothing for the others, and after one fetch of
// everything exactly those amounts out; the produce latency histogram counted every request.
func TestMetricsPartitionCounters(t *testing.T) {
	tn := startNode(t, t.TempDir())
	tn.createTopic(t, "orders", 3, nil)
	var wantBytes, wantRecords int
	for i, n := range []int{7, 25, 1, 40} {
		b := makeBatch(fmt.Sprintf("r%d", i), n, 1000, batch.Compression(i%2)) // some gzip-compressed
		if _, err := tn.produce(t, "orders", 2, b, runnelv1.Acks_ACKS_ALL); err != nil {
			t.Fatal(err)
		}
		wantBytes += len(b)
		wantRecords += n
	}
	// Refused requests count nothing: an unknown partition, and a corrupt batch.
	if _, err := tn.produce(t, "orders", 9, makeBatch("x", 3, 1, batch.CompressionNone), runnelv1.Acks_ACKS_ALL); err == nil {
		t.Fatal("produce to a partition that does not exist")
	}
	bad := makeBatch("x", 3, 1, batch.CompressionNone)
	bad[len(bad)-1] ^= 0xff
	if _, err := tn.produce(t, "orders", 2, bad, runnelv1.Acks_ACKS_ALL); err == nil {
		t.Fatal("corrupt batch accepted")
	}
	addr := tn.node.HTTPAddr()
	l := partLabels("orders", 2)
	if got := scrape(t, addr, "runnel_partition_in_bytes_total"); got[l] != float64(wantBytes) || len(got) != 1 {
		t.Fatalf("bytes in %v, want %s %d", got, l, wantBytes)
	}
	if got := scrape(t, addr, "runnel_partition_in_records_total"); got[l] != float64(wantRecords) || len(got) != 1 {
		t.Fatalf("records in %v, want %s %d", got, l, wantRecords)
	}
	if got := scrape(t, addr, "runnel_produce_duration_seconds_count"); got[`{runnel_acks="all"}`] != 4 {
		t.Fatalf("produce latency counts %v, want 4 successful requests with acks=all", got)
	}
	f, err := tn.fetch(t, "orders", 2, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Records) != wantBytes {
		t.Fatalf("fetched %d bytes, want all %d", len(f.Records), wantBytes)
	}
	if got := scrape(t, addr, "runnel_partition_out_bytes_total"); got[l] != float64(wantBytes) {
		t.Fatalf("bytes out %v, want %d", got, wantBytes)
	}
	if got := scrape(t, addr, "runnel_partition_out_records_total"); got[l] != float64(wantRecords) {
		t.Fatalf("records out %v, want %d", got, wantRecords)
	}
	if got := scrape(t, addr, "runnel_fetch_duration_seconds_count"); got[""] != 1 {
		t.Fatalf("fetch latency count %v", got)
	}
	if got := scrape(t, addr, "runnel_storage_vlog_size_bytes"); got[""] <= 0 {
		t.Fatalf("vlog size %v", got)
	}
	// A deleted topic's series go away.
	if _, err := tn.admin.DeleteTopics(ctxT(t), &runnelv1.DeleteTopicsRequest{Topics: []string{"orders"}}); err != nil {
		t.Fatal(err)
	}
	if got := scrape(t, addr, "runnel_partition_in_bytes_total"); len(got) != 0 {
		t.Fatalf("series of a deleted topic: %v", got)
	}
}

// TestMetricsConsumerLag drives a group through the raw Groups API: the lag of its partition is the high
// watermark minus the committed offset, before and after each commit and as the log grows; members and
// rebalances show the join.
func TestMetricsConsumerLag(t *testing.T) {
	tn := startNode(t, t.TempDir())
	tn.createTopic(t, "orders", 1, nil)
	produce := func(n int) {
		if _, err := tn.produce(t, "orders", 0, makeBatch("o", n, 1000, batch.CompressionNone), runnelv1.Acks_ACKS_ALL); err != nil {
			t.Fatal(err)
		}
	}
	produce(10)
	g := tn.groups()
	m := joinStable(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "billing", SubscribedTopicNames: []string{"orders"}})
	if m.Assignment == nil || len(m.Assignment.Partitions) != 1 {
		t.Fatalf("join: %v", m)
	}
	addr := tn.node.HTTPAddr()
	lagLabel := `{messaging_consumer_group_name="billing",messaging_destination_name="orders",messaging_destination_partition_id="0"}`
	lag := func() (float64, bool) {
		v, ok := scrape(t, addr, "runnel_consumer_lag")[lagLabel]
		return v, ok
	}
	if v, ok := lag(); ok {
		t.Fatalf("lag %v before any commit: want no series (nothing committed)", v)
	}
	commit := func(off int64) {
		t.Helper()
		resp, err := g.CommitOffsets(ctxT(t), &runnelv1.CommitOffsetsRequest{GroupId: "billing", MemberId: m.MemberId, MemberEpoch: m.MemberEpoch,
			Partitions: []*runnelv1.CommitPartition{{Topic: "orders", Partition: 0, Offset: off, LeaderEpoch: -1}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := rerr.FromInfo(resp.Partitions[0].Error); err != nil {
			t.Fatal(err)
		}
	}
	commit(4)
	if v, ok := lag(); !ok || v != 6 {
		t.Fatalf("lag after committing 4 of 10: %v %v, want 6", v, ok)
	}
	produce(5)
	if v, _ := lag(); v != 11 {
		t.Fatalf("lag after 5 more records: %v, want 11", v)
	}
	commit(15)
	if v, _ := lag(); v != 0 {
		t.Fatalf("lag after committing everything: %v, want 0", v)
	}
	groupLabel := `{messaging_consumer_group_name="billing"}`
	if v := scrape(t, addr, "runnel_group_members")[groupLabel]; v != 1 {
		t.Fatalf("members %v", v)
	}
	if v := scrape(t, addr, "runnel_group_rebalances_total")[groupLabel]; v != 1 {
		t.Fatalf("rebalances %v, want 1 (the join)", v)
	}
	if v := scrape(t, addr, "runnel_group_rebalance_duration_seconds_count")[groupLabel]; v != 1 {
		t.Fatalf("rebalance durations %v, want 1", v)
	}
	// The member leaves: a second rebalance, settled at once (empty group).
	if _, err := hb(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "billing", MemberId: m.MemberId, MemberEpoch: -1}); err != nil {
		t.Fatal(err)
	}
	if v := scrape(t, addr, "runnel_group_rebalances_total")[groupLabel]; v != 2 {
		t.Fatalf("rebalances after the leave %v, want 2", v)
	}
	if v := scrape(t, addr, "runnel_group_members")[groupLabel]; v != 0 {
		t.Fatalf("members after the leave %v", v)
	}
	if v, _ := lag(); v != 0 {
		t.Fatalf("lag of an empty group with commits %v, want 0", v)
	}
}

// TestDescribeTopicsStats: include_stats returns each partition's produce counts and rates, so a hot
// partition stands out; without it, none.
func TestDescribeTopicsStats(t *testing.T) {
	tn := startNode(t, t.TempDir())
	tn.createTopic(t, "clicks", 3, nil)
	hot := 0
	for i := 0; i < 5; i++ {
		b := makeBatch("c", 20, 1000, batch.CompressionNone)
		if _, err := tn.produce(t, "clicks", 1, b, runnelv1.Acks_ACKS_LEADER); err != nil {
			t.Fatal(err)
		}
		hot += len(b)
	}
	cold := makeBatch("c", 1, 1000, batch.CompressionNone)
	if _, err := tn.produce(t, "clicks", 2, cold, runnelv1.Acks_ACKS_LEADER); err != nil {
		t.Fatal(err)
	}
	resp, err := tn.admin.DescribeTopics(ctxT(t), &runnelv1.DescribeTopicsRequest{Topics: []string{"clicks"}, IncludeStats: true})
	if err != nil {
		t.Fatal(err)
	}
	ps := resp.Topics[0].Partitions
	want := []struct{ bytes, records int64 }{{0, 0}, {int64(hot), 100}, {int64(len(cold)), 1}}
	for i, p := range ps {
		st := p.Stats
		if st == nil {
			t.Fatalf("partition %d: no stats", i)
		}
		if st.BytesInTotal != want[i].bytes || st.RecordsInTotal != want[i].records {
			t.Fatalf("partition %d totals %d bytes %d records, want %v", i, st.BytesInTotal, st.RecordsInTotal, want[i])
		}
		var minuteSum int64
		for _, b := range st.BytesInPerMinute {
			minuteSum += b
		}
		if minuteSum != want[i].bytes || len(st.RecordsInPerMinute) != 6 {
			t.Fatalf("partition %d per minute %v", i, st.BytesInPerMinute)
		}
		if (st.LastMinute.BytesInPerSec > 0) != (want[i].bytes > 0) || st.LastFiveMinutes.RecordsInPerSec < 0 || st.WindowMs <= 0 {
			t.Fatalf("partition %d rates %v", i, st)
		}
	}
	if ps[1].Stats.LastMinute.RecordsInPerSec <= 50*ps[2].Stats.LastMinute.RecordsInPerSec {
		t.Fatalf("hot partition's rate %v is not 100× the cold one's %v", ps[1].Stats.LastMinute, ps[2].Stats.LastMinute)
	}
	resp, err = tn.admin.DescribeTopics(ctxT(t), &runnelv1.DescribeTopicsRequest{Topics: []string{"clicks"}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Topics[0].Partitions[1].Stats != nil {
		t.Fatal("stats without include_stats")
	}
}

// TestTelemetryDisabled: a node with telemetry disabled (the benchmarks' baseline, OTEL_SDK_DISABLED)
// serves no /metrics and no stats, and works.
func TestTelemetryDisabled(t *testing.T) {
	for _, how := range []string{"config", "env"} {
		t.Run(how, func(t *testing.T) {
			var tn *testNode
			if how == "env" {
				t.Setenv("OTEL_SDK_DISABLED", "true")
				tn = startNode(t, t.TempDir())
			} else {
				tn = startNode(t, t.TempDir(), func(c *platform.Config) { c.Telemetry.Disabled = true })
			}
			tn.createTopic(t, "t", 1, nil)
			if _, err := tn.produce(t, "t", 0, makeBatch("x", 3, 1, batch.CompressionNone), runnelv1.Acks_ACKS_ALL); err != nil {
				t.Fatal(err)
			}
			resp, err := http.Get("http://" + tn.node.HTTPAddr() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("/metrics with telemetry disabled: %s", resp.Status)
			}
			d, err := tn.admin.DescribeTopics(ctxT(t), &runnelv1.DescribeTopicsRequest{Topics: []string{"t"}, IncludeStats: true})
			if err != nil || d.Topics[0].Partitions[0].Stats != nil {
				t.Fatalf("stats with telemetry disabled: %v %v", d, err)
			}
		})
	}
}

// TestTelemetryEnv: OTLP over HTTP, which the node does not ship, is refused at start with what to set
// instead; unsupported exporters and propagators are warned about and ignored.
func TestTelemetryEnv(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	n, err := platform.New(testConfig(t), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	err = n.Start()
	n.Close()
	if err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf") {
		t.Fatalf("start with OTLP over HTTP: %v", err)
	}

	t.Setenv("OTEL_TRACES_EXPORTER", "zipkin")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "")
	t.Setenv("OTEL_PROPAGATORS", "b3,tracecontext")
	var logs bytes.Buffer
	logger, err := platform.NewLogger("text", "warn", &logs)
	if err != nil {
		t.Fatal(err)
	}
	n, err = platform.New(testConfig(t), logger)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	n.Close()
	for _, want := range []string{"exporter=zipkin", "propagator=b3"} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("no warning with %q in:\n%s", want, logs.String())
		}
	}
}

func testConfig(t *testing.T) platform.Config {
	cfg := platform.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.RaftAddr, cfg.SerfAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", ""
	cfg.MemTableBytes, cfg.BlockCacheBytes, cfg.IndexCacheBytes = 8<<20, 8<<20, 4<<20
	cfg.ShutdownTimeout = 2 * time.Second
	return cfg
}

// TestLoggerTraceIDs: NewLogger's handler adds trace_id and span_id from a traced context, in JSON and
// text, and nothing without one; bad formats and levels are refused.
func TestLoggerTraceIDs(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	defer span.End()
	sc := span.SpanContext()

	var buf bytes.Buffer
	logger, err := platform.NewLogger("JSON", "info", &buf)
	if err != nil {
		t.Fatal(err)
	}
	logger.With("component", "test").InfoContext(ctx, "traced", "k", 1)
	logger.Info("untraced")
	logger.DebugContext(ctx, "below the level")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("lines: %q", lines)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	if rec["trace_id"] != sc.TraceID().String() || rec["span_id"] != sc.SpanID().String() || rec["component"] != "test" {
		t.Fatalf("traced record %v, want trace %s span %s", rec, sc.TraceID(), sc.SpanID())
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Fatalf("untraced record has ids: %s", lines[1])
	}

	buf.Reset()
	logger, err = platform.NewLogger("text", "debug", &buf)
	if err != nil {
		t.Fatal(err)
	}
	logger.DebugContext(ctx, "traced")
	if !strings.Contains(buf.String(), "trace_id="+sc.TraceID().String()) || !strings.Contains(buf.String(), "span_id="+sc.SpanID().String()) {
		t.Fatalf("text record: %s", buf.String())
	}
	if _, err := platform.NewLogger("xml", "info", io.Discard); err == nil {
		t.Fatal("format xml accepted")
	}
	if _, err := platform.NewLogger("text", "loud", io.Discard); err == nil {
		t.Fatal("level loud accepted")
	}
}

// TestDashboardMetricsExist: every metric and label the Grafana dashboard queries is on /metrics of a
// node that has served produce, fetch, group and transaction calls, so a renamed instrument cannot
// leave a panel empty.
func TestDashboardMetricsExist(t *testing.T) {
	raw, err := os.ReadFile("../deploy/grafana/runnel-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	tn := startNode(t, t.TempDir())
	tn.createTopic(t, "orders", 1, nil)
	if _, err := tn.produce(t, "orders", 0, makeBatch("o", 5, 1000, batch.CompressionNone), runnelv1.Acks_ACKS_ALL); err != nil {
		t.Fatal(err)
	}
	if _, err := tn.fetch(t, "orders", 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	g := tn.groups()
	m := joinStable(t, g, &runnelv1.GroupHeartbeatRequest{GroupId: "g", SubscribedTopicNames: []string{"orders"}})
	if _, err := g.CommitOffsets(ctxT(t), &runnelv1.CommitOffsetsRequest{GroupId: "g", MemberId: m.MemberId, MemberEpoch: m.MemberEpoch,
		Partitions: []*runnelv1.CommitPartition{{Topic: "orders", Partition: 0, Offset: 2, LeaderEpoch: -1}}}); err != nil {
		t.Fatal(err)
	}
	// One committed and one aborted transaction, for the transaction panels.
	txp, err := client.NewProducer([]string{tn.node.GRPCAddr()}, client.WithTransactionalID("dash"), client.WithAcks(client.AcksAll))
	if err != nil {
		t.Fatal(err)
	}
	defer txp.Close()
	if err := txp.InitTransactions(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for _, commit := range []bool{true, false} {
		if err := txp.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := txp.ProduceSync(ctxT(t), &client.Record{Topic: "orders", Partition: 0, Value: []byte("t")}); err != nil {
			t.Fatal(err)
		}
		end := txp.AbortTransaction
		if commit {
			end = txp.CommitTransaction
		}
		if err := end(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Get("http://" + tn.node.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	have := map[string]bool{} // metric and label names
	label := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	for _, line := range strings.Split(string(body), "\n") {
		if line != "" && line[0] != '#' {
			have[strings.FieldsFunc(line, func(r rune) bool { return r == '{' || r == ' ' })[0]] = true
			for _, m := range label.FindAllStringSubmatch(line, -1) {
				have[m[1]] = true
			}
		}
	}
	metricName := regexp.MustCompile(`\b(runnel|rpc|go|process)_[a-z0-9_]+`)
	n := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, name := range metricName.FindAllString(tg.Expr, -1) {
				n++
				if !have[name] {
					t.Errorf("panel %q queries %s, which /metrics does not have", p.Title, name)
				}
			}
		}
	}
	if n < 20 {
		t.Fatalf("only %d metric references found in the dashboard", n)
	}
}
