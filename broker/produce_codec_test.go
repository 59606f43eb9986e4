package broker

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/client/batch"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// checkProduceDecode decodes wire with decodeProduceRequest and with proto.Unmarshal: both must fail,
// or both succeed with proto.Equal results (unknown fields included), the records aliasing wire.
func checkProduceDecode(t testing.TB, wire []byte) {
	t.Helper()
	var want runnelv1.ProduceRequest
	wantErr := proto.Unmarshal(wire, &want)
	in := bytes.Clone(wire)
	var got runnelv1.ProduceRequest
	got.CorrelationId, got.Partitions = 99, []*runnelv1.ProducePartition{{Topic: "stale"}} // reset by the decoder
	aliased, err := decodeProduceRequest(in, &got)
	if (err == nil) != (wantErr == nil) {
		t.Fatalf("wire %s: hand decoder error %v, proto.Unmarshal error %v", short(wire), err, wantErr)
	}
	if err != nil {
		return
	}
	if !proto.Equal(&got, &want) {
		t.Fatalf("wire %s: hand decoder gave %v, proto.Unmarshal %v", short(wire), &got, &want)
	}
	anyRecords := false
	for i, pp := range got.Partitions {
		if pp.Records == nil {
			continue
		}
		anyRecords = true
		if !within(pp.Records, in) {
			t.Fatalf("wire %s: partitions[%d].records were copied, not aliased", short(wire), i)
		}
		if len(pp.Records) != cap(pp.Records) {
			t.Fatalf("wire %s: partitions[%d].records have capacity %d beyond their %d bytes", short(wire), i, cap(pp.Records), len(pp.Records))
		}
	}
	if aliased != anyRecords {
		t.Fatalf("wire %s: decoder says aliased=%v, records present %v", short(wire), aliased, anyRecords)
	}
}

// short is wire in hex for a failure message, cut after 64 bytes.
func short(wire []byte) string {
	if len(wire) > 64 {
		return fmt.Sprintf("%x... (%d bytes)", wire[:64], len(wire))
	}
	return fmt.Sprintf("%x", wire)
}

// within reports whether b lies inside buf's memory.
func within(b, buf []byte) bool {
	p, start := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	return p >= start && p+uintptr(len(b)) <= start+uintptr(len(buf))
}

// TestProduceCodecKnowsEveryField fails when ProduceRequest or ProducePartition gains, loses or
// renumbers a field: decodeProduceRequest would drop the new one into the unknown fields.
func TestProduceCodecKnowsEveryField(t *testing.T) {
	known := map[protoreflect.FullName]map[protoreflect.FieldNumber]protoreflect.Kind{
		"runnel.v1.ProduceRequest": {runnelv1.FieldProduceCorrelationID: protoreflect.Int64Kind, runnelv1.FieldProduceAcks: protoreflect.EnumKind,
			runnelv1.FieldProduceTimeoutMs: protoreflect.Int32Kind, runnelv1.FieldProducePartitions: protoreflect.MessageKind, runnelv1.FieldProduceTransactionalID: protoreflect.StringKind},
		"runnel.v1.ProducePartition": {runnelv1.FieldPartitionTopic: protoreflect.StringKind, runnelv1.FieldPartitionPartition: protoreflect.Int32Kind,
			runnelv1.FieldPartitionRecords: protoreflect.BytesKind, runnelv1.FieldPartitionTraceContext: protoreflect.MessageKind, runnelv1.FieldPartitionCurrentLeaderEpoch: protoreflect.Int32Kind},
	}
	for _, m := range []proto.Message{&runnelv1.ProduceRequest{}, &runnelv1.ProducePartition{}} {
		d := m.ProtoReflect().Descriptor()
		want := known[d.FullName()]
		if d.Fields().Len() != len(want) {
			t.Fatalf("%s has %d fields, decodeProduceRequest knows %d: teach it the new ones", d.FullName(), d.Fields().Len(), len(want))
		}
		for n, kind := range want {
			f := d.Fields().ByNumber(n)
			if f == nil || f.Kind() != kind {
				t.Fatalf("%s field %d is %v, decodeProduceRequest decodes a %v: fix it", d.FullName(), n, f, kind)
			}
		}
	}
	tc := (&runnelv1.ProducePartition{}).ProtoReflect().Descriptor().Fields().ByNumber(runnelv1.FieldPartitionTraceContext)
	if !tc.IsMap() || tc.MapKey().Kind() != protoreflect.StringKind || tc.MapValue().Kind() != protoreflect.StringKind {
		t.Fatalf("trace_context is no longer a map<string, string>: fix decodeStringMapEntry")
	}
	if ep := (&runnelv1.ProducePartition{}).ProtoReflect().Descriptor().Fields().ByNumber(runnelv1.FieldPartitionCurrentLeaderEpoch); !ep.HasPresence() {
		t.Fatalf("current_leader_epoch lost its presence: fix decodeProducePartition")
	}
}

// randomProduceRequest builds a request with every field set or not, at random, extreme values
// included, and sometimes unknown fields on either message.
func randomProduceRequest(r *rand.Rand) *runnelv1.ProduceRequest {
	int32s := []int32{0, 1, -1, math.MaxInt32, math.MinInt32, 300}
	pick32 := func() int32 {
		if r.IntN(2) == 0 {
			return int32s[r.IntN(len(int32s))]
		}
		return r.Int32() - r.Int32()
	}
	strs := []string{"", "orders", "ü€𝄞", strings.Repeat("t", 300), "a\x00b"}
	str := func() string { return strs[r.IntN(len(strs))] }
	req := &runnelv1.ProduceRequest{
		CorrelationId:   []int64{0, -1, math.MaxInt64, math.MinInt64, r.Int64()}[r.IntN(5)],
		Acks:            runnelv1.Acks([]int32{0, 1, -1, 2, 7, math.MinInt32}[r.IntN(6)]),
		TimeoutMs:       pick32(),
		TransactionalId: str(),
	}
	for range r.IntN(5) {
		pp := &runnelv1.ProducePartition{Topic: str(), Partition: pick32()}
		switch r.IntN(4) {
		case 0: // none
		case 1:
			pp.Records = []byte{}
		default:
			pp.Records = make([]byte, 1+r.IntN(3000))
			for i := range pp.Records {
				pp.Records[i] = byte(r.Uint32())
			}
		}
		switch r.IntN(3) {
		case 0:
		case 1:
			pp.TraceContext = map[string]string{}
		default:
			pp.TraceContext = map[string]string{}
			for range 1 + r.IntN(3) {
				pp.TraceContext[str()] = str()
			}
		}
		if r.IntN(2) == 0 {
			e := pick32()
			pp.CurrentLeaderEpoch = &e
		}
		if r.IntN(5) == 0 {
			pp.ProtoReflect().SetUnknown(randomUnknown(r))
		}
		req.Partitions = append(req.Partitions, pp)
	}
	if r.IntN(5) == 0 {
		req.ProtoReflect().SetUnknown(randomUnknown(r))
	}
	return req
}

// randomUnknown encodes one or two fields of numbers the messages do not have, of every wire type.
func randomUnknown(r *rand.Rand) []byte {
	var b []byte
	for range 1 + r.IntN(2) {
		num := []protowire.Number{6, 15, 16, 1000, protowire.MaxValidNumber}[r.IntN(5)]
		switch r.IntN(5) {
		case 0:
			b = protowire.AppendTag(b, num, protowire.VarintType)
			b = protowire.AppendVarint(b, r.Uint64())
		case 1:
			b = protowire.AppendTag(b, num, protowire.Fixed32Type)
			b = protowire.AppendFixed32(b, r.Uint32())
		case 2:
			b = protowire.AppendTag(b, num, protowire.Fixed64Type)
			b = protowire.AppendFixed64(b, r.Uint64())
		case 3:
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendString(b, "unknown")
		default:
			b = protowire.AppendTag(b, num, protowire.StartGroupType)
			b = protowire.AppendTag(b, 1, protowire.VarintType)
			b = protowire.AppendVarint(b, 5)
			b = protowire.AppendTag(b, num, protowire.EndGroupType)
		}
	}
	return b
}

// produceWireCases are hand-made encodings for the rules random messages do not reach: repeated
// scalars, map entries with missing or repeated parts, known fields with another wire type, groups,
// non-minimal varints, bad field numbers and wire types, invalid UTF-8, truncations.
func produceWireCases() [][]byte {
	type w = []byte
	tag := func(b w, n protowire.Number, t protowire.Type) w { return protowire.AppendTag(b, n, t) }
	vint := func(b w, n protowire.Number, v uint64) w {
		return protowire.AppendVarint(tag(b, n, protowire.VarintType), v)
	}
	bs := func(b w, n protowire.Number, v w) w { return protowire.AppendBytes(tag(b, n, protowire.BytesType), v) }
	str := func(b w, n protowire.Number, s string) w { return bs(b, n, w(s)) }
	part := func(fields w) w { return bs(nil, runnelv1.FieldProducePartitions, fields) }
	entry := func(fields w) w { return bs(nil, runnelv1.FieldPartitionTraceContext, fields) }
	group := func(b w, n protowire.Number, inner w) w {
		return tag(append(tag(b, n, protowire.StartGroupType), inner...), n, protowire.EndGroupType)
	}
	cat := func(parts ...w) w { return bytes.Join(parts, nil) }

	recs := bytes.Repeat(w("batch"), 10)
	full := cat(vint(nil, runnelv1.FieldProduceCorrelationID, 7), vint(nil, runnelv1.FieldProduceAcks, 1), vint(nil, runnelv1.FieldProduceTimeoutMs, 1000),
		part(cat(str(nil, runnelv1.FieldPartitionTopic, "orders"), vint(nil, runnelv1.FieldPartitionPartition, 3), bs(nil, runnelv1.FieldPartitionRecords, recs),
			entry(cat(str(nil, runnelv1.FieldMapKey, "traceparent"), str(nil, runnelv1.FieldMapValue, "00-abc"))), vint(nil, runnelv1.FieldPartitionCurrentLeaderEpoch, 4))),
		part(cat(str(nil, runnelv1.FieldPartitionTopic, "b"), bs(nil, runnelv1.FieldPartitionRecords, w("x")))),
		str(nil, runnelv1.FieldProduceTransactionalID, "txn"))

	cases := []w{
		nil, {},
		full,
		// Repeated scalars and strings: the last wins; records too, an empty last one included.
		cat(vint(nil, runnelv1.FieldProduceCorrelationID, 1), vint(nil, runnelv1.FieldProduceCorrelationID, 2), str(nil, runnelv1.FieldProduceTransactionalID, "a"), str(nil, runnelv1.FieldProduceTransactionalID, "b")),
		part(cat(str(nil, runnelv1.FieldPartitionTopic, "a"), str(nil, runnelv1.FieldPartitionTopic, "b"), vint(nil, runnelv1.FieldPartitionPartition, 1), vint(nil, runnelv1.FieldPartitionPartition, 2))),
		part(cat(bs(nil, runnelv1.FieldPartitionRecords, w("first")), bs(nil, runnelv1.FieldPartitionRecords, w("second")))),
		part(cat(bs(nil, runnelv1.FieldPartitionRecords, w("first")), bs(nil, runnelv1.FieldPartitionRecords, nil))),
		part(bs(nil, runnelv1.FieldPartitionRecords, nil)),
		part(cat(vint(nil, runnelv1.FieldPartitionCurrentLeaderEpoch, 1), vint(nil, runnelv1.FieldPartitionCurrentLeaderEpoch, 0))),
		part(vint(nil, runnelv1.FieldPartitionCurrentLeaderEpoch, 0)), // set to 0: present
		part(nil), cat(part(nil), part(nil)),
		// Negative and oversized varints in int32 and enum fields: truncated to 32 bits as proto does.
		cat(vint(nil, runnelv1.FieldProduceTimeoutMs, uint64(math.MaxUint64)), vint(nil, runnelv1.FieldProduceAcks, 1<<40|3), part(vint(nil, runnelv1.FieldPartitionPartition, 1<<35|5))),
		cat(vint(nil, runnelv1.FieldProduceTimeoutMs, 0xFFFFFFFF), part(vint(nil, runnelv1.FieldPartitionCurrentLeaderEpoch, uint64(1<<63)))),
		// Non-minimal varints, in a tag and in values.
		cat(w{0x88, 0x80, 0x00}, w{0x81, 0x80, 0x80, 0x00}),
		cat(w{0x22, 0x84, 0x00}, str(nil, runnelv1.FieldPartitionTopic, "tt")),
		// Map entries: missing key or value, empty, duplicate keys, repeated parts, unknown fields,
		// a key or value of another wire type (skipped), a group inside.
		part(cat(entry(str(nil, runnelv1.FieldMapValue, "v")), entry(str(nil, runnelv1.FieldMapKey, "k")), entry(nil))),
		part(cat(entry(cat(str(nil, runnelv1.FieldMapKey, "k"), str(nil, runnelv1.FieldMapValue, "1"))), entry(cat(str(nil, runnelv1.FieldMapKey, "k"), str(nil, runnelv1.FieldMapValue, "2"))))),
		part(entry(cat(str(nil, runnelv1.FieldMapKey, "a"), str(nil, runnelv1.FieldMapKey, "b"), str(nil, runnelv1.FieldMapValue, "x"), str(nil, runnelv1.FieldMapValue, "y")))),
		part(entry(cat(vint(nil, 3, 9), str(nil, runnelv1.FieldMapKey, "k"), vint(nil, runnelv1.FieldMapKey, 5), vint(nil, runnelv1.FieldMapValue, 6)))),
		part(entry(cat(group(nil, 7, vint(nil, 1, 1)), str(nil, runnelv1.FieldMapKey, "k")))),
		part(entry(tag(nil, runnelv1.FieldMapKey, protowire.EndGroupType))),
		part(entry(tag(nil, 0, protowire.VarintType))),
		part(entry(cat(tag(nil, protowire.MaxValidNumber+1, protowire.VarintType), w{0}))),
		part(entry(str(nil, runnelv1.FieldMapKey, "\xff"))), part(entry(str(nil, runnelv1.FieldMapValue, "\xc3"))),
		part(entry(w{0x0a, 0x05, 'a'})),
		// Known fields with another wire type: unknown fields, kept.
		cat(bs(nil, runnelv1.FieldProduceCorrelationID, w("x")), vint(nil, runnelv1.FieldProducePartitions, 1), vint(nil, runnelv1.FieldProduceTransactionalID, 2)),
		cat(tag(nil, runnelv1.FieldProduceAcks, protowire.Fixed32Type), w{1, 2, 3, 4}, tag(nil, runnelv1.FieldProduceTimeoutMs, protowire.Fixed64Type), w{1, 2, 3, 4, 5, 6, 7, 8}),
		part(cat(vint(nil, runnelv1.FieldPartitionTopic, 1), vint(nil, runnelv1.FieldPartitionRecords, 2), tag(nil, runnelv1.FieldPartitionTraceContext, protowire.Fixed64Type), w{1, 2, 3, 4, 5, 6, 7, 8},
			bs(nil, runnelv1.FieldPartitionCurrentLeaderEpoch, w("e")), bs(nil, runnelv1.FieldPartitionPartition, w("p")))),
		group(nil, runnelv1.FieldProducePartitions, str(nil, runnelv1.FieldPartitionTopic, "g")),
		part(group(nil, runnelv1.FieldPartitionRecords, nil)),
		// Unknown fields of every kind, at both levels, the largest field number included.
		cat(vint(nil, 100, 1), group(nil, 101, cat(vint(nil, 1, 1), group(nil, 2, nil))), part(cat(vint(nil, 9, 9), bs(nil, protowire.MaxValidNumber, w("z"))))),
		// Bad field numbers and wire types, stray or mismatched end-group tags.
		vint(nil, 0, 1),
		cat(tag(nil, protowire.MaxValidNumber+1, protowire.VarintType), w{1}),
		part(cat(tag(nil, protowire.MaxValidNumber+1, protowire.VarintType), w{1})),
		w{0x0e, 0x00}, w{0x0f, 0x00}, part(w{0x0e}),
		tag(nil, 5, protowire.EndGroupType), part(tag(nil, 1, protowire.EndGroupType)),
		cat(tag(nil, 9, protowire.StartGroupType), tag(nil, 8, protowire.EndGroupType)),
		tag(nil, 9, protowire.StartGroupType),
		// Invalid UTF-8 in every string.
		str(nil, runnelv1.FieldProduceTransactionalID, "\xff"), part(str(nil, runnelv1.FieldPartitionTopic, "ok\xe2\x82")),
		// Overflowing and truncated varints, lengths past the end.
		w{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02},
		w{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		w{0x08}, w{0x80}, w{0x22, 0x05, 0x1a, 0x10}, part(w{0x1a, 0x03, 'a'}), w{0x2a, 0x80},
	}
	for i := range full { // every truncation of a complete request
		cases = append(cases, full[:i])
	}
	return cases
}

// TestProduceDecodeMatchesProto holds decodeProduceRequest to proto.Unmarshal on random requests and
// on the hand-made encodings.
func TestProduceDecodeMatchesProto(t *testing.T) {
	r := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	for i := range 3000 {
		req := randomProduceRequest(r)
		wire, err := proto.MarshalOptions{Deterministic: i%2 == 0}.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		checkProduceDecode(t, wire)
		var got runnelv1.ProduceRequest
		if _, err := decodeProduceRequest(wire, &got); err != nil || !proto.Equal(&got, req) {
			t.Fatalf("request %v decoded to %v (%v)", req, &got, err)
		}
	}
	for _, wire := range produceWireCases() {
		checkProduceDecode(t, wire)
	}
}

// FuzzProduceRequestDecode: for any bytes, decodeProduceRequest fails exactly when proto.Unmarshal
// does, and otherwise gives a proto.Equal message whose records alias the input.
func FuzzProduceRequestDecode(f *testing.F) {
	for _, wire := range produceWireCases() {
		f.Add(wire)
	}
	r := rand.New(rand.NewPCG(2, 3))
	for range 20 {
		wire, err := proto.Marshal(randomProduceRequest(r))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(wire)
	}
	f.Fuzz(func(t *testing.T, wire []byte) { checkProduceDecode(t, wire) })
}

// countProduceBufs counts produceBufs' entries.
func countProduceBufs() int {
	n := 0
	produceBufs.Range(func(_, _ any) bool { n++; return true })
	return n
}

// TestProduceCodecUnmarshal checks the codec's side: a request arriving in several gRPC buffers is
// decoded with its records in the one buffer takeProduceBuf hands out (once); a request without records
// leaves no entry; a malformed one fails with a wrapped error and leaves no entry; the entry of a
// request nobody takes goes away with the request.
func TestProduceCodecUnmarshal(t *testing.T) {
	want := &runnelv1.ProduceRequest{CorrelationId: 5, Acks: runnelv1.Acks_ACKS_ALL, Partitions: []*runnelv1.ProducePartition{
		{Topic: "a", Partition: 1, Records: bytes.Repeat([]byte("r"), 5000), TraceContext: map[string]string{"traceparent": "x"}},
		{Topic: "b", Partition: 2},
		{Topic: "a", Partition: 0, Records: []byte("tail")},
	}}
	wire, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var data mem.BufferSlice // as gRPC hands a message over: in pieces
	for rest := wire; len(rest) > 0; {
		n := min(len(rest), 1000)
		data = append(data, mem.SliceBuffer(bytes.Clone(rest[:n])))
		rest = rest[n:]
	}
	req := &runnelv1.ProduceRequest{}
	if err := (fetchCodec{}).Unmarshal(data, req); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(req, want) {
		t.Fatalf("decoded %v, want %v", req, want)
	}
	buf := takeProduceBuf(req)
	if buf == nil {
		t.Fatal("no records buffer recorded for the request")
	}
	for i, pp := range req.Partitions {
		if pp.Records != nil && !within(pp.Records, *buf) {
			t.Fatalf("partition %d: records are not in the request's buffer", i)
		}
	}
	if takeProduceBuf(req) != nil {
		t.Fatal("the buffer was handed out twice")
	}
	if takeProduceBuf(want) != nil {
		t.Fatal("a request the codec did not decode has a buffer")
	}

	noRecs, _ := proto.Marshal(&runnelv1.ProduceRequest{CorrelationId: 1, Partitions: []*runnelv1.ProducePartition{{Topic: "a"}}})
	// A good partition with records, then one whose records run past the end.
	bad := []byte{0x22, 0x03, 0x1a, 0x01, 'r', 0x22, 0x05, 0x1a, 0x10, 'x', 'y', 'z'}
	before := countProduceBufs()
	for _, in := range [][]byte{noRecs, bad} {
		req := &runnelv1.ProduceRequest{}
		err := (fetchCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(in)}, req)
		if len(in) == len(bad) {
			if err == nil || !strings.Contains(err.Error(), "decode runnel.v1.ProduceRequest: partitions[1]: field 3: unexpected EOF") {
				t.Fatalf("malformed request: error %v", err)
			}
			if len(req.Partitions) != 0 { // the buffer went back: nothing may point into it
				t.Fatalf("a failed decode left %v", req)
			}
		} else if err != nil {
			t.Fatal(err)
		}
		if n := countProduceBufs(); n != before {
			t.Fatalf("%x left %d entries in produceBufs, want %d", in, n, before)
		}
	}

	// A request nobody takes: the entry goes once the request is garbage.
	func() {
		if err := (fetchCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &runnelv1.ProduceRequest{}); err != nil {
			t.Fatal(err)
		}
	}()
	if countProduceBufs() != before+1 {
		t.Fatalf("the decoded request has no entry")
	}
	waitUntil(t, "the entry of a dropped request removed", func() error {
		runtime.GC()
		if n := countProduceBufs(); n != before {
			return fmt.Errorf("%d entries, want %d", n, before)
		}
		return nil
	})
}

// produceCtx is a test's context, with a deadline.
func produceCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// produceNode is a real broker (Badger in a temporary directory) serving Records on 127.0.0.1 with
// the node's codec, and a client of it.
type produceNode struct {
	b   *Broker
	cli runnelv1.RecordsClient
	cc  *grpc.ClientConn
}

func startProduceNode(t *testing.T, topics map[string]int32) *produceNode {
	t.Helper()
	cl := startTestCluster(t, 1)
	b := cl.brokers[1]
	for name, parts := range topics {
		if _, err := cl.q.propose(meta.Command{Type: meta.CmdCreateTopic, TopicID: name + "-id",
			Spec: &meta.Spec{Name: name, Partitions: parts, ReplicationFactor: 1}}); err != nil {
			t.Fatal(err)
		}
		for p := range parts {
			waitUntil(t, "partition ready", func() error { _, _, err := b.partition(name, p); return err })
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(ServerCodec(), grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes))
	runnelv1.RegisterRecordsServer(srv, b)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-served }) // before the broker closes (cleanups run last first)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &produceNode{b: b, cli: runnelv1.NewRecordsClient(cc), cc: cc}
}

// stored returns the batches of topic-partition in the log, from offset 0 up to the HW.
func (n *produceNode) stored(t *testing.T, topic string, partition int32) [][]byte {
	t.Helper()
	var out [][]byte
	for off := int64(0); ; {
		resp, err := n.b.Fetch(context.Background(), &runnelv1.FetchRequest{Partitions: []*runnelv1.FetchPartition{
			{Topic: topic, Partition: partition, FetchOffset: off, PartitionMaxBytes: 1 << 20}}})
		if err != nil {
			t.Fatal(err)
		}
		r := resp.Partitions[0]
		if r.Error != nil && r.Error.Code != runnelv1.ErrorCode_NONE {
			t.Fatalf("fetch %s-%d at %d: %v", topic, partition, off, r.Error)
		}
		if len(r.Records) == 0 {
			return out
		}
		if err := batch.Split(r.Records, func(b []byte, h batch.Header) error {
			if _, err := batch.Validate(b); err != nil {
				return err
			}
			out = append(out, bytes.Clone(b))
			off = h.NextOffset()
			return nil
		}); err != nil {
			t.Fatalf("fetch %s-%d: %v", topic, partition, err)
		}
	}
}

// sameBatches compares stored batches with the ones sent, but for the fields the broker stamps (base
// offset, partition leader epoch: both outside the CRC).
func sameBatches(t *testing.T, what string, stored, sent [][]byte) {
	t.Helper()
	if len(stored) != len(sent) {
		t.Fatalf("%s: %d batches stored, %d sent", what, len(stored), len(sent))
	}
	for i := range sent {
		s, w := stored[i], sent[i]
		if len(s) != len(w) || !bytes.Equal(s[8:12], w[8:12]) || !bytes.Equal(s[16:], w[16:]) {
			t.Fatalf("%s: batch %d stored differs from the one sent", what, i)
		}
	}
}

// testBatch is a plain batch of n records whose values name tag.
func testBatch(tag string, n int) []byte {
	var bb batch.Builder
	for i := range n {
		bb.Append(1000+int64(i), []byte("k"), []byte(fmt.Sprintf("%s-%d-%s", tag, i, strings.Repeat("v", 90))), nil)
	}
	return bytes.Clone(bb.Build(batch.CompressionNone))
}

// releases counts the produce buffers returned to recordBufs, poisoning each first: any reader of
// the records after the release (an append still queued, a store that kept a reference) finds 0xEE.
type releases struct{ n atomic.Int64 }

func (r *releases) hook(buf *[]byte) {
	b := (*buf)[:cap(*buf)]
	for i := range b {
		b[i] = 0xEE
	}
	r.n.Add(1)
}

// TestProduceThroughNodeKeepsRecords produces through the node's codec (ProduceStream with many
// requests in flight, and unary Produce), several partitions and batches per request, and checks that
// every partition stores exactly the batches sent, in order, and that each request's buffer went back
// to the pool exactly once. Buffers are poisoned when they go back, so a buffer returned while an append
// still needed it would show up as damaged or different stored batches.
func TestProduceThroughNodeKeepsRecords(t *testing.T) {
	var rel releases
	hook := rel.hook
	testHookProduceBufReleased.Store(&hook)
	t.Cleanup(func() { testHookProduceBufReleased.Store(nil) }) // after the node stopped
	const topic, parts = "keep", 4
	n := startProduceNode(t, map[string]int32{topic: parts})
	ctx := produceCtx(t)
	sent := make([][][]byte, parts)

	stream, err := n.cli.ProduceStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const requests = 60
	for i := range requests {
		req := &runnelv1.ProduceRequest{CorrelationId: int64(i), Acks: runnelv1.Acks_ACKS_ALL, TimeoutMs: 20_000}
		for p := range int32(parts) {
			if (i+int(p))%3 == 2 {
				continue // not every partition in every request
			}
			var recs []byte
			for j := range 1 + (i+int(p))%3 {
				b := testBatch(fmt.Sprintf("s%d-p%d-b%d", i, p, j), 1+(i*7+j)%20)
				sent[p] = append(sent[p], b)
				recs = append(recs, b...)
			}
			req.Partitions = append(req.Partitions, &runnelv1.ProducePartition{Topic: topic, Partition: p, Records: recs})
		}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	for range requests {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Partitions {
			if r.Error != nil && r.Error.Code != runnelv1.ErrorCode_NONE {
				t.Fatalf("request %d, partition %d: %v", resp.CorrelationId, r.Partition, r.Error)
			}
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err == nil {
		t.Fatal("the stream answered more than it was sent")
	}

	// acks=all: the answer comes once the HW passed the batches, so stored (which reads up to the HW)
	// sees them; with acks=1 the answer may come before the fsync that moves the HW.
	unary := &runnelv1.ProduceRequest{Acks: runnelv1.Acks_ACKS_ALL}
	for p := range int32(parts) {
		b := testBatch(fmt.Sprintf("unary-p%d", p), 5)
		sent[p] = append(sent[p], b)
		unary.Partitions = append(unary.Partitions, &runnelv1.ProducePartition{Topic: topic, Partition: p, Records: b})
	}
	resp, err := n.cli.Produce(ctx, unary)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.Partitions {
		if r.Error != nil && r.Error.Code != runnelv1.ErrorCode_NONE {
			t.Fatalf("unary produce, partition %d: %v", r.Partition, r.Error)
		}
	}

	// Each request's buffer goes back once, after its answer may have gone out.
	waitUntil(t, "every request's buffer returned", func() error {
		if got := rel.n.Load(); got < requests+1 {
			return fmt.Errorf("%d of %d returned", got, requests+1)
		}
		return nil
	})
	for p := range int32(parts) {
		sameBatches(t, fmt.Sprintf("partition %d", p), n.stored(t, topic, p), sent[p])
	}
	if got := rel.n.Load(); got != requests+1 {
		t.Fatalf("%d buffers returned for %d requests", got, requests+1)
	}
	if c := countProduceBufs(); c != 0 {
		t.Fatalf("%d produceBufs entries left behind", c)
	}
}

// TestProduceBufferOutlivesTimeout: a request times out while one of its partitions has not been
// enqueued yet (held in testHookBeforeAppend, as a slow transaction verification or a full write queue
// would hold it). The client gets REQUEST_TIMED_OUT for it, but the buffer must stay out of the pool
// until that append ran: the partition then stores exactly what was sent. Returning the buffer when the
// call finished (at the timeout) fails both checks.
func TestProduceBufferOutlivesTimeout(t *testing.T) {
	var rel releases
	entered, gate := make(chan struct{}), make(chan struct{})
	var enterOnce, openOnce sync.Once
	open := func() { openOnce.Do(func() { close(gate) }) }
	hook := rel.hook
	testHookProduceBufReleased.Store(&hook)
	testHookBeforeAppend = func(pp *runnelv1.ProducePartition) {
		if pp.Topic == "slow" && pp.Partition == 1 {
			enterOnce.Do(func() { close(entered) })
			<-gate
		}
	}
	t.Cleanup(func() { testHookProduceBufReleased.Store(nil); testHookBeforeAppend = nil })
	n := startProduceNode(t, map[string]int32{"slow": 3})
	t.Cleanup(open) // runs before the node stops: no handler stays held
	ctx := produceCtx(t)

	stream, err := n.cli.ProduceStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sent := make([][]byte, 3)
	// acks=all: a partition's callback, and so the buffer's return, comes after the HW passed its batches.
	req := &runnelv1.ProduceRequest{Acks: runnelv1.Acks_ACKS_ALL, TimeoutMs: 1000}
	for p := range int32(3) {
		sent[p] = testBatch(fmt.Sprintf("slow-p%d", p), 30)
		req.Partitions = append(req.Partitions, &runnelv1.ProducePartition{Topic: "slow", Partition: p, Records: sent[p]})
	}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, "partition 1 held before its append", entered)
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.Partitions {
		want := runnelv1.ErrorCode_REQUEST_TIMED_OUT
		if r.Partition == 0 {
			want = runnelv1.ErrorCode_NONE
		}
		if got := r.GetError().GetCode(); got != want {
			t.Fatalf("partition %d answered %v (%v), want %v", r.Partition, got, r.Error, want)
		}
	}
	if got := rel.n.Load(); got != 0 {
		t.Fatalf("the buffer went back to the pool at the timeout, with partitions 1 and 2 not appended yet")
	}
	open()
	waitUntil(t, "the buffer returned after the held appends", func() error {
		if rel.n.Load() == 0 {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	if got := rel.n.Load(); got != 1 {
		t.Fatalf("%d buffers returned for one request", got)
	}
	for p := range int32(3) {
		sameBatches(t, fmt.Sprintf("partition %d", p), n.stored(t, "slow", p), [][]byte{sent[p]})
	}

	// A request refused before anything was enqueued gives its buffer back at once and ends the stream.
	if err := stream.Send(&runnelv1.ProduceRequest{Acks: 7, Partitions: []*runnelv1.ProducePartition{{Topic: "slow", Records: sent[0]}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !strings.Contains(fmt.Sprint(err), "acks 7") {
		t.Fatalf("a request with acks 7: %v", err)
	}
	waitUntil(t, "the refused request's buffer returned", func() error {
		if got := rel.n.Load(); got != 2 {
			return fmt.Errorf("%d buffers returned, want 2", got)
		}
		return nil
	})
	if c := countProduceBufs(); c != 0 {
		t.Fatalf("%d produceBufs entries left behind", c)
	}
}

// rawCodec sends and receives messages as the bytes they are.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// TestMalformedProduceStatus: a produce request the node cannot decode fails the call with gRPC's
// status for codec errors (INTERNAL), whose message says what is wrong with the request.
func TestMalformedProduceStatus(t *testing.T) {
	n := startProduceNode(t, nil)
	var out []byte
	err := n.cc.Invoke(produceCtx(t), runnelv1.Records_Produce_FullMethodName, []byte{0x22, 0x04, 0x0a, 0x02, 0xff, 0xfe}, &out, grpc.ForceCodecV2(rawCodec{}))
	st := status.Convert(err)
	if st.Code() != codes.Internal || !strings.Contains(st.Message(), "decode runnel.v1.ProduceRequest: partitions[0]: topic: string field contains invalid UTF-8") {
		t.Fatalf("malformed request: %v", err)
	}
	if c := countProduceBufs(); c != 0 {
		t.Fatalf("%d produceBufs entries left behind", c)
	}
}
