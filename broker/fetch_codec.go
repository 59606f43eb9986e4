package broker

import (
	"github.com/runnel-io/runnel/api/grpcbuf"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/plog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Fetch answers and their record buffers.
//
// A fetch answer's records are copied once, out of Badger's value log straight into a buffer taken from
// recordBufs (readPartition), sized beforehand from the partition's bytes per offset so that the copy
// rarely has to grow. The node's gRPC server encodes FetchResponse with fetchCodec, which hands each
// partition's records buffer to the transport as it is (referenced, not copied into a message
// buffer) and, once the transport has written it to the connection, back to recordBufs. Measured with
// 100-byte records (docs/performance.md), growing a fresh buffer per read and the proto codec's copy
// into its message buffer were most of the node's memmove and memclr under consume.
//
// Ownership: a buffer from recordBufs belongs to the FetchPartitionResult whose Records it is, and that
// result to the answer Broker.Fetch returns; nothing else keeps a reference to it. gRPC calls the
// codec once per answer it sends, after the handler (and its deferred telemetry) returned, and reads no
// record byte after the transport freed it. An answer that never reaches the codec (a long poll's
// discarded read, an in-process caller of Fetch, a server without ServerCodec) just leaves its buffers
// to the garbage collector.

// recordBufs pools the buffers of fetch answers' records, and those of decoded produce requests
// (produce_codec.go): the process's uncleared pool, which the node's gRPC server reads frames into too.
var recordBufs = grpcbuf.Shared

// The pool's largest size class holds the largest fetch answer (a negative constant does not convert
// to uint: this fails to compile if MaxFetchBytes outgrows it).
const _ = uint(1<<grpcbuf.MaxShift - MaxFetchBytes)

// readBufSize estimates the bytes a read of p from offset up to end will return, at most limit: the
// partition's average bytes per offset (its stored bytes over its offsets) times the offsets asked
// for, plus an eighth and 4 KiB for a batch that begins before offset and for uneven batches. A read
// that returns more (a larger first batch, KIP-74; a compacted log, whose average understates a
// batch) grows the buffer as append does.
func readBufSize(p *plog.Partition, offset, end int64, limit int) int {
	start, leo, size := p.LogStartOffset(), p.LogEndOffset(), p.Size()
	if end <= offset || leo <= start || size <= 0 {
		return min(limit, 4<<10)
	}
	need := float64(end-offset) * float64(size) / float64(leo-start)
	if need >= float64(limit) {
		return limit
	}
	return min(limit, int(need*1.125)+4<<10)
}

// ServerCodec returns the gRPC server option that makes the node encode Fetch answers with
// fetchCodec: records referenced rather than copied, and their buffers recycled once sent; and decode
// produce requests with their records in one pooled buffer (produce_codec.go). Every other message
// goes through gRPC's proto codec, both ways.
func ServerCodec() grpc.ServerOption { return grpc.ForceServerCodecV2(fetchCodec{}) }

// fetchCodec is the node's gRPC codec (ServerCodec). It encodes a *runnelv1.FetchResponse by hand:
// each partition's fields as proto.Marshal writes them, except that the records field comes last but
// one (before aborted_transactions) and its bytes are the answer's own buffer, handed to the
// transport by reference and returned to recordBufs when the transport is done with it. Protobuf
// parsers accept fields in any order, so clients need nothing new; TestFetchCodecMatchesProto holds the
// encoding to proto's and fails when either message gains a field the codec does not know. It also
// decodes a *runnelv1.ProduceRequest by hand (produce_codec.go).
type fetchCodec struct{}

// Name returns "proto": what goes on the wire is protobuf.
func (fetchCodec) Name() string { return grpcproto.Name }

// Marshal encodes a *runnelv1.FetchResponse with its records referenced, anything else with the proto
// codec.
func (fetchCodec) Marshal(v any) (mem.BufferSlice, error) {
	resp, ok := v.(*runnelv1.FetchResponse)
	if !ok {
		return encoding.GetCodecV2(grpcproto.Name).Marshal(v)
	}
	return marshalFetchResponse(resp)
}

// Unmarshal decodes a *runnelv1.ProduceRequest with its records aliasing one pooled buffer
// (unmarshalProduceRequest, produce_codec.go), anything else with the proto codec.
func (fetchCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if req, ok := v.(*runnelv1.ProduceRequest); ok {
		return unmarshalProduceRequest(data, req)
	}
	return encoding.GetCodecV2(grpcproto.Name).Unmarshal(data, v)
}

// marshalFetchResponse encodes resp as a list of buffers: the small fields of all partitions in one
// byte slice, sliced into the pieces between the records buffers, which are referenced. proto3 rules:
// scalars, strings and bytes equal to their zero value are left out.
func marshalFetchResponse(resp *runnelv1.FetchResponse) (mem.BufferSlice, error) {
	size := 0
	for _, r := range resp.Partitions {
		size += 80 + len(r.Topic) + 24*len(r.AbortedTransactions)
		if r.Error != nil {
			size += 8 + proto.Size(r.Error) // cached for the marshal below
		}
	}
	small := make([]byte, 0, size)
	out := make(mem.BufferSlice, 0, 2*len(resp.Partitions)+1)
	from := 0 // start of the small bytes not yet in out
	var err error
	for _, r := range resp.Partitions {
		small = protowire.AppendTag(small, runnelv1.FieldFetchPartitions, protowire.BytesType)
		small = protowire.AppendVarint(small, uint64(fetchResultSize(r)))
		if r.Topic != "" {
			small = protowire.AppendTag(small, runnelv1.FieldResultTopic, protowire.BytesType)
			small = protowire.AppendString(small, r.Topic)
		}
		small = appendVarintField(small, runnelv1.FieldResultPartition, uint64(int64(r.Partition)))
		if r.Error != nil {
			small = protowire.AppendTag(small, runnelv1.FieldResultError, protowire.BytesType)
			small = protowire.AppendVarint(small, uint64(proto.Size(r.Error)))
			if small, err = cachedSize.MarshalAppend(small, r.Error); err != nil {
				return nil, err
			}
		}
		small = appendVarintField(small, runnelv1.FieldResultHighWatermark, uint64(r.HighWatermark))
		small = appendVarintField(small, runnelv1.FieldResultLastStableOffset, uint64(r.LastStableOffset))
		small = appendVarintField(small, runnelv1.FieldResultLogStartOffset, uint64(r.LogStartOffset))
		if len(r.Records) > 0 {
			small = protowire.AppendTag(small, runnelv1.FieldResultRecords, protowire.BytesType)
			small = protowire.AppendVarint(small, uint64(len(r.Records)))
			out = append(out, mem.SliceBuffer(small[from:len(small):len(small)]))
			from = len(small)
			recs := r.Records
			out = append(out, mem.NewBuffer(&recs, recordBufs))
		}
		for _, a := range r.AbortedTransactions {
			small = protowire.AppendTag(small, runnelv1.FieldResultAbortedTransactions, protowire.BytesType)
			small = protowire.AppendVarint(small, uint64(proto.Size(a)))
			if small, err = cachedSize.MarshalAppend(small, a); err != nil {
				return nil, err
			}
		}
	}
	if from < len(small) {
		out = append(out, mem.SliceBuffer(small[from:]))
	}
	return out, nil
}

// cachedSize marshals sub-messages whose size was just taken with proto.Size.
var cachedSize = proto.MarshalOptions{UseCachedSize: true}

// fetchResultSize returns the encoded size of r, as marshalFetchResponse writes it.
func fetchResultSize(r *runnelv1.FetchPartitionResult) int {
	n := 0
	if r.Topic != "" {
		n += protowire.SizeTag(runnelv1.FieldResultTopic) + protowire.SizeBytes(len(r.Topic))
	}
	n += varintFieldSize(runnelv1.FieldResultPartition, uint64(int64(r.Partition)))
	if r.Error != nil {
		n += protowire.SizeTag(runnelv1.FieldResultError) + protowire.SizeBytes(proto.Size(r.Error))
	}
	n += varintFieldSize(runnelv1.FieldResultHighWatermark, uint64(r.HighWatermark))
	n += varintFieldSize(runnelv1.FieldResultLastStableOffset, uint64(r.LastStableOffset))
	n += varintFieldSize(runnelv1.FieldResultLogStartOffset, uint64(r.LogStartOffset))
	if len(r.Records) > 0 {
		n += protowire.SizeTag(runnelv1.FieldResultRecords) + protowire.SizeBytes(len(r.Records))
	}
	for _, a := range r.AbortedTransactions {
		n += protowire.SizeTag(runnelv1.FieldResultAbortedTransactions) + protowire.SizeBytes(proto.Size(a))
	}
	return n
}

// varintFieldSize is the size appendVarintField writes.
func varintFieldSize(n protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(n) + protowire.SizeVarint(v)
}

// appendVarintField appends a varint field unless v is 0 (proto3's default, left out).
func appendVarintField(b []byte, n protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, n, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}
