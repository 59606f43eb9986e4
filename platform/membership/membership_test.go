package membership

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/serf/serf"
	"github.com/runnel-io/runnel/internal/testaddr"
	"go.uber.org/goleak"
)

// TestMain fails the package if goroutines are left over. memberlist's probe of a peer can outlive Close
// by a probe interval (it waits for its ack timer), so the check polls for a while.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := goleak.Find()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
				code = 1
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	os.Exit(code)
}

// testConfig returns a config for node id on 127.0.0.1 with a free port and fast timings: a crashed node
// is seen failed in about 1 s.
func testConfig(t *testing.T, id int32, join ...string) Config {
	c := DefaultConfig()
	c.NodeID = id
	c.BindAddr = "127.0.0.1:0"
	c.Join = join
	c.Tags = Tags{
		Role:     RoleBroker,
		GRPCAddr: fmt.Sprintf("127.0.0.1:%d", 17000+id),
		RaftAddr: fmt.Sprintf("127.0.0.1:%d", 18000+id),
		Rack:     "r" + fmt.Sprint(id%2),
	}
	if id == 1 {
		c.Tags.Role = RoleController
	}
	c.ProbeInterval = 200 * time.Millisecond
	c.ProbeTimeout = 100 * time.Millisecond
	c.GossipInterval = 50 * time.Millisecond
	c.SuspicionMult = 3
	c.TCPTimeout = 2 * time.Second
	c.JoinRetryInterval = 200 * time.Millisecond
	c.LeavePropagateDelay = 200 * time.Millisecond
	c.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return c
}

// testWriter sends log lines to t.Log, so they show only for failed tests.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// start starts a member and closes it at the end of the test.
func start(t *testing.T, cfg Config) *Membership {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start node %d: %v", cfg.NodeID, err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close node %d: %v", cfg.NodeID, err)
		}
	})
	return m
}

// waitFor polls cond until it is true, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitEvent reads m's events until one matches, failing the test after timeout.
func waitEvent(t *testing.T, m *Membership, timeout time.Duration, what string, match func(Event) bool) Event {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case e, ok := <-m.Events():
			if !ok {
				t.Fatalf("events closed while waiting for %s", what)
			}
			if match(e) {
				return e
			}
		case <-timer.C:
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}

func isEvent(kind EventKind, id int32) func(Event) bool {
	return func(e Event) bool { return e.Kind == kind && e.Member.Tags.NodeID == id }
}

// member returns the member with id as m sees it.
func member(m *Membership, id int32) (Member, bool) {
	for _, mem := range m.Members() {
		if mem.Tags.NodeID == id {
			return mem, true
		}
	}
	return Member{}, false
}

func allAlive(m *Membership, n int) bool {
	ms := m.Members()
	if len(ms) != n {
		return false
	}
	for _, mem := range ms {
		if mem.Status != StatusAlive {
			return false
		}
	}
	return true
}

func TestThreeMembers(t *testing.T) {
	t.Parallel()
	c1, c2, c3 := testConfig(t, 1), testConfig(t, 2), testConfig(t, 3)
	n1 := start(t, c1)
	c2.Join = []string{n1.LocalAddr()}
	c3.Join = []string{n1.LocalAddr()}
	n2 := start(t, c2)
	n3 := start(t, c3)
	nodes := []*Membership{n1, n2, n3}
	cfgs := []Config{c1, c2, c3}

	for i, n := range nodes {
		if !n.Joined() {
			t.Errorf("node %d: Joined() = false", i+1)
		}
		waitFor(t, 5*time.Second, fmt.Sprintf("node %d to see 3 alive members", i+1), func() bool { return allAlive(n, 3) })
		ms := n.Members()
		for j, mem := range ms {
			want := cfgs[j].Tags
			want.NodeID = int32(j + 1)
			if mem.Tags != want || mem.Name != fmt.Sprintf("node-%d", j+1) || mem.Addr != nodes[j].LocalAddr() {
				t.Errorf("node %d sees member %d as %+v, want name node-%d, addr %s, tags %+v",
					i+1, j+1, mem, j+1, nodes[j].LocalAddr(), want)
			}
		}
	}
	if got := n1.LocalMember(); got.Tags.Role != RoleController || got.Status != StatusAlive || got.Name != "node-1" {
		t.Errorf("LocalMember() = %+v", got)
	}
	e := waitEvent(t, n1, 5*time.Second, "node 1 to get a join event for node 3", isEvent(EventJoin, 3))
	if e.Member.Status != StatusAlive || e.Member.Tags.GRPCAddr != c3.Tags.GRPCAddr {
		t.Errorf("join event = %+v", e)
	}

	// A tag change reaches the others as an update.
	newTags := c2.Tags
	newTags.ClusterID = "9c1b2d4e"
	newTags.NodeID = 77 // ignored: the id is the node's
	if err := n2.SetTags(newTags); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*Membership{n1, n3} {
		e := waitEvent(t, n, 5*time.Second, "an update event for node 2", isEvent(EventUpdate, 2))
		if e.Member.Tags.ClusterID != "9c1b2d4e" || e.Member.Tags.NodeID != 2 {
			t.Errorf("update event = %+v", e)
		}
		if m, _ := member(n, 2); m.Tags.ClusterID != "9c1b2d4e" {
			t.Errorf("member 2 = %+v after the update", m)
		}
	}
	if got := n2.LocalMember().Tags.ClusterID; got != "9c1b2d4e" {
		t.Errorf("node 2's own cluster id = %q", got)
	}
	if err := n2.SetTags(Tags{Role: "voter"}); err == nil {
		t.Error("SetTags with an invalid role: no error")
	}
	if err := n2.SetTags(Tags{Role: RoleBroker, Rack: strings.Repeat("x", 600)}); err == nil {
		t.Error("SetTags over 512 bytes: no error")
	}
}

func TestLeaveFailAndReap(t *testing.T) {
	t.Parallel()
	c1 := testConfig(t, 1)
	c1.ReconnectTimeout = time.Second // reap failed members fast
	c1.ReapInterval = 200 * time.Millisecond
	n1 := start(t, c1)
	n2 := start(t, testConfig(t, 2, n1.LocalAddr()))
	n3 := start(t, testConfig(t, 3, n1.LocalAddr()))
	waitFor(t, 5*time.Second, "3 alive members", func() bool { return allAlive(n1, 3) && allAlive(n2, 3) })

	// A clean leave is seen as a leave, not a failure.
	if err := n3.Leave(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*Membership{n1, n2} {
		e := waitEvent(t, n, 5*time.Second, "a leave event for node 3", isEvent(EventLeave, 3))
		if e.Member.Status != StatusLeft {
			t.Errorf("leave event = %+v", e)
		}
	}
	if m, ok := member(n2, 3); !ok || m.Status != StatusLeft {
		t.Errorf("member 3 = %+v, %v after leave; want status left", m, ok)
	}
	waitFor(t, time.Second, "node 3's events to close", func() bool {
		select {
		case _, ok := <-n3.Events():
			return !ok
		default:
			return false
		}
	})
	if err := n3.Leave(context.Background()); err != nil {
		t.Errorf("second Leave: %v", err)
	}
	if err := n3.SetTags(testConfig(t, 3).Tags); err == nil {
		t.Error("SetTags after Leave: no error")
	}

	// A crash (Close without leave) is seen as a failure within a few seconds, then reaped.
	closed := time.Now()
	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}
	e := waitEvent(t, n1, 5*time.Second, "a failed event for node 2", isEvent(EventFailed, 2))
	t.Logf("failure seen after %v", time.Since(closed).Round(time.Millisecond))
	if e.Member.Status != StatusFailed {
		t.Errorf("failed event = %+v", e)
	}
	waitEvent(t, n1, 5*time.Second, "a reap event for node 2", isEvent(EventReap, 2))
	if _, ok := member(n1, 2); ok {
		t.Errorf("node 2 still in Members after reap: %+v", n1.Members())
	}
	if err := n2.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestJoinRetriesInBackground(t *testing.T) {
	t.Parallel()
	later := testaddr.Free(t)
	began := time.Now()
	n1 := start(t, testConfig(t, 1, later))
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("Start took %v with an unreachable join address", d)
	}
	if n1.Joined() {
		t.Fatal("Joined() = true before any member was reachable")
	}
	c2 := testConfig(t, 2)
	c2.BindAddr = later
	n2 := start(t, c2)
	waitFor(t, 5*time.Second, "node 1 to join", n1.Joined)
	waitFor(t, 5*time.Second, "both to see 2 alive members", func() bool { return allAlive(n1, 2) && allAlive(n2, 2) })
}

func TestJoinedByOthers(t *testing.T) {
	t.Parallel()
	// The first node of a cluster lists the others, which are not up yet; the second lists the first.
	later := testaddr.Free(t)
	n1 := start(t, testConfig(t, 1, later))
	c2 := testConfig(t, 2, n1.LocalAddr())
	c2.BindAddr = later
	n2 := start(t, c2)
	if !n2.Joined() {
		t.Error("node 2: Joined() = false")
	}
	waitFor(t, 5*time.Second, "node 1 to count as joined", n1.Joined)
	waitFor(t, 5*time.Second, "both to see 2 alive members", func() bool { return allAlive(n1, 2) && allAlive(n2, 2) })
}

func TestJoinListWithSelf(t *testing.T) {
	t.Parallel()
	// A shared join list names the node itself: it is skipped.
	addr := testaddr.Free(t)
	c := testConfig(t, 1, addr)
	c.BindAddr = addr
	n := start(t, c)
	if !n.Joined() {
		t.Error("Joined() = false for a node whose join list holds only itself")
	}
}

func key(t *testing.T, n int) []byte {
	t.Helper()
	k := make([]byte, n)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

func TestEncryption(t *testing.T) {
	t.Parallel()
	k := key(t, 32)
	c1 := testConfig(t, 1)
	c1.EncryptKey = k
	n1 := start(t, c1)
	c2 := testConfig(t, 2, n1.LocalAddr())
	c2.EncryptKey = k
	n2 := start(t, c2)
	waitFor(t, 5*time.Second, "2 alive members", func() bool { return allAlive(n1, 2) && allAlive(n2, 2) })

	plain := start(t, testConfig(t, 9)) // an unencrypted cluster

	cases := []struct {
		name string
		key  []byte
		join string
		want string
	}{
		{"wrong key", key(t, 32), n1.LocalAddr(), "not the cluster's"},
		{"wrong key length too", key(t, 16), n2.LocalAddr(), "not the cluster's"},
		{"no key", nil, n1.LocalAddr(), "this node has no key"},
		{"key for a plain cluster", k, plain.LocalAddr(), "the cluster does not"},
	}
	for i, tc := range cases {
		c := testConfig(t, int32(3+i), tc.join)
		c.EncryptKey = tc.key
		began := time.Now()
		m, err := Start(context.Background(), c)
		if err == nil {
			m.Close()
			t.Errorf("%s: Start succeeded", tc.name)
			continue
		}
		if d := time.Since(began); d > 5*time.Second {
			t.Errorf("%s: Start took %v to fail", tc.name, d)
		}
		if !errors.Is(err, ErrEncryption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Start error = %v; want ErrEncryption saying %q", tc.name, err, tc.want)
		}
	}
	if !allAlive(n1, 2) || !allAlive(n2, 2) || !allAlive(plain, 1) {
		t.Errorf("after the refused joins: %v, %v, %v", n1.Members(), n2.Members(), plain.Members())
	}
}

func TestDuplicateNodeID(t *testing.T) {
	t.Parallel()
	n1 := start(t, testConfig(t, 1))
	n2 := start(t, testConfig(t, 2, n1.LocalAddr()))
	waitFor(t, 5*time.Second, "2 alive members", func() bool { return allAlive(n1, 2) && allAlive(n2, 2) })

	// A second node 2 joining node 1, and a second node 1 joining node 2 (it meets the original node 1
	// in node 2's member list).
	for _, tc := range []struct {
		id       int32
		via      *Membership
		original *Membership
	}{{2, n1, n2}, {1, n2, n1}} {
		began := time.Now()
		m, err := Start(context.Background(), testConfig(t, tc.id, tc.via.LocalAddr()))
		if err == nil {
			m.Close()
			t.Fatalf("duplicate node %d: Start succeeded", tc.id)
		}
		if d := time.Since(began); d > 5*time.Second {
			t.Errorf("duplicate node %d: Start took %v to fail", tc.id, d)
		}
		if !errors.Is(err, ErrDuplicateNodeID) || !strings.Contains(err.Error(), tc.original.LocalAddr()) {
			t.Errorf("duplicate node %d: Start error = %v; want ErrDuplicateNodeID naming %s",
				tc.id, err, tc.original.LocalAddr())
		}
		t.Logf("duplicate node %d: %v", tc.id, err)
	}

	// The originals are unaffected: still alive at their addresses, and still talking to each other.
	if err := n2.SetTags(Tags{Role: RoleBroker, ClusterID: "after"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "node 1 to see node 2's new tags", func() bool {
		m, _ := member(n1, 2)
		return m.Tags.ClusterID == "after"
	})
	for _, n := range []*Membership{n1, n2} {
		for _, mem := range n.Members() {
			want := map[int32]string{1: n1.LocalAddr(), 2: n2.LocalAddr()}[mem.Tags.NodeID]
			if mem.Status != StatusAlive || mem.Addr != want {
				t.Errorf("%s sees %+v; want alive at %s", n.LocalMember().Name, mem, want)
			}
		}
	}
	for {
		select {
		case e := <-n1.Events():
			if e.Kind != EventJoin && e.Kind != EventUpdate {
				t.Errorf("node 1 got %v", e)
			}
			continue
		default:
		}
		break
	}
}

// TestDuplicateNodeIDWhois starts the duplicate without the merge guard, as if it had joined through
// members that had not heard of the original yet: the whois query after the join catches it. Not
// parallel: it changes a package variable read by Start.
func TestDuplicateNodeIDWhois(t *testing.T) {
	n1 := start(t, testConfig(t, 1))
	n2 := start(t, testConfig(t, 2, n1.LocalAddr()))
	n3 := start(t, testConfig(t, 3, n1.LocalAddr()))
	waitFor(t, 5*time.Second, "3 alive members", func() bool { return allAlive(n1, 3) && allAlive(n2, 3) })

	testNoMergeGuard = true
	m, err := Start(context.Background(), testConfig(t, 2, n3.LocalAddr()))
	testNoMergeGuard = false
	if err == nil {
		m.Close()
		t.Fatal("duplicate node 2: Start succeeded")
	}
	if !errors.Is(err, ErrDuplicateNodeID) || !strings.Contains(err.Error(), n2.LocalAddr()) {
		t.Fatalf("duplicate node 2: Start error = %v; want ErrDuplicateNodeID naming %s", err, n2.LocalAddr())
	}
	for _, n := range []*Membership{n1, n2, n3} {
		if mem, _ := member(n, 2); mem.Addr != n2.LocalAddr() || mem.Status != StatusAlive {
			t.Errorf("%s sees node 2 as %+v", n.LocalMember().Name, mem)
		}
	}
}

// TestDuplicateNodeIDConcurrent starts two nodes with one id at the same moment, joining the same
// member: never both start, and a refused one gets ErrDuplicateNodeID. Usually one wins (in at least one
// of three rounds, the test demands); when both merges went through before either node's whois check,
// each check finds the other and both are refused, which is safe (the id is left to nobody) and the
// error tells the operator what to fix.
func TestDuplicateNodeIDConcurrent(t *testing.T) {
	t.Parallel()
	n1 := start(t, testConfig(t, 1))
	wins := 0
	for round := range 3 {
		id := int32(10 + round)
		var wg sync.WaitGroup
		ms := make([]*Membership, 2)
		errs := make([]error, 2)
		for i := range 2 {
			wg.Go(func() { ms[i], errs[i] = Start(context.Background(), testConfig(t, id, n1.LocalAddr())) })
		}
		wg.Wait()
		var winner *Membership
		for i := range 2 {
			switch {
			case errs[i] == nil && winner == nil:
				winner = ms[i]
				t.Cleanup(func() { ms[i].Close() })
			case errs[i] == nil:
				ms[i].Close()
				t.Errorf("round %d: both nodes %d started", round, id)
			case !errors.Is(errs[i], ErrDuplicateNodeID):
				t.Errorf("round %d: Start error = %v; want ErrDuplicateNodeID", round, errs[i])
			}
		}
		if winner == nil {
			t.Logf("round %d: both nodes %d refused, each having seen the other: %v", round, id, errs)
			continue
		}
		wins++
		waitFor(t, 5*time.Second, "node 1 to see the winner alive", func() bool {
			mem, _ := member(n1, id)
			return mem.Status == StatusAlive && mem.Addr == winner.LocalAddr()
		})
	}
	if wins == 0 {
		t.Errorf("in none of 3 rounds did one of the two nodes start: the check refuses more than the race explains")
	}
}

func TestRestartAtNewAddress(t *testing.T) {
	t.Parallel()
	n1 := start(t, testConfig(t, 1))
	c2 := testConfig(t, 2, n1.LocalAddr())
	n2, err := Start(context.Background(), c2)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "2 alive members", func() bool { return allAlive(n1, 2) })
	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, n1, 5*time.Second, "node 2 to fail", isEvent(EventFailed, 2))

	// Node 2 comes back with a new port (a new container IP, say).
	n2b := start(t, c2)
	if n2b.LocalAddr() == n2.LocalAddr() {
		t.Skip("got the same port again")
	}
	e := waitEvent(t, n1, 5*time.Second, "node 2 to join again", isEvent(EventJoin, 2))
	if e.Member.Addr != n2b.LocalAddr() {
		t.Errorf("rejoin event = %+v, want addr %s", e, n2b.LocalAddr())
	}
	waitFor(t, 5*time.Second, "node 2 alive at its new address", func() bool {
		m, _ := member(n1, 2)
		return m.Status == StatusAlive && m.Addr == n2b.LocalAddr()
	})
}

func TestStartErrors(t *testing.T) {
	t.Parallel()
	bad := func(f func(*Config)) Config {
		c := testConfig(t, 1)
		f(&c)
		return c
	}
	for name, c := range map[string]Config{
		"negative id":      bad(func(c *Config) { c.NodeID = -1 }),
		"no role":          bad(func(c *Config) { c.Tags.Role = "" }),
		"key length":       bad(func(c *Config) { c.EncryptKey = make([]byte, 10) }),
		"bind address":     bad(func(c *Config) { c.BindAddr = "127.0.0.1" }),
		"advertise":        bad(func(c *Config) { c.AdvertiseAddr = "nowhere" }),
		"negative timeout": bad(func(c *Config) { c.ProbeTimeout = -time.Second }),
		"empty join":       bad(func(c *Config) { c.Join = []string{" "} }),
	} {
		if m, err := Start(context.Background(), c); err == nil {
			m.Close()
			t.Errorf("%s: Start succeeded", name)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if m, err := Start(ctx, testConfig(t, 1, testaddr.Free(t))); !errors.Is(err, context.Canceled) {
		if err == nil {
			m.Close()
		}
		t.Errorf("Start with a cancelled context: %v", err)
	}

	// A Config built from scratch takes the defaults.
	m := start(t, Config{NodeID: 5, BindAddr: "127.0.0.1:0", Tags: Tags{Role: RoleBroker},
		Logger: testConfig(t, 5).Logger})
	if got := m.LocalMember(); got.Name != "node-5" || got.Tags.NodeID != 5 {
		t.Errorf("LocalMember() = %+v", got)
	}
	if err := m.Leave(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Leave with a cancelled context = %v", err)
	}
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	for _, n := range []int{16, 24, 32} {
		k := make([]byte, n)
		k[0] = byte(n)
		got, err := ParseKey(" " + base64.StdEncoding.EncodeToString(k) + "\n")
		if err != nil || !bytes.Equal(got, k) {
			t.Errorf("%d bytes: ParseKey = %x, %v", n, got, err)
		}
	}
	for _, s := range []string{
		base64.StdEncoding.EncodeToString(make([]byte, 15)),
		base64.StdEncoding.EncodeToString(make([]byte, 33)),
		"",
		"not base64!",
		base64.RawStdEncoding.EncodeToString(make([]byte, 16)), // no padding
	} {
		if k, err := ParseKey(s); err == nil {
			t.Errorf("ParseKey(%q) = %x, want an error", s, k)
		}
	}
}

func TestStatusAndKindNames(t *testing.T) {
	t.Parallel()
	for s, want := range map[Status]string{StatusAlive: "alive", StatusLeaving: "leaving", StatusLeft: "left",
		StatusFailed: "failed", Status(9): "Status(9)"} {
		if s.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(s), s.String(), want)
		}
	}
	for k, want := range map[EventKind]string{EventJoin: "join", EventLeave: "leave", EventFailed: "failed",
		EventUpdate: "update", EventReap: "reap", EventKind(9): "EventKind(9)"} {
		if k.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(k), k.String(), want)
		}
	}
}

func TestTagsRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tags := range []Tags{
		{NodeID: 0, Role: RoleBroker},
		{NodeID: 2147483647, Role: RoleController, GRPCAddr: "a:1", RaftAddr: "b:2", HTTPAddr: "c:3", Rack: "r",
			ClusterID: "cid"},
	} {
		got, err := decodeTags(nodeName(tags.NodeID), tags.encode())
		if err != nil || got != tags {
			t.Errorf("decode(encode(%+v)) = %+v, %v", tags, got, err)
		}
	}
	if _, err := decodeTags("node-2", map[string]string{"id": "3"}); err == nil {
		t.Error("decodeTags with a name that does not match the id: no error")
	}
	if _, err := decodeTags("consul-1", map[string]string{"role": "server"}); err == nil {
		t.Error("decodeTags of a foreign member: no error")
	}
}

// TestEventsSlowReader feeds more member events than both channels hold while nobody reads, then
// reads them all: none is dropped and the order is kept.
func TestEventsSlowReader(t *testing.T) {
	t.Parallel()
	m := &Membership{
		name:       "node-1",
		log:        slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelError})),
		serfEvents: make(chan serf.Event, eventBuffer),
		events:     make(chan Event, eventBuffer),
		stopEvents: make(chan struct{}),
		eventsDone: make(chan struct{}),
	}
	go m.forwardEvents()
	const n = 5 * eventBuffer
	for i := range n {
		id := int32(2 + i%3)
		m.serfEvents <- serf.MemberEvent{Type: serf.EventMemberUpdate, Members: []serf.Member{{
			Name: nodeName(id), Addr: net.IPv4(127, 0, 0, 1), Port: uint16(i),
			Tags: Tags{NodeID: id, Role: RoleBroker}.encode(), Status: serf.StatusAlive,
		}}}
	}
	m.serfEvents <- serf.UserEvent{Name: "ignored"}
	for i := range n {
		e := <-m.Events()
		if want := fmt.Sprintf("127.0.0.1:%d", i); e.Kind != EventUpdate || e.Member.Addr != want {
			t.Fatalf("event %d = %+v, want an update from %s", i, e, want)
		}
	}
	close(m.stopEvents)
	<-m.eventsDone
	if _, ok := <-m.Events(); ok {
		t.Error("events not closed")
	}
}

type recordHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r)
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }

func TestLogAdapter(t *testing.T) {
	t.Parallel()
	h := &recordHandler{}
	l := newStdLogger(slog.New(h))
	l.Printf("[WARN] memberlist: Refuting a suspect message")
	l.Printf("[ERR] serf: something")
	l.Printf("[DEBUG] memberlist: Stream connection")
	l.Printf("[INFO] serf: EventMemberJoin: node-2 127.0.0.1")
	l.Printf("no prefix at all")
	want := []struct {
		level slog.Level
		msg   string
	}{
		{slog.LevelWarn, "memberlist: Refuting a suspect message"},
		{slog.LevelWarn, "serf: something"},
		{slog.LevelDebug, "memberlist: Stream connection"},
		{slog.LevelDebug, "serf: EventMemberJoin: node-2 127.0.0.1"},
		{slog.LevelDebug, "no prefix at all"},
	}
	if len(h.recs) != len(want) {
		t.Fatalf("got %d records, want %d", len(h.recs), len(want))
	}
	for i, w := range want {
		if h.recs[i].Level != w.level || h.recs[i].Message != w.msg {
			t.Errorf("record %d = %v %q, want %v %q", i, h.recs[i].Level, h.recs[i].Message, w.level, w.msg)
		}
	}
}
