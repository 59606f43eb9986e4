package client_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/batch"
)

// damagedBatch builds an uncompressed batch of n records (key "k", value "v", one timestamp) whose
// record bad has a key length past its end. Its record lengths and CRC are right, which is all a broker
// checks of an uncompressed batch, so a node stores it as any other: a producer's bug, not the
// network's.
func damagedBatch(t *testing.T, n, bad int) []byte {
	t.Helper()
	var b batch.Builder
	for range n {
		b.Append(1_700_000_000_000, []byte("k"), []byte("v"), nil)
	}
	raw := append([]byte(nil), b.Build(batch.CompressionNone)...)
	// Each record is its length (1 byte) then attributes, timestamp delta, offset delta, key length,
	// key, value length, value and header count (1 byte each).
	const recordLen = 9
	if len(raw) != batch.HeaderSize+n*recordLen {
		t.Fatalf("batch of %d bytes, want %d: the layout assumed here changed", len(raw), batch.HeaderSize+n*recordLen)
	}
	raw[batch.HeaderSize+bad*recordLen+4] = 0x7e // zigzag 63: past the 8-byte body
	c := batch.Checksum(raw)
	raw[17], raw[18], raw[19], raw[20] = byte(c>>24), byte(c>>16), byte(c>>8), byte(c)
	return raw
}

// TestConsumerStopsAtDamagedRecord stores, after a committed transaction (offsets 0-2, its marker at
// 3), two batches with one record each that does not decode (the first record of 4-6, the middle one
// of 7-9), then a good batch (10-12), and reads the partition as Kafka's consumer would: the records
// before a damaged one come out, then Poll (and PollFunc) returns CORRUPT_MESSAGE for the partition on
// every call with the position at that record, past the marker's gap, until a Seek past it resumes
// with the next record of the same batch.
func TestConsumerStopsAtDamagedRecord(t *testing.T) {
	addr := startNode(t)
	const topic = "damaged"
	createTopic(t, addr, topic, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tp := newTxnProducer(t, addr, "damaged-txn")
	if err := tp.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"a", "b", "c"} {
		if err := tp.ProduceSync(ctx, &client.Record{Topic: topic, Partition: 0, Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tp.CommitTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	// The commit is answered once the decision is durable; the coordinator writes the marker after
	// (as Kafka's does), so the batches below would take offset 3 if sent before it lands.
	a := newAdmin(t, addr)
	var end int64
	waitFor(t, 10*time.Second, func() string { return fmt.Sprintf("log end offset %d, want 4 (the marker)", end) }, func() bool {
		end, _, _ = a.ListOffsets(ctx, topic, 0, client.OffsetLatest())
		return end == 4
	})
	var good batch.Builder
	for _, v := range []string{"x", "y", "z"} {
		good.Append(1_700_000_000_000, nil, []byte(v), nil)
	}
	raw := recordsClient(t, addr)
	for i, b := range [][]byte{damagedBatch(t, 3, 0), damagedBatch(t, 3, 1), good.Build(batch.CompressionNone)} {
		resp, err := raw.Produce(ctx, &runnelv1.ProduceRequest{Acks: runnelv1.Acks_ACKS_ALL,
			Partitions: []*runnelv1.ProducePartition{{Topic: topic, Partition: 0, Records: b}}})
		if err != nil {
			t.Fatalf("produce batch %d: %v", i, err)
		}
		if err := rerr.FromInfo(resp.Partitions[0].Error); err != nil || resp.Partitions[0].BaseOffset != int64(4+3*i) {
			t.Fatalf("produce batch %d: base offset %d, %v", i, resp.Partitions[0].BaseOffset, err)
		}
	}

	for _, viaFunc := range []bool{false, true} {
		name := "Poll"
		if viaFunc {
			name = "PollFunc"
		}
		t.Run(name, func(t *testing.T) {
			c := newConsumer(t, addr)
			if err := c.Assign(topic, 0, client.OffsetEarliest()); err != nil {
				t.Fatal(err)
			}
			// poll returns the offsets of one poll, or its error.
			poll := func() ([]int64, error) {
				var offs []int64
				if viaFunc {
					_, err := c.PollFunc(ctx, func(r *client.Record) { offs = append(offs, r.Offset) })
					return offs, err
				}
				recs, err := c.Poll(ctx)
				for _, r := range recs {
					offs = append(offs, r.Offset)
				}
				return offs, err
			}
			// readUntilDamaged polls until the partition reports a damaged record and checks the
			// offsets returned before it and the position it holds.
			readUntilDamaged := func(want []int64, at int64, batchRange string) {
				t.Helper()
				var got []int64
				var perr error
				for perr == nil {
					var offs []int64
					offs, perr = poll()
					got = append(got, offs...)
				}
				var pe *client.PartitionError
				if !errors.As(perr, &pe) || !errors.Is(perr, rerr.ErrCorruptMessage) || pe.Topic != topic || pe.Partition != 0 {
					t.Fatalf("after offsets %v: %v, want a CORRUPT_MESSAGE PartitionError for %s-0", got, perr, topic)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("offsets before the damaged record: %v, want %v", got, want)
				}
				// The message says where to Seek: past the record, or past its batch.
				if msg := fmt.Sprintf("offset %d, in the batch of offsets %s", at, batchRange); !strings.Contains(perr.Error(), msg) {
					t.Fatalf("error %q does not say %q", perr, msg)
				}
				if pos := c.Position(topic, 0); pos != at {
					t.Fatalf("position %d, want %d (the damaged record)", pos, at)
				}
				if offs, err := poll(); !errors.Is(err, rerr.ErrCorruptMessage) || len(offs) != 0 {
					t.Fatalf("poll again: %v %v, want the same error until a Seek", offs, err)
				}
				c.Seek(topic, 0, at+1)
			}
			readUntilDamaged([]int64{0, 1, 2}, 4, "4-6")
			readUntilDamaged([]int64{5, 6, 7}, 8, "7-9")
			var got []int64
			for len(got) < 4 {
				offs, err := poll()
				if err != nil {
					t.Fatalf("after the seek past the second damaged record, at %v: %v", got, err)
				}
				got = append(got, offs...)
			}
			if want := []int64{9, 10, 11, 12}; !slices.Equal(got, want) {
				t.Fatalf("offsets after the seek: %v, want %v", got, want)
			}
		})
	}
}

// A group member whose partition's revocation has begun (no longer fetched, still owned until the
// next poll) and whose taken part holds a record that does not decode: PollFunc hands out the records
// before it and the position stops at it, so the revocation's commit does not make the next owner
// skip it and the records after it.
func TestGroupPollFuncRevokedAtDamagedRecord(t *testing.T) {
	addr := startGroupNode(t)
	createTopic(t, addr, "t", 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := newProducer(t, addr)
	var recs []*client.Record
	for i := range 100 {
		recs = append(recs, &client.Record{Topic: "t", Partition: 0, Value: fmt.Appendf(nil, "%d", i)})
	}
	if err := p.ProduceSync(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	resp, err := recordsClient(t, addr).Produce(ctx, &runnelv1.ProduceRequest{Acks: runnelv1.Acks_ACKS_ALL,
		Partitions: []*runnelv1.ProducePartition{{Topic: "t", Partition: 1, Records: damagedBatch(t, 5, 2)}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := rerr.FromInfo(resp.Partitions[0].Error); err != nil {
		t.Fatal(err)
	}
	inOneCall(t, addr, func(gc *client.GroupConsumer) bool {
		first := int32(-1)
		var seen []int64 // offsets of partition 1 fn saw after it stopped being fetched
		fn := func(r *client.Record) {
			if first < 0 {
				first = r.Partition
				gc.StopFetching("t", 1)
				return
			}
			if r.Partition == 1 {
				seen = append(seen, r.Offset)
			}
		}
		if _, err := gc.PollFunc(ctx, fn); err != nil {
			t.Fatal(err)
		}
		if first != 0 || len(seen) == 0 {
			return false
		}
		if !slices.Equal(seen, []int64{0, 1}) {
			t.Fatalf("fn saw offsets %v of partition 1, want 0 and 1 (2 does not decode)", seen)
		}
		if pos := gc.Position("t", 1); pos != 2 {
			t.Fatalf("Position of partition 1 = %d after fn saw offsets 0 and 1 and offset 2 did not decode, want 2", pos)
		}
		return true
	})
}
