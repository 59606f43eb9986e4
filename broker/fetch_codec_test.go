package broker

import (
	"bytes"
	"testing"
	"unsafe"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// TestFetchCodecMatchesProto checks that fetchCodec's encoding of a FetchResponse decodes, with the
// standard proto codec, to the message it encoded, field for field, and that it references the records
// instead of copying them. It fails when FetchResponse or FetchPartitionResult gains a field the codec
// does not write.
func TestFetchCodecMatchesProto(t *testing.T) {
	known := map[protoreflect.FullName][]protoreflect.FieldNumber{
		"runnel.v1.FetchResponse":        {runnelv1.FieldFetchPartitions},
		"runnel.v1.FetchPartitionResult": {runnelv1.FieldResultTopic, runnelv1.FieldResultPartition, runnelv1.FieldResultError, runnelv1.FieldResultHighWatermark, runnelv1.FieldResultLastStableOffset, runnelv1.FieldResultLogStartOffset, runnelv1.FieldResultRecords, runnelv1.FieldResultAbortedTransactions},
	}
	for _, m := range []proto.Message{&runnelv1.FetchResponse{}, &runnelv1.FetchPartitionResult{}} {
		d := m.ProtoReflect().Descriptor()
		want := known[d.FullName()]
		if d.Fields().Len() != len(want) {
			t.Fatalf("%s has %d fields, the codec writes %d: teach marshalFetchResponse the new ones", d.FullName(), d.Fields().Len(), len(want))
		}
		for _, n := range want {
			if d.Fields().ByNumber(n) == nil {
				t.Fatalf("%s has no field %d any more: fix marshalFetchResponse", d.FullName(), n)
			}
		}
	}

	recs1 := bytes.Repeat([]byte("batch-one"), 1000)
	recs2 := []byte("x")
	resp := &runnelv1.FetchResponse{Partitions: []*runnelv1.FetchPartitionResult{
		{Topic: "orders", Partition: 3, HighWatermark: 1 << 40, LastStableOffset: 99, LogStartOffset: 7, Records: recs1,
			AbortedTransactions: []*runnelv1.AbortedTransaction{{ProducerId: 5, FirstOffset: 10}, {ProducerId: -1, FirstOffset: 0}}},
		{Topic: "orders", Partition: 4, HighWatermark: -1, LastStableOffset: -1, LogStartOffset: -1,
			Error: &runnelv1.ErrorInfo{Code: runnelv1.ErrorCode_OFFSET_OUT_OF_RANGE, Message: "offset 9 outside [0, 5]"}},
		{Topic: "", Partition: -2, Records: recs2},
		{},
		{Topic: "ü", Partition: 1 << 30, Records: recs2, AbortedTransactions: []*runnelv1.AbortedTransaction{{ProducerId: 1 << 50, FirstOffset: 1 << 40}}},
	}}
	for _, m := range []*runnelv1.FetchResponse{resp, {}} {
		out, err := fetchCodec{}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		wire := out.Materialize()
		want, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if len(wire) != len(want) {
			t.Fatalf("codec wrote %d bytes, proto.Marshal %d", len(wire), len(want))
		}
		var got runnelv1.FetchResponse
		if err := proto.Unmarshal(wire, &got); err != nil {
			t.Fatalf("the codec's encoding does not parse: %v", err)
		}
		if !proto.Equal(&got, m) {
			t.Fatalf("decoded %v, want %v", &got, m)
		}
		// Every non-empty records field travels as its own buffer, the records themselves.
		for _, r := range m.Partitions {
			if len(r.Records) > 0 && !referenced(out, r.Records) {
				t.Fatalf("%s-%d: records were copied, not referenced", r.Topic, r.Partition)
			}
		}
		out.Free()
	}

	// Other messages go through the proto codec both ways.
	req := &runnelv1.FetchRequest{MaxBytes: 5, Partitions: []*runnelv1.FetchPartition{{Topic: "t", FetchOffset: 3}}}
	out, err := fetchCodec{}.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var back runnelv1.FetchRequest
	if err := (fetchCodec{}).Unmarshal(out, &back); err != nil || !proto.Equal(&back, req) {
		t.Fatalf("round trip of a FetchRequest: %v, %v", &back, err)
	}
}

// referenced reports whether one of out's buffers is b itself.
func referenced(out mem.BufferSlice, b []byte) bool {
	for _, buf := range out {
		d := buf.ReadOnlyData()
		if len(d) == len(b) && unsafe.SliceData(d) == unsafe.SliceData(b) {
			return true
		}
	}
	return false
}
