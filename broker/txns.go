package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/group"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/txn"
	"github.com/runnel-io/runnel/client/telemetry"
	"google.golang.org/grpc"
)

// Marker delivery and verification timing.
const (
	// markerCallTimeout bounds one WriteTxnMarkers call to a partition leader (it waits for the ISR).
	markerCallTimeout = 30 * time.Second
	// markerRetryMin and markerRetryMax bound the backoff between rounds of markers that failed (a
	// leader moving, a follower catching up for min.insync.replicas).
	markerRetryMin = 50 * time.Millisecond
	markerRetryMax = 2 * time.Second
	// verifyRetryFor is how long Verify retries a coordinator that is moving or loading before it
	// answers the produce with that (retriable) error.
	verifyRetryFor = 2 * time.Second
)

type txnShard = stateShard[txn.Record, *txn.Coordinator]

// TxnCoordinator serves the Transactions gRPC service (KIP-98, KIP-447, KIP-890): the shell around one
// txn.Coordinator per partition of __transaction_state that this node leads. Per partition it
// serialises calls to the core, appends the records a call produced acks=all, hands them back to the
// core once durable and only then answers (stateshard.go). Once a PREPARE_COMMIT or PREPARE_ABORT
// record is durable it writes the transaction's markers through every partition's leader (this node
// in-process, others with WriteTxnMarkers over gRPC), retrying until all have them, then appends
// COMPLETE_*. A new leader of a partition replays it and resumes the prepared transactions it finds;
// markers are idempotent per producer epoch, so writing them twice is harmless. One goroutine follows
// the metadata (loading and dropping partitions, creating __transaction_state) and drives the cores'
// timers (Tick: transaction timeouts, id expiry). It also implements TxnVerifier for this node's
// partition leaders. See broker/txn's doc.
type TxnCoordinator struct {
	runnelv1.UnimplementedTransactionsServer

	b      *Broker
	cfg    txn.Config
	log    *slog.Logger
	shards *stateShards[txn.Record, *txn.Coordinator]

	connsMu sync.Mutex
	conns   map[string]*grpc.ClientConn // by broker address: WriteTxnMarkers and VerifyPartitions to peers

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// NewTxnCoordinator validates cfg and starts the goroutine that follows the metadata: it creates
// __transaction_state (cfg.StateTopicPartitions partitions, cleanup.policy=compact, internal, the
// replication factor of __consumer_offsets) once the cluster's brokers are up, and loads each
// partition this node leads. Close stops it and every marker writer.
func NewTxnCoordinator(b *Broker, cfg txn.Config, logger *slog.Logger) (*TxnCoordinator, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	tc := &TxnCoordinator{b: b, cfg: cfg, log: logger, conns: map[string]*grpc.ClientConn{}, stop: make(chan struct{})}
	tc.shards = &stateShards[txn.Record, *txn.Coordinator]{b: b, topic: txn.StateTopic, what: "transactional id",
		partitions: cfg.StateTopicPartitions, log: logger, newCore: func() *txn.Coordinator { return txn.New(cfg) },
		newCodec: func() stateCodec[txn.Record] { return kvCodec[txn.Record]{} },
		shards:   map[int32]*txnShard{},
		// Prepared transactions found in the log are resumed at once; later ones as their records apply.
		loaded:     func(s *txnShard, _ time.Time) { tc.startMarkers(s) },
		afterApply: tc.startMarkers,
	}
	tc.shards.follow(time.Now())
	b.tel.ObserveTransactions(func(visit func(telemetry.TxnCore)) { // the open-transactions gauge, read at collection
		for _, s := range tc.shards.list() {
			s.read(func(c *txn.Coordinator) { visit(c) })
		}
	})
	tc.wg.Add(1)
	go tc.loop()
	return tc, nil
}

// Close stops the timer goroutine and the marker writers (what they did not finish is resumed by the
// partition's next leader) and closes the connections to other brokers.
func (tc *TxnCoordinator) Close() {
	tc.b.tel.ObserveTransactions(nil)
	tc.closeOnce.Do(func() { close(tc.stop) })
	tc.wg.Wait()
	tc.shards.close()
	tc.connsMu.Lock()
	defer tc.connsMu.Unlock()
	for addr, cc := range tc.conns {
		cc.Close()
		delete(tc.conns, addr)
	}
}

// Loaded reports whether __transaction_state exists and every partition of it this node leads is
// loaded, so calls for those ids are served rather than answered COORDINATOR_LOAD_IN_PROGRESS.
func (tc *TxnCoordinator) Loaded() bool { return tc.shards.Loaded() }

// loop follows metadata changes, and the replication layer's taking up of leaderships, at once and
// runs the cores' timers every TickInterval.
func (tc *TxnCoordinator) loop() {
	defer tc.wg.Done()
	t := time.NewTicker(tc.cfg.TickInterval)
	defer t.Stop()
	led := tc.b.repl.ledChanged() // renewed only once it fired, so a leadership taken up meanwhile is seen
	for {
		changed := tc.b.md.Changed()
		select {
		case <-tc.stop:
			return
		case <-changed:
			tc.shards.follow(time.Now())
		case <-led:
			led = tc.b.repl.ledChanged()
			tc.shards.follow(time.Now())
		case now := <-t.C:
			tc.shards.follow(now)
			for _, s := range tc.shards.list() {
				s.tick(now, func(c *txn.Coordinator) []txn.Record {
					defer tc.b.tel.TxnCall(c, now, telemetry.TxnAbortTimeout)()
					return c.Tick(now)
				})
			}
		}
	}
}

// startMarkers starts a marker writer for every transaction of s whose PREPARE_* record became
// durable. Called with s.mu held, so it never starts one after unload cancelled s.ctx.
func (tc *TxnCoordinator) startMarkers(s *txnShard) {
	if s.ctx.Err() != nil {
		return
	}
	for _, m := range s.core.TakePrepared() {
		s.wg.Add(1)
		go tc.writeMarkers(s, m)
	}
}

// writeMarkers writes the markers of one prepared transaction until every partition has its marker,
// then appends COMPLETE_*; it gives up only when the shard is unloaded (its next leader resumes).
func (tc *TxnCoordinator) writeMarkers(s *txnShard, m txn.Marker) {
	defer s.wg.Done()
	pending := map[tpKey]struct{}{}
	for _, t := range m.Partitions {
		for _, p := range t.Partitions {
			pending[tpKey{t.Topic, p}] = struct{}{}
		}
	}
	wait := markerRetryMin
	for len(pending) > 0 {
		tc.markerRound(s.ctx, s.leaderEpoch, m, pending)
		if len(pending) == 0 {
			break
		}
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, markerRetryMax)
	}
	now := time.Now()
	err := s.do(s.ctx, now, func(c *txn.Coordinator) ([]txn.Record, error) { return c.Complete(now, m), nil })
	if err != nil && s.ctx.Err() == nil {
		tc.log.Warn("completing a transaction failed; it is resumed when its partition is reloaded",
			"transactional_id", m.TransactionalID, "err", err)
	}
}

type tpKey struct {
	topic     string
	partition int32
}

// markerRound sends the markers still pending to the partitions' current leaders, in parallel, and
// removes from pending the partitions that have them (or no longer exist).
func (tc *TxnCoordinator) markerRound(ctx context.Context, coordinatorEpoch int32, m txn.Marker, pending map[tpKey]struct{}) {
	img := tc.b.md.Image()
	byLeader := map[int32][]tpKey{}
	for k := range pending {
		t, ok := img.Topic(k.topic)
		if !ok || k.partition >= t.Partitions {
			delete(pending, k) // deleted: nothing left to mark
			continue
		}
		if st, _ := t.Partition(k.partition); st.Leader != meta.NoLeader {
			byLeader[st.Leader] = append(byLeader[st.Leader], k)
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for leader, keys := range byLeader {
		wg.Go(func() {
			done := tc.sendMarkers(ctx, leader, coordinatorEpoch, m, keys)
			mu.Lock()
			for _, k := range done {
				delete(pending, k)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
}

// sendMarkers sends one WriteTxnMarkers for keys to leader and returns the partitions that have their
// marker. A partition whose producer state holds a newer epoch counts as done: a later producer epoch
// already ended this transaction there (retrying could never succeed).
func (tc *TxnCoordinator) sendMarkers(ctx context.Context, leader, coordinatorEpoch int32, m txn.Marker, keys []tpKey) []tpKey {
	slices.SortFunc(keys, func(a, b tpKey) int {
		if c := strings.Compare(a.topic, b.topic); c != 0 {
			return c
		}
		return int(a.partition - b.partition)
	})
	mk := &runnelv1.TxnMarker{ProducerId: m.ProducerID, ProducerEpoch: int32(m.ProducerEpoch), Commit: m.Commit,
		CoordinatorEpoch: coordinatorEpoch, TransactionalId: m.TransactionalID}
	for _, k := range keys {
		if n := len(mk.Partitions); n == 0 || mk.Partitions[n-1].Topic != k.topic {
			mk.Partitions = append(mk.Partitions, &runnelv1.TopicPartitions{Topic: k.topic})
		}
		last := mk.Partitions[len(mk.Partitions)-1]
		last.Partitions = append(last.Partitions, k.partition)
	}
	req := &runnelv1.WriteTxnMarkersRequest{Markers: []*runnelv1.TxnMarker{mk}}
	ctx, cancel := context.WithTimeout(ctx, markerCallTimeout)
	defer cancel()
	var resp *runnelv1.WriteTxnMarkersResponse
	var err error
	if leader == tc.b.cfg.NodeID {
		resp, err = tc.b.WriteTxnMarkers(ctx, req)
	} else {
		var cl runnelv1.TransactionsClient
		if cl, err = tc.client(leader); err == nil {
			resp, err = cl.WriteTxnMarkers(ctx, req)
			err = rerr.FromStatus(err)
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			tc.log.Debug("writing transaction markers failed; retrying", "transactional_id", m.TransactionalID, "leader", leader, "err", err)
		}
		return nil
	}
	var done []tpKey
	for _, mr := range resp.GetMarkers() {
		for _, pr := range mr.Partitions {
			switch code := pr.Error.GetCode(); code {
			case runnelv1.ErrorCode_NONE:
			case runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH:
				tc.log.Warn("a partition holds a newer epoch of the producer; its marker is skipped", "transactional_id", m.TransactionalID,
					"topic", pr.Topic, "partition", pr.Partition, "producer_id", m.ProducerID, "producer_epoch", m.ProducerEpoch)
			default:
				tc.log.Debug("a transaction marker was refused; retrying", "transactional_id", m.TransactionalID,
					"topic", pr.Topic, "partition", pr.Partition, "err", rerr.FromInfo(pr.Error))
				continue
			}
			done = append(done, tpKey{pr.Topic, pr.Partition})
		}
	}
	return done
}

// client returns a Transactions client for broker id, over a connection kept per address.
func (tc *TxnCoordinator) client(id int32) (runnelv1.TransactionsClient, error) {
	br, ok := tc.b.md.Image().Broker(id)
	if !ok {
		return nil, rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "broker %d is not registered", id)
	}
	tc.connsMu.Lock()
	defer tc.connsMu.Unlock()
	cc := tc.conns[br.GRPCAddr]
	if cc == nil {
		var err error
		if cc, err = grpc.NewClient(br.GRPCAddr, tc.b.peerDialOptions()...); err != nil {
			return nil, fmt.Errorf("dial broker %d at %s: %w", id, br.GRPCAddr, err)
		}
		tc.conns[br.GRPCAddr] = cc
	}
	return runnelv1.NewTransactionsClient(cc), nil
}

// Verify implements TxnVerifier (KIP-890): nil when topic-partition is in the ongoing transaction of
// exactly this producer id and epoch. It asks the core in-process when this node coordinates the id,
// else the coordinator with VerifyPartitions; a coordinator that is moving or loading is retried for up
// to verifyRetryFor within ctx. Errors: INVALID_TXN_STATE, PRODUCER_FENCED, INVALID_REQUEST, or the
// retriable coordinator error that outlasted the retries.
func (tc *TxnCoordinator) Verify(ctx context.Context, p *runnelv1.TxnProducer, topic string, partition int32) error {
	req := &runnelv1.VerifyPartitionsRequest{Producer: p, Partitions: []*runnelv1.TopicPartitions{{Topic: topic, Partitions: []int32{partition}}}}
	giveUp := time.Now().Add(verifyRetryFor)
	wait := markerRetryMin
	for {
		resp, err := tc.verifyOnce(ctx, req)
		if err == nil {
			if len(resp.Partitions) != 1 {
				return rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "verification answered %d partitions of 1", len(resp.Partitions))
			}
			return rerr.FromInfo(resp.Partitions[0].Error)
		}
		switch rerr.FromError(err).Code {
		case runnelv1.ErrorCode_NOT_COORDINATOR, runnelv1.ErrorCode_COORDINATOR_LOAD_IN_PROGRESS, runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE:
		default:
			return err
		}
		if time.Now().Add(wait).After(giveUp) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, markerRetryMax)
	}
}

// verifyOnce asks the id's coordinator once: in-process, or over gRPC to the broker NOT_COORDINATOR
// names.
func (tc *TxnCoordinator) verifyOnce(ctx context.Context, req *runnelv1.VerifyPartitionsRequest) (*runnelv1.VerifyPartitionsResponse, error) {
	resp, err := tc.VerifyPartitions(ctx, req)
	if err == nil {
		return resp, nil
	}
	err = rerr.FromStatus(err)
	var e *rerr.Error
	if !errors.As(err, &e) || e.Code != runnelv1.ErrorCode_NOT_COORDINATOR || e.LeaderID < 0 || e.LeaderID == tc.b.cfg.NodeID {
		return nil, err
	}
	cl, cerr := tc.client(e.LeaderID)
	if cerr != nil {
		return nil, rerr.New(runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE, "transaction coordinator %d: %v", e.LeaderID, cerr)
	}
	resp, err = cl.VerifyPartitions(ctx, req)
	if err != nil {
		return nil, rerr.FromStatus(err)
	}
	return resp, nil
}

// shardOf returns the shard of transactional id id (see stateShards.shard), refusing an empty or
// over-long id with INVALID_REQUEST before routing it.
func (tc *TxnCoordinator) shardOf(id string) (*txnShard, error) {
	if id == "" || len(id) > txn.MaxIDBytes {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "transactional id of %d bytes: 1 to %d", len(id), txn.MaxIDBytes)
	}
	return tc.shards.shard(id)
}

// call runs fn on the shard of id (see stateShard.do) and turns its error into a gRPC status.
func (tc *TxnCoordinator) call(ctx context.Context, id string, fn func(c *txn.Coordinator, now time.Time) ([]txn.Record, error)) error {
	s, err := tc.shardOf(id)
	if err != nil {
		return rerr.ToStatus(err)
	}
	now := time.Now()
	return rerr.ToStatus(s.do(ctx, now, func(c *txn.Coordinator) ([]txn.Record, error) { return fn(c, now) }))
}

// InitProducerId implements runnelv1.TransactionsServer; see txn.Coordinator.InitProducerId. New
// producer ids come from the broker's block allocator.
func (tc *TxnCoordinator) InitProducerId(ctx context.Context, req *runnelv1.InitTxnProducerIdRequest) (*runnelv1.InitTxnProducerIdResponse, error) {
	var resp *runnelv1.InitTxnProducerIdResponse
	alloc := func() (int64, error) { return tc.b.allocateProducerID(ctx) }
	err := tc.call(ctx, req.TransactionalId, func(c *txn.Coordinator, now time.Time) (recs []txn.Record, err error) {
		defer tc.b.tel.TxnCall(c, now, telemetry.TxnAbortFenced, req.TransactionalId)() // an ongoing transaction is aborted, its producer fenced
		resp, recs, err = c.InitProducerId(now, req, alloc)
		return recs, err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// partitionCheck is the core's check of a partition added to a transaction: it must exist, and not
// belong to an internal topic (only the broker writes those; groups join with AddOffsetsToTxn).
func (tc *TxnCoordinator) partitionCheck() txn.PartitionCheck {
	img := tc.b.md.Image()
	return func(topic string, partition int32) error {
		t, ok := img.Topic(topic)
		switch {
		case !ok || partition < 0 || partition >= t.Partitions:
			return rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "%s-%d does not exist", topic, partition)
		case t.Internal:
			return rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "topic %q is internal: only the broker writes to it", topic)
		}
		return nil
	}
}

// AddPartitionsToTxn implements runnelv1.TransactionsServer; see txn.Coordinator.AddPartitionsToTxn.
func (tc *TxnCoordinator) AddPartitionsToTxn(ctx context.Context, req *runnelv1.AddPartitionsToTxnRequest) (*runnelv1.AddPartitionsToTxnResponse, error) {
	var resp *runnelv1.AddPartitionsToTxnResponse
	check := tc.partitionCheck()
	err := tc.call(ctx, req.GetProducer().GetTransactionalId(), func(c *txn.Coordinator, now time.Time) (recs []txn.Record, err error) {
		resp, recs, err = c.AddPartitionsToTxn(now, req, check)
		return recs, err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// AddOffsetsToTxn implements runnelv1.TransactionsServer; see txn.Coordinator.AddOffsetsToTxn.
// COORDINATOR_NOT_AVAILABLE while __consumer_offsets does not exist yet.
func (tc *TxnCoordinator) AddOffsetsToTxn(ctx context.Context, req *runnelv1.AddOffsetsToTxnRequest) (*runnelv1.AddOffsetsToTxnResponse, error) {
	var n int32
	if t, ok := tc.b.md.Image().Topic(group.OffsetsTopic); ok {
		n = t.Partitions
	}
	err := tc.call(ctx, req.GetProducer().GetTransactionalId(), func(c *txn.Coordinator, now time.Time) ([]txn.Record, error) {
		return c.AddOffsetsToTxn(now, req, n)
	})
	if err != nil {
		return nil, err
	}
	return &runnelv1.AddOffsetsToTxnResponse{}, nil
}

// EndTxn implements runnelv1.TransactionsServer; see txn.Coordinator.EndTxn. It answers once the
// decision is durable; the markers are written afterwards.
func (tc *TxnCoordinator) EndTxn(ctx context.Context, req *runnelv1.EndTxnRequest) (*runnelv1.EndTxnResponse, error) {
	var resp *runnelv1.EndTxnResponse
	err := tc.call(ctx, req.GetProducer().GetTransactionalId(), func(c *txn.Coordinator, now time.Time) (recs []txn.Record, err error) {
		defer tc.b.tel.TxnCall(c, now, telemetry.TxnAbortClient, req.GetProducer().GetTransactionalId())()
		resp, recs, err = c.EndTxn(now, req)
		return recs, err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// VerifyPartitions implements runnelv1.TransactionsServer; see txn.Coordinator.VerifyPartitions. It
// waits for the writes before it, so it never verifies a partition whose addition a crash could undo.
func (tc *TxnCoordinator) VerifyPartitions(ctx context.Context, req *runnelv1.VerifyPartitionsRequest) (*runnelv1.VerifyPartitionsResponse, error) {
	var resp *runnelv1.VerifyPartitionsResponse
	err := tc.call(ctx, req.GetProducer().GetTransactionalId(), func(c *txn.Coordinator, _ time.Time) (_ []txn.Record, err error) {
		resp, err = c.VerifyPartitions(req)
		return nil, err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// ListTransactions implements runnelv1.TransactionsServer: the ids of every partition loaded here, by
// transactional id.
func (tc *TxnCoordinator) ListTransactions(_ context.Context, req *runnelv1.ListTransactionsRequest) (*runnelv1.ListTransactionsResponse, error) {
	resp := &runnelv1.ListTransactionsResponse{}
	for _, s := range tc.shards.list() {
		s.read(func(c *txn.Coordinator) {
			resp.Transactions = append(resp.Transactions, c.ListTransactions(req.States)...)
		})
	}
	for _, t := range resp.Transactions {
		t.CoordinatorId = tc.b.cfg.NodeID
	}
	slices.SortFunc(resp.Transactions, func(a, b *runnelv1.TransactionSummary) int {
		return strings.Compare(a.TransactionalId, b.TransactionalId)
	})
	return resp, nil
}

// DescribeTransactions implements runnelv1.TransactionsServer. Ids another broker coordinates get
// NOT_COORDINATOR (coordinator_id naming it), unknown ids TRANSACTIONAL_ID_NOT_FOUND, in their entry.
func (tc *TxnCoordinator) DescribeTransactions(_ context.Context, req *runnelv1.DescribeTransactionsRequest) (*runnelv1.DescribeTransactionsResponse, error) {
	if len(req.TransactionalIds) > txn.MaxListed {
		return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%d transactional ids, at most %d", len(req.TransactionalIds), txn.MaxListed))
	}
	resp := &runnelv1.DescribeTransactionsResponse{}
	for _, id := range req.TransactionalIds {
		s, err := tc.shardOf(id)
		if err != nil {
			d := &runnelv1.TransactionDescription{TransactionalId: id, Error: rerr.ToInfo(err), CoordinatorId: -1, ProducerId: -1, ProducerEpoch: -1}
			if e := (*rerr.Error)(nil); errors.As(err, &e) && e.Code == runnelv1.ErrorCode_NOT_COORDINATOR {
				d.CoordinatorId = e.LeaderID
			}
			resp.Transactions = append(resp.Transactions, d)
			continue
		}
		var d *runnelv1.TransactionDescription
		s.read(func(c *txn.Coordinator) { d = c.DescribeTransaction(id) })
		d.CoordinatorId = tc.b.cfg.NodeID
		resp.Transactions = append(resp.Transactions, d)
	}
	return resp, nil
}

// AbortTransaction implements runnelv1.TransactionsServer; see txn.Coordinator.AbortTransaction. It
// answers once the abort decision is durable.
func (tc *TxnCoordinator) AbortTransaction(ctx context.Context, req *runnelv1.AbortTransactionRequest) (*runnelv1.AbortTransactionResponse, error) {
	var resp *runnelv1.AbortTransactionResponse
	err := tc.call(ctx, req.TransactionalId, func(c *txn.Coordinator, now time.Time) (recs []txn.Record, err error) {
		defer tc.b.tel.TxnCall(c, now, telemetry.TxnAbortOperator, req.TransactionalId)()
		resp, recs, err = c.AbortTransaction(now, req)
		return recs, err
	})
	if err != nil {
		return nil, err
	}
	tc.log.Info("transaction aborted by an operator", "transactional_id", req.TransactionalId, "producer_id", resp.ProducerId,
		"producer_epoch", resp.ProducerEpoch)
	return resp, nil
}

// WriteTxnMarkers implements runnelv1.TransactionsServer: the partition leader's side, Broker.WriteTxnMarkers.
func (tc *TxnCoordinator) WriteTxnMarkers(ctx context.Context, req *runnelv1.WriteTxnMarkersRequest) (*runnelv1.WriteTxnMarkersResponse, error) {
	resp, err := tc.b.WriteTxnMarkers(ctx, req)
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	return resp, nil
}
