// Package ceiling measures this machine's ceilings for Runnel's produce path, so benchmark figures can
// be read as a share of what the hardware and transport allow:
//
//	disk: sequential writes to a file, fdatasync after every write (what a group commit pays) and
//	      only at the end (the raw sequential bandwidth);
//	grpc: a bare bidi gRPC stream on loopback carrying ProduceRequest messages of a given size to a
//	      server that answers each at once, with the same pipelining the SDK uses (no storage, no
//	      batch validation): the transport's ceiling.
//
// bench/ceiling is its command line; bench/peers measures the ceilings in the same run as the systems.
package ceiling

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/grpcbuf"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Result is one ceiling: its name, bandwidth (MB = 10^6 bytes) and how it was measured.
type Result struct {
	Name     string  `json:"name"`
	MBPerSec float64 `json:"mb_per_s"`
	Note     string  `json:"note"`
}

// DiskWrite writes size-byte blocks sequentially to a temporary file in dir for dur, with an fsync
// (fdatasync on Linux) after every write when syncEach, else one at the end.
func DiskWrite(dir string, size int, dur time.Duration, syncEach bool) (Result, error) {
	f, err := os.CreateTemp(dir, "runnel-ceiling-*")
	if err != nil {
		return Result{}, err
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
			return Result{}, err
		}
		n += int64(size)
		if syncEach {
			if err := f.Sync(); err != nil {
				return Result{}, err
			}
		}
	}
	if err := f.Sync(); err != nil {
		return Result{}, err
	}
	el := time.Since(start)
	name, note := "disk sequential write", fmt.Sprintf("%d-byte writes, one fsync at the end, in %s", size, filepath.Dir(f.Name()))
	if syncEach {
		name, note = "disk write+fdatasync", fmt.Sprintf("%d-byte writes, fsync after each, in %s", size, filepath.Dir(f.Name()))
	}
	return Result{Name: name, MBPerSec: float64(n) / el.Seconds() / 1e6, Note: note}, nil
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

// GRPCStream measures a bare bidi gRPC stream on loopback carrying size-byte ProduceRequests for
// dur, to a server that answers each at once without storing anything, 5 requests in flight.
func GRPCStream(size int, dur time.Duration) (Result, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Result{}, err
	}
	// The node's transport options (api/grpcbuf: buffer pool, socket buffers, flow-control windows):
	// the ceiling is the transport the node actually gets.
	srv := grpc.NewServer(append(grpcbuf.ServerOptions(), grpc.MaxRecvMsgSize(size+1<<20))...)
	runnelv1.RegisterRecordsServer(srv, sink{})
	go srv.Serve(ln)
	defer srv.Stop()
	// The transport options the SDK dials with (client/cluster.go), so the ceiling is the transport
	// Runnel's clients actually get.
	conn, err := grpc.NewClient(ln.Addr().String(), append(grpcbuf.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(size+1<<20)))...)
	if err != nil {
		return Result{}, err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := runnelv1.NewRecordsClient(conn).ProduceStream(ctx)
	if err != nil {
		return Result{}, err
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
			return Result{}, err
		}
	}
	for i := 0; i < inflight; i++ { // wait for the answers still in flight
		slots <- struct{}{}
	}
	el := time.Since(start)
	stream.CloseSend()
	cancel()
	wg.Wait()
	return Result{Name: "grpc bare stream (loopback)", MBPerSec: float64(acked) / el.Seconds() / 1e6,
		Note: fmt.Sprintf("%d-byte ProduceRequests, %d in flight, server answers without storing", size, inflight)}, nil
}
