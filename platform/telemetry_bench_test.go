package platform_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/client/telemetry"
	"github.com/runnel-io/runnel/platform"
	"github.com/runnel-io/runnel/platform/platformtest"
)

// discardExporter drops spans after the batch processor has done its work, so the benchmark pays for
// making, sampling and queueing spans but not for a network.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// BenchmarkProduce measures produce throughput through a real node and a pipelined ProduceStream, the
// way the SDK produces (a batch span per batch, its context in every record's headers and in the
// request), in three builds:
//
//   - uninstrumented: telemetry disabled on the node, no tracing calls in the client;
//   - tracing-off: the default node (metrics, otelgrpc with a no-op tracer) and a client Tracer over a
//     no-op provider: what every deployment without OTEL_* variables runs;
//   - sampled-1pct: node and client trace with ParentBased(TraceIDRatioBased(0.01)) into a batch span
//     processor; every record carries a traceparent (sampled or not, as W3C propagation wants).
//
// Acks=all without fsync, so the node is CPU-bound and instrumentation costs show rather than hide
// behind the disk. Compare runs with -count and benchstat: docs/telemetry.md has the figures.
func BenchmarkProduce(b *testing.B) {
	for _, mode := range []string{"uninstrumented", "tracing-off", "sampled-1pct"} {
		b.Run(mode, func(b *testing.B) { benchProduce(b, mode) })
	}
}

const (
	benchPartitions = 4
	benchRecords    = 100 // per batch
	benchValue      = 100 // bytes per record value
	benchInflight   = 32  // requests unanswered on the stream
)

func benchProduce(b *testing.B, mode string) {
	var tracer *telemetry.Tracer
	prop := propagation.TraceContext{}
	n := platformtest.StartNode(b, b.TempDir(), func(c *platform.Config) {
		c.Fsync = false
		c.MemTableBytes = 64 << 20 // the default's: fewer flushes, less noise from Badger's background work
		switch mode {
		case "uninstrumented":
			c.Telemetry.Disabled = true
		case "tracing-off":
			tracer = telemetry.NewTracer(telemetry.WithTracerProvider(tracenoop.NewTracerProvider()), telemetry.WithPropagator(prop))
		case "sampled-1pct":
			sampler := sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))
			nodeTP := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithBatcher(discardExporter{}))
			clientTP := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithBatcher(discardExporter{}))
			b.Cleanup(func() { nodeTP.Shutdown(context.Background()); clientTP.Shutdown(context.Background()) })
			c.Telemetry.TracerProvider = nodeTP
			tracer = telemetry.NewTracer(telemetry.WithTracerProvider(clientTP), telemetry.WithPropagator(prop))
		}
	})
	conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	admin := runnelv1.NewAdminClient(conn)
	if _, err := admin.CreateTopics(ctx, &runnelv1.CreateTopicsRequest{Topics: []*runnelv1.NewTopic{{Name: "bench", Partitions: benchPartitions}}}); err != nil {
		b.Fatal(err)
	}
	stream, err := runnelv1.NewRecordsClient(conn).ProduceStream(ctx)
	if err != nil {
		b.Fatal(err)
	}
	value := make([]byte, benchValue)
	keys := make([][]byte, benchRecords)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("key-%04d", i))
	}
	pending := make([]*telemetry.SendSpan, b.N)
	inflight := make(chan struct{}, benchInflight)
	var wg sync.WaitGroup
	wg.Add(1)
	var recvErr error
	go func() {
		defer wg.Done()
		for i := 0; i < b.N; i++ {
			resp, err := stream.Recv()
			if err != nil {
				recvErr = err
				return
			}
			p := resp.Partitions[0]
			if p.Error != nil {
				recvErr = fmt.Errorf("%v", p.Error)
				return
			}
			pending[resp.CorrelationId].End(p.BaseOffset, benchRecords, nil)
			pending[resp.CorrelationId] = nil
			<-inflight
		}
	}()
	var bld batch.Builder
	var bytes int64
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	for i := 0; i < b.N; i++ {
		part := int32(i % benchPartitions)
		send := tracer.StartSend(ctx, "bench", part) // nil Tracer: a nil check, as the uninstrumented SDK
		bld.Reset()
		ts := time.Now().UnixMilli()
		for r := 0; r < benchRecords; r++ {
			bld.Append(ts, keys[r], value, send.Headers(nil))
		}
		recs := append([]byte(nil), bld.Build(batch.CompressionNone)...)
		bytes += int64(len(recs))
		pending[i] = send
		inflight <- struct{}{}
		if err := stream.Send(&runnelv1.ProduceRequest{CorrelationId: int64(i), Acks: runnelv1.Acks_ACKS_ALL,
			Partitions: []*runnelv1.ProducePartition{{Topic: "bench", Partition: part, Records: recs, TraceContext: send.TraceContext()}}}); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	b.StopTimer()
	if recvErr != nil {
		b.Fatal(recvErr)
	}
	stream.CloseSend()
	b.SetBytes(bytes / int64(b.N))
	b.ReportMetric(float64(b.N*benchRecords)/elapsed.Seconds(), "records/s")
	// CPU time of the process (client, node and Badger's background work) per batch: on a machine with
	// few cores it varies less between runs than the wall time does.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// cpuTime returns the user and system CPU time the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFetchRPC measures a small unary fetch, where otelgrpc's per-call work (a no-op span, the
// rpc.server.call.duration histogram) and the fetch metrics weigh the most, with telemetry disabled and
// in the default tracing-off build.
func BenchmarkFetchRPC(b *testing.B) {
	for _, mode := range []string{"uninstrumented", "tracing-off"} {
		b.Run(mode, func(b *testing.B) {
			n := platformtest.StartNode(b, b.TempDir(), func(c *platform.Config) { c.Telemetry.Disabled = mode == "uninstrumented" })
			conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			ctx := context.Background()
			if _, err := runnelv1.NewAdminClient(conn).CreateTopics(ctx, &runnelv1.CreateTopicsRequest{Topics: []*runnelv1.NewTopic{{Name: "f", Partitions: 1}}}); err != nil {
				b.Fatal(err)
			}
			records := runnelv1.NewRecordsClient(conn)
			if _, err := records.Produce(ctx, &runnelv1.ProduceRequest{Acks: runnelv1.Acks_ACKS_ALL, Partitions: []*runnelv1.ProducePartition{{Topic: "f",
				Records: makeBatch("v", 10, 1, batch.CompressionNone)}}}); err != nil {
				b.Fatal(err)
			}
			req := &runnelv1.FetchRequest{Partitions: []*runnelv1.FetchPartition{{Topic: "f", FetchOffset: 0}}}
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := records.Fetch(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
