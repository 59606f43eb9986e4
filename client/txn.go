package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf16"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// The transactional producer (KIP-98, with KIP-447's group-fenced offset commits and KIP-890's
// server-side partition verification): see Producer and WithTransactionalID.

// Errors of the transactional producer. Each is returned wrapped with the cause (the broker's
// *rerr.Error, which errors.Is also matches against the rerr sentinels).
var (
	// ErrProducerFenced is fatal: another Producer with the same transactional id called
	// InitTransactions (or an operator aborted the transaction with `runnel txn abort`, or the
	// coordinator aborted it past its timeout), so this one's producer epoch is stale. Every later call
	// returns it; the producer must be closed. Kafka: ProducerFencedException (raised for
	// PRODUCER_FENCED and, inside a transaction, INVALID_PRODUCER_EPOCH).
	ErrProducerFenced = errors.New("client: producer fenced: its epoch is no longer the transactional id's (a newer producer took the id, or an operator or the transaction timeout aborted its transaction)")
	// ErrTransactionAborted says the transaction was aborted rather than committed: records dropped by
	// AbortTransaction before they were sent get it in their promises, and a transaction the coordinator
	// aborted because it outlived WithTransactionTimeout returns it from CommitTransaction (together
	// with ErrProducerFenced, since that abort bumps the producer epoch). Kafka:
	// TransactionAbortedException.
	ErrTransactionAborted = errors.New("client: transaction aborted")
	// ErrTransactionFailed says the transaction cannot commit: one of its records failed, a partition
	// could not be added to it, or SendOffsetsToTransaction failed. Produce, SendOffsetsToTransaction and
	// CommitTransaction return it until AbortTransaction, after which the next transaction may begin.
	// Kafka: the producer's abortable error state.
	ErrTransactionFailed = errors.New("client: transaction failed; call AbortTransaction")
	// ErrTxnState says a transactional method was called out of order (Produce outside a transaction,
	// BeginTransaction before InitTransactions or inside a transaction, ...), or on a producer without
	// WithTransactionalID. Kafka: IllegalStateException.
	ErrTxnState = errors.New("client: transactional call out of order")
)

// TxnStateTopic is the internal topic that holds transaction state: the leader of the partition a
// transactional id hashes to is that id's transaction coordinator.
const TxnStateTopic = "__transaction_state"

// txnPartitionFor returns the __transaction_state partition of a transactional id: Kafka's
// Utils.abs(id.hashCode()) % partitions over Java's String.hashCode of UTF-16 code units, the same as
// broker/group.PartitionFor for group ids (which the SDK does not import: it is a broker package).
func txnPartitionFor(id string, partitions int32) int32 {
	var h int32
	for _, u := range utf16.Encode([]rune(id)) {
		h = 31*h + int32(u)
	}
	if h == math.MinInt32 {
		h = 0 // Kafka's Utils.abs maps Integer.MIN_VALUE to 0
	} else if h < 0 {
		h = -h
	}
	return h % partitions
}

// GroupMetadata names a consumer group member for SendOffsetsToTransaction, so that the group's
// coordinator fences the transactional offset commit like the member's own commits (KIP-447): a member
// that lost its partitions to a rebalance cannot commit them. Take it from GroupConsumer.GroupMetadata
// just before the call. Kafka: ConsumerGroupMetadata.
type GroupMetadata struct {
	GroupID     string
	MemberID    string
	MemberEpoch int32
}

// txnCoordinator routes Transactions calls of one transactional id to its coordinator: the leader of
// the id's __transaction_state partition, looked up in metadata (the partition count is read there, not
// assumed). When the topic is not in metadata yet (it is created with the first transactional id), any
// broker is asked, and NOT_COORDINATOR naming a node in its leader id sends the next call there.
type txnCoordinator struct {
	cl *cluster
	id string
	coordNode
}

// lookup returns the coordinator's node, or -1 for "any broker" when metadata does not say.
func (c *txnCoordinator) lookup(ctx context.Context) (int32, error) {
	c.mu.Lock()
	node := c.node
	c.mu.Unlock()
	if node >= 0 && c.cl.knows(node) {
		return node, nil
	}
	md, err := c.cl.metadataOnce(ctx, []string{TxnStateTopic})
	if err != nil {
		return -1, err
	}
	if node >= 0 && c.cl.knows(node) {
		return node, nil // named by a NOT_COORDINATOR answer; its address is known now
	}
	for _, t := range md.Topics {
		if t.Name != TxnStateTopic || rerr.FromInfo(t.Error) != nil || len(t.Partitions) == 0 {
			continue
		}
		n := int32(0)
		for _, p := range t.Partitions {
			n = max(n, p.Partition+1)
		}
		want := txnPartitionFor(c.id, n)
		for _, p := range t.Partitions {
			if p.Partition == want && p.LeaderId >= 0 {
				c.mu.Lock()
				c.node = p.LeaderId
				c.mu.Unlock()
				return p.LeaderId, nil
			}
		}
	}
	return -1, nil
}

// concurrentTxnBackoff is the wait after CONCURRENT_TRANSACTIONS: the previous transaction's markers
// take milliseconds to write, and a producer committing every 100 ms must not lose a whole retry
// backoff each time (Kafka uses a fixed 20 ms for the same reason).
const concurrentTxnBackoff = 5 * time.Millisecond

// concurrentBackoff is the wait before retry number attempt after CONCURRENT_TRANSACTIONS: a fixed 5 ms
// for the first 20 tries (markers normally land within them), then doubling up to maxWait.
func concurrentBackoff(attempt int, maxWait time.Duration) time.Duration {
	if attempt < 20 {
		return concurrentTxnBackoff
	}
	return min(concurrentTxnBackoff<<min(attempt-19, 10), maxWait)
}

// call runs fn against the coordinator until it succeeds, fails for good, or ctx ends: retriable errors
// (coordinator moving or loading, CONCURRENT_TRANSACTIONS, a broker unreachable) are retried with
// backoff, each attempt bounded by the request timeout. fn returns wire errors (wireErr).
func (c *txnCoordinator) call(ctx context.Context, fn func(ctx context.Context, tc runnelv1.TransactionsClient) error) error {
	var prev error
	for attempt := 0; ; attempt++ {
		err := c.once(ctx, fn)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil && prev != nil {
			err = prev // cut short by ctx: say why the earlier attempts failed
		}
		if !retriable(err) {
			return err
		}
		wait := c.cl.backoff(attempt)
		if isCode(err, runnelv1.ErrorCode_CONCURRENT_TRANSACTIONS) {
			wait = concurrentBackoff(attempt, c.cl.cfg.retryBackoffMax)
		}
		if ctx.Err() != nil || sleep(ctx, wait) != nil {
			if attempt > 0 {
				return fmt.Errorf("gave up after %d attempts: %w", attempt+1, err)
			}
			return err
		}
		prev = err
		c.cl.cfg.logger.Debug("transaction coordinator call retried", "transactional_id", c.id, "attempt", attempt+1, "err", err)
	}
}

func (c *txnCoordinator) once(ctx context.Context, fn func(ctx context.Context, tc runnelv1.TransactionsClient) error) error {
	node, err := c.lookup(ctx)
	if err != nil {
		return err
	}
	cc, err := c.cl.nodeConn(node)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, c.cl.cfg.requestTimeout)
	defer cancel()
	err = fn(actx, runnelv1.NewTransactionsClient(cc))
	if err != nil {
		c.failed(err)
	}
	return err
}

// txnState is where the producer is in the transaction protocol (Kafka's TransactionManager.State).
type txnState int8

const (
	txnUninit       txnState = iota // InitTransactions not called yet, or it failed
	txnInitializing                 // InitTransactions running
	txnReady                        // no transaction open
	txnInProgress                   // BeginTransaction was called
	txnCommitting                   // CommitTransaction running (or it failed in a way a retry may finish)
	txnAborting                     // AbortTransaction running (or it failed in a way a retry may finish)
	txnAbortable                    // something failed: only AbortTransaction goes on
	txnFatal                        // fenced: nothing goes on
)

func (s txnState) String() string {
	return [...]string{"uninitialized", "initializing", "ready", "in a transaction", "committing", "aborting",
		"failed (abort required)", "fenced"}[s]
}

// txnManager is the transactional part of a Producer (nil when it has no transactional id).
//
// Partitions join a transaction before their first batch is sent: a sink that finds records of a
// partition not added in the current transaction (gen) asks the adder (requestAdd), which sends the
// partitions waiting at that moment in one AddPartitionsToTxn, marks them added (ppart.addedGen) and
// wakes the sinks; partitions that come while a call is in flight go in the next one.
type txnManager struct {
	p       *Producer
	id      string
	timeout time.Duration
	coord   *txnCoordinator

	gen    atomic.Uint64 // number of the current (or last) transaction, from 1
	addGen atomic.Uint64 // the transaction partitions may be added to now; 0: none (not open, aborting, failed)

	mu        sync.Mutex
	state     txnState
	err       error     // with txnAbortable or txnFatal: what Produce and the other calls return
	producing int       // Produce and SendOffsetsToTransaction calls inside the open transaction
	idle      chan bool // closed when producing drops to 0 while someone waits
	added     bool      // a partition or group may have been added: the coordinator may hold a transaction to end
	startedAt time.Time // the first add of the transaction (the coordinator's timeout runs from about then)
	groups    map[string]bool
	seqBroken bool               // a numbered batch failed for good: the epoch must be bumped before the next transaction
	onFail    context.CancelFunc // CommitTransaction's wait, ended when the transaction fails meanwhile
	gcoords   map[string]*coordinator

	addMu     sync.Mutex
	pending   map[*ppart]uint64 // partitions to add, and the transaction they are for
	addingNow map[*ppart]bool   // in the call in flight
	adding    bool              // the adder goroutine runs
	addIdle   chan struct{}     // closed when the adder stops
}

func newTxnManager(p *Producer) *txnManager {
	return &txnManager{p: p, id: p.cfg.transactionalID, timeout: p.cfg.txnTimeout,
		coord: &txnCoordinator{cl: p.cl, id: p.cfg.transactionalID, coordNode: coordNode{node: -1}}}
}

// txnOf returns the producer's transaction manager, or ErrTxnState naming call when it has none.
func (p *Producer) txnOf(call string) (*txnManager, error) {
	if p.txn == nil {
		return nil, fmt.Errorf("%w: %s on a producer without WithTransactionalID", ErrTxnState, call)
	}
	if p.closed.Load() {
		return nil, ErrClosed
	}
	return p.txn, nil
}

// stateErrLocked is the error of a call not allowed in the current state.
func (t *txnManager) stateErrLocked(call string) error {
	switch t.state {
	case txnFatal, txnAbortable:
		return t.err
	}
	return fmt.Errorf("%w: %s while the producer is %s", ErrTxnState, call, t.state)
}

// isFenced reports whether err says a newer epoch of the producer exists: PRODUCER_FENCED, or
// INVALID_PRODUCER_EPOCH, which inside a transaction means the same (Kafka treats both as fencing).
func isFenced(err error) bool {
	return errors.Is(err, rerr.ErrProducerFenced) || errors.Is(err, rerr.ErrInvalidProducerEpoch)
}

// failLocked moves the transaction to txnFatal (cause fences the producer) or txnAbortable, unless it
// is already there. Nothing more is added to the transaction; a CommitTransaction waiting stops.
func (t *txnManager) failLocked(cause error) {
	if t.state == txnFatal || t.state == txnUninit || t.state == txnReady {
		return
	}
	t.addGen.Store(0)
	if isFenced(cause) {
		if !t.startedAt.IsZero() && time.Since(t.startedAt) >= t.timeout {
			t.err = fmt.Errorf("%w: %w (the transaction was open %v, longer than its timeout %v, so the coordinator aborted it and bumped the epoch): %w",
				ErrProducerFenced, ErrTransactionAborted, time.Since(t.startedAt).Round(time.Millisecond), t.timeout, cause)
		} else {
			t.err = fmt.Errorf("%w: %w", ErrProducerFenced, cause)
		}
		t.state = txnFatal
		t.p.cfg.common.logger.Warn("transactional producer fenced", "transactional_id", t.id, "err", cause)
	} else {
		if t.state == txnAbortable || t.state == txnAborting {
			return // keep the first cause; an abort in progress decides for itself
		}
		t.err = fmt.Errorf("%w: %w", ErrTransactionFailed, cause)
		t.state = txnAbortable
	}
	if t.onFail != nil {
		t.onFail()
	}
}

func (t *txnManager) fail(cause error) {
	t.mu.Lock()
	t.failLocked(cause)
	t.mu.Unlock()
}

// recordFailed is told every record batch that failed (from finish): inside an open or committing
// transaction the transaction can no longer commit.
func (t *txnManager) recordFailed(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch t.state {
	case txnInProgress, txnCommitting:
		t.failLocked(err)
	case txnAborting, txnAbortable:
		if isFenced(err) {
			t.failLocked(err)
		}
	}
}

// sequenceBroken is told (under the partition's lock, from resetIdent) that a numbered batch failed
// for good: the leader would refuse the partition's next sequences, so the producer epoch is bumped
// (InitProducerId again) once the transaction is aborted. A transactional producer never drops its
// identity on its own, as an idempotent one does: its id and epoch are the coordinator's.
func (t *txnManager) sequenceBroken() {
	t.mu.Lock()
	t.seqBroken = true
	t.mu.Unlock()
}

// enterProduce admits a Produce (or SendOffsetsToTransaction) into the open transaction; exitProduce
// ends it. CommitTransaction and AbortTransaction wait for those admitted, so no record slips into a
// transaction after it was flushed.
func (t *txnManager) enterProduce(call string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state != txnInProgress {
		if t.state == txnReady || t.state == txnUninit {
			return fmt.Errorf("%w: %s outside a transaction (call BeginTransaction first)", ErrTxnState, call)
		}
		return t.stateErrLocked(call)
	}
	t.producing++
	return nil
}

func (t *txnManager) exitProduce() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.producing--
	if t.producing == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
}

// waitProducing waits until no Produce call is inside the transaction.
func (t *txnManager) waitProducing(ctx context.Context) error {
	for {
		t.mu.Lock()
		if t.producing == 0 {
			t.mu.Unlock()
			return nil
		}
		if t.idle == nil {
			t.idle = make(chan bool)
		}
		ch := t.idle
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// markAdded notes that the coordinator may now hold a transaction of this producer.
func (t *txnManager) markAdded() {
	t.mu.Lock()
	if !t.added {
		t.added, t.startedAt = true, time.Now()
	}
	t.mu.Unlock()
}

// txnProducer names this producer incarnation on the wire.
func (t *txnManager) txnProducer() *runnelv1.TxnProducer {
	id, epoch := t.p.ProducerID()
	return &runnelv1.TxnProducer{TransactionalId: t.id, ProducerId: id, ProducerEpoch: int32(epoch)}
}

// requestAdd asks for pp to be added to transaction gen (called by a sink, under pp.mu, when pp has
// records to send and is not added yet). Requests for a transaction no longer open are ignored: its
// records are dropped by AbortTransaction.
func (t *txnManager) requestAdd(pp *ppart, gen uint64) {
	if gen == 0 || t.addGen.Load() != gen {
		return
	}
	t.addMu.Lock()
	defer t.addMu.Unlock()
	if _, ok := t.pending[pp]; ok || t.addingNow[pp] {
		return
	}
	if t.pending == nil {
		t.pending = map[*ppart]uint64{}
	}
	t.pending[pp] = gen
	if !t.adding {
		t.adding = true
		t.addIdle = make(chan struct{})
		t.p.wg.Add(1) // from a sink goroutine, itself counted, so never concurrently with Close's Wait
		go t.runAdds()
	}
}

// runAdds sends AddPartitionsToTxn for the partitions waiting, call after call, until none waits.
func (t *txnManager) runAdds() {
	defer t.p.wg.Done()
	for {
		t.addMu.Lock()
		gen := t.addGen.Load()
		var parts []*ppart
		for pp, g := range t.pending {
			if g == gen && gen != 0 {
				parts = append(parts, pp)
			}
		}
		clear(t.pending)
		if len(parts) == 0 {
			t.adding, t.addingNow = false, nil
			close(t.addIdle)
			t.addMu.Unlock()
			return
		}
		t.addingNow = make(map[*ppart]bool, len(parts))
		for _, pp := range parts {
			t.addingNow[pp] = true
		}
		t.addMu.Unlock()
		t.addPartitions(gen, parts)
		t.addMu.Lock()
		t.addingNow = nil
		t.addMu.Unlock()
	}
}

// waitAdds waits until no AddPartitionsToTxn is in flight, so that EndTxn is not overtaken by an add
// that would open a new transaction at the coordinator.
func (t *txnManager) waitAdds(ctx context.Context) error {
	t.addMu.Lock()
	clear(t.pending)
	ch := t.addIdle
	adding := t.adding
	t.addMu.Unlock()
	if !adding {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// maxAddRetries bounds the retries of partitions a successful AddPartitionsToTxn answered with a
// retriable per-partition error (a topic just created, say); the delivery timeout bounds them too.
const maxAddRetries = 50

// addPartitions adds parts to transaction gen, retrying retriable errors within the delivery timeout,
// and wakes the sinks of those added. Partitions that cannot be added fail the transaction (abort
// required) and their unsent records with the error; a fencing error is fatal.
func (t *txnManager) addPartitions(gen uint64, parts []*ppart) {
	p := t.p
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.deliveryTimeout)
	defer cancel()
	t.markAdded()
	left := parts
	for attempt := 0; len(left) > 0; attempt++ {
		if t.addGen.Load() != gen {
			return // the transaction failed or is being aborted: its records are dropped there
		}
		tps := make([]TopicPartition, len(left))
		for i, pp := range left {
			tps[i] = TopicPartition{pp.topic, pp.id}
		}
		var resp *runnelv1.AddPartitionsToTxnResponse
		err := t.coord.call(ctx, func(ctx context.Context, tc runnelv1.TransactionsClient) error {
			var err error
			resp, err = tc.AddPartitionsToTxn(ctx, &runnelv1.AddPartitionsToTxnRequest{Producer: t.txnProducer(), Partitions: toProtoPartitions(tps)})
			return wireErr(err)
		})
		if err != nil {
			t.addFailed(left, err)
			return
		}
		res := make(map[TopicPartition]error, len(resp.Partitions))
		for _, r := range resp.Partitions {
			res[TopicPartition{r.Topic, r.Partition}] = rerr.FromInfo(r.Error)
		}
		var retry []*ppart
		woke := false
		for _, pp := range left {
			perr, ok := res[TopicPartition{pp.topic, pp.id}]
			switch {
			case !ok:
				t.addFailed([]*ppart{pp}, rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "AddPartitionsToTxn answer without %s-%d", pp.topic, pp.id))
			case perr == nil:
				pp.addedGen.Store(gen)
				woke = true
			case retriable(perr) && attempt < maxAddRetries:
				retry = append(retry, pp)
			default:
				t.addFailed([]*ppart{pp}, perr)
			}
		}
		if woke {
			p.wakeAll()
		}
		left = retry
		if len(left) > 0 {
			wait := p.cl.backoff(attempt)
			if isCode(res[TopicPartition{left[0].topic, left[0].id}], runnelv1.ErrorCode_CONCURRENT_TRANSACTIONS) {
				wait = concurrentBackoff(attempt, p.cfg.common.retryBackoffMax)
			}
			if err := sleep(ctx, wait); err != nil {
				t.addFailed(left, fmt.Errorf("%w (last answer: %v)", err, res[TopicPartition{left[0].topic, left[0].id}]))
				return
			}
		}
	}
}

// addFailed fails the transaction because parts could not be added, and their unsent records.
func (t *txnManager) addFailed(parts []*ppart, err error) {
	if t.p.ctx.Err() != nil {
		err = ErrClosed
	}
	for _, pp := range parts {
		err := fmt.Errorf("add %s-%d to transaction of %q: %w", pp.topic, pp.id, t.id, err)
		t.fail(err)
		t.p.dropUnsent(pp, err)
	}
}

// dropUnsent fails the batches of pp that were never sent (its queue and open batch) with err. They
// reached no leader, so the partition's sequence is wound back to the first of them and the next
// batch takes its place without a gap; but when one of them was sent before (a retry waiting in the
// queue), the leader may hold it, so their failure counts as a sequence break instead.
func (p *Producer) dropUnsent(pp *ppart, err error) {
	pp.mu.Lock()
	drop := append([]*pbatch(nil), pp.queue...)
	clear(pp.queue)
	pp.queue = pp.queue[:0]
	if pp.cur != nil {
		drop = append(drop, pp.cur)
		pp.cur = nil
	}
	resent := false
	for _, b := range drop {
		resent = resent || b.attempts > 0 || b.doomed
	}
	if !resent {
		rewound := false
		for _, b := range drop {
			if b.ident != nil && !rewound && b.ident == pp.seqIdent {
				pp.nextSequence, rewound = b.baseSeq, true
			}
			b.ident = nil // its failure leaves no gap: no sequence break
		}
	}
	pp.mu.Unlock()
	for _, b := range drop {
		p.batchResult(pp, b, false, -1, -1, err)
	}
}

// InitTransactions registers the producer's transactional id with its transaction coordinator and
// gets the producer id and epoch its transactions are written with (KIP-98 InitProducerId). It must be
// called once, before anything else. The coordinator first ends whatever a previous producer with the
// same id left open (committing what it had decided to commit, aborting the rest) and bumps the epoch,
// which fences that producer: its later writes and commits fail with ErrProducerFenced. It retries
// retriable errors (the coordinator loading or moving, CONCURRENT_TRANSACTIONS while the previous
// transaction's markers are written) with backoff until ctx ends. Errors: ctx's, ErrTxnState (called
// twice), INVALID_TRANSACTION_TIMEOUT (WithTransactionTimeout above the broker's maximum), or another
// broker error; after a failure it may be called again. Kafka: initTransactions.
func (p *Producer) InitTransactions(ctx context.Context) error {
	t, err := p.txnOf("InitTransactions")
	if err != nil {
		return err
	}
	t.mu.Lock()
	if t.state != txnUninit {
		err := t.stateErrLocked("InitTransactions")
		t.mu.Unlock()
		return err
	}
	t.state = txnInitializing
	t.mu.Unlock()
	id, err := t.initProducerID(ctx)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.state = txnUninit
		return err
	}
	p.ident.Store(id)
	t.state = txnReady
	p.cfg.common.logger.Debug("transactional producer initialized", "transactional_id", t.id, "producer_id", id.id, "epoch", id.epoch)
	return nil
}

// initProducerID calls the coordinator's InitProducerId and returns the new identity.
func (t *txnManager) initProducerID(ctx context.Context) (*producerIdentity, error) {
	var resp *runnelv1.InitTxnProducerIdResponse
	err := t.coord.call(ctx, func(ctx context.Context, tc runnelv1.TransactionsClient) error {
		var err error
		resp, err = tc.InitProducerId(ctx, &runnelv1.InitTxnProducerIdRequest{TransactionalId: t.id,
			TransactionTimeoutMs: int32(t.timeout / time.Millisecond)})
		if err != nil {
			return wireErr(err)
		}
		if resp.ProducerId < 0 || resp.ProducerEpoch < 0 || resp.ProducerEpoch > math.MaxInt16 {
			return rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "InitProducerId answered producer id %d, epoch %d", resp.ProducerId, resp.ProducerEpoch)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("init transactions of %q: %w", t.id, err)
	}
	return &producerIdentity{id: resp.ProducerId, epoch: int16(resp.ProducerEpoch)}, nil
}

// BeginTransaction opens a transaction: records produced from now until CommitTransaction or
// AbortTransaction belong to it. It is local (the coordinator hears of the transaction with its first
// partition). Errors: ErrTxnState (before InitTransactions, or a transaction is already open),
// ErrProducerFenced. Kafka: beginTransaction.
func (p *Producer) BeginTransaction() error {
	t, err := p.txnOf("BeginTransaction")
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state != txnReady {
		return t.stateErrLocked("BeginTransaction")
	}
	gen := t.gen.Add(1)
	t.added, t.startedAt, t.groups, t.err = false, time.Time{}, nil, nil
	t.state = txnInProgress
	t.addGen.Store(gen)
	return nil
}

// SendOffsetsToTransaction commits a consumer group's offsets as part of the open transaction, for
// consume-transform-produce: the offsets become the group's committed offsets if and only if the
// transaction commits (KIP-98, fenced by the member's epoch as in KIP-447). offsets are the next
// offsets to read, as CommitOffsets takes them; meta is the consuming member's
// GroupConsumer.GroupMetadata(), taken just before (the member should not auto-commit:
// WithAutoCommit(false), and should read committed).
//
// It adds the group to the transaction at the transaction coordinator (AddOffsetsToTxn), then sends
// the offsets to the group's coordinator (TxnOffsetCommit), retrying retriable errors within the
// request timeout and ctx. Any failure makes the transaction fail (ErrTransactionFailed wrapping the
// cause, per partition a *PartitionError: STALE_MEMBER_EPOCH or UNKNOWN_MEMBER_ID when the member lost
// the partitions, say): abort it. ErrProducerFenced is fatal. Kafka: sendOffsetsToTransaction.
func (p *Producer) SendOffsetsToTransaction(ctx context.Context, offsets map[TopicPartition]OffsetAndMetadata, meta GroupMetadata) error {
	t, err := p.txnOf("SendOffsetsToTransaction")
	if err != nil {
		return err
	}
	if meta.GroupID == "" {
		return rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "SendOffsetsToTransaction without a group id (pass GroupConsumer.GroupMetadata())")
	}
	if err := t.enterProduce("SendOffsetsToTransaction"); err != nil {
		return err
	}
	defer t.exitProduce()
	err = t.sendOffsets(ctx, offsets, meta)
	if err != nil {
		t.fail(err)
		t.mu.Lock()
		if t.err != nil {
			err = t.err
		}
		t.mu.Unlock()
	}
	return err
}

func (t *txnManager) sendOffsets(ctx context.Context, offsets map[TopicPartition]OffsetAndMetadata, meta GroupMetadata) error {
	group := meta.GroupID
	t.mu.Lock()
	added := t.groups[group]
	gc := t.gcoords[group]
	if gc == nil {
		if t.gcoords == nil {
			t.gcoords = map[string]*coordinator{}
		}
		gc = newCoordinator(t.p.cl)
		t.gcoords[group] = gc
	}
	t.mu.Unlock()
	if !added {
		t.markAdded()
		err := t.coord.call(ctx, func(ctx context.Context, tc runnelv1.TransactionsClient) error {
			_, err := tc.AddOffsetsToTxn(ctx, &runnelv1.AddOffsetsToTxnRequest{Producer: t.txnProducer(), GroupId: group})
			return wireErr(err)
		})
		if err != nil {
			return fmt.Errorf("add offsets of group %q to transaction of %q: %w", group, t.id, err)
		}
		t.mu.Lock()
		if t.groups == nil {
			t.groups = map[string]bool{}
		}
		t.groups[group] = true
		t.mu.Unlock()
	}
	if len(offsets) == 0 {
		return nil
	}
	pid, epoch := t.p.ProducerID()
	pending := make(map[TopicPartition]OffsetAndMetadata, len(offsets))
	for k, o := range offsets {
		pending[k] = o
	}
	var errs []error
	tries := map[TopicPartition]int{}
	for attempt := 0; len(pending) > 0; attempt++ {
		req := &runnelv1.TxnOffsetCommitRequest{GroupId: group, TransactionalId: t.id, ProducerId: pid, ProducerEpoch: int32(epoch),
			MemberId: meta.MemberID, MemberEpoch: meta.MemberEpoch}
		for k, o := range pending {
			req.Partitions = append(req.Partitions, &runnelv1.CommitPartition{Topic: k.Topic, Partition: k.Partition,
				Offset: o.Offset, LeaderEpoch: -1, Metadata: o.Metadata})
		}
		var resp *runnelv1.CommitOffsetsResponse
		err := gc.call(ctx, func(ctx context.Context, c runnelv1.GroupsClient) error {
			var err error
			resp, err = c.TxnOffsetCommit(ctx, req)
			return wireErr(err)
		})
		if err != nil {
			return fmt.Errorf("transactional offset commit to group %q: %w", group, err)
		}
		retry := false
		for _, r := range resp.Partitions {
			k := TopicPartition{r.Topic, r.Partition}
			if _, ok := pending[k]; !ok {
				continue
			}
			perr := rerr.FromInfo(r.Error)
			switch {
			case perr == nil:
				delete(pending, k)
			case isFenced(perr):
				return fmt.Errorf("transactional offset commit to group %q: %w", group, perr)
			case retriable(perr) && tries[k] < maxStaleRetries:
				tries[k]++
				retry = true
			default:
				delete(pending, k)
				errs = append(errs, &PartitionError{Topic: r.Topic, Partition: r.Partition, Err: perr})
			}
		}
		if !retry {
			for k := range pending {
				errs = append(errs, &PartitionError{Topic: k.Topic, Partition: k.Partition,
					Err: rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "TxnOffsetCommit answer without the partition")})
			}
			break
		}
		if err := sleep(ctx, t.p.cl.backoff(attempt)); err != nil {
			return fmt.Errorf("transactional offset commit to group %q: %w", group, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("transactional offset commit to group %q: %w", group, err)
	}
	return nil
}

// CommitTransaction commits the open transaction: it waits for Produce calls in progress, sends every
// buffered record at once and waits until each is acknowledged, then asks the coordinator to commit
// (EndTxn), which answers once the decision is durable; the COMMIT markers reach the partitions
// right after, and read_committed consumers see the records from then on. The next transaction may
// begin when it returns.
//
// Errors: ErrTransactionFailed (wrapping the first failure) when a record of the transaction or
// SendOffsetsToTransaction failed, or the coordinator refused the commit: call AbortTransaction.
// ErrProducerFenced (also matching ErrTransactionAborted when the transaction outlived its timeout) is
// fatal. When ctx ends first, it returns ctx's error and the transaction stays committing: call it
// again (a repeated EndTxn of a committed transaction succeeds) or AbortTransaction. ErrTxnState when
// no transaction is open. Kafka: commitTransaction.
func (p *Producer) CommitTransaction(ctx context.Context) error {
	t, err := p.txnOf("CommitTransaction")
	if err != nil {
		return err
	}
	t.mu.Lock()
	if t.state != txnInProgress && t.state != txnCommitting {
		err := t.stateErrLocked("CommitTransaction")
		t.mu.Unlock()
		return err
	}
	t.state = txnCommitting
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t.onFail = cancel
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.onFail = nil
		t.mu.Unlock()
	}()
	err = t.waitProducing(fctx)
	if err == nil {
		err = p.Flush(fctx)
	}
	t.mu.Lock()
	if t.state != txnCommitting { // a record failed, or the producer was fenced
		err := t.err
		t.mu.Unlock()
		return err
	}
	added := t.added
	t.mu.Unlock()
	if err != nil {
		return fmt.Errorf("commit transaction of %q: waiting for its records: %w", t.id, err)
	}
	if added {
		if err := t.endTxn(ctx, true); err != nil {
			return err
		}
	}
	t.mu.Lock()
	t.state = txnReady
	t.mu.Unlock()
	return nil
}

// endTxn ends the transaction at the coordinator and moves the producer to the epoch the answer gives
// (KIP-890 part 2: every transaction ends at a bumped epoch, so a late write of this one is refused
// everywhere instead of joining the next; the new identity restarts every partition's sequence at 0).
// At the last epoch (math.MaxInt16) it asks InitProducerId for a new producer id. A fencing error is
// fatal; ctx ending keeps the state for a retry; any other error fails the transaction (abort
// required).
func (t *txnManager) endTxn(ctx context.Context, commit bool) error {
	what := "abort"
	if commit {
		what = "commit"
	}
	var resp *runnelv1.EndTxnResponse
	err := t.coord.call(ctx, func(ctx context.Context, tc runnelv1.TransactionsClient) error {
		var err error
		resp, err = tc.EndTxn(ctx, &runnelv1.EndTxnRequest{Producer: t.txnProducer(), Commit: commit})
		if err == nil {
			pid, _ := t.p.ProducerID()
			if resp.ProducerId != pid || resp.ProducerEpoch < 0 || resp.ProducerEpoch > math.MaxInt16 {
				return rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "EndTxn answered producer id %d, epoch %d", resp.ProducerId, resp.ProducerEpoch)
			}
		}
		return wireErr(err)
	})
	if err == nil {
		err = t.nextIdentity(ctx, int16(resp.ProducerEpoch))
	}
	if err == nil {
		return nil
	}
	err = fmt.Errorf("%s transaction of %q: %w", what, t.id, err)
	if ctx.Err() != nil && !isFenced(err) {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if commit || isFenced(err) {
		t.failLocked(err)
		return t.err
	}
	return err
}

// nextIdentity installs the producer epoch EndTxn answered, when it is new. Every batch of the ended
// transaction has been answered (CommitTransaction flushed, AbortTransaction waited), so none is
// numbered under the old identity any more.
func (t *txnManager) nextIdentity(ctx context.Context, epoch int16) error {
	cur := t.p.ident.Load()
	if cur == nil || epoch == cur.epoch {
		return nil
	}
	if epoch == math.MaxInt16 {
		// The epoch cannot be bumped again: the next transaction needs a new producer id.
		id, err := t.initProducerID(ctx)
		if err != nil {
			return fmt.Errorf("new producer id after the last epoch: %w", err)
		}
		t.p.ident.Store(id)
		return nil
	}
	t.p.ident.Store(&producerIdentity{id: cur.id, epoch: epoch})
	return nil
}

// AbortTransaction aborts the open (or failed) transaction: it waits for Produce calls in progress,
// fails the records not sent yet with ErrTransactionAborted, waits for those in flight to be answered,
// and asks the coordinator to abort (EndTxn), which writes ABORT markers: read_committed consumers
// never see the transaction's records, and its offsets are not committed. Ending the transaction bumps
// the producer epoch (KIP-890 part 2), which also restarts the sequences a failed record broke (with
// nothing added to the transaction, InitProducerId bumps it), so the next transaction starts clean.
// The next transaction may begin when it returns.
//
// Errors: ErrProducerFenced (fatal); ctx's error (the abort stays in progress: call it again); a
// broker error; ErrTxnState when no transaction is open. Kafka: abortTransaction.
func (p *Producer) AbortTransaction(ctx context.Context) error {
	t, err := p.txnOf("AbortTransaction")
	if err != nil {
		return err
	}
	return t.abort(ctx)
}

func (t *txnManager) abort(ctx context.Context) error {
	p := t.p
	t.mu.Lock()
	switch t.state {
	case txnInProgress, txnCommitting, txnAbortable, txnAborting:
		t.state = txnAborting
		t.addGen.Store(0)
	default:
		err := t.stateErrLocked("AbortTransaction")
		t.mu.Unlock()
		return err
	}
	t.mu.Unlock()
	if err := t.waitProducing(ctx); err != nil {
		return err
	}
	if err := t.waitAdds(ctx); err != nil {
		return err
	}
	aborted := fmt.Errorf("%w: AbortTransaction before the record was sent", ErrTransactionAborted)
	for _, pp := range *p.allParts.Load() {
		p.dropUnsent(pp, aborted)
	}
	p.flushing.Add(1) // retried batches in flight go at once
	p.wakeAll()
	err := p.waitIdle(ctx)
	p.flushing.Add(-1)
	if err != nil {
		return fmt.Errorf("abort transaction of %q: waiting for its records in flight: %w", t.id, err)
	}
	t.mu.Lock()
	added, fatal := t.added, t.state == txnFatal
	t.mu.Unlock()
	if fatal {
		return t.fatalErr()
	}
	if added {
		if err := t.endTxn(ctx, false); err != nil {
			return err
		}
		t.mu.Lock()
		t.added = false     // a retried abort does not end it again
		t.seqBroken = false // EndTxn bumped the epoch: every sequence starts again
		t.mu.Unlock()
	}
	t.mu.Lock()
	bump := t.seqBroken
	t.mu.Unlock()
	if bump {
		id, err := t.initProducerID(ctx)
		if err != nil {
			return fmt.Errorf("abort transaction of %q: new producer epoch after a sequence failure: %w", t.id, err)
		}
		p.ident.Store(id)
		p.cfg.common.logger.Info("producer epoch bumped after a failed transaction", "transactional_id", t.id, "producer_id", id.id, "epoch", id.epoch)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state == txnFatal {
		return t.err
	}
	t.seqBroken = false
	t.state, t.err = txnReady, nil
	return nil
}

func (t *txnManager) fatalErr() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// close runs when the Producer closes: an open transaction is aborted (as Kafka's producer does on a
// graceful close), within the request timeout; a fenced producer drops its unsent records.
func (t *txnManager) close() {
	t.mu.Lock()
	st := t.state
	t.mu.Unlock()
	switch st {
	case txnInProgress, txnCommitting, txnAbortable, txnAborting:
		ctx, cancel := context.WithTimeout(context.Background(), t.p.cfg.common.requestTimeout)
		defer cancel()
		if err := t.abort(ctx); err != nil {
			t.p.cfg.common.logger.Warn("abort of the open transaction on close failed; the coordinator aborts it after its timeout",
				"transactional_id", t.id, "err", err)
		}
	}
	t.mu.Lock()
	st, err := t.state, t.err
	t.mu.Unlock()
	if st != txnReady && st != txnUninit {
		if err == nil {
			err = ErrClosed
		}
		t.addGen.Store(0)
		for _, pp := range *t.p.allParts.Load() {
			t.p.dropUnsent(pp, err)
		}
	}
}
