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

// InitProducerId implements runnelv1.RecordsServer: a new producer id, epoch 0, for an idempotent
// producer. A transactional producer gets its id and epoch from its transaction coordinator
// (Transactions.InitProducerId, which fences the id's previous producer), so a transactional_id here
// is INVALID_REQUEST.
func (b *Broker) InitProducerId(ctx context.Context, req *runnelv1.InitProducerIdRequest) (*runnelv1.InitProducerIdResponse, error) {
	if req.TransactionalId != "" {
		return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_INVALID_REQUEST,
			"transactional id %q: a transactional producer gets its producer id from its transaction coordinator (Transactions.InitProducerId)", req.TransactionalId))
	}
	id, err := b.allocateProducerID(ctx)
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	return &runnelv1.InitProducerIdResponse{ProducerId: id, ProducerEpoch: 0}, nil
}

// allocateProducerID returns a producer id never handed out before in the cluster: the next of the
// block the controller gave this broker, proposing CmdAllocateProducerIDs for a new block of
// meta.ProducerIDBlockSize ids when it is used up (Kafka's KIP-730). InitProducerId and the
// transaction coordinator (a new transactional id, or an epoch that ran out) call it. Errors: the
// proposal's (NOT_CONTROLLER, REQUEST_TIMED_OUT, ...), UNKNOWN_SERVER_ERROR when the applied image
// holds no block for this broker.
func (b *Broker) allocateProducerID(ctx context.Context) (int64, error) {
	b.pids.mu.Lock()
	defer b.pids.mu.Unlock()
	if b.pids.next >= b.pids.end {
		img, err := b.md.Propose(ctx, meta.Command{Type: meta.CmdAllocateProducerIDs, BrokerID: b.cfg.NodeID})
		if err != nil {
			return -1, fmt.Errorf("allocate a producer id block: %w", err)
		}
		start, ok := img.ProducerIDBlocks[b.cfg.NodeID]
		if !ok {
			return -1, rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "no producer id block for broker %d", b.cfg.NodeID)
		}
		b.pids.next, b.pids.end = start, start+meta.ProducerIDBlockSize
	}
	id := b.pids.next
	b.pids.next++
	return id, nil
}

// producerState is the idempotence and transaction state of one partition led here.
//
// Transactions (KIP-98): ongoing holds, per producer, its transaction on the partition from its first
// transactional batch until the leader writes its marker; completing holds ended transactions until
// the HW passes their marker (Kafka's unreplicated transactions). The last stable offset (LSO) is the
// least first offset among both, else the HW: a read_committed reader never passes a record whose
// transaction's outcome it cannot see yet, and once it passes the LSO the marker and the
// aborted-transaction entry of every transaction below are readable (both are written with the
// marker).
type producerState struct {
	mu          sync.Mutex
	leaderEpoch int32 // the leadership it was built for; another epoch rebuilds it
	loaded      bool  // false: rebuild from the log on next use (a new leadership, a failed marker append)
	builds      uint64
	producers   map[int64]*producerEntry
	ongoing     map[int64]*ongoingTxn
	completing  []*completingTxn
}

type producerEntry struct {
	epoch   int16
	batches []*producerBatch // oldest first, at most producerBatchesKept
	// verified is the producer epoch whose ongoing transaction the coordinator confirmed holds this
	// partition (KIP-890), -1 when none: batches of that epoch are admitted without asking again until
	// a marker ends the transaction.
	verified int16
	// markers counts the markers written for the producer since the state was built: a verification
	// that a marker overtook answered for the transaction the marker ended, so it is asked again.
	markers uint64
	// coordEpoch is the coordinator epoch of the producer's latest marker (-1 before any): markers of
	// an older coordinator are refused (TRANSACTION_COORDINATOR_FENCED).
	coordEpoch int32
}

func newProducerEntry(epoch int16) *producerEntry {
	return &producerEntry{epoch: epoch, verified: -1, coordEpoch: -1}
}

// ongoingTxn is a producer's ongoing transaction on the partition.
type ongoingTxn struct {
	// first is the offset of the transaction's first record once exact; before (its first batch is
	// still being appended) a lower bound: the LEO when the batch was admitted, which holds the LSO
	// low enough from the moment the batch is queued.
	first int64
	exact bool
	// epoch is the producer epoch of the transaction's batches here. Its marker carries a higher one
	// (KIP-890 part 2: ending a transaction bumps the epoch), so a marker at this epoch or below is a
	// late copy of an earlier transaction's and must not end this one.
	epoch int16
	// inflight are the transaction's batches queued while first is not exact, in admission (and so
	// log) order: the first of them to be stored gives the exact first offset; a marker waits for
	// them.
	inflight []*producerBatch
}

// completingTxn is a transaction whose marker is written or being written: it holds the LSO at first
// until the HW passes marker.
type completingTxn struct {
	first  int64
	marker int64 // the marker's offset, -1 while it is being appended
}

// producerBatch is one accepted batch; done is closed once its append finished (base, last, err set).
type producerBatch struct {
	firstSeq, lastSeq int32
	done              chan struct{}
	base, last        int64
	err               error
	// settled is set under the partition's producer state lock once base and err are final, for the
	// transaction that tracks the batch (txnBatchDone).
	settled bool
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
	rb, err := rebuildProducers(l)
	if err != nil {
		return nil, fmt.Errorf("rebuild producer state of %s-%d: %w", t.Name, partition, err)
	}
	ps.producers, ps.ongoing, ps.completing = rb.producers, rb.ongoing, rb.completing
	ps.leaderEpoch, ps.loaded = leaderEpoch, true
	ps.builds++
	return ps, nil
}

// lastStableOffset returns the LSO of topic-partition t/partition (log l), which this broker leads:
// the least first offset of a transaction that is ongoing or whose marker the HW has not passed, else
// the HW (KIP-98). Read_committed fetches read up to it; ListOffsets LATEST answers it for them. It
// rebuilds the producer state when the leadership is new (rebuildProducers). Errors: reading the log
// for the rebuild.
func (b *Broker) lastStableOffset(t *meta.Topic, partition int32, l *plog.Partition) (int64, error) {
	st, _ := t.Partition(partition)
	ps, err := b.producerStateOf(t, partition, l, st.LeaderEpoch)
	if err != nil {
		return -1, err
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.lsoLocked(l.HighWatermark()), nil
}

// lsoLocked is the LSO for the high watermark hw; it forgets the completed transactions whose marker
// the HW passed. ps.mu is held. (The HW may be read before ps.mu: a transaction that begins after it
// starts at or above it, and one that completes stays in completing.)
func (ps *producerState) lsoLocked(hw int64) int64 {
	lso := hw
	kept := ps.completing[:0]
	for _, c := range ps.completing {
		if c.marker >= 0 && c.marker < hw {
			continue
		}
		kept = append(kept, c)
		lso = min(lso, c.first)
	}
	clear(ps.completing[len(kept):])
	ps.completing = kept
	for _, txn := range ps.ongoing {
		lso = min(lso, txn.first)
	}
	return lso
}

// rebuilt is producer state read back from a log.
type rebuilt struct {
	producers  map[int64]*producerEntry
	ongoing    map[int64]*ongoingTxn
	completing []*completingTxn
}

// rebuildProducers reads the batch headers of the log's tail (the last producerStateWindow offsets,
// up to DurableEnd) and keeps each producer's last batches and epoch, the coordinator epoch of its
// latest marker, and its transactions: one is ongoing from a transactional batch of the producer with
// no later marker of it, and a marker ends it (completing until the HW passes the marker). A producer
// whose transaction is ongoing counts as verified at that batch's epoch, as it was admitted.
//
// A transaction whose first batch lies before the window is taken to start at its first batch in the
// window (and, when the window does not reach the log start, at most at the window's start): its
// records below that offset are not held back by the LSO. Transactions are bounded by their timeout,
// and the window is far longer than retries need; see the package notes on the limits.
func rebuildProducers(l *plog.Partition) (rebuilt, error) {
	out := rebuilt{producers: map[int64]*producerEntry{}, ongoing: map[int64]*ongoingTxn{}}
	end, read := l.HighWatermark(), l.Read
	if l.Replicated() {
		if !waitDurable(l, rebuildDurableWait) {
			// A state built without the batches still being synced would not know a transaction
			// among them: the LSO would not hold its records back and its marker would index
			// nothing, so read_committed readers would see them even if it aborts. Refuse for now
			// (a retriable error: the caller's client retries) and build it on the next call.
			return rebuilt{}, rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE,
				"the new leader's log is not yet durable to its end %d (at %d) after %v; retry", l.LogEndOffset(), l.DurableEnd(), rebuildDurableWait)
		}
		end, read = l.DurableEnd(), l.ReadLocal
	}
	from := max(l.LogStartOffset(), end-producerStateWindow)
	windowStart := int64(-1) // where a transaction seen first in the window may have begun earlier
	if from > l.LogStartOffset() {
		windowStart = from
	}
	for off := from; off < end; {
		data, err := read(nil, off, 4<<20)
		if err != nil {
			return rebuilt{}, err
		}
		if len(data) == 0 {
			break
		}
		err = batch.Split(data, func(bt []byte, h batch.Header) error {
			off = h.NextOffset()
			if h.ProducerID < 0 {
				return nil
			}
			e := out.producers[h.ProducerID]
			seen := e != nil
			if e == nil {
				e = newProducerEntry(h.ProducerEpoch)
				out.producers[h.ProducerID] = e
			} else if h.ProducerEpoch > e.epoch {
				e.epoch, e.batches = h.ProducerEpoch, nil
			}
			if h.IsControl() {
				if m, err := batch.ParseControl(bt); err == nil {
					e.coordEpoch = max(e.coordEpoch, m.CoordinatorEpoch)
				}
				if txn := out.ongoing[h.ProducerID]; txn != nil {
					out.completing = append(out.completing, &completingTxn{first: txn.first, marker: h.BaseOffset})
					delete(out.ongoing, h.ProducerID)
				}
				e.verified = -1
				return nil
			}
			if h.IsTransactional() {
				if out.ongoing[h.ProducerID] == nil {
					first := h.BaseOffset
					if !seen && windowStart >= 0 {
						first = windowStart // no marker of the producer in the window: it may have begun before
					}
					out.ongoing[h.ProducerID] = &ongoingTxn{first: first, exact: true, epoch: h.ProducerEpoch}
				}
				e.verified = h.ProducerEpoch
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
			return rebuilt{}, err
		}
	}
	return out, nil
}

// duplicateLocked returns the batch of the producer's state that h repeats (same epoch and sequence
// range), or nil. ps.mu is held.
func (ps *producerState) duplicateLocked(h batch.Header) *producerBatch {
	e := ps.producers[h.ProducerID]
	if e == nil || e.epoch != h.ProducerEpoch {
		return nil
	}
	first, last := h.BaseSequence, lastSeq(h.BaseSequence, h.RecordCount)
	for _, pb := range e.batches {
		if pb.firstSeq == first && pb.lastSeq == last {
			return pb
		}
	}
	return nil
}

// admit checks an idempotent batch against the producer's state (ps.mu held): it returns the earlier
// batch it duplicates, or the new entry to complete once appended, or the refusal.
func (ps *producerState) admit(topic string, partition int32, h batch.Header) (dup, added *producerBatch, err error) {
	e := ps.producers[h.ProducerID]
	first, last := h.BaseSequence, lastSeq(h.BaseSequence, h.RecordCount)
	switch {
	case e == nil:
		e = newProducerEntry(h.ProducerEpoch)
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

// beginTxnLocked records that the transactional batch pb of producer pid was admitted (ps.mu held,
// after admit set the producer's epoch to the batch's): the producer's transaction on the partition
// begins with it unless one is ongoing, with the LEO leo as the lower bound of its first offset until
// a batch of it is stored (txnBatchDone). It returns the transaction while pb may decide its first
// offset, else nil.
func (ps *producerState) beginTxnLocked(pid int64, pb *producerBatch, leo int64) *ongoingTxn {
	txn := ps.ongoing[pid]
	if txn == nil {
		txn = &ongoingTxn{first: leo, epoch: ps.producers[pid].epoch}
		ps.ongoing[pid] = txn
	}
	if txn.exact {
		return nil
	}
	txn.inflight = append(txn.inflight, pb)
	return txn
}

// txnBatchDone records the outcome of a transactional batch that beginTxnLocked tracked (pb.base
// and pb.err set). The transaction's exact first offset is that of the earliest admitted batch that
// was stored: appends are stored in admission order, so it is the least offset of the transaction's
// records. Completions do not arrive in that order (the store's callback workers run each append's
// callback on its own), so a batch that settles before those admitted ahead of it waits for them:
// taking the first to settle would let a later batch's offset stand for the transaction's start,
// and the LSO and the ABORT marker's first offset would then leave the earlier batch's records
// visible to read_committed readers. A transaction none of whose batches was stored keeps its lower
// bound, so the LSO stays held until its marker (which then says it wrote nothing here).
func (ps *producerState) txnBatchDone(pid int64, txn *ongoingTxn, pb *producerBatch) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.ongoing[pid] != txn || txn.exact {
		return // ended by a marker, or the state was rebuilt
	}
	pb.settled = true
	for len(txn.inflight) > 0 && txn.inflight[0].settled {
		head := txn.inflight[0]
		if head.err == nil {
			txn.first, txn.exact, txn.inflight = head.base, true, nil
			return
		}
		txn.inflight[0] = nil
		txn.inflight = txn.inflight[1:]
	}
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

// rebuildDurableWait bounds how long a rebuild waits for a replica's appends to become durable.
const rebuildDurableWait = 2 * time.Second

// waitDurable waits, at most d, until everything l held when it was called is durable, and reports
// whether it is. A follower appends without waiting for its fsync; when it becomes leader, batches it
// had appended but not yet synced would be missing from the producer state read up to DurableEnd: an
// idempotent producer's retry of one of them would be written again, and a transaction among them
// would not hold the LSO.
func waitDurable(l *plog.Partition, d time.Duration) bool {
	leo := l.LogEndOffset()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		changed := l.Changed()
		if l.DurableEnd() >= leo {
			return true
		}
		before := l.DurableEnd()
		select {
		case <-changed:
			if l.DurableEnd() == before && l.LogEndOffset() == leo {
				// Woken without progress: a closed channel of a deleted partition or closed store
				// (which stays closed), or another kind of change; wait a little rather than spin.
				select {
				case <-time.After(10 * time.Millisecond):
				case <-timer.C:
					return l.DurableEnd() >= leo
				}
			}
		case <-timer.C:
			return l.DurableEnd() >= leo
		}
	}
}
