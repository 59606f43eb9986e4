package group

import (
	"hash/fnv"
	"regexp"
	"slices"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/group/assignor"
	"github.com/runnel-io/runnel/broker/topiccfg"
)

// hbRequest is a heartbeat that passed the checks that need no group state.
type hbRequest struct {
	groupID, memberID, instanceID, rackID string
	epoch                                 int32
	rebalanceTimeout, sessionTimeout      time.Duration // 0: not given
	setSub                                bool          // the subscription below replaces the member's
	names                                 []string      // sorted, unique
	regex                                 string
	re                                    *regexp.Regexp
	assignor                              string // "": not given
	owned                                 parts
}

// parseHeartbeat checks everything about req that does not depend on the group.
func (c *Coordinator) parseHeartbeat(req *runnelv1.GroupHeartbeatRequest) (*hbRequest, error) {
	bad := func(format string, args ...any) error {
		return rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, format, args...)
	}
	if err := validGroupID(req.GroupId); err != nil {
		return nil, err
	}
	hb := &hbRequest{groupID: req.GroupId, memberID: req.MemberId, instanceID: req.InstanceId, rackID: req.RackId,
		epoch: req.MemberEpoch, assignor: req.ServerAssignor}
	for _, f := range []struct{ what, v string }{{"member id", req.MemberId}, {"instance id", req.InstanceId}, {"rack id", req.RackId}} {
		if err := validID(f.what, f.v); err != nil {
			return nil, err
		}
	}
	switch {
	case hb.epoch < StaticLeaveEpoch:
		return nil, bad("member epoch %d: want 0 to join, -1 or -2 to leave, or the epoch last received", hb.epoch)
	case hb.epoch != JoinEpoch && hb.memberID == "":
		return nil, bad("member id is empty; only a joining member (epoch 0) may leave it empty")
	case hb.epoch == StaticLeaveEpoch && hb.instanceID == "":
		return nil, bad("member epoch -2 (leave for now) is for static members, and the request has no instance id")
	}
	if req.RebalanceTimeoutMs < 0 || time.Duration(req.RebalanceTimeoutMs)*time.Millisecond > c.cfg.MaxRebalanceTimeout {
		return nil, bad("rebalance timeout %d ms outside [0, %d]", req.RebalanceTimeoutMs, c.cfg.MaxRebalanceTimeout.Milliseconds())
	}
	hb.rebalanceTimeout = time.Duration(req.RebalanceTimeoutMs) * time.Millisecond
	if req.SessionTimeoutMs != 0 {
		d := time.Duration(req.SessionTimeoutMs) * time.Millisecond
		if d < c.cfg.MinSessionTimeout || d > c.cfg.MaxSessionTimeout {
			return nil, rerr.New(runnelv1.ErrorCode_INVALID_SESSION_TIMEOUT, "session timeout %d ms outside the broker's bounds [%d, %d] ms",
				req.SessionTimeoutMs, c.cfg.MinSessionTimeout.Milliseconds(), c.cfg.MaxSessionTimeout.Milliseconds())
		}
		hb.sessionTimeout = d
	}
	if hb.assignor != "" {
		if _, ok := assignor.Get(hb.assignor); !ok {
			return nil, rerr.New(runnelv1.ErrorCode_UNSUPPORTED_ASSIGNOR, "server assignor %q: this broker has %v", hb.assignor, assignor.Names())
		}
	}
	hasSub := len(req.SubscribedTopicNames) > 0 || req.SubscribedTopicRegex != ""
	switch {
	case req.SubscriptionUnchanged && hasSub:
		return nil, bad("subscription_unchanged is set, and so is a subscription")
	case req.SubscriptionUnchanged && hb.epoch == JoinEpoch:
		return nil, bad("a joining member must send its subscription (subscription_unchanged is set)")
	case len(req.SubscribedTopicNames) > 0 && req.SubscribedTopicRegex != "":
		return nil, bad("subscribe by topic names or by a regular expression, not both")
	case len(req.SubscribedTopicNames) > c.cfg.MaxSubscribedTopics:
		return nil, bad("subscription of %d topic names; at most %d (use a regular expression)", len(req.SubscribedTopicNames), c.cfg.MaxSubscribedTopics)
	}
	hb.setSub = !req.SubscriptionUnchanged && hb.epoch >= JoinEpoch
	if hb.setSub {
		for _, n := range req.SubscribedTopicNames {
			if err := topiccfg.ValidateTopicName(n); err != nil {
				return nil, bad("subscribed topic: %s", rerr.FromError(err).Message)
			}
		}
		hb.names = slices.Compact(slices.Sorted(slices.Values(req.SubscribedTopicNames)))
		if req.SubscribedTopicRegex != "" {
			re, err := compileRegex(req.SubscribedTopicRegex)
			if err != nil {
				return nil, err
			}
			hb.regex, hb.re = req.SubscribedTopicRegex, re
		}
	}
	owned, err := partsFromProto("owned partitions", req.OwnedPartitions, MaxOwnedPartitions)
	if err != nil {
		return nil, err
	}
	hb.owned = owned
	return hb, nil
}

// Heartbeat handles one GroupHeartbeat (KIP-848): a join (member epoch 0), a heartbeat of a member (its
// current epoch), or a leave (-1, or -2 for a static member coming back). It returns the answer and
// the records to make durable before the answer is sent.
//
// On every heartbeat the member's target assignment is brought forward one step: partitions it must
// give up are left out of the answer's assignment and stay pending until a heartbeat's owned_partitions
// no longer lists them (or the rebalance timeout removes the member); only then does the member move to
// the assignment epoch, and only partitions that no other member owns are added to it. So no partition
// ever has two owners, and a member keeps its other partitions throughout.
//
// Errors (the group is then unchanged): COORDINATOR_LOAD_IN_PROGRESS, INVALID_GROUP_ID, INVALID_REQUEST,
// INVALID_SESSION_TIMEOUT, UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION, UNKNOWN_MEMBER_ID,
// FENCED_MEMBER_EPOCH, FENCED_INSTANCE_ID, UNRELEASED_INSTANCE_ID, GROUP_MAX_SIZE_REACHED.
func (c *Coordinator) Heartbeat(now time.Time, req *runnelv1.GroupHeartbeatRequest, client ClientInfo) (*runnelv1.GroupHeartbeatResponse, []Record, error) {
	if err := c.loadErr(); err != nil {
		return nil, nil, err
	}
	hb, err := c.parseHeartbeat(req)
	if err != nil {
		return nil, nil, err
	}
	var resp *runnelv1.GroupHeartbeatResponse
	switch {
	case hb.epoch < 0:
		resp, err = c.leave(now, hb)
	case hb.epoch == JoinEpoch:
		resp, err = c.join(now, hb, client)
	default:
		resp, err = c.heartbeat(now, hb)
	}
	if err != nil {
		return nil, nil, err // every path checks before it changes anything
	}
	c.assertInvariants()
	return resp, c.flush(), nil
}

// findMember finds the member a heartbeat with a non-zero epoch comes from.
func (c *Coordinator) findMember(hb *hbRequest) (*group, *member, error) {
	g := c.groups[hb.groupID]
	if g == nil {
		return nil, nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_MEMBER_ID, "group %q has no member %q (the group does not exist)", hb.groupID, hb.memberID)
	}
	if hb.instanceID != "" {
		if sm := g.byInstance[hb.instanceID]; sm != nil && sm.id != hb.memberID {
			return nil, nil, rerr.New(runnelv1.ErrorCode_FENCED_INSTANCE_ID, "instance id %q now belongs to member %q, not %q", hb.instanceID, sm.id, hb.memberID)
		}
	}
	m := g.members[hb.memberID]
	if m == nil {
		return nil, nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_MEMBER_ID, "group %q has no member %q; rejoin with member epoch 0", hb.groupID, hb.memberID)
	}
	if m.instanceID != hb.instanceID {
		return nil, nil, rerr.New(runnelv1.ErrorCode_FENCED_INSTANCE_ID, "member %q has instance id %q, the request says %q", m.id, m.instanceID, hb.instanceID)
	}
	return g, m, nil
}

func (c *Coordinator) leave(now time.Time, hb *hbRequest) (*runnelv1.GroupHeartbeatResponse, error) {
	g, m, err := c.findMember(hb)
	if err != nil {
		return nil, err
	}
	resp := &runnelv1.GroupHeartbeatResponse{MemberId: m.id, MemberEpoch: hb.epoch}
	if hb.epoch == LeaveEpoch {
		c.removeMember(g, m, now)
		c.refresh(g)
		c.ensureTarget(g)
		return resp, nil
	}
	if !m.departed {
		// The member has stopped: what it was revoking is released; what it keeps stays reserved for
		// one session timeout from now.
		m.departed = true
		c.release(g, m, m.pending)
		m.pending = nil
		if m.state == stateUnrevoked {
			m.state = stateStable
		}
		c.touchMember(m, now)
		c.markMember(g, m)
	}
	return resp, nil
}

func (c *Coordinator) join(now time.Time, hb *hbRequest, client ClientInfo) (*runnelv1.GroupHeartbeatResponse, error) {
	g := c.groups[hb.groupID]
	created := g == nil
	if created {
		g = newGroup(hb.groupID)
	}
	var m, replaced *member
	if hb.instanceID != "" {
		if old := g.byInstance[hb.instanceID]; old != nil {
			switch {
			case old.departed:
				replaced = old
			case old.id == hb.memberID:
				m = old
			default:
				return nil, rerr.New(runnelv1.ErrorCode_UNRELEASED_INSTANCE_ID,
					"instance id %q is in use by member %q, until it leaves or its session times out", hb.instanceID, old.id)
			}
		}
	}
	if hb.memberID != "" && m == nil {
		if ex := g.members[hb.memberID]; ex != nil && ex != replaced {
			if ex.instanceID != hb.instanceID {
				return nil, rerr.New(runnelv1.ErrorCode_FENCED_INSTANCE_ID, "member id %q belongs to a member with instance id %q", hb.memberID, ex.instanceID)
			}
			m = ex
		}
	}
	if m == nil && replaced == nil && len(g.members) >= c.cfg.MaxGroupSize {
		return nil, rerr.New(runnelv1.ErrorCode_GROUP_MAX_SIZE_REACHED, "group %q has %d members, the most allowed", g.id, len(g.members))
	}

	// Checked; from here on the group changes.
	if created {
		c.groups[g.id] = g
		c.markGroup(g)
	}
	newSub := false
	switch {
	case m != nil:
		// A member that joins again has dropped everything it owned (it was fenced, or restarted with
		// its id). Its target stays: it gets those partitions back at once.
		c.release(g, m, m.assigned)
		c.release(g, m, m.pending)
		m.assigned, m.pending, m.state, m.epoch = nil, nil, stateStable, 0
	case replaced != nil:
		// A static member comes back: it takes the place of the one that left, with its assignment and
		// epoch, and the group does not rebalance.
		m = replaced
		if id := hb.memberID; id != m.id {
			if id == "" {
				id = c.newMemberID(g)
			}
			c.renameMember(g, m, id)
		}
		m.departed = false
	default:
		id := hb.memberID
		if id == "" {
			id = c.newMemberID(g)
		}
		m = &member{id: id, instanceID: hb.instanceID, sessionTimeout: c.cfg.SessionTimeout, rebalanceTimeout: c.cfg.RebalanceTimeout}
		g.members[id] = m
		if m.instanceID != "" {
			g.byInstance[m.instanceID] = m
		}
		g.emptySince = time.Time{}
		newSub = true
		c.bump(g)
	}
	m.clientID, m.clientHost = client.ClientID, client.ClientHost
	c.markMember(g, m)
	return c.step(now, g, m, hb, newSub, true), nil
}

// newMemberID returns a member id not in use in g.
func (c *Coordinator) newMemberID(g *group) string {
	for {
		if id := c.cfg.NewMemberID(); id != "" && g.members[id] == nil {
			return id
		}
	}
}

// renameMember gives m a new id, keeping its place: target, partitions, instance id.
func (c *Coordinator) renameMember(g *group, m *member, id string) {
	old := m.id
	delete(g.members, old)
	delete(g.dirtyMems, old)
	g.removed[old] = true
	m.id = id
	m.persisted = nil
	g.members[id] = m
	g.target[id] = g.target[old]
	delete(g.target, old)
	for _, k := range m.assigned.union(m.pending).list() {
		g.owners[k] = id
	}
	c.markMember(g, m)
}

func (c *Coordinator) heartbeat(now time.Time, hb *hbRequest) (*runnelv1.GroupHeartbeatResponse, error) {
	g, m, err := c.findMember(hb)
	if err != nil {
		return nil, err
	}
	if m.departed {
		return nil, rerr.New(runnelv1.ErrorCode_FENCED_MEMBER_EPOCH, "member %q left the group (epoch -2); rejoin with member epoch 0", m.id)
	}
	lost := false
	if hb.epoch != m.epoch {
		// The answer that moved the member to its epoch may have been lost: accept the epoch before
		// when the member claims nothing it no longer has (KIP-848).
		if hb.epoch != m.prevEpoch || !hb.owned.subsetOf(m.assigned) {
			return nil, rerr.New(runnelv1.ErrorCode_FENCED_MEMBER_EPOCH, "member %q is at epoch %d, the request says %d; rejoin with member epoch 0", m.id, m.epoch, hb.epoch)
		}
		lost = true
	}
	return c.step(now, g, m, hb, false, lost), nil
}

// step applies a checked join or heartbeat to m: settings and subscription, session timer, the target
// assignment if it moved, and one reconciliation step. forceAssignment puts the full assignment in the
// answer even when it did not change (joins, and answers that may have been lost).
func (c *Coordinator) step(now time.Time, g *group, m *member, hb *hbRequest, newSub, forceAssignment bool) *runnelv1.GroupHeartbeatResponse {
	wasReconciling := forceAssignment || m.state != stateStable || m.epoch != g.assignmentEpoch
	if hb.rackID != "" && hb.rackID != m.rackID {
		m.rackID = hb.rackID
		c.markMember(g, m)
	}
	if hb.sessionTimeout != 0 && hb.sessionTimeout != m.sessionTimeout {
		m.sessionTimeout = hb.sessionTimeout
		c.markMember(g, m)
	}
	if hb.rebalanceTimeout != 0 && hb.rebalanceTimeout != m.rebalanceTimeout {
		m.rebalanceTimeout = hb.rebalanceTimeout
		c.markMember(g, m)
	}
	inputs := newSub
	if hb.assignor != "" && hb.assignor != m.assignor {
		m.assignor = hb.assignor
		inputs = true
		c.markMember(g, m)
	}
	if hb.setSub && (!slices.Equal(hb.names, m.names) || hb.regex != m.regex) {
		m.names, m.regex, m.re = hb.names, hb.regex, hb.re
		c.resolve(m)
		c.bump(g) // a subscription change is a new group epoch even if the topics stay the same (KIP-848)
		inputs = true
		c.markMember(g, m)
	}
	if inputs {
		c.resolve(m)
		c.refresh(g)
	}
	c.ensureTarget(g)
	c.touchMember(m, now)

	epoch, assigned := m.epoch, m.assigned
	c.reconcile(g, m, hb.owned, now)
	include := forceAssignment || epoch != m.epoch || !assigned.equal(m.assigned) || !hb.owned.equal(m.assigned)

	interval := c.cfg.HeartbeatInterval
	switch {
	case m.state != stateStable || m.epoch != g.assignmentEpoch:
		interval = c.cfg.ReconcilingHeartbeatInterval
	case wasReconciling:
		// Members that finish reconciling together would heartbeat together ever after, and a joining
		// member waits for donors to hear that they must revoke: the first interval after reconciling is
		// a fraction (10-100%, fixed per member and epoch) of the full one, which spreads the members'
		// heartbeats over the interval, so the donors chosen (those due soonest) hear it soon.
		interval = phaseInterval(interval, m.id, m.epoch)
	}
	// Leave room for two lost heartbeats within the session timeout.
	interval = max(min(interval, m.sessionTimeout/3), time.Millisecond)
	m.nextHeartbeat = now.Add(interval)
	resp := &runnelv1.GroupHeartbeatResponse{MemberId: m.id, MemberEpoch: m.epoch, HeartbeatIntervalMs: int32(interval / time.Millisecond)}
	if include {
		resp.Assignment = &runnelv1.Assignment{Partitions: m.assigned.proto()}
	}
	return resp
}

// reconcile moves m one step towards its target (KIP-848's CurrentAssignmentBuilder):
//
//   - unrevoked: once owned no longer holds any pending partition, those are freed and m goes on;
//   - behind the assignment epoch: partitions outside the target that the request still lists as owned
//     become pending revocation (m stays at its epoch, state unrevoked, rebalance timer running); those
//     it does not list are freed at once; with none left to revoke, m moves to the assignment epoch;
//   - at the assignment epoch: every target partition nobody owns is added; if some are still owned by
//     others, m is unreleased and picks them up on a later heartbeat.
func (c *Coordinator) reconcile(g *group, m *member, owned parts, now time.Time) {
	target := g.target[m.id]
	if m.state == stateUnrevoked {
		if owned.intersects(m.pending) {
			return
		}
		c.release(g, m, m.pending)
		m.pending, m.state = nil, stateStable
		c.markMember(g, m)
	}
	if m.epoch != g.assignmentEpoch {
		if revoke := m.assigned.minus(target); len(revoke) > 0 {
			// What the member says it no longer owns is free at once: it sends one heartbeat at a time,
			// so it cannot come to own those partitions again without being told. It has to revoke the
			// rest before it may move on.
			m.assigned = m.assigned.intersect(target)
			held := revoke.intersect(owned)
			c.release(g, m, revoke.minus(held))
			c.markMember(g, m)
			if len(held) > 0 {
				m.pending, m.state = held, stateUnrevoked
				m.rebalanceDeadline = now.Add(m.rebalanceTimeout)
				c.noteDeadline(m.rebalanceDeadline)
				return
			}
		}
		m.prevEpoch, m.epoch = m.epoch, g.assignmentEpoch
		c.markMember(g, m)
	}
	waiting := false
	missing := target.minus(m.assigned)
	if len(missing) > 0 {
		assigned := m.assigned.clone()
		for _, k := range missing.list() {
			if g.owners[k] != "" {
				waiting = true
				continue
			}
			g.owners[k] = m.id
			assigned = assigned.with(k)
		}
		if !assigned.equal(m.assigned) {
			m.assigned = assigned
			c.markMember(g, m)
		}
	}
	state := stateStable
	if waiting {
		state = stateUnreleased
	}
	if state != m.state {
		m.state = state
		c.markMember(g, m)
	}
}

// phaseInterval returns between 10% and 100% of interval, chosen by a hash of the member id and epoch:
// deterministic, and spread evenly over members.
func phaseInterval(interval time.Duration, memberID string, epoch int32) time.Duration {
	h := fnv.New64a()
	h.Write([]byte(memberID))
	h.Write([]byte{byte(epoch), byte(epoch >> 8), byte(epoch >> 16), byte(epoch >> 24)})
	u := float64(h.Sum64()>>11) / (1 << 53)
	return time.Duration(float64(interval) * (0.1 + 0.9*u))
}
