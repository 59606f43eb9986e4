package broker

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/client/telemetry"
	"golang.org/x/time/rate"
)

// replication is the broker's replica manager: it follows the metadata to give each replicated
// partition held here its role (leader or follower at a leader epoch), runs one fetcher per leader this
// broker follows, and on the leader shrinks and expands the ISR through the controller (Kafka's
// ReplicaManager and AlterPartition, KIP-497). Partitions with one replica are not replicated: their
// high watermark is their durable end, as on a single node.
type replication struct {
	b        *Broker
	lagMax   time.Duration
	throttle *rate.Limiter // bytes/s sent to followers out of the ISR; nil: none

	mu       sync.Mutex
	parts    map[plog.PartitionID]*replica
	fetchers map[int32]*fetcher // by leader id
	led      chan struct{}      // closed (and replaced) when apply takes up a leadership
}

func newReplication(b *Broker) *replication {
	lag := b.cfg.ReplicaLagTimeMax
	if lag <= 0 {
		lag = DefaultReplicaLagTimeMax
	}
	rm := &replication{b: b, lagMax: lag, parts: map[plog.PartitionID]*replica{}, fetchers: map[int32]*fetcher{}, led: make(chan struct{})}
	if t := b.cfg.ReplicationThrottle; t > 0 {
		rm.throttle = rate.NewLimiter(rate.Limit(t), int(min(t, 64<<20)))
	}
	return rm
}

// get returns the replica state of a replicated partition held here, or nil.
func (rm *replication) get(id plog.PartitionID) *replica {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	return rm.parts[id]
}

// leads reports whether this broker has taken up the leadership of replicated partition id at epoch:
// the metadata image can show it before apply ran, while the replica still follows and its
// truncation for the previous epoch may still cut the log.
func (rm *replication) leads(id plog.PartitionID, epoch int32) bool {
	r := rm.get(id)
	return r != nil && r.leadsAt(epoch)
}

// leadsAt reports whether r has taken up the leadership at epoch (rm.leads).
func (r *replica) leadsAt(epoch int32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leader && r.epoch == epoch
}

// ledChanged returns a channel closed the next time apply takes up a leadership, for the
// coordinators, which load a partition's state only once its leadership is taken up.
func (rm *replication) ledChanged() <-chan struct{} {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	return rm.led
}

// apply gives every replicated partition held here its role in img. logs are the open local logs (b.mu
// held by the caller, so the logs cannot be dropped meanwhile).
func (rm *replication) apply(img *meta.Image, logs func(t *meta.Topic, p int32) *plog.Partition) {
	self := rm.b.cfg.NodeID
	now := time.Now()
	seen := map[plog.PartitionID]bool{}
	var fail, ready []hwWaiter // appends that lost their leader; appends the HW now covers
	took := false              // a leadership was taken up
	rm.mu.Lock()
	defer func() {
		if took {
			close(rm.led)
			rm.led = make(chan struct{})
		}
		rm.mu.Unlock()
		fire(fail, rerr.New(runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER, "leadership moved while the write waited for the ISR"))
		fire(ready, nil)
	}()
	for _, t := range img.TopicList() {
		for i, st := range t.Assignment {
			if len(st.Replicas) <= 1 || !st.IsReplica(self) {
				continue
			}
			l := logs(t, int32(i))
			if l == nil {
				continue
			}
			id := plog.PartitionID{TopicNum: t.Num, Partition: int32(i)}
			seen[id] = true
			r := rm.parts[id]
			if r == nil {
				l.SetReplicated()
				r = &replica{id: id, topic: t.Name, topicID: t.ID, partition: int32(i), log: l, leaderID: meta.NoLeader, epoch: -1}
				rm.parts[id] = r
			}
			r.mu.Lock()
			r.replicas, r.isr, r.partitionEpoch, r.minISR = st.Replicas, st.ISR, st.PartitionEpoch, t.Config.MinInsyncReplicas
			r.settleExpansionLocked()
			switch {
			case st.Leader == self:
				if !r.leader || r.epoch != st.LeaderEpoch {
					rm.unfollowLocked(r)
					if r.leader {
						fail = append(fail, r.stepDownLocked()...) // a new epoch of our own leadership
					}
					r.becomeLeader(self, st, now)
					took = true
					r.stopWatch = make(chan struct{})
					rm.b.wg.Add(1)
					go func(stop chan struct{}) {
						defer rm.b.wg.Done()
						r.watchDurable(stop, rm.b.stop)
					}(r.stopWatch)
					rm.b.log.Debug("partition leader", "topic", t.Name, "partition", i, "leader_epoch", st.LeaderEpoch)
				}
				r.isrChange = false
				r.syncFollowersLocked(self, st.Replicas, now) // a reassignment adds or removes replicas
				ready = append(ready, r.advanceLocked()...)   // an ISR that shrank may let the HW move
			default:
				if r.leader {
					fail = append(fail, r.stepDownLocked()...)
				}
				if r.leaderID != st.Leader || r.epoch != st.LeaderEpoch {
					l.FenceLeaderAppends(st.LeaderEpoch) // before the fetcher truncates for this epoch
					rm.unfollowLocked(r)
					r.leaderID, r.epoch, r.truncated = st.Leader, st.LeaderEpoch, false
					if st.Leader != meta.NoLeader {
						rm.followLocked(r, st.Leader)
					}
				}
			}
			r.mu.Unlock()
		}
	}
	for id, r := range rm.parts {
		if seen[id] {
			continue
		}
		r.mu.Lock()
		if r.leader {
			fail = append(fail, r.stepDownLocked()...)
		}
		rm.unfollowLocked(r)
		r.mu.Unlock()
		delete(rm.parts, id)
	}
}

// followLocked hands r to the fetcher of leader (rm.mu held).
func (rm *replication) followLocked(r *replica, leader int32) {
	f := rm.fetchers[leader]
	if f == nil {
		f = newFetcher(rm, leader)
		rm.fetchers[leader] = f
		rm.b.wg.Add(1)
		go f.run()
	}
	f.add(r)
}

// unfollowLocked takes r from every fetcher (rm.mu held).
func (rm *replication) unfollowLocked(r *replica) {
	for _, f := range rm.fetchers {
		f.remove(r.id)
	}
}

// waitISR is called once an acks=all append to a replicated partition is durable on the leader: done
// runs when the HW reaches end (every ISR member has the records), with NOT_ENOUGH_REPLICAS_AFTER_APPEND
// if the ISR shrank below min.insync.replicas meanwhile, or with REQUEST_TIMED_OUT at the deadline.
func (rm *replication) waitISR(r *replica, end int64, deadline time.Time, done func(error)) {
	var once sync.Once
	finish := func(err error) { once.Do(func() { done(err) }) }
	timer := time.AfterFunc(time.Until(deadline), func() {
		finish(rerr.New(runnelv1.ErrorCode_REQUEST_TIMED_OUT, "%s-%d: the in-sync replicas did not all have the records within the request timeout", r.topic, r.partition))
	})
	r.mu.Lock()
	if !r.leader {
		err := r.notLeaderLocked()
		r.mu.Unlock()
		timer.Stop()
		finish(err)
		return
	}
	r.addWaiterLocked(end, func(err error) {
		timer.Stop()
		if err == nil {
			r.mu.Lock()
			// The committed ISR, not the maximal one the HW counts: a joiner whose addition is not
			// committed may yet be refused. Stricter than Kafka, whose checkEnoughReplicasReachOffset
			// counts the maximal ISR here (its check before the append counts the committed one).
			isr, minISR := len(r.isr), r.minISR
			r.mu.Unlock()
			if int32(isr) < minISR {
				err = rerr.New(runnelv1.ErrorCode_NOT_ENOUGH_REPLICAS_AFTER_APPEND, "%s-%d: written, but the ISR has %d member(s), fewer than min.insync.replicas=%d", r.topic, r.partition, isr, minISR)
			}
		}
		finish(err)
	})
	ws := r.advanceLocked()
	r.mu.Unlock()
	fire(ws, nil)
}

// checkMinISR refuses an acks=all append before it is written when the ISR is smaller than
// min.insync.replicas (NOT_ENOUGH_REPLICAS), as Kafka does.
func (r *replica) checkMinISR() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.leader {
		return r.notLeaderLocked()
	}
	if int32(len(r.isr)) < r.minISR {
		return rerr.New(runnelv1.ErrorCode_NOT_ENOUGH_REPLICAS, "%s-%d: the ISR %v has fewer members than min.insync.replicas=%d", r.topic, r.partition, r.isr, r.minISR)
	}
	return nil
}

// followerFetched records a follower's fetch at offset (its log end offset): it may move the HW and,
// once the follower has caught up, bring it back into the ISR.
func (rm *replication) followerFetched(r *replica, id int32, offset int64, now time.Time) {
	// A fenced follower is not proposed (KIP-841): the controller would refuse it, and every refusal
	// is a metadata entry of its own.
	alive := rm.b.md.Image().Alive(id)
	r.mu.Lock()
	f := r.followers[id]
	if !r.leader || f == nil {
		r.mu.Unlock()
		return
	}
	f.leo, f.lastFetch = offset, now
	if offset >= r.log.DurableEnd() {
		f.lastCaughtUp = now
	}
	ws := r.advanceLocked()
	// A follower out of the ISR that has everything up to the HW, and everything this leader had when
	// its leadership began, rejoins (Kafka's maybeExpandIsr with KAFKA-7128's epoch start check).
	expand := alive && !slices.Contains(r.isr, id) && offset >= max(r.log.HighWatermark(), r.epochStart) && !r.isrChange
	var cmd meta.Command
	if expand {
		r.isrChange = true
		cmd = meta.Command{Type: meta.CmdAlterPartition, Name: r.topic, TopicID: r.topicID, Partition: r.partition, BrokerID: rm.b.cfg.NodeID,
			LeaderEpoch: r.epoch, PartitionEpoch: r.partitionEpoch, ISR: append(slices.Clone(r.isr), id)}
		r.expandingLocked(cmd.ISR) // before the proposal can commit
		// Counted as caught up from now, as followers are at an election: its last catch-up to the
		// log end may be long past, and checkISR would otherwise settle the expansion it just made.
		f.lastCaughtUp = now
	}
	r.mu.Unlock()
	fire(ws, nil)
	if expand {
		rm.b.wg.Add(1)
		go rm.alterISR(r, cmd, +1, fmt.Sprintf("broker %d caught up", id))
	}
}

// checkISR removes from the ISR of every partition led here the followers that have not caught up for
// lagMax (Kafka's maybeShrinkIsr), one controller proposal per partition.
func (rm *replication) checkISR(now time.Time) {
	rm.mu.Lock()
	parts := make([]*replica, 0, len(rm.parts))
	for _, r := range rm.parts {
		parts = append(parts, r)
	}
	rm.mu.Unlock()
	for _, r := range parts {
		r.mu.Lock()
		if !r.leader || r.isrChange {
			r.mu.Unlock()
			continue
		}
		// Over the maximal ISR: a joiner whose expansion's outcome never came back (the proposal was
		// refused, or timed out and may still commit) holds the HW as a member does, and leaves it the
		// same way. When only such joiners lag, the proposal is the ISR as it is: accepted at this
		// partition epoch it moves the epoch, which settles the expansion either way. (Kafka keeps one
		// AlterPartition in flight and retries it until answered; here a proposal's outcome may not
		// come back, so the epoch is what settles it.)
		var keep, out []int32
		for _, id := range r.hwISRLocked() {
			if f := r.followers[id]; f != nil && now.Sub(f.lastCaughtUp) > rm.lagMax {
				out = append(out, id)
			} else if slices.Contains(r.isr, id) {
				keep = append(keep, id)
			}
		}
		if len(out) == 0 {
			r.mu.Unlock()
			continue
		}
		r.isrChange = true
		cmd := meta.Command{Type: meta.CmdAlterPartition, Name: r.topic, TopicID: r.topicID, Partition: r.partition, BrokerID: rm.b.cfg.NodeID,
			LeaderEpoch: r.epoch, PartitionEpoch: r.partitionEpoch, ISR: keep}
		why := fmt.Sprintf("broker(s) %v not caught up within %v", out, rm.lagMax)
		if len(keep) == len(r.isr) {
			why = fmt.Sprintf("pending addition of broker(s) %v not caught up within %v", out, rm.lagMax)
		}
		change := 0
		if len(keep) < len(r.isr) {
			change = -1
		}
		r.mu.Unlock()
		rm.b.wg.Add(1)
		go rm.alterISR(r, cmd, change, why)
	}
}

// alterISR proposes an ISR change: change is -1 for a shrink, +1 for an expansion, 0 for the same ISR
// (which only moves the partition epoch, see checkISR). The new ISR takes effect when the metadata
// brings it back (apply).
func (rm *replication) alterISR(r *replica, cmd meta.Command, change int, why string) {
	defer rm.b.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := rm.b.md.Propose(ctx, cmd)
	if err != nil {
		rm.b.log.Warn("ISR change refused", "topic", r.topic, "partition", r.partition, "isr", cmd.ISR, "reason", why, "err", err)
		r.mu.Lock()
		// The maximal ISR stays even after a refusal: another proposal made at this partition epoch
		// (isrChange is cleared by every image) may be in flight with the same joiner. The next epoch
		// settles it (apply), or checkISR once the joiner lags.
		r.isrChange = false
		r.mu.Unlock()
		return
	}
	if change != 0 {
		rm.b.tel.ISRChanged(r.topic, r.partition, change < 0)
	}
	rm.b.log.Info("ISR changed", "topic", r.topic, "partition", r.partition, "isr", cmd.ISR, "reason", why)
}

// throttled reports whether a replica fetch of r by follower id must wait for the throttle (the
// follower is out of the ISR, catching up, and the bytes sent to such followers used up the rate for
// now), and otherwise the most bytes to send it (0: no cap).
func (rm *replication) throttled(r *replica, id int32) (bool, int) {
	if rm.throttle == nil {
		return false, 0
	}
	r.mu.Lock()
	inSync := slices.Contains(r.isr, id)
	r.mu.Unlock()
	if inSync {
		return false, 0
	}
	return rm.throttle.Tokens() < 1, rm.throttle.Burst()
}

// charge counts n bytes sent to follower id of r against the throttle when it is out of the ISR; the
// bucket may go into debt, which later fetches wait out.
func (rm *replication) charge(r *replica, id int32, n int) {
	if rm.throttle == nil || n == 0 {
		return
	}
	r.mu.Lock()
	inSync := slices.Contains(r.isr, id)
	r.mu.Unlock()
	if !inSync {
		rm.throttle.ReserveN(time.Now(), min(n, rm.throttle.Burst())) // n is at most the burst (throttled)
	}
}

// followerLags returns, for every partition led here, how far each follower is behind the leader's
// durable end (a follower not heard from since the leadership began counts from offset 0).
func (rm *replication) followerLags() []telemetry.FollowerLag {
	rm.mu.Lock()
	parts := make([]*replica, 0, len(rm.parts))
	for _, r := range rm.parts {
		parts = append(parts, r)
	}
	rm.mu.Unlock()
	var out []telemetry.FollowerLag
	for _, r := range parts {
		r.mu.Lock()
		if r.leader {
			end := r.log.DurableEnd()
			for id, f := range r.followers {
				out = append(out, telemetry.FollowerLag{Topic: r.topic, Partition: r.partition, Follower: id, Lag: max(end-max(f.leo, 0), 0)})
			}
		}
		r.mu.Unlock()
	}
	return out
}

// loop runs the ISR check every lagMax/4 until the broker stops.
func (rm *replication) loop() {
	defer rm.b.wg.Done()
	t := time.NewTicker(rm.lagMax / 4)
	defer t.Stop()
	for {
		select {
		case <-rm.b.stop:
			rm.mu.Lock()
			for _, f := range rm.fetchers {
				f.close()
			}
			rm.mu.Unlock()
			return
		case now := <-t.C:
			rm.checkISR(now)
		}
	}
}
