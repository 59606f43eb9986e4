package client

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The idempotent producer's identity (KIP-98): see Producer and WithIdempotence.

// ProducerID returns the producer id and epoch the producer's batches carry: -1, -1 when the producer is
// not idempotent, before its first InitProducerId has answered, and while it is taking a new id after a
// sequence failure.
func (p *Producer) ProducerID() (id int64, epoch int16) {
	if pi := p.ident.Load(); pi != nil {
		return pi.id, pi.epoch
	}
	return -1, -1
}

// ensureIdent starts InitProducerId when batches wait for a producer identity and none is being
// obtained. It returns when the caller should look again (after a failed attempt's backoff), or zero.
func (p *Producer) ensureIdent(now time.Time) time.Time {
	if p.txn != nil {
		return time.Time{} // a transactional producer's identity comes from InitTransactions only
	}
	p.identMu.Lock()
	defer p.identMu.Unlock()
	if p.ident.Load() != nil || p.identBusy || p.ctx.Err() != nil {
		return time.Time{}
	}
	if now.Before(p.identRetry) {
		return p.identRetry
	}
	p.identBusy = true
	p.wg.Add(1) // called by a sink goroutine, itself counted, so never concurrently with Close's Wait
	go p.initProducerID()
	return time.Time{}
}

// initProducerID asks any broker for a producer id, retrying retriable errors within the delivery
// timeout, and installs it. A cluster that does not implement InitProducerId makes the producer
// non-idempotent when idempotence was left at its default; otherwise a non-retriable failure fails the
// batches waiting for the id, and the next batch tries again after a backoff.
func (p *Producer) initProducerID() {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.deliveryTimeout)
	defer cancel()
	var (
		resp        *runnelv1.InitProducerIdResponse
		err         error
		unsupported bool
	)
	for {
		err = p.cl.retry(ctx, func(ctx context.Context) error {
			cc, err := p.cl.anyConn()
			if err != nil {
				return err
			}
			resp, err = runnelv1.NewRecordsClient(cc).InitProducerId(ctx, &runnelv1.InitProducerIdRequest{})
			if status.Code(err) == codes.Unimplemented {
				unsupported = true
				return rerr.New(runnelv1.ErrorCode_UNSUPPORTED_VERSION, "the cluster does not support idempotent producers (InitProducerId: %v)", status.Convert(err).Message())
			}
			if err != nil {
				return wireErr(err)
			}
			if resp.ProducerId < 0 || resp.ProducerEpoch < 0 || resp.ProducerEpoch > math.MaxInt16 {
				return rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "InitProducerId answered producer id %d, epoch %d", resp.ProducerId, resp.ProducerEpoch)
			}
			return nil
		})
		if err == nil || !retriable(err) || ctx.Err() != nil {
			break
		}
	}
	fallback := false
	p.identMu.Lock()
	p.identBusy = false
	switch {
	case err == nil:
		p.identErr, p.identFailures = nil, 0
		p.ident.Store(&producerIdentity{id: resp.ProducerId, epoch: int16(resp.ProducerEpoch)})
	case unsupported && !p.cfg.idempotenceSet:
		fallback = true
		p.identErr = nil
		p.ident.Store(noIdentity)
	default:
		if p.ctx.Err() != nil {
			err = ErrClosed
		}
		p.identErr = err
		p.identRetry = time.Now().Add(p.cl.backoff(p.identFailures))
		p.identFailures++
	}
	p.identMu.Unlock()
	switch {
	case err == nil:
		p.cfg.common.logger.Debug("producer id", "id", resp.ProducerId, "epoch", resp.ProducerEpoch)
	case fallback:
		p.cfg.common.logger.Warn("the cluster does not support idempotent producers: producing without idempotence (retries may write a batch twice)", "err", err)
	case !retriable(err):
		p.failUnbuilt(err)
	default:
		p.cfg.common.logger.Warn("no producer id within the delivery timeout", "err", err)
	}
	p.wakeAll()
}

// identError returns why the last InitProducerId failed, or nil.
func (p *Producer) identError() error {
	p.identMu.Lock()
	defer p.identMu.Unlock()
	return p.identErr
}

// resetIdent drops identity stale (a numbered batch of pp failed for good, with err) so that new batches
// are numbered under a new producer id, as Kafka's idempotent producer resets its producer id. Other
// partitions keep sending what they have already built under stale, whose sequences are intact. Called
// with pp.mu held; it reports whether it reset (false: stale was already replaced).
func (p *Producer) resetIdent(stale *producerIdentity, pp *ppart, err error) bool {
	if p.txn != nil {
		// The transaction cannot commit now (the batch's failure reaches it through finish); the epoch
		// is bumped once it is aborted.
		p.txn.sequenceBroken()
		return false
	}
	if !p.ident.CompareAndSwap(stale, nil) {
		return false
	}
	p.identMu.Lock()
	p.identRetry, p.identFailures = time.Time{}, 0
	p.identMu.Unlock()
	p.cfg.common.logger.Warn("sequence broken: taking a new producer id", "topic", pp.topic, "partition", pp.id,
		"producer_id", stale.id, "epoch", stale.epoch, "err", err)
	return true
}

// failUnbuilt fails every batch waiting for a producer identity (queued and not built, or open) with
// err, rather than leaving them to their delivery timeout.
func (p *Producer) failUnbuilt(err error) {
	for _, pp := range *p.allParts.Load() {
		pp.mu.Lock()
		if p.ident.Load() != nil {
			pp.mu.Unlock()
			return // an identity came meanwhile: they will be built and sent
		}
		i := len(pp.queue)
		for i > 0 && pp.queue[i-1].wire == nil {
			i--
		}
		fail := slices.Clone(pp.queue[i:])
		clear(pp.queue[i:])
		pp.queue = pp.queue[:i]
		if pp.cur != nil {
			fail = append(fail, pp.cur)
			pp.cur = nil
		}
		pp.mu.Unlock()
		for _, b := range fail {
			p.batchResult(pp, b, false, -1, -1, err)
		}
	}
}
