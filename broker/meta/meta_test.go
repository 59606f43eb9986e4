package meta

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/runnel-io/runnel/api/rerr"
	"pgregory.net/rapid"
)

// cluster applies commands in order like the metadata log does, failing the test on refusals unless
// asked not to.
type cluster struct {
	t   testing.TB
	img *Image
	idx uint64
}

func newCluster(t testing.TB) *cluster {
	c := &cluster{t: t, img: Empty()}
	c.must(Command{Type: CmdInitCluster, ClusterID: "c1"})
	return c
}

func (c *cluster) apply(cmd Command) Result {
	c.idx++
	var res Result
	c.img, res = Apply(c.img, c.idx, cmd)
	return res
}

func (c *cluster) must(cmd Command) Result {
	c.t.Helper()
	res := c.apply(cmd)
	if res.Err != nil {
		c.t.Fatalf("%s: %v", cmd.Type, res.Err)
	}
	return res
}

// broker registers and unfences broker id (in rack).
func (c *cluster) broker(id int32, rack string) {
	c.t.Helper()
	res := c.must(Command{Type: CmdRegisterBroker, Broker: &Broker{ID: id, GRPCAddr: fmt.Sprintf("h:%d", id), Rack: rack, Incarnation: "i1"}})
	c.must(Command{Type: CmdUnfenceBroker, BrokerID: id, BrokerEpoch: res.Broker.Epoch})
}

func (c *cluster) create(name string, partitions, rf int32, configs map[string]string) *Topic {
	c.t.Helper()
	return c.must(Command{Type: CmdCreateTopic, Spec: &Spec{Name: name, Partitions: partitions, ReplicationFactor: rf, Configs: configs},
		TopicID: "id-" + name, CreatedMs: 1}).Topic
}

func TestRegisterFencedUntilUnfenced(t *testing.T) {
	c := newCluster(t)
	res := c.must(Command{Type: CmdRegisterBroker, Broker: &Broker{ID: 1, GRPCAddr: "h:1", Incarnation: "a"}})
	if !res.Broker.Fenced || res.Broker.Epoch != c.idx {
		t.Fatalf("registered broker %+v: want fenced with epoch %d", res.Broker, c.idx)
	}
	if _, err := c.img.ValidateCreate(Spec{Name: "t"}); !errors.Is(err, rerr.ErrInvalidReplicationFactor) {
		t.Fatalf("create with only fenced brokers: %v", err)
	}
	if r := c.apply(Command{Type: CmdUnfenceBroker, BrokerID: 1, BrokerEpoch: res.Broker.Epoch + 7}); !errors.Is(r.Err, rerr.ErrStaleBrokerEpoch) {
		t.Fatalf("unfence with a wrong epoch: %v", r.Err)
	}
	c.must(Command{Type: CmdUnfenceBroker, BrokerID: 1, BrokerEpoch: res.Broker.Epoch})
	if !c.img.Alive(1) {
		t.Fatal("broker 1 not alive after unfence")
	}
	// The same incarnation registering again changes nothing; a new one is fenced with a new epoch.
	again := c.must(Command{Type: CmdRegisterBroker, Broker: &Broker{ID: 1, GRPCAddr: "h:1", Incarnation: "a"}})
	if again.Broker.Fenced || again.Broker.Epoch != res.Broker.Epoch {
		t.Fatalf("re-registration of the same incarnation: %+v", again.Broker)
	}
	restarted := c.must(Command{Type: CmdRegisterBroker, Broker: &Broker{ID: 1, GRPCAddr: "h:1", Incarnation: "b"}})
	if !restarted.Broker.Fenced || restarted.Broker.Epoch <= res.Broker.Epoch {
		t.Fatalf("registration of a new incarnation: %+v", restarted.Broker)
	}
	// Another broker may not take a live broker's address.
	c.must(Command{Type: CmdUnfenceBroker, BrokerID: 1})
	if r := c.apply(Command{Type: CmdRegisterBroker, Broker: &Broker{ID: 2, GRPCAddr: "h:1", Incarnation: "x"}}); !errors.Is(r.Err, rerr.ErrDuplicateBroker) {
		t.Fatalf("duplicate address: %v", r.Err)
	}
}

func TestFailoverMovesLeadersAndBumpsEpochs(t *testing.T) {
	c := newCluster(t)
	for id := int32(1); id <= 3; id++ {
		c.broker(id, "")
	}
	top := c.create("orders", 12, 3, nil)
	led := 0
	for _, p := range top.Assignment {
		if p.Leader == 2 {
			led++
		}
		if !slices.Equal(p.ISR, p.Replicas) || p.Leader != p.Replicas[0] || p.LeaderEpoch != 0 {
			t.Fatalf("new partition %+v", p)
		}
	}
	if led != 4 {
		t.Fatalf("broker 2 leads %d of 12 partitions, want 4", led)
	}
	before, _ := c.img.Topic("orders")
	c.must(Command{Type: CmdFenceBroker, BrokerID: 2, Reason: "failed"})
	after, _ := c.img.Topic("orders")
	for i, p := range after.Assignment {
		old := before.Assignment[i]
		if p.Leader == 2 || p.InISR(2) || len(p.ISR) != 2 {
			t.Fatalf("partition %d after fencing 2: %+v", i, p)
		}
		if old.Leader == 2 && (p.LeaderEpoch != old.LeaderEpoch+1 || p.PartitionEpoch != old.PartitionEpoch+1) {
			t.Fatalf("partition %d: leader moved without epoch bumps: %+v -> %+v", i, old, p)
		}
		if old.Leader != 2 && (p.Leader != old.Leader || p.LeaderEpoch != old.LeaderEpoch || p.PartitionEpoch != old.PartitionEpoch+1) {
			t.Fatalf("partition %d: ISR shrink changed more than the partition epoch: %+v -> %+v", i, old, p)
		}
	}
	// The old image is untouched (images are immutable).
	if before.Assignment[0].PartitionEpoch != 0 {
		t.Fatal("apply changed an earlier image")
	}
	if _, err := c.img.ValidateCreate(Spec{Name: "x", ReplicationFactor: 3}); !errors.Is(err, rerr.ErrInvalidReplicationFactor) {
		t.Fatalf("rf 3 with 2 alive brokers: %v", err)
	}
}

func TestLastISRMemberKeepsPartitionUntilBack(t *testing.T) {
	c := newCluster(t)
	c.broker(1, "")
	c.broker(2, "")
	c.create("solo", 2, 1, nil)
	c.create("loose", 2, 1, map[string]string{"unclean.leader.election.enable": "true"})
	top, _ := c.img.Topic("solo")
	owner := top.Assignment[0].Leader
	c.must(Command{Type: CmdFenceBroker, BrokerID: owner})
	top, _ = c.img.Topic("solo")
	p := top.Assignment[0]
	if p.Leader != NoLeader || !slices.Equal(p.ISR, []int32{owner}) {
		t.Fatalf("rf=1 partition after its broker failed: %+v (want no leader, ISR kept)", p)
	}
	// Unclean election has no other replica to take either (rf 1): still offline.
	c.must(Command{Type: CmdUnfenceBroker, BrokerID: owner})
	top, _ = c.img.Topic("solo")
	if p2 := top.Assignment[0]; p2.Leader != owner || p2.LeaderEpoch != p.LeaderEpoch+1 {
		t.Fatalf("partition after its broker came back: %+v", p2)
	}
}

func TestUncleanElectionOnlyWhenEnabled(t *testing.T) {
	for _, unclean := range []bool{false, true} {
		c := newCluster(t)
		c.broker(1, "")
		c.broker(2, "")
		c.create("t", 1, 2, map[string]string{"unclean.leader.election.enable": fmt.Sprint(unclean)})
		top, _ := c.img.Topic("t")
		p := top.Assignment[0]
		leader, follower := p.Replicas[0], p.Replicas[1]
		// The follower drops out of the ISR, then the leader fails.
		c.must(Command{Type: CmdAlterPartition, Name: "t", Partition: 0, BrokerID: leader, LeaderEpoch: p.LeaderEpoch,
			PartitionEpoch: p.PartitionEpoch, ISR: []int32{leader}})
		c.must(Command{Type: CmdFenceBroker, BrokerID: leader})
		top, _ = c.img.Topic("t")
		got := top.Assignment[0]
		if unclean && (got.Leader != follower || !slices.Equal(got.ISR, []int32{follower})) {
			t.Fatalf("unclean enabled: %+v, want out-of-sync follower %d elected", got, follower)
		}
		if !unclean && got.Leader != NoLeader {
			t.Fatalf("unclean disabled: out-of-sync replica elected: %+v", got)
		}
	}
}

func TestAlterPartitionFencing(t *testing.T) {
	c := newCluster(t)
	for id := int32(1); id <= 3; id++ {
		c.broker(id, "")
	}
	c.create("t", 1, 3, nil)
	top, _ := c.img.Topic("t")
	p := top.Assignment[0]
	ok := Command{Type: CmdAlterPartition, Name: "t", Partition: 0, BrokerID: p.Leader, LeaderEpoch: p.LeaderEpoch,
		PartitionEpoch: p.PartitionEpoch, ISR: p.Replicas[:2]}
	stale := ok
	stale.PartitionEpoch--
	if r := c.apply(stale); !errors.Is(r.Err, rerr.ErrInvalidUpdateVersion) {
		t.Fatalf("stale partition epoch: %v", r.Err)
	}
	wrongLeader := ok
	wrongLeader.BrokerID = p.Replicas[1]
	if r := c.apply(wrongLeader); !errors.Is(r.Err, rerr.ErrNotLeaderOrFollower) {
		t.Fatalf("ISR change from a follower: %v", r.Err)
	}
	noLeader := ok
	noLeader.ISR = p.Replicas[1:]
	if r := c.apply(noLeader); !errors.Is(r.Err, rerr.ErrInvalidRequest) {
		t.Fatalf("ISR without the leader: %v", r.Err)
	}
	otherTopic := ok
	otherTopic.TopicID = "an-id-of-a-deleted-topic"
	if r := c.apply(otherTopic); !errors.Is(r.Err, rerr.ErrUnknownTopicOrPartition) {
		t.Fatalf("ISR change for another topic of the same name: %v", r.Err)
	}
	if got, _ := c.img.Topic("t"); !slices.Equal(got.Assignment[0].ISR, p.ISR) || got.Assignment[0].PartitionEpoch != p.PartitionEpoch {
		t.Fatalf("a refused ISR change changed the partition: %+v", got.Assignment[0])
	}
	ok.TopicID = top.ID
	res := c.must(ok)
	if np := res.Topic.Assignment[0]; len(np.ISR) != 2 || np.PartitionEpoch != p.PartitionEpoch+1 {
		t.Fatalf("after the ISR shrink: %+v", np)
	}
	if r := c.apply(ok); !errors.Is(r.Err, rerr.ErrInvalidUpdateVersion) {
		t.Fatalf("the same change again (now stale): %v", r.Err)
	}
}

func TestTopicCommands(t *testing.T) {
	c := newCluster(t)
	c.broker(1, "")
	a := c.create("a", 3, 1, map[string]string{"retention.ms": "1000"})
	b := c.create("b", 0, 0, nil)
	if a.Num == b.Num || b.Partitions != DefaultPartitions || b.ReplicationFactor != 1 || a.Config.RetentionMs != 1000 {
		t.Fatalf("a=%+v b=%+v", a, b)
	}
	if r := c.apply(Command{Type: CmdCreateTopic, Spec: &Spec{Name: "a"}, TopicID: "x"}); !errors.Is(r.Err, rerr.ErrTopicAlreadyExists) {
		t.Fatalf("create existing: %v", r.Err)
	}
	if r := c.apply(Command{Type: CmdCreateTopic, Spec: &Spec{Name: "a_b"}, TopicID: "x"}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := c.apply(Command{Type: CmdCreateTopic, Spec: &Spec{Name: "a.b"}, TopicID: "y"}); !errors.Is(r.Err, rerr.ErrInvalidTopic) {
		t.Fatalf("colliding name: %v", r.Err)
	}
	for _, bad := range []Spec{{Name: ""}, {Name: "x/y"}, {Name: "p", Partitions: MaxPartitions + 1},
		{Name: "q", Configs: map[string]string{"retention.ms": "soon"}}, {Name: "r", Configs: map[string]string{"min.insync.replicas": "2"}}} {
		before := c.img
		if r := c.apply(Command{Type: CmdCreateTopic, Spec: &bad, TopicID: "z"}); r.Err == nil {
			t.Fatalf("create %+v accepted", bad)
		}
		if len(c.img.Topics) != len(before.Topics) || c.img.NextTopicNum != before.NextTopicNum {
			t.Fatalf("a refused create changed the image")
		}
	}
	res := c.must(Command{Type: CmdAlterTopicConfig, Name: "a", Set: map[string]string{"retention.bytes": "5"}, Delete: []string{"retention.ms"}})
	if res.Topic.Config.RetentionBytes != 5 || res.Topic.Config.RetentionMs != 604800000 {
		t.Fatalf("after alter: %+v", res.Topic.Config)
	}
	if r := c.apply(Command{Type: CmdAlterTopicConfig, Name: "a", Set: map[string]string{"nope": "1"}}); !errors.Is(r.Err, rerr.ErrInvalidConfig) {
		t.Fatalf("alter unknown config: %v", r.Err)
	}
	c.must(Command{Type: CmdDeleteTopic, Name: "b"})
	if r := c.apply(Command{Type: CmdDeleteTopic, Name: "b"}); !errors.Is(r.Err, rerr.ErrUnknownTopicOrPartition) {
		t.Fatalf("delete twice: %v", r.Err)
	}
	// A topic created again gets a new number, so its old data can never reappear.
	b2 := c.create("b", 1, 1, nil)
	if b2.Num <= b.Num {
		t.Fatalf("recreated b reuses number %d", b.Num)
	}
	if r := c.apply(Command{Type: "bogus"}); !errors.Is(r.Err, rerr.ErrInvalidRequest) {
		t.Fatalf("unknown command: %v", r.Err)
	}
	if r := c.apply(Command{Type: CmdInitCluster, ClusterID: "other"}); !errors.Is(r.Err, rerr.ErrInconsistentClusterID) {
		t.Fatalf("second cluster id: %v", r.Err)
	}
}

func TestSnapshotRoundTripAndFSM(t *testing.T) {
	f := NewFSM(nil)
	cmds := []Command{
		{Type: CmdInitCluster, ClusterID: "c"},
		{Type: CmdRegisterBroker, Broker: &Broker{ID: 1, GRPCAddr: "h:1", Incarnation: "i"}},
		{Type: CmdUnfenceBroker, BrokerID: 1},
		{Type: CmdCreateTopic, Spec: &Spec{Name: "t", Partitions: 4, Configs: map[string]string{"cleanup.policy": "compact"}}, TopicID: "u"},
	}
	for i, cmd := range cmds {
		if res := f.Apply(uint64(i+1), cmd.Encode()).(Result); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	if res := f.Apply(5, []byte("{not json")).(Result); res.Err == nil || f.Image().Offset != 5 {
		t.Fatalf("undecodable entry: %v, offset %d", res.Err, f.Image().Offset)
	}
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	g := NewFSM(nil)
	if err := g.Restore(5, snap); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.Image(), g.Image()) {
		t.Fatalf("restored image differs:\n%+v\n%+v", f.Image(), g.Image())
	}
	if top, _ := g.Image().Topic("t"); !top.Config.Compact() {
		t.Fatal("restored topic lost its parsed config")
	}
	if err := g.Restore(6, []byte(`{"topics":{"x":{"name":"x","partitions":2,"assignment":[]}}}`)); err == nil {
		t.Fatal("snapshot with a partition count that does not match its assignment restored")
	}
}

// Placement spreads leaders and replicas evenly, never puts two replicas of a partition on one broker,
// and puts them on distinct racks when there are enough racks.
func TestPlacementProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 9).Draw(t, "brokers")
		nracks := rapid.IntRange(0, 4).Draw(t, "racks")
		var brokers []*Broker
		for i := 0; i < n; i++ {
			rack := ""
			if nracks > 0 {
				rack = fmt.Sprint("r", rapid.IntRange(0, nracks-1).Draw(t, "rack"))
			}
			brokers = append(brokers, &Broker{ID: int32(i*3 + 1), Rack: rack})
		}
		rf := int32(rapid.IntRange(1, n).Draw(t, "rf"))
		parts := int32(rapid.IntRange(1, 60).Draw(t, "partitions"))
		start := rapid.Uint64Range(0, 100).Draw(t, "start")
		got := assignReplicas(brokers, parts, rf, start)
		leaders := map[int32]int{}
		replicas := map[int32]int{}
		racks := map[string]bool{}
		rackOf := map[int32]string{}
		for _, b := range brokers {
			racks[b.Rack] = true
			rackOf[b.ID] = b.Rack
		}
		for p, rs := range got {
			if len(rs) != int(rf) {
				t.Fatalf("partition %d has %d replicas, want %d", p, len(rs), rf)
			}
			seen := map[int32]bool{}
			usedRacks := map[string]bool{}
			for _, r := range rs {
				if seen[r] {
					t.Fatalf("partition %d has broker %d twice: %v", p, r, rs)
				}
				seen[r] = true
				usedRacks[rackOf[r]] = true
				replicas[r]++
			}
			if want := min(int(rf), len(racks)); len(usedRacks) < want {
				t.Fatalf("partition %d uses racks %v, want %d distinct", p, usedRacks, want)
			}
			leaders[rs[0]]++
		}
		lo, hi := int(parts)/n, (int(parts)+n-1)/n
		for _, b := range brokers {
			if c := leaders[b.ID]; c < lo || c > hi {
				t.Fatalf("broker %d leads %d partitions, want %d..%d (%v)", b.ID, c, lo, hi, leaders)
			}
		}
		if len(racks) <= 1 {
			total := int(parts) * int(rf)
			for _, b := range brokers {
				if c := replicas[b.ID]; c < total/n-int(rf) || c > (total+n-1)/n+int(rf) {
					t.Fatalf("broker %d holds %d replicas of %d over %d brokers", b.ID, c, total, n)
				}
			}
		}
	})
}

// Random command sequences keep the invariants: an ISR is a non-empty subset of the replicas, a
// leader is in the ISR and alive, and epochs never go back.
func TestInvariantsUnderRandomCommands(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		c := newCluster(t)
		for id := int32(1); id <= 4; id++ {
			c.broker(id, "")
		}
		c.create("t", 8, 3, nil)
		c.create("u", 4, 2, map[string]string{"unclean.leader.election.enable": "true"})
		prev := c.img
		for i := 0; i < 40; i++ {
			id := int32(rapid.IntRange(1, 4).Draw(rt, "broker"))
			switch rapid.IntRange(0, 2).Draw(rt, "op") {
			case 0:
				c.apply(Command{Type: CmdFenceBroker, BrokerID: id})
			case 1:
				c.apply(Command{Type: CmdUnfenceBroker, BrokerID: id})
			case 2:
				top, _ := c.img.Topic("t")
				p := rapid.IntRange(0, 7).Draw(rt, "partition")
				st := top.Assignment[p]
				if st.Leader != NoLeader {
					c.apply(Command{Type: CmdAlterPartition, Name: "t", Partition: int32(p), BrokerID: st.Leader,
						LeaderEpoch: st.LeaderEpoch, PartitionEpoch: st.PartitionEpoch, ISR: []int32{st.Leader}})
				}
			}
			for _, top := range c.img.TopicList() {
				old, _ := prev.Topic(top.Name)
				for i, p := range top.Assignment {
					if len(p.ISR) == 0 {
						rt.Fatalf("%s-%d: empty ISR", top.Name, i)
					}
					for _, r := range p.ISR {
						if !p.IsReplica(r) {
							rt.Fatalf("%s-%d: ISR %v not within replicas %v", top.Name, i, p.ISR, p.Replicas)
						}
					}
					if p.Leader != NoLeader && (!p.InISR(p.Leader) || !c.img.Alive(p.Leader)) {
						rt.Fatalf("%s-%d: leader %d not an alive ISR member (%+v)", top.Name, i, p.Leader, p)
					}
					op := old.Assignment[i]
					if p.LeaderEpoch < op.LeaderEpoch || p.PartitionEpoch < op.PartitionEpoch ||
						(p.Leader != op.Leader && p.LeaderEpoch == op.LeaderEpoch) {
						rt.Fatalf("%s-%d: epochs %+v -> %+v", top.Name, i, op, p)
					}
				}
			}
			prev = c.img
		}
	})
}

func TestAllocateProducerIDs(t *testing.T) {
	c := newCluster(t)
	c.broker(1, "")
	c.broker(2, "")
	c.must(Command{Type: CmdAllocateProducerIDs, BrokerID: 1})
	c.must(Command{Type: CmdAllocateProducerIDs, BrokerID: 2})
	c.must(Command{Type: CmdAllocateProducerIDs, BrokerID: 1})
	if c.img.ProducerIDBlocks[1] != 2*ProducerIDBlockSize || c.img.ProducerIDBlocks[2] != ProducerIDBlockSize || c.img.NextProducerID != 3*ProducerIDBlockSize {
		t.Fatalf("blocks %v next %d", c.img.ProducerIDBlocks, c.img.NextProducerID)
	}
	if r := c.apply(Command{Type: CmdAllocateProducerIDs, BrokerID: 9}); !errors.Is(r.Err, rerr.ErrBrokerNotRegistered) {
		t.Fatalf("unregistered broker: %v", r.Err)
	}
	snap, _ := c.img.Encode()
	back, err := DecodeImage(snap)
	if err != nil || back.NextProducerID != c.img.NextProducerID || back.ProducerIDBlocks[1] != c.img.ProducerIDBlocks[1] {
		t.Fatalf("snapshot lost producer ids: %+v %v", back, err)
	}
}

func TestElectPreferredLeaders(t *testing.T) {
	c := newCluster(t)
	for id := int32(1); id <= 3; id++ {
		c.broker(id, "")
	}
	c.create("t", 6, 3, nil)
	c.create("u", 3, 3, nil)
	c.must(Command{Type: CmdFenceBroker, BrokerID: 2})
	c.must(Command{Type: CmdUnfenceBroker, BrokerID: 2})
	top, _ := c.img.Topic("t")
	// Broker 2 is back but out of the ISR (fencing dropped it): no preferred election yet.
	c.must(Command{Type: CmdElectPreferredLeaders})
	for i, p := range top.Assignment {
		if p.Replicas[0] == 2 && p.Leader == 2 {
			t.Fatalf("partition %d: an out-of-sync preferred replica was elected", i)
		}
	}
	// It rejoins the ISR of every partition (as its leaders would propose).
	for _, name := range []string{"t", "u"} {
		tt, _ := c.img.Topic(name)
		for i, p := range tt.Assignment {
			c.must(Command{Type: CmdAlterPartition, Name: name, Partition: int32(i), BrokerID: p.Leader, LeaderEpoch: p.LeaderEpoch,
				PartitionEpoch: p.PartitionEpoch, ISR: p.Replicas})
		}
	}
	// Only topic t, only partitions 0-2.
	c.must(Command{Type: CmdElectPreferredLeaders, Name: "t", Partitions: []int32{0, 1, 2}})
	top, _ = c.img.Topic("t")
	for i, p := range top.Assignment {
		moved := p.Leader == p.Replicas[0]
		if i <= 2 && !moved || i > 2 && p.Replicas[0] == 2 && moved {
			t.Fatalf("partition %d of t after electing 0-2: %+v", i, p)
		}
	}
	u, _ := c.img.Topic("u")
	for i, p := range u.Assignment {
		if p.Replicas[0] == 2 && p.Leader == 2 {
			t.Fatalf("u-%d moved by an election for t", i)
		}
	}
	before, _ := c.img.Topic("u")
	c.must(Command{Type: CmdElectPreferredLeaders})
	u, _ = c.img.Topic("u")
	for i, p := range u.Assignment {
		if p.Leader != p.Replicas[0] {
			t.Fatalf("u-%d after electing everything: %+v", i, p)
		}
		if b := before.Assignment[i]; b.Leader != p.Leader && p.LeaderEpoch != b.LeaderEpoch+1 {
			t.Fatalf("u-%d moved without an epoch bump", i)
		}
	}
	if r := c.apply(Command{Type: CmdElectPreferredLeaders, Name: "nope"}); !errors.Is(r.Err, rerr.ErrUnknownTopicOrPartition) {
		t.Fatalf("unknown topic: %v", r.Err)
	}
}

func TestReassignPartition(t *testing.T) {
	c := newCluster(t)
	for id := int32(1); id <= 4; id++ {
		c.broker(id, "")
	}
	c.create("t", 1, 2, nil)
	top, _ := c.img.Topic("t")
	p := top.Assignment[0]
	var target []int32
	for id := int32(1); id <= 4; id++ {
		if !p.IsReplica(id) {
			target = append(target, id)
		}
	}
	res := c.must(Command{Type: CmdReassignPartition, Name: "t", Partition: 0, Replicas: target})
	moving := res.Topic.Assignment[0]
	if len(moving.Replicas) != 4 || !slices.Equal(moving.Target, target) || moving.Leader != p.Leader {
		t.Fatalf("while moving: %+v", moving)
	}
	if r := c.apply(Command{Type: CmdReassignPartition, Name: "t", Partition: 0, Replicas: target}); !errors.Is(r.Err, rerr.ErrInvalidRequest) {
		t.Fatalf("second reassignment while one runs: %v", r.Err)
	}
	// The first new replica catches up: not done yet.
	top, _ = c.img.Topic("t")
	st := top.Assignment[0]
	c.must(Command{Type: CmdAlterPartition, Name: "t", Partition: 0, BrokerID: st.Leader, LeaderEpoch: st.LeaderEpoch,
		PartitionEpoch: st.PartitionEpoch, ISR: append(slices.Clone(st.ISR), target[0])})
	top, _ = c.img.Topic("t")
	if st = top.Assignment[0]; len(st.Target) == 0 {
		t.Fatalf("completed with one target replica out of the ISR: %+v", st)
	}
	// The second catches up: the move completes, the old leader hands over.
	c.must(Command{Type: CmdAlterPartition, Name: "t", Partition: 0, BrokerID: st.Leader, LeaderEpoch: st.LeaderEpoch,
		PartitionEpoch: st.PartitionEpoch, ISR: append(slices.Clone(st.ISR), target[1])})
	top, _ = c.img.Topic("t")
	done := top.Assignment[0]
	if !slices.Equal(done.Replicas, target) || len(done.Target) != 0 || !slices.Equal(done.ISR, target) || done.Leader != target[0] ||
		done.LeaderEpoch != p.LeaderEpoch+1 {
		t.Fatalf("after the move: %+v (was %+v)", done, p)
	}
	for _, bad := range [][]int32{nil, {1, 1}, {9}} {
		if r := c.apply(Command{Type: CmdReassignPartition, Name: "t", Partition: 0, Replicas: bad}); r.Err == nil {
			t.Fatalf("reassign to %v accepted", bad)
		}
	}
}
