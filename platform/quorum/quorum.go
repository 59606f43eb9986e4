package quorum

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
)

const (
	// walSegmentSize is the size of raft-wal's segment files, which it preallocates. Metadata entries
	// are small; its 64 MiB default would mostly hold zeros.
	walSegmentSize = 16 << 20
	// snapshotsRetained is how many snapshots the file snapshot store keeps.
	snapshotsRetained = 2
	// transportMaxPool and transportTimeout configure raft's network transport: pooled connections per
	// peer, and the I/O deadline of one RPC (an InstallSnapshot raises it by the snapshot's size).
	transportMaxPool = 3
	transportTimeout = 5 * time.Second
	// handlerWait bounds how long Close waits for the transport's connection handlers to return.
	handlerWait = 5 * time.Second
)

// Quorum is this node's member of the controller quorum. Its methods are safe for concurrent use.
type Quorum struct {
	cfg    Config
	log    *slog.Logger
	addr   string
	raft   *raft.Raft
	trans  *raft.NetworkTransport
	stream *streamLayer
	wal    *raftwal.WAL
	meta   *metadb.BoltMetaDB
	fsm    *fsm
	seq    atomic.Uint64 // the last proposal's sequence number

	observer  *raft.Observer
	obsCh     chan raft.Observation
	stopWatch chan struct{}
	wg        sync.WaitGroup

	leaderChanges chan bool

	mu sync.Mutex
	// leading is whether this node leads, as the watch goroutine last saw raft's state.
	leading bool
	// changed is closed (and replaced) at every change of raft's state or of the known leader.
	changed chan struct{}

	closing   chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// Start opens (or creates) the raft state in cfg.Dir and starts raft. A voter whose Dir has no raft
// state bootstraps the cluster with cfg.Voters (every voter bootstraps with the same configuration,
// which raft allows); a non-voter starts empty and waits for the leader to add it (AddNonvoter). A node
// restarting with its Dir restores its newest snapshot, then catches up from its own log and the
// leader. cfg.StateMachine must be empty. A sole voter starts its election at once instead of after a
// heartbeat timeout, so it leads within milliseconds. On error nothing is left running.
func Start(cfg Config) (_ *Quorum, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("quorum: invalid config: %w", err)
	}
	walDir := filepath.Join(cfg.Dir, "wal")
	if err := os.MkdirAll(walDir, 0o755); err != nil {
		return nil, fmt.Errorf("quorum: create raft directory: %w", err)
	}

	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	ln := cfg.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.BindAddr); err != nil {
			return nil, fmt.Errorf("quorum: listen for raft: %w", err)
		}
	}
	undo = append(undo, func() { _ = ln.Close() })
	advertise, err := advertiseFor(cfg.AdvertiseAddr, ln.Addr())
	if err != nil {
		return nil, fmt.Errorf("quorum: %w", err)
	}
	for _, v := range cfg.Voters {
		if v.ID == cfg.NodeID && v.Addr != advertise {
			cfg.Logger.Warn("controller advertises another raft address than its controller.quorum.voters entry",
				"node_id", cfg.NodeID, "advertise", advertise, "voters_entry", v.Addr)
		}
	}

	segSize := walSegmentSize
	if cfg.walSegmentSize > 0 {
		segSize = cfg.walSegmentSize
	}
	hl := newHclog(cfg.Logger)
	meta := &metadb.BoltMetaDB{}
	wal, err := raftwal.Open(walDir, raftwal.WithMetaStore(meta), raftwal.WithLogger(hl.Named("wal")),
		raftwal.WithSegmentSize(segSize))
	if err != nil {
		_ = meta.Close()
		return nil, fmt.Errorf("quorum: open raft log in %s: %w", walDir, err)
	}
	// raft-wal's Close leaves the meta store it was given open (and its file locked): close it too.
	undo = append(undo, func() { _ = wal.Close(); _ = meta.Close() })
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, snapshotsRetained, hl.Named("snapshots"))
	if err != nil {
		return nil, fmt.Errorf("quorum: open snapshot store in %s: %w", cfg.Dir, err)
	}
	stream := newStreamLayer(ln, advertise, cfg.Rewrite)
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Logger:  hl.Named("transport"),
		Stream:  stream,
		MaxPool: transportMaxPool,
		Timeout: transportTimeout,
	})
	undo = append(undo, func() { _ = trans.Close() })

	rc := raft.DefaultConfig()
	rc.LocalID = serverID(cfg.NodeID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	rc.Logger = hl
	// A removed member keeps running (as a follower of no one) rather than shutting raft down under
	// its owner, who learns of the removal from Status.
	rc.ShutdownOnRemove = false
	rc.NoLegacyTelemetry = true

	existing, err := raft.HasExistingState(wal, wal, snaps)
	if err != nil {
		return nil, fmt.Errorf("quorum: read raft state in %s: %w", cfg.Dir, err)
	}
	bootstrap := !existing && cfg.isVoter()
	if bootstrap {
		voters := slices.SortedFunc(slices.Values(cfg.Voters), func(a, b Voter) int { return cmp.Compare(a.ID, b.ID) })
		var conf raft.Configuration
		for _, v := range voters {
			conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: serverID(v.ID), Address: raft.ServerAddress(v.Addr)})
		}
		if err := raft.BootstrapCluster(rc, wal, wal, snaps, trans, conf); err != nil {
			return nil, fmt.Errorf("quorum: bootstrap with voters %s: %w", FormatVoters(voters), err)
		}
	}

	f := newFSM(cfg.StateMachine, rand.Uint64())
	r, err := raft.NewRaft(rc, f, wal, wal, snaps, trans)
	if err != nil {
		return nil, fmt.Errorf("quorum: start raft: %w", err)
	}

	q := &Quorum{
		cfg: cfg, log: cfg.Logger, addr: advertise, raft: r, trans: trans, stream: stream, wal: wal, meta: meta, fsm: f,
		obsCh:         make(chan raft.Observation, 64),
		stopWatch:     make(chan struct{}),
		leaderChanges: make(chan bool, 1),
		changed:       make(chan struct{}),
		closing:       make(chan struct{}),
	}
	// Blocking, so no change is missed: the watch goroutine drains the channel until raft has shut
	// down, and it never calls into raft in a way that waits for raft's main loop.
	q.observer = raft.NewObserver(q.obsCh, true, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.RaftState, raft.LeaderObservation:
			return true
		}
		return false
	})
	r.RegisterObserver(q.observer)
	q.setLeading(r.State() == raft.Leader) // in case it changed before the observer was registered
	q.wg.Add(1)
	go q.watch()

	if len(cfg.Voters) == 1 && cfg.isVoter() {
		q.electNow()
	}
	q.log.Info("controller quorum member started", "node_id", cfg.NodeID, "raft_addr", advertise,
		"voter", cfg.isVoter(), "voters", FormatVoters(cfg.Voters), "bootstrapped", bootstrap,
		"applied_index", f.applied.Load())
	return q, nil
}

// advertiseFor returns the address to advertise: adv when set (its port 0 replaced by the bound
// port), else the bound address, which must then be a specific IP.
func advertiseFor(adv string, bound net.Addr) (string, error) {
	tcp, ok := bound.(*net.TCPAddr)
	if !ok {
		return "", fmt.Errorf("raft listener address %v is not TCP", bound)
	}
	if adv == "" {
		if tcp.IP == nil || tcp.IP.IsUnspecified() {
			return "", fmt.Errorf("raft bind address %v is not advertisable: set AdvertiseAddr", bound)
		}
		return tcp.String(), nil
	}
	host, port, err := net.SplitHostPort(adv)
	if err != nil {
		return "", fmt.Errorf("raft advertise address %q: %w", adv, err)
	}
	if port == "0" {
		port = strconv.Itoa(tcp.Port)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return "", fmt.Errorf("raft advertise address %q is not advertisable", adv)
	}
	return net.JoinHostPort(host, port), nil
}

// electNow makes a sole voter start its election at once. raft's follower waits a randomized
// heartbeat timeout (0.5-1 s by default) for a leader before it campaigns, though a sole voter can
// never hear from one. When ReloadConfig shrinks the heartbeat timeout, raft re-checks the follower's
// timer at once, and a follower that never heard from a leader then starts an election: shrink it by
// a nanosecond, then put it back.
func (q *Quorum) electNow() {
	rc := q.raft.ReloadableConfig()
	hb := rc.HeartbeatTimeout
	rc.HeartbeatTimeout = hb - time.Nanosecond
	if err := q.raft.ReloadConfig(rc); err != nil { // only when LeaderLeaseTimeout == HeartbeatTimeout
		q.log.Debug("cannot start the sole voter's election early", "err", err)
		return
	}
	rc.HeartbeatTimeout = hb
	if err := q.raft.ReloadConfig(rc); err != nil {
		q.log.Warn("restore heartbeat timeout", "err", err)
	}
}

// watch follows raft's state and leader until Close.
func (q *Quorum) watch() {
	defer q.wg.Done()
	for {
		select {
		case o := <-q.obsCh:
			switch d := o.Data.(type) {
			case raft.RaftState:
				q.setLeading(d == raft.Leader)
			case raft.LeaderObservation:
				q.noteLeader(d)
			}
		case <-q.stopWatch:
			// Raft has shut down and the observer is deregistered: take what it sent last (its
			// Shutdown state among it), so LeaderChanges ends with false.
			for {
				select {
				case o := <-q.obsCh:
					if d, ok := o.Data.(raft.RaftState); ok {
						q.setLeading(d == raft.Leader)
					}
				default:
					return
				}
			}
		}
	}
}

// setLeading records whether this node leads, wakes the waiters, tells LeaderChanges and logs.
func (q *Quorum) setLeading(now bool) {
	q.mu.Lock()
	was := q.leading
	q.leading = now
	close(q.changed)
	q.changed = make(chan struct{})
	q.mu.Unlock()
	if now == was {
		return
	}
	sendLatest(q.leaderChanges, now)
	if now {
		q.log.Info("became controller leader", "node_id", q.cfg.NodeID, "term", q.raft.CurrentTerm())
	} else {
		q.log.Info("no longer controller leader", "node_id", q.cfg.NodeID, "term", q.raft.CurrentTerm())
	}
}

// noteLeader wakes the waiters and logs a new leader.
func (q *Quorum) noteLeader(o raft.LeaderObservation) {
	q.mu.Lock()
	close(q.changed)
	q.changed = make(chan struct{})
	q.mu.Unlock()
	switch {
	case o.LeaderID == "":
		q.log.Debug("controller leader unknown", "node_id", q.cfg.NodeID)
	case o.LeaderID != serverID(q.cfg.NodeID):
		q.log.Info("controller leader elected", "node_id", q.cfg.NodeID, "leader_id", string(o.LeaderID),
			"leader_addr", string(o.LeaderAddr), "term", q.raft.CurrentTerm())
	}
}

// sendLatest puts v in ch (buffered 1), replacing a value nobody took yet. Only the watch goroutine
// sends, so this never blocks.
func sendLatest(ch chan bool, v bool) {
	for {
		select {
		case ch <- v:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}

// serverID is raft's server id for node id: its decimal string.
func serverID(id int32) raft.ServerID { return raft.ServerID(strconv.FormatInt(int64(id), 10)) }

// nodeID is the inverse of serverID; -1 for an id that is not one.
func nodeID(id raft.ServerID) int32 {
	n, err := strconv.ParseInt(string(id), 10, 32)
	if err != nil {
		return -1
	}
	return int32(n)
}

// Addr returns the advertised raft host:port (with the real port when port 0 was asked for).
func (q *Quorum) Addr() string { return q.addr }

// IsLeader reports whether this node is the controller leader now (raft's own state; a leader may
// learn only later that it was deposed, which is why writes go through Propose).
func (q *Quorum) IsLeader() bool { return q.raft.State() == raft.Leader }

// Leader returns the current leader's node id and raft address as this node knows them; -1, "" when
// unknown (during an election, or before a non-voter has heard from a leader).
func (q *Quorum) Leader() (id int32, addr string) {
	a, sid := q.raft.LeaderWithID()
	if sid == "" {
		return -1, ""
	}
	if id = nodeID(sid); id < 0 {
		return -1, ""
	}
	return id, string(a)
}

// LeaderChanges returns a channel that receives true when this node becomes leader and false when it
// stops being leader (also at Close). It is buffered with room for one value and the latest value
// replaces one not yet received, so it never blocks raft; a slow reader sees the current state, not
// every transition. All calls return the same channel; it is never closed.
func (q *Quorum) LeaderChanges() <-chan bool { return q.leaderChanges }

// Propose appends data to the log and waits until it is committed and applied here, returning what
// StateMachine.Apply returned and the entry's index. data is copied.
//
// Only the leader accepts proposals: on another node Propose returns a *NotLeaderError naming the
// leader. While no leader is known (an election is under way) it waits, within ctx, for one.
//
// ctx bounds the whole wait. When it ends while this node leads or no leader is known, Propose returns
// an error wrapping ErrNoQuorum and ctx.Err(). After Close it returns ErrShutdown.
//
// Outcome: an error from Propose means the entry was not applied here before Propose returned, not
// that it never will be. Raft cannot take back an entry that reached a follower, so an entry whose
// leader lost its leadership, or whose ctx ended, may still commit later under the next leader (the
// Raft paper, §5.4.2). Callers must treat the outcome of such a write as unknown: make entries
// idempotent or conditional on the state they expect, or read back after a Barrier on the new leader.
func (q *Quorum) Propose(ctx context.Context, data []byte) (result any, index uint64, err error) {
	r, err := q.submit(ctx, kindCommand, slices.Clone(data), "propose")
	return r.result, r.index, err
}

// Barrier waits (leader only) until every entry committed before it is applied here. A new leader calls
// it before acting on its state: until then its state machine may miss entries that earlier leaders
// committed (the Raft paper, §8; KRaft's controller waits the same way). It appends an entry that the
// state machine never sees. Errors as for Propose.
func (q *Quorum) Barrier(ctx context.Context) error {
	_, err := q.submit(ctx, kindBarrier, nil, "barrier")
	return err
}

// submit appends one tagged entry and waits for it to be applied here.
func (q *Quorum) submit(ctx context.Context, kind byte, data []byte, what string) (applyResult, error) {
	if err := q.awaitLeadership(ctx); err != nil {
		return applyResult{}, fmt.Errorf("quorum: %s: %w", what, err)
	}
	seq := q.seq.Add(1)
	ch := q.fsm.register(seq)
	defer q.fsm.unregister(seq)
	var timeout time.Duration // 0: raft waits for its apply queue without a limit
	if dl, ok := ctx.Deadline(); ok {
		if timeout = time.Until(dl); timeout <= 0 {
			return applyResult{}, noQuorum(context.DeadlineExceeded, what)
		}
	}
	// The future raft returns is not waited on. Its answer comes through ch (the result), a change of
	// leadership, or the context; and waiting on it could block past Close, since raft never answers
	// the futures of entries still queued for its FSM goroutine when it shuts down.
	q.raft.ApplyLog(raft.Log{Data: data, Extensions: encodeExt(kind, q.fsm.nonce, seq)}, timeout)
	for {
		q.mu.Lock()
		leading, changed := q.leading, q.changed
		q.mu.Unlock()
		if !leading {
			if id, addr := q.Leader(); id >= 0 && id != q.cfg.NodeID {
				select {
				case r := <-ch:
					return r, nil
				default:
				}
				return applyResult{}, fmt.Errorf("quorum: %s: leadership moved before the entry was applied here; it may still commit: %w",
					what, &NotLeaderError{LeaderID: id, LeaderAddr: addr})
			}
			// No leader known, or this node about to lead again: the entry may still commit.
		}
		select {
		case r := <-ch:
			return r, nil
		case <-changed:
		case <-ctx.Done():
			select {
			case r := <-ch:
				return r, nil
			default:
			}
			return applyResult{}, noQuorum(ctx.Err(), what)
		case <-q.closing:
			return applyResult{}, fmt.Errorf("quorum: %s: %w", what, ErrShutdown)
		}
	}
}

// awaitLeadership returns nil once this node leads, a *NotLeaderError when another node is known to,
// and waits while no leader is known: until one is, ctx ends (ErrNoQuorum) or Close (ErrShutdown).
func (q *Quorum) awaitLeadership(ctx context.Context) error {
	for {
		select {
		case <-q.closing:
			return ErrShutdown
		default:
		}
		q.mu.Lock()
		leading, changed := q.leading, q.changed
		q.mu.Unlock()
		if leading {
			return nil
		}
		// A leader id equal to ours means raft has just made this node leader and the watch goroutine
		// has not seen it yet: wait for it.
		if id, addr := q.Leader(); id >= 0 && id != q.cfg.NodeID {
			return &NotLeaderError{LeaderID: id, LeaderAddr: addr}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("no controller leader elected: %w: %w", ErrNoQuorum, ctx.Err())
		case <-q.closing:
			return ErrShutdown
		}
	}
}

// AddNonvoter adds a non-voting member that receives and applies the log but does not vote (leader
// only; KRaft's observers, here every broker that is not a controller). It is idempotent when id and
// addr are unchanged; an existing non-voter with a new address is updated. Adding a voter's id errors
// unless addr is its address (then it does nothing): voters are fixed by controller.quorum.voters.
// It returns once the change is committed and applied here; errors as for Propose.
func (q *Quorum) AddNonvoter(ctx context.Context, id int32, addr string) error {
	what := fmt.Sprintf("add non-voter %d at %s", id, addr)
	if id < 0 {
		return fmt.Errorf("quorum: %s: negative node id", what)
	}
	if err := checkHostPort(addr); err != nil {
		return fmt.Errorf("quorum: %s: %w", what, err)
	}
	sid, saddr := serverID(id), raft.ServerAddress(addr)
	done := func(c raft.Configuration) (bool, error) {
		for _, s := range c.Servers {
			if s.ID != sid {
				continue
			}
			if s.Address == saddr {
				return true, nil
			}
			if s.Suffrage == raft.Voter {
				return false, fmt.Errorf("node %d is a voter at %s; voters are fixed by controller.quorum.voters", id, s.Address)
			}
		}
		return false, nil
	}
	return q.changeConfig(ctx, what, done, func(timeout time.Duration) raft.Future {
		return q.raft.AddNonvoter(sid, saddr, 0, timeout)
	})
}

// RemoveServer removes a member, voter or non-voter (leader only; removing an absent id does nothing).
// The leader cannot remove itself. Removing a voter shrinks the quorum for good: it is no longer taken
// from controller.quorum.voters once the cluster exists. It returns once the change is committed and
// applied here; errors as for Propose.
func (q *Quorum) RemoveServer(ctx context.Context, id int32) error {
	what := fmt.Sprintf("remove server %d", id)
	if id == q.cfg.NodeID {
		return fmt.Errorf("quorum: %s: a node cannot remove itself (remove it from another leader)", what)
	}
	sid := serverID(id)
	done := func(c raft.Configuration) (bool, error) {
		return !slices.ContainsFunc(c.Servers, func(s raft.Server) bool { return s.ID == sid }), nil
	}
	return q.changeConfig(ctx, what, done, func(timeout time.Duration) raft.Future {
		return q.raft.RemoveServer(sid, 0, timeout)
	})
}

// changeConfig makes a membership change unless done says the configuration already has it, and waits
// until it is committed and applied here.
func (q *Quorum) changeConfig(ctx context.Context, what string, done func(raft.Configuration) (bool, error),
	change func(timeout time.Duration) raft.Future) error {
	if err := q.awaitLeadership(ctx); err != nil {
		return fmt.Errorf("quorum: %s: %w", what, err)
	}
	conf, err := q.configuration()
	if err != nil {
		return fmt.Errorf("quorum: %s: %w", what, err)
	}
	if ok, err := done(conf); err != nil {
		return fmt.Errorf("quorum: %s: %w", what, err)
	} else if ok {
		return nil
	}
	var timeout time.Duration
	if dl, ok := ctx.Deadline(); ok {
		if timeout = time.Until(dl); timeout <= 0 {
			return noQuorum(context.DeadlineExceeded, what)
		}
	}
	f := change(timeout)
	// raft answers f at once when it refuses the change, else on its FSM goroutine when the change
	// commits, before it applies any later entry. So once a barrier appended after it is applied here,
	// f has its answer and f.Error below does not block (and no goroutine is left waiting on f if raft
	// shuts down first).
	if _, err := q.submit(ctx, kindBarrier, nil, what); err != nil {
		return err
	}
	if conf, err = q.configuration(); err == nil {
		if ok, _ := done(conf); ok {
			return nil
		}
	}
	if err := f.Error(); err != nil {
		return q.mapErr(err, what)
	}
	return fmt.Errorf("quorum: %s: committed, but the configuration does not show it", what)
}

// configuration returns raft's latest configuration (it does not wait for raft's main loop).
func (q *Quorum) configuration() (raft.Configuration, error) {
	f := q.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return raft.Configuration{}, q.mapErr(err, "read configuration")
	}
	return f.Configuration(), nil
}

// mapErr turns one of raft's errors into this package's.
func (q *Quorum) mapErr(err error, what string) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress):
		id, addr := q.Leader()
		return fmt.Errorf("quorum: %s: %w", what, &NotLeaderError{LeaderID: id, LeaderAddr: addr})
	case errors.Is(err, raft.ErrRaftShutdown):
		return fmt.Errorf("quorum: %s: %w", what, ErrShutdown)
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("quorum: %s: %w", what, ErrNoQuorum)
	}
	return fmt.Errorf("quorum: %s: %w", what, err)
}

// AppliedIndex is the raft index of the last entry applied to the state machine on this node (or of
// the snapshot it was restored from). Entries the state machine never sees — raft's own, barriers —
// count once a later entry is applied.
func (q *Quorum) AppliedIndex() uint64 { return q.fsm.applied.Load() }

// WaitApplied waits until AppliedIndex() >= index, e.g. for an index a Propose on the leader returned.
// It returns ctx's error wrapped when ctx ends first and ErrShutdown after Close.
func (q *Quorum) WaitApplied(ctx context.Context, index uint64) error {
	for {
		ch := q.fsm.advancedAfter(index)
		if ch == nil {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("quorum: wait for index %d (applied %d): %w", index, q.AppliedIndex(), ctx.Err())
		case <-q.closing:
			return fmt.Errorf("quorum: wait for index %d: %w", index, ErrShutdown)
		}
	}
}

// Status is a member's view of the quorum, for `runnel cluster status`.
type Status struct {
	// NodeID is this node's id.
	NodeID int32
	// State is "leader", "follower", "candidate" or "shutdown".
	State string
	// Term is the current raft term (KRaft's epoch).
	Term uint64
	// CommitIndex is the highest log index this node knows to be committed.
	CommitIndex uint64
	// AppliedIndex is AppliedIndex().
	AppliedIndex uint64
	// LastLogIndex is the index of the last entry in this node's log (or of its snapshot).
	LastLogIndex uint64
	// LastSnapshotIndex is the index of this node's newest snapshot, 0 when it has none.
	LastSnapshotIndex uint64
	// LeaderID is the leader's node id as this node knows it, -1 when unknown.
	LeaderID int32
	// LeaderAddr is the leader's raft host:port as this node knows it, "" when unknown.
	LeaderAddr string
	// LastContact is the time since this node last heard from the leader: 0 on the leader, and 0 when
	// it never has.
	LastContact time.Duration
	// Servers are the members in the latest configuration, by id.
	Servers []Server
}

// Server is one member of the quorum's configuration.
type Server struct {
	// ID is the node id.
	ID int32
	// Addr is its raft host:port.
	Addr string
	// Voter is true for a voter, false for a non-voter.
	Voter bool
}

// Status returns this node's view of the quorum. It does not wait for raft's main loop.
func (q *Quorum) Status() Status {
	st := q.raft.State()
	s := Status{
		NodeID:       q.cfg.NodeID,
		State:        strings.ToLower(st.String()),
		Term:         q.raft.CurrentTerm(),
		CommitIndex:  q.raft.CommitIndex(),
		AppliedIndex: q.AppliedIndex(),
		LastLogIndex: q.raft.LastIndex(),
	}
	s.LastSnapshotIndex, _ = strconv.ParseUint(q.raft.Stats()["last_snapshot_index"], 10, 64)
	s.LeaderID, s.LeaderAddr = q.Leader()
	if last := q.raft.LastContact(); st != raft.Leader && !last.IsZero() {
		s.LastContact = time.Since(last)
	}
	if conf, err := q.configuration(); err == nil {
		for _, srv := range conf.Servers {
			s.Servers = append(s.Servers, Server{ID: nodeID(srv.ID), Addr: string(srv.Address), Voter: srv.Suffrage == raft.Voter})
		}
		slices.SortFunc(s.Servers, func(a, b Server) int { return cmp.Compare(a.ID, b.ID) })
	}
	return s
}

// Snapshot makes raft take a snapshot now and truncate its log to TrailingLogs entries behind it (tests,
// operators). Nothing new to snapshot is not an error. raft refuses while a membership change is
// committed but not yet followed by an applied entry.
func (q *Quorum) Snapshot() error {
	err := q.raft.Snapshot().Error()
	if err == nil || errors.Is(err, raft.ErrNothingNewToSnapshot) {
		return nil
	}
	return q.mapErr(err, "snapshot")
}

// Close shuts raft down, then closes the transport (with every connection), the log and the stable
// store. Every goroutine this package started has returned when it does. It is idempotent; later calls
// return the first call's result, and the other methods return ErrShutdown.
func (q *Quorum) Close() error {
	q.closeOnce.Do(func() {
		close(q.closing)
		var errs []error
		// The watch goroutine keeps draining the (blocking) observer until raft has stopped.
		if err := q.raft.Shutdown().Error(); err != nil {
			errs = append(errs, fmt.Errorf("shut raft down: %w", err))
		}
		q.raft.DeregisterObserver(q.observer)
		close(q.stopWatch)
		q.wg.Wait()
		q.trans.CloseStreams()
		if err := q.trans.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close transport: %w", err))
		}
		if !q.stream.waitHandlers(handlerWait) {
			q.log.Warn("raft connection handlers still running after close", "node_id", q.cfg.NodeID)
		}
		if err := q.wal.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close raft log: %w", err))
		}
		if err := q.meta.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close raft stable store: %w", err))
		}
		if len(errs) > 0 {
			q.closeErr = fmt.Errorf("quorum: close: %w", errors.Join(errs...))
		}
		q.log.Info("controller quorum member stopped", "node_id", q.cfg.NodeID)
	})
	return q.closeErr
}
