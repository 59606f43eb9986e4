package group

import (
	"fmt"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// Group states as DescribeGroups and ListGroups report them (KIP-848's consumer group states).
const (
	StateEmpty       = "empty"       // no members
	StateAssigning   = "assigning"   // the group epoch is ahead of the target assignment (never seen outside a call here)
	StateReconciling = "reconciling" // some member has not reached its target yet
	StateStable      = "stable"      // every member owns its target at the assignment epoch
)

func (g *group) state() string {
	switch {
	case g == nil || len(g.members) == 0:
		return StateEmpty
	case g.epoch != g.assignmentEpoch:
		return StateAssigning
	}
	for _, m := range g.members {
		if m.state != stateStable || m.epoch != g.assignmentEpoch {
			return StateReconciling
		}
	}
	return StateStable
}

// known reports whether the coordinator knows group id: it has membership state, committed offsets, or
// durable offsets of a transaction not yet ended.
func (c *Coordinator) known(id string) bool {
	return c.groups[id] != nil || len(c.offsets[id]) > 0 || len(c.openTxns[id]) > 0
}

// Describe returns a group's state, epochs, assignor and members with what each owns (assigned and
// pending revocation) and its target. Members that left as static members and whose partitions are
// reserved show member epoch -2. Unknown groups get GROUP_ID_NOT_FOUND in the description's error,
// invalid ids INVALID_GROUP_ID.
func (c *Coordinator) Describe(id string) *runnelv1.GroupDescription {
	d := &runnelv1.GroupDescription{GroupId: id}
	if err := c.loadErr(); err != nil {
		d.Error = rerr.ToInfo(err)
		return d
	}
	if err := validGroupID(id); err != nil {
		d.Error = rerr.ToInfo(err)
		return d
	}
	if !c.known(id) {
		d.Error = rerr.ToInfo(rerr.New(runnelv1.ErrorCode_GROUP_ID_NOT_FOUND, "group %q does not exist", id))
		return d
	}
	g := c.groups[id]
	d.State = g.state()
	if g == nil {
		return d
	}
	d.GroupEpoch, d.AssignmentEpoch, d.Assignor = g.epoch, g.assignmentEpoch, g.assignor
	for _, mid := range sortedKeys(g.members) {
		m := g.members[mid]
		md := &runnelv1.MemberDescription{MemberId: m.id, InstanceId: m.instanceID, ClientId: m.clientID, ClientHost: m.clientHost,
			MemberEpoch: m.epoch, SubscribedTopicNames: m.names, SubscribedTopicRegex: m.regex,
			Assignment: m.assigned.union(m.pending).proto(), TargetAssignment: g.target[m.id].proto()}
		if m.departed {
			md.MemberEpoch = StaticLeaveEpoch
		}
		d.Members = append(d.Members, md)
	}
	return d
}

// List returns a summary of every known group, sorted by id.
func (c *Coordinator) List() []*runnelv1.GroupSummary {
	if c.loading {
		return nil
	}
	ids := map[string]bool{}
	for id := range c.groups {
		ids[id] = true
	}
	for id := range c.offsets {
		ids[id] = true
	}
	for id := range c.openTxns {
		ids[id] = true
	}
	out := make([]*runnelv1.GroupSummary, 0, len(ids))
	for _, id := range sortedKeys(ids) {
		g := c.groups[id]
		s := &runnelv1.GroupSummary{GroupId: id, State: g.state()}
		if g != nil {
			s.Members = int32(len(g.members))
		}
		out = append(out, s)
	}
	return out
}

// DeleteGroup deletes a group without members: its membership state now, its committed offsets when
// the returned tombstones are applied. Errors: COORDINATOR_LOAD_IN_PROGRESS, INVALID_GROUP_ID,
// GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP (members, including static members that left and whose
// partitions are still reserved; or offsets of a transaction not yet ended, which its marker would
// otherwise install into a deleted group or silently lose: retry once the transaction ends).
func (c *Coordinator) DeleteGroup(now time.Time, id string) ([]Record, error) {
	if err := c.loadErr(); err != nil {
		return nil, err
	}
	if err := validGroupID(id); err != nil {
		return nil, err
	}
	if !c.known(id) && len(c.pending[id]) == 0 {
		return nil, rerr.New(runnelv1.ErrorCode_GROUP_ID_NOT_FOUND, "group %q does not exist", id)
	}
	if g := c.groups[id]; g != nil && len(g.members) > 0 {
		return nil, rerr.New(runnelv1.ErrorCode_NON_EMPTY_GROUP, "group %q has %d member(s)", id, len(g.members))
	}
	if n := c.PendingTxnOffsets(id); n > 0 {
		return nil, rerr.New(runnelv1.ErrorCode_NON_EMPTY_GROUP, "group %q holds offsets of %d partition(s) in transactions not yet ended", id, n)
	}
	c.deleteGroup(id)
	c.assertInvariants()
	return c.flush(), nil
}

// Check verifies the coordinator's invariants and returns the first violation:
//
//   - every partition some member owns (assigned or pending revocation) is owned by that member alone,
//     and the owners index says exactly that: no partition has two owners;
//   - targets are disjoint, a member's epoch is at most the assignment epoch, which is at most the group
//     epoch; a member revoking has partitions to revoke, and only it does; a member at the assignment
//     epoch that is not revoking owns only target partitions;
//   - the instance id index matches the members;
//   - pending transactional offsets are indexed by group, and in-flight ones are counted as commits.
func (c *Coordinator) Check() error {
	if err := c.checkTxns(); err != nil {
		return err
	}
	for _, gid := range sortedKeys(c.groups) {
		g := c.groups[gid]
		owners := map[tp]string{}
		targeted := map[tp]string{}
		for _, mid := range sortedKeys(g.members) {
			m := g.members[mid]
			if m.id != mid {
				return fmt.Errorf("group %q: member %q indexed as %q", gid, m.id, mid)
			}
			for _, k := range m.assigned.union(m.pending).list() {
				if o, dup := owners[k]; dup {
					return fmt.Errorf("group %q: %s-%d owned by %q and %q", gid, k.topic, k.part, o, mid)
				}
				owners[k] = mid
				if g.owners[k] != mid {
					return fmt.Errorf("group %q: %s-%d owned by %q but indexed to %q", gid, k.topic, k.part, mid, g.owners[k])
				}
			}
			if m.assigned.intersects(m.pending) {
				return fmt.Errorf("group %q: member %q both keeps and revokes a partition", gid, mid)
			}
			for _, k := range g.target[mid].list() {
				if o, dup := targeted[k]; dup {
					return fmt.Errorf("group %q: %s-%d targeted to %q and %q", gid, k.topic, k.part, o, mid)
				}
				targeted[k] = mid
			}
			if m.epoch > g.assignmentEpoch || g.assignmentEpoch > g.epoch {
				return fmt.Errorf("group %q: member %q epoch %d, assignment epoch %d, group epoch %d", gid, mid, m.epoch, g.assignmentEpoch, g.epoch)
			}
			if (m.state == stateUnrevoked) != (len(m.pending) > 0) {
				return fmt.Errorf("group %q: member %q is %v with %d partitions pending revocation", gid, mid, m.state, m.pending.size())
			}
			if m.state != stateUnrevoked && m.epoch == g.assignmentEpoch && !m.assigned.subsetOf(g.target[mid]) {
				return fmt.Errorf("group %q: member %q at the assignment epoch owns %v outside its target %v", gid, mid, m.assigned, g.target[mid])
			}
			if m.instanceID != "" && g.byInstance[m.instanceID] != m {
				return fmt.Errorf("group %q: member %q not indexed by its instance id %q", gid, mid, m.instanceID)
			}
			if m.departed && (m.instanceID == "" || len(m.pending) > 0) {
				return fmt.Errorf("group %q: departed member %q is dynamic or revoking", gid, mid)
			}
		}
		if len(owners) != len(g.owners) {
			return fmt.Errorf("group %q: owners index has %d partitions, members own %d", gid, len(g.owners), len(owners))
		}
		for inst, m := range g.byInstance {
			if g.members[m.id] != m || m.instanceID != inst {
				return fmt.Errorf("group %q: instance id %q indexes a stale member %q", gid, inst, m.id)
			}
		}
		for mid := range g.target {
			if g.members[mid] == nil {
				return fmt.Errorf("group %q: target for missing member %q", gid, mid)
			}
		}
	}
	return nil
}

// assertInvariants runs Check where invariants shout: in tests and -race builds a violation panics;
// in production the check is skipped (it walks every partition of every group).
func (c *Coordinator) assertInvariants() {
	if !invariantsOn {
		return
	}
	if err := c.Check(); err != nil {
		panic(fmt.Sprintf("group coordinator invariant violated: %v", err))
	}
}
