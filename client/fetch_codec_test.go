package client

import (
	"bytes"
	"testing"
	"unsafe"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// TestFetchCodecDecodesAsProto checks that fetchCodec decodes a FetchResponse, however gRPC split it
// into buffers, to what proto.Unmarshal makes of it: every field, unknown fields (from a newer broker)
// included, and a records field that occurs twice (the last wins).
func TestFetchCodecDecodesAsProto(t *testing.T) {
	resp := &runnelv1.FetchResponse{Partitions: []*runnelv1.FetchPartitionResult{
		{Topic: "orders", Partition: 3, HighWatermark: 1 << 40, LastStableOffset: 99, LogStartOffset: 7, Records: bytes.Repeat([]byte("batch"), 5000),
			AbortedTransactions: []*runnelv1.AbortedTransaction{{ProducerId: 5, FirstOffset: 10}}},
		{Topic: "orders", Partition: 4, HighWatermark: -1, LastStableOffset: -1, LogStartOffset: -1,
			Error: &runnelv1.ErrorInfo{Code: runnelv1.ErrorCode_OFFSET_OUT_OF_RANGE, Message: "out of range"}},
		{Topic: "t", Partition: -2, Records: []byte("x")},
		{},
	}}
	wire, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	// A newer broker's fields: an unknown field in the response and in a partition, and a second
	// records field in a partition.
	part := &runnelv1.FetchPartitionResult{Topic: "new", Records: []byte("first")}
	pb, err := proto.Marshal(part)
	if err != nil {
		t.Fatal(err)
	}
	pb = protowire.AppendTag(pb, 99, protowire.VarintType)
	pb = protowire.AppendVarint(pb, 42)
	pb = protowire.AppendTag(pb, runnelv1.FieldResultRecords, protowire.BytesType)
	pb = protowire.AppendBytes(pb, []byte("second"))
	pb = protowire.AppendTag(pb, 5, protowire.VarintType)
	pb = protowire.AppendVarint(pb, 12)
	wire = protowire.AppendTag(wire, runnelv1.FieldFetchPartitions, protowire.BytesType)
	wire = protowire.AppendBytes(wire, pb)
	wire = protowire.AppendTag(wire, 77, protowire.BytesType)
	wire = protowire.AppendBytes(wire, []byte("future"))

	var want runnelv1.FetchResponse
	if err := proto.Unmarshal(wire, &want); err != nil {
		t.Fatal(err)
	}
	if string(want.Partitions[4].Records) != "second" {
		t.Fatalf("the test's premise: proto took records %q", want.Partitions[4].Records)
	}
	for _, chunk := range []int{len(wire), 1, 7, 1000} {
		var data mem.BufferSlice
		for rest := wire; len(rest) > 0; {
			n := min(chunk, len(rest))
			data = append(data, mem.SliceBuffer(rest[:n]))
			rest = rest[n:]
		}
		var got runnelv1.FetchResponse
		if err := (fetchCodec{}).Unmarshal(data, &got); err != nil {
			t.Fatalf("chunks of %d: %v", chunk, err)
		}
		if !proto.Equal(&got, &want) {
			t.Fatalf("chunks of %d: decoded %v, want %v", chunk, &got, &want)
		}
		if r := got.Partitions[0].Records; cap(r) != len(r) {
			t.Fatalf("records have room after them (len %d cap %d): an append would overwrite the next field", len(r), cap(r))
		}
		// Decoded for the consumer: the same, with each partition's records in a pooled buffer.
		reply := &fetchReply{FetchResponse: &runnelv1.FetchResponse{}}
		if err := (fetchCodec{}).Unmarshal(data, reply); err != nil {
			t.Fatalf("chunks of %d, as a fetchReply: %v", chunk, err)
		}
		if !proto.Equal(reply.FetchResponse, &want) {
			t.Fatalf("chunks of %d, as a fetchReply: decoded %v, want %v", chunk, reply.FetchResponse, &want)
		}
		if len(reply.bufs) != len(want.Partitions) {
			t.Fatalf("%d buffers for %d partitions", len(reply.bufs), len(want.Partitions))
		}
		for i, r := range reply.Partitions {
			b := reply.bufs[i]
			if (b != nil) != (len(r.Records) > 0) {
				t.Fatalf("partition %d: buffer %v for %d bytes of records", i, b != nil, len(r.Records))
			}
			if b != nil && (cap(*b) < len(r.Records) || unsafe.SliceData((*b)[:1]) != unsafe.SliceData(r.Records)) {
				t.Fatalf("partition %d: records are not in their buffer", i)
			}
		}
	}
	// Damage is an error, as with proto.
	var got runnelv1.FetchResponse
	if err := (fetchCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire[:len(wire)-3])}, &got); err == nil {
		t.Fatal("a truncated answer decoded")
	}
	// Other messages go through the proto codec.
	req := &runnelv1.FetchRequest{MaxBytes: 5}
	out, err := fetchCodec{}.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var back runnelv1.FetchRequest
	if err := (fetchCodec{}).Unmarshal(out, &back); err != nil || !proto.Equal(&back, req) {
		t.Fatalf("round trip of a FetchRequest: %v, %v", &back, err)
	}
}

// TestRecordBufClasses checks the pool's size classes: each size maps to the least class that holds it,
// and a buffer from the pool holds what was asked for.
func TestRecordBufClasses(t *testing.T) {
	if classSize(0) != minRecordBuf || classSize(recordBufClasses-1) != maxRecordBuf {
		t.Fatalf("classes span %d..%d", classSize(0), classSize(recordBufClasses-1))
	}
	for c := 1; c < recordBufClasses; c++ {
		if lo, hi := classSize(c-1), classSize(c); hi <= lo || hi > lo+lo/4+1 && hi > lo*5/4 {
			t.Fatalf("class %d: %d after %d", c, hi, lo)
		}
	}
	for _, n := range []int{minRecordBuf, minRecordBuf + 1, 5 << 10, 5<<10 + 1, 1 << 20, 1<<20 + 1, 1<<20 + 1<<18, maxRecordBuf - 1, maxRecordBuf} {
		c := bufClass(n)
		if classSize(c) < n || c > 0 && classSize(c-1) >= n {
			t.Fatalf("bufClass(%d) = %d of size %d (the one before: %d)", n, c, classSize(c), classSize(max(c-1, 0)))
		}
	}
	var p recordBufPool
	for _, n := range []int{0, 100, minRecordBuf, 1<<20 + 3, maxRecordBuf, maxRecordBuf + 1} {
		b := p.get(n)
		if len(*b) != 0 || cap(*b) < n {
			t.Fatalf("get(%d): len %d cap %d", n, len(*b), cap(*b))
		}
		p.Put(b)
	}
	odd := make([]byte, 0, 6000) // between classes: serves only what it can hold
	p.Put(&odd)
	for range 50 {
		if b := p.get(6000); cap(*b) < 6000 {
			t.Fatalf("get(6000) returned capacity %d", cap(*b))
		}
	}
}
