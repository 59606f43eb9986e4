package group

import (
	"fmt"
	"math"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// Offsets in transactions (KIP-98's TxnOffsetCommit, with KIP-447's fencing by member epoch).
//
// A transactional producer that consumed from a group commits the group's offsets inside its
// transaction: TxnOffsetCommit validates the commit exactly as Commit does (member id and epoch,
// partitions owned, offsets in range, metadata size) and returns offset records that the shell appends
// as one transactional batch of the producer. Once durable (Apply) they are pending, per producer id,
// invisible to FetchOffsets, until the producer's end-transaction marker reaches the partition: COMMIT
// makes them the committed offsets, ABORT drops them.
//
// Which offset wins when transactions and plain commits mix is decided by log order of the offset
// records, as Kafka's coordinator does (OffsetMetadataManager.replayEndTransactionMarker keeps the
// offset whose record offset is higher): a plain commit or a tombstone appended after a transaction's
// offset of the same partition makes that pending offset moot, and a committed transaction's offset
// makes the pending offsets of other transactions appended before it moot. Moot offsets are dropped
// at once, so a marker only ever installs offsets newer than the committed ones. The rule depends on
// nothing but the order of the records that share a key, which is what lets a compacted log replay to
// the same state, provided the cleaner removes aborted transactional records before it picks the
// latest record per key and does not clean past the last stable offset (Kafka's cleaner does both).
//
// Producer epochs fence zombies: the coordinator remembers the highest producer epoch it has seen per
// producer id, from transactional offset records and markers, and refuses an older one: a
// TxnOffsetCommit with PRODUCER_FENCED, a marker with INVALID_PRODUCER_EPOCH (as partition leaders
// refuse WriteTxnMarkers of an older epoch). Under KIP-890 part 2 every end of a transaction bumps
// the producer epoch and its markers carry the bumped epoch, which the producer's next transaction
// then writes its offsets at; so a marker at the epoch of the offsets of a transaction still open
// here can only be a late copy of the previous transaction's marker (a WriteTxnMarkers request the
// transaction coordinator gave up on, delivered late), and it is refused with INVALID_PRODUCER_EPOCH
// too rather than ending the open transaction with the other's outcome, as partition leaders do.
//
// A group with pending transactional offsets is not deleted: DeleteGroup refuses it with
// NON_EMPTY_GROUP and expiry skips it, until the transaction ends. Offsets of a deleted topic are
// tombstoned as ever, and the tombstone drops the pending transactional offsets of the partition too.

// txnProducer is what the coordinator knows of one producer id.
type txnProducer struct {
	// epoch is the highest producer epoch seen for the id (accepted TxnOffsetCommit, applied record or
	// marker). It outlives the transaction so a zombie of an older epoch stays fenced.
	epoch int16
	// offsets are the durable offsets of its ongoing transaction: group → partition → offset. It is
	// non-nil from the first transactional offset record applied after the producer's last marker
	// until its next marker (applyMarker sets it nil), even once emptied by other commits that made
	// the offsets moot: the transaction is still open then, which is what Marker's KIP-890 part 2
	// rule (see offsetsEpoch) needs to know.
	offsets map[string]map[tp]txnOffset
	// offsetsEpoch is the producer epoch of the records behind offsets (the highest, should they
	// differ), meaningful while offsets is non-nil. A marker at that epoch (or below) ends no
	// transaction of this epoch: under KIP-890 part 2 the transaction's own marker carries the epoch
	// its end bumped to, so such a marker is a late copy of an earlier transaction's and Marker
	// refuses it.
	offsetsEpoch int16
}

// txnOffset is one durable offset of a transaction not yet ended.
type txnOffset struct {
	commit OffsetCommit
	// seq is the position of its record among the offset records applied (log order), to tell
	// which of two transactions' offsets of one partition was appended later.
	seq uint64
}

// TxnOffsetCommit validates a transactional offset commit of producer (req.ProducerId,
// req.ProducerEpoch) and returns the per-partition results and the records of the partitions that
// passed. The caller appends the records as one transactional batch of that producer (attributes
// transactional, producer id and epoch in the header; every Record has Producer set) after verifying
// with the transaction coordinator that the group's partition is in the producer's transaction
// (AddOffsetsToTxn, KIP-890), and hands them to Apply once durable; the offsets then stay pending
// until the producer's marker (Marker, Apply).
//
// Member fencing and per-partition results are Commit's (KIP-447: a member that lost its partitions
// cannot commit them in a transaction either), including admin commits (empty member id, epoch -1)
// into a group without members, which is what a transactional producer that is not a group member
// sends. Errors failing the whole call, besides Commit's: INVALID_REQUEST (no transactional id, a
// negative producer id, a producer epoch outside [0, 32767]), PRODUCER_FENCED (a producer epoch older
// than one already seen for the producer id).
func (c *Coordinator) TxnOffsetCommit(now time.Time, req *runnelv1.TxnOffsetCommitRequest, logEnd LogEndFunc) (*runnelv1.CommitOffsetsResponse, []Record, error) {
	if err := c.loadErr(); err != nil {
		return nil, nil, err
	}
	if err := validGroupID(req.GroupId); err != nil {
		return nil, nil, err
	}
	prod, err := c.checkTxnProducer(req.TransactionalId, req.ProducerId, req.ProducerEpoch)
	if err != nil {
		return nil, nil, err
	}
	m, err := c.checkCommitter(req.GroupId, req.MemberId, req.MemberEpoch, req.Partitions)
	if err != nil {
		return nil, nil, err
	}
	resp := &runnelv1.CommitOffsetsResponse{Partitions: make([]*runnelv1.CommitPartitionResult, len(req.Partitions))}
	var out []Record
	for i, p := range req.Partitions {
		r := &runnelv1.CommitPartitionResult{Topic: p.Topic, Partition: p.Partition}
		resp.Partitions[i] = r
		if err := c.checkCommit(m, p, logEnd); err != nil {
			r.Error = rerr.ToInfo(err)
			continue
		}
		k := tp{p.Topic, p.Partition}
		v := OffsetCommit{Offset: p.Offset, LeaderEpoch: p.LeaderEpoch, Metadata: p.Metadata, CommitTimestampMs: now.UnixMilli()}
		out = append(out, Record{Key: offsetKey(req.GroupId, k).encode(), Value: v.encode(), Producer: &prod})
		countUp(c.pending, req.GroupId, k)
		countUp(c.txnInflight, req.GroupId, k)
	}
	if len(out) > 0 {
		// Only a call that writes raises the epoch, so memory never holds an epoch the log does not.
		c.seeEpoch(prod)
	}
	return resp, out, nil
}

// checkTxnProducer validates the producer fields of a transactional request and fences an older
// producer epoch.
func (c *Coordinator) checkTxnProducer(txnID string, id int64, epoch int32) (Producer, error) {
	switch {
	case txnID == "":
		return Producer{}, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "a transactional offset commit needs a transactional id")
	case id < 0:
		return Producer{}, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "producer id %d", id)
	case epoch < 0 || epoch > math.MaxInt16:
		return Producer{}, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "producer epoch %d outside [0, %d]", epoch, math.MaxInt16)
	}
	if err := validID("transactional id", txnID); err != nil {
		return Producer{}, err
	}
	if t := c.txns[id]; t != nil && int16(epoch) < t.epoch {
		return Producer{}, rerr.New(runnelv1.ErrorCode_PRODUCER_FENCED, "producer %d is at epoch %d, the commit says %d: a newer producer took transactional id %q",
			id, t.epoch, epoch, txnID)
	}
	return Producer{ID: id, Epoch: int16(epoch)}, nil
}

// Marker validates an end-transaction marker of producer p (COMMIT when commit) for this partition and
// returns the record the caller appends, as a control batch of p (batch.BuildControl), in its write
// order, and hands to Apply once durable. Writing a marker again is harmless: the second finds nothing
// pending. The caller must have applied every transactional offset record of the producer it wrote
// before (WriteOffsetsMarker waits for them), so that the open transaction is known here.
//
// Errors: COORDINATOR_LOAD_IN_PROGRESS, INVALID_REQUEST (a negative producer id or epoch),
// INVALID_PRODUCER_EPOCH (older than an epoch already seen for the producer id, or not above the
// epoch of the offsets of the producer's transaction still open here: under KIP-890 part 2 a
// transaction's markers carry the epoch its end bumped to, and the producer's next transaction
// writes at that epoch, so such a marker is a late copy of the previous transaction's marker and
// must not end the open one with the previous one's outcome).
func (c *Coordinator) Marker(p Producer, commit bool) ([]Record, error) {
	if err := c.loadErr(); err != nil {
		return nil, err
	}
	if p.ID < 0 || p.Epoch < 0 {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "marker of producer id %d epoch %d", p.ID, p.Epoch)
	}
	if t := c.txns[p.ID]; t != nil {
		if p.Epoch < t.epoch {
			return nil, rerr.New(runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH, "marker of producer %d at epoch %d, older than its epoch %d", p.ID, p.Epoch, t.epoch)
		}
		if t.offsets != nil && p.Epoch <= t.offsetsEpoch {
			return nil, rerr.New(runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH,
				"marker of producer %d at epoch %d is not above epoch %d of its open transaction's offsets: a late marker of an earlier transaction (KIP-890 part 2)",
				p.ID, p.Epoch, t.offsetsEpoch)
		}
	}
	c.seeEpoch(p)
	m := AbortMarker
	if commit {
		m = CommitMarker
	}
	return []Record{{Producer: &p, Marker: m}}, nil
}

// PendingTxnOffsets returns how many partitions of group id hold offsets of transactions not yet
// ended, durable or on their way to the log: what keeps DeleteGroup from deleting the group.
func (c *Coordinator) PendingTxnOffsets(id string) int {
	n := len(c.txnInflight[id])
	for pid := range c.openTxns[id] {
		for k := range c.txns[pid].offsets[id] {
			if c.txnInflight[id][k] == 0 {
				n++
			}
		}
	}
	return n
}

// unstable reports whether partition k of group gid has offsets of a transaction not yet ended,
// durable or on their way to the log (require_stable, KIP-447).
func (c *Coordinator) unstable(gid string, k tp) bool {
	if c.txnInflight[gid][k] > 0 {
		return true
	}
	for pid := range c.openTxns[gid] {
		if _, ok := c.txns[pid].offsets[gid][k]; ok {
			return true
		}
	}
	return false
}

// seeEpoch raises the producer's remembered epoch to p.Epoch.
func (c *Coordinator) seeEpoch(p Producer) *txnProducer {
	t := c.txns[p.ID]
	if t == nil {
		t = &txnProducer{epoch: p.Epoch}
		c.txns[p.ID] = t
	}
	t.epoch = max(t.epoch, p.Epoch)
	return t
}

// loadTxn replays a transactional offset record or a marker.
func (c *Coordinator) loadTxn(rec Record) error {
	if rec.Producer == nil {
		c.loadErrs++
		return fmt.Errorf("decode marker: %w: %v marker without a producer", errCorrupt, rec.Marker)
	}
	if rec.Marker != NoMarker {
		if rec.Marker != CommitMarker && rec.Marker != AbortMarker {
			c.loadErrs++
			return fmt.Errorf("decode marker: %w: %v", errCorrupt, rec.Marker)
		}
		c.applyMarker(*rec.Producer, rec.Marker == CommitMarker)
		return nil
	}
	k, err := decodeKey(rec.Key)
	if err != nil {
		c.loadErrs++
		return err
	}
	if k.kind != kindOffset || rec.Value == nil {
		// TxnOffsetCommit writes offset values only; anything else in a transactional batch is not ours.
		c.loadErrs++
		return fmt.Errorf("transactional record of producer %d: %w: key kind %d, tombstone %t", rec.Producer.ID, errCorrupt, k.kind, rec.Value == nil)
	}
	return c.applyTxnOffset(k, *rec.Producer, rec.Value, false)
}

// applyTxnOffset makes a durable transactional offset record pending in its producer's transaction.
func (c *Coordinator) applyTxnOffset(k recordKey, p Producer, value []byte, live bool) error {
	key := tp{k.topic, k.partition}
	if live {
		countDown(c.pending, k.group, key)
		countDown(c.txnInflight, k.group, key)
	}
	v, err := decodeOffsetValue(value)
	if err != nil {
		if !live {
			c.loadErrs++
		}
		return fmt.Errorf("group %q transactional offset of %s-%d: %w", k.group, k.topic, k.partition, err)
	}
	c.seq++
	t := c.seeEpoch(p)
	if t.offsets == nil {
		t.offsets = map[string]map[tp]txnOffset{}
		t.offsetsEpoch = p.Epoch
	}
	t.offsetsEpoch = max(t.offsetsEpoch, p.Epoch)
	o := t.offsets[k.group]
	if o == nil {
		o = map[tp]txnOffset{}
		t.offsets[k.group] = o
	}
	o[key] = txnOffset{commit: v, seq: c.seq}
	open := c.openTxns[k.group]
	if open == nil {
		open = map[int64]bool{}
		c.openTxns[k.group] = open
	}
	open[p.ID] = true
	return nil
}

// applyMarker ends producer p's transaction on this partition: COMMIT installs its pending offsets as
// the committed ones (each newer than the committed offset of its partition, or it would have been
// dropped) and drops other transactions' offsets of those partitions appended before them; ABORT
// drops them.
func (c *Coordinator) applyMarker(p Producer, commit bool) {
	t := c.seeEpoch(p)
	offsets := t.offsets
	t.offsets = nil
	for _, gid := range sortedKeys(offsets) {
		if open := c.openTxns[gid]; open != nil {
			delete(open, p.ID)
			if len(open) == 0 {
				delete(c.openTxns, gid)
			}
		}
		if !commit {
			continue
		}
		for key, off := range offsets[gid] {
			o := c.offsets[gid]
			if o == nil {
				o = map[tp]OffsetCommit{}
				c.offsets[gid] = o
			}
			o[key] = off.commit
			c.dropTxnOffsets(gid, key, off.seq)
		}
	}
}

// supersedeTxnOffsets drops every pending transactional offset of partition key of group gid: a plain
// commit or tombstone of the key was just applied, after all of them in log order.
func (c *Coordinator) supersedeTxnOffsets(gid string, key tp) {
	c.dropTxnOffsets(gid, key, math.MaxUint64)
}

// dropTxnOffsets drops the pending transactional offsets of partition key of group gid whose records
// came before position before.
func (c *Coordinator) dropTxnOffsets(gid string, key tp, before uint64) {
	for pid := range c.openTxns[gid] {
		t := c.txns[pid]
		o := t.offsets[gid]
		if off, ok := o[key]; !ok || off.seq >= before {
			continue
		}
		delete(o, key)
		if len(o) == 0 {
			delete(t.offsets, gid)
			delete(c.openTxns[gid], pid)
		}
	}
	if len(c.openTxns[gid]) == 0 {
		delete(c.openTxns, gid)
	}
}

// checkTxns verifies the transactional state's own invariants (part of Check).
func (c *Coordinator) checkTxns() error {
	for pid, t := range c.txns {
		if t.offsets != nil && t.offsetsEpoch > t.epoch {
			return fmt.Errorf("producer %d: open transaction at epoch %d, above its epoch %d", pid, t.offsetsEpoch, t.epoch)
		}
		for gid, o := range t.offsets {
			if len(o) == 0 {
				return fmt.Errorf("producer %d: empty pending offsets of group %q", pid, gid)
			}
			if !c.openTxns[gid][pid] {
				return fmt.Errorf("producer %d: pending offsets of group %q not indexed", pid, gid)
			}
		}
	}
	for gid, open := range c.openTxns {
		if len(open) == 0 {
			return fmt.Errorf("group %q: empty open transactions index", gid)
		}
		for pid := range open {
			if t := c.txns[pid]; t == nil || len(t.offsets[gid]) == 0 {
				return fmt.Errorf("group %q: producer %d indexed without pending offsets", gid, pid)
			}
		}
	}
	for gid, ks := range c.txnInflight {
		for k, n := range ks {
			if n <= 0 || c.pending[gid][k] < n {
				return fmt.Errorf("group %q: %d transactional offsets of %s-%d in flight, %d commits", gid, n, k.topic, k.part, c.pending[gid][k])
			}
		}
	}
	return nil
}

func countUp(m map[string]map[tp]int, gid string, k tp) {
	g := m[gid]
	if g == nil {
		g = map[tp]int{}
		m[gid] = g
	}
	g[k]++
}

func countDown(m map[string]map[tp]int, gid string, k tp) {
	g := m[gid]
	if g == nil {
		return
	}
	if g[k]--; g[k] <= 0 {
		delete(g, k)
	}
	if len(g) == 0 {
		delete(m, gid)
	}
}
