package platform_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/telemetry"
	"github.com/runnel-io/runnel/internal/testaddr"
	"github.com/runnel-io/runnel/platform"
	"github.com/runnel-io/runnel/platform/platformtest"
)

// startTracedCluster starts n in-process nodes, all controller voters, that find each other by serf
// gossip, each sending its spans to tp; it waits until every node is ready and returns their gRPC
// addresses by node id (1..n). Raft and serf addresses come from testaddr, because the nodes must know
// each other's before any starts; gRPC binds port 0 and is advertised as bound.
func startTracedCluster(t *testing.T, n int, tp trace.TracerProvider) map[int32]string {
	t.Helper()
	type addrs struct{ grpc, raft, serf string }
	as := map[int32]addrs{}
	var voters []string
	for id := int32(1); id <= int32(n); id++ {
		as[id] = addrs{"127.0.0.1:0", testaddr.Free(t), testaddr.Free(t)}
		voters = append(voters, fmt.Sprintf("%d@%s", id, as[id].raft))
	}
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("RUNNEL_TEST_LOG") == "1" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	nodes := map[int32]*platform.Node{}
	for id := int32(1); id <= int32(n); id++ {
		cfg := platformtest.Config(t.TempDir())
		cfg.NodeID, cfg.GRPCAddr, cfg.RaftAddr, cfg.SerfAddr = id, as[id].grpc, as[id].raft, as[id].serf
		cfg.ControllerVoters = strings.Join(voters, ",")
		for other := int32(1); other <= int32(n); other++ {
			if other != id {
				cfg.Join = append(cfg.Join, as[other].serf)
			}
		}
		cfg.Telemetry.TracerProvider = tp
		node, err := platform.New(cfg, logger.With("node", id))
		if err != nil {
			t.Fatal(err)
		}
		nodes[id] = node
		t.Cleanup(func() { node.Close() })
	}
	// Started together: a voter's start may wait for the quorum, which needs the others.
	var wg sync.WaitGroup
	errs := make([]error, n+1)
	for id, node := range nodes {
		wg.Go(func() { errs[id] = node.Start() })
	}
	wg.Wait()
	for id, err := range errs {
		if err != nil {
			t.Fatalf("start node %d: %v", id, err)
		}
	}
	out := map[int32]string{}
	for id, node := range nodes {
		out[id] = node.GRPCAddr()
		waitFor(t, 90*time.Second, func() string {
			resp, err := http.Get("http://" + node.HTTPAddr() + "/readyz")
			if err != nil {
				return fmt.Sprintf("node %d /readyz: %v", id, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Sprintf("node %d /readyz: %s", id, resp.Status)
			}
			return ""
		})
	}
	return out
}

// spansIn returns the exported spans of trace id named name of kind.
func spansIn(exp *tracetest.InMemoryExporter, id trace.TraceID, name string, kind trace.SpanKind) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID() == id && s.Name == name && s.SpanKind == kind {
			out = append(out, s)
		}
	}
	return out
}

// TestTraceReplicatedProduceConsume is the trace test across a cluster: one record produced by
// the SDK with acks=all to a partition replicated on three nodes, and consumed by a group member,
// yields one trace: the producer's send span → the leader's append span (continued from the
// ProduceStream request's trace context) → one replicate span on each of the two followers, children
// of the append span, ended once the batch was durable there → the member's process span, child of and
// linked to the send span, and its receive span linked to it. Nodes and clients share one in-memory
// exporter; the follower and leader attributes tell the nodes' spans apart.
func TestTraceReplicatedProduceConsume(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	addrs := startTracedCluster(t, 3, tp)
	brokers := []string{addrs[1], addrs[2], addrs[3]}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	admin, err := client.NewAdmin(brokers)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.CreateTopic(ctx, "orders", 1, 3, nil); err != nil {
		t.Fatal(err)
	}
	var leader int32
	var followers []int32
	waitFor(t, 60*time.Second, func() string {
		d, err := admin.DescribeTopic(ctx, "orders")
		if err != nil {
			return err.Error()
		}
		p := d.Partitions[0]
		if p.LeaderID < 0 || len(p.ISR) != 3 {
			return fmt.Sprintf("partition leader %d, ISR %v", p.LeaderID, p.ISR)
		}
		leader, followers = p.LeaderID, nil
		for _, r := range p.Replicas {
			if r != leader {
				followers = append(followers, r)
			}
		}
		return ""
	})

	tr := telemetry.NewTracer(telemetry.WithTracerProvider(tp), telemetry.WithPropagator(propagation.TraceContext{}))
	p, err := client.NewProducer(brokers, client.WithAcks(client.AcksAll), client.WithTelemetry(tr))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.ProduceSync(ctx, &client.Record{Topic: "orders", Partition: 0, Key: []byte("k1"), Value: []byte("v1")}); err != nil {
		t.Fatal(err)
	}

	gc, err := client.NewGroupConsumer(brokers, "billing", client.WithAutoOffsetReset(client.OffsetEarliest()), client.WithTelemetry(tr))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	if err := gc.Subscribe("orders"); err != nil {
		t.Fatal(err)
	}
	var recs []*client.Record
	waitFor(t, 60*time.Second, func() string {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		defer pcancel()
		got, err := gc.Poll(pctx)
		recs = append(recs, got...)
		if len(recs) == 0 {
			return fmt.Sprintf("no record polled yet (%v)", err)
		}
		return ""
	})
	if len(recs) != 1 {
		t.Fatalf("polled %d records, want 1", len(recs))
	}
	_, proc := gc.StartProcess(context.Background(), recs[0])
	proc.End()

	// The producer's span starts the trace; every other span must be in it.
	var send tracetest.SpanStub
	waitFor(t, 10*time.Second, func() string {
		var sends []tracetest.SpanStub
		for _, s := range exp.GetSpans() {
			if s.Name == "send orders" && s.SpanKind == trace.SpanKindProducer {
				sends = append(sends, s)
			}
		}
		if len(sends) != 1 {
			return fmt.Sprintf("%d send spans", len(sends))
		}
		send = sends[0]
		return ""
	})
	id := send.SpanContext.TraceID()
	var app tracetest.SpanStub
	var reps []tracetest.SpanStub
	waitFor(t, 30*time.Second, func() string { // followers end their spans once the batch is durable there
		apps := spansIn(exp, id, "append orders", trace.SpanKindServer)
		reps = spansIn(exp, id, "replicate orders", trace.SpanKindConsumer)
		if len(apps) != 1 || len(reps) != 2 {
			var all []string
			for _, s := range exp.GetSpans() {
				all = append(all, s.Name+"/"+s.SpanKind.String())
			}
			return fmt.Sprintf("%d append and %d replicate spans in the trace, among %v", len(apps), len(reps), all)
		}
		app = apps[0]
		return ""
	})
	if app.Parent.SpanID() != send.SpanContext.SpanID() || !app.Parent.IsRemote() {
		t.Fatalf("append span's parent %v, want the remote send span %v", app.Parent, send.SpanContext)
	}
	seen := map[int64]bool{}
	for _, r := range reps {
		childOf(t, r, app)
		if !r.Parent.IsRemote() {
			t.Errorf("replicate span's parent %v is not remote: it must come from the leader", r.Parent)
		}
		f, l := attrOf(r, telemetry.AttrFollower).AsInt64(), attrOf(r, telemetry.AttrLeader).AsInt64()
		if l != int64(leader) || f == int64(leader) || seen[f] {
			t.Errorf("replicate span of follower %d under leader %d; leader %d, followers %v", f, l, leader, followers)
		}
		seen[f] = true
		if attrOf(r, telemetry.AttrBaseOffset).AsInt64() != 0 || attrOf(r, "messaging.batch.message_count").AsInt64() != 1 ||
			attrOf(r, telemetry.AttrPartition).AsString() != "0" || attrOf(r, "messaging.operation.name").AsString() != telemetry.OpReplicate {
			t.Errorf("replicate span attributes %v", r.Attributes)
		}
		if r.Status.Code != 0 || len(r.Events) == 0 || r.Events[len(r.Events)-1].Name != "durable" {
			t.Errorf("replicate span status %v, events %v: want it ended at durability", r.Status, r.Events)
		}
		if r.StartTime.Before(app.StartTime) {
			t.Errorf("replicate span starts %v, before the append span %v", r.StartTime, app.StartTime)
		}
	}
	for _, f := range followers {
		if !seen[int64(f)] {
			t.Errorf("no replicate span of follower %d (have %v)", f, seen)
		}
	}

	procs := spansIn(exp, id, "process orders", trace.SpanKindConsumer)
	if len(procs) != 1 {
		t.Fatalf("%d process spans in the trace", len(procs))
	}
	childOf(t, procs[0], send)
	if len(procs[0].Links) != 1 || procs[0].Links[0].SpanContext.SpanID() != send.SpanContext.SpanID() {
		t.Errorf("process span links %v, want the send span", procs[0].Links)
	}
	if g := attrOf(procs[0], telemetry.AttrGroup).AsString(); g != "billing" {
		t.Errorf("process span group %q", g)
	}
	var recv []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "receive orders" && s.SpanKind == trace.SpanKindClient {
			recv = append(recv, s)
		}
	}
	if len(recv) != 1 || len(recv[0].Links) != 1 || recv[0].Links[0].SpanContext.SpanID() != send.SpanContext.SpanID() {
		t.Errorf("receive spans %d, want one linked to the send span", len(recv))
	}
}
