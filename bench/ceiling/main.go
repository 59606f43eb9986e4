// Command ceiling measures this machine's ceilings for Runnel's produce path, so benchmark figures can
// be read as a share of what the hardware and transport allow:
//
//	disk: sequential 1 MiB writes to a file, fdatasync after every write (what a group commit pays) and
//	      only at the end (the raw sequential bandwidth);
//	grpc: a bare bidi gRPC stream on loopback carrying ProduceRequest messages of a given size to a
//	      server that answers each at once, with the same pipelining the SDK uses (no storage, no
//	      batch validation): the transport's ceiling.
//
// Usage: go run ./bench/ceiling [-dir DIR] [-size BYTES] [-duration D] [-o json]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

type result struct {
	Name     string  `json:"name"`
	MBPerSec float64 `json:"mb_per_s"`
	Note     string  `json:"note"`
}

func main() {
	dir := flag.String("dir", os.TempDir(), "directory for the disk test file")
	size := flag.Int("size", 1<<20, "bytes per write and per gRPC request")
	dur := flag.Duration("duration", 5*time.Second, "how long each measurement runs")
	out := flag.String("o", "table", "output: table or json")
	flag.Parse()
	var results []result
	for _, sync := range []bool{true, false} {
		r, err := diskWrite(*dir, *size, *dur, sync)
		if err != nil {
			fmt.Fprintln(os.Stderr, "disk:", err)
			os.Exit(1)
		}
		results = append(results, r)
	}
	r, err := grpcStream(*size, *dur)
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpc:", err)
		os.Exit(1)
	}
	results = append(results, r)
	if *out == "json" {
		json.NewEncoder(os.Stdout).Encode(results)
		return
	}
	fmt.Printf("%-28s %10s  %s\n", "CEILING", "MB/s", "HOW")
	for _, r := range results {
		fmt.Printf("%-28s %10.1f  %s\n", r.Name, r.MBPerSec, r.Note)
	}
}

func diskWrite(dir string, size int, dur time.Duration, syncEach bool) (result, error) {
	f, err := os.CreateTemp(dir, "runnel-ceiling-*")
	if err != nil {
		return result{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i * 31)
	}
	start := time.Now()
	var n int64
	for time.Since(start) < dur {
		if _, err := f.Write(buf); err != nil {
			return result{}, err
		}
		n += int64(size)
		if syncEach {
			if err := f.Sync(); err != nil {
				return result{}, err
			}
		}
	}
	if err := f.Sync(); err != nil {
		return result{}, err
	}
	el := time.Since(start)
	name, note := "disk sequential write", fmt.Sprintf("%d-byte writes, one fsync at the end, in %s", size, filepath.Dir(f.Name()))
	if syncEach {
		name, note = "disk write+fdatasync", fmt.Sprintf("%d-byte writes, fsync after each, in %s", size, filepath.Dir(f.Name()))
	}
	return result{Name: name, MBPerSec: float64(n) / el.Seconds() / 1e6, Note: note}, nil
}

// sink answers every produce request at once: gRPC and protobuf cost only.
type sink struct {
	runnelv1.UnimplementedRecordsServer
}

func (sink) ProduceStream(stream grpc.BidiStreamingServer[runnelv1.ProduceRequest, runnelv1.ProduceResponse]) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(&runnelv1.ProduceResponse{CorrelationId: req.CorrelationId}); err != nil {
			return err
		}
	}
}

func grpcStream(size int, dur time.Duration) (result, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{}, err
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(size + 1<<20))
	runnelv1.RegisterRecordsServer(srv, sink{})
	go srv.Serve(ln)
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(size+1<<20)))
	if err != nil {
		return result{}, err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := runnelv1.NewRecordsClient(conn).ProduceStream(ctx)
	if err != nil {
		return result{}, err
	}
	const inflight = 5 // the SDK's default max in flight
	slots := make(chan struct{}, inflight)
	var wg sync.WaitGroup
	var acked int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
			acked += int64(size)
			<-slots
		}
	}()
	payload := make([]byte, size)
	start := time.Now()
	for id := int64(0); time.Since(start) < dur; id++ {
		slots <- struct{}{}
		req := &runnelv1.ProduceRequest{CorrelationId: id, Partitions: []*runnelv1.ProducePartition{{Topic: "t", Records: payload}}}
		if err := stream.Send(req); err != nil {
			return result{}, err
		}
	}
	for i := 0; i < inflight; i++ { // wait for the answers still in flight
		slots <- struct{}{}
	}
	el := time.Since(start)
	stream.CloseSend()
	cancel()
	wg.Wait()
	return result{Name: "grpc bare stream (loopback)", MBPerSec: float64(acked) / el.Seconds() / 1e6,
		Note: fmt.Sprintf("%d-byte ProduceRequests, %d in flight, server answers without storing", size, inflight)}, nil
}
