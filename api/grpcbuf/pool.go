// Package grpcbuf is the pool of byte buffers that the node's gRPC server and the connections of the
// SDK and of brokers to each other give gRPC (grpc/experimental.BufferPool and WithBufferPool), and
// that the broker keeps records in (the records of decoded produce requests and of fetch answers,
// broker/produce_codec.go and broker/fetch_codec.go). ServerOptions and DialOptions (transport.go)
// give the node's server and the SDK's connections that pool with the socket buffer and flow-control
// window sizes they share.
//
// gRPC's default pool clears every buffer it hands out, and each received HTTP/2 data frame over
// 1 KiB is read into one: a pass over every byte produced to a node or fetched from it, 5 % of the
// node's CPU samples at full produce speed (docs/performance.md). This pool does not clear. That is
// safe because every user writes a buffer before reading it, checked in gRPC v1.85.0: a data frame
// is read whole into its buffer (padding cut off), the receive buffer's compaction copies exactly the
// bytes it asks for, decompression (mem.ReadAll) keeps only the bytes it read, mem.Copy fills its
// copy; in Runnel, a produce request's records are copied whole out of the frames, and a fetch
// appends whole batches to a zero-length buffer. gRPC's socket reads and write batches use uncleared
// pools of its own already. The check must be made again when gRPC is upgraded: the option is
// experimental, and mem.BufferPool promises nothing about zeroing.
package grpcbuf

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// Size classes: powers of two from 4 KiB to 64 MiB (the broker's MaxFetchBytes, the largest fetch
// answer; broker/fetch_codec.go checks that it fits). A smaller request gets 4 KiB; a larger one is
// allocated exactly, and when put back joins the 64 MiB class, which its capacity covers.
const (
	MinShift = 12
	MaxShift = 26
)

// Pool is a mem.BufferPool of byte slices in power-of-two size classes whose buffers are not cleared:
// what Get and GetCap return holds whatever an earlier user left in it. Safe for concurrent use; the
// zero value is ready.
type Pool struct {
	classes [MaxShift + 1]sync.Pool // of *[]byte with cap >= 1<<class
}

var _ mem.BufferPool = (*Pool)(nil)

// Shared is the process's pool: the gRPC server, every SDK connection and the broker draw from it, so
// the buffers one frees serve the others.
var Shared = &Pool{}

// Get returns a buffer of length n; its contents are left over from earlier use. mem.BufferPool.
func (p *Pool) Get(n int) *[]byte {
	b := p.GetCap(n)
	*b = (*b)[:n]
	return b
}

// GetCap returns a buffer of length 0 and capacity at least n, for appending to.
func (p *Pool) GetCap(n int) *[]byte {
	if n > 1<<MaxShift {
		b := make([]byte, 0, n)
		return &b
	}
	class := max(MinShift, bits.Len(uint(max(n, 1)-1))) // the least c with 1<<c >= n
	if v := p.classes[class].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:0]
		return b
	}
	b := make([]byte, 0, 1<<class)
	return &b
}

// Put takes a buffer back, in the largest class its capacity covers, so a class never hands out a
// buffer smaller than its size; one under 4 KiB is left to the garbage collector. mem.BufferPool.
func (p *Pool) Put(b *[]byte) {
	c := cap(*b)
	if c < 1<<MinShift {
		return
	}
	class := min(MaxShift, bits.Len(uint(c))-1) // the greatest c' with 1<<c' <= c
	*b = (*b)[:0]
	p.classes[class].Put(b)
}
