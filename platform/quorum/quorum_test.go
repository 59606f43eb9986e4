package quorum

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParseVoters(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want []Voter
		err  string // substring of the error; "" for success
	}{
		{in: "1@127.0.0.1:7072", want: []Voter{{1, "127.0.0.1:7072"}}},
		{in: "1@a:1,2@b:2,3@c:3", want: []Voter{{1, "a:1"}, {2, "b:2"}, {3, "c:3"}}},
		{in: " 3@c:3 , 1@a:1,2@b:2 ", want: []Voter{{3, "c:3"}, {1, "a:1"}, {2, "b:2"}}},
		{in: "0@[::1]:9093", want: []Voter{{0, "[::1]:9093"}}},
		{in: "1@a:1,2@b:2,3@c:3,4@d:4,5@e:5", want: []Voter{{1, "a:1"}, {2, "b:2"}, {3, "c:3"}, {4, "d:4"}, {5, "e:5"}}},
		{in: "", err: "empty"},
		{in: "  ", err: "empty"},
		{in: "1@a:1,2@b:2", err: "2 voters"},
		{in: "1@a:1,2@b:2,3@c:3,4@d:4", err: "4 voters"},
		{in: "1@a:1,2@b:2,3@c:3,4@d:4,5@e:5,6@f:6,7@g:7", err: "7 voters"},
		{in: "1@a:1,", err: "want id@host:port"},
		{in: "a:1", err: "want id@host:port"},
		{in: "x@a:1", err: "not a node id"},
		{in: "-1@a:1", err: "not a node id"},
		{in: "2147483648@a:1", err: "not a node id"},
		{in: "1@a", err: "missing port"},
		{in: "1@:1", err: "no host"},
		{in: "1@a:0", err: "not in 1-65535"},
		{in: "1@a:65536", err: "not in 1-65535"},
		{in: "1@a:http", err: "not in 1-65535"},
		{in: "1@a:1,1@b:2,3@c:3", err: "id 1 appears twice"},
		{in: "1@a:1,2@a:1,3@c:3", err: "address a:1 appears twice"},
	} {
		got, err := ParseVoters(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseVoters(%q) = %v, %v; want error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseVoters(%q): %v", tc.in, err)
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("ParseVoters(%q) = %v, want %v", tc.in, got, tc.want)
		}
		if s := FormatVoters(got); s != strings.ReplaceAll(tc.in, " ", "") {
			t.Errorf("FormatVoters(ParseVoters(%q)) = %q", tc.in, s)
		}
		if again, err := ParseVoters(FormatVoters(got)); err != nil || fmt.Sprint(again) != fmt.Sprint(got) {
			t.Errorf("round trip of %q: %v, %v", tc.in, again, err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	base := DefaultConfig()
	base.StateMachine = newKV()
	if err := base.Validate(); err != nil {
		t.Fatalf("default config with a state machine: %v", err)
	}
	zero := Config{NodeID: 1, Dir: "x", BindAddr: "127.0.0.1:0", Voters: base.Voters, StateMachine: newKV()}
	if err := zero.Validate(); err != nil {
		t.Fatalf("zero timings should take the defaults: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		err    string
	}{
		{"no state machine", func(c *Config) { c.StateMachine = nil }, "no state machine"},
		{"no dir", func(c *Config) { c.Dir = "" }, "no raft directory"},
		{"negative id", func(c *Config) { c.NodeID = -1 }, "negative"},
		{"bad bind", func(c *Config) { c.BindAddr = "nohost" }, "bind address"},
		{"bad advertise", func(c *Config) { c.AdvertiseAddr = "nohost" }, "advertise address"},
		{"two voters", func(c *Config) { c.Voters = []Voter{{1, "a:1"}, {2, "b:2"}} }, "2 voters"},
		{"lease above heartbeat", func(c *Config) { c.LeaderLeaseTimeout = time.Second }, "leader lease timeout"},
		{"election below heartbeat", func(c *Config) { c.ElectionTimeout = 100 * time.Millisecond }, "election timeout"},
		{"tiny heartbeat", func(c *Config) { c.HeartbeatTimeout = time.Millisecond }, "heartbeat timeout 1ms is below"},
	} {
		c := base
		tc.change(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: Validate() = %v, want an error containing %q", tc.name, err, tc.err)
		}
	}
	c := base
	c.BindAddr = "0.0.0.0:0"
	c.Dir = t.TempDir()
	if q, err := Start(c); err == nil || !strings.Contains(err.Error(), "AdvertiseAddr") {
		if q != nil {
			q.Close()
		}
		t.Errorf("Start bound to 0.0.0.0 without an advertise address: %v", err)
	}
}

func TestNotLeaderError(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("wrapped: %w", &NotLeaderError{LeaderID: 2, LeaderAddr: "h:1"})
	var nle *NotLeaderError
	if !errors.Is(err, ErrNotLeader) || !errors.As(err, &nle) || nle.LeaderID != 2 {
		t.Fatalf("errors.Is/As on %v", err)
	}
	if s := err.Error(); !strings.Contains(s, "leader is 2 at h:1") {
		t.Errorf("Error() = %q", s)
	}
	if s := (&NotLeaderError{LeaderID: -1}).Error(); !strings.Contains(s, "leader unknown") {
		t.Errorf("Error() = %q", s)
	}
}

// TestSingleVoter: a sole voter leads at once, Propose returns Apply's result and index, WaitApplied
// and Barrier work, and restarts keep the state, first from the log alone, then from a snapshot plus
// the log.
func TestSingleVoter(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := newCluster(t, 1, nil)
	n := c.nodes[1]
	waitFor(t, 5*time.Second, func() error {
		if !n.q.IsLeader() {
			return errors.New("not leader yet")
		}
		return nil
	})
	t.Logf("single voter: leader %v after Start was called", time.Since(start).Round(time.Millisecond))
	select {
	case v := <-n.q.LeaderChanges():
		if !v {
			t.Fatal("LeaderChanges: false, want true")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("LeaderChanges: nothing")
	}
	// raft sets its state to leader a moment before it records itself as the leader it reports.
	waitFor(t, 5*time.Second, func() error {
		if id, addr := n.q.Leader(); id != 1 || addr != n.q.Addr() {
			return fmt.Errorf("Leader() = %d, %q; want 1, %q", id, addr, n.q.Addr())
		}
		return nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, idx1 := propose(t, n, "a", "1")
	if res != "" || idx1 == 0 {
		t.Fatalf("first propose = %v, %d; want \"\", > 0", res, idx1)
	}
	res, idx2 := propose(t, n, "a", "2")
	if res != "1" || idx2 <= idx1 {
		t.Fatalf("second propose = %v, %d; want \"1\", > %d", res, idx2, idx1)
	}
	if err := n.q.WaitApplied(ctx, idx2); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	err := n.q.WaitApplied(short, idx2+100)
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitApplied for a future index = %v, want a deadline error", err)
	}
	// A waiter for the next entry is woken by it.
	waited := make(chan error, 1)
	go func() { waited <- n.q.WaitApplied(ctx, idx2+1) }()
	propose(t, n, "b", "1")
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if err := n.q.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	// Proposals from many goroutines each get their own entry's result.
	errs := make(chan error, 20)
	for i := range 20 {
		go func() {
			k := "p" + strconv.Itoa(i)
			res, _, err := n.q.Propose(ctx, setCmd(k, "x"))
			if err == nil && res != "" {
				err = fmt.Errorf("propose %s: result %v, want \"\"", k, res)
			}
			errs <- err
		}()
	}
	for range 20 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	st := n.q.Status()
	if st.State != "leader" || st.LeaderID != 1 || st.LastContact != 0 || st.AppliedIndex < idx2 ||
		st.CommitIndex < st.AppliedIndex || st.LastLogIndex < st.CommitIndex || st.Term == 0 ||
		len(st.Servers) != 1 || st.Servers[0] != (Server{ID: 1, Addr: n.q.Addr(), Voter: true}) {
		t.Fatalf("Status() = %+v", st)
	}
	want := n.sm.state()

	// Restart: the state comes back from the log alone.
	c.stop(1)
	if v := <-n.q.LeaderChanges(); v {
		t.Fatal("LeaderChanges after Close: true, want false")
	}
	if _, _, err := n.q.Propose(ctx, setCmd("z", "z")); !errors.Is(err, ErrShutdown) {
		t.Fatalf("Propose after Close = %v, want ErrShutdown", err)
	}
	if err := n.q.WaitApplied(ctx, idx2+1000); !errors.Is(err, ErrShutdown) {
		t.Fatalf("WaitApplied after Close = %v, want ErrShutdown", err)
	}
	if err := n.q.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if st := n.q.Status(); st.State != "shutdown" {
		t.Fatalf("state after Close = %q", st.State)
	}
	restart := time.Now()
	n = c.restart(1)
	c.waitLeader(5 * time.Second)
	t.Logf("single voter: leader again %v after restart", time.Since(restart).Round(time.Millisecond))
	waitSame(t, 5*time.Second, want, 0, n)
	if n.sm.restoreCount() != 0 {
		t.Fatalf("restored a snapshot, but none was taken")
	}

	// Restart with a snapshot and entries after it.
	if err := n.q.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if err := n.q.Snapshot(); err != nil { // nothing new: not an error
		t.Fatal(err)
	}
	snapIdx := n.q.Status().LastSnapshotIndex
	if snapIdx == 0 {
		t.Fatal("no snapshot index after Snapshot")
	}
	_, last := propose(t, n, "after", "snap")
	want = n.sm.state()
	c.stop(1)
	n = c.restart(1)
	if got := n.q.AppliedIndex(); got != snapIdx || n.sm.restoreCount() != 1 {
		t.Fatalf("after restart: applied %d, restores %d; want %d, 1", got, n.sm.restoreCount(), snapIdx)
	}
	c.waitLeader(5 * time.Second)
	waitSame(t, 5*time.Second, want, last, n)
}

// TestThreeVoters: a leader is elected, followers refuse proposals naming it, a new leader takes over
// within seconds when it dies, and the old leader catches up when it comes back.
func TestThreeVoters(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := newCluster(t, 3, nil)
	leader := c.waitLeader(10 * time.Second)
	t.Logf("three voters: leader %d elected %v after start", leader.id, time.Since(start).Round(time.Millisecond))
	var last uint64
	for i := range 10 {
		_, last = propose(t, leader, "k"+strconv.Itoa(i), "v1")
	}
	waitSame(t, 5*time.Second, leader.sm.state(), last, c.running()...)

	var follower *node
	for _, n := range c.running() {
		if n != leader {
			follower = n
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _, err := follower.q.Propose(ctx, setCmd("x", "y"))
	var nle *NotLeaderError
	if !errors.Is(err, ErrNotLeader) || !errors.As(err, &nle) || nle.LeaderID != leader.id || nle.LeaderAddr != leader.q.Addr() {
		t.Fatalf("Propose on a follower = %v; want NotLeaderError naming %d at %s", err, leader.id, leader.q.Addr())
	}
	if err := follower.q.Barrier(ctx); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("Barrier on a follower = %v", err)
	}
	if err := follower.q.AddNonvoter(ctx, 9, "127.0.0.1:1"); !errors.As(err, &nle) || nle.LeaderID != leader.id {
		t.Fatalf("AddNonvoter on a follower = %v", err)
	}
	if st := follower.q.Status(); st.State != "follower" || st.LeaderID != leader.id || len(st.Servers) != 3 {
		t.Fatalf("follower Status() = %+v", st)
	}

	// Kill the leader: another takes over.
	old := leader
	c.stop(old.id)
	killed := time.Now()
	leader = c.waitLeader(10 * time.Second)
	failover := time.Since(killed)
	t.Logf("three voters: node %d leads %v after leader %d was closed", leader.id, failover.Round(time.Millisecond), old.id)
	if failover > 5*time.Second {
		t.Errorf("failover took %v, want < 5s", failover)
	}
	select {
	case v := <-leader.q.LeaderChanges():
		if !v {
			t.Errorf("new leader's LeaderChanges: false")
		}
	case <-time.After(5 * time.Second):
		t.Errorf("new leader's LeaderChanges: nothing")
	}
	if err := leader.q.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		_, last = propose(t, leader, "k"+strconv.Itoa(i), "v2")
	}

	// The old leader comes back with its Dir and catches up.
	old = c.restart(old.id)
	for i := 10; i < 15; i++ {
		_, last = propose(t, leader, "k"+strconv.Itoa(i), "v2")
	}
	waitSame(t, 10*time.Second, leader.sm.state(), last, c.running()...)
	if got := len(leader.sm.state()); got != 15 {
		t.Fatalf("leader has %d keys, want 15", got)
	}
}

// TestNonvoters: non-voters added with AddNonvoter apply every entry and show as non-voters; the quorum
// stays available without them; with 2 of 3 voters down a write fails with ErrNoQuorum within its
// context.
func TestNonvoters(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3, nil)
	leader := c.waitLeader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n4, n5 := c.startNonvoter(4), c.startNonvoter(5)
	for _, n := range []*node{n4, n5} {
		if err := leader.q.AddNonvoter(ctx, n.id, n.q.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	if err := leader.q.AddNonvoter(ctx, 4, n4.q.Addr()); err != nil {
		t.Fatalf("adding a non-voter again: %v", err)
	}
	if err := leader.q.AddNonvoter(ctx, 1, "127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "is a voter") {
		t.Fatalf("AddNonvoter with a voter's id = %v", err)
	}
	if err := leader.q.RemoveServer(ctx, leader.id); err == nil {
		t.Fatal("the leader removed itself")
	}
	st := leader.q.Status()
	if len(st.Servers) != 5 {
		t.Fatalf("servers %+v", st.Servers)
	}
	for _, s := range st.Servers {
		if s.Voter != (s.ID <= 3) {
			t.Fatalf("server %+v: voter should be %v", s, s.ID <= 3)
		}
	}
	var last uint64
	for i := range 20 {
		_, last = propose(t, leader, "k"+strconv.Itoa(i), "v")
	}
	waitSame(t, 10*time.Second, leader.sm.state(), last, c.running()...)
	for _, n := range []*node{n4, n5} {
		if st := n.q.Status(); st.State != "follower" || st.LeaderID != leader.id || len(st.Servers) != 5 {
			t.Fatalf("non-voter %d Status() = %+v", n.id, st)
		}
		var nle *NotLeaderError
		if _, _, err := n.q.Propose(ctx, setCmd("x", "y")); !errors.As(err, &nle) || nle.LeaderID != leader.id {
			t.Fatalf("Propose on non-voter %d = %v", n.id, err)
		}
	}

	// Without the non-voters the quorum still commits; a down non-voter can be removed.
	c.stop(4)
	c.stop(5)
	for i := range 5 {
		_, last = propose(t, leader, "after"+strconv.Itoa(i), "v")
	}
	if err := leader.q.RemoveServer(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if err := leader.q.RemoveServer(ctx, 5); err != nil {
		t.Fatalf("removing an absent server: %v", err)
	}
	if got := len(leader.q.Status().Servers); got != 4 {
		t.Fatalf("%d servers after removing one of 5", got)
	}

	// A non-voter that comes back at another address is updated and catches up.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n4 = c.start(4, ln, "")
	if err := leader.q.AddNonvoter(ctx, 4, n4.q.Addr()); err != nil {
		t.Fatal(err)
	}
	for _, s := range leader.q.Status().Servers {
		if s.ID == 4 && s.Addr != n4.q.Addr() {
			t.Fatalf("non-voter 4 at %s after moving to %s", s.Addr, n4.q.Addr())
		}
	}
	_, last = propose(t, leader, "moved", "v")
	waitSame(t, 10*time.Second, leader.sm.state(), last, n4)

	// With 2 of 3 voters down nothing commits.
	for _, n := range c.running() {
		if n != leader {
			c.stop(n.id)
		}
	}
	short, cancelShort := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancelShort()
	t0 := time.Now()
	_, _, err = leader.q.Propose(short, setCmd("lost", "v"))
	took := time.Since(t0)
	if !errors.Is(err, ErrNoQuorum) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Propose without a quorum = %v, want ErrNoQuorum", err)
	}
	if took > 3*time.Second {
		t.Fatalf("Propose without a quorum took %v for a 1.5s context", took)
	}
	t.Logf("no quorum: Propose failed after %v: %v", took.Round(time.Millisecond), err)
	if leader.q.IsLeader() {
		t.Errorf("a leader without a majority still leads after its lease")
	}

	// A proposal without a deadline waits for a leader; Close ends it.
	pending := make(chan error, 1)
	go func() {
		_, _, err := leader.q.Propose(context.Background(), setCmd("never", "v"))
		pending <- err
	}()
	select {
	case err := <-pending:
		t.Fatalf("Propose without a leader or a deadline returned %v", err)
	case <-time.After(100 * time.Millisecond): // it is waiting, as it should
	}
	c.stop(leader.id)
	if err := <-pending; !errors.Is(err, ErrShutdown) {
		t.Fatalf("pending Propose after Close = %v, want ErrShutdown", err)
	}
}

// TestSnapshots: with a small threshold raft snapshots on its own, Snapshot truncates the log, and a
// voter that was down over the truncation and a non-voter added afterwards are both restored from a
// snapshot and end up equal to the leader.
func TestSnapshots(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3, func(cfg *Config) {
		cfg.SnapshotThreshold = 32
		cfg.SnapshotInterval = 50 * time.Millisecond
		cfg.TrailingLogs = 8
		cfg.walSegmentSize = 4 << 10
	})
	leader := c.waitLeader(10 * time.Second)
	var down *node
	for _, n := range c.running() {
		if n != leader {
			down = n
		}
	}
	c.stop(down.id)
	var last uint64
	for i := range 100 {
		_, last = propose(t, leader, "k"+strconv.Itoa(i%40), strconv.Itoa(i))
	}
	waitFor(t, 5*time.Second, func() error {
		if leader.q.Status().LastSnapshotIndex == 0 {
			return errors.New("no automatic snapshot yet")
		}
		return nil
	})
	if err := leader.q.Snapshot(); err != nil {
		t.Fatal(err)
	}
	st := leader.q.Status()
	first, err := leader.q.wal.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	if st.LastSnapshotIndex != last || first != last-8+1 {
		t.Fatalf("after Snapshot at %d: snapshot index %d, first log index %d; want %d, %d", last, st.LastSnapshotIndex, first, last, last-8+1)
	}

	down = c.restart(down.id)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n4 := c.startNonvoter(4)
	if err := leader.q.AddNonvoter(ctx, 4, n4.q.Addr()); err != nil {
		t.Fatal(err)
	}
	_, last = propose(t, leader, "final", "x")
	want := leader.sm.state()
	waitSame(t, 10*time.Second, want, last, c.running()...)
	for _, n := range []*node{down, n4} {
		if n.sm.restoreCount() < 1 {
			t.Errorf("node %d caught up without a snapshot (%d applies)", n.id, n.sm.applies)
		}
	}
	if !maps.Equal(want, down.sm.state()) {
		t.Fatal("restarted voter differs")
	}
}

func TestHclogAdapter(t *testing.T) {
	t.Parallel()
	lb := &logBuf{}
	l := newHclog(slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelInfo})))
	l.Info("routine", "a", 1) // raft's INFO goes to Debug: dropped here
	l.Named("net").Warn("careful", "servers", hclog.Fmt("%d-%s", 7, "x"), "lone")
	l.With("peer", "2").Error("failed", "error", errors.New("boom"))
	got := lb.b.String()
	for _, want := range []string{
		`level=WARN msg=careful component=raft.net servers=7-x extra=lone`,
		`level=ERROR msg=failed component=raft peer=2 error=boom`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("log lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "routine") || l.IsInfo() || !l.IsWarn() || l.GetLevel() != hclog.Warn {
		t.Errorf("raft's INFO should be below slog Info:\n%s", got)
	}
	l.StandardLogger(nil).Print("[WARN] from the standard logger")
	if got := lb.b.String(); !strings.Contains(got, `level=WARN msg="from the standard logger"`) {
		t.Errorf("standard logger line:\n%s", got)
	}
}
