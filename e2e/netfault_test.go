package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	"github.com/runnel-io/runnel/client"
)

// TestFaultProxiesCarryCluster: three nodes whose every inter-node link goes through the harness's
// proxies form a cluster, elect a controller and replicate acks=all writes; raft, gRPC and serf (UDP
// and TCP) bytes all flow through the proxies. Isolating the controller leader gets a new leader
// elected among the other two, which commit metadata (a topic is created) while the isolated node
// cannot (a topic created through it alone fails and never appears); after heal() the isolated node
// follows the new leader and sees the topic created without it.
func TestFaultProxiesCarryCluster(t *testing.T) {
	fc := startFaultCluster(t, 3, 3)
	adm := fc.admin()
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, "carry", 3, 3, map[string]string{"min.insync.replicas": "2"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "leaders of carry", func() error {
		ls, err := fc.leaders(1, "carry")
		if err != nil {
			return err
		}
		if slices.Contains(ls, -1) {
			return fmt.Errorf("leaders %v", ls)
		}
		return nil
	})
	for p := int32(0); p < 3; p++ {
		if err := produceN(t, fc.grpcAddrs(), "carry", p, client.AcksAll, 50, fmt.Sprintf("p%d", p)); err != nil {
			t.Fatalf("acks=all through the proxies, partition %d: %v", p, err)
		}
	}
	if n := countAll(t, fc.grpcAddrs(), "carry"); n != 150 {
		t.Fatalf("read %d records of carry, want 150", n)
	}
	for _, proto := range []string{"raft", "grpc", "serf-tcp", "serf-udp"} {
		if fc.net.forwarded(proto) == 0 {
			t.Errorf("no %s bytes went through the proxies", proto)
		}
	}

	old := fc.controllerOf(1)
	if old < 1 {
		t.Fatalf("controller leader %d", old)
	}
	var others []int32
	for _, id := range fc.ids {
		if id != old {
			others = append(others, id)
		}
	}
	fc.isolate(old)
	t.Logf("isolated controller leader %d (%s)", old, fc.net.describe())
	took := waitFor(t, 30*time.Second, "a new controller leader among the others", func() error {
		for _, id := range others {
			if c := fc.controllerOf(id); c == old || c < 1 || !slices.Contains(others, c) {
				return fmt.Errorf("node %d sees controller %d", id, c)
			}
		}
		return nil
	})
	t.Logf("new controller leader %d after %v", fc.controllerOf(others[0]), took)
	if _, err := fc.admin(others...).CreateTopic(ctx, "majority", 1, 2, nil); err != nil {
		t.Fatalf("the majority side cannot create a topic: %v", err)
	}
	alone, err := client.NewAdmin([]string{fc.nodes[old].grpc}, client.WithRequestTimeout(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()
	actx, cancel := context.WithTimeout(ctx, 4*time.Second)
	_, err = alone.CreateTopic(actx, "isolated", 1, 1, nil)
	cancel()
	if err == nil {
		t.Fatal("the isolated node created a topic")
	}
	t.Logf("create through the isolated node: %v", err)

	fc.heal()
	waitFor(t, 30*time.Second, "every node follows one controller leader", func() error {
		var seen []int32
		for _, id := range fc.ids {
			seen = append(seen, fc.controllerOf(id))
		}
		if seen[0] < 1 || slices.ContainsFunc(seen, func(c int32) bool { return c != seen[0] }) {
			return fmt.Errorf("controllers seen %v", seen)
		}
		return nil
	})
	waitFor(t, 30*time.Second, "the healed node sees the majority's topic", func() error {
		ls, err := fc.leaders(old, "majority")
		if err != nil {
			return err
		}
		if slices.Contains(ls, -1) {
			return fmt.Errorf("leaders %v", ls)
		}
		return nil
	})
	if _, err := adm.DescribeTopic(ctx, "isolated"); !errors.Is(err, rerr.ErrUnknownTopicOrPartition) {
		t.Fatalf("topic created through the isolated node: describe answers %v, want unknown topic", err)
	}
	fc.waitReady(30*time.Second, fc.ids...)
}
