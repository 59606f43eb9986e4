package grpcbuf

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
)

// Socket buffer and flow-control window sizes of the connections between the SDK and a node, on both
// ends. Produce requests and fetch answers are megabytes: with gRPC's defaults (32 KiB reads and
// writes, a 64 KiB window grown by its BDP probe) a stream stalls on flow control and takes a read,
// a window update and a wakeup per few dozen KiB. With these on the node's side too, its CPU at
// 1.4 M records/s fell by 2.5 % and the maximum rose by 4 % (docs/performance.md, eighteenth
// session).
const (
	SocketBufferBytes = 256 << 10 // read and write buffer of each connection, bytes
	StreamWindowBytes = 4 << 20   // initial flow-control window of each stream, bytes
	ConnWindowBytes   = 16 << 20  // initial flow-control window of each connection, bytes
)

// ServerOptions returns the transport options of the node's gRPC server: received frames read into
// Shared's uncleared buffers, and the sizes above.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		experimental.BufferPool(Shared),
		grpc.ReadBufferSize(SocketBufferBytes),
		grpc.WriteBufferSize(SocketBufferBytes),
		grpc.InitialWindowSize(StreamWindowBytes),
		grpc.InitialConnWindowSize(ConnWindowBytes),
	}
}

// DialOptions returns the transport options of the SDK's connections to nodes, the counterpart of
// ServerOptions.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		experimental.WithBufferPool(Shared),
		grpc.WithReadBufferSize(SocketBufferBytes),
		grpc.WithWriteBufferSize(SocketBufferBytes),
		grpc.WithInitialWindowSize(StreamWindowBytes),
		grpc.WithInitialConnWindowSize(ConnWindowBytes),
	}
}
