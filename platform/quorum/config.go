package quorum

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/runnel-io/runnel/platform/netmap"
)

// Config configures one member of the controller quorum. Start from DefaultConfig, set NodeID, Dir,
// BindAddr, Voters and StateMachine, then Start (which calls Validate). Zero durations and counts take
// DefaultConfig's values.
type Config struct {
	// NodeID is this node's id (Kafka's node.id, >= 0); raft's server id is its decimal string.
	NodeID int32
	// Dir is raft's own directory, created if missing: the log in Dir/wal, snapshots in Dir/snapshots.
	// It must outlive restarts: a voter that loses it loses its term and vote, which the Raft paper
	// (Figure 2) requires on stable storage.
	Dir string
	// BindAddr is the raft transport's listen host:port (default 127.0.0.1:7072); port 0 picks a free
	// port.
	BindAddr string
	// AdvertiseAddr is the host:port other members dial; empty means the bound address, which then must
	// not be unspecified (0.0.0.0, ::). Port 0 here means the bound port. A voter should advertise the
	// address its Voters entry has.
	AdvertiseAddr string
	// Voters is the quorum (controller.quorum.voters), the same on every node: 1, 3 or 5 voters with
	// distinct ids and addresses. A node whose NodeID is not in it is a non-voter.
	Voters []Voter
	// StateMachine is the replicated state; it must be empty at Start (raft rebuilds it from the newest
	// snapshot and the log).
	StateMachine StateMachine
	// Logger receives raft's log lines (its INFO lines at Debug) and the shell's own (leadership
	// changes at Info); nil means slog.Default().
	Logger *slog.Logger

	// HeartbeatTimeout is how long a follower waits without hearing from the leader before it starts
	// an election (randomized between 1x and 2x); the leader sends heartbeats ten times as often
	// (default 500ms, LAN).
	HeartbeatTimeout time.Duration
	// ElectionTimeout is how long a candidate waits for votes before it starts a new election
	// (randomized between 1x and 2x; default 500ms; must be >= HeartbeatTimeout).
	ElectionTimeout time.Duration
	// LeaderLeaseTimeout is how long a leader stays leader without hearing from a majority before it
	// steps down, so a partitioned leader stops accepting writes (default 250ms; must be <=
	// HeartbeatTimeout).
	LeaderLeaseTimeout time.Duration
	// CommitTimeout bounds how long the leader waits before it sends an AppendEntries even with nothing
	// new, so followers learn the commit index (default 50ms).
	CommitTimeout time.Duration
	// SnapshotThreshold is the number of log entries since the last snapshot before raft takes a new
	// one (default 8192).
	SnapshotThreshold uint64
	// SnapshotInterval is how often raft checks SnapshotThreshold (randomized between 1x and 2x;
	// default 30s).
	SnapshotInterval time.Duration
	// TrailingLogs is the number of entries kept in the log after a snapshot, so a follower that is only
	// a little behind catches up from the log instead of a whole snapshot (default 10240).
	TrailingLogs uint64

	// Listener, when set, is used instead of binding BindAddr, and Close closes it. A caller that must
	// name the node's raft address before raft starts (a single voter on port 0, tests that reserve a
	// cluster's ports) binds it first and passes it here.
	Listener net.Listener
	// Rewrite, when not empty, makes raft dial the rewritten address of each member (netmap: the e2e
	// harness's per-link fault proxies); nil dials members at their addresses.
	Rewrite *netmap.Table
	// walSegmentSize, when set, replaces walSegmentSize (tests: raft-wal frees truncated entries only a
	// whole segment at a time, and until then the leader still finds them and sends them instead of a
	// snapshot).
	walSegmentSize int
}

// The defaults. The timings are for a LAN: a new leader is elected within about 0.5-1.5 s after the old
// one dies (one to two heartbeat timeouts, then one pre-vote and one vote round trip).
const (
	defaultHeartbeatTimeout   = 500 * time.Millisecond
	defaultElectionTimeout    = 500 * time.Millisecond
	defaultLeaderLeaseTimeout = 250 * time.Millisecond
	defaultCommitTimeout      = 50 * time.Millisecond
	defaultSnapshotThreshold  = 8192
	defaultSnapshotInterval   = 30 * time.Second
	defaultTrailingLogs       = 10240
)

// DefaultConfig returns the configuration of `runnel dev`'s controller: node 1, the only voter, at
// 127.0.0.1:7072, state in ./data/dev/raft, with the default timings. StateMachine has no default.
func DefaultConfig() Config {
	return Config{
		NodeID:             1,
		Dir:                "./data/dev/raft",
		BindAddr:           "127.0.0.1:7072",
		Voters:             []Voter{{ID: 1, Addr: "127.0.0.1:7072"}},
		HeartbeatTimeout:   defaultHeartbeatTimeout,
		ElectionTimeout:    defaultElectionTimeout,
		LeaderLeaseTimeout: defaultLeaderLeaseTimeout,
		CommitTimeout:      defaultCommitTimeout,
		SnapshotThreshold:  defaultSnapshotThreshold,
		SnapshotInterval:   defaultSnapshotInterval,
		TrailingLogs:       defaultTrailingLogs,
	}
}

// withDefaults returns c with zero durations and counts set to DefaultConfig's values and a nil Logger
// set to slog.Default().
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	setDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setDur(&c.HeartbeatTimeout, d.HeartbeatTimeout)
	setDur(&c.ElectionTimeout, d.ElectionTimeout)
	setDur(&c.LeaderLeaseTimeout, d.LeaderLeaseTimeout)
	setDur(&c.CommitTimeout, d.CommitTimeout)
	setDur(&c.SnapshotInterval, d.SnapshotInterval)
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = d.SnapshotThreshold
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = d.TrailingLogs
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks c after filling in defaults for zero durations and counts: a node id >= 0, a Dir, a
// BindAddr (and AdvertiseAddr when set) of the form host:port, valid Voters (see ParseVoters), a
// StateMachine, and timings raft accepts (each at least 5ms, CommitTimeout at least 1ms,
// LeaderLeaseTimeout <= HeartbeatTimeout <= ElectionTimeout).
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.NodeID < 0 {
		errs = append(errs, fmt.Errorf("node id %d is negative", c.NodeID))
	}
	if c.Dir == "" {
		errs = append(errs, errors.New("no raft directory (Dir)"))
	}
	if c.Listener == nil {
		if _, _, err := net.SplitHostPort(c.BindAddr); err != nil {
			errs = append(errs, fmt.Errorf("raft bind address %q: %w", c.BindAddr, err))
		}
	}
	if c.AdvertiseAddr != "" {
		if _, _, err := net.SplitHostPort(c.AdvertiseAddr); err != nil {
			errs = append(errs, fmt.Errorf("raft advertise address %q: %w", c.AdvertiseAddr, err))
		}
	}
	if err := validateVoters(c.Voters); err != nil {
		errs = append(errs, err)
	}
	if c.StateMachine == nil {
		errs = append(errs, errors.New("no state machine"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		min  time.Duration
	}{
		{"heartbeat timeout", c.HeartbeatTimeout, 5 * time.Millisecond},
		{"election timeout", c.ElectionTimeout, 5 * time.Millisecond},
		{"leader lease timeout", c.LeaderLeaseTimeout, 5 * time.Millisecond},
		{"commit timeout", c.CommitTimeout, time.Millisecond},
		{"snapshot interval", c.SnapshotInterval, 5 * time.Millisecond},
	} {
		if d.v < d.min {
			errs = append(errs, fmt.Errorf("%s %v is below %v", d.name, d.v, d.min))
		}
	}
	if c.LeaderLeaseTimeout > c.HeartbeatTimeout {
		errs = append(errs, fmt.Errorf("leader lease timeout %v is above the heartbeat timeout %v", c.LeaderLeaseTimeout, c.HeartbeatTimeout))
	}
	if c.ElectionTimeout < c.HeartbeatTimeout {
		errs = append(errs, fmt.Errorf("election timeout %v is below the heartbeat timeout %v", c.ElectionTimeout, c.HeartbeatTimeout))
	}
	return errors.Join(errs...)
}

// isVoter reports whether c.NodeID is one of c.Voters.
func (c Config) isVoter() bool {
	for _, v := range c.Voters {
		if v.ID == c.NodeID {
			return true
		}
	}
	return false
}
