package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/client/telemetry"
)

// Producer writes records to topics. Produce is asynchronous: records are encoded at once into their
// partition's open batch, a batch is sent as soon as its broker's stream can take another request (or,
// with WithLinger, after the linger) and grows while it cannot, and each record's promise runs when the
// broker answers. Safe for concurrent use.
//
// How it works: every partition keeps one open batch (a batch.Builder records are encoded into, pooled
// with its buffers) and a queue of sealed batches. Each broker that leads partitions has a sink: one
// goroutine that takes at most one ready batch per partition into a request, sends requests on a
// long-lived ProduceStream (up to max-in-flight unanswered), and one goroutine that reads the answers.
// The broker appends requests in the order they arrive, so pipelining keeps each partition's order.
// When a partition's batch fails with a retriable error, that partition sends nothing more until its
// other in-flight batches are answered; then its failed batches go back, in order, to the front of its
// queue and are re-sent after a backoff, until the delivery timeout. Promises of a partition run in the
// order its records were produced, on the goroutine reading answers: they must be quick and must not
// call Flush or Close, nor wait for other promises.
//
// Idempotence (KIP-98, on by default, WithIdempotence): the producer gets a producer id and epoch from
// InitProducerId (one goroutine, started when a batch is first waiting for it; nothing is built or sent
// meanwhile) and numbers each partition's batches with base sequences when they are built, which is when
// they are sealed or, for batches sealed while the id was pending, once it is known, in order. The
// sequence counts records from 0 per producer id and partition, wrapping after MaxInt32. A retried batch
// is re-sent with the bytes it was built with, so with the same sequence, and the leader drops it if it
// already has it. A partition has at most 5 batches in flight, all under one producer id, and starts a
// new batch only while fewer than 5 are open (sent and not finished: ppart.open). A batch that
// fails for good after it was numbered leaves a gap the leader would refuse every later batch for: it
// and the partition's later batches under that id fail, and the producer takes a new id (resetIdent),
// under which sequences start again at 0.
//
// Transactions (KIP-98, WithTransactionalID): the producer id and epoch come from the transaction
// coordinator (InitTransactions; never taken or reset on its own), every batch carries the
// transactional attribute and the request its transactional id, and a partition's batches are sent
// only once the partition is in the current transaction: a sink that finds records of a partition not
// yet added asks the transaction manager, which adds the partitions waiting together in one
// AddPartitionsToTxn and wakes the sinks. Records are accepted only between BeginTransaction and
// CommitTransaction/AbortTransaction; CommitTransaction flushes and waits for every record before
// EndTxn; AbortTransaction drops the batches never sent (winding their partition's sequence back, as
// they reached no leader) and waits for those in flight. A numbered batch that fails for good breaks
// its sequence: the transaction must abort, and the abort bumps the epoch (InitProducerId again) so
// sequences restart at 0. See txn.go.
type Producer struct {
	cfg    producerConfig
	cl     *cluster
	sticky StickyPartitioner // cfg.partitioner when it implements StickyPartitioner
	acks   runnelv1.Acks
	tr     *telemetry.Tracer // nil: tracing off (WithTelemetry(nil))
	txn    *txnManager       // nil: not transactional (no WithTransactionalID)
	// kafka is cfg.partitioner when it is NewKafkaPartitioner's: the producer then reads and moves a
	// topic's sticky partition through ptopic.sticky, without the partitioner's lookup of the topic.
	kafka *kafkaPartitioner

	buf      bufLimiter
	flushing atomic.Int32 // > 0: send open batches without waiting for the linger

	outstanding atomic.Int64 // records in a batch, or about to be, whose promise has not run yet
	idleMu      sync.Mutex
	idleCh      chan struct{} // closed when outstanding reaches 0 while someone waits

	topicsMu sync.Mutex                         // serialises changes to topics and allParts
	topics   atomic.Pointer[map[string]*ptopic] // copy on write
	allParts atomic.Pointer[[]*ppart]           // every partition of every topic, copy on write
	// firstTopic is the first topic whose metadata loaded, looked at before topics: most producers
	// write one topic, and comparing its name costs less than the map's hashing of it, for every record.
	firstTopic atomic.Pointer[ptopic]

	sinksMu sync.Mutex
	sinks   map[int32]*sink

	// ident is the producer id and epoch batches are built with: nil while InitProducerId is pending
	// (nothing is built or sent then), noIdentity when the producer is not idempotent.
	ident         atomic.Pointer[producerIdentity]
	identMu       sync.Mutex
	identBusy     bool      // an InitProducerId goroutine is running
	identErr      error     // why the last InitProducerId failed (nil once one succeeded)
	identRetry    time.Time // no new InitProducerId before this, after a failure
	identFailures int       // consecutive failed InitProducerId rounds, for the backoff

	free batchPool // finished batches whose buffers the next batches reuse
	corr atomic.Int64

	metaWake chan struct{}

	// active counts the calls in progress that Close must wait for: a transactional producer's Produce
	// calls, and metadata loads started by topic.
	active      atomic.Int64
	closed      atomic.Bool
	drained     chan struct{} // closed once Close has started and active is 0
	drainedOnce sync.Once
	closeOnce   sync.Once
	closeErr    error

	ctx        context.Context // ends sinks, streams and the metadata loop, after the last promise
	cancel     context.CancelFunc
	loadCtx    context.Context // ends metadata waits of Produce calls, as soon as Close starts
	loadCancel context.CancelFunc
	wg         sync.WaitGroup
}

// ptopic is a topic the producer has produced to.
type ptopic struct {
	name  string
	parts atomic.Pointer[[]*ppart] // nil until metadata first describes the topic; grows, never shrinks
	// sticky is the topic's sticky partition in Producer.kafka (nil when the partitioner is another).
	sticky *atomic.Int32

	mu      sync.Mutex
	loading chan struct{} // closed when the metadata load in progress ends
	loadErr error         // why the last load failed
}

// ppart is one partition's batches.
type ppart struct {
	topic string
	id    int32

	finishMu sync.Mutex // held while promises run, so a partition's promises run in order
	ready    []*pbatch  // scratch for finishMu's holder

	mu       sync.Mutex
	cur      *pbatch   // the open batch, nil when none
	queue    []*pbatch // sealed batches waiting to be sent, oldest first
	inflight int       // batches sent and not answered
	failed   []*pbatch // failed retriably; re-queued once inflight reaches 0
	retryAt  time.Time // nothing is sent before this (backoff after a retriable error)
	sink     *sink     // the broker the partition's batches go to
	leader   int32     // leader from the latest metadata (-1 unknown)
	// epoch is the leader epoch from the latest metadata, sent with each batch (KIP-320) so a broker
	// that is no longer the leader, or not yet, refuses it rather than storing it.
	epoch    atomic.Int32
	lastSize int       // bytes of the partition's last sealed batch, which sizes the next one's buffer
	lastLen  int       // records of the partition's last sealed batch, which sizes the next one's records
	nextSeq  uint64    // sequence of the next batch created
	nextDone uint64    // sequence of the next batch whose promises may run
	held     []*pbatch // finished batches waiting for an earlier one, by sequence
	// open counts the batches sent at least once and not yet released to run their promises: in
	// flight, failed and waiting to be re-sent, or answered and held for an earlier one. An
	// idempotent partition starts a new batch only while it is below maxIdempotentInFlight, so that
	// the leader never writes more than 4 batches after one a retry may still need it to recognise:
	// the broker answers a stream's requests as their appends finish, not always in order, so
	// counting only the batches in flight let a failed batch's later ones pass the leader's window
	// of 5 (it then refused the retry with OUT_OF_ORDER_SEQUENCE_NUMBER).
	open int
	// addedGen is the transaction (txnManager.gen) the partition was last added to: its batches are
	// sent only while it equals the current one (a transactional producer's partitions join each
	// transaction with AddPartitionsToTxn before their first batch).
	addedGen atomic.Uint64

	// Idempotence. Batch sequences (KIP-98 base sequences, not the seq above) count records per
	// producer identity, from 0.
	seqIdent     *producerIdentity // the identity nextSequence counts for
	nextSequence int32             // base sequence of the next batch built under seqIdent
	sentIdent    *producerIdentity // identity of the batches in flight, when inflight > 0
	breaks       []seqBreak        // numbered batches that failed for good; later ones of their identity fail too
}

// producerIdentity is a producer id and epoch from InitProducerId. Every answer gets its own value, so
// identities compare by pointer.
type producerIdentity struct {
	id    int64
	epoch int16
}

// noIdentity is the identity of a producer without idempotence: batches carry producer id -1.
var noIdentity = &producerIdentity{id: -1, epoch: -1}

// seqBreak records that the batch with seq `after` of identity ident failed for good: the leader will
// refuse the identity's later batches of the partition as out of order, so they fail with err wrapped.
type seqBreak struct {
	ident *producerIdentity
	after uint64
	err   error
}

// pending is a record and its promise (nil when Produce was given none), waiting in a batch.
type pending struct {
	r  *Record
	fn func(*Record, error)
}

// pbatch is one batch of a partition, from its first record to its promises.
type pbatch struct {
	bld      batch.Builder
	recs     []pending
	bytes    int64 // buffered bytes accounted for its records
	seq      uint64
	firstAt  time.Time         // when the first record came (linger starts)
	deadline time.Time         // firstAt + delivery timeout
	wire     []byte            // the built batch once sealed and the producer identity known (nil before)
	ident    *producerIdentity // identity whose sequence it carries; nil: none (not built, or not idempotent)
	baseSeq  int32             // its base sequence under ident
	doomed   bool              // failed because an earlier batch of its identity failed (error wrapped already)
	opened   bool              // sent at least once: counted in its partition's open until its promises run
	attempts int
	lastErr  error
	send     *telemetry.SendSpan // the batch's span; nil when not traced
	// unanswered counts the sends of wire the broker has not answered: the transport may still read
	// wire then (produceCodec references it), so a batch is recycled only at 0. A send on a stream that
	// broke is never answered, so its batch is left to the garbage collector.
	unanswered atomic.Int32
	// outcome
	base       int64
	appendTime int64
	err        error
}

// NewProducer returns a producer for the cluster reachable at brokers (host:port of one or more
// brokers; the others are learnt from metadata). It validates the options and connects lazily: an
// unreachable cluster shows as errors in promises, not here.
func NewProducer(brokers []string, opts ...ProducerOption) (*Producer, error) {
	cfg, err := newProducerConfig(opts)
	if err != nil {
		return nil, err
	}
	cl, err := newCluster(brokers, cfg.common)
	if err != nil {
		return nil, err
	}
	p := &Producer{cfg: cfg, cl: cl, sinks: map[int32]*sink{}, metaWake: make(chan struct{}, 1), drained: make(chan struct{})}
	p.sticky, _ = cfg.partitioner.(StickyPartitioner)
	p.kafka, _ = cfg.partitioner.(*kafkaPartitioner)
	p.tr = cfg.common.tracer()
	if cfg.transactionalID != "" {
		p.txn = newTxnManager(p) // the identity comes from InitTransactions
	}
	if !cfg.idempotence {
		p.ident.Store(noIdentity)
	}
	switch cfg.acks {
	case AcksAll:
		p.acks = runnelv1.Acks_ACKS_ALL
	case AcksLeader:
		p.acks = runnelv1.Acks_ACKS_LEADER
	case AcksNone:
		p.acks = runnelv1.Acks_ACKS_NONE
	}
	p.buf.max = cfg.maxBuffered
	p.topics.Store(&map[string]*ptopic{})
	p.allParts.Store(&[]*ppart{})
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.loadCtx, p.loadCancel = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.metaLoop()
	return p, nil
}

// enter registers a Produce call; false once the producer is closed.
func (p *Producer) enter() bool {
	p.active.Add(1)
	if p.closed.Load() {
		p.exit()
		return false
	}
	return true
}

func (p *Producer) exit() {
	if p.active.Add(-1) == 0 && p.closed.Load() {
		p.drainedOnce.Do(func() { close(p.drained) })
	}
}

// Produce sends r asynchronously and calls promise (which may be nil) exactly once, with r and nil when
// the broker has acknowledged it (Partition and Offset filled; Offset -1 with AcksNone) or with the error
// that ended it. Errors are catalogue errors (errors.Is against rerr sentinels): MESSAGE_TOO_LARGE for a
// record over the request or buffer cap, UNKNOWN_TOPIC_OR_PARTITION when the topic does not show up
// within the delivery timeout, the broker's error for a batch it refused, or the last retriable error
// once the delivery timeout expired; or ctx's error, or ErrClosed.
//
// Produce returns once the record is in a batch. It blocks while the topic's metadata is first loaded
// (at most the delivery timeout) and while the buffered bytes are at their cap; ctx ends those waits
// (the promise then gets ctx.Err()) and has no effect once the record is buffered. With tracing on
// (WithTelemetry, or a global tracer provider), ctx's span is the parent of the span of the batch the
// record opens, or is linked from the batch's span it joins; the records of a traced batch carry its
// trace context headers (traceparent) after their own.
//
// r must not be modified until the promise runs; the producer writes r.Partition, r.Offset and, when
// zero, r.Timestamp.
func (p *Producer) Produce(ctx context.Context, r *Record, promise func(*Record, error)) {
	// A nil promise is kept as nil in the batch, so completing its record costs no call; the paths
	// below that fail the record at once call fail.
	fail := promise
	if fail == nil {
		fail = func(*Record, error) {}
	}
	if p.closed.Load() {
		fail(r, ErrClosed)
		return
	}
	if p.txn != nil {
		p.produceTxn(ctx, r, promise, fail)
		return
	}
	p.produce(ctx, r, promise, fail)
}

// produceTxn is Produce inside a transaction. Close aborts an open transaction only once no Produce
// call is inside it (drained). A non-transactional producer's calls count as in progress only while
// they load a topic's metadata (topic): for the rest append reads closed under the partition's lock,
// which spares the add and the subtract of the count per record (in a profile at full speed the add
// alone took 3.4 s of Produce's 17.7 s; docs/performance.md, issue 9). Its own function, so that the
// defers are not Produce's: with them, Produce had too many returns for the compiler's inline defers
// and ran the runtime's deferreturn on every call, transactional or not.
func (p *Producer) produceTxn(ctx context.Context, r *Record, promise, fail func(*Record, error)) {
	if !p.enter() {
		fail(r, ErrClosed)
		return
	}
	defer p.exit()
	if err := p.txn.enterProduce("Produce"); err != nil {
		fail(r, err)
		return
	}
	defer p.txn.exitProduce()
	p.produce(ctx, r, promise, fail)
}

// produce is Produce after the producer's own checks: fail is promise, or a no-op when promise is nil.
func (p *Producer) produce(ctx context.Context, r *Record, promise, fail func(*Record, error)) {
	if r.Topic == "" {
		fail(r, rerr.New(runnelv1.ErrorCode_INVALID_TOPIC_EXCEPTION, "record without a topic"))
		return
	}
	size := batch.RecordSize(r.Key, r.Value, r.Headers)
	if size+batch.HeaderSize > p.cfg.maxRequestBytes || int64(size) > p.cfg.maxBuffered {
		fail(r, rerr.New(runnelv1.ErrorCode_MESSAGE_TOO_LARGE, "record of %d bytes is larger than max request bytes (%d) or max buffered bytes (%d)",
			size, p.cfg.maxRequestBytes, p.cfg.maxBuffered))
		return
	}
	if err := ctx.Err(); err != nil {
		fail(r, err)
		return
	}
	t, err := p.topic(ctx, r.Topic)
	if err != nil {
		fail(r, err)
		return
	}
	if err := p.buf.acquire(ctx, int64(size), p.wakeAll); err != nil {
		fail(r, err)
		return
	}
	p.outstanding.Add(1)
	if r.Timestamp.IsZero() {
		r.Timestamp = time.Now()
	}
	if err := p.append(ctx, t, r, promise, size); err != nil {
		p.buf.release(int64(size))
		fail(r, err)
		p.recordsDone(1)
	}
}

// ProduceSync produces rs and waits until every one has its outcome. It returns the first error (in
// completion order), or nil when all are written; each record's Partition and Offset are filled. ctx
// bounds the waits of Produce (metadata, buffer space); buffered records finish within the delivery
// timeout, and ProduceSync waits for them.
func (p *Producer) ProduceSync(ctx context.Context, rs ...*Record) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	wg.Add(len(rs))
	promise := func(_ *Record, err error) {
		if err != nil {
			mu.Lock()
			if first == nil {
				first = err
			}
			mu.Unlock()
		}
		wg.Done()
	}
	for _, r := range rs {
		p.Produce(ctx, r, promise)
	}
	wg.Wait()
	return first
}

// Flush sends every buffered record at once (ignoring the linger) and waits until all records produced
// before and during the call have had their promises run, or ctx ends (returning ctx.Err()).
func (p *Producer) Flush(ctx context.Context) error {
	p.flushing.Add(1)
	defer p.flushing.Add(-1)
	p.wakeAll()
	return p.waitIdle(ctx)
}

// Close flushes, waiting for every buffered record's outcome (bounded by the delivery timeout), then
// stops the producer's goroutines and closes its connections. Produce calls waiting for metadata or for
// buffer space fail with ErrClosed (as Kafka's producer fails a send waiting for memory when it
// closes); later ones too. Such calls may return, and run their promise with ErrClosed, after Close
// has returned. Close may be called more than once.
func (p *Producer) Close() error {
	p.closeOnce.Do(func() {
		p.closed.Store(true)
		p.loadCancel()
		p.flushing.Add(1)
		p.wakeAll()
		// Calls in progress (a transactional producer's, and metadata loads, which start goroutines of
		// p.wg) end before the transaction is aborted and before p.wg.Wait; other records are refused
		// once closed is set (append), or counted in outstanding, which waitIdle below waits for.
		if p.active.Load() != 0 {
			<-p.drained
		}
		if p.txn != nil {
			p.txn.close() // aborts an open transaction
		}
		_ = p.waitIdle(context.Background())
		p.cancel()
		p.wg.Wait()
		p.closeErr = p.cl.close()
	})
	return p.closeErr
}

func (p *Producer) waitIdle(ctx context.Context) error {
	for {
		p.idleMu.Lock()
		if p.outstanding.Load() == 0 {
			p.idleMu.Unlock()
			return nil
		}
		if p.idleCh == nil {
			p.idleCh = make(chan struct{})
		}
		ch := p.idleCh
		p.idleMu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// recordsDone counts n records finished, waking Flush when none is left.
func (p *Producer) recordsDone(n int) {
	if p.outstanding.Add(-int64(n)) == 0 {
		p.idleMu.Lock()
		if p.idleCh != nil {
			close(p.idleCh)
			p.idleCh = nil
		}
		p.idleMu.Unlock()
	}
}

// topic returns the producer's state of topic name, loading its metadata first if needed.
func (p *Producer) topic(ctx context.Context, name string) (*ptopic, error) {
	if t := p.firstTopic.Load(); t != nil && t.name == name {
		return t, nil
	}
	if t := (*p.topics.Load())[name]; t != nil && t.parts.Load() != nil {
		p.firstTopic.CompareAndSwap(nil, t)
		return t, nil
	}
	// The slow path may start a load goroutine (p.wg.Add), so it counts as a call in progress: Close
	// waits for those (drained) before its p.wg.Wait, and a call that comes after closed is refused.
	if !p.enter() {
		return nil, ErrClosed
	}
	defer p.exit()
	p.topicsMu.Lock()
	t := (*p.topics.Load())[name]
	if t == nil {
		t = &ptopic{name: name}
		if p.kafka != nil {
			t.sticky = p.kafka.state(name)
		}
		m := make(map[string]*ptopic, len(*p.topics.Load())+1)
		for k, v := range *p.topics.Load() {
			m[k] = v
		}
		m[name] = t
		p.topics.Store(&m)
	}
	p.topicsMu.Unlock()

	t.mu.Lock()
	if t.parts.Load() != nil {
		t.mu.Unlock()
		return t, nil
	}
	ch := t.loading
	if ch == nil {
		ch = make(chan struct{})
		t.loading = ch
		p.wg.Add(1)
		go p.load(t, ch)
	}
	t.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.parts.Load() != nil {
		return t, nil
	}
	return nil, t.loadErr
}

// load fetches a topic's metadata until it describes the topic's partitions, retrying retriable errors
// (UNKNOWN_TOPIC_OR_PARTITION included: a new topic may not have reached every broker yet) within the
// delivery timeout. It closes ch when done.
func (p *Producer) load(t *ptopic, ch chan struct{}) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(p.loadCtx, p.cfg.deliveryTimeout)
	defer cancel()
	var err, topicErr, prev error
	attempt := 0
	for ; ; attempt++ {
		if err != nil {
			prev = err
		}
		actx, acancel := context.WithTimeout(ctx, p.cfg.common.requestTimeout)
		_, err = p.cl.metadataOnce(actx, []string{t.name})
		acancel()
		if err == nil {
			tm := p.cl.topic(t.name)
			switch {
			case tm == nil:
				err = rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q missing from the metadata answer", t.name)
			case tm.err != nil:
				err = tm.err
			default:
				p.applyMeta(t)
				err = nil
			}
			topicErr = err
		}
		if err == nil || !retriable(err) || ctx.Err() != nil || sleep(ctx, p.cl.backoff(attempt)) != nil {
			break
		}
	}
	if err != nil && ctx.Err() != nil && prev != nil {
		err = prev // the last attempt was cut short by the deadline: report why the others failed
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.parts.Load() == nil {
		switch {
		case p.loadCtx.Err() != nil:
			err = ErrClosed
		case topicErr != nil && retriable(topicErr):
			err = fmt.Errorf("topic %q not available within the delivery timeout (%v, %d attempts): %w", t.name, p.cfg.deliveryTimeout, attempt+1, topicErr)
		case err == nil:
			err = rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q has no partitions", t.name)
		case retriable(err):
			err = fmt.Errorf("no metadata for topic %q within the delivery timeout (%v, %d attempts): %w", t.name, p.cfg.deliveryTimeout, attempt+1, err)
		}
		t.loadErr = err
	}
	t.loading = nil
	close(ch)
}

// applyMeta brings a topic's partitions in line with the cached metadata: new partitions are added, and
// leaders updated.
func (p *Producer) applyMeta(t *ptopic) {
	tm := p.cl.topic(t.name)
	if tm == nil || tm.err != nil || len(tm.partitions) == 0 {
		return // keep what we have: produce errors and the delivery timeout take it from here
	}
	p.topicsMu.Lock()
	var parts []*ppart
	if old := t.parts.Load(); old != nil {
		parts = *old
	}
	if len(tm.partitions) > len(parts) {
		grown := slices.Clone(parts)
		all := slices.Clone(*p.allParts.Load())
		for i := len(parts); i < len(tm.partitions); i++ {
			leader := tm.partitions[i].leader
			pp := &ppart{topic: t.name, id: int32(i), leader: leader, sink: p.sinkFor(leader)}
			grown = append(grown, pp)
			all = append(all, pp)
		}
		parts = grown
		t.parts.Store(&grown)
		p.allParts.Store(&all)
	}
	p.topicsMu.Unlock()
	for i, pm := range tm.partitions {
		parts[i].epoch.Store(pm.epoch)
		parts[i].setLeader(p, pm.leader)
	}
}

// setLeader records the partition's leader and moves the partition to its sink once nothing of it is in
// flight on the old one (moving earlier could reorder it).
func (pp *ppart) setLeader(p *Producer, leader int32) {
	pp.mu.Lock()
	pp.leader = leader
	s := pp.moveLocked(p)
	pp.mu.Unlock()
	if s != nil {
		s.wake()
	}
}

// moveLocked switches the partition to its leader's sink when that is safe; it returns the new sink to
// wake, or nil.
func (pp *ppart) moveLocked(p *Producer) *sink {
	if pp.inflight > 0 || len(pp.failed) > 0 || pp.leader < 0 || (pp.sink != nil && pp.sink.node == pp.leader) {
		return nil
	}
	pp.sink = p.sinkFor(pp.leader)
	return pp.sink
}

// sinkFor returns the sink of broker node (-1: any broker), starting it on first use.
func (p *Producer) sinkFor(node int32) *sink {
	p.sinksMu.Lock()
	defer p.sinksMu.Unlock()
	s := p.sinks[node]
	if s == nil {
		s = &sink{p: p, node: node, wakeCh: make(chan struct{}, 1), inflight: map[int64]*request{}}
		p.sinks[node] = s
		p.wg.Add(1)
		go s.run()
	}
	return s
}

func (p *Producer) wakeAll() {
	p.sinksMu.Lock()
	defer p.sinksMu.Unlock()
	for _, s := range p.sinks {
		s.wake()
	}
}

// requestMetadata asks the metadata loop for a refresh (after errors that suggest leaders or
// partitions changed).
func (p *Producer) requestMetadata() {
	select {
	case p.metaWake <- struct{}{}:
	default:
	}
}

// metaLoop refreshes the metadata of every topic produced to, when asked and every metadata max age,
// at most once per retry backoff.
func (p *Producer) metaLoop() {
	defer p.wg.Done()
	tick := time.NewTicker(p.cfg.common.metadataMaxAge)
	defer tick.Stop()
	var last time.Time
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.metaWake:
		case <-tick.C:
		}
		if wait := time.Until(last.Add(p.cfg.common.retryBackoff)); wait > 0 && sleep(p.ctx, wait) != nil {
			return
		}
		last = time.Now()
		var names []string
		for name, t := range *p.topics.Load() {
			if t.parts.Load() != nil {
				names = append(names, name)
			}
		}
		if len(names) == 0 {
			continue
		}
		if _, err := p.cl.metadata(p.ctx, names); err != nil {
			p.cfg.common.logger.Warn("metadata refresh failed", "topics", names, "err", err)
			continue
		}
		for _, name := range names {
			p.applyMeta((*p.topics.Load())[name])
		}
	}
}

// append puts the record into its partition's open batch, sealing the batch first when the record
// would overflow it.
func (p *Producer) append(ctx context.Context, t *ptopic, r *Record, promise func(*Record, error), size int) error {
	parts := *t.parts.Load()
	n := int32(len(parts))
	auto := r.Partition < 0
	part := r.Partition
	if auto {
		part = p.partition(t, r, n)
		if part < 0 || part >= n {
			return fmt.Errorf("client: partitioner chose partition %d of topic %q, which has %d", part, t.name, n)
		}
	} else if part >= n {
		// After Close has set closed, no metadata request: the connections may be closing, and
		// applyMeta may start a sink goroutine (p.wg.Add) after Close's p.wg.Wait. Read after Produce
		// counted the record in outstanding, as in the loop below, so it is safe.
		if p.closed.Load() {
			return ErrClosed
		}
		// The topic may have grown since the metadata was cached: look once more before failing.
		if _, err := p.cl.metadata(ctx, []string{t.name}); err == nil {
			p.applyMeta(t)
			parts = *t.parts.Load()
			n = int32(len(parts))
		}
		if part >= n {
			return rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q has %d partitions, no partition %d", t.name, n, part)
		}
	}
	ts := r.Timestamp.UnixMilli()
	for attempt := 0; ; attempt++ {
		pp := parts[part]
		pp.mu.Lock()
		// Produce counted the record in outstanding before this read, and Close sets closed before it
		// waits for outstanding to reach 0 (both sequentially consistent): either Close waits for this
		// record, or the record is refused here. So nothing enters a batch behind Close's back without
		// counting this call as in progress (topic's slow path and transactional calls still are).
		if p.closed.Load() {
			pp.mu.Unlock()
			return ErrClosed
		}
		b := pp.cur
		// The record is encoded with its batch's trace context headers (none when the batch is not
		// traced: hs is then r.Headers, with no allocation), so whether it fits is judged with them.
		var hs []batch.RecordHeader
		var wake *sink
		if b != nil {
			hs = b.send.Headers(r.Headers)
			if _, ok := b.bld.AppendWithin(p.cfg.batchBytes, ts, r.Key, r.Value, hs); !ok {
				pp.sealLocked(p)
				s := pp.sink
				pp.mu.Unlock()
				s.wake()
				if p.sticky != nil {
					p.batchSealed(t, pp.id, n)
					if auto && attempt == 0 {
						// KIP-480: a keyless record that would start a new batch follows the sticky
						// partition to its next place.
						if np := p.partition(t, r, n); np >= 0 && np < n {
							part = np
						}
					}
				}
				continue
			}
			if b.send != nil { // Link, not inlined, would check it after a call for every record
				b.send.Link(ctx) // a record from another trace than the first record's
			}
		} else {
			b = p.newBatch(pp)
			// The batch's span is a child of its first record's context; later records link to it.
			b.send = p.tr.StartSend(ctx, pp.topic, pp.id)
			hs = b.send.Headers(r.Headers)
			b.bld.Append(ts, r.Key, r.Value, hs)
			pp.cur = b
			wake = pp.sink // the sink times the linger from now
		}
		if b.send != nil {
			// Produce reserved the record's size without the trace context headers, which only the
			// batch decides. The difference (about 70 bytes) is taken without waiting: waiting here,
			// under the partition's lock, would block the releases it waits for.
			if extra := int64(batch.RecordSize(r.Key, r.Value, hs) - size); extra > 0 {
				p.buf.force(extra)
				size += int(extra)
			}
		}
		b.recs = append(b.recs, pending{r: r, fn: promise})
		b.bytes += int64(size)
		r.Partition = part
		pp.mu.Unlock()
		if wake != nil {
			wake.wake()
		}
		return nil
	}
}

// partition returns the partition the partitioner chooses for r among n. With NewKafkaPartitioner's, a
// keyless record's sticky partition is read through t.sticky, as the partitioner would.
func (p *Producer) partition(t *ptopic, r *Record, n int32) int32 {
	if t.sticky != nil && r.Key == nil {
		return stickyPartition(t.sticky, n)
	}
	return p.cfg.partitioner.Partition(r, n)
}

// batchSealed tells the sticky partitioner (p.sticky, not nil) that partition's batch of t was sealed.
func (p *Producer) batchSealed(t *ptopic, partition, n int32) {
	if t.sticky != nil {
		stickySealed(t.sticky, partition, n)
		return
	}
	p.sticky.OnBatchSealed(t.name, partition, n)
}

func (p *Producer) newBatch(pp *ppart) *pbatch {
	b := p.free.get()
	b.bld.Reset()
	// Room for twice the partition's last batch: the next is likely about as large (full ones at full
	// speed), and a buffer allocated at its size is not grown by copying, nor faulted in twice. Twice,
	// because sizes vary from batch to batch (keyed records spread over many partitions, say), and a
	// batch that outgrows its buffer copies all of it.
	b.bld.Grow(min(2*pp.lastSize, p.cfg.batchBytes) - batch.HeaderSize)
	b.recs = slices.Grow(b.recs, 2*pp.lastLen)
	now := time.Now()
	b.seq = pp.nextSeq
	pp.nextSeq++
	b.firstAt, b.deadline = now, now.Add(p.cfg.deliveryTimeout)
	return b
}

func (p *Producer) putBatch(b *pbatch) {
	if b.bld.Size() > 2*p.cfg.batchBytes || p.acks == runnelv1.Acks_ACKS_NONE || b.unanswered.Load() != 0 {
		// An outsized buffer is left to the GC, and so is one the transport may still read: with acks=0
		// nothing says when it is done, and a send on a broken stream is never answered.
		return
	}
	clear(b.recs)
	b.recs = b.recs[:0]
	b.bytes, b.wire, b.ident, b.baseSeq, b.doomed, b.opened, b.attempts, b.lastErr, b.err, b.send = 0, nil, nil, 0, false, false, 0, nil, nil, nil
	p.free.put(b, p.cfg.maxBuffered/2)
}

// batchPool keeps finished batches, with their builders' buffers and record slices, for the next
// batches: a buffer that is reused is already grown and its pages already touched, where a fresh one
// is grown by copying and faulted in page by page, which cost more than encoding the records into it.
// Unlike a sync.Pool it is not emptied by garbage collections, which a producer at full speed runs
// several times a second. It holds at most half the buffered-bytes cap (WithMaxBufferedBytes) of buffer
// capacity, and hands out the most recently freed batch first, whose memory is likeliest in cache.
type batchPool struct {
	mu    sync.Mutex
	free  []*pbatch
	bytes int64 // buffer capacity held in free
}

func (bp *batchPool) get() *pbatch {
	bp.mu.Lock()
	n := len(bp.free)
	if n == 0 {
		bp.mu.Unlock()
		return &pbatch{}
	}
	b := bp.free[n-1]
	bp.free[n-1] = nil
	bp.free = bp.free[:n-1]
	bp.bytes -= int64(b.bld.Cap())
	bp.mu.Unlock()
	return b
}

// put keeps b unless the pool would then hold more than max bytes of buffers.
func (bp *batchPool) put(b *pbatch, max int64) {
	c := int64(b.bld.Cap())
	bp.mu.Lock()
	if bp.bytes+c <= max {
		bp.free = append(bp.free, b)
		bp.bytes += c
	}
	bp.mu.Unlock()
}

// sealLocked closes the open batch and queues it for sending, building it (and those sealed before it
// while the producer identity was pending) when the identity is known.
func (pp *ppart) sealLocked(p *Producer) {
	pp.lastSize, pp.lastLen = pp.cur.bld.Size(), len(pp.cur.recs)
	pp.queue = append(pp.queue, pp.cur)
	pp.cur = nil
	pp.buildLocked(p)
}

// buildLocked builds the queued batches that are not built yet (a suffix of the queue: those sealed
// while the producer identity was pending), in order, once the identity is known. With idempotence each
// gets the partition's next base sequence under the identity, written into its header; a new identity
// starts the partition's sequence again at 0. A built batch keeps its bytes through retries.
func (pp *ppart) buildLocked(p *Producer) {
	n := len(pp.queue)
	if n == 0 || pp.queue[n-1].wire != nil {
		return
	}
	id := p.ident.Load()
	if id == nil {
		return
	}
	i := n - 1
	for i > 0 && pp.queue[i-1].wire == nil {
		i--
	}
	for _, b := range pp.queue[i:] {
		if id != noIdentity {
			if pp.seqIdent != id {
				pp.seqIdent, pp.nextSequence = id, 0
			}
			b.ident, b.baseSeq = id, pp.nextSequence
			b.bld.SetProducer(id.id, id.epoch, pp.nextSequence)
			b.bld.SetTransactional(p.txn != nil)
			pp.nextSequence = batch.NextSequence(pp.nextSequence, int32(b.bld.Len()))
		}
		b.wire = b.bld.Build(p.cfg.compression)
	}
}

// mayStartLocked reports whether a batch numbered under id (nil: not idempotent) may be sent now as far
// as idempotence goes: at most maxIdempotentInFlight batches of the partition in flight, all under one
// identity (so a retry never follows batches of a newer identity), and, for a batch not sent before
// (resend false), fewer than maxIdempotentInFlight open (see ppart.open). A re-sent batch is counted
// in open already.
func (pp *ppart) mayStartLocked(id *producerIdentity, resend bool) bool {
	if id == nil {
		return true
	}
	if !resend && pp.open >= maxIdempotentInFlight {
		return false
	}
	return pp.inflight == 0 || (pp.inflight < maxIdempotentInFlight && pp.sentIdent == id)
}

// limitedLocked reports whether the idempotence limits hold the partition's next new batch back.
func (pp *ppart) limitedLocked() bool {
	return pp.open >= maxIdempotentInFlight || pp.inflight >= maxIdempotentInFlight
}

// breakOfLocked returns the failure that dooms b (a later batch of the same identity), or nil.
func (pp *ppart) breakOfLocked(b *pbatch) *seqBreak {
	if b.ident == nil {
		return nil
	}
	for i := range pp.breaks {
		if br := &pp.breaks[i]; br.ident == b.ident && b.seq > br.after {
			return br
		}
	}
	return nil
}

// doomedErr is the error of a batch doomed by br.
func (pp *ppart) doomedErr(br *seqBreak) error {
	return fmt.Errorf("%s-%d: batch not written after an earlier batch failed: %w", pp.topic, pp.id, br.err)
}

// pruneBreaksLocked forgets the failures whose identity has no unfinished batch in the partition left.
func (pp *ppart) pruneBreaksLocked() {
	pp.breaks = slices.DeleteFunc(pp.breaks, func(br seqBreak) bool {
		if pp.inflight > 0 && pp.sentIdent == br.ident {
			return false
		}
		for _, q := range [2][]*pbatch{pp.failed, pp.queue} {
			for _, b := range q {
				if b.ident == br.ident {
					return false
				}
			}
		}
		return true
	})
}

// batchResult settles one batch that was sent (inflight) or expired before being sent: a retriable error
// within the delivery timeout queues it for a retry, anything else finishes it. Finished batches run
// their promises in sequence order.
//
// With idempotence: a batch that fails for good after it was numbered (anything but success or a retry)
// dooms the partition's later batches of its identity, which then fail with its error wrapped, and
// resets the producer identity so that new batches start a new sequence. OUT_OF_ORDER_SEQUENCE_NUMBER
// is retried while an earlier batch of the partition is unresolved (in flight or waiting to be
// retried): the leader refused the batch only because that one is missing so far.
func (p *Producer) batchResult(pp *ppart, b *pbatch, wasInflight bool, base, appendTime int64, err error) {
	now := time.Now()
	if err != nil && b.ident != nil && errors.Is(err, rerr.ErrDuplicateSequence) {
		// The leader has the batch already (Kafka counts this as written), without saying where.
		err, base, appendTime = nil, -1, -1
	}
	closing := p.ctx.Err() != nil
	pp.finishMu.Lock()
	pp.mu.Lock()
	limited := pp.limitedLocked()
	if wasInflight {
		pp.inflight--
	}
	retry, reset := false, false
	if err != nil {
		if b.doomed {
			// err says so already (collect)
		} else if br := pp.breakOfLocked(b); br != nil {
			err = pp.doomedErr(br)
		} else {
			retry = wasInflight && !closing && now.Before(b.deadline) &&
				(retriable(err) || (b.ident != nil && pp.nextDone < b.seq && errors.Is(err, rerr.ErrOutOfOrderSequence)))
			if !retry {
				switch {
				case closing:
					err = fmt.Errorf("%w (%v)", ErrClosed, err)
				case retriable(err):
					err = fmt.Errorf("delivery timeout (%v) expired after %d attempts: %w", p.cfg.deliveryTimeout, b.attempts+1, err)
				}
				if b.ident != nil && !closing {
					pp.breaks = append(pp.breaks, seqBreak{ident: b.ident, after: b.seq, err: err})
					reset = p.resetIdent(b.ident, pp, err) // under pp.mu: the partition builds nothing more under b.ident
				}
			}
		}
	}
	if retry {
		b.attempts++
		b.lastErr = err
		pp.failed = append(pp.failed, b)
	} else {
		b.base, b.appendTime, b.err = base, appendTime, err
		i, _ := slices.BinarySearchFunc(pp.held, b.seq, func(h *pbatch, seq uint64) int { return cmpU64(h.seq, seq) })
		pp.held = slices.Insert(pp.held, i, b)
	}
	var wake *sink
	if pp.inflight == 0 && len(pp.failed) > 0 {
		// Every batch that was in flight is answered: re-send the failed ones first, in order.
		slices.SortFunc(pp.failed, func(x, y *pbatch) int { return cmpU64(x.seq, y.seq) })
		attempts := 0
		for _, f := range pp.failed {
			attempts = max(attempts, f.attempts)
		}
		pp.queue = append(pp.failed, pp.queue...)
		pp.failed = nil
		pp.retryAt = now.Add(p.cl.backoff(attempts - 1))
		wake = pp.sink
	}
	if s := pp.moveLocked(p); s != nil {
		wake = s
	}
	if len(pp.breaks) > 0 {
		pp.pruneBreaksLocked()
		wake = pp.sink // doomed batches at the head of the queue are failed by the sink
	}
	ready := pp.ready[:0]
	for len(pp.held) > 0 && pp.held[0].seq == pp.nextDone {
		if pp.held[0].opened {
			pp.open--
		}
		ready = append(ready, pp.held[0])
		pp.held[0] = nil
		pp.held = pp.held[1:]
		pp.nextDone++
	}
	if wake == nil && limited && !pp.limitedLocked() {
		// The sink may have looked at the partition between the answer's wake and this result.
		wake = pp.sink
	}
	pp.mu.Unlock()
	for i, rb := range ready {
		p.finish(rb)
		ready[i] = nil
	}
	pp.ready = ready[:0]
	pp.finishMu.Unlock()
	if retry {
		p.requestMetadata()
	}
	if reset {
		p.wakeAll() // a sink with batches waiting starts InitProducerId
	} else if wake != nil {
		wake.wake()
	}
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// finish runs a finished batch's promises in record order and recycles the batch.
func (p *Producer) finish(b *pbatch) {
	p.buf.release(b.bytes) // first, so Produce calls waiting for space go on while promises run
	err := b.err
	if err != nil && p.txn != nil {
		p.txn.recordFailed(err) // the transaction can no longer commit
		if isFenced(err) && !errors.Is(err, ErrProducerFenced) {
			err = fmt.Errorf("%w: %w", ErrProducerFenced, err)
		}
	}
	b.send.End(b.base, len(b.recs), err)
	for i := range b.recs {
		pr := &b.recs[i]
		if err == nil {
			pr.r.Offset = -1
			if b.base >= 0 {
				pr.r.Offset = b.base + int64(i)
			}
			if b.appendTime >= 0 {
				pr.r.Timestamp = time.UnixMilli(b.appendTime)
			}
		}
		if pr.fn != nil {
			pr.fn(pr.r, err)
		}
	}
	n := len(b.recs)
	p.putBatch(b)
	p.recordsDone(n)
}

// bufLimiter caps the bytes of buffered records. Acquiring is a CAS on the fast path; waiters sleep on
// a channel that the next release closes.
type bufLimiter struct {
	max     int64
	used    atomic.Int64
	waiters atomic.Int32
	mu      sync.Mutex
	freed   chan struct{}
}

func (l *bufLimiter) tryAcquire(n int64) bool {
	for {
		cur := l.used.Load()
		if cur+n > l.max {
			return false
		}
		if l.used.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// acquire takes n bytes, waiting for releases while the cap would be exceeded; onWait is called once
// before waiting (the producer then sends open batches at once, as Kafka does when its buffer is
// exhausted).
func (l *bufLimiter) acquire(ctx context.Context, n int64, onWait func()) error {
	if l.tryAcquire(n) {
		return nil
	}
	l.waiters.Add(1)
	defer l.waiters.Add(-1)
	onWait()
	for {
		l.mu.Lock()
		if l.freed == nil {
			l.freed = make(chan struct{})
		}
		ch := l.freed
		l.mu.Unlock()
		if l.tryAcquire(n) { // after taking the channel, so a release in between is not missed
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// force takes n bytes even beyond the cap, for what must be accounted but cannot wait (a record's
// trace context headers, known only under its partition's lock).
func (l *bufLimiter) force(n int64) { l.used.Add(n) }

func (l *bufLimiter) release(n int64) {
	l.used.Add(-n)
	if l.waiters.Load() > 0 {
		l.mu.Lock()
		if l.freed != nil {
			close(l.freed)
			l.freed = nil
		}
		l.mu.Unlock()
	}
}

var errNoResult = errors.New("answer without this partition's result")
