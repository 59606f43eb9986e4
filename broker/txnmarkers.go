package broker

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/group"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/client/batch"
)

// TxnVerifier answers, for a partition leader, whether a partition is in a producer's ongoing
// transaction (KIP-890): the transaction coordinator implements it (in-process when this node
// coordinates the transactional id, else VerifyPartitions over gRPC to the node that does). The leader
// calls it before admitting the first transactional batch of a producer epoch's transaction on the
// partition.
type TxnVerifier interface {
	// Verify returns nil when topic-partition is in the ongoing transaction of exactly this producer
	// id and epoch; rerr INVALID_TXN_STATE (not added, or no transaction ongoing), PRODUCER_FENCED (an
	// older epoch), or a retriable coordinator error (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
	// COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS). ctx bounds the call.
	Verify(ctx context.Context, p *runnelv1.TxnProducer, topic string, partition int32) error
}

// OffsetsMarkerWriter writes a transaction marker to a partition of __consumer_offsets (group.
// OffsetsTopic) that this node leads: the group coordinator implements it, appending the marker in its
// shard's write order (acks=all) and applying it to the group core (COMMIT makes the transaction's
// pending offsets the committed ones, ABORT drops them). m.FirstOffset is -1 as handed over; the
// writer sets the first offset of the producer's pending offsets on the partition. Errors: catalogue
// errors (NOT_LEADER_OR_FOLLOWER, COORDINATOR_LOAD_IN_PROGRESS, INVALID_PRODUCER_EPOCH, ...).
type OffsetsMarkerWriter interface {
	WriteOffsetsMarker(ctx context.Context, partition int32, producerID int64, producerEpoch int16, m batch.ControlMarker) error
}

// verifier returns the installed TxnVerifier, nil when transactions are not enabled.
func (b *Broker) verifier() TxnVerifier {
	b.txnMu.RLock()
	defer b.txnMu.RUnlock()
	return b.txnVerifier
}

// offsetsMarkerWriter returns the installed OffsetsMarkerWriter, or nil.
func (b *Broker) offsetsMarkerWriter() OffsetsMarkerWriter {
	b.txnMu.RLock()
	defer b.txnMu.RUnlock()
	return b.offsetsMarkers
}

// WriteTxnMarkers implements the Transactions service's WriteTxnMarkers for this node's partitions
// (the coordinator's shell serves it over gRPC and calls it in-process): for each marker and each
// listed partition, it appends a COMMIT or ABORT control batch of the producer (batch.BuildControl)
// with acks=all and ends the producer's transaction on the partition (KIP-98). Partitions are written
// concurrently; the answer lists every partition with its error, in request order, once all are done
// (or ctx ends; a marker whose wait ctx cut short may still be written, and the coordinator retries).
//
// Per partition: this node must lead it (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE,
// UNKNOWN_TOPIC_OR_PARTITION otherwise) and, when replicated, have min.insync.replicas in the ISR
// (NOT_ENOUGH_REPLICAS). Partitions of __consumer_offsets go to the OffsetsMarkerWriter. Else, under
// the partition's producer state lock: a marker of an older producer epoch than the partition knows is
// refused (INVALID_PRODUCER_EPOCH), as is one from an older coordinator epoch than the producer's last
// marker here (TRANSACTION_COORDINATOR_FENCED); the marker carries the first offset of the producer's
// ongoing transaction (-1 when it wrote nothing here), so every replica indexes an aborted transaction
// from the marker alone; the transaction ends (it holds the LSO until the HW passes the marker) and the
// partition's known epoch of the producer becomes the marker's (a bumped epoch fences its older
// incarnation's late batches). A marker whose epoch is not above that of the producer's ongoing
// transaction here is refused too (INVALID_PRODUCER_EPOCH): markers carry the epoch their EndTxn
// bumped to (KIP-890 part 2), so it can only be a late copy of an earlier transaction's. A marker for a producer with no ongoing transaction here is written too:
// it says nothing to readers, costs one small batch, and makes a retried marker simply succeed.
// Appending under the lock orders the marker after every batch of the transaction admitted before and
// before any admitted after.
//
// The only error for the whole call is a request without markers (INVALID_REQUEST).
func (b *Broker) WriteTxnMarkers(ctx context.Context, req *runnelv1.WriteTxnMarkersRequest) (*runnelv1.WriteTxnMarkersResponse, error) {
	if len(req.Markers) == 0 {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "write transaction markers without markers")
	}
	resp := &runnelv1.WriteTxnMarkersResponse{Markers: make([]*runnelv1.TxnMarkerResult, len(req.Markers))}
	var wg sync.WaitGroup
	for i, m := range req.Markers {
		mr := &runnelv1.TxnMarkerResult{ProducerId: m.ProducerId}
		resp.Markers[i] = mr
		for _, tp := range m.Partitions {
			for _, part := range tp.Partitions {
				r := &runnelv1.TxnPartitionResult{Topic: tp.Topic, Partition: part}
				mr.Partitions = append(mr.Partitions, r)
				wg.Add(1)
				go func() { // owned by this call, which waits for it
					defer wg.Done()
					if err := b.writeMarker(ctx, m, tp.Topic, part); err != nil {
						r.Error = rerr.ToInfo(storeErr(tp.Topic, part, err))
					}
				}()
			}
		}
	}
	wg.Wait()
	return resp, nil
}

// writeMarker writes marker m to topic-partition and waits for acks=all (see WriteTxnMarkers).
func (b *Broker) writeMarker(ctx context.Context, m *runnelv1.TxnMarker, topic string, partition int32) error {
	if m.ProducerId < 0 || m.ProducerEpoch < 0 || m.ProducerEpoch > math.MaxInt16 {
		return rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s-%d: marker of producer %d epoch %d", topic, partition, m.ProducerId, m.ProducerEpoch)
	}
	pid, epoch := m.ProducerId, int16(m.ProducerEpoch)
	t, p, err := b.partition(topic, partition)
	if err != nil {
		return err
	}
	cm := batch.ControlMarker{Commit: m.Commit, CoordinatorEpoch: m.CoordinatorEpoch, FirstOffset: -1}
	if topic == group.OffsetsTopic {
		w := b.offsetsMarkerWriter()
		if w == nil {
			return rerr.New(runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE, "%s-%d: the group coordinator of broker %d takes no transaction markers yet", topic, partition, b.cfg.NodeID)
		}
		return w.WriteOffsetsMarker(ctx, partition, pid, epoch, cm)
	}
	if _, err := b.replicaOf(t, partition, true); err != nil {
		return err
	}
	st, _ := t.Partition(partition)
	ps, err := b.producerStateOf(t, partition, p, st.LeaderEpoch)
	if err != nil {
		return err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultProduceTimeout)
	}
	type appended struct {
		res plog.AppendResult
		err error
	}
	result := make(chan appended, 1)
	ps.mu.Lock()
	for {
		e := ps.producers[pid]
		if e != nil && epoch < e.epoch {
			ps.mu.Unlock()
			return rerr.New(runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH, "%s-%d: marker of producer %d epoch %d is older than its epoch %d here", topic, partition, pid, epoch, e.epoch)
		}
		if e != nil && m.CoordinatorEpoch < e.coordEpoch {
			ps.mu.Unlock()
			return rerr.New(runnelv1.ErrorCode_TRANSACTION_COORDINATOR_FENCED, "%s-%d: marker of producer %d from coordinator epoch %d, older than %d", topic, partition, pid, m.CoordinatorEpoch, e.coordEpoch)
		}
		txn := ps.ongoing[pid]
		if txn != nil && epoch <= txn.epoch {
			// KIP-890 part 2: ending a transaction bumps the producer epoch and its markers carry the
			// bumped one, which the producer's next transaction then writes at. A marker at the
			// epoch of the ongoing transaction's batches (or below) is therefore a late copy of an
			// earlier transaction's marker (a request the coordinator had given up on, delivered
			// late), and writing it would end this transaction with the other's outcome.
			ps.mu.Unlock()
			return rerr.New(runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH, "%s-%d: marker of producer %d epoch %d is not above epoch %d of its ongoing transaction here: a late marker of an earlier transaction",
				topic, partition, pid, epoch, txn.epoch)
		}
		if txn == nil || txn.exact || len(txn.inflight) == 0 {
			break
		}
		// The transaction's first batch is being appended: the marker must carry its exact offset.
		wait := txn.inflight[0].done
		ps.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
		ps.mu.Lock()
	}
	if err := ctx.Err(); err != nil {
		// The coordinator gave up on this request and retries it (or has already): a marker written
		// now could land after the retry's, once the producer's next transaction has begun here, and
		// end that one instead (its records would become committed, or be aborted, with it).
		ps.mu.Unlock()
		return err
	}
	var done *completingTxn
	cm.FirstOffset, done = ps.endTxnLocked(pid, epoch, m.CoordinatorEpoch)
	now := time.Now().UnixMilli()
	opts := plog.AppendOptions{Sync: true, LogAppendTime: -1, LeaderEpoch: st.LeaderEpoch,
		SegmentBytes: t.Config.SegmentBytes, SegmentMs: t.Config.RollMs()}
	if t.Config.LogAppendTime {
		opts.LogAppendTime = now
	}
	p.AppendAsync(batch.BuildControl(pid, epoch, now, cm), opts, func(res plog.AppendResult, err error) {
		ps.mu.Lock()
		if err != nil {
			// The state says the transaction ended, the log does not: build it again from the log
			// (the coordinator retries the marker).
			ps.loaded = false
		} else if done != nil {
			done.marker = res.BaseOffset
		}
		ps.mu.Unlock()
		result <- appended{res, err}
	})
	ps.mu.Unlock()

	var a appended
	select {
	case a = <-result:
	case <-ctx.Done():
		return ctx.Err()
	}
	if a.err != nil {
		return a.err
	}
	acked := make(chan error, 1)
	b.afterAppend(t, partition, true, a.res, deadline, func(err error) { acked <- err })
	select {
	case err := <-acked:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// endTxnLocked ends producer pid's transaction on the partition as its marker (of producer epoch
// epoch, coordinator epoch coordEpoch) is queued, ps.mu held, and returns the marker's first offset
// (-1 when the producer has no ongoing transaction here, or none of its batches was stored) and the
// completing entry that holds the LSO until the HW passes the marker (nil without a transaction); the
// caller sets its marker offset once the marker is stored. The producer's known epoch becomes epoch
// when newer (its sequences start again at 0), its verification ends, and the marker is counted so a
// verification it overtook is asked again. The caller has checked the epochs (writeMarker).
func (ps *producerState) endTxnLocked(pid int64, epoch int16, coordEpoch int32) (first int64, done *completingTxn) {
	first = -1
	if txn := ps.ongoing[pid]; txn != nil {
		if txn.exact {
			first = txn.first
		}
		done = &completingTxn{first: txn.first, marker: -1}
		ps.completing = append(ps.completing, done)
		delete(ps.ongoing, pid)
	}
	e := ps.producers[pid]
	if e == nil {
		e = newProducerEntry(epoch)
		ps.producers[pid] = e
	}
	if epoch > e.epoch {
		e.epoch, e.batches = epoch, nil
	}
	e.verified, e.coordEpoch = -1, max(e.coordEpoch, coordEpoch)
	e.markers++
	return first, done
}
