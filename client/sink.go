package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"google.golang.org/grpc"
)

// responseGrace returns what is added to the request timeout before the producer gives up on an answer
// itself: the broker gets the request timeout as timeout_ms and answers REQUEST_TIMED_OUT when it
// passes, which is the better outcome (the stream survives). Half the timeout, at most 5s.
func responseGrace(requestTimeout time.Duration) time.Duration {
	return min(requestTimeout/2, 5*time.Second)
}

// sink sends the batches of the partitions a broker leads, over one ProduceStream.
//
// Its run goroutine is the only one that collects batches and sends; a receive goroutine per stream
// reads answers and settles their batches. A stream that breaks (transport error, a request unanswered
// past its timeout, the broker ending it) fails every request in flight on it with a retriable error
// unless the broker said otherwise, and the next send opens a new one.
type sink struct {
	p      *Producer
	node   int32 // -1: the broker is unknown, use any
	wakeCh chan struct{}
	rr     int // where the next collect starts, so partitions take turns filling requests

	mu       sync.Mutex
	stream   grpc.BidiStreamingClient[runnelv1.ProduceRequest, runnelv1.ProduceResponse]
	cancel   context.CancelFunc
	recvDone chan struct{} // closed when the current stream's receiver has returned
	gen      int           // stream generation: answers and failures of an old stream are told apart
	inflight map[int64]*request
	breakErr error // why the sink itself broke the current stream
}

// request is one ProduceRequest in flight: one batch for each of its partitions.
type request struct {
	id      int64
	gen     int
	sent    time.Time
	parts   []*ppart
	batches []*pbatch
}

func (s *sink) wake() {
	select {
	case s.wakeCh <- struct{}{}:
	default:
	}
}

func (s *sink) run() {
	defer s.p.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := s.pump(time.Now())
		var tc <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			tc = timer.C
		}
		select {
		case <-s.wakeCh:
		case <-tc:
		case <-s.p.ctx.Done():
			s.shutdown()
			return
		}
	}
}

// shutdown ends the stream gracefully: CloseSend, then wait (at most the request timeout) for the
// broker to finish the requests it has read and end the stream. Cancelling at once would make the
// broker drop requests still in its receive buffer, which loses acks=0 records that were already
// reported sent.
func (s *sink) shutdown() {
	s.mu.Lock()
	st, cancel, done := s.stream, s.cancel, s.recvDone
	s.mu.Unlock()
	if st == nil {
		return
	}
	if st.CloseSend() == nil {
		t := time.NewTimer(s.p.cfg.common.requestTimeout)
		select {
		case <-done:
		case <-t.C:
		}
		t.Stop()
	}
	cancel()
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// pump sends what is ready while request slots are free, and returns when it wants to run again
// (linger ends, backoffs, timeouts; zero: only when woken).
func (s *sink) pump(now time.Time) time.Time {
	var next time.Time
	s.mu.Lock()
	for _, req := range s.inflight {
		deadline := req.sent.Add(s.p.cfg.common.requestTimeout + responseGrace(s.p.cfg.common.requestTimeout))
		if now.After(deadline) && req.gen == s.gen && s.cancel != nil {
			s.breakErr = rerr.New(runnelv1.ErrorCode_REQUEST_TIMED_OUT, "no answer from broker %d within the request timeout (%v)", s.node, s.p.cfg.common.requestTimeout)
			s.cancel() // the receiver fails every request in flight
			break
		}
		next = earliest(next, deadline)
	}
	s.mu.Unlock()
	openDue := false
	for {
		s.mu.Lock()
		inflight := len(s.inflight)
		s.mu.Unlock()
		req, nx, crowded := s.collect(now, inflight, openDue)
		next = earliest(next, nx)
		if req == nil {
			return next
		}
		s.send(req)
		openDue = crowded // open batches a full request left out go in the next, if a slot is free
		now = time.Now()
	}
}

type failingBatch struct {
	pp  *ppart
	b   *pbatch
	err error // nil: expired
}

// collect expires batches past their delivery timeout, fails those doomed by an earlier batch's
// sequence failure and, while fewer than the max in flight are unanswered (inflight is how many are),
// takes one ready batch from each partition of this sink into a request (nil when none is ready). It
// also returns the earliest time something will need it: a linger ending, a backoff ending, a deadline.
// While the producer identity is pending (idempotence) nothing is sealed on linger, built or sent, and
// InitProducerId is started if batches wait.
//
// A batch that is still open (not full) is ready once its linger has passed; with linger 0 (natural
// batching) only while no request is in flight, or when a request goes anyway with a full batch
// (the open batches of the other partitions ride along as far as the request has room), or when
// Flush or a wait for buffer space wants everything out, or once it has waited defaultOpenHold (5
// ms) for the answers. So a producer below the broker's speed keeps about one request in flight,
// carrying what arrived during the last one's round trip, as Nagle's algorithm holds small segments
// while data is unacknowledged (RFC 896), instead of a stream of small requests that fill every
// slot: at half its maximum, sending whenever a slot was free made about 3 times the requests and
// cost the node 1.8 times the CPU per record it spends at full speed (docs/performance.md, "One
// request in flight below full speed"). Full batches use every slot, so the maximum is as before.
// With acks=0 nothing is ever in flight, so every batch goes at once, as before.
//
// crowded reports that an open batch that was to go did not fit in req (WithMaxRequestBytes): the
// caller collects again at once with openDue, which lets open batches go whatever is in flight, so
// partitions that fill batches never keep a slow one out of every request.
func (s *sink) collect(now time.Time, inflight int, openDue bool) (req *request, next time.Time, crowded bool) {
	var (
		size    int
		failing []failingBatch
		sealed  []*ppart
		held    []*ppart // an open batch that waited only for the requests in flight
		waiting bool     // a partition has records but no producer identity to send them with
	)
	p := s.p
	canSend := inflight < p.cfg.maxInFlight
	urgent := p.flushing.Load() > 0 || p.buf.waiters.Load() > 0
	ident := p.ident.Load()
	curIdent := ident // the identity a batch sealed now is numbered under (nil: none)
	if ident == noIdentity {
		curIdent = nil
	}
	// visit looks at one partition: it fails what expired and adds the partition's next batch to req
	// when it may go. An open batch goes only when openOK (or when its linger, not 0, has passed).
	visit := func(pp *ppart, openOK bool) {
		pp.mu.Lock()
		defer pp.mu.Unlock()
		if pp.sink != s {
			return
		}
		gap := false // a numbered batch expires: its partition's later batches are doomed
		for len(pp.queue) > 0 {
			b := pp.queue[0]
			var err error
			if !now.Before(b.deadline) {
				gap = gap || (b.ident != nil && !b.doomed)
			} else {
				br := pp.breakOfLocked(b)
				if br == nil {
					break
				}
				b.doomed = true
				err = pp.doomedErr(br)
			}
			failing = append(failing, failingBatch{pp, b, err})
			pp.queue[0] = nil
			pp.queue = pp.queue[1:]
		}
		if c := pp.cur; c != nil && !now.Before(c.deadline) {
			// Expired unsealed: never numbered, so its failure leaves no gap in the sequence.
			pp.cur = nil
			failing = append(failing, failingBatch{pp, c, nil})
		}
		if ident == nil && (pp.cur != nil || len(pp.queue) > 0) {
			waiting = true
		}
		if len(pp.queue) > 0 {
			next = earliest(next, pp.queue[0].deadline)
		} else if pp.cur != nil {
			next = earliest(next, pp.cur.deadline)
		}
		if len(pp.failed) > 0 || gap { // waiting for its in-flight batches before re-sending, or to fail the doomed
			return
		}
		if now.Before(pp.retryAt) {
			next = earliest(next, pp.retryAt)
			return
		}
		if ident == nil { // nothing is built or sent before InitProducerId answers
			return
		}
		pp.buildLocked(p) // batches sealed while the identity was pending
		if tx := p.txn; tx != nil && (pp.cur != nil || len(pp.queue) > 0) {
			// A partition joins the transaction (AddPartitionsToTxn) before its first batch is sent.
			if gen := tx.gen.Load(); pp.addedGen.Load() != gen {
				tx.requestAdd(pp, gen)
				return
			}
		}
		if len(pp.queue) == 0 && pp.cur != nil {
			lingerEnd := pp.cur.firstAt.Add(p.cfg.linger)
			switch {
			case !urgent && now.Before(lingerEnd):
				next = earliest(next, lingerEnd)
			case !urgent && !openOK && p.cfg.linger == 0 && now.Before(pp.cur.firstAt.Add(p.cfg.openHold)):
				// An answer wakes us, or a full batch takes it along; at the latest it takes a slot of
				// its own once it has waited openHold.
				held = append(held, pp)
				next = earliest(next, pp.cur.firstAt.Add(p.cfg.openHold))
			case !canSend || !pp.mayStartLocked(curIdent, false):
				// the batch keeps growing until a request slot frees (an answer wakes us)
			case req != nil && size+pp.cur.bld.Size() > p.cfg.maxRequestBytes:
				crowded = true // req is full: the next request takes it
			default:
				pp.sealLocked(p)
				sealed = append(sealed, pp)
			}
		}
		if canSend && len(pp.queue) > 0 {
			b := pp.queue[0]
			if b.wire != nil && pp.mayStartLocked(b.ident, b.opened) && (req == nil || size+len(b.wire) <= p.cfg.maxRequestBytes) {
				pp.queue[0] = nil
				pp.queue = pp.queue[1:]
				pp.inflight++
				if !b.opened {
					b.opened = true
					pp.open++
				}
				if b.ident != nil {
					pp.sentIdent = b.ident
				}
				if req == nil {
					req = &request{}
				}
				req.parts = append(req.parts, pp)
				req.batches = append(req.batches, b)
				size += len(b.wire)
			}
		}
	}
	parts := *p.allParts.Load()
	n := len(parts)
	s.rr++
	for i := 0; i < n; i++ {
		visit(parts[(s.rr+i)%n], inflight == 0 || openDue)
	}
	if req != nil && len(held) > 0 {
		// A request goes anyway: the open batches that waited for the requests in flight ride along
		// (those it has no room for make it crowded), so a partition that fills slowly is not held
		// back by others that fill batches.
		for _, pp := range held {
			visit(pp, true)
		}
	}
	if p.sticky != nil {
		for _, pp := range sealed {
			p.sticky.OnBatchSealed(pp.topic, pp.id, int32(len(*(*p.topics.Load())[pp.topic].parts.Load())))
		}
	}
	for _, f := range failing {
		err := f.err
		if err == nil {
			err = f.b.lastErr
		}
		if err == nil && f.b.wire == nil && ident == nil {
			if ie := p.identError(); ie != nil {
				err = fmt.Errorf("%s-%d: no producer id to send with: %w", f.pp.topic, f.pp.id, ie)
			}
		}
		if err == nil {
			err = rerr.New(runnelv1.ErrorCode_REQUEST_TIMED_OUT, "%s-%d: batch not sent within the delivery timeout", f.pp.topic, f.pp.id)
		}
		p.batchResult(f.pp, f.b, false, -1, -1, err)
	}
	if waiting {
		next = earliest(next, p.ensureIdent(now))
	}
	return req, next, crowded
}

// send opens the stream if needed and sends req. Failures settle req's batches (retriably when the
// transport failed).
func (s *sink) send(req *request) {
	p := s.p
	req.id = p.corr.Add(1)
	st, gen, err := s.ensureStream()
	if err != nil {
		s.failRequest(req, err)
		return
	}
	pr := &runnelv1.ProduceRequest{
		CorrelationId: req.id,
		Acks:          p.acks,
		TimeoutMs:     int32(min(p.cfg.common.requestTimeout/time.Millisecond, 1<<31-1)),
		Partitions:    make([]*runnelv1.ProducePartition, len(req.batches)),
		// The leader verifies with the coordinator that each partition is in the producer's
		// transaction before it accepts the first transactional batch (KIP-890).
		TransactionalId: p.cfg.transactionalID,
	}
	for i, b := range req.batches {
		// A stream has one context for its lifetime, so each partition carries its batch's trace
		// context itself (nil when the batch is not traced).
		pr.Partitions[i] = &runnelv1.ProducePartition{Topic: req.parts[i].topic, Partition: req.parts[i].id, Records: b.wire,
			TraceContext: b.send.TraceContext()}
		if e := req.parts[i].epoch.Load(); e >= 0 {
			pr.Partitions[i].CurrentLeaderEpoch = &e
		}
	}
	req.gen, req.sent = gen, time.Now()
	acked := p.acks != runnelv1.Acks_ACKS_NONE
	if acked {
		s.mu.Lock()
		if s.gen != gen { // the stream broke since ensureStream
			s.mu.Unlock()
			s.failRequest(req, rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "produce stream to broker %d broke", s.node))
			return
		}
		s.inflight[req.id] = req // before Send: the answer may beat Send's return
		for _, b := range req.batches {
			// The transport reads b.wire after Send returns (produceCodec does not copy it): the
			// batch's buffer may be reused only once this send is answered.
			b.unanswered.Add(1)
		}
		s.mu.Unlock()
	}
	if err := st.Send(pr); err != nil {
		// The stream is gone. Its receiver learns the status from Recv and fails everything in flight on
		// it, this request included; with acks=0 nothing is in flight, so fail it here.
		s.breakStream(gen, rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "send to broker %d failed: %v", s.node, err))
		if !acked {
			s.failRequest(req, rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "send to broker %d failed: %v", s.node, err))
		}
		return
	}
	if !acked {
		for i, b := range req.batches {
			p.batchResult(req.parts[i], b, true, -1, -1, nil)
		}
	}
}

func (s *sink) failRequest(req *request, err error) {
	for i, b := range req.batches {
		s.p.batchResult(req.parts[i], b, true, -1, -1, err)
	}
}

// ensureStream returns the open stream, opening one if there is none.
func (s *sink) ensureStream() (grpc.BidiStreamingClient[runnelv1.ProduceRequest, runnelv1.ProduceResponse], int, error) {
	s.mu.Lock()
	if s.stream != nil {
		st, gen := s.stream, s.gen
		s.mu.Unlock()
		return st, gen, nil
	}
	s.mu.Unlock()
	cc, err := s.p.cl.nodeConn(s.node)
	if err != nil {
		return nil, 0, err
	}
	// Not derived from the producer's context: shutdown ends streams gracefully, then cancels them.
	ctx, cancel := context.WithCancel(context.Background())
	st, err := runnelv1.NewRecordsClient(cc).ProduceStream(ctx, produceStreamCodec)
	if err != nil {
		cancel()
		if s.p.ctx.Err() != nil {
			return nil, 0, ErrClosed
		}
		return nil, 0, wireErr(err)
	}
	done := make(chan struct{})
	s.mu.Lock()
	s.gen++
	gen := s.gen
	s.stream, s.cancel, s.recvDone, s.breakErr = st, cancel, done, nil
	s.mu.Unlock()
	s.p.wg.Add(1)
	go s.recvLoop(st, gen, done)
	return st, gen, nil
}

// breakStream cancels stream generation gen, recording why; its receiver then fails what is in flight.
func (s *sink) breakStream(gen int, why error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen == gen && s.cancel != nil {
		if s.breakErr == nil {
			s.breakErr = why
		}
		s.cancel()
	}
}

func (s *sink) recvLoop(st grpc.BidiStreamingClient[runnelv1.ProduceRequest, runnelv1.ProduceResponse], gen int, done chan struct{}) {
	defer s.p.wg.Done()
	defer close(done)
	for {
		resp, err := st.Recv()
		if err != nil {
			s.streamFailed(gen, err)
			return
		}
		s.handle(resp)
	}
}

// streamFailed retires stream generation gen and fails the requests in flight on it.
func (s *sink) streamFailed(gen int, recvErr error) {
	s.mu.Lock()
	if s.gen != gen {
		s.mu.Unlock()
		return
	}
	err := s.breakErr
	if err == nil {
		if errors.Is(recvErr, io.EOF) {
			err = rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "broker %d ended the produce stream", s.node)
		} else {
			err = wireErr(recvErr)
			if !retriable(err) && errors.Is(err, context.Canceled) {
				err = rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "produce stream to broker %d canceled: %v", s.node, recvErr)
			}
		}
	}
	var reqs []*request
	for id, req := range s.inflight {
		if req.gen == gen {
			reqs = append(reqs, req)
			delete(s.inflight, id)
		}
	}
	if s.cancel != nil {
		s.cancel()
	}
	s.stream, s.cancel, s.recvDone, s.breakErr = nil, nil, nil, nil
	s.gen++
	s.mu.Unlock()
	if len(reqs) > 0 {
		s.p.cfg.common.logger.Info("produce stream broke", "broker", s.node, "requests_in_flight", len(reqs), "err", err)
	}
	// Settle in send order, so a partition's batches re-queue in order.
	for i := 1; i < len(reqs); i++ {
		for j := i; j > 0 && reqs[j].id < reqs[j-1].id; j-- {
			reqs[j], reqs[j-1] = reqs[j-1], reqs[j]
		}
	}
	for _, req := range reqs {
		s.failRequest(req, err)
	}
	s.wake()
}

// handle settles the batches of the request resp answers.
func (s *sink) handle(resp *runnelv1.ProduceResponse) {
	s.mu.Lock()
	req := s.inflight[resp.CorrelationId]
	delete(s.inflight, resp.CorrelationId)
	s.mu.Unlock()
	if req == nil {
		s.p.cfg.common.logger.Warn("answer to an unknown produce request", "broker", s.node, "correlation_id", resp.CorrelationId)
		return
	}
	s.wake() // a request slot is free
	for _, b := range req.batches {
		b.unanswered.Add(-1) // the broker read the whole request: the transport is done with it
	}
	for i, pp := range req.parts {
		var res *runnelv1.ProducePartitionResult
		if i < len(resp.Partitions) && resp.Partitions[i].Topic == pp.topic && resp.Partitions[i].Partition == pp.id {
			res = resp.Partitions[i]
		} else {
			for _, r := range resp.Partitions {
				if r.Topic == pp.topic && r.Partition == pp.id {
					res = r
					break
				}
			}
		}
		if res == nil {
			s.p.batchResult(pp, req.batches[i], true, -1, -1, rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "%s-%d: %v", pp.topic, pp.id, errNoResult))
			continue
		}
		s.p.batchResult(pp, req.batches[i], true, res.BaseOffset, res.LogAppendTimeMs, rerr.FromInfo(res.Error))
	}
}
