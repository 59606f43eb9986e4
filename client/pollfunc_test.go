package client_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/batch"
)

// copyRecord returns a deep copy of r: what must outlive a PollFunc callback.
func copyRecord(r *client.Record) *client.Record {
	c := *r
	c.Key, c.Value = bytes.Clone(r.Key), bytes.Clone(r.Value)
	c.Headers = nil
	for _, h := range r.Headers {
		c.Headers = append(c.Headers, client.Header{Key: h.Key, Value: bytes.Clone(h.Value)})
	}
	return &c
}

// sameRecord reports how a and b differ, or "".
func sameRecord(a, b *client.Record) string {
	if a.Topic != b.Topic || a.Partition != b.Partition || a.Offset != b.Offset || !a.Timestamp.Equal(b.Timestamp) || a.LeaderEpoch != b.LeaderEpoch {
		return fmt.Sprintf("position %s-%d@%d %v epoch %d vs %s-%d@%d %v epoch %d", a.Topic, a.Partition, a.Offset, a.Timestamp, a.LeaderEpoch, b.Topic, b.Partition, b.Offset, b.Timestamp, b.LeaderEpoch)
	}
	if !bytes.Equal(a.Key, b.Key) || (a.Key == nil) != (b.Key == nil) || !bytes.Equal(a.Value, b.Value) || (a.Value == nil) != (b.Value == nil) {
		return fmt.Sprintf("key/value %q/%q vs %q/%q", a.Key, a.Value, b.Key, b.Value)
	}
	if len(a.Headers) != len(b.Headers) {
		return fmt.Sprintf("%d headers vs %d", len(a.Headers), len(b.Headers))
	}
	for i := range a.Headers {
		if a.Headers[i].Key != b.Headers[i].Key || !bytes.Equal(a.Headers[i].Value, b.Headers[i].Value) || (a.Headers[i].Value == nil) != (b.Headers[i].Value == nil) {
			return fmt.Sprintf("header %d: %+v vs %+v", i, a.Headers[i], b.Headers[i])
		}
	}
	return ""
}

// produceMix writes n records to each of partitions of topic with codec: keys, tombstones, headers and
// values that name their record, so a value read from a reused buffer shows.
func produceMix(t *testing.T, addr, topic string, partitions int32, n int, codec batch.Compression) {
	t.Helper()
	ctx := context.Background()
	p := newProducer(t, addr, client.WithCompression(codec), client.WithAcks(client.AcksLeader), client.WithBatchBytes(4<<10))
	ps := newPromises()
	ps.unordered = true
	seq := 0
	for part := range partitions {
		for i := range n {
			r := &client.Record{Topic: topic, Partition: part, Value: bytes.Repeat(fmt.Appendf(nil, "%s/%d/%d;", topic, part, i), 1+i%7)}
			switch i % 5 {
			case 1:
				r.Key = fmt.Appendf(nil, "key-%d", i%13)
			case 2:
				r.Key, r.Value = []byte{}, nil
			case 3:
				r.Headers = []client.Header{{Key: "h", Value: fmt.Appendf(nil, "hv-%d", i)}, {Key: "null", Value: nil}}
			}
			r.Timestamp = time.UnixMilli(1_700_000_000_000 + int64(i))
			p.Produce(ctx, r, ps.fn(seq))
			seq++
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ps.check(t, seq)
}

// pollFuncAll reads want records with PollFunc, copying each, and checks each call's count.
func pollFuncAll(t *testing.T, c *client.Consumer, want int) []*client.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*client.Record
	for len(out) < want {
		before := len(out)
		n, err := c.PollFunc(ctx, func(r *client.Record) { out = append(out, copyRecord(r)) })
		if err != nil {
			t.Fatalf("PollFunc after %d of %d records: %v", len(out), want, err)
		}
		if n != len(out)-before || n == 0 {
			t.Fatalf("PollFunc returned %d, called fn %d times", n, len(out)-before)
		}
	}
	if len(out) != want {
		t.Fatalf("read %d records, want %d", len(out), want)
	}
	return out
}

// TestPollFuncMatchesPoll checks that PollFunc hands out the records Poll returns, field for field and
// in the same order per partition, uncompressed and compressed, from the start and from an offset in the
// middle of a batch.
func TestPollFuncMatchesPoll(t *testing.T) {
	addr := startNode(t)
	const parts, n = 3, 2000
	for _, codec := range []batch.Compression{batch.CompressionNone, batch.CompressionLZ4} {
		topic := "pollfunc-" + codec.String()
		createTopic(t, addr, topic, parts, nil)
		produceMix(t, addr, topic, parts, n, codec)
		for _, from := range []int64{0, 777} {
			t.Run(fmt.Sprintf("%s/from-%d", codec, from), func(t *testing.T) {
				// Small fetches: many answers, buffers recycled and reused while reading.
				opts := []client.ConsumerOption{client.WithPartitionMaxBytes(8 << 10)}
				a, b := newConsumer(t, addr, opts...), newConsumer(t, addr, opts...)
				for p := range int32(parts) {
					if err := a.Assign(topic, p, client.OffsetAt(from)); err != nil {
						t.Fatal(err)
					}
					if err := b.Assign(topic, p, client.OffsetAt(from)); err != nil {
						t.Fatal(err)
					}
				}
				want := parts * (n - int(from))
				polled := consume(t, a, want, 30*time.Second)
				funced := pollFuncAll(t, b, want)
				byPart := func(recs []*client.Record) map[int32][]*client.Record {
					m := map[int32][]*client.Record{}
					for _, r := range recs {
						m[r.Partition] = append(m[r.Partition], r)
					}
					return m
				}
				pa, pb := byPart(polled), byPart(funced)
				for p := range int32(parts) {
					if len(pa[p]) != len(pb[p]) || len(pa[p]) == 0 || pa[p][0].Offset != from {
						t.Fatalf("partition %d: Poll read %d records, PollFunc %d", p, len(pa[p]), len(pb[p]))
					}
					for i := range pa[p] {
						if d := sameRecord(pa[p][i], pb[p][i]); d != "" {
							t.Fatalf("partition %d record %d: Poll vs PollFunc: %s", p, i, d)
						}
					}
				}
				for p := range int32(parts) {
					if a.Position(topic, p) != n || b.Position(topic, p) != n {
						t.Fatalf("partition %d: positions %d (Poll) and %d (PollFunc), want %d", p, a.Position(topic, p), b.Position(topic, p), n)
					}
				}
			})
		}
	}
}

// TestPollRecordsSurvivePollFunc checks the buffer ownership: records a Poll returned keep their bytes
// while PollFunc, on the same consumer, recycles the buffers of the answers it handed out and later
// fetches reuse them.
func TestPollRecordsSurvivePollFunc(t *testing.T) {
	addr := startNode(t)
	const topic, n = "keep", 6000
	createTopic(t, addr, topic, 1, nil)
	produceMix(t, addr, topic, 1, n, batch.CompressionNone)
	c := newConsumer(t, addr, client.WithPartitionMaxBytes(4<<10))
	if err := c.Assign(topic, 0, client.OffsetEarliest()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var kept, copies []*client.Record
	for len(kept) < 500 {
		recs, err := c.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			kept, copies = append(kept, r), append(copies, copyRecord(r))
		}
	}
	rest := pollFuncAll(t, c, n-len(kept))
	if rest[0].Offset != kept[len(kept)-1].Offset+1 || rest[len(rest)-1].Offset != n-1 {
		t.Fatalf("PollFunc read offsets %d..%d after Poll's %d", rest[0].Offset, rest[len(rest)-1].Offset, kept[len(kept)-1].Offset)
	}
	for i := range kept {
		if d := sameRecord(kept[i], copies[i]); d != "" {
			t.Fatalf("record %d returned by Poll changed while PollFunc read on: %s", i, d)
		}
	}
}
