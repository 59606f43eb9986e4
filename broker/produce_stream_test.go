package broker

import (
	"errors"
	"io"
	"testing"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// TestProduceStreamDrain: a draining broker answers what a producer's stream already sent and then
// ends the stream with LEADER_NOT_AVAILABLE (retriable: the producer goes to the next leader), though
// the producer keeps the stream open and idle; a request sent after that is not stored.
func TestProduceStreamDrain(t *testing.T) {
	const topic = "drain"
	n := startProduceNode(t, map[string]int32{topic: 1})
	ctx := produceCtx(t)
	stream, err := n.cli.ProduceStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := testBatch("before-drain", 3)
	if err := stream.Send(&runnelv1.ProduceRequest{CorrelationId: 1, Acks: runnelv1.Acks_ACKS_ALL, TimeoutMs: 20_000,
		Partitions: []*runnelv1.ProducePartition{{Topic: topic, Partition: 0, Records: first}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Partitions[0]; r.Error != nil && r.Error.Code != runnelv1.ErrorCode_NONE || r.BaseOffset != 0 {
		t.Fatalf("first request: %v", r)
	}

	n.b.Drain() // the stream is open and idle: the handler must end it anyway
	_, err = stream.Recv()
	if err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("stream of a draining broker: Recv = %v, want LEADER_NOT_AVAILABLE", err)
	}
	if !errors.Is(rerr.FromStatus(err), rerr.ErrLeaderNotAvailable) {
		t.Fatalf("stream of a draining broker ended with %v, want LEADER_NOT_AVAILABLE", err)
	}
	// Whatever a producer still sends is refused (the stream is over), and nothing more is stored.
	_ = stream.Send(&runnelv1.ProduceRequest{CorrelationId: 2, Acks: runnelv1.Acks_ACKS_ALL,
		Partitions: []*runnelv1.ProducePartition{{Topic: topic, Partition: 0, Records: testBatch("after-drain", 2)}}})
	sameBatches(t, "after the drain", n.stored(t, topic, 0), [][]byte{first})
}
