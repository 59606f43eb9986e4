package client

import (
	"sort"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// produceCodec is the gRPC codec of the producer's ProduceStream. It encodes a ProduceRequest by hand
// so that each partition's record batch goes to the transport as it is, referenced rather than copied:
// the standard proto codec copies every batch into a fresh message buffer, which was about a fifth of
// the producer's CPU with 100-byte records. Everything else (the answers) goes through the proto codec.
// The bytes on the wire are a valid ProduceRequest encoding, field for field what proto.Marshal writes
// (in another field order within each partition, which protobuf parsers accept), so the broker needs
// nothing new; TestProduceCodecMatchesProto holds the two together, and fails when the message gains
// a field the codec does not know.
//
// The batch bytes must stay unchanged until the transport has written them, which is later than Send
// returns: the producer recycles a batch's buffer only after the broker answered every request that
// carried it (see pbatch.unanswered), which it cannot do before it has read the whole request.
type produceCodec struct{}

// produceStreamCodec is the call option that makes a ProduceStream use produceCodec. Its name is
// "proto", so the content-subtype stays the one the broker already reads.
var produceStreamCodec = grpc.ForceCodecV2(produceCodec{})

// Name returns "proto": what goes on the wire is protobuf, decoded by the broker's proto codec.
func (produceCodec) Name() string { return grpcproto.Name }

// Marshal encodes a *runnelv1.ProduceRequest with its batches referenced, anything else with the proto
// codec.
func (produceCodec) Marshal(v any) (mem.BufferSlice, error) {
	req, ok := v.(*runnelv1.ProduceRequest)
	if !ok {
		return encoding.GetCodecV2(grpcproto.Name).Marshal(v)
	}
	return appendProduceRequest(nil, req), nil
}

// Unmarshal decodes with the proto codec.
func (produceCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return encoding.GetCodecV2(grpcproto.Name).Unmarshal(data, v)
}

// appendProduceRequest appends req's encoding to out: the small fields in buffers of their own, each
// partition's records as a buffer that references them. proto3 rules: scalars and strings equal to
// their zero value are left out, an optional field is written when set.
func appendProduceRequest(out mem.BufferSlice, req *runnelv1.ProduceRequest) mem.BufferSlice {
	// One buffer holds every small part: the request's own fields, then, per partition, the fields
	// before its records; records buffers reference the batches in between.
	size := 40 + len(req.TransactionalId)
	for _, pp := range req.Partitions {
		size += 48 + len(pp.Topic)
		for k, v := range pp.TraceContext {
			size += 12 + len(k) + len(v)
		}
	}
	buf := make([]byte, 0, size)
	if req.CorrelationId != 0 {
		buf = protowire.AppendTag(buf, runnelv1.FieldProduceCorrelationID, protowire.VarintType)
		buf = protowire.AppendVarint(buf, uint64(req.CorrelationId))
	}
	if req.Acks != 0 {
		buf = protowire.AppendTag(buf, runnelv1.FieldProduceAcks, protowire.VarintType)
		buf = protowire.AppendVarint(buf, uint64(int64(req.Acks)))
	}
	if req.TimeoutMs != 0 {
		buf = protowire.AppendTag(buf, runnelv1.FieldProduceTimeoutMs, protowire.VarintType)
		buf = protowire.AppendVarint(buf, uint64(int64(req.TimeoutMs)))
	}
	if req.TransactionalId != "" {
		buf = protowire.AppendTag(buf, runnelv1.FieldProduceTransactionalID, protowire.BytesType)
		buf = protowire.AppendString(buf, req.TransactionalId)
	}
	start := 0
	var keys []string
	for _, pp := range req.Partitions {
		// The partition's message: its small fields, then the records field, whose bytes follow in
		// their own buffer.
		headLen := 0
		if pp.Topic != "" {
			headLen += protowire.SizeTag(runnelv1.FieldPartitionTopic) + protowire.SizeBytes(len(pp.Topic))
		}
		if pp.Partition != 0 {
			headLen += protowire.SizeTag(runnelv1.FieldPartitionPartition) + protowire.SizeVarint(uint64(int64(pp.Partition)))
		}
		keys = keys[:0]
		for k := range pp.TraceContext {
			keys = append(keys, k)
		}
		sort.Strings(keys) // deterministic bytes for the same request
		for _, k := range keys {
			headLen += protowire.SizeTag(runnelv1.FieldPartitionTraceContext) + protowire.SizeBytes(mapEntrySize(k, pp.TraceContext[k]))
		}
		if pp.CurrentLeaderEpoch != nil {
			headLen += protowire.SizeTag(runnelv1.FieldPartitionCurrentLeaderEpoch) + protowire.SizeVarint(uint64(int64(*pp.CurrentLeaderEpoch)))
		}
		recLen := 0
		if len(pp.Records) > 0 {
			recLen = protowire.SizeTag(runnelv1.FieldPartitionRecords) + protowire.SizeBytes(len(pp.Records))
		}
		buf = protowire.AppendTag(buf, runnelv1.FieldProducePartitions, protowire.BytesType)
		buf = protowire.AppendVarint(buf, uint64(headLen+recLen))
		if pp.Topic != "" {
			buf = protowire.AppendTag(buf, runnelv1.FieldPartitionTopic, protowire.BytesType)
			buf = protowire.AppendString(buf, pp.Topic)
		}
		if pp.Partition != 0 {
			buf = protowire.AppendTag(buf, runnelv1.FieldPartitionPartition, protowire.VarintType)
			buf = protowire.AppendVarint(buf, uint64(int64(pp.Partition)))
		}
		for _, k := range keys {
			v := pp.TraceContext[k]
			buf = protowire.AppendTag(buf, runnelv1.FieldPartitionTraceContext, protowire.BytesType)
			buf = protowire.AppendVarint(buf, uint64(mapEntrySize(k, v)))
			buf = protowire.AppendTag(buf, runnelv1.FieldMapKey, protowire.BytesType)
			buf = protowire.AppendString(buf, k)
			buf = protowire.AppendTag(buf, runnelv1.FieldMapValue, protowire.BytesType)
			buf = protowire.AppendString(buf, v)
		}
		if pp.CurrentLeaderEpoch != nil {
			buf = protowire.AppendTag(buf, runnelv1.FieldPartitionCurrentLeaderEpoch, protowire.VarintType)
			buf = protowire.AppendVarint(buf, uint64(int64(*pp.CurrentLeaderEpoch)))
		}
		if len(pp.Records) > 0 {
			buf = protowire.AppendTag(buf, runnelv1.FieldPartitionRecords, protowire.BytesType)
			buf = protowire.AppendVarint(buf, uint64(len(pp.Records)))
			out = append(out, mem.SliceBuffer(buf[start:len(buf):len(buf)]), mem.SliceBuffer(pp.Records))
			start = len(buf)
		}
	}
	if start < len(buf) {
		out = append(out, mem.SliceBuffer(buf[start:len(buf):len(buf)]))
	}
	return out
}

// mapEntrySize is the encoded size of a map<string, string> entry: key field 1, value field 2 (proto
// writes both even when empty).
func mapEntrySize(k, v string) int {
	return protowire.SizeTag(runnelv1.FieldMapKey) + protowire.SizeBytes(len(k)) + protowire.SizeTag(runnelv1.FieldMapValue) + protowire.SizeBytes(len(v))
}

// produceCodecFields lists the fields appendProduceRequest writes, by message, for the test that checks
// them against the generated descriptors.
var produceCodecFields = map[string][]protowire.Number{
	"ProduceRequest":   {runnelv1.FieldProduceCorrelationID, runnelv1.FieldProduceAcks, runnelv1.FieldProduceTimeoutMs, runnelv1.FieldProducePartitions, runnelv1.FieldProduceTransactionalID},
	"ProducePartition": {runnelv1.FieldPartitionTopic, runnelv1.FieldPartitionPartition, runnelv1.FieldPartitionRecords, runnelv1.FieldPartitionTraceContext, runnelv1.FieldPartitionCurrentLeaderEpoch},
}
