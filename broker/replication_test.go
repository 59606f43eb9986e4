package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/client/batch"
)

// testQuorum stands in for the controller quorum's raft log: every proposed command gets the next
// offset and is applied, in that order, to every node's real meta.FSM before Propose returns. So all
// nodes see the same metadata log, as with raft, and a test decides when a change happens.
type testQuorum struct {
	mu    sync.Mutex
	index uint64
	fsms  map[int32]*meta.FSM
}

// propose appends cmd to the log and applies it on every node; it returns the offset and the result.
func (q *testQuorum) propose(cmd meta.Command) (uint64, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.index++
	data := cmd.Encode()
	ids := make([]int32, 0, len(q.fsms))
	for id := range q.fsms {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var err error
	for _, id := range ids {
		err = q.fsms[id].Apply(q.index, data).(meta.Result).Err
	}
	return q.index, err
}

// testMeta is one node's Metadata: its own FSM of the shared log.
type testMeta struct {
	q     *testQuorum
	fsm   *meta.FSM
	epoch atomic.Uint64
	// beforePropose, when set, runs in Propose before the command reaches the quorum: a test holds a
	// proposal in flight with it, or makes it fail without reaching the quorum (its error).
	beforePropose atomic.Pointer[func(meta.Command) error]
}

func (m *testMeta) Image() *meta.Image       { return m.fsm.Image() }
func (m *testMeta) Changed() <-chan struct{} { return m.fsm.Changed() }
func (m *testMeta) ControllerID() int32      { return 1 }
func (m *testMeta) Epoch() uint64            { return m.epoch.Load() }
func (m *testMeta) Propose(_ context.Context, cmd meta.Command) (*meta.Image, error) {
	if f := m.beforePropose.Load(); f != nil {
		if err := (*f)(cmd); err != nil {
			return nil, err
		}
	}
	if _, err := m.q.propose(cmd); err != nil {
		return nil, err
	}
	return m.fsm.Image(), nil
}

// testCluster is n in-process brokers, each with its own Badger store in a temporary directory and its
// Replication service on 127.0.0.1, sharing a testQuorum.
type testCluster struct {
	q       *testQuorum
	brokers map[int32]*Broker
}

// testReplicaLagTimeMax is the brokers' replica.lag.time.max in startTestCluster: long, so that no
// test's ISR shrinks unless it asks; a test of the shrink sets it shorter for its own cluster.
var testReplicaLagTimeMax = time.Minute

func startTestCluster(t *testing.T, n int) *testCluster {
	t.Helper()
	c := &testCluster{q: &testQuorum{fsms: map[int32]*meta.FSM{}}, brokers: map[int32]*Broker{}}
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("RUNNEL_TEST_LOG") == "1" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	metas := map[int32]*testMeta{}
	addrs := map[int32]string{}
	lis := map[int32]net.Listener{}
	for id := int32(1); id <= int32(n); id++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis[id], addrs[id] = l, l.Addr().String()
		fsm := meta.NewFSM(logger)
		c.q.fsms[id] = fsm
		metas[id] = &testMeta{q: c.q, fsm: fsm}
	}
	for id := int32(1); id <= int32(n); id++ {
		epoch, err := c.q.propose(meta.Command{Type: meta.CmdRegisterBroker, Broker: &meta.Broker{ID: id, GRPCAddr: addrs[id],
			Incarnation: "test-" + strconv.Itoa(int(id))}})
		if err != nil {
			t.Fatal(err)
		}
		metas[id].epoch.Store(epoch)
		if _, err := c.q.propose(meta.Command{Type: meta.CmdUnfenceBroker, BrokerID: id}); err != nil {
			t.Fatal(err)
		}
	}
	for id := int32(1); id <= int32(n); id++ {
		o := plog.DefaultOptions(t.TempDir())
		o.MemTableSize, o.BlockCacheSize, o.IndexCacheSize = 8<<20, 8<<20, 4<<20
		st, err := plog.Open(o)
		if err != nil {
			t.Fatal(err)
		}
		b, err := New(Config{NodeID: id, AdvertisedAddr: addrs[id], ReplicaLagTimeMax: testReplicaLagTimeMax}, st, metas[id], logger.With("node", id))
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes))
		runnelv1.RegisterReplicationServer(srv, b)
		go srv.Serve(lis[id])
		c.brokers[id] = b
		t.Cleanup(func() {
			srv.Stop()
			b.Close()
			st.Close()
		})
	}
	return c
}

// replicaOn returns node id's replica state of partition 0 of topic, nil until the node took it up.
func (c *testCluster) replicaOn(id int32, topic string) *replica {
	tp, ok := c.brokers[id].md.Image().Topic(topic)
	if !ok {
		return nil
	}
	return c.brokers[id].repl.get(plog.PartitionID{TopicNum: tp.Num, Partition: 0})
}

// following is a condition for waitUntil: node id follows leader at epoch for partition 0 of topic and
// has run its leader-epoch exchange.
func (c *testCluster) following(topic string, id, leader, epoch int32) func() error {
	return func() error {
		r := c.replicaOn(id, topic)
		if r == nil {
			return fmt.Errorf("node %d has not taken up its replica", id)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.leader || r.leaderID != leader || r.epoch != epoch || !r.truncated {
			return fmt.Errorf("node %d: leader %v, leader id %d, epoch %d, truncated %v", id, r.leader, r.leaderID, r.epoch, r.truncated)
		}
		return nil
	}
}

// produce sends one batch to partition 0 of topic on node id (a copy: the broker stamps it in place).
func (c *testCluster) produce(id int32, topic string, records []byte, acks runnelv1.Acks) (int64, error) {
	resp, err := c.brokers[id].Produce(context.Background(), &runnelv1.ProduceRequest{Acks: acks, TimeoutMs: 10_000,
		Partitions: []*runnelv1.ProducePartition{{Topic: topic, Partition: 0, Records: bytes.Clone(records)}}})
	if err != nil {
		return -1, rerr.FromStatus(err)
	}
	r := resp.Partitions[0]
	return r.BaseOffset, rerr.FromInfo(r.Error)
}

// idempotentBatch builds a batch of n records of producer pid (epoch 0) from base sequence seq.
func idempotentBatch(pid int64, seq int32, n int, tag string) []byte {
	var b batch.Builder
	for i := 0; i < n; i++ {
		b.Append(time.Now().UnixMilli(), []byte("k"), []byte(fmt.Sprintf("%s-%d", tag, i)), nil)
	}
	b.SetProducer(pid, 0, seq)
	return bytes.Clone(b.Build(batch.CompressionNone))
}

// localLog reads a replica's whole log up to its local end.
func localLog(t *testing.T, r *replica) []byte {
	t.Helper()
	var out []byte
	for off := r.log.LogStartOffset(); off < r.log.DurableEnd(); {
		data, err := r.log.ReadLocal(nil, off, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if err := batch.Split(data, func(b []byte, h batch.Header) error {
			out = append(out, b...)
			off = h.NextOffset()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// waitUntil polls cond until it returns nil, failing the test with its last error after 15 s.
func waitUntil(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fetchGates holds chosen replica-fetch answers in flight (testHookFetched): a gate for (follower,
// leader) stops the next answer that matches it until the test releases it.
type fetchGates struct {
	mu    sync.Mutex
	gates map[[2]int32]*fetchGate // waiting for an answer
	all   []*fetchGate            // every gate made, for openAll
}

type fetchGate struct {
	withRecords bool          // only an answer that carries batches stops
	entered     chan struct{} // closed when an answer stopped at the gate
	release     chan struct{} // closed by the test to let it through
	applied     chan struct{} // closed once the fetcher applied (or discarded) it
	once        sync.Once
}

func (g *fetchGates) hold(node, leader int32, withRecords bool) *fetchGate {
	gt := &fetchGate{withRecords: withRecords, entered: make(chan struct{}), release: make(chan struct{}), applied: make(chan struct{})}
	g.mu.Lock()
	g.gates[[2]int32{node, leader}] = gt
	g.all = append(g.all, gt)
	g.mu.Unlock()
	return gt
}

func (gt *fetchGate) open() { gt.once.Do(func() { close(gt.release) }) }

func (g *fetchGates) openAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.gates)
	for _, gt := range g.all {
		gt.open()
	}
}

func (g *fetchGates) hook(node, leader int32, resp *runnelv1.ReplicaFetchResponse) func() {
	g.mu.Lock()
	gt := g.gates[[2]int32{node, leader}]
	if gt != nil && gt.withRecords && !slices.ContainsFunc(resp.Partitions, func(p *runnelv1.ReplicaFetchPartitionResult) bool { return len(p.Records) > 0 }) {
		gt = nil
	}
	if gt != nil {
		delete(g.gates, [2]int32{node, leader})
	}
	g.mu.Unlock()
	if gt == nil {
		return nil
	}
	close(gt.entered)
	<-gt.release
	return func() { close(gt.applied) }
}

// startGatedCluster starts n brokers whose replica-fetch answers the returned gates can hold, and
// creates topic with one partition on all of them (min.insync.replicas=2); it returns the partition's
// first assignment.
func startGatedCluster(t *testing.T, n int, topic string) (*testCluster, *fetchGates, meta.PartitionState) {
	t.Helper()
	gates := &fetchGates{gates: map[[2]int32]*fetchGate{}}
	testHookFetched = gates.hook
	t.Cleanup(func() { testHookFetched = nil }) // runs last: after the brokers stopped
	c := startTestCluster(t, n)
	t.Cleanup(gates.openAll) // runs first: no fetcher stays stopped at a gate while its broker closes
	if _, err := c.q.propose(meta.Command{Type: meta.CmdCreateTopic, TopicID: topic + "-id", Spec: &meta.Spec{Name: topic,
		Partitions: 1, ReplicationFactor: int32(n), Configs: map[string]string{"min.insync.replicas": "2"}}}); err != nil {
		t.Fatal(err)
	}
	tp, _ := c.brokers[1].md.Image().Topic(topic)
	return c, gates, tp.Assignment[0]
}

// waitClosed waits for ch with a deadline.
func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(15 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// waitResult waits for an outcome on ch with a deadline and returns it.
func waitResult(t *testing.T, what string, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(15 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return nil
	}
}

// TestStaleFetchAnswerAfterLeaderChange is the CI failure of TestReplicationSurvivesLeaderKills where
// a replica's log held the same records as the others' below the HW but one batch carried another
// partition leader epoch. Leader A at epoch 0 writes batch X (an idempotent producer's) and answers the
// long polls of its followers B and C with it; the answers are still in flight when A loses the
// leadership to B at epoch 1 (A is fenced: killed or paused in the e2e test). C follows B and finds
// nothing to truncate: B's log ends where X begins. Then C's stale answer from A arrives. The producer
// retries X on B, which writes it at the same offset under epoch 1. A replica must not take an answer
// to a fetch it sent under an earlier role: C's log must equal B's, byte for byte.
func TestStaleFetchAnswerAfterLeaderChange(t *testing.T) {
	const topic = "stale"
	c, gates, st := startGatedCluster(t, 3, topic)
	a := st.Leader
	var b, cc int32 // b: the replica elected when a is fenced (the first other one in replica order)
	for _, id := range st.Replicas {
		switch {
		case id == a:
		case b == 0:
			b = id
		default:
			cc = id
		}
	}
	following := func(id, leader, epoch int32) func() error { return c.following(topic, id, leader, epoch) }
	waitUntil(t, "followers ready at epoch 0", following(b, a, 0))
	waitUntil(t, "followers ready at epoch 0", following(cc, a, 0))

	// Committed records first, so every replica has epoch 0 in its leader-epoch cache.
	const pid = 4242
	if _, err := c.produce(a, topic, idempotentBatch(pid, 0, 10, "committed"), runnelv1.Acks_ACKS_ALL); err != nil {
		t.Fatalf("produce to the first leader: %v", err)
	}

	// X reaches C and B only in answers that stay in flight; B's never arrives.
	toC := gates.hold(cc, a, true)
	gates.hold(b, a, true)
	x := idempotentBatch(pid, 10, 5, "x")
	firstTry := make(chan error, 1)
	go func() {
		_, err := c.produce(a, topic, x, runnelv1.Acks_ACKS_ALL)
		firstTry <- err
	}()
	waitClosed(t, "C's answer from A carrying X", toC.entered)
	xOffset := c.replicaOn(cc, topic).log.LogEndOffset()

	// A is fenced; B leads at epoch 1 and C follows it, truncating nothing (B ends where X begins).
	if _, err := c.q.propose(meta.Command{Type: meta.CmdFenceBroker, BrokerID: a}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "C follows B at epoch 1", following(cc, b, 1))
	if err := waitResult(t, "the first attempt of X to fail when A lost the leadership", firstTry); err == nil {
		t.Fatal("X was acknowledged by A, which never had the ISR's copy")
	}

	// C's next answer from B waits, so C fetches again only once B has the retry of X.
	fromB := gates.hold(cc, b, false)
	waitClosed(t, "C's answer from B", fromB.entered)
	toC.open() // the stale answer from A arrives
	waitClosed(t, "C's stale answer from A applied or dropped", toC.applied)

	// The producer retries X on B (same producer id, epoch and sequence): B has no copy, so it writes it,
	// at X's offset, under epoch 1.
	retry := make(chan error, 1)
	go func() {
		off, err := c.produce(b, topic, x, runnelv1.Acks_ACKS_ALL)
		if err == nil && off != xOffset {
			err = fmt.Errorf("retry of X written at %d, want %d", off, xOffset)
		}
		retry <- err
	}()
	rb := c.replicaOn(b, topic)
	waitUntil(t, "B writes the retry of X", func() error {
		if end := rb.log.DurableEnd(); end < xOffset+5 {
			return fmt.Errorf("B's durable end %d", end)
		}
		return nil
	})
	fromB.open()
	if err := waitResult(t, "the retry of X on B to be acknowledged", retry); err != nil {
		t.Fatalf("retry of X on B: %v", err)
	}

	rc := c.replicaOn(cc, topic)
	waitUntil(t, "C has B's log", func() error {
		if rc.log.DurableEnd() != rb.log.DurableEnd() {
			return fmt.Errorf("C ends at %d, B at %d", rc.log.DurableEnd(), rb.log.DurableEnd())
		}
		return nil
	})
	logB, logC := localLog(t, rb), localLog(t, rc)
	if !bytes.Equal(logB, logC) {
		var hb, hc []string
		for _, x := range []struct {
			data []byte
			out  *[]string
		}{{logB, &hb}, {logC, &hc}} {
			_ = batch.Split(x.data, func(_ []byte, h batch.Header) error {
				*x.out = append(*x.out, fmt.Sprintf("[%d..%d epoch %d seq %d]", h.BaseOffset, h.LastOffset(), h.PartitionLeaderEpoch, h.BaseSequence))
				return nil
			})
		}
		t.Fatalf("C's log differs from the leader B's:\n  B: %v\n  C: %v", hb, hc)
	}
}

// TestISRExpansionWaitsForLeaderEpochStart is KAFKA-7128. A new leader starts from the HW its last
// fetch answer carried, which may lag the old leader's: here B's is 10 while 15 records were
// acknowledged (by A, B and D). A follower out of the ISR at 10 (C) must not rejoin at that stale HW:
// elected next, it would miss acknowledged records. It rejoins once it has what B had when its
// leadership began.
func TestISRExpansionWaitsForLeaderEpochStart(t *testing.T) {
	const topic = "epochstart"
	c, gates, st := startGatedCluster(t, 4, topic)
	a, b, cc, d := st.Leader, st.Replicas[1], st.Replicas[2], st.Replicas[3] // b: elected when a is fenced
	if st.Replicas[0] != a {
		t.Fatalf("leader %d is not the first replica of %v", a, st.Replicas)
	}
	for _, id := range []int32{b, cc, d} {
		waitUntil(t, "followers ready at epoch 0", c.following(topic, id, a, 0))
	}
	const pid = 4343
	if _, err := c.produce(a, topic, idempotentBatch(pid, 0, 10, "one"), runnelv1.Acks_ACKS_ALL); err != nil {
		t.Fatalf("first batch: %v", err)
	}

	// C falls behind: its next answer from A is held, so once that answer is in, C sends A no more
	// fetches (one would take it back into the ISR at A's HW), and it leaves the ISR.
	waitClosed(t, "C's fetcher stopped at A", gates.hold(cc, a, false).entered)
	ra := c.replicaOn(a, topic)
	c.applyISR(t, ra, []int32{a, b, d})

	// Records 10-14 are acknowledged by A, B and D; the answer that would tell B the new HW is held.
	toB := gates.hold(b, a, true)
	acked := make(chan error, 1)
	go func() {
		_, err := c.produce(a, topic, idempotentBatch(pid, 10, 5, "two"), runnelv1.Acks_ACKS_ALL)
		acked <- err
	}()
	waitClosed(t, "B's answer carrying the second batch", toB.entered)
	gates.hold(b, a, false)
	toB.open()
	if err := waitResult(t, "the second batch to be acknowledged", acked); err != nil {
		t.Fatalf("second batch: %v", err)
	}
	rb := c.replicaOn(b, topic)
	if hw := rb.log.HighWatermark(); hw != 10 {
		t.Fatalf("B's HW is %d, want 10 (behind A's 15): the scenario did not happen", hw)
	}

	// A and D stop; A is fenced and B leads at epoch 1 with ISR {B, D}. D's log end is unknown to B,
	// so B's HW stays 10.
	c.brokers[d].Close()
	c.brokers[a].Close()
	fromB := gates.hold(cc, b, true)
	if _, err := c.q.propose(meta.Command{Type: meta.CmdFenceBroker, BrokerID: a}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "B leads at epoch 1", func() error {
		rb.mu.Lock()
		defer rb.mu.Unlock()
		if !rb.leader || rb.epoch != 1 {
			return fmt.Errorf("B: leader %v epoch %d", rb.leader, rb.epoch)
		}
		return nil
	})
	if hw := rb.log.HighWatermark(); hw != 10 {
		t.Fatalf("B's HW as leader is %d, want 10", hw)
	}

	// C follows B from 10 (its answers from B that carry records are held, from its first): B must see
	// that fetch and keep C out of the ISR.
	waitUntil(t, "B sees C's fetch at 10", func() error {
		rb.mu.Lock()
		defer rb.mu.Unlock()
		f := rb.followers[cc]
		if f == nil || f.leo != 10 {
			return fmt.Errorf("B's view of C: %+v", f)
		}
		if rb.isrChange || slices.Contains(rb.isr, cc) {
			t.Fatalf("B takes C back into the ISR at offset 10, below the 15 records B had when elected (ISR %v, change proposed %v)", rb.isr, rb.isrChange)
		}
		return nil
	})

	// Once C has B's records it rejoins.
	fromB.open()
	waitUntil(t, "C rejoins the ISR", func() error {
		st, _ := c.brokers[b].md.Image().Topic(topic)
		if isr := st.Assignment[0].ISR; !slices.Contains(isr, cc) {
			return fmt.Errorf("ISR %v", isr)
		}
		return nil
	})
}

// TestProduceNeedsLeadershipTakenUp: an image can show a broker leading at a new epoch before its
// replication layer took that leadership up (apply runs after the image changes). Until it has, a
// produce of any acks value is refused: stamped with the new epoch it would pass the log's fence, and
// the replica's truncation as a follower of the old epoch could still cut it.
func TestProduceNeedsLeadershipTakenUp(t *testing.T) {
	const topic = "takenup"
	c, _, st := startGatedCluster(t, 3, topic)
	a, b := st.Replicas[0], st.Replicas[1]
	waitUntil(t, "B follows A at epoch 0", c.following(topic, b, a, 0))
	tp, _ := c.brokers[a].md.Image().Topic(topic)
	if _, err := c.brokers[a].replicaOf(tp, 0, false); err != nil {
		t.Fatalf("the leader A at epoch 0: %v", err)
	}
	// The image of a moment later, as B would see it before its apply ran: B leads at epoch 1.
	next := *tp
	next.Assignment = slices.Clone(tp.Assignment)
	next.Assignment[0].Leader, next.Assignment[0].LeaderEpoch = b, 1
	for _, acksAll := range []bool{false, true} {
		if _, err := c.brokers[b].replicaOf(&next, 0, acksAll); !errors.Is(err, rerr.ErrLeaderNotAvailable) {
			t.Fatalf("B, still following, asked to write at epoch 1 (acks=all %v): %v, want LEADER_NOT_AVAILABLE", acksAll, err)
		}
	}
}

// TestPendingISRExpansionHoldsHW: a leader counts a follower in the HW from the moment it proposes
// taking it back into the ISR (Kafka's maximal ISR, KIP-497), not from when the new ISR comes back to
// it. Leader A proposes adding C, which caught up at offset 10; the proposal is held in flight while
// records 10-14 are written and B fetches them, and C's answer carrying them is held. Counting the old
// ISR {A, B}, A would acknowledge them. Then the expansion commits, A and B stop and are fenced, and C,
// in the ISR, is elected without records 10-14: acknowledged records lost. The
// shape of the e2e loss in TestReplicationSurvivesLeaderKills, where the leader of a follower just
// restarted and catching up was paused (SIGSTOP) and another elected.
func TestPendingISRExpansionHoldsHW(t *testing.T) {
	const pid = 5151
	c, gates, a, b, cc, ra, first := rejoinScenario(t, "maximalisr", pid)
	topic := ra.topic

	// A's proposal to take C back is held in flight; so is C's first answer with records.
	proposed, commit := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var expansion meta.Command
	hold := func(cmd meta.Command) error {
		if cmd.Type == meta.CmdAlterPartition && slices.Contains(cmd.ISR, cc) {
			once.Do(func() { expansion = cmd; close(proposed) })
			<-commit
		}
		return nil
	}
	c.brokers[a].md.(*testMeta).beforePropose.Store(&hold)
	var commitOnce sync.Once
	release := func() { commitOnce.Do(func() { close(commit) }) }
	t.Cleanup(release)
	toC := gates.hold(cc, a, true)
	first.open()
	waitClosed(t, "A proposes C back into the ISR", proposed)
	if top, ok := c.brokers[a].md.Image().Topic(topic); !ok || expansion.TopicID != top.ID {
		t.Errorf("the expansion names topic id %q, want the topic's %q", expansion.TopicID, top.ID)
	}

	acked := make(chan error, 1)
	go func() {
		// A short request timeout: the broker's Close below leaves a waiting append to it.
		resp, err := c.brokers[a].Produce(context.Background(), &runnelv1.ProduceRequest{Acks: runnelv1.Acks_ACKS_ALL, TimeoutMs: 3000,
			Partitions: []*runnelv1.ProducePartition{{Topic: topic, Partition: 0, Records: idempotentBatch(pid, 10, 5, "two")}}})
		if err == nil {
			err = rerr.FromInfo(resp.Partitions[0].Error)
		}
		acked <- err
	}()
	waitClosed(t, "C's answer carrying the second batch", toC.entered)
	waitUntil(t, "A sees B's fetch past the second batch", fetchedTo(ra, b, 15))
	if hw := ra.log.HighWatermark(); hw != 10 {
		t.Errorf("A's HW is %d with the expansion to C pending and C at 10: want 10", hw)
	}

	// The expansion commits; A and B are fenced and C, in the ISR, leads.
	release()
	waitUntil(t, "the expansion is committed", func() error {
		tp, _ := c.brokers[cc].md.Image().Topic(topic)
		if isr := tp.Assignment[0].ISR; !slices.Contains(isr, cc) {
			return fmt.Errorf("ISR %v", isr)
		}
		return nil
	})
	c.brokers[b].Close()
	c.brokers[a].Close()
	for _, id := range []int32{b, a} {
		if _, err := c.q.propose(meta.Command{Type: meta.CmdFenceBroker, BrokerID: id}); err != nil {
			t.Fatal(err)
		}
	}
	rc := c.replicaOn(cc, topic)
	waitUntil(t, "C leads", func() error {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if !rc.leader {
			return fmt.Errorf("C: leader %v epoch %d", rc.leader, rc.epoch)
		}
		return nil
	})
	toC.open() // the answer of the old leader is dropped: C's role changed
	var err error
	select {
	case err = <-acked:
	case <-time.After(15 * time.Second):
		t.Fatal("the second batch's produce did not finish")
	}
	if end := rc.log.LogEndOffset(); err == nil && end < 15 {
		t.Fatalf("records 10-14 were acknowledged, and the new leader C's log ends at %d", end)
	}
	if err == nil {
		t.Fatal("the second batch was acknowledged though C, counted in the HW, never had it")
	}
}

// TestPendingISRExpansionSettledByCheckISR: an expansion whose outcome never comes back (here its
// proposal fails as a timeout would, without reaching the controller) keeps its joiner in the maximal
// ISR, so the HW waits for it; once the joiner has not caught up for replica.lag.time.max, the leader
// proposes the ISR it has, which moves the partition epoch and settles the expansion: the HW moves on
// without the joiner, and the write waiting for it is acknowledged. Without that, a joiner that stopped
// right after being proposed would hold the HW, and every acks=all write, for good.
func TestPendingISRExpansionSettledByCheckISR(t *testing.T) {
	testReplicaLagTimeMax = 600 * time.Millisecond
	t.Cleanup(func() { testReplicaLagTimeMax = time.Minute })
	const pid = 6161
	c, gates, a, b, cc, ra, first := rejoinScenario(t, "maximalisrsettle", pid)
	topic := ra.topic

	// Every proposal to take C back fails as if it had timed out.
	var refused atomic.Int32
	fail := func(cmd meta.Command) error {
		if cmd.Type == meta.CmdAlterPartition && slices.Contains(cmd.ISR, cc) {
			refused.Add(1)
			return rerr.New(runnelv1.ErrorCode_REQUEST_TIMED_OUT, "test: the proposal's outcome is unknown")
		}
		return nil
	}
	c.brokers[a].md.(*testMeta).beforePropose.Store(&fail)

	// C comes back at 10 and stops again at its first answer with records.
	toC := gates.hold(cc, a, true)
	first.open()
	waitUntil(t, "A proposes C back", func() error {
		if refused.Load() == 0 {
			return errors.New("no proposal yet")
		}
		return nil
	})

	acked := make(chan error, 1)
	go func() {
		_, err := c.produce(a, topic, idempotentBatch(pid, 10, 5, "two"), runnelv1.Acks_ACKS_ALL)
		acked <- err
	}()
	waitClosed(t, "C's answer carrying the second batch", toC.entered)
	waitUntil(t, "A sees B's fetch past the second batch", fetchedTo(ra, b, 15))
	// Until the settle (replica.lag.time.max after the last proposal), C holds the HW. Read in this
	// order, the answer first: the HW moves only after the maximal ISR has lost C.
	var early error
	finished := false
	select {
	case early = <-acked:
		finished = true
	default:
	}
	ra.mu.Lock()
	maximal, hw := slices.Clone(ra.maximalISR), ra.log.HighWatermark()
	ra.mu.Unlock()
	if slices.Contains(maximal, cc) && (hw > 10 || finished) {
		t.Fatalf("with C (at 10) in the maximal ISR %v: HW %d, the second batch finished %v (%v)", maximal, hw, finished, early)
	}
	if finished {
		acked <- early // settled already (a slow machine): checked below
	}

	// C stays stopped: the leader's own proposal settles the expansion and the write is acknowledged.
	if err := waitResult(t, "the second batch to be acknowledged (the pending expansion holds the HW)", acked); err != nil {
		t.Fatalf("second batch: %v", err)
	}
	ra.mu.Lock()
	defer ra.mu.Unlock()
	if ra.maximalISR != nil || slices.Contains(ra.isr, cc) {
		t.Fatalf("after the settle: ISR %v, maximal ISR %v", ra.isr, ra.maximalISR)
	}
	if hw := ra.log.HighWatermark(); hw != 15 {
		t.Fatalf("A's HW is %d, want 15", hw)
	}
}

// rejoinScenario starts three gated brokers with topic (one partition, leader A, followers B and C),
// writes 10 records of producer pid with acks=all, and takes C out of the ISR: its fetcher is stopped
// at A's next answer, at the returned gate (still closed), and A has applied the ISR {A, B}. It returns
// the cluster, the gates, A, B, C and A's replica state.
func rejoinScenario(t *testing.T, topic string, pid int64) (c *testCluster, gates *fetchGates, a, b, cc int32, ra *replica, stopped *fetchGate) {
	t.Helper()
	c, gates, st := startGatedCluster(t, 3, topic)
	a, b, cc = st.Leader, st.Replicas[1], st.Replicas[2]
	for _, id := range []int32{b, cc} {
		waitUntil(t, "followers ready at epoch 0", c.following(topic, id, a, 0))
	}
	if _, err := c.produce(a, topic, idempotentBatch(pid, 0, 10, "one"), runnelv1.Acks_ACKS_ALL); err != nil {
		t.Fatalf("first batch: %v", err)
	}
	stopped = gates.hold(cc, a, false)
	waitClosed(t, "C's fetcher stopped at A", stopped.entered)
	ra = c.replicaOn(a, topic)
	c.applyISR(t, ra, []int32{a, b})
	return c, gates, a, b, cc, ra, stopped
}

// fetchedTo is a condition for waitUntil: leader r has seen follower id fetch at end or beyond.
func fetchedTo(r *replica, id int32, end int64) func() error {
	return func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if f := r.followers[id]; f == nil || f.leo < end {
			return fmt.Errorf("the leader's view of follower %d: %+v", id, f)
		}
		return nil
	}
}

// applyISR has the controller set the ISR of leader r's partition (at its epochs, as r's
// AlterPartition would) and waits until r applied it.
func (c *testCluster) applyISR(t *testing.T, r *replica, isr []int32) {
	t.Helper()
	r.mu.Lock()
	leader, epoch, pe := r.leaderID, r.epoch, r.partitionEpoch
	r.mu.Unlock()
	if _, err := c.q.propose(meta.Command{Type: meta.CmdAlterPartition, Name: r.topic, Partition: r.partition, BrokerID: leader,
		LeaderEpoch: epoch, PartitionEpoch: pe, ISR: isr}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, fmt.Sprintf("the leader applies the ISR %v", isr), func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !slices.Equal(r.isr, isr) {
			return fmt.Errorf("ISR %v", r.isr)
		}
		return nil
	})
}
