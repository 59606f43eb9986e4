package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/platform/platformtest"
)

// BenchmarkGroupJoin measures the join figure: with default group timers (heartbeats every 5s,
// 200ms while reconciling), the time from a member joining a group of 50 members over 600 partitions
// until it has consumed its first record. Records keep arriving on every partition meanwhile. Each
// iteration joins one member and closes it again. Reported as ms/join (mean) and max-ms.
//
//	go test -run '^$' -bench BenchmarkGroupJoin -benchtime 5x ./client/
func BenchmarkGroupJoin(b *testing.B) {
	addr := platformtest.StartNode(b, b.TempDir()).GRPCAddr()
	const partitions, members = 600, 50
	createTopic(b, addr, "wide", partitions, nil)
	// A steady trickle on every partition, so a member that owns a partition soon has a record of it.
	p := newProducer(b, addr, client.WithLinger(5*time.Millisecond))
	ctx, stop := context.WithCancel(context.Background())
	var pwg sync.WaitGroup
	pwg.Add(1)
	go func() {
		defer pwg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			for part := range int32(partitions) {
				p.Produce(ctx, &client.Record{Topic: "wide", Partition: part, Value: []byte("x")}, nil)
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
			}
		}
	}()
	defer func() { stop(); pwg.Wait() }()

	newMember := func(name string) *client.GroupConsumer {
		gc, err := client.NewGroupConsumer([]string{addr}, "join", client.WithClientID(name))
		if err != nil {
			b.Fatal(err)
		}
		if err := gc.Subscribe("wide"); err != nil {
			b.Fatal(err)
		}
		return gc
	}
	// The 50 members poll in the background, discarding records.
	var wg sync.WaitGroup
	pollCtx, stopPolls := context.WithCancel(context.Background())
	var group []*client.GroupConsumer
	for i := range members {
		gc := newMember(fmt.Sprintf("m%d", i))
		group = append(group, gc)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, err := gc.Poll(pollCtx); err != nil {
					return
				}
			}
		}()
	}
	defer func() {
		stopPolls()
		wg.Wait()
		for _, gc := range group {
			gc.Close()
		}
	}()
	adm := newAdmin(b, addr)
	waitFor(b, 2*time.Minute, func() string { return "the 50 members never settled" }, func() bool {
		d, err := adm.DescribeGroup(context.Background(), "join")
		return err == nil && d.State == "stable" && len(d.Members) == members
	})

	b.ResetTimer()
	var worst time.Duration
	var total time.Duration
	for i := range b.N {
		start := time.Now()
		gc := newMember(fmt.Sprintf("new%d", i))
		pctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		recs, err := gc.Poll(pctx)
		cancel()
		took := time.Since(start)
		if err != nil || len(recs) == 0 {
			b.Fatalf("the new member got no record: %v", err)
		}
		total += took
		worst = max(worst, took)
		b.StopTimer()
		gc.Close()
		waitFor(b, 2*time.Minute, func() string { return "the group never settled after the member left" }, func() bool {
			d, err := adm.DescribeGroup(context.Background(), "join")
			return err == nil && d.State == "stable" && len(d.Members) == members
		})
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/join")
	b.ReportMetric(float64(worst.Milliseconds()), "max-ms")
}
