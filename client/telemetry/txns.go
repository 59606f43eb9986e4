package telemetry

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// Transaction metrics (KIP-98): the coordinator decides each transaction once, with its
// PREPARE_COMMIT or PREPARE_ABORT record; the markers and COMPLETE_* follow. Decisions are counted
// where they are made, by comparing a transactional id's state before and after a call of the
// coordinator's core that may decide (TxnCalls), so the core stays free of instrumentation and the
// shell (broker/txns.go) pays one line per call site. A coordinator that takes over a partition and
// resumes its prepared transactions decides nothing and counts nothing: each transaction is counted
// once, by the coordinator that decided it.

// Reasons of aborted transactions, the values of AttrAbortReason.
const (
	// TxnAbortClient: the producer asked for the abort (EndTxn with commit=false).
	TxnAbortClient = "client"
	// TxnAbortTimeout: the transaction outlived its transaction.timeout.ms (the coordinator's Tick).
	TxnAbortTimeout = "timeout"
	// TxnAbortFenced: a new producer of the transactional id (InitProducerId) fenced the old one.
	TxnAbortFenced = "fenced"
	// TxnAbortOperator: an operator aborted it (runnel txn abort, AbortTransaction).
	TxnAbortOperator = "operator"
)

// TxnCore is what the transaction metrics read of one transaction coordinator core
// (broker/txn.Coordinator): its counts and its transactional ids' states. Calls are made with the
// core's lock held, as for any other call of it.
type TxnCore interface {
	// Stats returns the number of transactional ids and of those with a transaction ongoing or being
	// ended.
	Stats() (ids, open int)
	// DescribeTransaction describes one id: state, transaction_start_ms.
	DescribeTransaction(id string) *runnelv1.TransactionDescription
	// ListTransactions lists the ids in one of states.
	ListTransactions(states []runnelv1.TxnState) []*runnelv1.TransactionSummary
}

// txnMetrics are the transaction instruments and the source of the open gauge.
type txnMetrics struct {
	open      metric.Int64ObservableGauge
	committed metric.Int64Counter
	aborted   metric.Int64Counter
	duration  metric.Float64Histogram
	// abortOpts and durOpts are the attribute sets, made once: by reason; commit and abort.
	abortOpts          map[string]metric.MeasurementOption
	durCommit, durAbrt metric.MeasurementOption

	src atomic.Pointer[func(visit func(TxnCore))]
}

// txnBuckets are the bounds, in seconds, of transaction durations: from a few ms (a small
// read-process-write cycle) to the maximum transaction timeout (15 min).
var txnBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900}

func (t *txnMetrics) init(m metric.Meter) error {
	var err error
	add := func(e error) {
		if err == nil {
			err = e
		}
	}
	var e error
	t.open, e = m.Int64ObservableGauge(MetricTxnOpen, metric.WithUnit("{transaction}"),
		metric.WithDescription("Transactions ongoing or being ended, on the coordinators this broker runs."))
	add(e)
	t.committed, e = m.Int64Counter(MetricTxnCommitted, metric.WithUnit("{transaction}"),
		metric.WithDescription("Transactions the coordinators of this broker decided to commit."))
	add(e)
	t.aborted, e = m.Int64Counter(MetricTxnAborted, metric.WithUnit("{transaction}"),
		metric.WithDescription("Transactions the coordinators of this broker decided to abort, by reason."))
	add(e)
	t.duration, e = m.Float64Histogram(MetricTxnDuration, metric.WithUnit("s"),
		metric.WithDescription("Time from a transaction's first partition or group to its commit or abort decision."),
		metric.WithExplicitBucketBoundaries(txnBuckets...))
	add(e)
	t.abortOpts = map[string]metric.MeasurementOption{}
	for _, r := range []string{TxnAbortClient, TxnAbortTimeout, TxnAbortFenced, TxnAbortOperator} {
		t.abortOpts[r] = metric.WithAttributeSet(attribute.NewSet(AttrAbortReason.String(r)))
	}
	t.durCommit = metric.WithAttributeSet(attribute.NewSet(AttrTxnOutcome.String("commit")))
	t.durAbrt = metric.WithAttributeSet(attribute.NewSet(AttrTxnOutcome.String("abort")))
	return err
}

// observe reports the open transactions of every core, at collection.
func (t *txnMetrics) observe(o metric.Observer) {
	fn := t.src.Load()
	if fn == nil {
		return
	}
	var open int64
	(*fn)(func(c TxnCore) {
		_, n := c.Stats()
		open += int64(n)
	})
	o.ObserveInt64(t.open, open)
}

// ObserveTransactions sets the function that visits, at each metric collection, every transaction
// coordinator core this broker runs (each under its lock), for the open-transactions gauge. nil stops
// the reports (the coordinator closed). A broker that coordinates no partition of
// __transaction_state reports 0, so the sum over the brokers is the cluster's.
func (b *Broker) ObserveTransactions(fn func(visit func(TxnCore))) {
	if b == nil {
		return
	}
	if fn == nil {
		b.txns.src.Store(nil)
		return
	}
	b.txns.src.Store(&fn)
}

// txnSeen is an id's transaction before a call of the core.
type txnSeen struct {
	id      string
	pid     int64
	startMs int64
}

func noTxnCall() {}

// TxnCall observes one call of core, made at now, that may decide transactions, for the committed,
// aborted and duration metrics: it looks at ids (all ids with an ongoing transaction when none are
// given, which is what a timer tick may abort) before the call, and the function it returns looks
// again after it. An id whose transaction was ongoing before and is PREPARE_COMMIT or PREPARE_ABORT
// after was decided by the call: it counts as committed, or as aborted with reason (one of
// TxnAbortClient, ...; for EndTxn the decision says which), and its duration is now minus its start.
// Both halves run with the core's lock held. Use it as
//
//	defer tc.b.tel.TxnCall(c, now, telemetry.TxnAbortClient, id)()
//
// inside the call's closure. With a nil Broker it costs nothing and returns a no-op.
func (b *Broker) TxnCall(core TxnCore, now time.Time, reason string, ids ...string) func() {
	if b == nil {
		return noTxnCall
	}
	var seen []txnSeen
	look := func(id string) {
		d := core.DescribeTransaction(id)
		if d.GetState() == runnelv1.TxnState_TXN_ONGOING {
			seen = append(seen, txnSeen{id: id, pid: d.ProducerId, startMs: d.TransactionStartMs})
		}
	}
	if len(ids) == 0 {
		if _, open := core.Stats(); open == 0 {
			return noTxnCall // the common tick: nothing could time out
		}
		for _, s := range core.ListTransactions([]runnelv1.TxnState{runnelv1.TxnState_TXN_ONGOING}) {
			look(s.TransactionalId)
		}
	} else {
		for _, id := range ids {
			look(id)
		}
	}
	if len(seen) == 0 {
		return noTxnCall
	}
	return func() {
		for _, s := range seen {
			d := core.DescribeTransaction(s.id)
			if d.ProducerId != s.pid {
				continue // another producer id took the id (an epoch overflow): not this transaction's decision
			}
			var dur float64
			if s.startMs >= 0 {
				dur = max(float64(now.UnixMilli()-s.startMs)/1000, 0)
			}
			switch d.GetState() {
			case runnelv1.TxnState_TXN_PREPARE_COMMIT:
				b.txns.committed.Add(context.Background(), 1, b.noAttrs)
				b.txns.duration.Record(context.Background(), dur, b.txns.durCommit)
			case runnelv1.TxnState_TXN_PREPARE_ABORT:
				opt, ok := b.txns.abortOpts[reason]
				if !ok {
					opt = metric.WithAttributes(AttrAbortReason.String(reason))
				}
				b.txns.aborted.Add(context.Background(), 1, opt)
				b.txns.duration.Record(context.Background(), dur, b.txns.durAbrt)
			}
		}
	}
}
