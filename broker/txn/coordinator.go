package txn

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/group"
)

// StateTopic is the internal compacted topic that holds the transactional ids' state.
const StateTopic = "__transaction_state"

// PartitionFor returns the __transaction_state partition of a transactional id: the same hash and
// modulo as group ids on __consumer_offsets (group.PartitionFor), as in Kafka. The leader of that
// partition coordinates the id.
func PartitionFor(transactionalID string, partitions int32) int32 {
	return group.PartitionFor(transactionalID, partitions)
}

// MaxProducerEpoch is the highest epoch InitProducerId hands out: one below math.MaxInt16, so the bump
// that fences a producer (a timeout or a takeover aborting its transaction) is always possible. Past it
// InitProducerId allocates a new producer id at epoch 0.
const MaxProducerEpoch = math.MaxInt16 - 1

// Marker is the work that ends a prepared transaction: a COMMIT or ABORT marker, of ProducerID at
// ProducerEpoch, to every partition in Partitions (by topic, partitions ascending; the groups'
// __consumer_offsets partitions included).
type Marker struct {
	TransactionalID string
	ProducerID      int64
	ProducerEpoch   int16
	Commit          bool
	Partitions      []*runnelv1.TopicPartitions
}

// AllocFunc returns a new producer id (the broker's block allocator; KIP-730). Its error is returned as
// it is by the call that needed the id.
type AllocFunc func() (int64, error)

// PartitionCheck returns nil when topic-partition exists and may be in a transaction, else the
// per-partition error (UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST for internal topics, ...).
type PartitionCheck func(topic string, partition int32) error

// Coordinator is the deterministic core of the transaction coordinator (KIP-98) for the transactional
// ids of one __transaction_state partition. It holds no goroutines, reads no clock and does no I/O:
// every call gets the time, and calls that change state change it in memory at once and return the
// records that must be appended to the partition, in order, before the call is answered (the shell
// serialises calls and appends in call order, so memory is never behind the log). Durable records come
// back through Apply, which is how the core learns that a PREPARE_* decision may be acted on
// (TakePrepared).
//
// Every refused call leaves the state as it was: each path checks everything before it changes
// anything. It is not safe for concurrent use.
type Coordinator struct {
	cfg  Config
	txns map[string]*txnMeta
	// prepared holds the transactions whose PREPARE_* record is durable and that TakePrepared has not
	// handed out yet.
	prepared        map[string]Marker
	nextExpiryCheck time.Time
}

// New returns a coordinator with no transactional ids; feed it the partition's records with Load.
func New(cfg Config) *Coordinator {
	return &Coordinator{cfg: cfg.WithDefaults(), txns: map[string]*txnMeta{}, prepared: map[string]Marker{}}
}

func isPrepare(s runnelv1.TxnState) bool {
	return s == runnelv1.TxnState_TXN_PREPARE_COMMIT || s == runnelv1.TxnState_TXN_PREPARE_ABORT
}

// active reports whether a transaction is ongoing or being ended.
func active(s runnelv1.TxnState) bool { return s == runnelv1.TxnState_TXN_ONGOING || isPrepare(s) }

func record(id string, m *txnMeta) Record { return Record{Key: encodeKey(id), Value: m.encode()} }

func concurrent(id string, m *txnMeta) error {
	return rerr.New(runnelv1.ErrorCode_CONCURRENT_TRANSACTIONS, "transactional id %q: the previous transaction is being ended (%v); retry", id, m.state)
}

// Load replays one durable record of the partition, in log order, when this node becomes the
// partition's leader. A record that does not decode is skipped and returns an error wrapping
// errCorrupt (the caller logs it); a later record of the same id still applies.
func (c *Coordinator) Load(rec Record) error {
	id, err := decodeKey(rec.Key)
	if err != nil {
		return err
	}
	if rec.Value == nil {
		delete(c.txns, id)
		delete(c.prepared, id)
		return nil
	}
	m, err := decodeValue(rec.Value)
	if err != nil {
		return fmt.Errorf("transactional id %q: %w", id, err)
	}
	c.txns[id] = m
	c.notePrepared(id, m)
	return nil
}

// Apply takes back records this core returned, once they are durable, in log order. A PREPARE_*
// record makes its transaction's markers due (TakePrepared).
func (c *Coordinator) Apply(recs []Record) {
	for _, rec := range recs {
		id, err := decodeKey(rec.Key)
		if err != nil {
			continue // our own records decode
		}
		if rec.Value == nil {
			delete(c.prepared, id)
			continue
		}
		if m, err := decodeValue(rec.Value); err == nil {
			c.notePrepared(id, m)
		}
	}
}

func (c *Coordinator) notePrepared(id string, m *txnMeta) {
	if !isPrepare(m.state) {
		delete(c.prepared, id)
		return
	}
	c.prepared[id] = Marker{TransactionalID: id, ProducerID: m.producerID, ProducerEpoch: m.epoch,
		Commit: m.state == runnelv1.TxnState_TXN_PREPARE_COMMIT, Partitions: m.sortedParts()}
}

// TakePrepared returns, by transactional id, the transactions whose PREPARE_* record became durable
// (through Apply or Load) since the last call: the shell writes their markers, then calls Complete.
func (c *Coordinator) TakePrepared() []Marker {
	out := make([]Marker, 0, len(c.prepared))
	for _, id := range slices.Sorted(maps.Keys(c.prepared)) {
		out = append(out, c.prepared[id])
	}
	clear(c.prepared)
	return out
}

// InitProducerId registers transactional id req.TransactionalId with a new producer id at epoch 0
// (alloc gives the id), or bumps the epoch of a known one (a new producer id at epoch 0 past
// MaxProducerEpoch), fencing its previous producer. A known id with an ONGOING transaction gets that
// transaction aborted first, at a bumped epoch, and the answer CONCURRENT_TRANSACTIONS with the
// PREPARE_ABORT record to append; one with a transaction being ended (PREPARE_*) gets
// CONCURRENT_TRANSACTIONS alone. Errors: INVALID_REQUEST (bad id), INVALID_TRANSACTION_TIMEOUT (below 0
// or above MaxTimeout), alloc's.
func (c *Coordinator) InitProducerId(now time.Time, req *runnelv1.InitTxnProducerIdRequest, alloc AllocFunc) (*runnelv1.InitTxnProducerIdResponse, []Record, error) {
	id := req.GetTransactionalId()
	if err := checkID("transactional id", id); err != nil {
		return nil, nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%v", err)
	}
	timeout := req.GetTransactionTimeoutMs()
	if timeout == 0 {
		timeout = int32(c.cfg.DefaultTimeout.Milliseconds())
	}
	if timeout < 0 || time.Duration(timeout)*time.Millisecond > c.cfg.MaxTimeout {
		return nil, nil, rerr.New(runnelv1.ErrorCode_INVALID_TRANSACTION_TIMEOUT, "transaction timeout %dms is outside [1, %d]ms",
			req.GetTransactionTimeoutMs(), c.cfg.MaxTimeout.Milliseconds())
	}
	m := c.txns[id]
	if m != nil && isPrepare(m.state) {
		return nil, nil, concurrent(id, m)
	}
	if m != nil && m.state == runnelv1.TxnState_TXN_ONGOING {
		// The previous producer left a transaction open: abort it at a bumped epoch, so its late writes
		// and its EndTxn are fenced, and let the new producer retry once the markers are written.
		c.fenceAbort(now, m)
		return nil, []Record{record(id, m)}, concurrent(id, m)
	}
	next := &txnMeta{epoch: 0, lastEpoch: -1, state: runnelv1.TxnState_TXN_EMPTY, timeoutMs: timeout, startMs: -1, updateMs: now.UnixMilli(),
		parts: map[tp]struct{}{}, groups: map[string]struct{}{}}
	if m != nil && m.epoch < MaxProducerEpoch {
		next.producerID, next.epoch = m.producerID, m.epoch+1
	} else {
		pid, err := alloc()
		if err != nil {
			return nil, nil, fmt.Errorf("transactional id %q: allocate a producer id: %w", id, err)
		}
		next.producerID = pid
	}
	c.txns[id] = next
	return &runnelv1.InitTxnProducerIdResponse{ProducerId: next.producerID, ProducerEpoch: int32(next.epoch)},
		[]Record{record(id, next)}, nil
}

// fenceAbort decides to abort m's ongoing transaction at a bumped epoch, which fences its producer
// (InitProducerId of another producer, a timeout, an operator's abort). InitProducerId never hands out
// math.MaxInt16, so the bump always fits; the guard only keeps a corrupt epoch from wrapping.
func (c *Coordinator) fenceAbort(now time.Time, m *txnMeta) {
	if m.epoch < math.MaxInt16 {
		m.epoch++
	}
	m.lastEpoch = -1 // not the producer's own bump: its retried EndTxn is fenced
	m.state = runnelv1.TxnState_TXN_PREPARE_ABORT
	m.updateMs = now.UnixMilli()
}

// producer returns the state of the producer a call comes from, or the error that refuses it:
// INVALID_REQUEST (no id), INVALID_PRODUCER_ID_MAPPING (the id is unknown or has another producer id),
// PRODUCER_FENCED (another epoch: a newer producer took the id, or the transaction was aborted by a
// timeout or an operator).
func (c *Coordinator) producer(p *runnelv1.TxnProducer) (string, *txnMeta, error) {
	id := p.GetTransactionalId()
	if err := checkID("transactional id", id); err != nil {
		return id, nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%v", err)
	}
	m := c.txns[id]
	switch {
	case m == nil:
		return id, nil, rerr.New(runnelv1.ErrorCode_INVALID_PRODUCER_ID_MAPPING, "transactional id %q is unknown to its coordinator (call InitProducerId)", id)
	case p.ProducerId != m.producerID:
		return id, nil, rerr.New(runnelv1.ErrorCode_INVALID_PRODUCER_ID_MAPPING, "transactional id %q has producer id %d, not %d", id, m.producerID, p.ProducerId)
	case p.ProducerEpoch != int32(m.epoch):
		return id, nil, rerr.New(runnelv1.ErrorCode_PRODUCER_FENCED, "transactional id %q is at producer epoch %d, not %d: this producer was fenced",
			id, m.epoch, p.ProducerEpoch)
	}
	return id, m, nil
}

// begin starts a transaction on m unless one is ongoing.
func begin(now time.Time, m *txnMeta) {
	if m.state != runnelv1.TxnState_TXN_ONGOING {
		m.state, m.startMs = runnelv1.TxnState_TXN_ONGOING, now.UnixMilli()
		clear(m.parts)
		clear(m.groups)
	}
	m.updateMs = now.UnixMilli()
}

func countParts(parts []*runnelv1.TopicPartitions) int {
	n := 0
	for _, t := range parts {
		n += len(t.GetPartitions())
	}
	return n
}

// AddPartitionsToTxn adds partitions to the producer's transaction, beginning one when none is ongoing.
// Each partition is checked with check (and must not be of an internal topic: groups join through
// AddOffsetsToTxn); those that fail get their error in the answer and are not added, the others are.
// Errors of the whole call: those of producer, CONCURRENT_TRANSACTIONS (the previous transaction is
// being ended), INVALID_REQUEST (more than MaxPartitions in the request or the transaction).
func (c *Coordinator) AddPartitionsToTxn(now time.Time, req *runnelv1.AddPartitionsToTxnRequest, check PartitionCheck) (*runnelv1.AddPartitionsToTxnResponse, []Record, error) {
	id, m, err := c.producer(req.GetProducer())
	if err != nil {
		return nil, nil, err
	}
	if isPrepare(m.state) {
		return nil, nil, concurrent(id, m)
	}
	if n := countParts(req.Partitions); n > MaxPartitions {
		return nil, nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%d partitions in one request, at most %d", n, MaxPartitions)
	}
	resp := &runnelv1.AddPartitionsToTxnResponse{}
	added := map[tp]struct{}{}
	for _, t := range req.Partitions {
		for _, p := range t.Partitions {
			err := checkTopic(t.Topic)
			if err != nil {
				err = rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "%v", err)
			} else if p < 0 {
				err = rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "partition %d of %q", p, t.Topic)
			} else {
				err = check(t.Topic, p)
			}
			resp.Partitions = append(resp.Partitions, &runnelv1.TxnPartitionResult{Topic: t.Topic, Partition: p, Error: rerr.ToInfo(err)})
			if k := (tp{t.Topic, p}); err == nil && (m.state != runnelv1.TxnState_TXN_ONGOING || !has(m.parts, k)) {
				added[k] = struct{}{}
			}
		}
	}
	if len(added) == 0 {
		return resp, nil, nil // nothing new: the answer waits for the writes before it
	}
	kept := 0
	if m.state == runnelv1.TxnState_TXN_ONGOING {
		kept = len(m.parts)
	}
	if kept+len(added) > MaxPartitions {
		return nil, nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "transactional id %q: a transaction of more than %d partitions", id, MaxPartitions)
	}
	begin(now, m)
	maps.Copy(m.parts, added)
	return resp, []Record{record(id, m)}, nil
}

func has[K comparable](m map[K]struct{}, k K) bool {
	_, ok := m[k]
	return ok
}

// AddOffsetsToTxn adds group req.GroupId to the producer's transaction (KIP-447), beginning one when
// none is ongoing: its partition of __consumer_offsets (offsetsPartitions partitions) joins the
// transaction, so it gets the markers. Errors: those of producer, CONCURRENT_TRANSACTIONS,
// INVALID_GROUP_ID, INVALID_REQUEST (the transaction is full).
func (c *Coordinator) AddOffsetsToTxn(now time.Time, req *runnelv1.AddOffsetsToTxnRequest, offsetsPartitions int32) ([]Record, error) {
	id, m, err := c.producer(req.GetProducer())
	if err != nil {
		return nil, err
	}
	if err := checkID("group id", req.GroupId); err != nil {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_GROUP_ID, "%v", err)
	}
	if offsetsPartitions < 1 {
		return nil, rerr.New(runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE, "%s has no partitions", group.OffsetsTopic)
	}
	if isPrepare(m.state) {
		return nil, concurrent(id, m)
	}
	k := tp{group.OffsetsTopic, group.PartitionFor(req.GroupId, offsetsPartitions)}
	ongoing := m.state == runnelv1.TxnState_TXN_ONGOING
	if ongoing && has(m.groups, req.GroupId) && has(m.parts, k) {
		return nil, nil
	}
	if ongoing && !has(m.parts, k) && len(m.parts) >= MaxPartitions {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "transactional id %q: a transaction of more than %d partitions", id, MaxPartitions)
	}
	begin(now, m)
	m.parts[k] = struct{}{}
	m.groups[req.GroupId] = struct{}{}
	return []Record{record(id, m)}, nil
}

// EndTxn decides the producer's ongoing transaction: PREPARE_COMMIT or PREPARE_ABORT at the producer
// epoch bumped by one (KIP-890 part 2), whose record the shell appends before answering; the markers
// follow (TakePrepared, Complete), written at the new epoch, so every partition refuses a late write of
// the ended transaction (INVALID_PRODUCER_EPOCH, or PRODUCER_FENCED from VerifyPartitions) instead of
// admitting it into the producer's next transaction under the same epoch. The answer carries the
// producer id and the new epoch; the producer's sequences start again at 0. An EndTxn retried with
// the epoch that bump replaced (its answer was lost) is answered the same way, and changes nothing.
//
// With no transaction ongoing it is a no-op answered with the current epoch: a retried EndTxn, an
// abort with nothing to abort, or a commit of a transaction that added nothing (txn.proto calls the
// last INVALID_TXN_STATE; committing nothing is harmless, so it is not refused). Errors: those of
// producer, INVALID_TXN_STATE (ending with the opposite decision of the one being carried out or just
// completed; an ongoing transaction at epoch math.MaxInt16, which InitProducerId never hands out).
func (c *Coordinator) EndTxn(now time.Time, req *runnelv1.EndTxnRequest) (*runnelv1.EndTxnResponse, []Record, error) {
	p := req.GetProducer()
	if m := c.txns[p.GetTransactionalId()]; m != nil && m.lastEpoch >= 0 && p.GetProducerId() == m.producerID &&
		p.GetProducerEpoch() == int32(m.lastEpoch) && m.state != runnelv1.TxnState_TXN_ONGOING {
		// The retry of the EndTxn that bumped the epoch; the producer has not used the new one yet.
		if err := decided(p.GetTransactionalId(), m, req.Commit); err != nil {
			return nil, nil, err
		}
		return &runnelv1.EndTxnResponse{ProducerId: m.producerID, ProducerEpoch: int32(m.epoch)}, nil, nil
	}
	id, m, err := c.producer(p)
	if err != nil {
		return nil, nil, err
	}
	if m.state != runnelv1.TxnState_TXN_ONGOING {
		if err := decided(id, m, req.Commit); err != nil {
			return nil, nil, err
		}
		return &runnelv1.EndTxnResponse{ProducerId: m.producerID, ProducerEpoch: int32(m.epoch)}, nil, nil
	}
	if m.epoch >= math.MaxInt16 {
		return nil, nil, rerr.New(runnelv1.ErrorCode_INVALID_TXN_STATE, "transactional id %q: producer epoch %d cannot be bumped; call InitProducerId", id, m.epoch)
	}
	m.lastEpoch = m.epoch
	m.epoch++
	m.state = runnelv1.TxnState_TXN_PREPARE_ABORT
	if req.Commit {
		m.state = runnelv1.TxnState_TXN_PREPARE_COMMIT
	}
	m.updateMs = now.UnixMilli()
	return &runnelv1.EndTxnResponse{ProducerId: m.producerID, ProducerEpoch: int32(m.epoch)}, []Record{record(id, m)}, nil
}

// decided refuses ending m's transaction with commit when it is being ended, or was just ended, the
// other way: a producer whose commit timed out and that now aborts must not be told its committed
// records were aborted (it would redo them), as in Kafka.
func decided(id string, m *txnMeta, commit bool) error {
	switch m.state {
	case runnelv1.TxnState_TXN_PREPARE_COMMIT, runnelv1.TxnState_TXN_COMPLETE_COMMIT:
		if !commit {
			break
		}
		return nil
	case runnelv1.TxnState_TXN_PREPARE_ABORT, runnelv1.TxnState_TXN_COMPLETE_ABORT:
		if commit {
			break
		}
		return nil
	default:
		return nil
	}
	return rerr.New(runnelv1.ErrorCode_INVALID_TXN_STATE, "transactional id %q: cannot %s, the transaction is in %v",
		id, map[bool]string{true: "commit", false: "abort"}[commit], m.state)
}

// VerifyPartitions answers a partition leader (KIP-890): per partition, success when it is in the
// ongoing transaction of exactly this producer id and epoch, PRODUCER_FENCED when the epoch is not the
// id's (a newer producer, or the transaction was aborted with a bump), INVALID_TXN_STATE otherwise
// (not added, no transaction ongoing, unknown id or producer id). It changes nothing. Errors:
// INVALID_REQUEST (bad id, more than MaxPartitions).
func (c *Coordinator) VerifyPartitions(req *runnelv1.VerifyPartitionsRequest) (*runnelv1.VerifyPartitionsResponse, error) {
	if n := countParts(req.Partitions); n > MaxPartitions {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%d partitions in one request, at most %d", n, MaxPartitions)
	}
	id, m, err := c.producer(req.GetProducer())
	if err != nil {
		if e := rerr.FromError(err); e.Code == runnelv1.ErrorCode_INVALID_REQUEST {
			return nil, err
		} else if e.Code == runnelv1.ErrorCode_INVALID_PRODUCER_ID_MAPPING {
			err = rerr.New(runnelv1.ErrorCode_INVALID_TXN_STATE, "%s", e.Message)
		}
	}
	resp := &runnelv1.VerifyPartitionsResponse{}
	for _, t := range req.Partitions {
		for _, p := range t.Partitions {
			perr := err
			if perr == nil && (m.state != runnelv1.TxnState_TXN_ONGOING || !has(m.parts, tp{t.Topic, p})) {
				perr = rerr.New(runnelv1.ErrorCode_INVALID_TXN_STATE, "%s-%d is not in the ongoing transaction of transactional id %q (%v)",
					t.Topic, p, id, m.state)
			}
			resp.Partitions = append(resp.Partitions, &runnelv1.TxnPartitionResult{Topic: t.Topic, Partition: p, Error: rerr.ToInfo(perr)})
		}
	}
	return resp, nil
}

// Complete ends a prepared transaction once the shell has written its markers everywhere:
// COMPLETE_COMMIT or COMPLETE_ABORT, partitions and groups cleared. It returns nothing when the id is
// no longer in that PREPARE_* state of that producer id and epoch (a stale completion).
func (c *Coordinator) Complete(now time.Time, mk Marker) []Record {
	m := c.txns[mk.TransactionalID]
	want := runnelv1.TxnState_TXN_PREPARE_ABORT
	if mk.Commit {
		want = runnelv1.TxnState_TXN_PREPARE_COMMIT
	}
	if m == nil || m.state != want || m.producerID != mk.ProducerID || m.epoch != mk.ProducerEpoch {
		return nil
	}
	m.state = runnelv1.TxnState_TXN_COMPLETE_ABORT
	if mk.Commit {
		m.state = runnelv1.TxnState_TXN_COMPLETE_COMMIT
	}
	m.startMs, m.updateMs = -1, now.UnixMilli()
	clear(m.parts)
	clear(m.groups)
	return []Record{record(mk.TransactionalID, m)}
}

// Tick aborts, at a bumped epoch, the ongoing transactions older than their timeout (so their
// producers are fenced: a zombie cannot commit what the coordinator aborted), and every
// IDExpirationCheckInterval forgets the ids with no transaction ongoing that have not changed for
// IDExpiration (tombstones). It returns the records, by transactional id.
func (c *Coordinator) Tick(now time.Time) []Record {
	var timedOut, expired []string
	checkExpiry := !now.Before(c.nextExpiryCheck)
	if checkExpiry {
		c.nextExpiryCheck = now.Add(c.cfg.IDExpirationCheckInterval)
	}
	ms := now.UnixMilli()
	for id, m := range c.txns {
		switch {
		case m.state == runnelv1.TxnState_TXN_ONGOING && ms-m.startMs > int64(m.timeoutMs):
			timedOut = append(timedOut, id)
		case checkExpiry && !active(m.state) && ms-m.updateMs >= c.cfg.IDExpiration.Milliseconds():
			expired = append(expired, id)
		}
	}
	var out []Record
	for _, id := range slices.Sorted(slices.Values(timedOut)) {
		m := c.txns[id]
		c.fenceAbort(now, m)
		out = append(out, record(id, m))
	}
	for _, id := range slices.Sorted(slices.Values(expired)) {
		delete(c.txns, id)
		out = append(out, Record{Key: encodeKey(id)})
	}
	return out
}

// AbortTransaction is the operator's abort of a stuck transaction: the ongoing transaction is aborted
// at a bumped epoch, which fences its producer; the answer carries the new epoch. Errors:
// INVALID_REQUEST, TRANSACTIONAL_ID_NOT_FOUND, CONCURRENT_TRANSACTIONS (it is being ended already),
// INVALID_TXN_STATE (no transaction ongoing).
func (c *Coordinator) AbortTransaction(now time.Time, req *runnelv1.AbortTransactionRequest) (*runnelv1.AbortTransactionResponse, []Record, error) {
	id := req.GetTransactionalId()
	if err := checkID("transactional id", id); err != nil {
		return nil, nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%v", err)
	}
	m := c.txns[id]
	switch {
	case m == nil:
		return nil, nil, rerr.New(runnelv1.ErrorCode_TRANSACTIONAL_ID_NOT_FOUND, "transactional id %q is unknown to its coordinator", id)
	case isPrepare(m.state):
		return nil, nil, concurrent(id, m)
	case m.state != runnelv1.TxnState_TXN_ONGOING:
		return nil, nil, rerr.New(runnelv1.ErrorCode_INVALID_TXN_STATE, "transactional id %q has no ongoing transaction (%v)", id, m.state)
	}
	c.fenceAbort(now, m)
	return &runnelv1.AbortTransactionResponse{ProducerId: m.producerID, ProducerEpoch: int32(m.epoch)}, []Record{record(id, m)}, nil
}

// ListTransactions returns the ids in one of states (all when empty), by transactional id, without
// coordinator_id (the shell's).
func (c *Coordinator) ListTransactions(states []runnelv1.TxnState) []*runnelv1.TransactionSummary {
	var out []*runnelv1.TransactionSummary
	for _, id := range slices.Sorted(maps.Keys(c.txns)) {
		m := c.txns[id]
		if len(states) == 0 || slices.Contains(states, m.state) {
			out = append(out, &runnelv1.TransactionSummary{TransactionalId: id, ProducerId: m.producerID, State: m.state})
		}
	}
	return out
}

// DescribeTransaction describes transactional id id, without coordinator_id (the shell's); an unknown
// id gets TRANSACTIONAL_ID_NOT_FOUND in the description's error.
func (c *Coordinator) DescribeTransaction(id string) *runnelv1.TransactionDescription {
	m := c.txns[id]
	if m == nil {
		return &runnelv1.TransactionDescription{TransactionalId: id, State: runnelv1.TxnState_TXN_DEAD, ProducerId: -1, ProducerEpoch: -1,
			TransactionStartMs: -1, LastUpdateMs: -1,
			Error: rerr.ToInfo(rerr.New(runnelv1.ErrorCode_TRANSACTIONAL_ID_NOT_FOUND, "transactional id %q is unknown to its coordinator", id))}
	}
	d := m.describe()
	d.TransactionalId = id
	return d
}

// Stats counts the ids this core holds and those with a transaction ongoing or being ended, for the
// broker's metrics.
func (c *Coordinator) Stats() (ids, open int) {
	for _, m := range c.txns {
		if active(m.state) {
			open++
		}
	}
	return len(c.txns), open
}

// String describes the core for test failures: every id and its state, by id.
func (c *Coordinator) String() string {
	var sb strings.Builder
	for _, id := range slices.Sorted(maps.Keys(c.txns)) {
		m := c.txns[id]
		fmt.Fprintf(&sb, "%s: pid=%d epoch=%d last=%d %v timeout=%dms start=%d parts=%v groups=%v\n", id, m.producerID, m.epoch, m.lastEpoch, m.state,
			m.timeoutMs, m.startMs, m.sortedParts(), slices.Sorted(maps.Keys(m.groups)))
	}
	return sb.String()
}
