package client

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sync"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// fetchCodec is the gRPC codec of the consumer's Fetch calls. gRPC hands a codec the answer in pooled,
// frame-sized buffers that go back to its pool after Unmarshal, so the records must be copied out; the
// proto codec copies the whole answer into one message buffer and then every bytes field again. This
// codec copies each partition's records once, straight from gRPC's buffers into a buffer of their own
// (from recordBufs when the reply is a *fetchReply, so the consumer can recycle it once the application
// is done with the records, see PollFunc), and decodes every other field with proto.Unmarshal, so
// fields the messages gain later are decoded as before. Only the records field of FetchPartitionResult
// (number 7) is taken by hand. TestFetchCodecDecodesAsProto holds the result to proto.Unmarshal's.
type fetchCodec struct{}

// fetchCallCodec is the call option that makes a Fetch use fetchCodec. Its name is "proto", so the
// content-subtype is the one the broker already serves.
var fetchCallCodec = grpc.ForceCodecV2(fetchCodec{})

// fetchReply is what the consumer's Fetch call decodes into: the answer, and for each of its
// partitions the recordBufs buffer its Records are in (nil when it has none). It is a proto.Message
// (the embedded FetchResponse's), for interceptors that look at replies.
type fetchReply struct {
	*runnelv1.FetchResponse
	bufs []*[]byte
}

// Name returns "proto": what goes on the wire is protobuf.
func (fetchCodec) Name() string { return grpcproto.Name }

// Marshal encodes with the proto codec.
func (fetchCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*fetchReply); ok {
		v = r.FetchResponse
	}
	return encoding.GetCodecV2(grpcproto.Name).Marshal(v)
}

// Unmarshal decodes a *fetchReply or *runnelv1.FetchResponse with each partition's records copied
// once into a buffer of their own; anything else with the proto codec.
func (fetchCodec) Unmarshal(data mem.BufferSlice, v any) error {
	var resp *runnelv1.FetchResponse
	var bufs *[]*[]byte
	switch m := v.(type) {
	case *fetchReply:
		resp, bufs = m.FetchResponse, &m.bufs
	case *runnelv1.FetchResponse:
		resp = m
	default:
		return encoding.GetCodecV2(grpcproto.Name).Unmarshal(data, v)
	}
	r := data.Reader()
	defer r.Close()
	err := readFetchResponse(r, resp, bufs)
	if err != nil && bufs != nil {
		for _, b := range *bufs {
			if b != nil {
				recordBufs.Put(b)
			}
		}
		*bufs = nil
	}
	if err != nil {
		return fmt.Errorf("decode FetchResponse: %w", err)
	}
	return nil
}

var errFetchWire = errors.New("malformed protobuf")

// readFetchResponse decodes the FetchResponse in r into resp (empty). With bufs, each partition's
// records are read into a recordBufs buffer, listed in *bufs by partition index (nil for none);
// without, into an exact allocation.
func readFetchResponse(r *mem.Reader, resp *runnelv1.FetchResponse, bufs *[]*[]byte) error {
	var other []byte // fields other than partitions, re-encoded for proto.Unmarshal
	for r.Remaining() > 0 {
		tag, err := binary.ReadUvarint(r)
		if err != nil {
			return errFetchWire
		}
		num, typ := protowire.DecodeTag(tag)
		if num == runnelv1.FieldFetchPartitions && typ == protowire.BytesType {
			n, err := binary.ReadUvarint(r)
			if err != nil || n > uint64(r.Remaining()) {
				return errFetchWire
			}
			res := &runnelv1.FetchPartitionResult{}
			buf, err := readFetchResult(r, int(n), res, bufs != nil)
			if err != nil {
				return err
			}
			resp.Partitions = append(resp.Partitions, res)
			if bufs != nil {
				*bufs = append(*bufs, buf)
			}
			continue
		}
		if other, err = appendField(other, r, tag); err != nil {
			return err
		}
	}
	if len(other) > 0 {
		// Merge keeps the partitions decoded above.
		return proto.UnmarshalOptions{Merge: true}.Unmarshal(other, resp)
	}
	return nil
}

// readFetchResult decodes a FetchPartitionResult of n bytes from r into res: the records field (the
// last occurrence wins, as in proto) copied into a buffer of its own, a recordBufs one when pooled
// (returned, nil when there are no records), every other field with proto.Unmarshal.
func readFetchResult(r *mem.Reader, n int, res *runnelv1.FetchPartitionResult, pooled bool) (*[]byte, error) {
	end := r.Remaining() - n
	var other []byte
	var buf *[]byte
	var records []byte
	for r.Remaining() > end {
		tag, err := binary.ReadUvarint(r)
		if err != nil {
			return nil, errFetchWire
		}
		num, typ := protowire.DecodeTag(tag)
		if num != runnelv1.FieldResultRecords || typ != protowire.BytesType {
			if other, err = appendField(other, r, tag); err != nil {
				return nil, err
			}
			continue
		}
		l, err := binary.ReadUvarint(r)
		if err != nil || l > uint64(r.Remaining()-end) {
			return nil, errFetchWire
		}
		if buf != nil {
			recordBufs.Put(buf) // an earlier records field, superseded
			buf = nil
		}
		if pooled {
			buf = recordBufs.get(int(l))
			records = (*buf)[:l]
		} else {
			records = make([]byte, l)
		}
		if _, err := io.ReadFull(r, records); err != nil {
			return nil, errFetchWire
		}
	}
	if r.Remaining() != end {
		return nil, errFetchWire // a field ran past the message's end
	}
	if err := proto.Unmarshal(other, res); err != nil {
		if buf != nil {
			recordBufs.Put(buf)
		}
		return nil, err
	}
	if len(records) > 0 {
		res.Records = records[:len(records):len(records)]
		return buf, nil
	}
	if buf != nil {
		recordBufs.Put(buf)
	}
	return nil, nil
}

// appendField appends the field whose tag was just read from r, value included, to b. Groups
// (deprecated, never in Runnel's messages) are refused.
func appendField(b []byte, r *mem.Reader, tag uint64) ([]byte, error) {
	b = protowire.AppendVarint(b, tag)
	switch _, typ := protowire.DecodeTag(tag); typ {
	case protowire.VarintType:
		v, err := binary.ReadUvarint(r)
		if err != nil {
			return nil, errFetchWire
		}
		return protowire.AppendVarint(b, v), nil
	case protowire.Fixed32Type, protowire.Fixed64Type, protowire.BytesType:
		var l uint64 = 4
		if typ == protowire.Fixed64Type {
			l = 8
		} else if typ == protowire.BytesType {
			var err error
			if l, err = binary.ReadUvarint(r); err != nil {
				return nil, errFetchWire
			}
			b = protowire.AppendVarint(b, l)
		}
		if l > uint64(r.Remaining()) {
			return nil, errFetchWire
		}
		n := len(b)
		b = append(b, make([]byte, l)...)
		if _, err := io.ReadFull(r, b[n:]); err != nil {
			return nil, errFetchWire
		}
		return b, nil
	}
	return nil, errFetchWire
}

// recordBufs pools the buffers fetched records are read into. A buffer is recycled only when nothing
// can reference its bytes any more: the fetched part was dropped unread, or PollFunc, whose records are
// valid only during its callback, has handed all of it out. Records Poll returned keep theirs.
var recordBufs recordBufPool

// Size classes of recordBufs: four per power of two (1, 1.25, 1.5 and 1.75 times it), so a buffer is at
// most a quarter larger than what it holds, from 4 KiB to 64 MiB (the largest fetch answer). Other
// sizes are allocated exactly and not pooled.
const (
	minRecordBuf = 4 << 10
	maxRecordBuf = 64 << 20
)

// recordBufClasses is the number of size classes.
var recordBufClasses = bufClass(maxRecordBuf) + 1

// bufClass returns the least class whose size is at least n (minRecordBuf <= n <= maxRecordBuf).
func bufClass(n int) int {
	e := bits.Len(uint(n-1)) - 1   // 1<<e < n <= 1<<(e+1)
	q := (n - 1 - 1<<e) >> (e - 2) // quarters of 1<<e above it, rounded down: 0..3
	return (e-bits.Len(uint(minRecordBuf))+1)*4 + q + 1
}

// classSize returns the size of class c.
func classSize(c int) int {
	e := c/4 + bits.Len(uint(minRecordBuf)) - 1
	return 1<<e + (c%4)<<(e-2)
}

// recordBufPool is a pool of byte slices in size classes (bufClass). Buffers are not cleared: every
// user overwrites what it reads.
type recordBufPool struct {
	once    sync.Once
	classes []sync.Pool // of *[]byte with cap >= classSize(class)
}

func (p *recordBufPool) init() { p.classes = make([]sync.Pool, recordBufClasses) }

// get returns a buffer of length 0 and capacity at least n.
func (p *recordBufPool) get(n int) *[]byte {
	if n < minRecordBuf || n > maxRecordBuf {
		b := make([]byte, 0, n)
		return &b
	}
	p.once.Do(p.init)
	class := bufClass(n)
	if v := p.classes[class].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:0]
		return b
	}
	b := make([]byte, 0, classSize(class))
	return &b
}

// Put takes a buffer back, in the largest class its capacity covers.
func (p *recordBufPool) Put(b *[]byte) {
	c := cap(*b)
	if c < minRecordBuf {
		return
	}
	p.once.Do(p.init)
	class := min(bufClass(min(c, maxRecordBuf)), recordBufClasses-1)
	if classSize(class) > c {
		class-- // c lies between two sizes: the smaller one
	}
	*b = (*b)[:0]
	p.classes[class].Put(b)
}
