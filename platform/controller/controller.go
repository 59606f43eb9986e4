package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/platform/membership"
	"github.com/runnel-io/runnel/platform/quorum"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// Defaults of Config's timings.
const (
	// DefaultHeartbeatInterval is how often a broker heartbeats to the controller leader (Kafka's
	// broker.heartbeat.interval.ms is 2 s; a LAN cluster affords a shorter one).
	DefaultHeartbeatInterval = 500 * time.Millisecond
	// DefaultSessionTimeout is how long the leader waits for a heartbeat before it fences a broker
	// (Kafka's broker.session.timeout.ms is 9 s; serf usually reports a crash sooner).
	DefaultSessionTimeout = 3 * time.Second
	// DefaultPreferredElectionInterval is how often the controller leader elects preferred leaders
	// (Kafka checks every leader.imbalance.check.interval.seconds, 300 s; a LAN cluster affords a shorter period).
	DefaultPreferredElectionInterval = 30 * time.Second
	// DefaultProposeTimeout bounds a metadata write whose caller set no deadline.
	DefaultProposeTimeout = 15 * time.Second
)

// forwardedKey marks a request a node forwarded to the one it believes leads, so it is forwarded at
// most once and two nodes with different beliefs cannot bounce it between them.
const forwardedKey = "runnel-forwarded"

// Config of a node's controller shell.
type Config struct {
	// Self is this node's registration: id, addresses, rack and whether it is a voter. Incarnation is
	// chosen by New; Epoch and Fenced are the controller's.
	Self meta.Broker
	// HeartbeatInterval and SessionTimeout: see the defaults.
	HeartbeatInterval time.Duration
	SessionTimeout    time.Duration
	// PreferredElectionInterval is how often the controller leader moves leaderships back to preferred
	// replicas that are alive and in sync (default DefaultPreferredElectionInterval).
	PreferredElectionInterval time.Duration
	// DialOptions are added to the gRPC dial options used to reach other nodes (tests, TLS later).
	DialOptions []grpc.DialOption
	Logger      *slog.Logger
}

// Controller is one node's part of the controller quorum. It implements broker.Metadata; Register
// adds its Controller and Cluster gRPC services to a server.
type Controller struct {
	cfg  Config
	log  *slog.Logger
	fsm  *meta.FSM
	q    *quorum.Quorum
	memb *membership.Membership // nil: no gossip (a single node)

	connsMu sync.Mutex
	conns   map[string]*grpc.ClientConn

	// Leader state: heartbeat times, valid while this node leads (reset when it becomes leader).
	hbMu     sync.Mutex
	lastSeen map[int32]time.Time
	leading  bool

	// Broker state: this node's epoch once registered (0 before).
	epochMu sync.Mutex
	epoch   uint64

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// New starts the controller shell over a running quorum whose state machine is fsm, and memb (may be
// nil). It starts the goroutines that register this node and heartbeat, and the leader's duties;
// Shutdown or Close stops them.
func New(cfg Config, fsm *meta.FSM, q *quorum.Quorum, memb *membership.Membership) *Controller {
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = DefaultSessionTimeout
	}
	if cfg.PreferredElectionInterval <= 0 {
		cfg.PreferredElectionInterval = DefaultPreferredElectionInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Self.Incarnation = uuid.NewString()
	c := &Controller{cfg: cfg, log: cfg.Logger, fsm: fsm, q: q, memb: memb, conns: map[string]*grpc.ClientConn{},
		lastSeen: map[int32]time.Time{}, stop: make(chan struct{})}
	c.wg.Add(2)
	go c.leaderLoop()
	go c.brokerLoop()
	if memb != nil {
		c.wg.Add(1)
		go c.membershipLoop()
	}
	return c
}

// Image returns the metadata image this node has applied.
func (c *Controller) Image() *meta.Image { return c.fsm.Image() }

// Changed returns a channel closed when a newer image is applied.
func (c *Controller) Changed() <-chan struct{} { return c.fsm.Changed() }

// ControllerID returns the node id of the quorum leader, -1 while none is known.
func (c *Controller) ControllerID() int32 {
	id, _ := c.q.Leader()
	return id
}

// Epoch returns this node's broker epoch, 0 until it is registered.
func (c *Controller) Epoch() uint64 {
	c.epochMu.Lock()
	defer c.epochMu.Unlock()
	return c.epoch
}

// Propose sends cmd to the quorum leader and waits until this node has applied it; see broker.Metadata.
// It retries while no leader is known or the leader changes, until ctx ends (DefaultProposeTimeout when
// ctx has no deadline). Errors: the command's refusal (a catalogue error), or NOT_CONTROLLER /
// REQUEST_TIMED_OUT when no majority commits it in time. A timed-out write may still be applied later.
func (c *Controller) Propose(ctx context.Context, cmd meta.Command) (*meta.Image, error) {
	if d, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultProposeTimeout)
		defer cancel()
	} else {
		// Give up a little before the caller does, so a remote caller gets this answer, not its own
		// "deadline exceeded".
		margin := min(500*time.Millisecond, time.Until(d)/10)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-margin))
		defer cancel()
	}
	data := cmd.Encode()
	var last error
	for attempt := 0; ; attempt++ {
		resp, err := c.propose(ctx, data, false)
		if err == nil {
			return c.applied(ctx, resp)
		}
		last = err
		if !retriable(err) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, rerr.New(runnelv1.ErrorCode_REQUEST_TIMED_OUT, "metadata write (%s) not committed in time: no controller leader answered; is a majority of the controller voters (%s) running? last error: %v",
				cmd.Type, c.votersString(), last)
		case <-c.stop:
			return nil, rerr.New(runnelv1.ErrorCode_NOT_CONTROLLER, "node shutting down")
		case <-time.After(backoff(attempt)):
		}
	}
}

// votersString names the controller voters as this node knows them.
func (c *Controller) votersString() string {
	var out []string
	for _, s := range c.q.Status().Servers {
		if s.Voter {
			out = append(out, fmt.Sprintf("%d@%s", s.ID, s.Addr))
		}
	}
	if len(out) == 0 {
		return "unknown to this node"
	}
	return strings.Join(out, ",")
}

var backoffConfig = grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}

func retriable(err error) bool {
	var e *rerr.Error
	return errors.As(err, &e) && e.Retriable()
}

func backoff(attempt int) time.Duration {
	return min(50*time.Millisecond<<min(attempt, 4), 500*time.Millisecond)
}

// propose commits data on the leader: here when this node leads, else over gRPC (once forwarded, a
// request is not forwarded again).
func (c *Controller) propose(ctx context.Context, data []byte, forwarded bool) (*runnelv1.ProposeResponse, error) {
	if c.q.IsLeader() {
		res, index, err := c.q.Propose(ctx, data)
		if err == nil {
			r, _ := res.(meta.Result)
			resp := &runnelv1.ProposeResponse{Offset: index, Error: rerr.ToInfo(r.Err)}
			if r.Broker != nil {
				resp.BrokerEpoch = r.Broker.Epoch
			}
			return resp, nil
		}
		if !errors.Is(err, quorum.ErrNotLeader) {
			return nil, quorumErr(err)
		}
	}
	// Not the leader (a non-voter never is, and does not learn who is until it is in the raft
	// configuration): forward, unless this request was forwarded here already.
	if forwarded {
		return nil, c.notController()
	}
	var resp *runnelv1.ProposeResponse
	err := c.callLeader(ctx, func(ctx context.Context, cl runnelv1.ControllerClient) error {
		var err error
		resp, err = cl.Propose(ctx, &runnelv1.ProposeRequest{Command: data})
		return err
	})
	return resp, err
}

// applied waits until this node has applied the committed write resp answers, and returns its image
// and the command's own error.
func (c *Controller) applied(ctx context.Context, resp *runnelv1.ProposeResponse) (*meta.Image, error) {
	img, err := c.fsm.WaitFor(ctx, resp.Offset)
	if err != nil {
		return nil, rerr.New(runnelv1.ErrorCode_REQUEST_TIMED_OUT, "metadata write committed at offset %d but not applied here yet: %v", resp.Offset, err)
	}
	if e := rerr.FromInfo(resp.Error); e != nil {
		return img, e
	}
	return img, nil
}

// proposeAsLeader writes cmd to the metadata log through this node's own leadership, and never
// forwards it: the controller's own decisions (fencing a broker whose heartbeats stopped or that serf
// reports gone, preferred leader elections, the cluster id, a heartbeat's unfencing) were taken from
// this node's view as leader. A leader that lost the leadership meanwhile (paused, cut off) must not
// have a stale decision applied by its successor: a leader resumed after a SIGSTOP found every broker's
// heartbeat late on its own clock, and its fencing of a live broker, forwarded to the new leader, took
// that broker out of every ISR while the only other replica was down, which left partitions without a
// leader. KRaft's controller likewise writes its decisions only as the active controller. Errors:
// NOT_CONTROLLER when this node does not lead (or lost the leadership before the entry committed),
// the quorum's errors mapped by quorumErr, or the command's own error from the state machine.
func (c *Controller) proposeAsLeader(ctx context.Context, cmd meta.Command) (*meta.Image, error) {
	resp, err := c.propose(ctx, cmd.Encode(), true) // as if forwarded here: never forwarded on
	if err != nil {
		return nil, err
	}
	return c.applied(ctx, resp)
}

// quorumErr maps the quorum's errors to catalogue errors.
func quorumErr(err error) error {
	switch {
	case errors.Is(err, quorum.ErrNoQuorum), errors.Is(err, context.DeadlineExceeded):
		return rerr.New(runnelv1.ErrorCode_REQUEST_TIMED_OUT, "metadata write: no majority of the controller quorum committed it: %v", err)
	case errors.Is(err, quorum.ErrShutdown):
		return rerr.New(runnelv1.ErrorCode_NOT_CONTROLLER, "metadata write: this node is shutting down")
	case errors.Is(err, quorum.ErrNotLeader):
		return rerr.New(runnelv1.ErrorCode_NOT_CONTROLLER, "metadata write: %v", err)
	}
	return rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "metadata write: %v", err)
}

func (c *Controller) notController() error {
	id, _ := c.q.Leader()
	return &rerr.Error{Code: runnelv1.ErrorCode_NOT_CONTROLLER, LeaderID: id, LeaderEpoch: -1,
		Message: fmt.Sprintf("node %d does not lead the controller quorum (leader: %d)", c.cfg.Self.ID, id)}
}

// leaderAddrs returns the gRPC addresses to try for the leader: the leader's own when known, then the
// other voters' (one of them forwards), from the metadata image and serf tags.
func (c *Controller) leaderAddrs() []string {
	id, _ := c.q.Leader()
	img := c.fsm.Image()
	var addrs []string
	add := func(a string) {
		if a == "" {
			return
		}
		for _, x := range addrs {
			if x == a {
				return
			}
		}
		addrs = append(addrs, a)
	}
	if id >= 0 && id != c.cfg.Self.ID {
		if b, ok := img.Broker(id); ok {
			add(b.GRPCAddr)
		}
		if c.memb != nil {
			for _, m := range c.memb.Members() {
				if m.Tags.NodeID == id {
					add(m.Tags.GRPCAddr)
				}
			}
		}
	}
	if c.memb != nil {
		for _, m := range c.memb.Members() {
			if m.Tags.Role == membership.RoleController && m.Tags.NodeID != c.cfg.Self.ID && m.Status == membership.StatusAlive {
				add(m.Tags.GRPCAddr)
			}
		}
	}
	for _, b := range img.BrokerList() {
		if b.Controller && b.ID != c.cfg.Self.ID {
			add(b.GRPCAddr)
		}
	}
	return addrs
}

// callLeader calls fn on the leader, or on the first node that answers and forwards it there.
func (c *Controller) callLeader(ctx context.Context, fn func(ctx context.Context, cl runnelv1.ControllerClient) error) error {
	addrs := c.leaderAddrs()
	if len(addrs) == 0 {
		return c.notController()
	}
	ctx = metadata.AppendToOutgoingContext(ctx, forwardedKey, "1")
	var last error
	for _, a := range addrs {
		cc, err := c.dial(a)
		if err != nil {
			last = err
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = fn(actx, runnelv1.NewControllerClient(cc))
		cancel()
		if err == nil {
			return nil
		}
		last = rerr.FromStatus(err)
		if ctx.Err() != nil {
			break
		}
	}
	return last
}

func (c *Controller) dial(addr string) (*grpc.ClientConn, error) {
	c.connsMu.Lock()
	defer c.connsMu.Unlock()
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		// A node that was down comes back within seconds: reconnect at least every second, not after
		// gRPC's default back-off of up to two minutes, or its heartbeats would miss the session timeout.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoffConfig, MinConnectTimeout: time.Second})}, c.cfg.DialOptions...)
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// Shutdown is the controlled shutdown: it asks the leader to fence this broker (so its leaderships
// move while it still answers), leaves serf cleanly, and stops the goroutines. ctx bounds the first
// two steps; Close must still be called for the connections.
func (c *Controller) Shutdown(ctx context.Context) {
	if epoch := c.Epoch(); epoch != 0 {
		req := &runnelv1.BrokerHeartbeatRequest{NodeId: c.cfg.Self.ID, BrokerEpoch: epoch, MetadataOffset: c.fsm.Image().Offset, WantShutdown: true}
		if _, err := c.heartbeat(ctx, req); err != nil {
			c.log.Warn("controlled shutdown: the controller did not fence this broker first", "err", err)
		}
	}
	c.stopLoops()
	others := false
	if c.memb != nil {
		for _, m := range c.memb.Members() {
			others = others || (m.Tags.NodeID != c.cfg.Self.ID && m.Status == membership.StatusAlive)
		}
	}
	if others { // a leave takes a second to spread; alone there is no one to tell
		if err := c.memb.Leave(ctx); err != nil {
			c.log.Warn("leaving the cluster's gossip failed", "err", err)
		}
	}
}

func (c *Controller) stopLoops() {
	c.closeOnce.Do(func() { close(c.stop) })
	c.wg.Wait()
}

// Close stops the goroutines and closes the connections to other nodes (no controlled shutdown: to
// the others this looks like a failure). The quorum and membership are the caller's to close.
func (c *Controller) Close() error {
	c.stopLoops()
	c.connsMu.Lock()
	defer c.connsMu.Unlock()
	var errs []error
	for a, cc := range c.conns {
		errs = append(errs, cc.Close())
		delete(c.conns, a)
	}
	return errors.Join(errs...)
}
