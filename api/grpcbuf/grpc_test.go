package grpcbuf

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/experimental"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// poisoned hands out the pool's buffers with every byte of their capacity set to 0xEE: the worst an
// earlier user could leave. A byte gRPC read from a buffer before writing it would reach a message.
type poisoned struct {
	p    *Pool
	gets atomic.Int64
}

func (q *poisoned) Get(n int) *[]byte {
	b := q.p.Get(n)
	full := (*b)[:cap(*b)]
	for i := range full {
		full[i] = 0xEE
	}
	q.gets.Add(1)
	return b
}

func (q *poisoned) Put(b *[]byte) { q.p.Put(b) }

// echo answers each call with the payload it was sent.
type echo struct {
	testgrpc.UnimplementedTestServiceServer
}

func (echo) UnaryCall(_ context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Payload: req.GetPayload()}, nil
}

func (echo) FullDuplexCall(st grpc.BidiStreamingServer[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse]) error {
	for {
		req, err := st.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := st.Send(&testgrpc.StreamingOutputCallResponse{Payload: req.GetPayload()}); err != nil {
			return err
		}
	}
}

// TestGRPCWithUnclearedBuffers runs gRPC on both ends with buffers full of stale bytes, as this pool
// gives them, and checks that every message arrives as sent: unary and streamed, plain and gzip
// compressed (decompression reads into pooled buffers too), from empty to over 1 MiB, across frame
// boundaries. It is the check behind not clearing, made again with every gRPC upgrade.
func TestGRPCWithUnclearedBuffers(t *testing.T) {
	q := &poisoned{p: &Pool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The node's and the SDK's transport options, with the poisoned pool in place of Shared (later
	// options win): frames are read with their socket buffers and windows.
	srv := grpc.NewServer(append(ServerOptions(), experimental.BufferPool(q))...)
	testgrpc.RegisterTestServiceServer(srv, echo{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
	cc, err := grpc.NewClient(ln.Addr().String(), append(DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()), experimental.WithBufferPool(q))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	cli := testgrpc.NewTestServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, 1023, 1024, 1025, 4096, 16383, 16384, 16385, 100_000, 1<<20 + 3}
	for _, compress := range []bool{false, true} {
		var opts []grpc.CallOption
		if compress {
			opts = append(opts, grpc.UseCompressor(gzip.Name))
		}
		stream, err := cli.FullDuplexCall(ctx, opts...)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range sizes {
			body := make([]byte, n)
			for i := range body {
				body[i] = byte(rng.IntN(200)) // never 0xEE
			}
			resp, err := cli.UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: body}}, opts...)
			if err != nil {
				t.Fatalf("unary, %d bytes, gzip %t: %v", n, compress, err)
			}
			if !bytes.Equal(resp.GetPayload().GetBody(), body) {
				t.Fatalf("unary, %d bytes, gzip %t: the echo differs from what was sent", n, compress)
			}
			if err := stream.Send(&testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: body}}); err != nil {
				t.Fatalf("stream send, %d bytes, gzip %t: %v", n, compress, err)
			}
			sr, err := stream.Recv()
			if err != nil {
				t.Fatalf("stream receive, %d bytes, gzip %t: %v", n, compress, err)
			}
			if !bytes.Equal(sr.GetPayload().GetBody(), body) {
				t.Fatalf("stream, %d bytes, gzip %t: the echo differs from what was sent", n, compress)
			}
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != io.EOF {
			t.Fatalf("stream end: %v", err)
		}
	}
	if q.gets.Load() == 0 {
		t.Fatal("gRPC took no buffer from the pool: the test checked nothing")
	}
}
