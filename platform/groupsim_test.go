package platform_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// tpart names one topic-partition in the group tests.
type tpart struct {
	topic string
	part  int32
}

func (p tpart) String() string { return fmt.Sprintf("%s-%d", p.topic, p.part) }

// ownershipChecker records, from the members' side, when each member starts and stops processing each
// partition. Members call acquire after an answer gave them a partition and release before the
// heartbeat that says they let it go, so the order of these calls (under one lock) is the real-time
// order: a partition acquired while another member holds it is a partition with two owners.
type ownershipChecker struct {
	mu         sync.Mutex
	owner      map[tpart]string
	since      map[tpart]time.Time
	intervals  map[tpart][]ownInterval
	violations []string
}

type ownInterval struct {
	member     string
	start, end time.Time
}

func newOwnershipChecker() *ownershipChecker {
	return &ownershipChecker{owner: map[tpart]string{}, since: map[tpart]time.Time{}, intervals: map[tpart][]ownInterval{}}
}

func (c *ownershipChecker) acquire(p tpart, who string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if o, ok := c.owner[p]; ok && o != who {
		c.violations = append(c.violations, fmt.Sprintf("%v: %s got it while %s held it since %v", p, who, o, c.since[p].Format("15:04:05.000")))
		return
	}
	c.owner[p], c.since[p] = who, time.Now()
}

func (c *ownershipChecker) release(p tpart, who string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.owner[p] == who {
		c.intervals[p] = append(c.intervals[p], ownInterval{who, c.since[p], time.Now()})
		delete(c.owner, p)
	}
}

// snapshot returns who holds what now.
func (c *ownershipChecker) snapshot() map[tpart]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[tpart]string, len(c.owner))
	for p, o := range c.owner {
		out[p] = o
	}
	return out
}

func (c *ownershipChecker) problems() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.violations)
}

// simMember is a group member speaking the raw heartbeat protocol as the SDK must: one heartbeat in
// flight at a time, owned partitions in full on every heartbeat, revocations honoured (after a delay,
// to play a slow application) and acknowledged at once, and everything dropped when it cannot be sure it
// is still a member (no answer for a session timeout, or a revocation not acknowledged within the
// rebalance timeout), since the coordinator may then have handed its partitions out.
type simMember struct {
	name, group, instance string
	topics                []string
	regex                 string
	groups                runnelv1.GroupsClient
	check                 *ownershipChecker
	session, rebalance    time.Duration
	maxRevokeDelay        time.Duration // revocations finish after a random delay up to this
	commitOnRevoke        bool
	startDelay            time.Duration // before the first heartbeat, to spread members' heartbeat phases
	reconcilingInterval   time.Duration // the broker's ReconcilingHeartbeatInterval: any other means reconciled
	rng                   *rand.Rand

	stopCh chan stopMode
	done   chan struct{}

	mu         sync.Mutex // guards the fields below for readers outside the member's goroutine
	memberID   string
	epoch      int32
	owned      map[tpart]bool
	joinSent   time.Time
	firstOwned time.Time // when the first partition arrived after the last join
	reconciled time.Time // when an answer first said it is reconciled (normal interval) while owning something
	errs       []string
}

type stopMode int

const (
	stopCrash       stopMode = iota // the process dies: no more heartbeats
	stopLeave                       // leaves for good (-1)
	stopStaticLeave                 // leaves for now (-2)
)

func (m *simMember) start() {
	m.stopCh, m.done = make(chan stopMode, 1), make(chan struct{})
	m.mu.Lock()
	m.memberID, m.epoch, m.owned = "", 0, map[tpart]bool{}
	m.firstOwned, m.reconciled, m.joinSent = time.Time{}, time.Time{}, time.Time{}
	m.mu.Unlock()
	go m.run()
}

// stop ends the member's goroutine the given way and waits for it.
func (m *simMember) stop(mode stopMode) {
	m.stopCh <- mode
	<-m.done
}

func (m *simMember) ownedList() []tpart {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []tpart
	for p := range m.owned {
		out = append(out, p)
	}
	return out
}

func (m *simMember) id() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.memberID
}

func (m *simMember) run() {
	defer close(m.done)
	var (
		lastOK    time.Time               // send time of the last heartbeat that got an answer
		revoking  = map[tpart]time.Time{} // partitions to release, and when
		unacked   = map[tpart]bool{}      // asked to revoke, no heartbeat without them answered yet
		revokeBy  time.Time
		next      = time.Now().Add(m.startDelay)
		joined    bool
		heartbeat = 5 * time.Second
	)
	loseAll := func() {
		for _, p := range m.ownedList() {
			m.check.release(p, m.name)
		}
		m.mu.Lock()
		m.owned, m.memberID, m.epoch = map[tpart]bool{}, "", 0
		m.mu.Unlock()
		clear(revoking)
		clear(unacked)
		revokeBy, joined = time.Time{}, false
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		wake := next
		for _, at := range revoking {
			if at.Before(wake) {
				wake = at
			}
		}
		timer.Reset(time.Until(wake))
		select {
		case mode := <-m.stopCh:
			owned := m.ownedList()
			for _, p := range owned {
				m.check.release(p, m.name)
			}
			if mode != stopCrash && joined {
				epoch := int32(-1)
				if mode == stopStaticLeave && m.instance != "" {
					epoch = -2
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := m.groups.Heartbeat(ctx, &runnelv1.GroupHeartbeatRequest{GroupId: m.group, MemberId: m.id(), MemberEpoch: epoch, InstanceId: m.instance})
				cancel()
				if err != nil {
					m.fail("leave: %v", err)
				}
			}
			m.mu.Lock()
			m.owned = map[tpart]bool{}
			m.mu.Unlock()
			return
		case <-timer.C:
		}
		now := time.Now()
		// Margins cover scheduling delays: the member must give up strictly before the coordinator's
		// deadline, which is measured from when the coordinator received the heartbeat.
		if joined && (now.Sub(lastOK) > m.session*3/4 || !revokeBy.IsZero() && now.After(revokeBy.Add(-m.rebalance/4))) {
			loseAll()
		}
		acked := false
		for p, at := range revoking {
			if !now.Before(at) {
				if m.commitOnRevoke {
					m.commit(p)
				}
				m.check.release(p, m.name)
				m.mu.Lock()
				delete(m.owned, p)
				m.mu.Unlock()
				delete(revoking, p)
				acked = true
			}
		}
		if now.Before(next) && !acked {
			continue
		}
		req := &runnelv1.GroupHeartbeatRequest{GroupId: m.group, MemberId: m.id(), InstanceId: m.instance, SubscriptionUnchanged: true,
			SessionTimeoutMs: int32(m.session / time.Millisecond), RebalanceTimeoutMs: int32(m.rebalance / time.Millisecond)}
		owned := m.ownedList()
		sort.Slice(owned, func(i, j int) bool { return owned[i].String() < owned[j].String() })
		for _, p := range owned {
			if n := len(req.OwnedPartitions); n > 0 && req.OwnedPartitions[n-1].Topic == p.topic {
				req.OwnedPartitions[n-1].Partitions = append(req.OwnedPartitions[n-1].Partitions, p.part)
			} else {
				req.OwnedPartitions = append(req.OwnedPartitions, &runnelv1.TopicPartitions{Topic: p.topic, Partitions: []int32{p.part}})
			}
		}
		if joined {
			m.mu.Lock()
			req.MemberEpoch = m.epoch
			m.mu.Unlock()
		} else {
			req.MemberId, req.OwnedPartitions, req.SubscriptionUnchanged = "", nil, false
			req.SubscribedTopicNames, req.SubscribedTopicRegex = m.topics, m.regex
		}
		sent := time.Now()
		if !joined {
			m.mu.Lock()
			m.joinSent, m.firstOwned, m.reconciled = sent, time.Time{}, time.Time{}
			m.mu.Unlock()
		}
		ctx, cancel := context.WithTimeout(context.Background(), m.session/2)
		resp, err := m.groups.Heartbeat(ctx, req)
		cancel()
		if err != nil {
			err = rerr.FromStatus(err)
			var e *rerr.Error
			switch {
			case errors.As(err, &e) && (e.Code == runnelv1.ErrorCode_UNKNOWN_MEMBER_ID || e.Code == runnelv1.ErrorCode_FENCED_MEMBER_EPOCH ||
				e.Code == runnelv1.ErrorCode_FENCED_INSTANCE_ID):
				loseAll()
				next = time.Now()
			case errors.As(err, &e) && e.Code == runnelv1.ErrorCode_UNRELEASED_INSTANCE_ID:
				next = time.Now().Add(100 * time.Millisecond) // the previous incarnation has not timed out yet
			default:
				m.fail("heartbeat: %v", err)
				next = time.Now().Add(100 * time.Millisecond)
			}
			continue
		}
		joined, lastOK = true, sent
		m.mu.Lock()
		m.memberID, m.epoch = resp.MemberId, resp.MemberEpoch
		m.mu.Unlock()
		heartbeat = time.Duration(resp.HeartbeatIntervalMs) * time.Millisecond
		next = time.Now().Add(heartbeat)
		ackedAll := true
		for _, p := range owned {
			if unacked[p] {
				ackedAll = false
			}
		}
		if ackedAll {
			clear(unacked)
			revokeBy = time.Time{}
		}
		if resp.Assignment != nil {
			asg := map[tpart]bool{}
			for _, tps := range resp.Assignment.Partitions {
				for _, n := range tps.Partitions {
					asg[tpart{tps.Topic, n}] = true
				}
			}
			for _, p := range m.ownedList() {
				if !asg[p] {
					if _, ok := revoking[p]; !ok {
						revoking[p] = time.Now().Add(time.Duration(m.rng.Int64N(int64(m.maxRevokeDelay) + 1)))
					}
					unacked[p] = true
					if revokeBy.IsZero() {
						revokeBy = sent.Add(m.rebalance)
					}
				}
			}
			for p := range asg {
				m.mu.Lock()
				has := m.owned[p]
				m.mu.Unlock()
				if !has {
					m.check.acquire(p, m.name)
					m.mu.Lock()
					m.owned[p] = true
					if m.firstOwned.IsZero() {
						m.firstOwned = time.Now()
					}
					m.mu.Unlock()
				}
			}
		}
		m.mu.Lock()
		if m.reconciled.IsZero() && len(m.owned) > 0 && len(revoking) == 0 && heartbeat != m.reconcilingInterval {
			m.reconciled = time.Now()
		}
		m.mu.Unlock()
	}
}

// commit commits offset 0 of p with the member's epoch, as the SDK commits on revocation.
func (m *simMember) commit(p tpart) {
	m.mu.Lock()
	req := &runnelv1.CommitOffsetsRequest{GroupId: m.group, MemberId: m.memberID, MemberEpoch: m.epoch,
		Partitions: []*runnelv1.CommitPartition{{Topic: p.topic, Partition: p.part, Offset: 0, LeaderEpoch: -1}}}
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := m.groups.CommitOffsets(ctx, req)
	if err != nil {
		m.fail("commit %v: %v", p, rerr.FromStatus(err))
		return
	}
	if e := rerr.FromInfo(resp.Partitions[0].Error); e != nil {
		m.fail("commit %v: %v", p, e)
	}
}

func (m *simMember) fail(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.errs = append(m.errs, fmt.Sprintf(format, args...))
}

func (m *simMember) problems() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.errs)
}

// waitFor polls cond until it returns "" (satisfied) or the timeout passes, then fails with its last
// answer.
func waitFor(t testing.TB, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	why := ""
	for time.Now().Before(deadline) {
		if why = cond(); why == "" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("not within %v: %s", timeout, why)
}

// describeGroup returns the group as the coordinator sees it.
func describeGroup(t testing.TB, groups runnelv1.GroupsClient, id string) *runnelv1.GroupDescription {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := groups.DescribeGroups(ctx, &runnelv1.DescribeGroupsRequest{GroupIds: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Groups[0]
}

// converged says why a group is not yet stable with exactly the given live members each owning (from
// its own view) its target, all partitions covered and counts within one; "" when it is.
func converged(t testing.TB, groups runnelv1.GroupsClient, id string, live []*simMember, partitions int) string {
	d := describeGroup(t, groups, id)
	if d.State != "stable" {
		return "state " + d.State
	}
	if len(d.Members) != len(live) {
		return fmt.Sprintf("%d members, %d live", len(d.Members), len(live))
	}
	targets := map[string]int{}
	for _, md := range d.Members {
		n := 0
		for _, tps := range md.TargetAssignment {
			n += len(tps.Partitions)
		}
		targets[md.MemberId] = n
	}
	total, lo, hi := 0, partitions, 0
	for _, m := range live {
		n := len(m.ownedList())
		if n != targets[m.id()] {
			return fmt.Sprintf("%s owns %d of its %d", m.name, n, targets[m.id()])
		}
		total += n
		lo, hi = min(lo, n), max(hi, n)
	}
	if total != partitions || hi-lo > 1 {
		return fmt.Sprintf("owned %d of %d partitions, counts %d..%d", total, partitions, lo, hi)
	}
	return ""
}

func joinProblems(ms []*simMember, c *ownershipChecker) string {
	var out []string
	out = append(out, c.problems()...)
	for _, m := range ms {
		for _, p := range m.problems() {
			out = append(out, m.name+": "+p)
		}
	}
	return strings.Join(out, "\n")
}
