package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"
	"github.com/runnel-io/runnel/platform/netmap"
)

// Status of a member as serf sees it.
type Status int

// The statuses of a member. A member that left or failed stays in Members until it is reaped
// (Config.TombstoneTimeout, Config.ReconnectTimeout), or until it comes back (status alive again).
const (
	// StatusAlive: the member answers probes, or has not yet been found unresponsive for the suspicion
	// timeout.
	StatusAlive Status = iota
	// StatusLeaving: the member announced a leave and is still going.
	StatusLeaving
	// StatusLeft: the member left cleanly (Leave).
	StatusLeft
	// StatusFailed: the member stopped answering probes: it crashed, or it is cut off from us.
	StatusFailed
)

// String returns "alive", "leaving", "left" or "failed".
func (s Status) String() string {
	switch s {
	case StatusAlive:
		return "alive"
	case StatusLeaving:
		return "leaving"
	case StatusLeft:
		return "left"
	case StatusFailed:
		return "failed"
	}
	return "Status(" + strconv.Itoa(int(s)) + ")"
}

func statusOf(s serf.MemberStatus) Status {
	switch s {
	case serf.StatusAlive:
		return StatusAlive
	case serf.StatusLeaving:
		return StatusLeaving
	case serf.StatusLeft:
		return StatusLeft
	}
	return StatusFailed // serf.StatusFailed; StatusNone does not occur in serf's member list
}

// Member is one node of the cluster.
type Member struct {
	// Name is the serf node name, "node-<id>".
	Name string
	// Addr is the member's gossip host:port (its advertised address).
	Addr string
	// Tags are what the member publishes about itself.
	Tags Tags
	// Status is the member's status as this node sees it.
	Status Status
}

// EventKind says what happened to a member.
type EventKind int

// The kinds of Event.
const (
	// EventJoin: a member joined, or came back after it had failed or left (possibly at a new address).
	EventJoin EventKind = iota
	// EventLeave: a member left cleanly (Member.Status is StatusLeft).
	EventLeave
	// EventFailed: a member stopped answering probes for the suspicion timeout (Member.Status is
	// StatusFailed).
	EventFailed
	// EventUpdate: a member changed its tags (SetTags).
	EventUpdate
	// EventReap: a member that failed or left was removed from the member list for good.
	EventReap
)

// String returns "join", "leave", "failed", "update" or "reap".
func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventLeave:
		return "leave"
	case EventFailed:
		return "failed"
	case EventUpdate:
		return "update"
	case EventReap:
		return "reap"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Event says a member joined, left cleanly, failed, changed tags, or was reaped.
type Event struct {
	// Kind is what happened.
	Kind EventKind
	// Member is the member as it is after the event.
	Member Member
}

var (
	// ErrDuplicateNodeID is returned (wrapped) by Start when another live member already uses the node
	// id at a different address. Two nodes with one id would corrupt the controller's view of brokers.
	ErrDuplicateNodeID = errors.New("node id already used by another live member")
	// ErrEncryption is returned (wrapped) by Start when the members reached refused our gossip, or sent
	// gossip we could not read: the gossip key is wrong, or only one side has one.
	ErrEncryption = errors.New("gossip encryption key mismatch")
)

const (
	// eventBuffer is the capacity of the Events channel, and of the channel serf delivers to.
	eventBuffer = 1024
	// broadcastTimeout bounds serf's waits for its own broadcasts to go out (leave, tag updates) when
	// the other members cannot be reached.
	broadcastTimeout = 2 * time.Second
	// deadNodeReclaimTime lets a failed member come back at a new address (a restarted container gets
	// a new IP) as soon as it is failed. memberlist's default (0) refuses the new address until the
	// failed member is reaped, days later.
	deadNodeReclaimTime = time.Nanosecond
	// duplicateMarker starts the error the merge delegate refuses a conflicting member list with; it
	// comes back, as text, in the error of serf's Join.
	duplicateMarker = "runnel membership: duplicate node name"
	// whoisQuery is the serf query a node sends right after it joined: "where is node-<id>?"; see
	// checkUnique.
	whoisQuery = "runnel-whois"
	// whoisTimeout is the least time a joining node waits for the answers to its whois query.
	whoisTimeout = time.Second
)

// testNoMergeGuard, set by a test, starts nodes without mergeGuard so that checkUnique is what catches
// a duplicate node id.
var testNoMergeGuard bool

// Membership is this node's membership of the cluster: a running serf member. Its methods are safe for
// concurrent use.
type Membership struct {
	cfg       Config
	name      string
	log       *slog.Logger // cfg.Logger until Close, then silent
	logClosed atomic.Bool
	serf      *serf.Serf
	guardSerf atomic.Pointer[serf.Serf] // serf once created, for mergeGuard (which can run before m.serf is set)
	localAddr string

	serfEvents chan serf.Event
	events     chan Event
	joined     atomic.Bool

	conflictMu sync.Mutex
	conflict   string // address of the other member using our name, seen by the merge guard

	// lifeMu orders Leave and Close (write) against SetTags (read): memberlist panics when it is shut
	// down during a leave, and a tag update after shutdown would wait for a broadcast that never goes.
	lifeMu     sync.RWMutex
	closed     bool
	closeErr   error
	stopJoin   chan struct{} // closed to stop the join loop
	stopOnce   sync.Once
	joinDone   chan struct{} // closed when the join loop returned
	stopEvents chan struct{} // closed to stop the event forwarder, once serf is shut down
	eventsDone chan struct{} // closed when the forwarder returned
}

// Start creates the serf member and joins cfg.Join. If none of the join addresses can be reached, it
// keeps retrying in the background (every cfg.JoinRetryInterval) until one join succeeds, another node
// joins this one, or Close — the first nodes of a cluster start before the others. A join that reaches a
// member but fails because of the gossip key, and a node id already used by a live member at another
// address, are fatal: Start returns an error wrapping ErrEncryption or ErrDuplicateNodeID and leaves
// nothing running. ctx bounds the name resolution and the first join attempt: if it ends first, Start
// stops the node (waiting for the attempt in flight, at most cfg.TCPTimeout) and returns ctx's error.
func Start(ctx context.Context, cfg Config) (*Membership, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("membership config: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start membership: %w", err)
	}
	cfg = cfg.withDefaults()
	m := &Membership{
		cfg:        cfg,
		name:       nodeName(cfg.NodeID),
		serfEvents: make(chan serf.Event, eventBuffer),
		events:     make(chan Event, eventBuffer),
		stopJoin:   make(chan struct{}),
		joinDone:   make(chan struct{}),
		stopEvents: make(chan struct{}),
		eventsDone: make(chan struct{}),
	}
	m.log = slog.New(gateHandler{h: cfg.Logger.Handler(), closed: &m.logClosed})

	bindHost, bindPort, err := resolveHostPort(ctx, cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("bind address %s: %w", cfg.BindAddr, err)
	}
	mlc := memberlist.DefaultLANConfig()
	mlc.BindAddr, mlc.BindPort = bindHost, bindPort
	mlc.AdvertisePort = bindPort
	if cfg.AdvertiseAddr != "" {
		mlc.AdvertiseAddr, mlc.AdvertisePort, err = resolveHostPort(ctx, cfg.AdvertiseAddr)
		if err != nil {
			return nil, fmt.Errorf("advertise address %s: %w", cfg.AdvertiseAddr, err)
		}
		if mlc.AdvertisePort == 0 {
			mlc.AdvertisePort = bindPort
		}
	}
	stdLog := newStdLogger(m.log)
	mlc.Logger = stdLog
	mlc.ProbeInterval = cfg.ProbeInterval
	mlc.ProbeTimeout = cfg.ProbeTimeout
	mlc.GossipInterval = cfg.GossipInterval
	mlc.SuspicionMult = cfg.SuspicionMult
	mlc.SuspicionMaxTimeoutMult = cfg.SuspicionMaxTimeoutMult
	mlc.TCPTimeout = cfg.TCPTimeout
	mlc.PushPullInterval = cfg.PushPullInterval
	mlc.DeadNodeReclaimTime = deadNodeReclaimTime
	if !testNoMergeGuard {
		mlc.Merge = mergeGuard{m: m}
	}
	var rewritten *netmap.Transport // our own transport, which we shut down if serf does not start
	if !cfg.Rewrite.Empty() {
		// memberlist builds this same NetTransport itself when Config.Transport is nil; here it is
		// wrapped so that what we send goes through the rewrite table.
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{bindHost}, BindPort: bindPort, Logger: stdLog})
		if err != nil {
			return nil, fmt.Errorf("gossip transport on %s: %w", cfg.BindAddr, err)
		}
		if bindPort == 0 {
			mlc.BindPort = nt.GetAutoBindPort()
			if mlc.AdvertisePort == 0 {
				mlc.AdvertisePort = mlc.BindPort
			}
		}
		rewritten = cfg.Rewrite.WrapTransport(nt)
		mlc.Transport = rewritten
	}
	if cfg.EncryptKey != nil {
		mlc.SecretKey = slices.Clone(cfg.EncryptKey)
	}

	sc := serf.DefaultConfig()
	sc.NodeName = m.name
	sc.Tags = cfg.Tags.encode()
	sc.EventCh = m.serfEvents
	sc.Logger = stdLog
	sc.LogOutput = nil
	sc.MemberlistConfig = mlc
	sc.BroadcastTimeout = broadcastTimeout
	sc.LeavePropagateDelay = cfg.LeavePropagateDelay
	sc.ReconnectInterval = cfg.ReconnectInterval
	sc.ReconnectTimeout = cfg.ReconnectTimeout
	sc.TombstoneTimeout = cfg.TombstoneTimeout
	sc.ReapInterval = cfg.ReapInterval
	sc.EnableNameConflictResolution = false // see doc.go: it can shut both nodes down; mergeGuard does it
	sc.DisableCoordinates = true            // no use for network coordinates; keeps probes small
	sc.ValidateNodeNames = true

	s, err := serf.Create(sc)
	if err != nil {
		if rewritten != nil {
			_ = rewritten.Shutdown()
		}
		return nil, fmt.Errorf("start serf on %s: %w", cfg.BindAddr, err)
	}
	m.serf = s
	m.guardSerf.Store(s)
	// memberlist wrote the port it bound into mlc.BindPort when port 0 was asked.
	m.localAddr = net.JoinHostPort(bindHost, strconv.Itoa(mlc.BindPort))
	go m.forwardEvents()

	joins := m.joinAddrs()
	if len(joins) == 0 {
		m.joined.Store(true)
		close(m.joinDone)
		m.log.Info("membership started a new cluster", "node_id", cfg.NodeID, "addr", m.localAddr)
		return m, nil
	}
	first := make(chan error, 1)
	go m.joinLoop(joins, first)
	select {
	case err := <-first:
		if err != nil {
			_ = m.Close()
			return nil, err
		}
	case <-ctx.Done():
		_ = m.Close()
		return nil, fmt.Errorf("join %v: %w", joins, ctx.Err())
	}
	return m, nil
}

// resolveHostPort splits a host:port and resolves the host to an IP (memberlist wants IPs), preferring
// IPv4. An empty host means all interfaces.
func resolveHostPort(ctx context.Context, hostport string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", portStr, err)
	}
	if host == "" {
		return "0.0.0.0", int(port), nil
	}
	if net.ParseIP(host) != nil {
		return host, int(port), nil
	}
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return "", 0, err
	}
	if len(addrs) == 0 {
		return "", 0, fmt.Errorf("host %s has no address", host)
	}
	ip := addrs[0].IP
	for _, a := range addrs {
		if a.IP.To4() != nil {
			ip = a.IP
			break
		}
	}
	return ip.String(), int(port), nil
}

// joinAddrs returns cfg.Join without this node's own addresses.
func (m *Membership) joinAddrs() []string {
	self := map[string]bool{m.localAddr: true, m.cfg.BindAddr: true}
	if m.cfg.AdvertiseAddr != "" {
		self[m.cfg.AdvertiseAddr] = true
	}
	self[m.LocalMember().Addr] = true
	var out []string
	for _, j := range m.cfg.Join {
		j = strings.TrimSpace(j)
		if !self[j] {
			out = append(out, j)
		}
	}
	return out
}

// joinLoop makes the first join attempt, reports its outcome on first (nil, or a fatal error), then
// retries every JoinRetryInterval until a join succeeds, another member joined us, or stopJoin.
func (m *Membership) joinLoop(joins []string, first chan<- error) {
	defer close(m.joinDone)
	err := m.tryJoin(joins)
	first <- err
	if err != nil || m.joined.Load() {
		return
	}
	m.log.Info("membership: no member reachable yet, retrying in the background",
		"join", joins, "every", m.cfg.JoinRetryInterval)
	t := time.NewTicker(m.cfg.JoinRetryInterval)
	defer t.Stop()
	var lastErr string
	for attempt := 1; ; attempt++ {
		select {
		case <-m.stopJoin:
			return
		case <-t.C:
		}
		if m.notAlone() {
			m.joined.Store(true)
			m.log.Info("membership: joined by another member", "members", len(m.serf.Members()))
			return
		}
		err := m.tryJoin(joins)
		if err == nil {
			if m.joined.Load() {
				return
			}
			continue
		}
		if m.joined.Load() {
			// Joined, but the id check failed. Start has returned; the node stays a member, and the
			// owner of the duplicate id has to be fixed by hand.
			m.log.Error("membership: joined a cluster in which this node id is already used", "err", err)
			return
		}
		// A fatal error after Start returned: nothing was merged, so this node is harmless but alone.
		// Say so loudly, without repeating the same line every second.
		if err.Error() != lastErr || attempt%60 == 0 {
			m.log.Error("membership: join refused, retrying", "err", err)
			lastErr = err.Error()
		}
	}
}

// tryJoin makes one join attempt. It returns nil when the join succeeded and checkUnique found the node
// id unique (joined is then set), or when no member could be reached. It returns an error wrapping
// ErrEncryption or ErrDuplicateNodeID when a member was reached and refused us, and one wrapping
// ErrDuplicateNodeID when the join succeeded (joined is set) but checkUnique failed.
//
// memberlist's Join error is text only (one "failed to join <addr>: <cause>" per address). The rule:
// a cause starting with duplicateMarker came from mergeGuard, on our side of the exchange; causes
// naming encryption ("no installed keys could decrypt", "encryption is not configured", "remote state
// is not encrypted") are memberlist refusing the stream, on either side (the remote sends its refusal
// back encrypted with its own key, or in plain text, so our read of it fails the same way). Everything
// else (connection refused, timeouts, DNS) means not reached.
func (m *Membership) tryJoin(joins []string) error {
	n, err := m.serf.Join(joins, false)
	if n > 0 && m.notAlone() {
		m.joined.Store(true)
		if err := m.checkUnique(); err != nil {
			return fmt.Errorf("join %v: %w", joins, err)
		}
		m.log.Info("membership joined the cluster", "node_id", m.cfg.NodeID, "via", joins,
			"members", len(m.serf.Members()))
		return nil
	}
	if err == nil {
		return nil // only ourselves answered (our own address under another name)
	}
	msg := err.Error()
	if strings.Contains(msg, duplicateMarker) {
		m.conflictMu.Lock()
		other := m.conflict
		m.conflictMu.Unlock()
		if other == "" {
			return fmt.Errorf("join %v: %s: %w", joins, msg, ErrDuplicateNodeID)
		}
		return fmt.Errorf("join %v: %w", joins, m.duplicateError(other))
	}
	if why := encryptionMismatch(msg); why != "" {
		return fmt.Errorf("join %v: %s; every node needs the same gossip key, or none (%s): %w",
			joins, why, strings.TrimSpace(msg), ErrEncryption)
	}
	m.log.Debug("membership: join attempt failed", "join", joins, "err", err)
	return nil
}

// duplicateError is the error for our node id being used by a live member at other.
func (m *Membership) duplicateError(other string) error {
	return fmt.Errorf("node id %d is already used by a live member at %s (this node is at %s); "+
		"give every node its own id, or, if that member was this node before a restart at a new address, "+
		"start again once the cluster has seen it fail: %w",
		m.cfg.NodeID, other, m.LocalMember().Addr, ErrDuplicateNodeID)
}

// checkUnique asks every member, right after a join, where it sees this node's name, and returns an
// error wrapping ErrDuplicateNodeID if a member names another live address (the other node itself
// answers too). It catches what mergeGuard cannot: two nodes with one id joining the same member at
// the same moment (both merges are checked before either is applied), or joining through members that
// have not heard of each other yet. It waits until every alive member answered, or whoisTimeout
// (at least 5 gossip intervals); members that do not answer in time are not checked.
func (m *Membership) checkUnique() error {
	self := m.LocalMember().Addr
	expect := make(map[string]bool)
	for _, sm := range m.serf.Members() {
		if sm.Name != m.name && sm.Status == serf.StatusAlive {
			expect[sm.Name] = true
		}
	}
	timeout := max(whoisTimeout, 5*m.cfg.GossipInterval)
	resp, err := m.serf.Query(whoisQuery, []byte(m.name+" "+self), &serf.QueryParam{Timeout: timeout})
	if err != nil {
		m.log.Warn("membership: cannot check that the node id is unique", "err", err)
		return nil
	}
	defer resp.Close()
	for r := range resp.ResponseCh() {
		// serf keeps one answer per member name, so this node does not answer its own query: an answer
		// from our name is the other node's.
		if addr := string(r.Payload); addr != "" && addr != self {
			m.log.Warn("membership: a member sees this node's id elsewhere", "member", r.From, "addr", addr)
			return m.duplicateError(addr)
		}
		delete(expect, r.From)
		if len(expect) == 0 {
			break
		}
	}
	if len(expect) > 0 {
		m.log.Debug("membership: members did not answer the node id check", "members", len(expect))
	}
	return nil
}

// answerWhois answers a whois query "<name> <querier address>" with the address where this node sees
// name alive ("" if nowhere), unless this node is the querier.
func (m *Membership) answerWhois(q *serf.Query) {
	name, from, _ := strings.Cut(string(q.Payload), " ")
	self := m.LocalMember().Addr
	if name == m.name && from == self {
		return
	}
	var addr string
	if name == m.name {
		addr = self
	} else {
		for _, sm := range m.serf.Members() {
			if sm.Name == name && (sm.Status == serf.StatusAlive || sm.Status == serf.StatusLeaving) {
				addr = net.JoinHostPort(sm.Addr.String(), strconv.Itoa(int(sm.Port)))
			}
		}
	}
	if err := q.Respond([]byte(addr)); err != nil {
		m.log.Debug("membership: cannot answer a whois query", "from", q.SourceNode(), "err", err)
	}
}

// encryptionMismatch explains a memberlist join error caused by the gossip key, or returns "".
func encryptionMismatch(msg string) string {
	msg = strings.ToLower(msg)
	switch {
	case strings.Contains(msg, "remote state is encrypted and encryption is not configured"):
		return "the cluster encrypts its gossip and this node has no key"
	case strings.Contains(msg, "encryption is configured but remote state is not encrypted"):
		return "this node encrypts its gossip and the cluster does not"
	case strings.Contains(msg, "no installed keys could decrypt"):
		return "this node's gossip key is not the cluster's"
	}
	return ""
}

// notAlone reports whether another member is alive.
func (m *Membership) notAlone() bool {
	for _, mem := range m.serf.Members() {
		if mem.Name != m.name && mem.Status == serf.StatusAlive {
			return true
		}
	}
	return false
}

// mergeGuard is memberlist's merge delegate, asked before the member lists of two nodes are merged at a
// join (on both sides). It refuses the merge when the other side has a live member under a name that
// is live here at another address: two nodes with one node id. Failed and left members do not count, so
// a node restarted at a new address comes back once the cluster has seen it fail.
type mergeGuard struct{ m *Membership }

// NotifyMerge implements memberlist.MergeDelegate.
func (g mergeGuard) NotifyMerge(peers []*memberlist.Node) error {
	s := g.m.guardSerf.Load()
	if s == nil {
		return errors.New("runnel membership: still starting")
	}
	// serf's copy of the member list: memberlist's Members hands out nodes it keeps changing.
	live := make(map[string]string)
	for _, sm := range s.Members() {
		if sm.Status == serf.StatusAlive || sm.Status == serf.StatusLeaving { // alive includes suspect
			live[sm.Name] = net.JoinHostPort(sm.Addr.String(), strconv.Itoa(int(sm.Port)))
		}
	}
	for _, p := range peers {
		if p.State != memberlist.StateAlive && p.State != memberlist.StateSuspect {
			continue
		}
		here, ok := live[p.Name]
		if !ok || here == p.Address() {
			continue
		}
		if p.Name == g.m.name {
			g.m.conflictMu.Lock()
			g.m.conflict = p.Address()
			g.m.conflictMu.Unlock()
		}
		g.m.log.Warn("membership: refused to merge with a member list that has a duplicate node name",
			"name", p.Name, "here", here, "there", p.Address())
		return fmt.Errorf("%s: %s is alive at %s here, and at %s there", duplicateMarker, p.Name, here, p.Address())
	}
	return nil
}

// forwardEvents moves serf's events to Events, converted, until stopEvents. Serf delivers member events
// while it holds its member lock, inside memberlist's handlers, so this goroutine never blocks on the
// reader: events that do not fit in Events wait in an in-memory queue. The queue is unbounded; it only
// grows with membership changes while the reader stalls.
func (m *Membership) forwardEvents() {
	defer close(m.eventsDone)
	defer close(m.events)
	var pending []Event
	warnAt := eventBuffer
	for {
		var out chan<- Event
		var next Event
		if len(pending) > 0 {
			out, next = m.events, pending[0]
		}
		select {
		case e := <-m.serfEvents:
			pending = append(pending, m.convert(e)...)
			if len(pending) >= warnAt {
				m.log.Warn("membership: events wait for a slow reader", "queued", len(pending)+len(m.events))
				warnAt *= 2
			}
		case out <- next:
			pending[0] = Event{}
			pending = pending[1:]
		case <-m.stopEvents:
			// serf is shut down: take what it sent last, hand over what fits, drop the rest.
		drain:
			for {
				select {
				case e := <-m.serfEvents:
					pending = append(pending, m.convert(e)...)
				default:
					break drain
				}
			}
			for _, e := range pending {
				select {
				case m.events <- e:
				default:
					return
				}
			}
			return
		}
	}
}

// convert turns a serf event into Events about other members; user events and queries (unused) and
// members that are not Runnel nodes give none.
func (m *Membership) convert(e serf.Event) []Event {
	if q, ok := e.(*serf.Query); ok && q.Name == whoisQuery {
		m.answerWhois(q)
		return nil
	}
	me, ok := e.(serf.MemberEvent)
	if !ok {
		return nil // other queries and user events: unused
	}
	var kind EventKind
	switch me.Type {
	case serf.EventMemberJoin:
		kind = EventJoin
	case serf.EventMemberLeave:
		kind = EventLeave
	case serf.EventMemberFailed:
		kind = EventFailed
	case serf.EventMemberUpdate:
		kind = EventUpdate
	case serf.EventMemberReap:
		kind = EventReap
	default:
		return nil
	}
	var out []Event
	for _, sm := range me.Members {
		if sm.Name == m.name {
			continue
		}
		mem, err := memberOf(sm)
		if err != nil {
			m.log.Debug("membership: ignoring a member that is not a runnel node", "err", err)
			continue
		}
		level := slog.LevelInfo
		if kind == EventFailed {
			level = slog.LevelWarn
		}
		m.log.Log(context.Background(), level, "membership: member "+kind.String(),
			"node_id", mem.Tags.NodeID, "role", mem.Tags.Role, "addr", mem.Addr, "status", mem.Status.String())
		out = append(out, Event{Kind: kind, Member: mem})
	}
	return out
}

func memberOf(sm serf.Member) (Member, error) {
	tags, err := decodeTags(sm.Name, sm.Tags)
	if err != nil {
		return Member{}, err
	}
	return Member{
		Name:   sm.Name,
		Addr:   net.JoinHostPort(sm.Addr.String(), strconv.Itoa(int(sm.Port))),
		Tags:   tags,
		Status: statusOf(sm.Status),
	}, nil
}

// LocalAddr returns the host:port serf is bound to, with the real port when port 0 was asked. Other
// nodes can join this address unless the host is 0.0.0.0 or ::; LocalMember().Addr is the advertised
// one.
func (m *Membership) LocalAddr() string { return m.localAddr }

// LocalMember returns this node as the cluster sees it: its advertised address, its current tags, and
// its status (alive; leaving or left during and after Leave).
func (m *Membership) LocalMember() Member {
	sm := m.serf.LocalMember()
	mem, err := memberOf(sm)
	if err != nil { // our own tags always decode; keep the name and address if they somehow do not
		mem = Member{Name: sm.Name, Addr: net.JoinHostPort(sm.Addr.String(), strconv.Itoa(int(sm.Port)))}
	}
	return mem
}

// Members returns every member known, including this node and members that failed or left (until they
// are reaped), sorted by NodeID. Members that are not Runnel nodes (tags without a node id) are left
// out.
func (m *Membership) Members() []Member {
	sms := m.serf.Members()
	out := make([]Member, 0, len(sms))
	for _, sm := range sms {
		if mem, err := memberOf(sm); err == nil {
			out = append(out, mem)
		}
	}
	slices.SortFunc(out, func(a, b Member) int { return int(a.Tags.NodeID) - int(b.Tags.NodeID) })
	return out
}

// Events returns the events about other members, in the order this node learnt them. The channel holds
// 1024 events; when the reader is slower, further events queue in memory, so none is dropped while the
// node runs. Close and Leave close the channel: events still in it can be read; events queued beyond
// its capacity at that moment are dropped.
func (m *Membership) Events() <-chan Event { return m.events }

// SetTags replaces this node's tags (e.g. to add ClusterID once known); t.NodeID is overwritten with the
// node's id. The others see an EventUpdate. It fails if the role is invalid, if the encoded tags exceed
// serf's 512 bytes, or after Close or Leave. It waits, at most 2 s, for the update to be gossiped.
func (m *Membership) SetTags(t Tags) error {
	t.NodeID = m.cfg.NodeID
	if err := t.validate(); err != nil {
		return fmt.Errorf("set tags: %w", err)
	}
	m.lifeMu.RLock()
	defer m.lifeMu.RUnlock()
	if m.closed {
		return errors.New("set tags: membership is closed")
	}
	if err := m.serf.SetTags(t.encode()); err != nil {
		return fmt.Errorf("set tags: %w", err)
	}
	return nil
}

// Joined reports whether this node is part of a cluster: a join succeeded, another member joined this
// node while it was still retrying, or Join was empty (a new cluster).
func (m *Membership) Joined() bool { return m.joined.Load() }

// Leave tells the others this node leaves cleanly (they see EventLeave and status left, not a failure),
// then shuts down as Close does. The leave takes about LeavePropagateDelay plus a gossip round; when the
// others cannot be reached it gives up after a few seconds (2 s per broadcast) and still shuts down.
// memberlist cannot abort a leave once started, so ctx only matters before: if ctx is already done,
// Leave shuts down without the leave, as Close, and returns ctx's error. Leave after Close or Leave
// does nothing.
func (m *Membership) Leave(ctx context.Context) error {
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	if m.closed {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return errors.Join(fmt.Errorf("leave: %w", err), m.closeLocked())
	}
	m.stopJoinLoop()
	<-m.joinDone // serf's Join and Leave must not overlap
	var leaveErr error
	if err := m.serf.Leave(); err != nil {
		leaveErr = fmt.Errorf("leave: %w", err)
	}
	return errors.Join(leaveErr, m.closeLocked())
}

// Close shuts the node down without a leave, so the others will see it fail. It closes serf's sockets,
// stops every goroutine this package started (waiting, at most TCPTimeout, for a join attempt in
// flight) and closes Events; nothing logs to cfg.Logger after it returns. One thing outlives it:
// memberlist cannot cancel a probe of a peer in flight, so that goroutine ends on its own within one
// probe interval (longer, up to 8×, while memberlist considers the node unhealthy). Close is idempotent;
// later calls return the first one's result.
func (m *Membership) Close() error {
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	return m.closeLocked()
}

func (m *Membership) closeLocked() error {
	if m.closed {
		return m.closeErr
	}
	m.closed = true
	m.stopJoinLoop()
	if err := m.serf.Shutdown(); err != nil {
		m.closeErr = fmt.Errorf("shut down serf: %w", err)
	}
	<-m.joinDone
	close(m.stopEvents)
	<-m.eventsDone
	m.logClosed.Store(true)
	return m.closeErr
}

func (m *Membership) stopJoinLoop() {
	m.stopOnce.Do(func() { close(m.stopJoin) })
}
