package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client"
)

// leaders returns each partition's leader of topic as node id answers Metadata.
func (c *cluster) leaders(id int32, topic string) ([]int32, error) {
	md, err := c.metadata(id, topic)
	if err != nil {
		return nil, err
	}
	if len(md.Topics) != 1 {
		return nil, fmt.Errorf("metadata has %d topics", len(md.Topics))
	}
	if err := rerr.FromInfo(md.Topics[0].Error); err != nil {
		return nil, err
	}
	out := make([]int32, len(md.Topics[0].Partitions))
	for _, p := range md.Topics[0].Partitions {
		out[p.Partition] = p.LeaderId
	}
	return out, nil
}

// controllerOf returns the controller leader as node id sees it (-1 unknown).
func (c *cluster) controllerOf(id int32) int32 {
	s, err := c.status(id)
	if err != nil {
		return -1
	}
	return s.ControllerId
}

// producerLoad produces keyed records to topic until stop, counting acknowledged records per second of
// the run and failures.
type producerLoad struct {
	acked, failed atomic.Int64
	lastAck       atomic.Int64 // unix nanos of the latest acknowledgement
	lastErr       atomic.Value
	stop          chan struct{}
	done          sync.WaitGroup
}

func startLoad(t *testing.T, brokers []string, topic string) *producerLoad {
	p, err := client.NewProducer(brokers, client.WithAcks(client.AcksAll), client.WithLinger(2*time.Millisecond),
		client.WithDeliveryTimeout(30*time.Second), client.WithRequestTimeout(5*time.Second),
		client.WithRetryBackoff(50*time.Millisecond, 500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	l := &producerLoad{stop: make(chan struct{})}
	l.done.Add(1)
	go func() {
		defer l.done.Done()
		defer p.Close()
		ctx := context.Background()
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				p.Flush(ctx)
				return
			default:
			}
			r := client.NewRecord(topic, []byte(fmt.Sprintf("key-%d", i%97)), []byte(fmt.Sprintf("value-%d", i)))
			p.Produce(ctx, r, func(_ *client.Record, err error) {
				if err != nil {
					l.failed.Add(1)
					l.lastErr.Store(err.Error())
					return
				}
				l.acked.Add(1)
				l.lastAck.Store(time.Now().UnixNano())
			})
			if i%200 == 199 {
				time.Sleep(5 * time.Millisecond) // a steady load, not a flood that fills the buffer
			}
		}
	}()
	t.Cleanup(l.close)
	return l
}

func (l *producerLoad) close() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.done.Wait()
}

// ackedSince waits until a record is acknowledged after t0.
func (l *producerLoad) ackedAfter(t *testing.T, t0 time.Time, timeout time.Duration, what string) {
	t.Helper()
	waitFor(t, timeout, what, func() error {
		if l.lastAck.Load() > t0.UnixNano() {
			return nil
		}
		return fmt.Errorf("no acknowledgement since %v (acked %d, failed %d, last error %v)", time.Since(t0), l.acked.Load(), l.failed.Load(), l.lastErr.Load())
	})
}

// TestClusterFailover is the cluster issue's main scenario on three voters: a topic of 12 partitions is
// spread over the brokers; kill -9 of the controller leader gets a new one that accepts topics within
// 5 s; kill -9 of a broker moves all its partitions to other leaders within 10 s while a producer
// goes on; restarted nodes rejoin; and with a majority of the controllers down, metadata writes fail
// clearly while the surviving broker keeps serving its partitions.
func TestClusterFailover(t *testing.T) {
	c := startCluster(t, 3, 3)
	adm := c.admin()
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, "orders", 12, 3, nil); err != nil {
		t.Fatal(err)
	}
	// Every node answers from its own metadata: the same placement, 4 leaders each.
	var leaders []int32
	for id := int32(1); id <= 3; id++ {
		waitFor(t, 5*time.Second, fmt.Sprintf("node %d knows orders", id), func() error {
			ls, err := c.leaders(id, "orders")
			if err != nil {
				return err
			}
			if leaders != nil && !slices.Equal(ls, leaders) {
				return fmt.Errorf("node %d says leaders %v, another node %v", id, ls, leaders)
			}
			leaders = ls
			return nil
		})
	}
	count := map[int32]int{}
	for _, l := range leaders {
		count[l]++
	}
	if count[1] != 4 || count[2] != 4 || count[3] != 4 {
		t.Fatalf("leaders of 12 partitions over 3 brokers: %v, want 4 each", count)
	}
	d, err := adm.DescribeTopic(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Partitions {
		if len(p.Replicas) != 3 || len(p.ISR) != 3 || p.LeaderID != p.Replicas[0] {
			t.Fatalf("partition %+v: want 3 replicas, all in sync, the first leading", p)
		}
	}

	load := startLoad(t, c.grpcAddrs(), "orders")
	load.ackedAfter(t, time.Now(), 10*time.Second, "first acknowledgements")

	// Kill the controller leader.
	ctl := c.controllerOf(1)
	if ctl < 1 || ctl > 3 {
		t.Fatalf("controller leader %d", ctl)
	}
	killedAt := time.Now()
	c.kill(ctl)
	others := []int32{}
	for id := int32(1); id <= 3; id++ {
		if id != ctl {
			others = append(others, id)
		}
	}
	survivor := c.admin(others...)
	took := waitFor(t, 5*time.Second, "a new controller leader accepts a topic", func() error {
		if nc := c.controllerOf(others[0]); nc == ctl || nc < 0 {
			return fmt.Errorf("controller leader as node %d sees it: %d", others[0], nc)
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := survivor.CreateTopic(cctx, "after-failover", 1, 1, nil)
		if errors.Is(err, rerr.ErrTopicAlreadyExists) {
			return nil
		}
		return err
	})
	t.Logf("controller leader %d killed; a new leader accepted a topic after %v", ctl, took.Round(time.Millisecond)+time.Since(killedAt)-took)
	if time.Since(killedAt) > 5*time.Second+time.Second {
		t.Fatalf("a new controller took %v", time.Since(killedAt))
	}
	// Its partitions move to the other replicas within 10 s of the kill.
	waitFor(t, 10*time.Second-time.Since(killedAt), "partitions of the killed leader moved", func() error {
		ls, err := c.leaders(others[0], "orders")
		if err != nil {
			return err
		}
		for p, l := range ls {
			if l == ctl || l < 0 {
				return fmt.Errorf("partition %d led by %d", p, l)
			}
		}
		return nil
	})
	t.Logf("partitions of node %d moved %v after its kill", ctl, time.Since(killedAt).Round(time.Millisecond))
	load.ackedAfter(t, time.Now(), 10*time.Second, "the producer goes on after the controller leader died")

	// The killed node comes back with its data dir and rejoins.
	c.start(ctl)
	c.waitReady(30*time.Second, ctl)
	waitFor(t, 10*time.Second, "the restarted node alive in the cluster status", func() error {
		s, err := c.status(others[0])
		if err != nil {
			return err
		}
		for _, n := range s.Nodes {
			if n.NodeId == ctl {
				if n.Fenced || !n.Registered || n.Membership != "alive" {
					return fmt.Errorf("node %d: %+v", ctl, n)
				}
				return nil
			}
		}
		return fmt.Errorf("node %d missing from %v", ctl, s.Nodes)
	})

	// It catches up, rejoins the ISR of its partitions, and a preferred leader election gives it back
	// the leaderships it had: 4 partitions each again.
	waitFor(t, 30*time.Second, "the restarted broker back in every ISR", func() error {
		d, err := survivor.DescribeTopic(ctx, "orders")
		if err != nil {
			return err
		}
		for _, p := range d.Partitions {
			if !slices.Contains(p.ISR, ctl) {
				return fmt.Errorf("partition %d ISR %v", p.Partition, p.ISR)
			}
		}
		return nil
	})
	moved, err := survivor.ElectLeaders(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(moved) != 4 {
		t.Fatalf("the preferred leader election moved %v, want the 4 partitions node %d led", moved, ctl)
	}
	waitFor(t, 5*time.Second, "every node sees the preferred leaders", func() error {
		for id := int32(1); id <= 3; id++ {
			ls, err := c.leaders(id, "orders")
			if err != nil {
				return err
			}
			if n := count32(ls, ctl); n != 4 {
				return fmt.Errorf("node %d says node %d leads %d partitions: %v", id, ctl, n, ls)
			}
		}
		return nil
	})

	// Kill the broker that leads the most partitions of those that do not lead the controller quorum.
	nowCtl := c.controllerOf(others[0])
	ls, err := c.leaders(nowCtl, "orders")
	if err != nil {
		t.Fatal(err)
	}
	victim, most := int32(-1), 0
	for id := int32(1); id <= 3; id++ {
		if n := count32(ls, id); id != nowCtl && n > most {
			victim, most = id, n
		}
	}
	if victim < 0 {
		t.Fatalf("no broker but the controller leader %d leads a partition: %v", nowCtl, ls)
	}
	killedAt = time.Now()
	c.kill(victim)
	waitFor(t, 10*time.Second, "partitions of the killed broker moved", func() error {
		ls, err := c.leaders(nowCtl, "orders")
		if err != nil {
			return err
		}
		for p, l := range ls {
			if l == victim {
				return fmt.Errorf("partition %d still led by %d", p, l)
			}
		}
		s, err := c.status(nowCtl)
		if err != nil {
			return err
		}
		for _, n := range s.Nodes {
			if n.NodeId == victim && !n.Fenced {
				return fmt.Errorf("broker %d not fenced yet", victim)
			}
		}
		return nil
	})
	t.Logf("broker %d fenced and its partitions moved %v after its kill", victim, time.Since(killedAt).Round(time.Millisecond))
	load.ackedAfter(t, time.Now(), 10*time.Second, "the producer goes on after a broker died")
	c.start(victim)
	c.waitReady(30*time.Second, victim)
	load.close()
	if load.acked.Load() == 0 {
		t.Fatal("nothing acknowledged")
	}
	t.Logf("producer: %d records acknowledged, %d failed (last error: %v)", load.acked.Load(), load.failed.Load(), load.lastErr.Load())

	// A majority of the controllers goes: metadata writes fail with a clear error, reads go on.
	last := c.controllerOf(1)
	var down []int32
	for id := int32(1); id <= 3 && len(down) < 2; id++ {
		if id != last {
			down = append(down, id)
		}
	}
	// Keep the survivor the leader of something to read: produce to one of its partitions first.
	survLeaders, err := c.leaders(last, "orders")
	if err != nil {
		t.Fatal(err)
	}
	part := int32(slices.Index(survLeaders, last))
	if part < 0 {
		t.Fatalf("node %d leads no partition of orders: %v", last, survLeaders)
	}
	for _, id := range down {
		c.kill(id)
	}
	lone := c.admin(last)
	cctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	_, err = lone.CreateTopic(cctx, "no-majority", 1, 1, nil)
	cancel()
	var e *rerr.Error
	if !errors.As(err, &e) || (e.Code != runnelv1.ErrorCode_REQUEST_TIMED_OUT && e.Code != runnelv1.ErrorCode_NOT_CONTROLLER) {
		t.Fatalf("create topic without a controller majority: %v, want REQUEST_TIMED_OUT or NOT_CONTROLLER", err)
	}
	t.Logf("without a majority: %v", err)
	if _, err := c.metadata(last, "orders"); err != nil {
		t.Fatalf("metadata without a controller majority: %v", err)
	}
	cons, err := client.NewConsumer([]string{c.nodes[last].grpc})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	if err := cons.Assign("orders", part, client.OffsetEarliest()); err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	defer pcancel()
	recs, err := cons.Poll(pctx)
	if err != nil || len(recs) == 0 {
		t.Fatalf("read of orders-%d from its leader %d without a controller majority: %d records, %v", part, last, len(recs), err)
	}
}

// TestFiveNodesThreeVoters: two brokers that are not voters follow the metadata log as raft non-voters
// and answer Metadata from their own copy.
func TestFiveNodesThreeVoters(t *testing.T) {
	c := startCluster(t, 5, 3)
	adm := c.admin(4)
	if _, err := adm.CreateTopic(context.Background(), "five", 10, 2, map[string]string{"retention.ms": "3600000"}); err != nil {
		t.Fatal(err)
	}
	var want []int32
	for id := int32(1); id <= 5; id++ {
		waitFor(t, 5*time.Second, fmt.Sprintf("node %d answers metadata of five", id), func() error {
			ls, err := c.leaders(id, "five")
			if err != nil {
				return err
			}
			if want != nil && !slices.Equal(ls, want) {
				return fmt.Errorf("node %d: leaders %v, others %v", id, ls, want)
			}
			want = ls
			return nil
		})
	}
	count := map[int32]int{}
	for _, l := range want {
		count[l]++
	}
	for id := int32(1); id <= 5; id++ {
		if count[id] != 2 {
			t.Fatalf("leaders of 10 partitions over 5 brokers: %v, want 2 each", count)
		}
	}
	s, err := c.status(5)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range s.Nodes {
		wantVoter := n.NodeId <= 3
		if n.RaftVoter != wantVoter || !n.InRaftConfiguration || n.Fenced || n.Membership != "alive" {
			t.Fatalf("node %+v: want voter=%v, in the raft configuration, unfenced and alive", n, wantVoter)
		}
		if wantRole := map[bool]string{true: "controller", false: "broker"}[wantVoter]; n.Role != wantRole {
			t.Fatalf("node %d role %q, want %q", n.NodeId, n.Role, wantRole)
		}
	}
	if len(s.Nodes) != 5 || s.ControllerId < 1 || s.ControllerId > 3 {
		t.Fatalf("status: %d nodes, controller %d", len(s.Nodes), s.ControllerId)
	}

	// A consumer group reads every record: its coordinator is the leader of its __consumer_offsets
	// partition, somewhere in the cluster, and the SDK finds it through any node.
	const n = 2000
	p, err := client.NewProducer(c.grpcAddrs(5), client.WithAcks(client.AcksAll))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < n; i++ {
		p.Produce(ctx, client.NewRecord("five", []byte(fmt.Sprint("k", i%50)), []byte(fmt.Sprint(i))), func(_ *client.Record, err error) {
			if err != nil {
				t.Errorf("produce: %v", err)
			}
		})
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p.Close()
	g, err := client.NewGroupConsumer(c.grpcAddrs(4), "readers", client.WithAutoOffsetReset(client.OffsetEarliest()))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Subscribe("five"); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	waitFor(t, 30*time.Second, "the group reads every record", func() error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		recs, err := g.Poll(pctx)
		if err != nil && pctx.Err() == nil {
			return err
		}
		for _, r := range recs {
			seen[string(r.Value)] = true
		}
		if len(seen) < n {
			return fmt.Errorf("%d of %d records", len(seen), n)
		}
		return nil
	})
	if err := g.CommitSync(ctx); err != nil {
		t.Fatal(err)
	}
	desc, err := c.admin(1).DescribeGroup(ctx, "readers")
	if err != nil {
		t.Fatal(err)
	}
	if len(desc.Members) != 1 || desc.CoordinatorID < 1 || desc.CoordinatorID > 5 {
		t.Fatalf("group description %+v", desc)
	}
	offs, err := c.admin(2).FetchOffsets(ctx, "readers")
	if err != nil {
		t.Fatal(err)
	}
	var committed int64
	for _, o := range offs {
		committed += o.Offset
	}
	if committed != n {
		t.Fatalf("committed offsets sum to %d, want %d", committed, n)
	}
}

// TestClusterRefusals: a wrong or missing gossip key and a node id already in use are refused with
// exit status 3 and a clear log line; a data dir of another cluster with exit status 4.
func TestClusterRefusals(t *testing.T) {
	key := "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=" // 32 bytes
	c := newCluster(t, 1, 1)
	c.start(1, "RUNNEL_GOSSIP_KEY="+key)
	c.waitReady(30*time.Second, 1)

	refused := func(id int32, code int, logWant string, env ...string) {
		t.Helper()
		c.start(id, env...)
		if got := c.waitExit(id, 30*time.Second); got != code {
			t.Fatalf("node %d: exit status %d, want %d; log:\n%s", id, got, code, c.nodes[id].tail(30))
		}
		if l := c.nodes[id].log(); !strings.Contains(strings.ToLower(l), logWant) {
			t.Fatalf("node %d: log does not say %q:\n%s", id, logWant, c.nodes[id].tail(30))
		}
	}
	c.addNode(2)
	refused(2, 3, "key", "RUNNEL_GOSSIP_KEY=AQECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=")
	c.addNode(3)
	refused(3, 3, "key")
	// Node id 1 is taken by the running node.
	dup := c.addNode(11)
	c.startWithID(11, 1, "RUNNEL_GOSSIP_KEY="+key)
	if got := c.waitExit(11, 30*time.Second); got != 3 {
		t.Fatalf("duplicate node id: exit status %d, want 3; log:\n%s", got, dup.tail(30))
	}
	if !strings.Contains(dup.log(), "node id") {
		t.Fatalf("duplicate node id: log does not say so:\n%s", dup.tail(30))
	}
	if !c.running(1) || !c.ready(1) {
		t.Fatal("the running node was disturbed by the refused ones")
	}

	// A data dir of another cluster: run a node 4 alone as its own cluster, stop it, then start node 4
	// of cluster 1 with that data dir.
	other := &cluster{t: t, nodes: map[int32]*node{}}
	o := other.addNode(4)
	other.voters = "4@" + o.raft
	t.Cleanup(other.stopAll)
	other.start(4)
	other.waitReady(30*time.Second, 4)
	other.signal(4, syscall.SIGTERM)
	if code := other.waitExit(4, 20*time.Second); code != 0 {
		t.Fatalf("the other cluster's node stopped with %d", code)
	}
	n4 := c.addNode(4)
	n4.dir = o.dir
	c.start(4, "RUNNEL_GOSSIP_KEY="+key)
	if got := c.waitExit(4, 30*time.Second); got != 4 {
		t.Fatalf("foreign data dir: exit status %d, want 4; log:\n%s", got, n4.tail(30))
	}
	if !strings.Contains(n4.log(), "belongs to") {
		t.Fatalf("foreign data dir: log does not say so:\n%s", n4.tail(30))
	}
}

func count32(s []int32, v int32) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}
