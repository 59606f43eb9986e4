package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client"
)

// queueWorkload is the queue workload of the fault-injection runs: idempotent acks=all producers
// writing unique values ("p<producer>-<seq>") round-robin over the partitions of a replicated topic,
// and a consumer group whose members poll and commit during the run, all recorded in a history. At the
// end (finalRead) every partition is read from the start to its high watermark.
type queueWorkload struct {
	t          testing.TB
	h          *history
	brokers    []string
	topic      string
	partitions int32
	group      string
	stop       chan struct{} // closed: the producers stop
	stopGroup  chan struct{} // closed: the group members stop
	wg         sync.WaitGroup
	wgGroup    sync.WaitGroup
}

// queueConfig sizes the workload.
type queueConfig struct {
	producers, members int
	interval           time.Duration // between two sends of one producer
	inFlight           int           // sends of one producer awaiting their outcome, at most
}

// startQueue creates topic (partitions, RF 3, min.insync.replicas=2) and starts the producers and
// group members.
func startQueue(t testing.TB, brokers []string, topic string, partitions int32, cfg queueConfig) *queueWorkload {
	adm, err := client.NewAdmin(brokers, client.WithRequestTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, topic, partitions, 3, map[string]string{"min.insync.replicas": "2"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "leaders of "+topic, func() error {
		d, err := adm.DescribeTopic(ctx, topic)
		if err != nil {
			return err
		}
		for _, p := range d.Partitions {
			if p.LeaderID < 0 || len(p.ISR) < 3 {
				return fmt.Errorf("partition %d: leader %d, ISR %v", p.Partition, p.LeaderID, p.ISR)
			}
		}
		return nil
	})
	w := &queueWorkload{t: t, h: newHistory(), brokers: brokers, topic: topic, partitions: partitions, group: topic + "-group", stop: make(chan struct{}), stopGroup: make(chan struct{})}
	for i := 1; i <= cfg.producers; i++ {
		w.wg.Add(1)
		go w.produce(fmt.Sprintf("p%d", i), cfg)
	}
	for i := 1; i <= cfg.members; i++ {
		w.wgGroup.Add(1)
		go w.consume(fmt.Sprintf("g%d", i))
	}
	return w
}

// produce is one producer's loop until stop: it then waits for the outcome of every send.
func (w *queueWorkload) produce(proc string, cfg queueConfig) {
	defer w.wg.Done()
	p, err := client.NewProducer(w.brokers, client.WithAcks(client.AcksAll), client.WithIdempotence(true),
		client.WithLinger(5*time.Millisecond), client.WithDeliveryTimeout(20*time.Second), client.WithRequestTimeout(3*time.Second),
		client.WithRetryBackoff(50*time.Millisecond, 500*time.Millisecond))
	if err != nil {
		w.t.Errorf("%s: %v", proc, err)
		return
	}
	slots := make(chan struct{}, cfg.inFlight)
	tick := time.NewTicker(cfg.interval)
	defer tick.Stop()
	for seq := 0; ; seq++ {
		select {
		case <-w.stop:
			p.Close() // waits for every outcome (within the delivery timeout)
			return
		case <-tick.C:
		}
		select {
		case slots <- struct{}{}:
		case <-w.stop:
			p.Close()
			return
		}
		part := int32(seq) % w.partitions
		value := fmt.Sprintf("%s-%06d", proc, seq)
		r := client.NewRecord(w.topic, nil, []byte(value))
		r.Partition = part
		w.h.add(event{Process: proc, Type: "invoke", F: "send", Value: value, Partition: part})
		p.Produce(context.Background(), r, func(r *client.Record, err error) {
			defer func() { <-slots }()
			if err == nil {
				w.h.add(event{Process: proc, Type: "ok", F: "send", Value: value, Partition: part, Offset: r.Offset})
				return
			}
			// After retries of an idempotent producer the record may or may not be in the log: the
			// outcome is unknown (Jepsen's :info). The checker needs only the acknowledged ones.
			w.h.add(event{Process: proc, Type: "info", F: "send", Value: value, Partition: part, Err: err.Error()})
		})
	}
}

// consume is one group member's loop until stop: poll, record, commit synchronously, record.
func (w *queueWorkload) consume(proc string) {
	defer w.wgGroup.Done()
	parts := func(f string) client.PartitionsFunc {
		return func(_ context.Context, _ *client.GroupConsumer, tps []client.TopicPartition) {
			var ps []int32
			for _, tp := range tps {
				ps = append(ps, tp.Partition)
			}
			w.h.add(event{Process: proc, Type: "ok", F: f, Parts: ps})
		}
	}
	g, err := client.NewGroupConsumer(w.brokers, w.group, client.WithAutoOffsetReset(client.OffsetEarliest()), client.WithAutoCommit(false),
		client.WithOnAssigned(parts("assign")), client.WithOnRevoked(parts("revoke")), client.WithOnLost(parts("lost")),
		client.WithSessionTimeout(6*time.Second))
	if err != nil {
		w.t.Errorf("%s: %v", proc, err)
		return
	}
	defer g.Close()
	if err := g.Subscribe(w.topic); err != nil {
		w.t.Errorf("%s: %v", proc, err)
		return
	}
	for {
		select {
		case <-w.stopGroup:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		recs, err := g.Poll(ctx)
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			time.Sleep(100 * time.Millisecond)
		}
		next := map[int32]int64{}
		for _, r := range recs {
			w.h.add(event{Process: proc, Type: "ok", F: "poll", Value: string(r.Value), Partition: r.Partition, Offset: r.Offset})
			next[r.Partition] = r.Offset + 1
		}
		if len(next) == 0 {
			continue
		}
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err = g.CommitSync(cctx)
		cancel()
		typ, msg := "ok", ""
		if err != nil {
			typ, msg = "fail", err.Error()
		}
		for part, off := range next {
			w.h.add(event{Process: proc, Type: typ, F: "commit", Partition: part, Offset: off, Err: msg})
		}
	}
}

// stopProducers stops the producers and waits for the outcome of every send.
func (w *queueWorkload) stopProducers() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
}

// close stops the producers and members and waits for every outcome.
func (w *queueWorkload) close() {
	w.stopProducers()
	select {
	case <-w.stopGroup:
	default:
		close(w.stopGroup)
	}
	w.wgGroup.Wait()
}

// catchUp waits (the producers stopped, the cluster whole) until the group has committed every
// partition up to its high watermark, so the never-read check covers the whole log, and records the
// result in the history ("caught-up", ok or fail with the lag left). It returns an error after timeout.
func (w *queueWorkload) catchUp(timeout time.Duration) error {
	adm, err := client.NewAdmin(w.brokers, client.WithRequestTimeout(5*time.Second))
	if err != nil {
		return err
	}
	defer adm.Close()
	deadline := time.Now().Add(timeout)
	for {
		err := groupCaughtUp(adm, w.group, w.topic, w.partitions)
		if err == nil {
			w.h.add(event{Process: "group", Type: "ok", F: "caught-up"})
			return nil
		}
		if time.Now().After(deadline) {
			w.h.add(event{Process: "group", Type: "fail", F: "caught-up", Err: err.Error()})
			return fmt.Errorf("group %s did not catch up within %v: %w", w.group, timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// groupCaughtUp returns nil when group has a commit for each of topic's partitions at its high
// watermark, else what is left.
func groupCaughtUp(adm *client.Admin, group, topic string, partitions int32) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lags, err := adm.GroupLag(ctx, group)
	if err != nil {
		return err
	}
	lag, known := int64(0), int32(0)
	for _, l := range lags {
		if l.Topic == topic && l.Committed >= 0 && l.Lag >= 0 {
			lag += l.Lag
			known++
		}
	}
	if lag > 0 || known < partitions {
		return fmt.Errorf("lag %d over %d of %d partitions committed", lag, known, partitions)
	}
	return nil
}

// finalRead reads every partition from the start to its high watermark as reader proc. The cluster
// must be healed: it retries for up to timeout.
func (w *queueWorkload) finalRead(proc string, timeout time.Duration) error {
	ctx := context.Background()
	adm, err := client.NewAdmin(w.brokers, client.WithRequestTimeout(10*time.Second))
	if err != nil {
		return err
	}
	defer adm.Close()
	deadline := time.Now().Add(timeout)
	for p := int32(0); p < w.partitions; p++ {
		var hw int64 = -1
		for hw < 0 {
			d, err := adm.DescribeTopic(ctx, w.topic)
			if err == nil && d.Partitions[p].LeaderID >= 0 {
				hw = d.Partitions[p].HighWatermark
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("partition %d: no leader or high watermark: %v", p, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		cons, err := client.NewConsumer(w.brokers)
		if err != nil {
			return err
		}
		if err := cons.Assign(w.topic, p, client.OffsetEarliest()); err != nil {
			cons.Close()
			return err
		}
		for next := int64(0); next < hw; {
			if time.Now().After(deadline) {
				cons.Close()
				return fmt.Errorf("partition %d: read up to %d of %d within %v", p, next, hw, timeout)
			}
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			recs, err := cons.Poll(pctx)
			cancel()
			if err != nil && pctx.Err() == nil {
				time.Sleep(200 * time.Millisecond)
			}
			for _, r := range recs {
				w.h.add(event{Process: proc, Type: "ok", F: "read", Value: string(r.Value), Partition: r.Partition, Offset: r.Offset})
				next = r.Offset + 1
			}
		}
		cons.Close()
	}
	return nil
}
