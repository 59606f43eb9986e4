package platform_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/platform"
	"github.com/runnel-io/runnel/platform/platformtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// testNode is a real node on 127.0.0.1 with a raw gRPC connection, so tests can send bytes the SDK
// would never produce.
type testNode struct {
	node    *platform.Node
	conn    *grpc.ClientConn
	records runnelv1.RecordsClient
	admin   runnelv1.AdminClient
}

func startNode(t testing.TB, dir string, mutate ...func(*platform.Config)) *testNode {
	t.Helper()
	n := platformtest.StartNode(t, dir, mutate...)
	conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(128<<20), grpc.MaxCallSendMsgSize(128<<20)))
	if err != nil {
		t.Fatal(err)
	}
	tn := &testNode{node: n, conn: conn, records: runnelv1.NewRecordsClient(conn), admin: runnelv1.NewAdminClient(conn)}
	t.Cleanup(tn.close)
	return tn
}

func (tn *testNode) close() {
	tn.conn.Close()
	tn.node.Close()
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (tn *testNode) createTopic(t *testing.T, name string, partitions int32, configs map[string]string) {
	t.Helper()
	resp, err := tn.admin.CreateTopics(ctxT(t), &runnelv1.CreateTopicsRequest{Topics: []*runnelv1.NewTopic{{Name: name, Partitions: partitions, Configs: configs}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := rerr.FromInfo(resp.Topics[0].Error); err != nil {
		t.Fatal(err)
	}
}

// makeBatch encodes n records "<prefix>-i" with keys "k<i%3>" and timestamps ts0+i.
func makeBatch(prefix string, n int, ts0 int64, c batch.Compression) []byte {
	var b batch.Builder
	for i := 0; i < n; i++ {
		b.Append(ts0+int64(i), []byte(fmt.Sprintf("k%d", i%3)), []byte(fmt.Sprintf("%s-%d", prefix, i)),
			[]batch.RecordHeader{{Key: "h", Value: []byte("v")}})
	}
	return append([]byte(nil), b.Build(c)...)
}

func (tn *testNode) produce(t *testing.T, topic string, partition int32, records []byte, acks runnelv1.Acks) (*runnelv1.ProducePartitionResult, error) {
	t.Helper()
	resp, err := tn.records.Produce(ctxT(t), &runnelv1.ProduceRequest{Acks: acks, Partitions: []*runnelv1.ProducePartition{{Topic: topic, Partition: partition, Records: records}}})
	if err != nil {
		return nil, rerr.FromStatus(err)
	}
	r := resp.Partitions[0]
	return r, rerr.FromInfo(r.Error)
}

func (tn *testNode) fetch(t *testing.T, topic string, partition int32, offset int64, maxBytes int32) (*runnelv1.FetchPartitionResult, error) {
	t.Helper()
	resp, err := tn.records.Fetch(ctxT(t), &runnelv1.FetchRequest{MaxBytes: maxBytes, Partitions: []*runnelv1.FetchPartition{{Topic: topic, Partition: partition, FetchOffset: offset}}})
	if err != nil {
		return nil, rerr.FromStatus(err)
	}
	r := resp.Partitions[0]
	return r, rerr.FromInfo(r.Error)
}

// values decodes every record of fetched batches from offset on.
func values(t *testing.T, recs []byte, from int64) (offsets []int64, vals []string) {
	t.Helper()
	err := batch.Split(recs, func(b []byte, _ batch.Header) error {
		return batch.DecodeRecords(b, func(r batch.Record) error {
			if r.Offset >= from {
				offsets = append(offsets, r.Offset)
				vals = append(vals, string(r.Value))
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return offsets, vals
}

// readAll fetches partition from offset 0 to the high watermark.
func (tn *testNode) readAll(t *testing.T, topic string, partition int32) []string {
	t.Helper()
	var all []string
	next := int64(0)
	for {
		r, err := tn.fetch(t, topic, partition, next, 0)
		if err != nil {
			t.Fatal(err)
		}
		offs, vals := values(t, r.Records, next)
		for i, o := range offs {
			if o != next+int64(i) {
				t.Fatalf("offset %d at position %d, want %d", o, i, next+int64(i))
			}
		}
		all = append(all, vals...)
		next += int64(len(offs))
		if next >= r.HighWatermark {
			return all
		}
	}
}

func TestProduceFetchListOffsets(t *testing.T) {
	tn := startNode(t, t.TempDir())
	tn.createTopic(t, "events", 2, nil)
	ts0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	var want []string
	for i, c := range []batch.Compression{batch.CompressionNone, batch.CompressionGzip, batch.CompressionSnappy, batch.CompressionLZ4, batch.CompressionZstd} {
		prefix := fmt.Sprintf("b%d", i)
		r, err := tn.produce(t, "events", 1, makeBatch(prefix, 10, ts0+int64(i*100), c), runnelv1.Acks_ACKS_ALL)
		if err != nil {
			t.Fatalf("produce %v: %v", c, err)
		}
		if r.BaseOffset != int64(i*10) {
			t.Fatalf("batch %d base offset %d, want %d", i, r.BaseOffset, i*10)
		}
		for j := 0; j < 10; j++ {
			want = append(want, fmt.Sprintf("%s-%d", prefix, j))
		}
	}
	got := tn.readAll(t, "events", 1)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("read back\n%v\nwant\n%v", got, want)
	}
	// A fetch from the middle of a batch returns that whole batch; the client skips the records below.
	r, err := tn.fetch(t, "events", 1, 15, 0)
	if err != nil {
		t.Fatal(err)
	}
	if offs, _ := values(t, r.Records, 0); offs[0] != 10 {
		t.Fatalf("fetch at 15 starts at %d, want the batch at 10", offs[0])
	}
	lo, err := tn.records.ListOffsets(ctxT(t), &runnelv1.ListOffsetsRequest{Partitions: []*runnelv1.ListOffsetsPartition{
		{Topic: "events", Partition: 1, Spec: runnelv1.OffsetSpec_EARLIEST},
		{Topic: "events", Partition: 1, Spec: runnelv1.OffsetSpec_LATEST},
		{Topic: "events", Partition: 1, Spec: runnelv1.OffsetSpec_TIMESTAMP, Timestamp: ts0 + 205},
		{Topic: "events", Partition: 1, Spec: runnelv1.OffsetSpec_TIMESTAMP, Timestamp: ts0 + 100000},
		{Topic: "events", Partition: 0, Spec: runnelv1.OffsetSpec_LATEST},
		{Topic: "events", Partition: 7, Spec: runnelv1.OffsetSpec_LATEST},
	}})
	if err != nil {
		t.Fatal(err)
	}
	p := lo.Partitions
	if p[0].Offset != 0 || p[1].Offset != 50 || p[2].Offset != 25 || p[2].Timestamp != ts0+205 || p[3].Offset != -1 || p[4].Offset != 0 {
		t.Fatalf("list offsets: %v", p)
	}
	if !errors.Is(rerr.FromInfo(p[5].Error), rerr.ErrUnknownTopicOrPartition) {
		t.Fatalf("partition 7: %v", p[5].Error)
	}
	md, err := tn.records.Metadata(ctxT(t), &runnelv1.MetadataRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Metadata lists internal topics too (__consumer_offsets, flagged internal), as Kafka's does.
	md.Topics = slices.DeleteFunc(md.Topics, func(t *runnelv1.TopicMetadata) bool { return t.Internal })
	if len(md.Brokers) != 1 || md.Brokers[0].GrpcAddr != tn.node.GRPCAddr() || len(md.Topics) != 1 || len(md.Topics[0].Partitions) != 2 {
		t.Fatalf("metadata: %v", md)
	}
	hc, err := healthpb.NewHealthClient(tn.conn).Check(ctxT(t), &healthpb.HealthCheckRequest{})
	if err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", hc, err)
	}
}

func TestLogAppendTime(t *testing.T) {
	tn := startNode(t, t.TempDir())
	tn.createTopic(t, "lat", 1, map[string]string{"message.timestamp.type": "LogAppendTime"})
	before := time.Now().UnixMilli()
	// acks=all: the answer comes once the high watermark covers the batch, so the fetch below sees it
	// (acks=1 answers before the fsync that moves the high watermark here).
	r, err := tn.produce(t, "lat", 0, makeBatch("x", 3, 1000, batch.CompressionNone), runnelv1.Acks_ACKS_ALL)
	if err != nil {
		t.Fatal(err)
	}
	if r.LogAppendTimeMs < before {
		t.Fatalf("log append time %d before %d", r.LogAppendTimeMs, before)
	}
	f, err := tn.fetch(t, "lat", 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	err = batch.Split(f.Records, func(b []byte, _ batch.Header) error {
		return batch.DecodeRecords(b, func(rec batch.Record) error {
			n++
			if rec.Timestamp != r.LogAppendTimeMs {
				return fmt.Errorf("record %d timestamp %d, want append time %d", rec.Offset, rec.Timestamp, r.LogAppendTimeMs)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("fetched %d records, want the 3 produced", n)
	}
}

// TestBatchLargerThanValueLogFile: a node whose value-log files are 1 MiB (--value-log-file-size)
// refuses a batch of 2 MiB that the topic's max.message.bytes allows, with MESSAGE_TOO_LARGE naming
// the topic as the client knows it, stores nothing of it, and keeps taking batches that fit.
func TestBatchLargerThanValueLogFile(t *testing.T) {
	tn := startNode(t, t.TempDir(), func(c *platform.Config) { c.ValueLogFileBytes = 1 << 20 })
	tn.createTopic(t, "wide", 1, map[string]string{"max.message.bytes": fmt.Sprint(4 << 20)})
	if _, err := tn.produce(t, "wide", 0, makeBatch("keep", 3, 1, batch.CompressionNone), runnelv1.Acks_ACKS_ALL); err != nil {
		t.Fatal(err)
	}
	big := makeBatch(string(bytes.Repeat([]byte("x"), 2<<20)), 1, 1, batch.CompressionNone)
	_, err := tn.produce(t, "wide", 0, big, runnelv1.Acks_ACKS_ALL)
	if !errors.Is(err, rerr.ErrMessageTooLarge) || !strings.Contains(err.Error(), "wide-0: ") || !strings.Contains(err.Error(), "value-log file size 1048576") {
		t.Fatalf("2 MiB batch with 1 MiB value-log files: %v", err)
	}
	if _, err := tn.produce(t, "wide", 0, makeBatch("after", 2, 1, batch.CompressionNone), runnelv1.Acks_ACKS_ALL); err != nil {
		t.Fatal(err)
	}
	if got := tn.readAll(t, "wide", 0); strings.Join(got, ",") != "keep-0,keep-1,keep-2,after-0,after-1" {
		t.Fatalf("stored: %v", got)
	}
}

// TestBadInput sends each kind of bad request and checks the specific error, that the node keeps
// serving, and that the stored data is unchanged.
func TestBadInput(t *testing.T) {
	tn := startNode(t, t.TempDir())
	tn.createTopic(t, "good", 1, map[string]string{"max.message.bytes": "4096"})
	if _, err := tn.produce(t, "good", 0, makeBatch("keep", 5, 1, batch.CompressionNone), runnelv1.Acks_ACKS_ALL); err != nil {
		t.Fatal(err)
	}
	stored := tn.readAll(t, "good", 0)

	valid := makeBatch("bad", 3, 1, batch.CompressionNone)
	badCRC := append([]byte(nil), valid...)
	badCRC[len(badCRC)-1] ^= 0xff
	badMagic := append([]byte(nil), valid...)
	badMagic[16] = 1
	badLength := append([]byte(nil), valid...)
	badLength[11] = 0xff // batchLength points past the end
	badFraming := append([]byte(nil), valid...)
	badFraming[batch.HeaderSize] = 0x7f // first record's length varint now lies
	copy(badFraming[17:21], []byte{0, 0, 0, 0})
	crc := batch.Checksum(badFraming)
	badFraming[17], badFraming[18], badFraming[19], badFraming[20] = byte(crc>>24), byte(crc>>16), byte(crc>>8), byte(crc)
	big := makeBatch(string(bytes.Repeat([]byte("x"), 5000)), 1, 1, batch.CompressionNone)

	cases := []struct {
		name      string
		topic     string
		partition int32
		records   []byte
		want      error
	}{
		{"wrong CRC", "good", 0, badCRC, rerr.ErrCorruptMessage},
		{"truncated header", "good", 0, valid[:40], rerr.ErrCorruptMessage},
		{"truncated batch", "good", 0, valid[:len(valid)-3], rerr.ErrCorruptMessage},
		{"length past end", "good", 0, badLength, rerr.ErrCorruptMessage},
		{"bad record framing", "good", 0, badFraming, rerr.ErrCorruptMessage},
		{"valid then garbage", "good", 0, append(append([]byte(nil), valid...), 1, 2, 3), rerr.ErrCorruptMessage},
		{"old magic", "good", 0, badMagic, rerr.ErrUnsupportedForFormat},
		{"empty", "good", 0, nil, rerr.ErrCorruptMessage},
		{"over max.message.bytes", "good", 0, big, rerr.ErrMessageTooLarge},
		{"unknown topic", "nope", 0, valid, rerr.ErrUnknownTopicOrPartition},
		{"unknown partition", "good", 3, valid, rerr.ErrUnknownTopicOrPartition},
		{"negative partition", "good", -1, valid, rerr.ErrUnknownTopicOrPartition},
	}
	for _, c := range cases {
		_, err := tn.produce(t, c.topic, c.partition, c.records, runnelv1.Acks_ACKS_ALL)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	// Whole-request errors are gRPC statuses with the typed detail.
	_, err := tn.records.Produce(ctxT(t), &runnelv1.ProduceRequest{Acks: 7, Partitions: []*runnelv1.ProducePartition{{Topic: "good", Records: valid}}})
	if status.Code(err) != codes.InvalidArgument || !errors.Is(rerr.FromStatus(err), rerr.ErrInvalidRequiredAcks) {
		t.Errorf("bad acks: %v", err)
	}
	fetchCases := []struct {
		name   string
		offset int64
		want   error
	}{
		{"negative offset", -1, rerr.ErrOffsetOutOfRange},
		{"offset past the end", 1000, rerr.ErrOffsetOutOfRange},
	}
	for _, c := range fetchCases {
		if _, err := tn.fetch(t, "good", 0, c.offset, 0); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := tn.fetch(t, "nope", 0, 0, 0); !errors.Is(err, rerr.ErrUnknownTopicOrPartition) {
		t.Errorf("fetch unknown topic: %v", err)
	}
	if _, err := tn.fetch(t, "good", 0, 0, -5); !errors.Is(err, rerr.ErrInvalidFetchSize) {
		t.Errorf("negative max_bytes: %v", err)
	}
	// Zero and huge max_bytes are served (defaulted and capped).
	for _, mb := range []int32{0, 1 << 30} {
		if r, err := tn.fetch(t, "good", 0, 0, mb); err != nil || len(r.Records) == 0 {
			t.Errorf("max_bytes %d: %v (%d bytes)", mb, err, len(r.Records))
		}
	}
	// max_bytes of 1 still returns the first batch, so a consumer always progresses (KIP-74).
	if r, err := tn.fetch(t, "good", 0, 0, 1); err != nil || len(r.Records) == 0 {
		t.Errorf("max_bytes 1: %v (%d bytes)", err, len(r.Records))
	}
	// Invalid topic names and configs.
	for _, nt := range []*runnelv1.NewTopic{{Name: "bad name"}, {Name: ""}, {Name: "x", Configs: map[string]string{"retention.ms": "soon"}}, {Name: "good"}, {Name: "y", Partitions: 100000}} {
		resp, err := tn.admin.CreateTopics(ctxT(t), &runnelv1.CreateTopicsRequest{Topics: []*runnelv1.NewTopic{nt}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Topics[0].Error == nil {
			t.Errorf("create %+v succeeded", nt)
		}
	}
	// A request over the gRPC message cap is refused by the transport.
	huge := make([]byte, 70<<20)
	_, err = tn.records.Produce(ctxT(t), &runnelv1.ProduceRequest{Partitions: []*runnelv1.ProducePartition{{Topic: "good", Records: huge}}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("over-size request: %v, want ResourceExhausted", err)
	}
	// Nothing stored changed, and the node still serves.
	if got := tn.readAll(t, "good", 0); fmt.Sprint(got) != fmt.Sprint(stored) {
		t.Fatalf("stored data changed by bad input: %v, was %v", got, stored)
	}
	if _, err := tn.produce(t, "good", 0, makeBatch("after", 1, 1, batch.CompressionNone), runnelv1.Acks_ACKS_ALL); err != nil {
		t.Fatalf("node no longer serves: %v", err)
	}
}

func TestFetchLongPoll(t *testing.T) {
	tn := startNode(t, t.TempDir())
	tn.createTopic(t, "poll", 1, nil)
	type result struct {
		r   *runnelv1.FetchResponse
		err error
	}
	wait := func(topic string) chan result {
		ch := make(chan result, 1)
		go func() {
			r, err := tn.records.Fetch(ctxT(t), &runnelv1.FetchRequest{MaxWaitMs: 20000, MinBytes: 1,
				Partitions: []*runnelv1.FetchPartition{{Topic: topic, Partition: 0, FetchOffset: 0}}})
			ch <- result{r, err}
		}()
		return ch
	}
	// An empty max_wait returns at once with nothing.
	r, err := tn.records.Fetch(ctxT(t), &runnelv1.FetchRequest{Partitions: []*runnelv1.FetchPartition{{Topic: "poll"}}})
	if err != nil || len(r.Partitions[0].Records) != 0 {
		t.Fatalf("immediate fetch: %v %v", r, err)
	}
	ch := wait("poll")
	select {
	case res := <-ch:
		t.Fatalf("long poll answered before any data: %v %v", res.r, res.err)
	case <-time.After(100 * time.Millisecond): // only checks that the poll is still waiting
	}
	start := time.Now()
	if _, err := tn.produce(t, "poll", 0, makeBatch("wake", 2, 1, batch.CompressionNone), runnelv1.Acks_ACKS_LEADER); err != nil {
		t.Fatal(err)
	}
	res := <-ch
	if res.err != nil || len(res.r.Partitions[0].Records) == 0 {
		t.Fatalf("woken poll: %v %v", res.r, res.err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("long poll woke only after %v", time.Since(start))
	}
	// A topic deleted while a fetch waits on it ends the wait with UNKNOWN_TOPIC_OR_PARTITION.
	tn.createTopic(t, "doomed", 1, nil)
	ch = wait("doomed")
	dr, err := tn.admin.DeleteTopics(ctxT(t), &runnelv1.DeleteTopicsRequest{Topics: []string{"doomed"}})
	if err != nil || dr.Topics[0].Error != nil {
		t.Fatalf("delete: %v %v", dr, err)
	}
	res = <-ch
	if res.err != nil || !errors.Is(rerr.FromInfo(res.r.Partitions[0].Error), rerr.ErrUnknownTopicOrPartition) {
		t.Fatalf("fetch on deleted topic: %v %v", res.r, res.err)
	}
}

func TestProduceStreamKeepsOrder(t *testing.T) {
	tn := startNode(t, t.TempDir())
	tn.createTopic(t, "stream", 1, nil)
	stream, err := tn.records.ProduceStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	go func() {
		for i := 0; i < n; i++ {
			acks := runnelv1.Acks_ACKS_LEADER
			if i%3 == 0 {
				acks = runnelv1.Acks_ACKS_ALL
			}
			stream.Send(&runnelv1.ProduceRequest{CorrelationId: int64(i), Acks: acks, Partitions: []*runnelv1.ProducePartition{
				{Topic: "stream", Records: makeBatch(fmt.Sprintf("r%d", i), 1, int64(i), batch.CompressionNone)}}})
		}
		stream.CloseSend()
	}()
	seen := map[int64]int64{}
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if e := rerr.FromInfo(resp.Partitions[0].Error); e != nil {
			t.Fatal(e)
		}
		seen[resp.CorrelationId] = resp.Partitions[0].BaseOffset
	}
	if len(seen) != n {
		t.Fatalf("%d answers, want %d", len(seen), n)
	}
	for id, off := range seen {
		if off != id {
			t.Fatalf("request %d got offset %d: pipelined requests were reordered", id, off)
		}
	}
}

func TestRetentionMovesLogStart(t *testing.T) {
	tn := startNode(t, t.TempDir())
	tn.createTopic(t, "short", 1, map[string]string{"retention.bytes": "1"})
	for i := 0; i < 5; i++ {
		if _, err := tn.produce(t, "short", 0, makeBatch(fmt.Sprint(i), 10, 1, batch.CompressionNone), runnelv1.Acks_ACKS_ALL); err != nil {
			t.Fatal(err)
		}
	}
	if n := tn.node.Broker().ApplyRetention(time.Now()); n == 0 {
		t.Fatal("retention deleted nothing")
	}
	lo, err := tn.records.ListOffsets(ctxT(t), &runnelv1.ListOffsetsRequest{Partitions: []*runnelv1.ListOffsetsPartition{{Topic: "short", Spec: runnelv1.OffsetSpec_EARLIEST}}})
	if err != nil {
		t.Fatal(err)
	}
	start := lo.Partitions[0].Offset
	if start == 0 || start%10 != 0 {
		t.Fatalf("log start %d: want whole batches deleted", start)
	}
	if _, err := tn.fetch(t, "short", 0, 0, 0); !errors.Is(err, rerr.ErrOffsetOutOfRange) {
		t.Fatalf("fetch below log start: %v", err)
	}
	if _, err := tn.fetch(t, "short", 0, start, 0); err != nil {
		t.Fatalf("fetch at log start: %v", err)
	}
}

func TestRestartKeepsTopicsAndData(t *testing.T) {
	dir := t.TempDir()
	tn := startNode(t, dir)
	tn.createTopic(t, "durable", 3, map[string]string{"retention.ms": "-1"})
	for p := int32(0); p < 3; p++ {
		if _, err := tn.produce(t, "durable", p, makeBatch(fmt.Sprintf("p%d", p), 7, 1, batch.CompressionZstd), runnelv1.Acks_ACKS_ALL); err != nil {
			t.Fatal(err)
		}
	}
	before := [3][]string{}
	for p := int32(0); p < 3; p++ {
		before[p] = tn.readAll(t, "durable", p)
	}
	// Several topics created after it: on a restart the node replays its metadata log, and must not
	// take the logs of topics it has not replayed yet for stray ones (a bug once).
	for i := 0; i < 5; i++ {
		tn.createTopic(t, fmt.Sprint("later-", i), 1, nil)
		if _, err := tn.produce(t, fmt.Sprint("later-", i), 0, makeBatch("x", 2, 1, batch.CompressionNone), runnelv1.Acks_ACKS_ALL); err != nil {
			t.Fatal(err)
		}
	}
	for restart := 0; restart < 4; restart++ {
		tn.close()
		tn = startNode(t, dir)
		for p := int32(0); p < 3; p++ {
			if got := tn.readAll(t, "durable", p); fmt.Sprint(got) != fmt.Sprint(before[p]) {
				t.Fatalf("restart %d: partition %d: %v, want %v", restart, p, got, before[p])
			}
		}
		for i := 0; i < 5; i++ {
			if got := tn.readAll(t, fmt.Sprint("later-", i), 0); len(got) != 2 {
				t.Fatalf("restart %d: later-%d has %d records, want 2", restart, i, len(got))
			}
		}
	}
	r, err := tn.produce(t, "durable", 0, makeBatch("more", 1, 1, batch.CompressionNone), runnelv1.Acks_ACKS_ALL)
	if err != nil || r.BaseOffset != 7 {
		t.Fatalf("append after restart: offset %v err %v, want 7", r, err)
	}
	d, err := tn.admin.DescribeTopics(ctxT(t), &runnelv1.DescribeTopicsRequest{Topics: []string{"durable"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range d.Topics[0].Configs {
		if c.Name == "retention.ms" && (c.Value != "-1" || c.IsDefault) {
			t.Fatalf("retention.ms after restart: %+v", c)
		}
	}
}

func TestHTTPHealth(t *testing.T) {
	tn := startNode(t, t.TempDir())
	for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ready\n"} {
		resp, err := http.Get("http://" + tn.node.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != want {
			t.Fatalf("%s: %d %q", path, resp.StatusCode, body)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for name, m := range map[string]func(*platform.Config){
		"empty data dir": func(c *platform.Config) { c.DataDir = "" },
		"bad grpc addr":  func(c *platform.Config) { c.GRPCAddr = "nowhere" },
		"tiny memtable":  func(c *platform.Config) { c.MemTableBytes = 10 },
		"zero interval":  func(c *platform.Config) { c.RetentionCheckInterval = 0 },
		"bad voters":     func(c *platform.Config) { c.ControllerVoters = "1@a:1,2@b:2" },
		"voters no serf": func(c *platform.Config) { c.ControllerVoters = "1@a:1,2@b:2,3@c:3"; c.SerfAddr = "" },
		"bad gossip key": func(c *platform.Config) { c.GossipKey = "c2hvcnQ=" },
		"short session":  func(c *platform.Config) { c.BrokerSessionTimeout = c.BrokerHeartbeatInterval },
	} {
		cfg := platform.DefaultConfig()
		m(&cfg)
		if _, err := platform.New(cfg, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := platform.DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
}
