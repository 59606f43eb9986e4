package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client"
)

// TestDecommissionMovesData: `runnel cluster decommission 4` moves every replica on node 4 to the other
// brokers; the new replicas copy the log before the old ones go, so every record stays readable, and
// node 4 ends up holding and leading nothing. Then `runnel topic reassign` moves one partition back.
func TestDecommissionMovesData(t *testing.T) {
	// Every leader sends followers out of the ISR at most throttle bytes/s (the bucket holds one second).
	const throttle = 64 << 10
	c := newCluster(t, 4, 1)
	for id := int32(1); id <= 4; id++ {
		c.nodes[id].extraArgs = []string{"--replication-throttle", fmt.Sprint(throttle)}
		c.start(id)
	}
	c.waitReady(45*time.Second, 1, 2, 3, 4)
	adm := c.admin()
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, "moving", 4, 2, nil); err != nil {
		t.Fatal(err)
	}
	const n = 50000
	if err := produceAll(t, c.grpcAddrs(), "moving", n); err != nil {
		t.Fatal(err)
	}
	before, err := adm.DescribeTopic(ctx, "moving")
	if err != nil {
		t.Fatal(err)
	}
	var moving int64 // bytes that must be copied: the partitions with a replica on node 4
	for _, p := range before.Partitions {
		if slices.Contains(p.Replicas, 4) {
			moving += p.SizeBytes
		}
	}
	cli := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, append(args, "--brokers", strings.Join(c.grpcAddrs(1, 2, 3), ","))...).CombinedOutput()
		if err != nil {
			t.Fatalf("runnel %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	started := time.Now()
	out := cli("cluster", "decommission", "4")
	t.Logf("decommission:\n%s", out)
	waitFor(t, 90*time.Second, "every replica moved off node 4", func() error {
		d, err := adm.DescribeTopic(ctx, "moving")
		if err != nil {
			return err
		}
		for _, p := range d.Partitions {
			if slices.Contains(p.Replicas, 4) || len(p.ReassigningTo) > 0 || p.LeaderID == 4 {
				return fmt.Errorf("partition %d: replicas %v, ISR %v, leader %d, moving to %v", p.Partition, p.Replicas, p.ISR, p.LeaderID, p.ReassigningTo)
			}
			if len(p.Replicas) != 2 || len(p.ISR) != 2 {
				return fmt.Errorf("partition %d: replicas %v, ISR %v", p.Partition, p.Replicas, p.ISR)
			}
		}
		return nil
	})
	took := time.Since(started)
	// At most 3 leaders sent the copies, each at most a bucket (one second's worth) plus the rate: the
	// move cannot have been faster than that. (A lower bound: a slow machine only makes it longer.)
	if floor := time.Duration(float64(moving-3*throttle) / float64(3*throttle) * float64(time.Second)); took < floor {
		t.Fatalf("%d bytes copied in %v under a %d B/s throttle per leader: faster than the %v it allows", moving, took, throttle, floor)
	}
	t.Logf("decommission copied %d bytes in %v under a %d B/s replication throttle per leader", moving, took.Round(time.Millisecond), throttle)
	if got := countAll(t, c.grpcAddrs(1, 2, 3), "moving"); got != n {
		t.Fatalf("after the decommission %d records are readable, want %d", got, n)
	}
	waitFor(t, 10*time.Second, "node 4 leads nothing", func() error {
		s, err := c.status(4)
		if err != nil {
			return err
		}
		for _, nd := range s.Nodes {
			if nd.NodeId == 4 && nd.Leaders != 0 {
				return fmt.Errorf("node 4 leads %d partitions", nd.Leaders)
			}
		}
		return nil
	})
	// And back: partition 0 to nodes 4 and its current preferred leader.
	d, err := adm.DescribeTopic(ctx, "moving")
	if err != nil {
		t.Fatal(err)
	}
	to := fmt.Sprintf("4,%d", d.Partitions[0].Replicas[0])
	cli("topic", "reassign", "moving", "--partition", "0", "--replicas", to)
	// Node 2 stays the leader until the controller's automatic preferred-leader election (every 30 s,
	// as Kafka's leader.imbalance.check.interval) hands it to node 4: allow for two rounds.
	waitFor(t, 75*time.Second, "partition 0 moved to "+to, func() error {
		d, err := adm.DescribeTopic(ctx, "moving")
		if err != nil {
			return err
		}
		p := d.Partitions[0]
		if fmt.Sprintf("%d,%d", p.Replicas[0], p.Replicas[len(p.Replicas)-1]) != to || len(p.Replicas) != 2 || len(p.ISR) != 2 || p.LeaderID != 4 {
			return fmt.Errorf("replicas %v, ISR %v, leader %d", p.Replicas, p.ISR, p.LeaderID)
		}
		return nil
	})
	if got := countAll(t, c.grpcAddrs(), "moving"); got != n {
		t.Fatalf("after moving partition 0 back %d records are readable, want %d", got, n)
	}
}

// produceAll writes n keyed records with acks=all.
func produceAll(t *testing.T, brokers []string, topic string, n int) error {
	t.Helper()
	p, err := client.NewProducer(brokers, client.WithAcks(client.AcksAll))
	if err != nil {
		return err
	}
	defer p.Close()
	var first error
	for i := 0; i < n; i++ {
		p.Produce(context.Background(), client.NewRecord(topic, []byte(fmt.Sprint("k", i%64)), []byte(fmt.Sprint(i))), func(_ *client.Record, err error) {
			if err != nil && first == nil {
				first = err
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		return err
	}
	return first
}

// countAll reads every partition of topic from the start to its high watermark and returns the number
// of distinct values.
func countAll(t *testing.T, brokers []string, topic string) int {
	t.Helper()
	ctx := context.Background()
	adm, err := client.NewAdmin(brokers)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	// A partition that just moved has a new leader whose high watermark trails its log end until the
	// followers fetch again: read once the high watermarks have stopped moving, so a record counted
	// missing is missing, not yet to be acknowledged by the new ISR.
	var d *client.TopicDescription
	var sum int64 = -1
	var since time.Time
	waitFor(t, 30*time.Second, topic+"'s high watermarks settle", func() error {
		var err error
		if d, err = adm.DescribeTopic(ctx, topic); err != nil {
			return err
		}
		s := int64(0)
		for _, p := range d.Partitions {
			s += p.HighWatermark
		}
		if s != sum {
			sum, since = s, time.Now()
		}
		if time.Since(since) < time.Second {
			return fmt.Errorf("high watermarks sum to %d, changed %v ago", s, time.Since(since).Round(time.Millisecond))
		}
		return nil
	})
	seen := map[string]bool{}
	for _, p := range d.Partitions {
		cons, err := client.NewConsumer(brokers)
		if err != nil {
			t.Fatal(err)
		}
		if err := cons.Assign(topic, p.Partition, client.OffsetEarliest()); err != nil {
			t.Fatal(err)
		}
		for next := int64(0); next < p.HighWatermark; {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			recs, err := cons.Poll(pctx)
			cancel()
			if err != nil {
				t.Fatalf("read %s-%d at %d: %v", topic, p.Partition, next, err)
			}
			for _, r := range recs {
				seen[string(r.Value)] = true
				next = r.Offset + 1
			}
		}
		cons.Close()
	}
	return len(seen)
}
