package quorum

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// kv is the test state machine: a map of strings changed by JSON commands. Apply returns the previous
// value of the key.
type kv struct {
	mu        sync.Mutex
	m         map[string]string
	lastIndex uint64
	applies   int
	restores  int
	badOrder  error // set when Apply's index did not increase
}

type kvCmd struct {
	Op    string `json:"op"` // "set" or "del"
	Key   string `json:"key"`
	Value string `json:"value,omitempty"`
}

type kvSnap struct {
	M     map[string]string `json:"m"`
	Index uint64            `json:"index"`
}

func newKV() *kv { return &kv{m: map[string]string{}} }

func (s *kv) Apply(index uint64, data []byte) any {
	var c kvCmd
	if err := json.Unmarshal(data, &c); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if index <= s.lastIndex && s.badOrder == nil {
		s.badOrder = fmt.Errorf("apply index %d after %d", index, s.lastIndex)
	}
	s.lastIndex = index
	s.applies++
	prev := s.m[c.Key]
	switch c.Op {
	case "set":
		s.m[c.Key] = c.Value
	case "del":
		delete(s.m, c.Key)
	}
	return prev
}

func (s *kv) Snapshot() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return json.Marshal(kvSnap{M: s.m, Index: s.lastIndex})
}

func (s *kv) Restore(index uint64, data []byte) error {
	var snap kvSnap
	if err := json.Unmarshal(data, &snap); err != nil {
		return err
	}
	if snap.Index != index {
		return fmt.Errorf("snapshot of index %d restored as %d", snap.Index, index)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m, s.lastIndex = snap.M, index
	if s.m == nil {
		s.m = map[string]string{}
	}
	s.restores++
	return nil
}

// state returns a copy of the map.
func (s *kv) state() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.m)
}

func (s *kv) restoreCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restores
}

func (s *kv) orderErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.badOrder
}

func setCmd(k, v string) []byte {
	b, _ := json.Marshal(kvCmd{Op: "set", Key: k, Value: v})
	return b
}

// waitFor polls cond until it returns nil or timeout passes, then fails with cond's last error.
func waitFor(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// logBuf collects a test's log lines; they are printed when the test fails (or QUORUM_LOG is set).
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func testLogger(t *testing.T) *slog.Logger {
	lb := &logBuf{}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("QUORUM_LOG") != "" {
			lb.mu.Lock()
			defer lb.mu.Unlock()
			t.Logf("logs:\n%s", lb.b.String())
		}
	})
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// node is one member in a test cluster.
type node struct {
	id  int32
	dir string
	sm  *kv
	q   *Quorum
}

// cluster runs quorum members in one process over TCP on 127.0.0.1.
type cluster struct {
	t      *testing.T
	log    *slog.Logger
	voters []Voter
	tweak  func(*Config)
	nodes  map[int32]*node
}

// newCluster starts n voters (ids 1..n). Their listeners are bound first, so every node's Voters has
// the real ports.
func newCluster(t *testing.T, n int, tweak func(*Config)) *cluster {
	t.Helper()
	c := &cluster{t: t, log: testLogger(t), tweak: tweak, nodes: map[int32]*node{}}
	lns := make([]net.Listener, n)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
		c.voters = append(c.voters, Voter{ID: int32(i + 1), Addr: ln.Addr().String()})
	}
	for i, ln := range lns {
		c.start(int32(i+1), ln, "")
	}
	return c
}

// start starts node id with ln, or bound to bindAddr when ln is nil (an earlier node's Dir is reused).
func (c *cluster) start(id int32, ln net.Listener, bindAddr string) *node {
	c.t.Helper()
	n := c.nodes[id]
	if n == nil {
		n = &node{id: id, dir: c.t.TempDir()}
		c.nodes[id] = n
	}
	cfg := DefaultConfig()
	cfg.NodeID = id
	cfg.Dir = n.dir
	cfg.BindAddr = bindAddr
	cfg.Listener = ln
	cfg.Voters = c.voters
	n.sm = newKV()
	cfg.StateMachine = n.sm
	cfg.Logger = c.log.With("node", id)
	if c.tweak != nil {
		c.tweak(&cfg)
	}
	q, err := Start(cfg)
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		c.t.Fatalf("start node %d: %v", id, err)
	}
	n.q = q
	c.t.Cleanup(func() { _ = q.Close() })
	return n
}

// startNonvoter starts node id outside the voters, on a free port.
func (c *cluster) startNonvoter(id int32) *node {
	c.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	return c.start(id, ln, "")
}

// stop closes node id.
func (c *cluster) stop(id int32) {
	c.t.Helper()
	if err := c.nodes[id].q.Close(); err != nil {
		c.t.Fatalf("close node %d: %v", id, err)
	}
}

// restart starts a stopped node again with its Dir and address.
func (c *cluster) restart(id int32) *node {
	c.t.Helper()
	return c.start(id, nil, c.nodes[id].q.Addr())
}

// running returns the nodes that are not closed.
func (c *cluster) running() []*node {
	var ns []*node
	for _, n := range c.nodes {
		select {
		case <-n.q.closing:
		default:
			ns = append(ns, n)
		}
	}
	return ns
}

// waitLeader waits until exactly one running node leads and every running voter knows it.
func (c *cluster) waitLeader(timeout time.Duration) *node {
	c.t.Helper()
	var leader *node
	waitFor(c.t, timeout, func() error {
		leader = nil
		for _, n := range c.running() {
			if n.q.IsLeader() {
				if leader != nil {
					return fmt.Errorf("nodes %d and %d both lead", leader.id, n.id)
				}
				leader = n
			}
		}
		if leader == nil {
			return fmt.Errorf("no leader")
		}
		for _, n := range c.running() {
			if id, _ := n.q.Leader(); n.q.cfg.isVoter() && id != leader.id {
				return fmt.Errorf("node %d thinks the leader is %d, not %d", n.id, id, leader.id)
			}
		}
		return nil
	})
	return leader
}

// propose proposes set k=v on n and fails the test on error.
func propose(t *testing.T, n *node, k, v string) (any, uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, idx, err := n.q.Propose(ctx, setCmd(k, v))
	if err != nil {
		t.Fatalf("propose %s=%s on node %d: %v", k, v, n.id, err)
	}
	return res, idx
}

// waitSame waits until every given node has applied through index and has want as its state.
func waitSame(t *testing.T, timeout time.Duration, want map[string]string, index uint64, nodes ...*node) {
	t.Helper()
	waitFor(t, timeout, func() error {
		for _, n := range nodes {
			if got := n.q.AppliedIndex(); got < index {
				return fmt.Errorf("node %d applied %d, want >= %d", n.id, got, index)
			}
			if got := n.sm.state(); !maps.Equal(got, want) {
				return fmt.Errorf("node %d has %d keys, want %d", n.id, len(got), len(want))
			}
			if err := n.sm.orderErr(); err != nil {
				return fmt.Errorf("node %d: %v", n.id, err)
			}
		}
		return nil
	})
}
