package client

import (
	"context"
	"fmt"
	"sort"
	"time"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// Transaction administration (Kafka's kafka-transactions.sh and the AdminClient's listTransactions,
// describeTransactions and abortTransaction, KIP-664).

// TransactionSummary is one transactional id in ListTransactions.
type TransactionSummary struct {
	TransactionalID string
	ProducerID      int64
	// State is Kafka's transaction state name: Empty, Ongoing, PrepareCommit, PrepareAbort,
	// CompleteCommit, CompleteAbort or Dead.
	State         string
	CoordinatorID int32
}

// TransactionDescription is a transactional id in detail, from DescribeTransaction.
type TransactionDescription struct {
	TransactionalID string
	State           string // as in TransactionSummary
	ProducerID      int64
	ProducerEpoch   int16
	// Timeout is the producer's transaction timeout: the coordinator aborts a transaction open longer.
	Timeout time.Duration
	// StartTime is when the ongoing transaction began (its first partition or group was added); zero
	// when none is ongoing.
	StartTime time.Time
	// Partitions and Groups are in the ongoing (or ending) transaction.
	Partitions    []TopicPartition
	Groups        []string
	CoordinatorID int32
	LastUpdate    time.Time // zero when the coordinator did not say
}

// TxnStateName returns Kafka's name of a transaction state ("Ongoing", ...).
func TxnStateName(s runnelv1.TxnState) string {
	switch s {
	case runnelv1.TxnState_TXN_EMPTY:
		return "Empty"
	case runnelv1.TxnState_TXN_ONGOING:
		return "Ongoing"
	case runnelv1.TxnState_TXN_PREPARE_COMMIT:
		return "PrepareCommit"
	case runnelv1.TxnState_TXN_PREPARE_ABORT:
		return "PrepareAbort"
	case runnelv1.TxnState_TXN_COMPLETE_COMMIT:
		return "CompleteCommit"
	case runnelv1.TxnState_TXN_COMPLETE_ABORT:
		return "CompleteAbort"
	case runnelv1.TxnState_TXN_DEAD:
		return "Dead"
	}
	return s.String()
}

// ListTransactions lists the transactional ids every broker coordinates (each coordinates those that
// hash to the __transaction_state partitions it leads), sorted by id.
func (a *Admin) ListTransactions(ctx context.Context) ([]TransactionSummary, error) {
	md, err := a.cl.metadata(ctx, []string{})
	if err != nil {
		return nil, fmt.Errorf("list transactions: %w", err)
	}
	nodes := []int32{-1}
	if len(md.Brokers) > 0 {
		nodes = nodes[:0]
		for _, b := range md.Brokers {
			nodes = append(nodes, b.NodeId)
		}
	}
	seen := map[string]TransactionSummary{}
	for _, node := range nodes {
		err := unfinal(a.cl.retry(ctx, func(ctx context.Context) error {
			cc, err := a.cl.nodeConn(node)
			if err != nil {
				return err
			}
			resp, err := runnelv1.NewTransactionsClient(cc).ListTransactions(ctx, &runnelv1.ListTransactionsRequest{})
			if err != nil {
				return wireErr(err)
			}
			for _, s := range resp.Transactions {
				seen[s.TransactionalId] = TransactionSummary{TransactionalID: s.TransactionalId, ProducerID: s.ProducerId,
					State: TxnStateName(s.State), CoordinatorID: s.CoordinatorId}
			}
			return nil
		}))
		if err != nil {
			return nil, fmt.Errorf("list transactions of node %d: %w", node, err)
		}
	}
	out := make([]TransactionSummary, 0, len(seen))
	for _, s := range seen {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TransactionalID < out[j].TransactionalID })
	return out, nil
}

// DescribeTransaction describes a transactional id at its coordinator: state, producer id and epoch,
// timeout, and the partitions and groups of the ongoing transaction. An unknown id gives
// TRANSACTIONAL_ID_NOT_FOUND (errors.Is(err, rerr.ErrTransactionalIDNotFound)).
func (a *Admin) DescribeTransaction(ctx context.Context, transactionalID string) (*TransactionDescription, error) {
	coord := &txnCoordinator{cl: a.cl, id: transactionalID, coordNode: coordNode{node: -1}}
	var out *TransactionDescription
	ctx, cancel := context.WithTimeout(ctx, a.cfg.common.requestTimeout)
	defer cancel()
	err := coord.call(ctx, func(ctx context.Context, tc runnelv1.TransactionsClient) error {
		resp, err := tc.DescribeTransactions(ctx, &runnelv1.DescribeTransactionsRequest{TransactionalIds: []string{transactionalID}})
		if err != nil {
			return wireErr(err)
		}
		d, err := oneTopic(resp.Transactions, transactionalID, func(d *runnelv1.TransactionDescription) string { return d.TransactionalId })
		if err != nil {
			return err
		}
		if err := groupErr(d.Error); err != nil { // coordinator errors route the retry (once); the rest are final
			return err
		}
		out = &TransactionDescription{TransactionalID: d.TransactionalId, State: TxnStateName(d.State), ProducerID: d.ProducerId,
			ProducerEpoch: int16(d.ProducerEpoch), Timeout: time.Duration(d.TransactionTimeoutMs) * time.Millisecond,
			Partitions: fromProtoPartitions(d.Partitions), Groups: d.Groups, CoordinatorID: d.CoordinatorId}
		if d.TransactionStartMs >= 0 {
			out.StartTime = time.UnixMilli(d.TransactionStartMs)
		}
		if d.LastUpdateMs > 0 {
			out.LastUpdate = time.UnixMilli(d.LastUpdateMs)
		}
		sort.Strings(out.Groups)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("describe transaction %q: %w", transactionalID, unfinal(err))
	}
	return out, nil
}

// AbortTransaction aborts the ongoing transaction of a transactional id at its coordinator, for an
// operator ending a stuck ("hanging") transaction: ABORT markers are written to its partitions and
// the producer epoch is bumped, so the producer that opened it is fenced (its later calls fail with
// ErrProducerFenced). It returns the producer id and the new epoch. Kafka: kafka-transactions.sh abort.
func (a *Admin) AbortTransaction(ctx context.Context, transactionalID string) (producerID int64, epoch int16, err error) {
	coord := &txnCoordinator{cl: a.cl, id: transactionalID, coordNode: coordNode{node: -1}}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.common.requestTimeout)
	defer cancel()
	var resp *runnelv1.AbortTransactionResponse
	err = coord.call(ctx, func(ctx context.Context, tc runnelv1.TransactionsClient) error {
		var err error
		resp, err = tc.AbortTransaction(ctx, &runnelv1.AbortTransactionRequest{TransactionalId: transactionalID})
		return wireErr(err)
	})
	if err != nil {
		return -1, -1, fmt.Errorf("abort transaction %q: %w", transactionalID, err)
	}
	return resp.ProducerId, int16(resp.ProducerEpoch), nil
}
