package client_test

import (
	"bytes"
	"context"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client"
)

// BenchmarkProduceKeyless measures the producer's per-record path as `runnel bench produce` drives it:
// 100-byte keyless values (the sticky partitioner) to a 12-partition topic of a local node, acks=1,
// records reused round a ring, their timestamps set by the caller from a clock read every 64 records
// (as the bench command does, so the producer does not read the clock per record). Besides records/s it reports cpu-ns/record, the CPU time of the
// goroutine calling Produce (locked to its OS thread, whose CPU time getrusage reports): the client's
// share of each record, which the node's share (same process, same cores) does not blur. Run:
// go test ./client -run '^$' -bench ProduceKeyless -benchtime 2000000x
func BenchmarkProduceKeyless(b *testing.B) {
	addr := startNode(b)
	createTopic(b, addr, "bench", 12, nil)
	p := newProducer(b, addr, client.WithAcks(client.AcksLeader))
	ctx := context.Background()
	value := bytes.Repeat([]byte("0123456789"), 10)
	ring := newRecordRing(1 << 17)
	// The topic's metadata is loaded before timing starts.
	if err := p.ProduceSync(ctx, client.NewRecord("bench", nil, value)); err != nil {
		b.Fatal(err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.SetBytes(int64(len(value)))
	b.ReportAllocs()
	cpu0 := threadCPU(b)
	start := time.Now()
	var stamp time.Time
	b.ResetTimer()
	for i := range b.N {
		if i%64 == 0 {
			stamp = time.Now()
		}
		r, promise := ring.next(ctx, p, i)
		*r = client.Record{Topic: "bench", Partition: -1, Value: value, Timestamp: stamp}
		p.Produce(ctx, r, promise)
	}
	if err := p.Flush(ctx); err != nil || ring.failed.Load() > 0 {
		b.Fatalf("flush %v, %d failed", err, ring.failed.Load())
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
	b.ReportMetric(float64(threadCPU(b)-cpu0)/float64(b.N), "cpu-ns/record")
}

// threadCPU returns the CPU time (user and system) the calling OS thread has used, in ns.
func threadCPU(b *testing.B) int64 {
	const rusageThread = 1 // RUSAGE_THREAD (Linux), which package syscall does not name
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
