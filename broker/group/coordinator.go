package group

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/group/assignor"
)

// TopicInfo describes one topic as the coordinator needs it.
type TopicInfo struct {
	// ID changes when a topic is deleted and created again under the same name.
	ID         string
	Partitions int32
	// Internal topics are never matched by subscription regexes (Kafka's exclude.internal.topics).
	Internal bool
}

// ClientInfo identifies the client process behind a heartbeat, for DescribeGroups.
type ClientInfo struct {
	ClientID, ClientHost string
}

// LogEndFunc returns the log end offset of a partition, and false when the partition does not exist.
// Commit asks it for every partition it is given.
type LogEndFunc func(topic string, partition int32) (int64, bool)

// member is one member of a group, with its reconciliation state (KIP-848's ConsumerGroupMember).
type member struct {
	id, instanceID, rackID, clientID, clientHost string
	names                                        []string // subscribed topic names, sorted, unique
	regex                                        string
	re                                           *regexp.Regexp // regex anchored to whole names
	assignor                                     string         // asked for; "" for none
	rebalanceTimeout, sessionTimeout             time.Duration
	// epoch is the assignment epoch the member has reconciled to; prevEpoch the one before, accepted once
	// more in case the answer that moved the member on was lost.
	epoch, prevEpoch int32
	state            memberState
	// departed marks a static member that left with epoch -2: its partitions stay reserved until its
	// session timeout or until a member with its instance id joins.
	departed bool
	// assigned are the partitions the member owns and keeps; pending those it owns but must revoke.
	assigned, pending parts

	// Not persisted: derived, or liveness.
	subscribed        []string // existing topics it subscribes to (names and regex matches), sorted
	sessionDeadline   time.Time
	rebalanceDeadline time.Time // while unrevoked
	nextHeartbeat     time.Time // when its next heartbeat is due, for the assignor's donor order
	persisted         []byte    // the value last emitted for it
}

// owns reports whether the member owns k now (assigned or still to be revoked).
func (m *member) owns(k tp) bool { return m.assigned.has(k) || m.pending.has(k) }

// group is one consumer group's membership and assignment state.
type group struct {
	id string
	// epoch bumps on every change of membership, subscriptions, subscribed topics' metadata or assignor;
	// assignmentEpoch is the epoch the target was computed at (it catches up at once: see ensureTarget).
	epoch, assignmentEpoch int32
	assignor               string // in use: the one most members ask for
	members                map[string]*member
	byInstance             map[string]*member
	target                 map[string]parts // member id → target partitions
	// owners maps every partition some member owns (assigned or pending revocation) to that member: a
	// partition is handed out only while it is absent here, which is what keeps it single-owned.
	owners     map[tp]string
	subMeta    map[string]TopicInfo // subscribed topics, as of the last epoch
	emptySince time.Time            // when it lost its last member; zero while it has members

	dirty     bool            // its group record must be re-emitted
	dirtyMems map[string]bool // members whose record must be re-emitted
	removed   map[string]bool // members removed since the last flush: tombstones
	persisted []byte
}

func newGroup(id string) *group {
	return &group{id: id, assignor: assignor.Default, members: map[string]*member{}, byInstance: map[string]*member{},
		target: map[string]parts{}, owners: map[tp]string{}, subMeta: map[string]TopicInfo{},
		dirtyMems: map[string]bool{}, removed: map[string]bool{}}
}

// Coordinator is the deterministic core of the group coordinator for the groups of one
// __consumer_offsets partition. It holds no goroutines and reads no clock: every call gets the time,
// and calls that change state return the records that must be appended to the partition, in order,
// before the call's answer is given. Committed offsets are the exception: Commit validates and returns
// records, and the offsets change only when the caller hands the durable records to Apply.
//
// It is not safe for concurrent use; the broker serialises calls per partition.
type Coordinator struct {
	cfg    Config
	topics map[string]TopicInfo
	groups map[string]*group
	// offsets holds durable commits only: group → partition → commit.
	offsets map[string]map[tp]OffsetCommit
	// pending counts commits accepted but not yet applied, per group and partition, so a group deleted
	// meanwhile also tombstones them.
	pending map[string]map[tp]int

	// Transactional offsets (KIP-98, KIP-447; txn.go). txns holds, per producer id, the highest
	// producer epoch seen and the durable offsets of its transaction still waiting for a marker;
	// openTxns indexes those by group; txnInflight counts transactional offset records accepted and
	// not yet applied. seq numbers the applied offset records in log order.
	txns        map[int64]*txnProducer
	openTxns    map[string]map[int64]bool
	txnInflight map[string]map[tp]int
	seq         uint64

	loading   bool
	loadGroup map[string]groupValue
	loadMems  map[string]map[string]memberValue
	loadRaw   map[string][]byte // encoded key → value, to remember what was persisted
	loadErrs  int

	earliest        time.Time // no member deadline is before this (zero: none)
	nextExpiryCheck time.Time
	touched         map[string]*group
	out             []Record
}

// New returns a coordinator with no state, ready for Load calls; Start ends loading. Until then every
// call fails with COORDINATOR_LOAD_IN_PROGRESS.
func New(cfg Config) *Coordinator {
	return &Coordinator{cfg: cfg.WithDefaults(), topics: map[string]TopicInfo{}, groups: map[string]*group{},
		offsets: map[string]map[tp]OffsetCommit{}, pending: map[string]map[tp]int{}, loading: true,
		txns: map[int64]*txnProducer{}, openTxns: map[string]map[int64]bool{}, txnInflight: map[string]map[tp]int{},
		loadGroup: map[string]groupValue{}, loadMems: map[string]map[string]memberValue{}, loadRaw: map[string][]byte{},
		touched: map[string]*group{}}
}

// Load replays one record of the partition, in log order, while loading. A record that does not decode
// is skipped and returns an error wrapping errCorrupt (the caller logs it); a later record of the same
// key still applies. Records of transactional batches and markers (Record.Producer, Record.Marker) are
// replayed by the rules of Apply: offsets stay pending until their producer's marker.
func (c *Coordinator) Load(rec Record) error {
	if !c.loading {
		return fmt.Errorf("load after start")
	}
	if rec.Producer != nil || rec.Marker != NoMarker {
		return c.loadTxn(rec)
	}
	k, err := decodeKey(rec.Key)
	if err != nil {
		c.loadErrs++
		return err
	}
	switch k.kind {
	case kindOffset:
		return c.applyOffset(k, rec.Value, false)
	case kindGroup:
		if rec.Value == nil {
			delete(c.loadGroup, k.group)
			delete(c.loadMems, k.group)
			return nil
		}
		v, err := decodeGroupValue(rec.Value)
		if err != nil {
			c.loadErrs++
			return fmt.Errorf("group %q: %w", k.group, err)
		}
		c.loadGroup[k.group] = v
	case kindMember:
		ms := c.loadMems[k.group]
		if rec.Value == nil {
			delete(ms, k.member)
			return nil
		}
		v, err := decodeMemberValue(rec.Value)
		if err != nil {
			c.loadErrs++
			return fmt.Errorf("group %q member %q: %w", k.group, k.member, err)
		}
		if ms == nil {
			ms = map[string]memberValue{}
			c.loadMems[k.group] = ms
		}
		ms[k.member] = v
	}
	c.loadRaw[string(rec.Key)] = rec.Value
	return nil
}

// Start ends loading: it rebuilds the groups from the loaded records against the current topics,
// restarts every member's session timer at now (members are not alive until they heartbeat again, and
// are removed when they do not), and returns the records that bring the log up to date: new epochs of
// groups whose subscribed topics changed while nobody was watching, tombstones for offsets of topics
// that no longer exist.
func (c *Coordinator) Start(now time.Time, topics map[string]TopicInfo) []Record {
	if !c.loading {
		return nil
	}
	c.loading = false
	c.topics = maps.Clone(topics)
	for _, gid := range sortedKeys(c.loadGroup) {
		gv := c.loadGroup[gid]
		g := newGroup(gid)
		g.epoch, g.assignmentEpoch, g.assignor = gv.epoch, gv.assignmentEpoch, gv.assignor
		if _, ok := assignor.Get(g.assignor); !ok {
			g.assignor = assignor.Default
		}
		for _, t := range gv.topics {
			g.subMeta[t.name] = TopicInfo{ID: t.id, Partitions: t.partitions}
		}
		g.persisted = c.loadRaw[string(groupKey(gid).encode())]
		mems := c.loadMems[gid]
		for _, mid := range sortedKeys(mems) {
			mv := mems[mid]
			m := &member{id: mid, instanceID: mv.instanceID, rackID: mv.rackID, clientID: mv.clientID, clientHost: mv.clientHost,
				names: mv.names, regex: mv.regex, assignor: mv.assignor,
				rebalanceTimeout: time.Duration(mv.rebalanceTimeoutMs) * time.Millisecond,
				sessionTimeout:   time.Duration(mv.sessionTimeoutMs) * time.Millisecond,
				epoch:            mv.epoch, prevEpoch: mv.prevEpoch, state: mv.state, departed: mv.departed,
				assigned: mv.assigned, pending: mv.pending,
				persisted: c.loadRaw[string(memberKey(gid, mid).encode())]}
			if m.regex != "" {
				m.re, _ = compileRegex(m.regex) // it compiled when the member subscribed
			}
			// Records this broker wrote are consistent; one that is not (a bug of an earlier version, or
			// damage) drops its member, which then gets UNKNOWN_MEMBER_ID and joins again.
			if why := c.loadable(g, m, mv.target); why != "" {
				c.loadErrs++
				g.removed[mid] = true // tombstoned by the flush below, so the next load does not see it
				c.bump(g)
				continue
			}
			for _, k := range m.assigned.union(m.pending).list() {
				g.owners[k] = mid
			}
			g.members[mid] = m
			if m.instanceID != "" {
				g.byInstance[m.instanceID] = m
			}
			g.target[mid] = mv.target
			c.touchMember(m, now)
			if m.state == stateUnrevoked {
				m.rebalanceDeadline = now.Add(m.rebalanceTimeout)
				c.noteDeadline(m.rebalanceDeadline)
			}
			c.resolve(m)
		}
		if len(g.members) == 0 {
			g.emptySince = now
			if gv.emptySinceMs >= 0 {
				g.emptySince = time.UnixMilli(gv.emptySinceMs)
			}
		}
		c.groups[gid] = g
	}
	// Member records without a group record (never written so; damage) are tombstoned.
	for _, gid := range sortedKeys(c.loadMems) {
		if _, ok := c.loadGroup[gid]; !ok {
			for _, mid := range sortedKeys(c.loadMems[gid]) {
				c.loadErrs++
				c.out = append(c.out, Record{Key: memberKey(gid, mid).encode()})
			}
		}
	}
	c.loadGroup, c.loadMems, c.loadRaw = nil, nil, nil
	c.nextExpiryCheck = now.Add(c.cfg.OffsetsRetentionCheckInterval)
	for _, gid := range sortedKeys(c.groups) {
		g := c.groups[gid]
		// Subscriptions resolve against today's topics. A change of the subscribed topics' metadata bumps
		// the epoch (refresh); so does a target holding topics a member no longer subscribes to. (Which
		// topics each member's regex matched is not stored, so a regex that now matches a topic that
		// another member already subscribed to is only noticed at the next epoch.)
		for _, m := range g.members {
			for t := range g.target[m.id] {
				if _, ok := slices.BinarySearch(m.subscribed, t); !ok {
					c.bump(g)
				}
			}
		}
		c.refresh(g)
		c.ensureTarget(g)
	}
	c.dropDeletedTopicOffsets(nil)
	c.assertInvariants()
	return c.flush()
}

// loadable says why a loaded member cannot join g as it is, or "" when it can: its state must satisfy
// the invariants of Check together with the members loaded before it.
func (c *Coordinator) loadable(g *group, m *member, target parts) string {
	switch {
	case m.regex != "" && m.re == nil:
		return "regex does not compile"
	case m.epoch > g.assignmentEpoch:
		return "epoch ahead of the group's assignment epoch"
	case (m.state == stateUnrevoked) != (len(m.pending) > 0):
		return "revocation state and pending partitions disagree"
	case m.departed && (m.instanceID == "" || len(m.pending) > 0):
		return "a departed member must be static and not revoking"
	case m.state != stateUnrevoked && m.epoch == g.assignmentEpoch && !m.assigned.subsetOf(target):
		return "owns partitions outside its target at the assignment epoch"
	case m.instanceID != "" && g.byInstance[m.instanceID] != nil:
		return "instance id already taken"
	}
	for _, k := range m.assigned.union(m.pending).list() {
		if g.owners[k] != "" {
			return "partition owned by another member"
		}
	}
	for _, t := range g.target {
		if t.intersects(target) {
			return "target overlaps another member's"
		}
	}
	return ""
}

// LoadErrors returns how many records Load skipped because they did not decode, or whose member state
// Start could not take.
func (c *Coordinator) LoadErrors() int { return c.loadErrs }

// loadErr is returned by every live call before Start.
func (c *Coordinator) loadErr() error {
	if c.loading {
		return rerr.New(runnelv1.ErrorCode_COORDINATOR_LOAD_IN_PROGRESS, "the group coordinator is still loading its state")
	}
	return nil
}

// SetTopics tells the coordinator the current topics. Groups whose subscribed topics were created,
// deleted or changed partition count get a new group epoch and target assignment; regex subscriptions
// are matched again; committed offsets of deleted topics are tombstoned (Kafka does the same).
func (c *Coordinator) SetTopics(now time.Time, topics map[string]TopicInfo) []Record {
	if c.loading {
		c.topics = maps.Clone(topics)
		return nil
	}
	old := c.topics
	c.topics = maps.Clone(topics)
	for _, gid := range sortedKeys(c.groups) {
		g := c.groups[gid]
		for _, m := range g.members {
			if c.resolve(m) {
				c.bump(g) // a regex now matches more or fewer topics
			}
		}
		c.refresh(g)
		c.ensureTarget(g)
	}
	c.dropDeletedTopicOffsets(old)
	c.assertInvariants()
	return c.flush()
}

// dropDeletedTopicOffsets tombstones committed offsets (durable or pending) of topics that do not exist
// now, or were recreated since old (nil: compare with nothing, as after loading).
func (c *Coordinator) dropDeletedTopicOffsets(old map[string]TopicInfo) {
	gone := func(topic string) bool {
		now, ok := c.topics[topic]
		if !ok {
			return true
		}
		was, known := old[topic]
		return old != nil && known && was.ID != now.ID
	}
	for _, gid := range c.offsetGroups() {
		for _, k := range c.offsetKeys(gid) {
			if gone(k.topic) {
				c.out = append(c.out, Record{Key: offsetKey(gid, k).encode()})
			}
		}
	}
}

// offsetGroups returns the ids of groups with durable or pending commits, sorted; pending includes
// offsets of transactions not yet ended.
func (c *Coordinator) offsetGroups() []string {
	ids := map[string]bool{}
	for id := range c.offsets {
		ids[id] = true
	}
	for id := range c.pending {
		ids[id] = true
	}
	for id := range c.openTxns {
		ids[id] = true
	}
	return sortedKeys(ids)
}

// offsetKeys returns the partitions a group has durable or pending commits for, sorted; pending
// includes offsets of transactions not yet ended (a tombstone of the key drops those too).
func (c *Coordinator) offsetKeys(gid string) []tp {
	set := map[tp]bool{}
	for k := range c.offsets[gid] {
		set[k] = true
	}
	for k := range c.pending[gid] {
		set[k] = true
	}
	for pid := range c.openTxns[gid] {
		for k := range c.txns[pid].offsets[gid] {
			set[k] = true
		}
	}
	keys := slices.Collect(maps.Keys(set))
	slices.SortFunc(keys, cmpTP)
	return keys
}

func cmpTP(a, b tp) int {
	if c := cmp.Compare(a.topic, b.topic); c != 0 {
		return c
	}
	return cmp.Compare(a.part, b.part)
}

// Apply takes records the caller has made durable, in log order: committed offsets and their
// tombstones take effect here, offsets of a transaction become pending, and a marker commits or drops
// its producer's pending offsets. Other records were applied to memory when they were made.
func (c *Coordinator) Apply(recs []Record) {
	for _, rec := range recs {
		if rec.Marker != NoMarker {
			if rec.Producer != nil {
				c.applyMarker(*rec.Producer, rec.Marker == CommitMarker)
			}
			continue
		}
		k, err := decodeKey(rec.Key)
		if err != nil || k.kind != kindOffset {
			continue // our own records decode; membership records are already in memory
		}
		if rec.Producer != nil {
			_ = c.applyTxnOffset(k, *rec.Producer, rec.Value, true)
			continue
		}
		_ = c.applyOffset(k, rec.Value, true)
	}
}

func (c *Coordinator) applyOffset(k recordKey, value []byte, live bool) error {
	key := tp{k.topic, k.partition}
	if live && value != nil {
		if p := c.pending[k.group]; p != nil {
			if p[key]--; p[key] <= 0 {
				delete(p, key)
			}
			if len(p) == 0 {
				delete(c.pending, k.group)
			}
		}
	}
	if value == nil {
		c.seq++
		c.supersedeTxnOffsets(k.group, key)
		if o := c.offsets[k.group]; o != nil {
			delete(o, key)
			if len(o) == 0 {
				delete(c.offsets, k.group)
			}
		}
		return nil
	}
	v, err := decodeOffsetValue(value)
	if err != nil {
		if !live {
			c.loadErrs++
		}
		return fmt.Errorf("group %q offset of %s-%d: %w", k.group, k.topic, k.partition, err)
	}
	c.seq++
	c.supersedeTxnOffsets(k.group, key)
	o := c.offsets[k.group]
	if o == nil {
		o = map[tp]OffsetCommit{}
		c.offsets[k.group] = o
	}
	o[key] = v
	return nil
}

// Tick enforces session timeouts (a member not heard from is removed and its partitions freed),
// rebalance timeouts (a member that has not revoked in time is removed) and, every
// OffsetsRetentionCheckInterval, the expiry of groups empty for OffsetsRetention.
func (c *Coordinator) Tick(now time.Time) []Record {
	if c.loading {
		return nil
	}
	dueMembers := !c.earliest.IsZero() && !now.Before(c.earliest)
	dueExpiry := !now.Before(c.nextExpiryCheck)
	if !dueMembers && !dueExpiry {
		return nil
	}
	if dueMembers {
		c.earliest = time.Time{}
		for _, gid := range sortedKeys(c.groups) {
			g := c.groups[gid]
			changed := false
			for _, mid := range sortedKeys(g.members) {
				m := g.members[mid]
				if !now.Before(m.sessionDeadline) || m.state == stateUnrevoked && !now.Before(m.rebalanceDeadline) {
					c.removeMember(g, m, now)
					changed = true
					continue
				}
				c.noteDeadline(m.sessionDeadline)
				if m.state == stateUnrevoked {
					c.noteDeadline(m.rebalanceDeadline)
				}
			}
			if changed {
				c.refresh(g)
				c.ensureTarget(g)
			}
		}
	}
	if dueExpiry {
		c.nextExpiryCheck = now.Add(c.cfg.OffsetsRetentionCheckInterval)
		c.expireGroups(now)
	}
	c.assertInvariants()
	return c.flush()
}

// noteDeadline keeps c.earliest at or before every member deadline.
func (c *Coordinator) noteDeadline(t time.Time) {
	if c.earliest.IsZero() || t.Before(c.earliest) {
		c.earliest = t
	}
}

func (c *Coordinator) touchMember(m *member, now time.Time) {
	m.sessionDeadline = now.Add(m.sessionTimeout)
	c.noteDeadline(m.sessionDeadline)
}

// expireGroups deletes groups that have had no members for OffsetsRetention, counting from when they
// lost their last member or from their last commit, whichever is later (admin commits keep a group).
func (c *Coordinator) expireGroups(now time.Time) {
	ids := map[string]bool{}
	for id := range c.groups {
		ids[id] = true
	}
	for _, id := range c.offsetGroups() {
		ids[id] = true
	}
	for _, id := range sortedKeys(ids) {
		var since time.Time
		if g := c.groups[id]; g != nil {
			if len(g.members) > 0 {
				continue
			}
			since = g.emptySince
		}
		if len(c.pending[id]) > 0 || len(c.openTxns[id]) > 0 {
			continue // a commit is on its way, or a transaction holds offsets of the group: activity
		}
		for _, o := range c.offsets[id] {
			if t := time.UnixMilli(o.CommitTimestampMs); t.After(since) {
				since = t
			}
		}
		if now.Sub(since) >= c.cfg.OffsetsRetention {
			c.deleteGroup(id)
		}
	}
}

// deleteGroup drops a group without members from memory and emits tombstones for its group record and
// every committed offset (those take effect through Apply).
func (c *Coordinator) deleteGroup(id string) {
	if g := c.groups[id]; g != nil {
		for _, mid := range sortedKeys(g.removed) {
			c.out = append(c.out, Record{Key: memberKey(id, mid).encode()})
		}
		delete(c.groups, id)
		delete(c.touched, id)
	}
	c.out = append(c.out, Record{Key: groupKey(id).encode()})
	for _, k := range c.offsetKeys(id) {
		c.out = append(c.out, Record{Key: offsetKey(id, k).encode()})
	}
}

// resolve recomputes the topics m subscribes to that exist: its names, and the non-internal topics
// its regex matches. It reports whether they changed.
func (c *Coordinator) resolve(m *member) bool {
	var subs []string
	for _, n := range m.names {
		if _, ok := c.topics[n]; ok {
			subs = append(subs, n)
		}
	}
	if m.re != nil {
		for name, ti := range c.topics {
			if !ti.Internal && m.re.MatchString(name) {
				subs = append(subs, name)
			}
		}
	}
	slices.Sort(subs)
	subs = slices.Compact(subs)
	if slices.Equal(subs, m.subscribed) {
		return false
	}
	m.subscribed = subs
	return true
}

// refresh recomputes what the target assignment depends on besides membership — the assignor most
// members ask for, and the subscribed topics' metadata — and bumps the group epoch when it changed.
func (c *Coordinator) refresh(g *group) {
	votes := map[string]int{}
	meta := map[string]TopicInfo{}
	for _, m := range g.members {
		if m.assignor != "" {
			votes[m.assignor]++
		}
		for _, t := range m.subscribed {
			ti := c.topics[t]
			meta[t] = TopicInfo{ID: ti.ID, Partitions: ti.Partitions} // what the assignment depends on
		}
	}
	use, best := assignor.Default, 0
	for _, name := range assignor.Names() {
		if votes[name] > best {
			use, best = name, votes[name]
		}
	}
	if use != g.assignor || !maps.Equal(meta, g.subMeta) {
		g.assignor, g.subMeta = use, meta
		c.bump(g)
	}
}

// bump starts a new group epoch unless one is already waiting for its target assignment: what matters
// is that the epoch differs from the assignment epoch, and ensureTarget catches up before the call that
// bumped returns, so one call raises the epoch by one however many things it changed.
func (c *Coordinator) bump(g *group) {
	if g.epoch == g.assignmentEpoch {
		g.epoch++
	}
	c.markGroup(g)
}

func (c *Coordinator) markGroup(g *group) {
	g.dirty = true
	c.touched[g.id] = g
}

func (c *Coordinator) markMember(g *group, m *member) {
	g.dirtyMems[m.id] = true
	c.touched[g.id] = g
}

// ensureTarget computes the target assignment for the group epoch if it is behind. Members are given to
// the assignor in the order their next heartbeats are due (members that left as static members last),
// so partitions that must move are taken from members that will hear about it soonest: that is what
// makes a join complete within a fraction of the heartbeat interval.
func (c *Coordinator) ensureTarget(g *group) {
	if g.assignmentEpoch == g.epoch {
		return
	}
	ms := slices.Collect(maps.Values(g.members))
	slices.SortFunc(ms, func(a, b *member) int {
		if a.departed != b.departed {
			if a.departed {
				return 1
			}
			return -1
		}
		if c := a.nextHeartbeat.Compare(b.nextHeartbeat); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	spec := assignor.Spec{Partitions: map[string]int32{}}
	for t, ti := range g.subMeta {
		spec.Partitions[t] = ti.Partitions
	}
	for _, m := range ms {
		spec.Members = append(spec.Members, assignor.Member{ID: m.id, InstanceID: m.instanceID, Topics: m.subscribed, Current: g.target[m.id]})
	}
	a, ok := assignor.Get(g.assignor)
	if !ok {
		a, _ = assignor.Get(assignor.Default)
	}
	result := a.Assign(spec)
	for _, m := range ms {
		t := partsFromMap(result[m.id])
		if !t.equal(g.target[m.id]) {
			g.target[m.id] = t
			c.markMember(g, m)
		}
	}
	g.assignmentEpoch = g.epoch
	c.markGroup(g)
}

// release frees the partitions of ps that m owns.
func (c *Coordinator) release(g *group, m *member, ps parts) {
	ps.each(func(k tp) {
		if g.owners[k] == m.id {
			delete(g.owners, k)
		}
	})
}

// removeMember takes m out of the group and frees its partitions.
func (c *Coordinator) removeMember(g *group, m *member, now time.Time) {
	c.release(g, m, m.assigned)
	c.release(g, m, m.pending)
	delete(g.members, m.id)
	if m.instanceID != "" && g.byInstance[m.instanceID] == m {
		delete(g.byInstance, m.instanceID)
	}
	delete(g.target, m.id)
	delete(g.dirtyMems, m.id)
	g.removed[m.id] = true
	if len(g.members) == 0 {
		g.emptySince = now
	}
	c.bump(g)
}

// flush returns the records of everything changed since the last flush, after the ones already queued
// in c.out: per touched group (by id) its group record, tombstones of removed members, then the records
// of changed members (by id). Records whose value equals the last one emitted for the key are left out.
func (c *Coordinator) flush() []Record {
	for _, gid := range sortedKeys(c.touched) {
		g := c.touched[gid]
		if g.dirty {
			g.dirty = false
			if v := g.value().encode(); !bytes.Equal(v, g.persisted) {
				c.out = append(c.out, Record{Key: groupKey(g.id).encode(), Value: v})
				g.persisted = v
			}
		}
		for _, mid := range sortedKeys(g.removed) {
			if g.members[mid] == nil {
				c.out = append(c.out, Record{Key: memberKey(g.id, mid).encode()})
			}
		}
		clear(g.removed)
		for _, mid := range sortedKeys(g.dirtyMems) {
			m := g.members[mid]
			if m == nil {
				continue
			}
			if v := g.memberValue(m).encode(); !bytes.Equal(v, m.persisted) {
				c.out = append(c.out, Record{Key: memberKey(g.id, mid).encode(), Value: v})
				m.persisted = v
			}
		}
		clear(g.dirtyMems)
	}
	clear(c.touched)
	out := c.out
	c.out = nil
	return out
}

func (g *group) value() groupValue {
	v := groupValue{epoch: g.epoch, assignmentEpoch: g.assignmentEpoch, assignor: g.assignor, emptySinceMs: -1,
		topics: sortedSubTopics(g.subMeta)}
	if len(g.members) == 0 {
		v.emptySinceMs = g.emptySince.UnixMilli()
	}
	return v
}

func (g *group) memberValue(m *member) memberValue {
	return memberValue{instanceID: m.instanceID, rackID: m.rackID, clientID: m.clientID, clientHost: m.clientHost,
		names: m.names, regex: m.regex, assignor: m.assignor,
		rebalanceTimeoutMs: int32(m.rebalanceTimeout / time.Millisecond), sessionTimeoutMs: int32(m.sessionTimeout / time.Millisecond),
		epoch: m.epoch, prevEpoch: m.prevEpoch, state: m.state, departed: m.departed,
		assigned: m.assigned, pending: m.pending, target: g.target[m.id]}
}

// validGroupID checks a group id: 1 to MaxIDBytes bytes of UTF-8 without control characters.
func validGroupID(id string) error {
	if id == "" {
		return rerr.New(runnelv1.ErrorCode_INVALID_GROUP_ID, "group id is empty")
	}
	if err := validID("group id", id); err != nil {
		return rerr.New(runnelv1.ErrorCode_INVALID_GROUP_ID, "%s", rerr.FromError(err).Message)
	}
	return nil
}

// validID checks an id that may be empty: at most MaxIDBytes bytes of UTF-8, no control characters.
func validID(what, id string) error {
	if len(id) > MaxIDBytes {
		return rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s is %d bytes, at most %d", what, len(id), MaxIDBytes)
	}
	if !utf8.ValidString(id) {
		return rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s is not UTF-8", what)
	}
	for _, r := range id {
		if r < 0x20 || r == 0x7f {
			return rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s %q has a control character", what, id)
		}
	}
	return nil
}

// compileRegex compiles a subscription regex (RE2 syntax) anchored to match whole topic names. The
// expression is checked on its own first, so one that only parses once wrapped (say "a)|(b") is refused.
func compileRegex(expr string) (*regexp.Regexp, error) {
	if len(expr) > MaxRegexBytes {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REGULAR_EXPRESSION, "regular expression of %d bytes, at most %d", len(expr), MaxRegexBytes)
	}
	if _, err := regexp.Compile(expr); err != nil {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REGULAR_EXPRESSION, "%v", err)
	}
	re, err := regexp.Compile("^(?:" + expr + ")$")
	if err != nil {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REGULAR_EXPRESSION, "%v", err)
	}
	return re, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
