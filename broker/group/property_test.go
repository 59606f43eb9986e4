package group

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// simClient is a member's client process as the property test models it: it follows the heartbeat
// protocol the way the SDK must (see doc.go), and the test checks ownership from its point of view.
type simClient struct {
	alias, instance string
	sub             []string
	regex           string
	assignorName    string
	alive           bool // the process runs
	memberID        string
	epoch           int32
	joined          bool
	owned           parts // what it processes now
	slow            bool  // keeps partitions to revoke until finishRevoke
	// lastOK is when it sent its last heartbeat that got an answer: with no answer for a session
	// timeout since, it must assume it was removed and drop everything.
	lastOK time.Time
	// revoking are partitions it was asked to revoke and still processes (a slow client). unacked are
	// partitions it was asked to revoke and has not yet had a heartbeat without them answered; revokeBy
	// is the send time of the heartbeat that asked, plus the rebalance timeout. If revokeBy passes with
	// unacked partitions, the coordinator may have removed the member: the client drops everything.
	revoking parts
	unacked  parts
	revokeBy time.Time
}

type propModel struct {
	t       *rapid.T
	cfg     Config
	c       *Coordinator
	now     time.Time
	topics  map[string]TopicInfo
	log     []Record
	clients []*simClient
	nextID  int
	// txnEpochs is each producer id's current epoch (missing: 0). KIP-890 part 2: a transaction
	// writes at the current epoch, its end bumps it, the marker carries the bumped epoch, and the
	// next transaction writes at that one.
	txnEpochs map[int64]int16
}

const (
	propSession   = 10 * time.Second
	propRebalance = 5 * time.Second
)

func newPropModel(t *rapid.T) *propModel {
	m := &propModel{t: t, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), txnEpochs: map[int64]int16{}}
	m.cfg = Config{HeartbeatInterval: time.Second, ReconcilingHeartbeatInterval: 100 * time.Millisecond,
		SessionTimeout: propSession, MinSessionTimeout: time.Second, RebalanceTimeout: propRebalance,
		NewMemberID: func() string { m.nextID++; return fmt.Sprintf("m%d", m.nextID) }}
	m.topics = map[string]TopicInfo{"a": {ID: "a1", Partitions: 4}, "b": {ID: "b1", Partitions: 3}, "c": {ID: "c1", Partitions: 2}}
	m.c = New(m.cfg)
	m.persist(m.c.Start(m.now, m.topics))
	subs := [][]string{{"a", "b"}, {"a", "b"}, {"a", "b"}, {"a"}, {"b", "c"}, nil}
	for i, s := range subs {
		cl := &simClient{alias: fmt.Sprintf("c%d", i), sub: s}
		if i == 5 {
			cl.regex = "[ab]"
		}
		if i%2 == 0 {
			cl.instance = fmt.Sprintf("i%d", i)
		}
		if i == 4 {
			cl.assignorName = "range"
		}
		m.clients = append(m.clients, cl)
	}
	return m
}

func (m *propModel) persist(recs []Record) {
	m.log = append(m.log, recs...)
	m.c.Apply(recs)
}

func (m *propModel) send(cl *simClient, req *runnelv1.GroupHeartbeatRequest) (*runnelv1.GroupHeartbeatResponse, error) {
	resp, recs, err := m.c.Heartbeat(m.now, req, ClientInfo{ClientID: cl.alias})
	if err == nil {
		m.persist(recs)
	}
	return resp, err
}

// heartbeat sends cl's heartbeat (joining if it has no member yet) and applies the answer.
func (m *propModel) heartbeat(cl *simClient) {
	req := &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: cl.memberID, MemberEpoch: cl.epoch, InstanceId: cl.instance,
		SubscriptionUnchanged: true, OwnedPartitions: cl.owned.proto(), SessionTimeoutMs: int32(propSession / time.Millisecond)}
	if !cl.joined {
		req.MemberEpoch, req.OwnedPartitions, req.SubscriptionUnchanged = JoinEpoch, nil, false
		req.SubscribedTopicNames, req.SubscribedTopicRegex, req.ServerAssignor = cl.sub, cl.regex, cl.assignorName
	}
	resp, err := m.send(cl, req)
	if err != nil {
		var e *rerr.Error
		if !errors.As(err, &e) {
			m.t.Fatalf("%s: %v", cl.alias, err)
		}
		switch e.Code {
		case runnelv1.ErrorCode_UNKNOWN_MEMBER_ID, runnelv1.ErrorCode_FENCED_MEMBER_EPOCH, runnelv1.ErrorCode_FENCED_INSTANCE_ID:
			// Removed: whatever it held is lost (the coordinator may have handed it out already, which
			// is only safe because the client dropped it by its own deadlines first; see checkViews).
			m.lose(cl)
		case runnelv1.ErrorCode_UNRELEASED_INSTANCE_ID:
			// Its previous incarnation has not timed out yet: try again later.
		default:
			m.t.Fatalf("%s: unexpected %v", cl.alias, err)
		}
		return
	}
	cl.joined, cl.memberID, cl.epoch, cl.lastOK = true, resp.MemberId, resp.MemberEpoch, m.now
	if sent := cl.owned; len(cl.unacked) > 0 && !sent.intersects(cl.unacked) {
		cl.unacked, cl.revokeBy = nil, time.Time{} // the revocation is acknowledged
	}
	if resp.Assignment == nil {
		return
	}
	asg, err := partsFromProto("assignment", resp.Assignment.Partitions, MaxOwnedPartitions)
	if err != nil {
		m.t.Fatal(err)
	}
	if revoke := cl.owned.minus(asg); len(revoke) > 0 {
		cl.unacked = cl.unacked.union(revoke)
		if cl.revokeBy.IsZero() {
			cl.revokeBy = m.now.Add(propRebalance)
		}
		if cl.slow {
			cl.revoking = cl.revoking.union(revoke)
		} else {
			cl.owned = cl.owned.minus(revoke)
		}
	}
	if added := asg.minus(cl.owned); len(added) > 0 {
		cl.owned = cl.owned.union(added)
	}
}

func (m *propModel) lose(cl *simClient) {
	cl.owned, cl.revoking, cl.unacked, cl.revokeBy = nil, nil, nil, time.Time{}
	cl.joined, cl.memberID, cl.epoch = false, "", 0
}

func (m *propModel) finishRevoke(cl *simClient) {
	cl.owned = cl.owned.minus(cl.revoking)
	cl.revoking = nil
}

// advance moves the clock. Clients apply their own deadlines before the coordinator's timers fire at the
// same instant, as a client measuring from its send times always does.
func (m *propModel) advance(d time.Duration) {
	m.now = m.now.Add(d)
	for _, cl := range m.clients {
		if !cl.alive || !cl.joined {
			continue
		}
		// A revocation not acknowledged within the rebalance timeout, or no answer for a session
		// timeout: the member may have been removed, so everything is lost.
		if !cl.revokeBy.IsZero() && !m.now.Before(cl.revokeBy) || !m.now.Before(cl.lastOK.Add(propSession)) {
			m.lose(cl)
		}
	}
	m.persist(m.c.Tick(m.now))
}

// checkViews asserts the invariants after every step: the coordinator's own, and from the members'
// side that no partition is processed by two live clients, and that each client's partitions are ones
// the coordinator has it owning.
func (m *propModel) checkViews() {
	if err := m.c.Check(); err != nil {
		m.t.Fatal(err)
	}
	seen := map[tp]string{}
	g := m.c.groups["g"]
	for _, cl := range m.clients {
		if !cl.alive {
			continue
		}
		for _, k := range cl.owned.list() {
			if other, dup := seen[k]; dup {
				m.t.Fatalf("%s-%d is owned by %s and %s at once", k.topic, k.part, other, cl.alias)
			}
			seen[k] = cl.alias
			var mem *member
			if g != nil {
				mem = g.members[cl.memberID]
			}
			if mem == nil || !mem.owns(k) {
				m.t.Fatalf("%s processes %s-%d, which the coordinator does not have it owning", cl.alias, k.topic, k.part)
			}
		}
	}
}

func TestPropertyOwnership(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newPropModel(t)
		pick := func(t *rapid.T, ok func(*simClient) bool) *simClient {
			var cands []*simClient
			for _, cl := range m.clients {
				if ok(cl) {
					cands = append(cands, cl)
				}
			}
			if len(cands) == 0 {
				t.Skip("no candidate")
			}
			return rapid.SampledFrom(cands).Draw(t, "client")
		}
		t.Repeat(map[string]func(*rapid.T){
			"start": func(t *rapid.T) {
				cl := pick(t, func(c *simClient) bool { return !c.alive })
				cl.alive, cl.slow = true, rapid.Bool().Draw(t, "slow")
				m.lose(cl)
				m.heartbeat(cl)
			},
			"heartbeat": func(t *rapid.T) {
				m.heartbeat(pick(t, func(c *simClient) bool { return c.alive }))
			},
			"finish revoking": func(t *rapid.T) {
				cl := pick(t, func(c *simClient) bool { return c.alive && len(c.revoking) > 0 })
				m.finishRevoke(cl)
				m.heartbeat(cl) // the SDK acknowledges at once
			},
			"leave": func(t *rapid.T) {
				cl := pick(t, func(c *simClient) bool { return c.alive && c.joined })
				epoch := LeaveEpoch
				if cl.instance != "" && rapid.Bool().Draw(t, "for now") {
					epoch = StaticLeaveEpoch
				}
				cl.owned, cl.revoking, cl.unacked = nil, nil, nil // revoke everything before leaving
				_, err := m.send(cl, &runnelv1.GroupHeartbeatRequest{GroupId: "g", MemberId: cl.memberID, MemberEpoch: epoch, InstanceId: cl.instance})
				if err != nil && !errors.Is(err, &rerr.Error{Code: runnelv1.ErrorCode_UNKNOWN_MEMBER_ID}) {
					t.Fatalf("leave: %v", err)
				}
				m.lose(cl)
				cl.alive = false
			},
			"crash": func(t *rapid.T) {
				cl := pick(t, func(c *simClient) bool { return c.alive })
				m.lose(cl)
				cl.alive = false
			},
			"commit": func(t *rapid.T) {
				cl := pick(t, func(c *simClient) bool { return c.alive && c.joined && len(c.owned) > 0 })
				req := &runnelv1.CommitOffsetsRequest{GroupId: "g", MemberId: cl.memberID, MemberEpoch: cl.epoch}
				for _, k := range cl.owned.list() {
					if ti, ok := m.topics[k.topic]; ok && k.part < ti.Partitions { // a deleted topic is not committed
						req.Partitions = append(req.Partitions, &runnelv1.CommitPartition{Topic: k.topic, Partition: k.part, Offset: 1})
					}
				}
				resp, recs, err := m.c.Commit(m.now, req, func(topic string, p int32) (int64, bool) {
					ti, ok := m.topics[topic]
					return 10, ok && p < ti.Partitions
				})
				if err != nil {
					t.Fatalf("%s commits what it owns: %v", cl.alias, err)
				}
				for _, p := range resp.Partitions {
					if p.Error != nil {
						t.Fatalf("%s commits %s-%d: %v", cl.alias, p.Topic, p.Partition, p.Error)
					}
				}
				m.persist(recs)
			},
			// A client commits what it owns in its transaction (KIP-447: fenced like a commit, so a live
			// member is never refused), and the transaction later ends either way.
			"txn commit": func(t *rapid.T) {
				cl := pick(t, func(c *simClient) bool { return c.alive && c.joined && len(c.owned) > 0 })
				pid := int64(slices.Index(m.clients, cl) + 1)
				req := &runnelv1.TxnOffsetCommitRequest{GroupId: "g", TransactionalId: cl.alias, ProducerId: pid, ProducerEpoch: int32(m.txnEpochs[pid]),
					MemberId: cl.memberID, MemberEpoch: cl.epoch}
				for _, k := range cl.owned.list() {
					if ti, ok := m.topics[k.topic]; ok && k.part < ti.Partitions {
						req.Partitions = append(req.Partitions, &runnelv1.CommitPartition{Topic: k.topic, Partition: k.part, Offset: 2})
					}
				}
				resp, recs, err := m.c.TxnOffsetCommit(m.now, req, func(topic string, p int32) (int64, bool) {
					ti, ok := m.topics[topic]
					return 10, ok && p < ti.Partitions
				})
				if err != nil {
					t.Fatalf("%s commits what it owns in a transaction: %v", cl.alias, err)
				}
				for _, p := range resp.Partitions {
					if p.Error != nil {
						t.Fatalf("%s commits %s-%d in a transaction: %v", cl.alias, p.Topic, p.Partition, p.Error)
					}
				}
				m.persist(recs)
			},
			"end txn": func(t *rapid.T) {
				pid := int64(rapid.IntRange(1, len(m.clients)).Draw(t, "producer"))
				epoch := m.txnEpochs[pid] + 1 // the end of the transaction bumps the epoch (KIP-890 part 2)
				recs, err := m.c.Marker(Producer{ID: pid, Epoch: epoch}, rapid.Bool().Draw(t, "commit"))
				if err != nil {
					t.Fatalf("marker of producer %d epoch %d: %v", pid, epoch, err)
				}
				m.txnEpochs[pid] = epoch
				m.persist(recs)
			},
			"advance": func(t *rapid.T) {
				m.advance(time.Duration(rapid.IntRange(1, 4000).Draw(t, "ms")) * time.Millisecond)
			},
			"topics": func(t *rapid.T) {
				name := rapid.SampledFrom([]string{"a", "b", "c", "d"}).Draw(t, "topic")
				ti, ok := m.topics[name]
				switch {
				case !ok:
					m.topics[name] = TopicInfo{ID: name + "-new", Partitions: int32(rapid.IntRange(1, 4).Draw(t, "partitions"))}
				case rapid.Bool().Draw(t, "delete"):
					delete(m.topics, name)
				default:
					ti.Partitions += int32(rapid.IntRange(1, 3).Draw(t, "more"))
					m.topics[name] = ti
				}
				m.persist(m.c.SetTopics(m.now, m.topics))
			},
			"restart coordinator": func(t *rapid.T) {
				c := New(m.cfg)
				for _, rec := range m.log {
					if err := c.Load(rec); err != nil {
						t.Fatal(err)
					}
				}
				want := dumpState(m.c)
				m.c = c
				m.persist(c.Start(m.now, m.topics))
				if got := dumpState(c); got != want {
					t.Fatalf("state after restart:\n%s\nbefore:\n%s", got, want)
				}
			},
			"": func(t *rapid.T) { m.checkViews() },
		})
		m.converge()
	})
}

// converge stops the faults: slow clients finish revoking, every live client heartbeats as told, and
// the clock moves on past every session timeout. The group must then be stable with every live member
// owning exactly its balanced target.
func (m *propModel) converge() {
	for _, cl := range m.clients {
		cl.slow = false
		if len(cl.revoking) > 0 {
			m.finishRevoke(cl)
		}
	}
	for round := 0; round < 200; round++ {
		for _, cl := range m.clients {
			if cl.alive {
				m.heartbeat(cl)
				m.checkViews()
			}
		}
		m.advance(500 * time.Millisecond)
		m.checkViews()
		if round > 2*int(propSession/(500*time.Millisecond)) && m.stable() == "" {
			return
		}
	}
	m.t.Fatalf("no convergence: %s\n%s", m.stable(), dumpState(m.c))
}

// stable says why the group is not converged, or "" when it is.
func (m *propModel) stable() string {
	g := m.c.groups["g"]
	live := 0
	for _, cl := range m.clients {
		if !cl.alive {
			continue
		}
		live++
		if g == nil || g.members[cl.memberID] == nil {
			return cl.alias + " is not a member"
		}
		mem := g.members[cl.memberID]
		if mem.state != stateStable || mem.epoch != g.assignmentEpoch {
			return fmt.Sprintf("%s is %v at epoch %d of %d", cl.alias, mem.state, mem.epoch, g.assignmentEpoch)
		}
		if !cl.owned.equal(g.target[mem.id]) {
			return fmt.Sprintf("%s owns %v, target %v", cl.alias, cl.owned, g.target[mem.id])
		}
	}
	if g == nil {
		return ""
	}
	if len(g.members) != live {
		return fmt.Sprintf("%d members, %d live clients", len(g.members), live)
	}
	return balanced(g)
}

// balanced checks the uniform assignor's promise over a group's target: every subscribed partition is
// assigned, to a subscriber, and no partition could move to another subscriber holding two fewer.
func balanced(g *group) string {
	if g.assignor != "uniform" {
		return ""
	}
	count := map[string]int{}
	owner := map[tp]string{}
	for id, t := range g.target {
		count[id] = t.size()
		for _, k := range t.list() {
			owner[k] = id
		}
	}
	for topic, ti := range g.subMeta {
		for p := int32(0); p < ti.Partitions; p++ {
			k := tp{topic, p}
			o, ok := owner[k]
			if !ok {
				return fmt.Sprintf("%s-%d is not assigned", topic, p)
			}
			for id, mem := range g.members {
				if _, sub := slices.BinarySearch(mem.subscribed, topic); sub && count[id] < count[o]-1 {
					return fmt.Sprintf("unbalanced: %s-%d could move from %s (%d) to %s (%d)", topic, p, o, count[o], id, count[id])
				}
			}
		}
	}
	return ""
}

// TestGroupIDs covers group ids the script format cannot spell.
func TestGroupIDs(t *testing.T) {
	for _, id := range []string{"", "a\x00b", "tab\there", "bad\xffutf8", strings.Repeat("x", MaxIDBytes+1)} {
		if err := validGroupID(id); !errors.Is(err, &rerr.Error{Code: runnelv1.ErrorCode_INVALID_GROUP_ID}) {
			t.Errorf("group id %q: %v", id, err)
		}
	}
	for _, id := range []string{"g", "orders.consumers-1", "группа", strings.Repeat("x", MaxIDBytes)} {
		if err := validGroupID(id); err != nil {
			t.Errorf("group id %q: %v", id, err)
		}
	}
}

// TestPartitionFor pins the group → partition mapping to Kafka's (Java String.hashCode).
func TestPartitionFor(t *testing.T) {
	for _, c := range []struct {
		group string
		want  int32
	}{
		// Java: Math.abs("my-group".hashCode()) % 50 and friends, computed by hand from hashCode.
		{"", 0}, {"a", 97 % 50}, {"ab", (97*31 + 98) % 50},
		{"my-group", absJava(javaHash("my-group")) % 50},
		{"😀", absJava(javaHash("😀")) % 50},
	} {
		if got := PartitionFor(c.group, 50); got != c.want {
			t.Errorf("PartitionFor(%q) = %d, want %d", c.group, got, c.want)
		}
	}
	// "polygenelubricants".hashCode() is Integer.MIN_VALUE: Kafka's Utils.abs makes it 0.
	if javaHash("polygenelubricants") != -1<<31 || PartitionFor("polygenelubricants", 50) != 0 {
		t.Errorf("Integer.MIN_VALUE hash: %d", PartitionFor("polygenelubricants", 50))
	}
}

// javaHash is String.hashCode written out independently (UTF-16 units via surrogate arithmetic).
func javaHash(s string) int32 {
	var h int32
	for _, r := range s {
		if r >= 0x10000 {
			r -= 0x10000
			h = 31*h + int32(0xD800+(r>>10))
			h = 31*h + int32(0xDC00+(r&0x3FF))
			continue
		}
		h = 31*h + int32(r)
	}
	return h
}

func absJava(h int32) int32 {
	if h == -1<<31 {
		return 0
	}
	if h < 0 {
		return -h
	}
	return h
}
