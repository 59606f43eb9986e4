package broker

import (
	"context"
	"math"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/group"
	"github.com/runnel-io/runnel/client/batch"
)

// The group coordinator's part in transactions (KIP-98 TxnOffsetCommit, KIP-447, KIP-890
// verification): offsets committed inside a transaction are appended to the group's __consumer_offsets
// partition as a transactional batch of the producer, and stay pending in the core until the
// producer's end-transaction marker, which the transaction coordinator writes through WriteTxnMarkers
// and the broker hands to WriteOffsetsMarker. Markers go through the shard's write queue like every
// other write, so the core applies them in log order, and replay feeds the same batches and markers
// back (groupCodec). See broker/group/txn.go for the rules.

// TxnOffsetCommit implements runnelv1.GroupsServer; see group.Coordinator.TxnOffsetCommit. The group's
// __consumer_offsets partition must be in the producer's ongoing transaction (AddOffsetsToTxn): the
// transaction coordinator is asked first (TxnVerifier, KIP-890), outside the shard's lock since it may
// be a call to another node; its refusals (INVALID_TXN_STATE, PRODUCER_FENCED, retriable coordinator
// errors) fail the call. Without a verifier installed (transactions not enabled on this node) the call
// fails with INVALID_REQUEST, as transactional produce does. It answers once the batch is durable
// (acks=all); per-partition refusals are in the results.
func (gc *GroupCoordinator) TxnOffsetCommit(ctx context.Context, req *runnelv1.TxnOffsetCommitRequest) (*runnelv1.CommitOffsetsResponse, error) {
	s, err := gc.shards.shard(req.GroupId)
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	v := gc.b.verifier()
	if v == nil {
		return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "transactions are not enabled on broker %d", gc.b.cfg.NodeID))
	}
	prod := &runnelv1.TxnProducer{TransactionalId: req.TransactionalId, ProducerId: req.ProducerId, ProducerEpoch: req.ProducerEpoch}
	if err := v.Verify(ctx, prod, group.OffsetsTopic, s.partition); err != nil {
		return nil, rerr.ToStatus(err)
	}
	now := time.Now()
	var resp *runnelv1.CommitOffsetsResponse
	err = s.do(ctx, now, func(c *group.Coordinator) ([]group.Record, error) {
		r, recs, err := c.TxnOffsetCommit(now, req, gc.logEnd)
		resp = r
		return recs, err
	})
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	return resp, nil
}

// WriteOffsetsMarker implements OffsetsMarkerWriter: it appends producer (producerID, producerEpoch)'s
// end-transaction marker m to __consumer_offsets partition, in the shard's write order and acks=all, and
// returns once the core has applied it (COMMIT installs the transaction's pending offsets, ABORT drops
// them). The marker's FirstOffset is set here: the offset of the producer's first transactional batch
// on the partition since its previous marker, -1 when there is none; writes of the producer still in
// flight are waited for first so that offset is known. Writing a marker again is harmless.
//
// Errors: UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER (naming the leader) or
// LEADER_NOT_AVAILABLE when this node does not lead the partition, COORDINATOR_LOAD_IN_PROGRESS while
// it loads it, INVALID_PRODUCER_EPOCH for an epoch older than the producer's last one seen here or not
// above the epoch of its transaction's offsets still pending here (KIP-890 part 2: a transaction's
// markers carry the epoch its end bumped to, so such a marker is a late copy of an earlier
// transaction's; see group.Coordinator.Marker), COORDINATOR_NOT_AVAILABLE when the write failed,
// REQUEST_TIMED_OUT when ctx ends first (the marker may still be written; the coordinator retries).
func (gc *GroupCoordinator) WriteOffsetsMarker(ctx context.Context, partition int32, producerID int64, producerEpoch int16, m batch.ControlMarker) error {
	s, err := gc.shards.shardAt(partition)
	if err != nil {
		return err
	}
	codec := s.codec.(*groupCodec)
	p := group.Producer{ID: producerID, Epoch: producerEpoch}
	for {
		s.mu.Lock()
		if s.failed != nil {
			s.mu.Unlock()
			return s.unavailable(s.failed)
		}
		if w := inflightTxnWrite(s, producerID); w != nil {
			s.mu.Unlock()
			if err := s.await(ctx, w); err != nil {
				return err
			}
			continue
		}
		if err := ctx.Err(); err != nil {
			// The coordinator gave up on this request and retries it: written late, the marker could
			// end the producer's next transaction (see Broker.WriteTxnMarkers).
			s.mu.Unlock()
			return err
		}
		recs, err := s.core.Marker(p, m.Commit)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		m.FirstOffset = -1
		if first, ok := codec.txnFirst[producerID]; ok {
			m.FirstOffset = first
		}
		w := s.append(batch.BuildControl(producerID, producerEpoch, time.Now().UnixMilli(), m), recs)
		s.mu.Unlock()
		return s.await(ctx, w)
	}
}

// inflightTxnWrite returns the last write in s's queue (appended, not yet applied) holding
// transactional records of producer pid, or nil. Called with s.mu held.
func inflightTxnWrite(s *groupShard, pid int64) *stateWrite[group.Record] {
	for i := len(s.queue) - 1; i >= 0; i-- {
		if w := s.queue[i]; len(w.recs) > 0 && w.recs[0].Producer != nil && w.recs[0].Producer.ID == pid && w.recs[0].Marker == group.NoMarker {
			return w
		}
	}
	return nil
}

// groupCodec is the stateCodec of a __consumer_offsets shard: plain batches, a transactional
// producer's records as its transactional batches, markers as control batches. It keeps txnFirst for
// WriteOffsetsMarker.
type groupCodec struct {
	// txnFirst maps a producer id to the offset of its first transactional batch since its last
	// marker, the FirstOffset of its next marker.
	txnFirst map[int64]int64
}

// applied keeps txnFirst up to date as a write is applied, s.mu held: a transactional batch (a
// TxnOffsetCommit's records, all of one producer) starts its producer's run if none is open; a marker
// ends it.
func (cd *groupCodec) applied(recs []group.Record, base int64) {
	if len(recs) == 0 || recs[0].Producer == nil {
		return
	}
	pid := recs[0].Producer.ID
	if recs[0].Marker != group.NoMarker {
		delete(cd.txnFirst, pid)
		return
	}
	if _, ok := cd.txnFirst[pid]; !ok && base >= 0 {
		cd.txnFirst[pid] = base
	}
}

// replay replays one stored batch b (header h) into the core (load) while loading, and returns how
// many of its records the core could not load. A control batch is its producer's end-transaction
// marker; the records of a transactional batch are loaded with their producer, so they stay pending
// until it.
func (cd *groupCodec) replay(b []byte, h batch.Header, load func(group.Record) error) (bad int, err error) {
	if h.IsControl() {
		m, err := batch.ParseControl(b)
		if err != nil {
			return 1, nil // not an end-transaction marker: nothing this coordinator writes
		}
		mk := group.AbortMarker
		if m.Commit {
			mk = group.CommitMarker
		}
		if err := load(group.Record{Producer: &group.Producer{ID: h.ProducerID, Epoch: h.ProducerEpoch}, Marker: mk}); err != nil {
			bad++
		}
		delete(cd.txnFirst, h.ProducerID)
		return bad, nil
	}
	var prod *group.Producer
	if h.IsTransactional() {
		prod = &group.Producer{ID: h.ProducerID, Epoch: h.ProducerEpoch}
		if _, ok := cd.txnFirst[h.ProducerID]; !ok {
			cd.txnFirst[h.ProducerID] = h.BaseOffset
		}
	}
	_, err = batch.DecodeBatch(b, func(r batch.Record) error {
		if err := load(group.Record{Key: r.Key, Value: r.Value, Producer: prod}); err != nil {
			bad++
		}
		return nil
	})
	return bad, err
}

// encode encodes records a core returned as record batches, one per run of consecutive
// records of the same producer: plain records as plain batches, a transactional producer's records as a
// transactional batch with its producer id and epoch and base sequence -1 (internal writes carry no
// sequence; plog does not check them). A marker record becomes a control batch with coordinator epoch
// 0 and first offset -1, though cores only return markers from Coordinator.Marker, which
// WriteOffsetsMarker encodes itself. The bytes are new and the caller's.
func (*groupCodec) encode(recs []group.Record, ts int64) []byte {
	var out []byte
	for i := 0; i < len(recs); {
		r := recs[i]
		if r.Marker != group.NoMarker && r.Producer != nil {
			out = append(out, batch.BuildControl(r.Producer.ID, r.Producer.Epoch, ts, batch.ControlMarker{Commit: r.Marker == group.CommitMarker, FirstOffset: -1})...)
			i++
			continue
		}
		var b batch.Builder
		j := i
		for ; j < len(recs) && recs[j].Marker == group.NoMarker && sameProducer(recs[j].Producer, r.Producer); j++ {
			b.Append(ts, recs[j].Key, recs[j].Value, nil)
		}
		if j == i {
			i++ // a marker without a producer: nothing to write
			continue
		}
		if r.Producer != nil {
			b.SetProducer(r.Producer.ID, r.Producer.Epoch, -1)
			b.SetTransactional(true)
		}
		built := b.Build(batch.CompressionNone)
		if i == 0 && j == len(recs) {
			return built // the builder is dropped here, so the built bytes are ours to hand on
		}
		out = append(out, built...)
		i = j
	}
	return out
}

func sameProducer(a, b *group.Producer) bool {
	return a == b || a != nil && b != nil && *a == *b
}

// logEnd returns the log end offset of a partition for commits (group.LogEndFunc): this node's when it
// leads the partition, math.MaxInt64 when another broker does (its log end offset is not known here;
// Kafka does not check it at all), and false when the partition does not exist.
func (gc *GroupCoordinator) logEnd(topic string, partition int32) (int64, bool) {
	t, ok := gc.b.md.Image().Topic(topic)
	if !ok || partition < 0 || partition >= t.Partitions {
		return 0, false
	}
	if _, p, err := gc.b.partition(topic, partition); err == nil {
		return p.LogEndOffset(), true
	}
	return math.MaxInt64, true
}
