package broker

import (
	"slices"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/plog"
)

// DefaultReplicaLagTimeMax is how long a follower may go without catching up with the leader's log end
// before the leader removes it from the ISR (Kafka's replica.lag.time.max.ms is 30 s; a LAN cluster
// notices a stuck follower sooner).
const DefaultReplicaLagTimeMax = 10 * time.Second

// replica is this broker's part in one replicated partition (replication factor > 1): as leader it
// tracks its followers' log end offsets, moves the high watermark to the smallest of the ISR's, and
// answers acks=all producers once the HW passes their records; as follower a fetcher copies the
// leader's log into it (fetcher.go). Kafka's Partition and Replica classes, in one.
type replica struct {
	id        plog.PartitionID
	topic     string
	topicID   string // meta.Topic.ID: an ISR change names the topic by it too
	partition int32
	log       *plog.Partition

	// fetchMu serialises what the follower role does to the log: a fetcher's truncation (KIP-101) and
	// its appending of an answer, each together with the check that the replica still follows the
	// leader at the epoch the request was sent under (followsLocked). Two fetchers may hold answers for
	// one replica (the old leader's, still in flight, and the new one's), and an answer of the old
	// leader applied after the truncation for the new epoch would keep batches the new leader does not
	// have. Taken before mu, never while holding it.
	fetchMu sync.Mutex

	mu             sync.Mutex
	leader         bool  // this broker leads at epoch
	leaderID       int32 // the leader (this broker or another), meta.NoLeader when none
	epoch          int32 // leader epoch of the current role
	partitionEpoch int32
	replicas, isr  []int32
	minISR         int32
	followers      map[int32]*follower // leader role: every other replica
	waiters        []hwWaiter          // leader role: acks=all appends waiting for the HW, by offset
	isrChange      bool                // leader role: an ISR change is being proposed
	// epochStart is, in the leader role, the log end offset when this leadership began (Kafka's
	// leaderEpochStartOffset): everything committed under earlier epochs lies below it, while the HW
	// a new leader starts from is only what its last fetch answer said and may lag the old leader's.
	// A follower rejoins the ISR only once it has reached both (KAFKA-7128): one admitted at the stale
	// HW could be elected next while missing acknowledged records.
	epochStart int64
	// maximalISR is, in the leader role, the ISR with the followers whose joining this leader proposed
	// and may not have seen the outcome of (Kafka's maximal ISR, KIP-497); nil when none is pending.
	// The HW counts them from the proposal on: the controller can commit the expansion and then elect
	// the joiner before this leader applies it, and an HW of the old ISR would have acknowledged records
	// the new leader lacks. expandFrom is the partition epoch of the proposal, which the controller
	// takes only at that epoch: an image with another one shows the outcome, and clears maximalISR.
	maximalISR []int32
	expandFrom int32
	truncated  bool          // follower role: the log was truncated for this epoch (KIP-101)
	stopWatch  chan struct{} // leader role: closed to stop watchDurable
}

// followsLocked reports whether r follows leader at epoch: what a fetcher checks, under fetchMu, before
// it changes the log for a request it sent at epoch (r.mu held).
func (r *replica) followsLocked(leader, epoch int32) bool {
	return !r.leader && r.leaderID == leader && r.epoch == epoch
}

// follower is what the leader knows of one follower.
type follower struct {
	leo          int64     // its log end offset, from its latest fetch; -1 before the first
	lastFetch    time.Time // of its latest fetch
	lastCaughtUp time.Time // last time its fetch showed it had everything the leader had (Kafka's lastCaughtUpTimeMs)
}

// hwWaiter is an acks=all append waiting for the HW to reach end.
type hwWaiter struct {
	end  int64
	done func(error)
}

// becomeLeader takes the leadership at st's epoch: followers start unknown, and count as caught up now
// so the ISR is not shrunk before they had a chance to fetch (Kafka does the same at election).
func (r *replica) becomeLeader(self int32, st meta.PartitionState, now time.Time) {
	r.leader, r.leaderID, r.epoch, r.truncated = true, self, st.LeaderEpoch, false
	r.maximalISR = nil // a proposal of an earlier leadership is refused at this leader epoch
	r.epochStart = r.log.LogEndOffset()
	r.log.BeginLeadership(st.LeaderEpoch) // a truncation decided while following is refused from now on
	r.followers = map[int32]*follower{}
	for _, id := range st.Replicas {
		if id != self {
			r.followers[id] = &follower{leo: -1, lastCaughtUp: now}
		}
	}
}

// stepDown ends the leadership: appends still waiting for the HW fail with NOT_LEADER_OR_FOLLOWER (the
// new leader may or may not have them; the producer retries).
func (r *replica) stepDownLocked() []hwWaiter {
	if r.stopWatch != nil {
		close(r.stopWatch)
		r.stopWatch = nil
	}
	r.leader, r.followers, r.maximalISR = false, nil, nil
	w := r.waiters
	r.waiters = nil
	return w
}

// highWatermarkLocked is the HW the ISR allows: the smallest log end offset of the members of the
// maximal ISR (hwISRLocked), the leader's being its durable end (Kafka's replication design: the HW
// never passes what every in-sync replica has). A follower of it not heard from yet holds it where it is.
func (r *replica) highWatermarkLocked() int64 {
	hw := r.log.DurableEnd()
	for _, id := range r.hwISRLocked() {
		if f := r.followers[id]; f != nil {
			if f.leo < 0 {
				return r.log.HighWatermark()
			}
			hw = min(hw, f.leo)
		}
	}
	return hw
}

// hwISRLocked is the set the HW waits for: the ISR, and the followers of a pending expansion
// (maximalISR).
func (r *replica) hwISRLocked() []int32 {
	if r.maximalISR != nil {
		return r.maximalISR
	}
	return r.isr
}

// expandingLocked records that this leader proposes cmdISR, the ISR with a follower that caught up,
// at the partition epoch it has now: the HW counts that follower from now on.
func (r *replica) expandingLocked(cmdISR []int32) {
	m := slices.Clone(r.hwISRLocked())
	for _, id := range cmdISR {
		if !slices.Contains(m, id) {
			m = append(m, id)
		}
	}
	r.maximalISR, r.expandFrom = m, r.partitionEpoch
}

// settleExpansionLocked drops the maximal ISR once the partition epoch moved past the proposal's:
// the ISR applied then is the controller's answer (the expansion in it, or refused for good).
func (r *replica) settleExpansionLocked() {
	if r.maximalISR != nil && r.partitionEpoch != r.expandFrom {
		r.maximalISR = nil
	}
}

// advanceLocked moves the HW as far as the ISR allows and returns the waiters it satisfied.
func (r *replica) advanceLocked() []hwWaiter {
	if !r.leader {
		return nil
	}
	hw := r.highWatermarkLocked()
	if hw > r.log.HighWatermark() {
		if err := r.log.SetHighWatermark(hw); err != nil {
			return nil
		}
	}
	hw = r.log.HighWatermark()
	n := 0
	for n < len(r.waiters) && r.waiters[n].end <= hw {
		n++
	}
	done := slices.Clone(r.waiters[:n])
	r.waiters = slices.Delete(r.waiters, 0, n)
	return done
}

// addWaiterLocked queues an acks=all append whose records end at end (exclusive).
func (r *replica) addWaiterLocked(end int64, done func(error)) {
	i, _ := slices.BinarySearchFunc(r.waiters, end, func(w hwWaiter, e int64) int {
		switch {
		case w.end < e:
			return -1
		case w.end > e:
			return 1
		}
		return 0
	})
	r.waiters = slices.Insert(r.waiters, i, hwWaiter{end: end, done: done})
}

// notLeaderLocked is the error for a request this replica cannot serve as leader.
func (r *replica) notLeaderLocked() error {
	return &rerr.Error{Code: runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER, LeaderID: r.leaderID, LeaderEpoch: r.epoch,
		Message: "no longer the leader of " + r.id.String()}
}

// fire runs the callbacks of satisfied waiters with err, outside any lock.
func fire(ws []hwWaiter, err error) {
	for _, w := range ws {
		w.done(err)
	}
}

// watchDurable runs while this broker leads the partition: each time the local durable end moves (an
// append fsynced) it advances the HW, which with an ISR of the leader alone is all it takes.
func (r *replica) watchDurable(stop <-chan struct{}, brokerStop <-chan struct{}) {
	for {
		ch := r.log.Changed()
		r.mu.Lock()
		ws := r.advanceLocked()
		r.mu.Unlock()
		fire(ws, nil)
		select {
		case <-ch:
		case <-stop:
			return
		case <-brokerStop:
			return
		}
	}
}

// syncFollowersLocked makes the followers tracked the replicas other than self: a reassignment adds
// replicas (tracked from now, not yet heard from) and, once complete, removes the ones that left.
func (r *replica) syncFollowersLocked(self int32, replicas []int32, now time.Time) {
	for _, id := range replicas {
		if id != self && r.followers[id] == nil {
			r.followers[id] = &follower{leo: -1, lastCaughtUp: now}
		}
	}
	for id := range r.followers {
		if !slices.Contains(replicas, id) {
			delete(r.followers, id)
		}
	}
}
