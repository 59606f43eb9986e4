package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client"
)

// TestAcknowledgementLab is the classic exercise: one leader, two followers that stop copying two
// records before the end, a producer sending records 1 to 10, the leader crashing right after record 7.
// Records 1-5 reach every replica; 6 and 7 reach the leader only; the leader is killed; a follower
// takes over and 8-10 go to it. Which acknowledged records survive depends on acks:
//   - acks=all: 6 and 7 are never acknowledged (the ISR never had them), so every acknowledged record
//     survives;
//   - acks=1: 6 and 7 are acknowledged by the leader alone, and lost with it;
//   - acks=0: nothing is acknowledged, and 6 and 7 are lost without anyone being told.
//
// docs/durability.md explains the result.
func TestAcknowledgementLab(t *testing.T) {
	// One controller voter (node 1); the partitions used have their replicas on nodes 2-4, so killing
	// the leader never costs the controller its majority.
	c := startCluster(t, 4, 1)
	adm := c.admin()
	ctx := context.Background()
	topicID, err := adm.CreateTopic(ctx, "lab", 8, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The admin client may ask another node than the one that created the topic (after a retriable
	// failure it moves on), and the metadata reaches each node on its own schedule: wait for it, as
	// Kafka's tests wait for a new topic's metadata.
	var d *client.TopicDescription
	waitFor(t, 10*time.Second, "the topic in the metadata", func() error {
		var err error
		d, err = adm.DescribeTopic(ctx, "lab")
		return err
	})
	var parts []int32
	for _, p := range d.Partitions {
		if !slices.Contains(p.Replicas, 1) {
			parts = append(parts, p.Partition)
		}
	}
	if len(parts) == 0 {
		t.Fatal("no partition with its replicas on nodes 2-4")
	}
	modes := []struct {
		name string
		acks client.Acks
	}{{"acks=all", client.AcksAll}, {"acks=1", client.AcksLeader}, {"acks=0", client.AcksNone}}
	for i, mode := range modes {
		part := parts[0]
		acked, survived := runLab(t, c, topicID, part, mode.acks)
		t.Logf("%s: acknowledged %v, in the log after the failover %v", mode.name, acked, survived)
		var lost []int
		for _, r := range acked {
			if !slices.Contains(survived, r) {
				lost = append(lost, r)
			}
		}
		switch mode.acks {
		case client.AcksAll:
			if len(lost) > 0 || slices.Contains(acked, 6) || slices.Contains(acked, 7) {
				t.Fatalf("acks=all: acknowledged %v, lost %v; want 6 and 7 unacknowledged and nothing lost", acked, lost)
			}
		case client.AcksLeader:
			if !slices.Equal(lost, []int{6, 7}) {
				t.Fatalf("acks=1: lost %v of the acknowledged %v, want exactly 6 and 7", lost, acked)
			}
		case client.AcksNone:
			if len(acked) != 0 || slices.Contains(survived, 6) || slices.Contains(survived, 7) {
				t.Fatalf("acks=0: acknowledged %v, survived %v; want nothing acknowledged and 6, 7 gone", acked, survived)
			}
		}
		for _, r := range []int{1, 2, 3, 4, 5, 8, 9, 10} {
			if !slices.Contains(survived, r) {
				t.Fatalf("%s: record %d missing after the failover: %v", mode.name, r, survived)
			}
		}
		if i == len(modes)-1 {
			break
		}
		// The next mode starts from a fresh topic.
		if err := adm.DeleteTopic(ctx, "lab"); err != nil {
			t.Fatal(err)
		}
		if topicID, err = adm.CreateTopic(ctx, "lab", 8, 3, nil); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the new lab topic's leaders", func() error {
			ls, err := c.leaders(2, "lab")
			if err != nil {
				return err
			}
			if slices.Contains(ls, -1) {
				return fmt.Errorf("leaders %v", ls)
			}
			return nil
		})
		waitFor(t, 10*time.Second, "describe the new lab topic", func() error {
			var err error
			if d, err = adm.DescribeTopic(ctx, "lab"); err == nil && d.TopicID != topicID {
				err = fmt.Errorf("topic id %s, want %s", d.TopicID, topicID)
			}
			return err
		})
		parts = parts[:0]
		for _, p := range d.Partitions {
			if !slices.Contains(p.Replicas, 1) {
				parts = append(parts, p.Partition)
			}
		}
		if len(parts) == 0 {
			t.Fatal("no partition with its replicas on nodes 2-4")
		}
	}
}

// runLab plays the lab once on partition part of topic lab (whose id is topicID) and returns the record
// numbers that were acknowledged and those in the partition at the end.
func runLab(t *testing.T, c *cluster, topicID string, part int32, acks client.Acks) (acked, survived []int) {
	t.Helper()
	ctx := context.Background()
	// A new admin client may ask another node than the caller's, one the re-created topic has not
	// reached yet (it answers that lab does not exist, or describes the lab deleted before): wait for
	// the topic created last there too.
	adm := c.admin()
	var d *client.TopicDescription
	waitFor(t, 10*time.Second, "describe the lab topic", func() error {
		var err error
		if d, err = adm.DescribeTopic(ctx, "lab"); err == nil && d.TopicID != topicID {
			err = fmt.Errorf("topic id %s, want %s", d.TopicID, topicID)
		}
		return err
	})
	leader := d.Partitions[part].LeaderID
	var followers []int32
	for _, r := range d.Partitions[part].Replicas {
		if r != leader {
			followers = append(followers, r)
		}
	}
	var mu sync.Mutex
	send := func(p *client.Producer, n int) {
		r := client.NewRecord("lab", nil, []byte(strconv.Itoa(n)))
		r.Partition = part
		p.Produce(ctx, r, func(_ *client.Record, err error) {
			if err == nil && acks != client.AcksNone {
				mu.Lock()
				acked = append(acked, n)
				mu.Unlock()
			}
		})
	}
	// 1-5 with acks=all: on every replica.
	full, err := client.NewProducer(c.grpcAddrs(), client.WithAcks(client.AcksAll), client.WithLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	for n := 1; n <= 5; n++ {
		send(full, n)
		if err := full.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The followers stop copying (paused for less than the broker session timeout, so the controller
	// does not fence them), 6 and 7 go to the leader with the acks under test, and the leader dies.
	lab, err := client.NewProducer([]string{c.nodes[leader].grpc}, client.WithAcks(acks), client.WithLinger(0),
		client.WithIdempotence(false), client.WithDeliveryTimeout(1500*time.Millisecond), client.WithRequestTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range followers {
		c.signal(f, syscall.SIGSTOP)
	}
	// A follower's replica fetch may be parked at the leader (a long poll of up to 500 ms): let it
	// return empty first, or its answer would carry 6 and 7 to the paused follower, which would append
	// them when it resumes.
	time.Sleep(700 * time.Millisecond)
	for n := 6; n <= 7; n++ {
		send(lab, n)
	}
	fctx, cancel := context.WithTimeout(ctx, 800*time.Millisecond)
	lab.Flush(fctx) // acks=all does not finish: the ISR cannot have 6 and 7
	cancel()
	c.kill(leader)
	for _, f := range followers {
		c.signal(f, syscall.SIGCONT)
	}
	lab.Close()
	// A follower takes over; 8-10 go to it.
	survivors := c.grpcAddrs(append([]int32{1}, followers...)...)
	waitFor(t, 20*time.Second, "a follower leads", func() error {
		ls, err := c.leaders(followers[0], "lab")
		if err != nil {
			return err
		}
		if ls[part] == leader || ls[part] < 0 {
			return fmt.Errorf("leader %d", ls[part])
		}
		return nil
	})
	after, err := client.NewProducer(survivors, client.WithAcks(client.AcksAll), client.WithLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	for n := 8; n <= 10; n++ {
		send(after, n)
		if err := after.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	after.Close()
	// The old leader comes back, truncates 6 and 7 (the new leader's epoch never had them) and follows.
	c.start(leader)
	c.waitReady(30*time.Second, leader)
	cons, err := client.NewConsumer(survivors)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	if err := cons.Assign("lab", part, client.OffsetEarliest()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "read the partition", func() error {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		recs, err := cons.Poll(pctx)
		if err != nil && pctx.Err() == nil {
			return err
		}
		for _, r := range recs {
			n, _ := strconv.Atoi(string(r.Value))
			survived = append(survived, n)
		}
		if !slices.Contains(survived, 10) {
			return fmt.Errorf("read %v", survived)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	sort.Ints(acked)
	return acked, survived
}
