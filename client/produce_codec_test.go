package client

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The hand-made ProduceRequest encoding decodes, with the proto package, to the request it encoded:
// over requests with every field set, unset, at its extremes, and with several partitions.
func TestProduceCodecMatchesProto(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ints := []int32{0, 1, -1, 127, 128, math.MaxInt32, math.MinInt32}
	pick := func() int32 { return ints[rng.IntN(len(ints))] }
	for i := 0; i < 2000; i++ {
		req := &runnelv1.ProduceRequest{
			CorrelationId: []int64{0, 1, -1, math.MaxInt64, math.MinInt64, rng.Int64()}[rng.IntN(6)],
			Acks:          runnelv1.Acks(rng.IntN(3)),
			TimeoutMs:     pick(),
		}
		if rng.IntN(2) == 0 {
			req.TransactionalId = "txn-" + string(rune('a'+rng.IntN(26)))
		}
		for range rng.IntN(4) {
			pp := &runnelv1.ProducePartition{Partition: pick()}
			if rng.IntN(5) > 0 {
				pp.Topic = "topic-" + string(rune('a'+rng.IntN(26)))
			}
			if n := rng.IntN(3); n > 0 {
				pp.Records = make([]byte, []int{1, 300}[n-1])
				for j := range pp.Records {
					pp.Records[j] = byte(rng.IntN(256))
				}
			}
			if rng.IntN(2) == 0 {
				pp.TraceContext = map[string]string{"traceparent": "00-abc-def-01"}
				if rng.IntN(2) == 0 {
					pp.TraceContext["tracestate"] = ""
					pp.TraceContext[""] = "empty key"
				}
			}
			if rng.IntN(2) == 0 {
				e := pick()
				pp.CurrentLeaderEpoch = &e
			}
			req.Partitions = append(req.Partitions, pp)
		}
		data, err := produceCodec{}.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		wire := data.Materialize()
		var got runnelv1.ProduceRequest
		if err := proto.Unmarshal(wire, &got); err != nil {
			t.Fatalf("request %d: %v\nencoded %x", i, err, wire)
		}
		if !proto.Equal(req, &got) {
			t.Fatalf("request %d decodes to\n%v\nwant\n%v", i, &got, req)
		}
		if want, _ := proto.Marshal(req); len(want) != len(wire) {
			t.Fatalf("request %d: %d bytes, proto.Marshal writes %d", i, len(wire), len(want))
		}
		// Deterministic: the same request encodes to the same bytes.
		again, _ := produceCodec{}.Marshal(req)
		if !bytes.Equal(again.Materialize(), wire) {
			t.Fatalf("request %d: two encodings differ", i)
		}
	}
}

// The records of each partition are referenced, not copied, and nothing else is.
func TestProduceCodecReferencesRecords(t *testing.T) {
	recs := [][]byte{bytes.Repeat([]byte{1}, 100), bytes.Repeat([]byte{2}, 50)}
	req := &runnelv1.ProduceRequest{CorrelationId: 7, Partitions: []*runnelv1.ProducePartition{
		{Topic: "a", Partition: 0, Records: recs[0]},
		{Topic: "b", Partition: 3, Records: recs[1]},
	}}
	data, err := produceCodec{}.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, b := range data {
		rd := b.ReadOnlyData()
		for _, r := range recs {
			if len(rd) == len(r) && &rd[0] == &r[0] {
				found++
			}
		}
	}
	if found != len(recs) {
		t.Fatalf("%d of %d records buffers referenced", found, len(recs))
	}
	// Anything but a ProduceRequest goes through the proto codec.
	resp := &runnelv1.ProduceResponse{CorrelationId: 9}
	enc, err := produceCodec{}.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var back runnelv1.ProduceResponse
	if err := (produceCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(enc.Materialize())}, &back); err != nil || back.CorrelationId != 9 {
		t.Fatalf("round trip of a ProduceResponse: %v, %v", &back, err)
	}
}

// Every field of ProduceRequest and ProducePartition is one the codec writes: a field added to the
// .proto must be added to appendProduceRequest too, or it would be dropped from every produce request.
func TestProduceCodecKnowsEveryField(t *testing.T) {
	for _, m := range []proto.Message{&runnelv1.ProduceRequest{}, &runnelv1.ProducePartition{}} {
		d := m.ProtoReflect().Descriptor()
		var have []protowire.Number
		fields := d.Fields()
		for i := range fields.Len() {
			have = append(have, fields.Get(i).Number())
		}
		want := produceCodecFields[string(d.Name())]
		slices.Sort(have)
		if !slices.Equal(have, want) {
			t.Errorf("%s has fields %v; produceCodec writes %v", d.Name(), have, want)
		}
		if d.Name() == "ProducePartition" {
			tc := fields.ByNumber(runnelv1.FieldPartitionTraceContext)
			if !tc.IsMap() || tc.MapKey().Kind() != protoreflect.StringKind || tc.MapValue().Kind() != protoreflect.StringKind {
				t.Errorf("trace_context is no longer a map<string, string>")
			}
		}
	}
}
