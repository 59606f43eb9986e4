package broker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/client/batch"
	"google.golang.org/grpc"
)

// Fetcher settings (Kafka's replica.fetch.* properties).
const (
	replicaFetchWait     = 500 * time.Millisecond // replica.fetch.wait.max.ms
	replicaFetchMaxBytes = 16 << 20               // replica.fetch.response.max.bytes
	replicaPartitionMax  = 4 << 20                // replica.fetch.max.bytes
	replicaFetchBackoff  = 200 * time.Millisecond // replica.fetch.backoff.ms
	maxTruncationRounds  = 16                     // leader-epoch exchanges per fetch round (KIP-279)
)

// fetcher copies the partitions this broker follows from one leader: a loop of long-poll ReplicaFetch
// calls carrying each partition's log end offset, appending what comes back as it is. Before it first
// fetches a partition at a new leader epoch it asks the leader where its own latest epoch ends and
// truncates what the leader does not have (KIP-101, KIP-279).
type fetcher struct {
	rm     *replication
	leader int32

	mu    sync.Mutex
	parts map[plog.PartitionID]*replica
	wake  chan struct{} // signalled when partitions are added
	stop  chan struct{}
	once  sync.Once

	conn *grpc.ClientConn
	addr string
}

func newFetcher(rm *replication, leader int32) *fetcher {
	return &fetcher{rm: rm, leader: leader, parts: map[plog.PartitionID]*replica{}, wake: make(chan struct{}, 1), stop: make(chan struct{})}
}

func (f *fetcher) add(r *replica) {
	f.mu.Lock()
	f.parts[r.id] = r
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *fetcher) remove(id plog.PartitionID) {
	f.mu.Lock()
	delete(f.parts, id)
	f.mu.Unlock()
}

func (f *fetcher) close() { f.once.Do(func() { close(f.stop) }) }

// client returns a Replication client of the leader's current address.
func (f *fetcher) client() (runnelv1.ReplicationClient, error) {
	br, ok := f.rm.b.md.Image().Broker(f.leader)
	if !ok {
		return nil, rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "leader %d is not registered", f.leader)
	}
	if f.conn == nil || f.addr != br.GRPCAddr {
		if f.conn != nil {
			f.conn.Close()
		}
		cc, err := grpc.NewClient(br.GRPCAddr, f.rm.b.peerDialOptions()...)
		if err != nil {
			return nil, err
		}
		f.conn, f.addr = cc, br.GRPCAddr
	}
	return runnelv1.NewReplicationClient(f.conn), nil
}

func (f *fetcher) snapshot() []*replica {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*replica, 0, len(f.parts))
	for _, r := range f.parts {
		out = append(out, r)
	}
	return out
}

func (f *fetcher) run() {
	defer f.rm.b.wg.Done()
	defer func() {
		if f.conn != nil {
			f.conn.Close()
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-f.stop:
		case <-f.rm.b.stop:
		}
		cancel()
	}()
	for ctx.Err() == nil {
		parts := f.snapshot()
		if len(parts) == 0 {
			select {
			case <-ctx.Done():
			case <-f.wake:
			}
			continue
		}
		err := f.round(ctx, parts)
		if err != nil && ctx.Err() == nil {
			f.rm.b.log.Debug("replica fetch failed", "leader", f.leader, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(replicaFetchBackoff):
			}
		}
	}
}

// round truncates the partitions that start following a new epoch, then fetches once.
func (f *fetcher) round(ctx context.Context, parts []*replica) error {
	cl, err := f.client()
	if err != nil {
		return err
	}
	// Each round of the exchange cuts a log back by at least one epoch of its own, so it ends within
	// as many rounds as the log has epochs; the bound only keeps a misbehaving leader from holding the
	// fetcher here (what is left is asked again in the next fetch round).
	asking := parts
	for range maxTruncationRounds {
		again, err := f.truncate(ctx, cl, asking)
		if err != nil {
			return err
		}
		if len(again) == 0 {
			break
		}
		asking = again // only those: a partition whose answer was an error waits for the next fetch round
	}
	req := &runnelv1.ReplicaFetchRequest{ReplicaId: f.rm.b.cfg.NodeID, MaxWaitMs: int32(replicaFetchWait / time.Millisecond),
		MaxBytes: replicaFetchMaxBytes}
	var fetched []*replica
	var epochs []int32 // the leader epoch each partition is fetched under: its answer is applied only then
	for _, r := range parts {
		r.mu.Lock()
		ok := !r.leader && r.leaderID == f.leader && r.truncated
		epoch := r.epoch
		r.mu.Unlock()
		if !ok {
			continue
		}
		fetched, epochs = append(fetched, r), append(epochs, epoch)
		req.Partitions = append(req.Partitions, &runnelv1.ReplicaFetchPartition{Topic: r.topic, Partition: r.partition,
			CurrentLeaderEpoch: epoch, FetchOffset: r.log.LogEndOffset(), PartitionMaxBytes: replicaPartitionMax})
	}
	if len(fetched) == 0 {
		select { // every partition waits for its truncation or moved: do not spin
		case <-ctx.Done():
		case <-time.After(replicaFetchBackoff):
		}
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, replicaFetchWait+5*time.Second)
	defer cancel()
	resp, err := cl.ReplicaFetch(cctx, req)
	if err != nil {
		return rerr.FromStatus(err)
	}
	if len(resp.Partitions) != len(fetched) {
		return rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "replica fetch answered %d partitions of %d", len(resp.Partitions), len(fetched))
	}
	if testHookFetched != nil {
		if applied := testHookFetched(f.rm.b.cfg.NodeID, f.leader, resp); applied != nil {
			defer applied()
		}
	}
	var errs []error
	for i, pr := range resp.Partitions {
		if err := f.apply(ctx, fetched[i], epochs[i], pr); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// testHookFetched, when set by a test, runs in a fetcher round of follower node after leader's answer
// arrived and before it is applied: the window in which the follower's role can change under an answer
// in flight. The function it returns, if any, runs once the answer was applied (or discarded).
var testHookFetched func(node, leader int32, resp *runnelv1.ReplicaFetchResponse) (applied func())

// truncate asks the leader where this replica's latest epoch ends and cuts the log there (KIP-101,
// KIP-279): a suffix written under an epoch the leader does not continue was never committed. It
// returns the partitions that cut back to an earlier epoch of their own and must ask again.
func (f *fetcher) truncate(ctx context.Context, cl runnelv1.ReplicationClient, parts []*replica) (again []*replica, err error) {
	req := &runnelv1.OffsetForLeaderEpochRequest{ReplicaId: f.rm.b.cfg.NodeID}
	var asked []*replica
	var epochs, latest []int32 // per asked partition: the leader epoch followed, the log's latest epoch asked about
	for _, r := range parts {
		r.mu.Lock()
		need := !r.leader && r.leaderID == f.leader && !r.truncated
		epoch := r.epoch
		r.mu.Unlock()
		if !need {
			continue
		}
		own := r.log.LatestEpoch()
		asked, epochs, latest = append(asked, r), append(epochs, epoch), append(latest, own)
		req.Partitions = append(req.Partitions, &runnelv1.OffsetForLeaderEpochPartition{Topic: r.topic, Partition: r.partition,
			CurrentLeaderEpoch: epoch, LeaderEpoch: own})
	}
	if len(asked) == 0 {
		return nil, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cl.OffsetForLeaderEpoch(cctx, req)
	if err != nil {
		return nil, rerr.FromStatus(err)
	}
	for i, res := range resp.Partitions {
		if i >= len(asked) {
			break
		}
		if err := rerr.FromInfo(res.Error); err != nil {
			continue // the leader is not there yet at this epoch, or moved on: the metadata will tell
		}
		more, err := f.truncateTo(asked[i], epochs[i], latest[i], res)
		if err != nil {
			return nil, err
		}
		if more {
			again = append(again, asked[i])
		}
	}
	return again, nil
}

// truncateTo cuts r's log where the leader's answer res to "where does my latest epoch (asked) end"
// says (plog's TruncationOffset) and, when the exchange is complete, marks r truncated for epoch; it
// reports whether r must ask again (KIP-279: its log lacks the epoch the leader answered with). Under
// r.fetchMu, and only while r still follows this leader at epoch and its latest epoch is still asked:
// another fetcher (of the previous leader) may have appended meanwhile, and then the question is asked
// again in the next round.
func (f *fetcher) truncateTo(r *replica, epoch, asked int32, res *runnelv1.OffsetForLeaderEpochResult) (again bool, err error) {
	r.fetchMu.Lock()
	defer r.fetchMu.Unlock()
	r.mu.Lock()
	current := r.followsLocked(f.leader, epoch) && !r.truncated
	r.mu.Unlock()
	if !current || r.log.LatestEpoch() != asked {
		return false, nil
	}
	leo := r.log.LogEndOffset()
	cut, complete := r.log.TruncationOffset(res.LeaderEpoch, res.EndOffset)
	// Also when cut is the end just read: an append of this replica's own ended leadership that the
	// writer had already taken (FenceLeaderAppends refuses the ones after) may land after that read,
	// and the truncation, queued behind it, removes it (with nothing at or above cut it costs nothing).
	// As a follower of epoch: should this replica lead meanwhile, the cut is refused, not applied to
	// what it appended as leader.
	newEnd, err := r.log.TruncateAsFollower(cut, epoch)
	if err != nil {
		return false, err
	}
	if newEnd < leo {
		f.rm.b.log.Info("follower log truncated to the leader's", "topic", r.topic, "partition", r.partition,
			"leader", f.leader, "leader_epoch", epoch, "asked_epoch", asked, "leader_answer_epoch", res.LeaderEpoch,
			"leader_answer_end", res.EndOffset, "from", leo, "to", newEnd, "complete", complete)
	}
	if !complete {
		return true, nil
	}
	r.mu.Lock()
	if r.followsLocked(f.leader, epoch) {
		r.truncated = true
	}
	r.mu.Unlock()
	return false, nil
}

// untruncate makes r ask the leader again before its next fetch (its log and the leader's disagree),
// if r still follows this leader at epoch.
func (f *fetcher) untruncate(r *replica, epoch int32) {
	r.mu.Lock()
	if r.followsLocked(f.leader, epoch) {
		r.truncated = false
	}
	r.mu.Unlock()
}

// apply appends one partition's answer to a fetch sent while r followed this leader at epoch, and takes
// the leader's HW (capped at the local end). An answer that arrives after r's role changed (another
// leader or epoch, or the leadership) is dropped: the batches of a leader that lost its leadership may
// be missing from the new leader's log, which may get other batches at their offsets (the idempotent
// producer's retry of the same records under the new epoch), and the truncation for the new epoch
// (KIP-101) may already have run, so nothing would take them out again. The check and the append hold
// r.fetchMu, so a truncation for a new epoch comes wholly before or after them.
func (f *fetcher) apply(ctx context.Context, r *replica, epoch int32, pr *runnelv1.ReplicaFetchPartitionResult) error {
	r.fetchMu.Lock()
	defer r.fetchMu.Unlock()
	r.mu.Lock()
	current := r.followsLocked(f.leader, epoch) && r.truncated
	r.mu.Unlock()
	if !current {
		f.rm.b.log.Debug("replica fetch answer dropped: the replica's role changed while it was in flight", "topic", r.topic,
			"partition", r.partition, "leader", f.leader, "leader_epoch", epoch, "bytes", len(pr.Records))
		return nil
	}
	if err := rerr.FromInfo(pr.Error); err != nil {
		var e *rerr.Error
		if errors.As(err, &e) && e.Code == runnelv1.ErrorCode_OFFSET_OUT_OF_RANGE {
			// Behind the leader's log start (retention moved it): start over from there.
			if pr.LogStartOffset > r.log.LogEndOffset() {
				if _, terr := r.log.TruncateAsFollower(pr.LogStartOffset, epoch); terr != nil {
					return terr
				}
				return nil
			}
			// Ahead of the leader: truncate again before the next fetch.
			f.untruncate(r, epoch)
		}
		return err
	}
	recs := pr.Records
	if len(recs) > 0 {
		leo := r.log.LogEndOffset()
		// The answer starts at the batch that holds the fetch offset; skip what is already here. Batch
		// boundaries are the same on every replica (appends keep them, truncation and the cleaner never
		// split a batch), so a leader batch across our log end means our last batch is not the
		// leader's: taking the rest would leave a gap (AllowGaps) behind a batch the leader does not
		// have. Ask the leader again where our epoch ends instead.
		var keep []byte
		var across *batch.Header
		err := batch.Split(recs, func(b []byte, h batch.Header) error {
			switch {
			case h.BaseOffset >= leo:
				keep = append(keep, b...)
			case h.NextOffset() > leo && across == nil:
				across = &h
			}
			return nil
		})
		if err != nil {
			return rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "replica fetch of %s-%d: %v", r.topic, r.partition, err)
		}
		if across != nil {
			f.untruncate(r, epoch)
			f.rm.b.log.Warn("follower log diverges from the leader's: truncating again", "topic", r.topic, "partition", r.partition,
				"leader", f.leader, "leader_epoch", epoch, "log_end", leo, "leader_batch_base", across.BaseOffset, "leader_batch_end", across.NextOffset())
			return rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "replica fetch of %s-%d: the leader's batch [%d, %d) runs across this replica's log end %d",
				r.topic, r.partition, across.BaseOffset, across.NextOffset(), leo)
		}
		if len(keep) > 0 {
			// AllowGaps: a compacted leader's log has gaps between batches (the cleaner never moves
			// offsets); an overlap is still refused. Sync false: the follower does not wait for its fsync
			// before fetching on (the group commit still fsyncs), as Kafka's followers do: the copy on
			// another machine is what protects the record; the leader fsyncs before it acknowledges.
			// Measured on a 3-node cluster on one 2-core machine: p50 latency at half load 160 ms -> 64 ms.
			// Traced batches get a replicate span each, the child of the leader's append span, ended
			// once durable here (client/telemetry/replication.go); nil and free when nothing is traced.
			spans := f.rm.b.tel.StartReplicate(r.topic, r.partition, f.leader, f.rm.b.cfg.NodeID, pr.BatchTraces, keep)
			_, err := r.log.AppendReplica(ctx, keep, plog.AppendOptions{Sync: false, LogAppendTime: -1, AllowGaps: true})
			if !spans.Appended(r.log, err) {
				f.rm.b.wg.Add(1) // the fetcher holds one, so the broker's Close is not waiting yet
				go func() {
					defer f.rm.b.wg.Done()
					spans.Durable(f.rm.b.stop, r.log)
				}()
			}
			if err != nil {
				if errors.Is(err, plog.ErrOffsetMismatch) {
					f.untruncate(r, epoch)
				}
				return err
			}
		}
	}
	if hw := min(pr.HighWatermark, r.log.DurableEnd()); hw > r.log.HighWatermark() {
		return r.log.SetHighWatermark(hw)
	}
	return nil
}
