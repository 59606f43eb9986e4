package broker

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/client/batch"
	"google.golang.org/grpc"
)

// maxStreamInflight is how many requests one ProduceStream may have unanswered before the broker stops
// reading from it (back-pressure through gRPC flow control).
const maxStreamInflight = 256

// produceCall collects the per-partition outcomes of one produce request. Appends finish on the
// store's goroutines in any order; the last one to finish (or the timeout) completes the call once.
type produceCall struct {
	resp      *runnelv1.ProduceResponse
	remaining atomic.Int32
	once      sync.Once
	mu        sync.Mutex // guards resp's results against the timeout reading them, and timer
	done      chan struct{}
	timer     *time.Timer
	onDone    func(*runnelv1.ProduceResponse) // may be nil
	// buf is the recordBufs buffer the request's records alias (produce_codec.go), nil when none. It
	// goes back when remaining reaches 0 (settled), not at finish: after a timeout, appends may still
	// be queued or waiting to be enqueued, and they read the records.
	buf *[]byte
}

// settled runs once every append's callback has run and every partition has been enqueued (remaining
// reached 0): nothing reads the request's records any more.
func (c *produceCall) settled() {
	c.finish()
	releaseProduceBuf(c.buf)
}

func (c *produceCall) finish() {
	c.once.Do(func() {
		c.mu.Lock()
		t := c.timer
		c.mu.Unlock()
		if t != nil {
			t.Stop()
		}
		close(c.done)
		if c.onDone != nil {
			c.mu.Lock()
			resp := c.resp
			c.mu.Unlock()
			c.onDone(resp)
		}
	})
}

// timeout fails every partition still waiting with REQUEST_TIMED_OUT. Their appends may still land, as
// with Kafka's request.timeout.ms, so a client that retries may write twice until idempotence exists.
func (c *produceCall) timeout() {
	c.mu.Lock()
	for _, r := range c.resp.Partitions {
		if r.Error == nil && r.BaseOffset < 0 {
			r.Error = rerr.ToInfo(rerr.New(runnelv1.ErrorCode_REQUEST_TIMED_OUT, "%s-%d: no acknowledgement within the request timeout", r.Topic, r.Partition))
		}
	}
	c.mu.Unlock()
	c.finish()
}

// startProduce validates and enqueues every partition's batches of req in request order, and returns
// the call that completes when all of them are acknowledged per req.Acks. Enqueueing happens before
// startProduce returns, so requests started one after another are appended in that order. ctx is the
// trace the request continues (unary calls); a stream's requests pass none, since the stream's span
// would otherwise parent every request for the stream's lifetime. It also bounds, with the request's
// timeout, the transaction coordinator's verification of transactional batches (appendPartition).
// buf is the buffer req's records alias (takeProduceBuf), nil when none; startProduce owns it and
// returns it to recordBufs once every append's callback has run, or at once when it refuses req.
func (b *Broker) startProduce(ctx context.Context, req *runnelv1.ProduceRequest, buf *[]byte, onDone func(*runnelv1.ProduceResponse)) (*produceCall, error) {
	switch req.Acks {
	case runnelv1.Acks_ACKS_ALL, runnelv1.Acks_ACKS_LEADER, runnelv1.Acks_ACKS_NONE:
	default:
		releaseProduceBuf(buf) // nothing was enqueued
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUIRED_ACKS, "acks %d is not one of ACKS_ALL, ACKS_LEADER, ACKS_NONE", req.Acks)
	}
	if req.TimeoutMs < 0 {
		releaseProduceBuf(buf)
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "negative timeout_ms %d", req.TimeoutMs)
	}
	c := &produceCall{
		resp:   &runnelv1.ProduceResponse{CorrelationId: req.CorrelationId, Partitions: make([]*runnelv1.ProducePartitionResult, len(req.Partitions))},
		done:   make(chan struct{}),
		onDone: onDone,
		buf:    buf,
	}
	c.remaining.Store(int32(len(req.Partitions)) + 1) // +1 held until every append is enqueued
	timeout := DefaultProduceTimeout
	if req.TimeoutMs > 0 {
		timeout = time.Duration(req.TimeoutMs) * time.Millisecond
	}
	// Every result exists before the timer starts: the timeout may come while partitions are still
	// being enqueued (a verification or a full write queue waits here), and answers for all of them.
	for i, pp := range req.Partitions {
		c.resp.Partitions[i] = &runnelv1.ProducePartitionResult{Topic: pp.Topic, Partition: pp.Partition, BaseOffset: -1, LogAppendTimeMs: -1, LogStartOffset: -1}
	}
	// Set under mu: a short timeout, or a process paused right here (SIGSTOP), runs the timer's
	// finish before this goroutine goes on, and finish reads timer (a data race the e2e tests caught).
	c.mu.Lock()
	c.timer = time.AfterFunc(timeout, c.timeout)
	c.mu.Unlock()
	now := time.Now().UnixMilli()
	for i, pp := range req.Partitions {
		r := c.resp.Partitions[i]
		if testHookBeforeAppend != nil {
			testHookBeforeAppend(pp)
		}
		obs := b.tel.StartAppend(ctx, pp)
		b.appendPartition(ctx, pp, req.TransactionalId, req.Acks, now, time.Now().Add(timeout), func(res plog.AppendResult, appendTime int64, err error) {
			obs.Done(res.BaseOffset, err)
			c.mu.Lock()
			if r.Error == nil { // not timed out already
				if err != nil {
					r.Error = rerr.ToInfo(storeErr(pp.Topic, pp.Partition, err))
				} else {
					r.BaseOffset, r.LogStartOffset, r.LogAppendTimeMs = res.BaseOffset, res.LogStartOffset, appendTime
				}
			}
			c.mu.Unlock()
			if c.remaining.Add(-1) == 0 {
				c.settled()
			}
		})
	}
	if c.remaining.Add(-1) == 0 {
		c.settled()
	}
	return c, nil
}

// testHookBeforeAppend, when set by a test, runs in startProduce before each partition is validated
// and enqueued: it stands for the waits there may be (the transaction coordinator's verification, a
// full write queue).
var testHookBeforeAppend func(*runnelv1.ProducePartition)

// appendPartition validates one partition's batches and enqueues them; done is called exactly once:
// once they are written (acks=1) or, with acks=all, written and fsynced here and, for a replicated
// partition, in every ISR member's log (the high watermark passed them), or with the error.
//
// Transactional batches (KIP-98) need txnID (the request's transactional_id) and an idempotent
// producer. Before the first one of a producer epoch's transaction on the partition, the leader asks
// the transaction coordinator whether the partition is in that transaction (TxnVerifier, KIP-890), so
// a produce that arrives after its transaction ended cannot open a transaction nobody will end; it
// waits for the answer (until ctx or deadline) before enqueueing. Refusals: INVALID_REQUEST (control
// batches from a producer, a transactional batch without txnID, transactions not enabled), the
// verifier's INVALID_TXN_STATE and PRODUCER_FENCED, and the idempotence errors.
func (b *Broker) appendPartition(ctx context.Context, pp *runnelv1.ProducePartition, txnID string, acks runnelv1.Acks, now int64, deadline time.Time, done func(plog.AppendResult, int64, error)) {
	acksAll := acks == runnelv1.Acks_ACKS_ALL
	t, p, err := b.partition(pp.Topic, pp.Partition)
	if err == nil {
		err = checkEpoch(pp.Topic, pp.Partition, t, pp.CurrentLeaderEpoch)
	}
	if err == nil {
		err = checkWritable(t)
	}
	if err == nil {
		_, err = b.replicaOf(t, pp.Partition, acksAll)
	}
	if err != nil {
		done(plog.AppendResult{}, -1, err)
		return
	}
	if len(pp.Records) == 0 {
		done(plog.AppendResult{}, -1, rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "%s-%d: produce without record batches", pp.Topic, pp.Partition))
		return
	}
	maxBytes := int(t.Config.MaxMessageBytes)
	compacted := t.Config.Compact()
	var first batch.Header
	n := 0
	err = batch.Split(pp.Records, func(bt []byte, h batch.Header) error {
		if n == 0 {
			first = h
		}
		n++
		if len(bt) > maxBytes {
			return rerr.New(runnelv1.ErrorCode_MESSAGE_TOO_LARGE, "%s-%d: batch of %d bytes is larger than max.message.bytes=%d", pp.Topic, pp.Partition, len(bt), maxBytes)
		}
		if h.IsControl() {
			return rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s-%d: producers may not write control batches: only the partition leader writes transaction markers", pp.Topic, pp.Partition)
		}
		if h.IsTransactional() != first.IsTransactional() {
			return rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s-%d: transactional and non-transactional batches mixed in one request", pp.Topic, pp.Partition)
		}
		if h.IsTransactional() && txnID == "" {
			return rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s-%d: a transactional batch needs the request's transactional_id", pp.Topic, pp.Partition)
		}
		if h.IsTransactional() && h.ProducerID < 0 {
			return rerr.New(runnelv1.ErrorCode_INVALID_RECORD, "%s-%d: a transactional batch needs a producer id", pp.Topic, pp.Partition)
		}
		if (h.ProducerID >= 0) != (first.ProducerID >= 0) || (n > 1 && h.ProducerID >= 0) {
			return rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s-%d: an idempotent producer sends exactly one batch per partition in a request", pp.Topic, pp.Partition)
		}
		if h.ProducerID >= 0 && (h.ProducerEpoch < 0 || h.BaseSequence < 0) {
			return rerr.New(runnelv1.ErrorCode_INVALID_RECORD, "%s-%d: batch of producer %d has epoch %d and base sequence %d; both must be >= 0", pp.Topic, pp.Partition, h.ProducerID, h.ProducerEpoch, h.BaseSequence)
		}
		if compacted {
			return requireKeys(pp, t.Config.CleanupPolicy, bt, h.BaseOffset)
		}
		return nil
	})
	if err != nil {
		var e *rerr.Error
		if errors.As(err, &e) && e.Code == runnelv1.ErrorCode_CORRUPT_MESSAGE {
			err = rerr.New(e.Code, "%s-%d: %s", pp.Topic, pp.Partition, e.Message)
		}
		done(plog.AppendResult{}, -1, err)
		return
	}
	st, _ := t.Partition(pp.Partition)
	opts := plog.AppendOptions{Sync: acksAll, LogAppendTime: -1, LeaderEpoch: st.LeaderEpoch,
		SegmentBytes: t.Config.SegmentBytes, SegmentMs: t.Config.RollMs()}
	if t.Config.LogAppendTime {
		opts.LogAppendTime = now
	}
	finish := func(res plog.AppendResult, err error) {
		if err != nil {
			done(res, opts.LogAppendTime, err)
			return
		}
		b.afterAppend(t, pp.Partition, acksAll, res, deadline, func(err error) { done(res, opts.LogAppendTime, err) })
	}
	if first.ProducerID < 0 {
		p.AppendAsync(pp.Records, opts, finish)
		return
	}
	txnal := first.IsTransactional()
	var verifier TxnVerifier
	if txnal {
		if verifier = b.verifier(); verifier == nil {
			done(plog.AppendResult{}, -1, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s-%d: transactions are not enabled on broker %d", pp.Topic, pp.Partition, b.cfg.NodeID))
			return
		}
	}
	// Idempotent: check the sequence and enqueue under the partition's producer state lock, so batches
	// are admitted in the order they are written.
	ps, err := b.producerStateOf(t, pp.Partition, p, st.LeaderEpoch)
	if err != nil {
		done(plog.AppendResult{}, -1, storeErr(pp.Topic, pp.Partition, err))
		return
	}
	ps.mu.Lock()
	if txnal {
		// Unlocks ps.mu while it asks the coordinator, and holds it again when it returns nil.
		if err := ps.verifyLocked(ctx, verifier, txnID, pp.Topic, pp.Partition, first, deadline); err != nil {
			done(plog.AppendResult{}, -1, err)
			return
		}
	}
	dup, added, err := ps.admit(pp.Topic, pp.Partition, first)
	if err != nil || dup != nil {
		ps.mu.Unlock()
		if err != nil {
			done(plog.AppendResult{}, -1, err)
		} else {
			b.answerDuplicate(t, pp.Partition, acksAll, dup, deadline, done)
		}
		return
	}
	var txn *ongoingTxn
	if txnal {
		txn = ps.beginTxnLocked(first.ProducerID, added, p.LogEndOffset())
	}
	p.AppendAsync(pp.Records, opts, func(res plog.AppendResult, err error) {
		added.base, added.last, added.err = res.BaseOffset, res.LastOffset, err
		if txn != nil {
			ps.txnBatchDone(first.ProducerID, txn, added) // before done: a marker waits on it
		}
		close(added.done)
		if err != nil {
			ps.forget(first.ProducerID, added)
		}
		finish(res, err)
	})
	ps.mu.Unlock()
}

// maxVerifyRounds bounds how often a transactional batch is verified again because a marker for its
// producer was written while the coordinator answered.
const maxVerifyRounds = 3

// verifyLocked makes sure the producer of the transactional batch h has its ongoing transaction
// verified on this partition (KIP-890) before the batch is admitted. ps.mu is held on entry and, when
// it returns nil, on return; on an error it is released. A producer verified at h's epoch (since its
// last marker here), a retry of a batch already admitted, and a batch of an epoch older than the
// partition knows (admit refuses it) need no call. Otherwise the coordinator is asked with ps.mu
// released (a network call when another node coordinates the transactional id), bounded by ctx and
// deadline; if a marker of the producer was written meanwhile, or the state rebuilt, the answer may
// concern the transaction that just ended, so it asks again (CONCURRENT_TRANSACTIONS, retriable, after
// maxVerifyRounds). Errors: the verifier's (INVALID_TXN_STATE, PRODUCER_FENCED, coordinator errors).
func (ps *producerState) verifyLocked(ctx context.Context, v TxnVerifier, txnID, topic string, partition int32, h batch.Header, deadline time.Time) error {
	for round := 0; ; round++ {
		e := ps.producers[h.ProducerID]
		if e != nil && (e.verified == h.ProducerEpoch || h.ProducerEpoch < e.epoch) || ps.duplicateLocked(h) != nil {
			return nil
		}
		if round == maxVerifyRounds {
			ps.mu.Unlock()
			return rerr.New(runnelv1.ErrorCode_CONCURRENT_TRANSACTIONS, "%s-%d: transactions of producer %d kept ending while its partition was verified", topic, partition, h.ProducerID)
		}
		var markers uint64
		if e != nil {
			markers = e.markers
		}
		builds := ps.builds
		ps.mu.Unlock()
		vctx, cancel := context.WithDeadline(ctx, deadline)
		err := v.Verify(vctx, &runnelv1.TxnProducer{TransactionalId: txnID, ProducerId: h.ProducerID, ProducerEpoch: int32(h.ProducerEpoch)}, topic, partition)
		cancel()
		if err != nil {
			return verifyErr(topic, partition, err)
		}
		ps.mu.Lock()
		e = ps.producers[h.ProducerID]
		var now uint64
		if e != nil {
			now = e.markers
		}
		if ps.builds != builds || now != markers {
			continue // a marker overtook the answer: ask again
		}
		if e == nil {
			e = newProducerEntry(h.ProducerEpoch)
			ps.producers[h.ProducerID] = e
		}
		if h.ProducerEpoch >= e.epoch {
			e.verified = h.ProducerEpoch
		}
		return nil
	}
}

// requireKeys refuses a batch with a keyless record for a compacted topic, as Kafka does (INVALID_RECORD):
// the cleaner keeps the latest record per key, so a record without one could never be kept. Only
// compacted topics pay for decoding (and decompressing) the records on produce.
func requireKeys(pp *runnelv1.ProducePartition, policy string, b []byte, base int64) error {
	_, err := batch.DecodeBatch(b, func(r batch.Record) error {
		if r.Key == nil {
			return rerr.New(runnelv1.ErrorCode_INVALID_RECORD, "%s-%d: record at offset delta %d has no key; topics with cleanup.policy=%s need a key on every record",
				pp.Topic, pp.Partition, r.Offset-base, policy)
		}
		return nil
	})
	return err
}

// Produce implements runnelv1.RecordsServer: append and wait for the acknowledgement per acks.
func (b *Broker) Produce(ctx context.Context, req *runnelv1.ProduceRequest) (*runnelv1.ProduceResponse, error) {
	start := time.Now()
	c, err := b.startProduce(ctx, req, takeProduceBuf(req), nil)
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	if req.Acks == runnelv1.Acks_ACKS_NONE {
		b.tel.ProduceDone(start, req.Acks, nil)
		return &runnelv1.ProduceResponse{CorrelationId: req.CorrelationId}, nil
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return nil, rerr.ToStatus(ctx.Err())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	b.tel.ProduceDone(start, req.Acks, c.resp)
	return c.resp, nil
}

// streamAnswer is a ProduceStream answer on its way to the sender goroutine, which records its latency
// there rather than on the store's callback workers that complete appends (plog/callbacks.go): one
// sender per stream keeps the metric SDK's call off the workers' stacks and their turnaround.
type streamAnswer struct {
	resp  *runnelv1.ProduceResponse
	start time.Time
	acks  runnelv1.Acks
}

// ProduceStream implements runnelv1.RecordsServer: requests are enqueued in the order received, and
// answers are sent as their appends complete.
func (b *Broker) ProduceStream(stream grpc.BidiStreamingServer[runnelv1.ProduceRequest, runnelv1.ProduceResponse]) error {
	// inflight bounds the requests a stream may have unanswered, and out can hold all of their answers,
	// so the store's goroutines that complete appends never block on a slow reader.
	inflight := make(chan struct{}, maxStreamInflight)
	out := make(chan streamAnswer, maxStreamInflight)
	var pending sync.WaitGroup
	sendErr := make(chan error, 1)
	senderDone := make(chan struct{})
	go func() { // the one goroutine allowed to Send; owned by this handler, ends when out closes
		defer close(senderDone)
		failed := false
		for a := range out {
			b.tel.ProduceDone(a.start, a.acks, a.resp)
			if !failed {
				if err := stream.Send(a.resp); err != nil {
					failed = true
					sendErr <- err
				}
			}
			<-inflight
		}
	}()
	// Recv runs on its own goroutine, which also starts each request it receives, so that this one can
	// stop the stream for a draining broker (Drain): a producer's stream stays open while idle, and
	// would hold a graceful stop until its timeout. Starting the request on the receiving goroutine
	// spares a handoff between goroutines per request, which at moderate rates (many small requests)
	// cost the node more CPU than the request itself. stopped, under mu, tells it to start nothing
	// more once this goroutine has decided to return; a request received after that gives its records
	// buffer back, since nothing was enqueued. The goroutine ends when Recv fails, which it does once
	// this handler has returned.
	var (
		mu      sync.Mutex
		stopped bool
	)
	recvDone := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				recvDone <- err
				return
			}
			buf := takeProduceBuf(req)
			acks := req.Acks
			select {
			case inflight <- struct{}{}:
			case <-stream.Context().Done():
				releaseProduceBuf(buf)
				recvDone <- stream.Context().Err()
				return
			}
			mu.Lock()
			if stopped {
				mu.Unlock()
				<-inflight
				releaseProduceBuf(buf)
				recvDone <- nil
				return
			}
			pending.Add(1)
			start := time.Now()
			_, err = b.startProduce(context.Background(), req, buf, func(resp *runnelv1.ProduceResponse) {
				if acks != runnelv1.Acks_ACKS_NONE {
					out <- streamAnswer{resp, start, acks}
				} else {
					<-inflight
				}
				pending.Done()
			})
			mu.Unlock()
			if err != nil {
				<-inflight
				pending.Done()
				// A request the broker cannot take at all ends the stream with its status.
				recvDone <- rerr.ToStatus(err)
				return
			}
			if acks == runnelv1.Acks_ACKS_NONE {
				b.tel.ProduceDone(start, acks, nil) // answered by not answering, once enqueued
			}
		}
	}()
	var recvErr error
	select {
	case recvErr = <-recvDone:
	case <-b.draining:
		recvErr = rerr.ToStatus(rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "broker %d is shutting down", b.cfg.NodeID))
	}
	// From here on the receiving goroutine starts nothing: every request it started is in pending.
	mu.Lock()
	stopped = true
	mu.Unlock()
	pending.Wait()
	close(out)
	<-senderDone
	select {
	case err := <-sendErr:
		return err
	default:
	}
	return recvErr
}

// verifyErr makes a verification failure a catalogue error for the producer: the coordinator's own
// (INVALID_TXN_STATE, PRODUCER_FENCED, NOT_COORDINATOR, ...) as they are, a deadline REQUEST_TIMED_OUT,
// anything else COORDINATOR_NOT_AVAILABLE (retriable: the coordinator could not be asked).
func verifyErr(topic string, partition int32, err error) error {
	var e *rerr.Error
	switch {
	case errors.As(err, &e):
		return err
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return rerr.New(runnelv1.ErrorCode_REQUEST_TIMED_OUT, "%s-%d: the transaction coordinator did not verify the partition in time: %v", topic, partition, err)
	default:
		return rerr.New(runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE, "%s-%d: verifying the partition with the transaction coordinator: %v", topic, partition, err)
	}
}
