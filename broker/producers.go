package broker

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/client/batch"
)

// Idempotent producers (KIP-98): a producer gets an id and epoch from InitProducerId; every batch it
// sends carries them and a base sequence per partition. The leader keeps, per partition and producer,
// the last producerBatchesKept batches it accepted: a batch equal to one of them is a retry and is
// answered with that batch's offsets without being written again; one whose base sequence does not
// follow the last is refused with OUT_OF_ORDER_SEQUENCE_NUMBER; one from an older epoch with
// INVALID_PRODUCER_EPOCH.
const (
	producerBatchesKept = 5 // Kafka's max.in.flight.requests.per.connection bound for idempotence
	// producerStateWindow is how many offsets before the log end a leader reads to rebuild producer
	// state when it takes a partition over: retries come within seconds, so the state of producers not
	// seen in that window is not needed to drop duplicates. A producer not in the state is accepted
	// at any sequence.
	producerStateWindow = 200_000
)

// producerIDs hands out producer ids from blocks the controller gives this broker.
type producerIDs struct {
	mu        sync.Mutex
	next, end int64
}

// InitProducerId implements runnelv1.RecordsServer: a new producer id, epoch 0.
func (b *Broker) InitProducerId(ctx context.Context, req *runnelv1.InitProducerIdRequest) (*runnelv1.InitProducerIdResponse, error) {
	if req.TransactionalId != "" {
		return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_UNSUPPORTED_VERSION, "transactional ids are not supported yet"))
	}
	b.pids.mu.Lock()
	defer b.pids.mu.Unlock()
	if b.pids.next >= b.pids.end {
		img, err := b.md.Propose(ctx, meta.Command{Type: meta.CmdAllocateProducerIDs, BrokerID: b.cfg.NodeID})
		if err != nil {
			return nil, rerr.ToStatus(err)
		}
		start, ok := img.ProducerIDBlocks[b.cfg.NodeID]
		if !ok {
			return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "no producer id block for broker %d", b.cfg.NodeID))
		}
		b.pids.next, b.pids.end = start, start+meta.ProducerIDBlockSize
	}
	id := b.pids.next
	b.pids.next++
	return &runnelv1.InitProducerIdResponse{ProducerId: id, ProducerEpoch: 0}, nil
}

// producerState is the idempotence state of one partition led here.
type producerState struct {
	mu          sync.Mutex
	leaderEpoch int32 // the leadership it was built for; another epoch rebuilds it
	loaded      bool
	producers   map[int64]*producerEntry
}

type producerEntry struct {
	epoch   int16
	batches []*producerBatch // oldest first, at most producerBatchesKept
}

// producerBatch is one accepted batch; done is closed once its append finished (base, last, err set).
type producerBatch struct {
	firstSeq, lastSeq int32
	done              chan struct{}
	base, last        int64
	err               error
}

// nextSeq is the sequence after s, wrapping at MaxInt32 to 0 as Kafka does.
func nextSeq(s int32) int32 {
	if s == math.MaxInt32 {
		return 0
	}
	return s + 1
}

// lastSeq is the sequence of the last record of a batch of count records from base.
func lastSeq(base, count int32) int32 {
	return int32((int64(base) + int64(count) - 1) % (int64(math.MaxInt32) + 1))
}

// producerStateOf returns the state of a partition this broker leads at leaderEpoch, rebuilt from the
// log's last producerStateWindow offsets when the leadership is new.
func (b *Broker) producerStateOf(t *meta.Topic, partition int32, l *plog.Partition, leaderEpoch int32) (*producerState, error) {
	id := plog.PartitionID{TopicNum: t.Num, Partition: partition}
	b.psMu.Lock()
	ps := b.producerStates[id]
	if ps == nil {
		ps = &producerState{}
		b.producerStates[id] = ps
	}
	b.psMu.Unlock()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.loaded && ps.leaderEpoch == leaderEpoch {
		return ps, nil
	}
	producers, err := rebuildProducers(l)
	if err != nil {
		return nil, fmt.Errorf("rebuild producer state of %s-%d: %w", t.Name, partition, err)
	}
	ps.producers, ps.leaderEpoch, ps.loaded = producers, leaderEpoch, true
	return ps, nil
}

// rebuildProducers reads the batch headers of the log's tail and keeps each producer's last batches.
func rebuildProducers(l *plog.Partition) (map[int64]*producerEntry, error) {
	out := map[int64]*producerEntry{}
	end, read := l.HighWatermark(), l.Read
	if l.Replicated() {
		end, read = l.DurableEnd(), l.ReadLocal
	}
	for off := max(l.LogStartOffset(), end-producerStateWindow); off < end; {
		data, err := read(nil, off, 4<<20)
		if err != nil {
			return nil, err
		}
		if len(data) == 0 {
			break
		}
		err = batch.Split(data, func(_ []byte, h batch.Header) error {
			off = h.NextOffset()
			if h.ProducerID < 0 || h.IsControl() {
				return nil
			}
			e := out[h.ProducerID]
			if e == nil || h.ProducerEpoch > e.epoch {
				e = &producerEntry{epoch: h.ProducerEpoch}
				out[h.ProducerID] = e
			}
			done := make(chan struct{})
			close(done)
			e.batches = append(e.batches, &producerBatch{firstSeq: h.BaseSequence, lastSeq: lastSeq(h.BaseSequence, h.RecordCount),
				done: done, base: h.BaseOffset, last: h.NextOffset() - 1})
			if len(e.batches) > producerBatchesKept {
				e.batches = e.batches[1:]
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// admit checks an idempotent batch against the producer's state (ps.mu held): it returns the earlier
// batch it duplicates, or the new entry to complete once appended, or the refusal.
func (ps *producerState) admit(topic string, partition int32, h batch.Header) (dup, added *producerBatch, err error) {
	e := ps.producers[h.ProducerID]
	first, last := h.BaseSequence, lastSeq(h.BaseSequence, h.RecordCount)
	switch {
	case e == nil:
		e = &producerEntry{epoch: h.ProducerEpoch}
		ps.producers[h.ProducerID] = e
	case h.ProducerEpoch < e.epoch:
		return nil, nil, rerr.New(runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH, "%s-%d: producer %d epoch %d is older than its current epoch %d", topic, partition, h.ProducerID, h.ProducerEpoch, e.epoch)
	case h.ProducerEpoch > e.epoch:
		if first != 0 {
			return nil, nil, rerr.New(runnelv1.ErrorCode_OUT_OF_ORDER_SEQUENCE_NUMBER, "%s-%d: producer %d starts epoch %d at sequence %d, not 0", topic, partition, h.ProducerID, h.ProducerEpoch, first)
		}
		e.epoch, e.batches = h.ProducerEpoch, nil
	}
	for _, pb := range e.batches {
		if pb.firstSeq == first && pb.lastSeq == last {
			return pb, nil, nil
		}
	}
	if n := len(e.batches); n > 0 {
		if want := nextSeq(e.batches[n-1].lastSeq); first != want {
			return nil, nil, rerr.New(runnelv1.ErrorCode_OUT_OF_ORDER_SEQUENCE_NUMBER, "%s-%d: producer %d sent sequence %d, expected %d", topic, partition, h.ProducerID, first, want)
		}
	}
	added = &producerBatch{firstSeq: first, lastSeq: last, done: make(chan struct{})}
	e.batches = append(e.batches, added)
	if len(e.batches) > producerBatchesKept {
		e.batches = e.batches[1:]
	}
	return nil, added, nil
}

// forget removes a batch whose append failed, so the producer's retry of it is taken as new.
func (ps *producerState) forget(pid int64, pb *producerBatch) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if e := ps.producers[pid]; e != nil {
		for i, x := range e.batches {
			if x == pb {
				e.batches = append(e.batches[:i], e.batches[i+1:]...)
				break
			}
		}
	}
}

// answerDuplicate answers a retried batch with its first append's offsets once that append finished,
// waiting for the ISR like any acks=all append.
func (b *Broker) answerDuplicate(t *meta.Topic, partition int32, acksAll bool, pb *producerBatch, deadline time.Time, done func(plog.AppendResult, int64, error)) {
	go func() {
		select {
		case <-pb.done:
		case <-time.After(time.Until(deadline)):
			done(plog.AppendResult{}, -1, rerr.New(runnelv1.ErrorCode_REQUEST_TIMED_OUT, "%s-%d: the first attempt of this retried batch is still being written", t.Name, partition))
			return
		}
		if pb.err != nil {
			done(plog.AppendResult{}, -1, pb.err)
			return
		}
		res := plog.AppendResult{BaseOffset: pb.base, LastOffset: pb.last}
		b.afterAppend(t, partition, acksAll, res, deadline, func(err error) { done(res, -1, err) })
	}()
}
