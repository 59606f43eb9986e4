package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/batch"
)

// ackLog records what a producer was told: every acknowledged record's value with its partition and
// offset.
type ackLog struct {
	mu    sync.Mutex
	acked map[string]client.TopicPartition // value → where it was acknowledged
	offs  map[string]int64
	fails int
	// firstErrs are the first failures' errors: with the test's 60 s delivery timeout only an error
	// the producer does not retry fails a record, such as the OUT_OF_ORDER_SEQUENCE_NUMBER a leader
	// missing acknowledged batches answers.
	firstErrs []string
}

// TestReplicationSurvivesLeaderKills: three nodes, a topic with replication factor 3 and
// min.insync.replicas=2; producers with acks=all write while the leader of partition 0 is killed with
// kill -9 (and restarted) every few seconds, then paused with SIGSTOP. Afterwards every acknowledged
// record is in the log exactly once, at the offset it was acknowledged with (the producer is
// idempotent), and every replica's log is byte-identical up to the high watermark: the same batches with
// the same header fields, leader epoch included.
func TestReplicationSurvivesLeaderKills(t *testing.T) {
	c := startCluster(t, 3, 3)
	adm := c.admin()
	ctx := context.Background()
	const topic = "replicated"
	if _, err := adm.CreateTopic(ctx, topic, 3, 3, map[string]string{"min.insync.replicas": "2"}); err != nil {
		t.Fatal(err)
	}
	p, err := client.NewProducer(c.grpcAddrs(), client.WithAcks(client.AcksAll), client.WithIdempotence(true),
		client.WithLinger(2*time.Millisecond), client.WithDeliveryTimeout(60*time.Second), client.WithRequestTimeout(5*time.Second),
		client.WithRetryBackoff(50*time.Millisecond, 500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	log := &ackLog{acked: map[string]client.TopicPartition{}, offs: map[string]int64{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			v := strconv.Itoa(i)
			p.Produce(ctx, client.NewRecord(topic, []byte(fmt.Sprint("k", i%31)), []byte(v)), func(r *client.Record, err error) {
				log.mu.Lock()
				defer log.mu.Unlock()
				if err != nil {
					log.fails++
					if len(log.firstErrs) < 3 {
						log.firstErrs = append(log.firstErrs, err.Error())
					}
					return
				}
				log.acked[v] = client.TopicPartition{Topic: r.Topic, Partition: r.Partition}
				log.offs[v] = r.Offset
			})
			if i%100 == 99 {
				time.Sleep(2 * time.Millisecond)
			}
		}
	}()

	leaderOf := func(part int32) int32 {
		var l int32 = -1
		waitFor(t, 20*time.Second, "a leader of partition 0", func() error {
			for id := int32(1); id <= 3; id++ {
				if !c.running(id) {
					continue
				}
				ls, err := c.leaders(id, topic)
				if err == nil && ls[part] >= 1 && c.running(ls[part]) {
					l = ls[part]
					return nil
				}
			}
			return fmt.Errorf("no running leader known")
		})
		return l
	}
	rounds := 3
	for i := 0; i < rounds; i++ {
		time.Sleep(time.Duration(2000+rand.IntN(1500)) * time.Millisecond) // let the load run between faults
		l := leaderOf(0)
		t.Logf("round %d: kill -9 leader %d of partition 0", i, l)
		c.kill(l)
		time.Sleep(2 * time.Second)
		c.start(l)
		c.waitReady(30*time.Second, l)
	}
	// A paused leader: it neither answers nor dies.
	l := leaderOf(0)
	t.Logf("SIGSTOP leader %d of partition 0 for 6 s", l)
	c.signal(l, syscall.SIGSTOP)
	time.Sleep(6 * time.Second)
	c.signal(l, syscall.SIGCONT)
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	fctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	if err := p.Flush(fctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	cancel()
	p.Close()
	log.mu.Lock()
	t.Logf("acknowledged %d records, %d failed", len(log.acked), log.fails)
	for _, e := range log.firstErrs {
		t.Logf("a failure: %s", e)
	}
	if len(log.acked) == 0 {
		t.Fatal("nothing acknowledged")
	}
	log.mu.Unlock()

	// Every follower catches up: the high watermark of each partition equals its leader's log end.
	waitFor(t, 30*time.Second, "replicas in sync", func() error {
		d, err := adm.DescribeTopic(ctx, topic)
		if err != nil {
			return err
		}
		for _, p := range d.Partitions {
			if len(p.ISR) != 3 || p.HighWatermark != p.LogEndOffset {
				return fmt.Errorf("partition %d: ISR %v, HW %d, LEO %d", p.Partition, p.ISR, p.HighWatermark, p.LogEndOffset)
			}
		}
		return nil
	})

	// Read everything back through the cluster and check the acknowledged records.
	got := map[string][]int64{} // value@partition → offsets it was read at
	d, err := adm.DescribeTopic(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	dups := 0
	for _, part := range d.Partitions {
		cons, err := client.NewConsumer(c.grpcAddrs())
		if err != nil {
			t.Fatal(err)
		}
		if err := cons.Assign(topic, part.Partition, client.OffsetEarliest()); err != nil {
			t.Fatal(err)
		}
		for n := int64(0); n < part.HighWatermark; {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			recs, err := cons.Poll(pctx)
			cancel()
			if err != nil {
				t.Fatalf("read partition %d at %d of %d: %v", part.Partition, n, part.HighWatermark, err)
			}
			for _, r := range recs {
				k := string(r.Value) + "@" + strconv.Itoa(int(part.Partition))
				if len(got[k]) > 0 {
					dups++ // a retried batch written twice: what the idempotent producer prevents
				}
				got[k] = append(got[k], r.Offset)
				n = r.Offset + 1
			}
		}
		cons.Close()
	}
	log.mu.Lock()
	lost := 0
	for v, tp := range log.acked {
		offs := got[v+"@"+strconv.Itoa(int(tp.Partition))]
		if !slices.Contains(offs, log.offs[v]) {
			lost++
			if lost <= 5 {
				t.Errorf("acknowledged record %s (partition %d offset %d) read back at %v", v, tp.Partition, log.offs[v], offs)
			}
		}
	}
	log.mu.Unlock()
	if lost > 0 {
		t.Fatalf("%d acknowledged records lost or moved", lost)
	}
	if dups > 0 {
		t.Fatalf("%d records are in the log twice: retries of the idempotent producer were written again", dups)
	}
	t.Logf("every acknowledged record is at its acknowledged offset, exactly once")

	// Stop the nodes and compare every replica's log byte for byte up to the high watermark.
	hws := map[int32]int64{}
	for _, part := range d.Partitions {
		hws[part.Partition] = part.HighWatermark
	}
	c.stopAll()
	var logs [4]map[int32][]byte
	for id := int32(1); id <= 3; id++ {
		logs[id] = readTopicLogs(t, c.nodes[id].dir, 3, hws)
	}
	for part, hw := range hws {
		ref := records(t, logs[1][part])
		for id := int32(2); id <= 3; id++ {
			if got := records(t, logs[id][part]); !slices.Equal(got, ref) {
				t.Fatalf("partition %d: replica on node %d has other records than node 1 below the HW %d (%d vs %d)", part, id, hw, len(got), len(ref))
			}
			if !bytes.Equal(logs[1][part], logs[id][part]) {
				// Same records at the same offsets, but the bytes differ: name the first batch that
				// differs and both copies' header fields, which tell how it came about.
				t.Errorf("partition %d: node %d's log differs from node 1's below the HW %d (same records): %s",
					part, id, hw, firstBatchDiff(t, logs[1][part], logs[id][part]))
			}
		}
		t.Logf("partition %d: 3 replicas hold the same %d records up to HW %d", part, len(ref), hw)
	}
}

// firstBatchDiff describes the first batch where two replicas' logs (concatenated batches) differ: its
// offset and both copies' header fields, or which log ends first.
func firstBatchDiff(t *testing.T, a, b []byte) string {
	t.Helper()
	type rec struct {
		h    batch.Header
		data []byte
	}
	list := func(data []byte) []rec {
		var out []rec
		if err := batch.Split(data, func(bt []byte, h batch.Header) error {
			out = append(out, rec{h, bt})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	la, lb := list(a), list(b)
	for i := 0; i < len(la) && i < len(lb); i++ {
		if bytes.Equal(la[i].data, lb[i].data) {
			continue
		}
		field := ""
		for j := range min(len(la[i].data), len(lb[i].data)) {
			if la[i].data[j] != lb[i].data[j] {
				field = fmt.Sprintf("first differing byte at %d of the batch (0-7 base offset, 12-15 partition leader epoch, 17-20 CRC, 43-56 producer id/epoch/base sequence)", j)
				break
			}
		}
		return fmt.Sprintf("batch #%d at offset %d (the ones before are equal): %s;\n  node 1: %+v\n  other:  %+v",
			i, la[i].h.BaseOffset, field, la[i].h, lb[i].h)
	}
	return fmt.Sprintf("the logs have %d and %d batches, equal as far as both go", len(la), len(lb))
}

// records lists the records of batches as "offset key value" strings.
func records(t *testing.T, batches []byte) []string {
	t.Helper()
	var out []string
	err := batch.Split(batches, func(b []byte, _ batch.Header) error {
		_, err := batch.DecodeBatch(b, func(r batch.Record) error {
			out = append(out, fmt.Sprintf("%d %s %s", r.Offset, r.Key, r.Value))
			return nil
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// readTopicLogs opens a stopped node's store and returns, for the one topic with `partitions`
// partitions, each partition's batches from the log start up to hws[partition] (whole batches whose
// last offset is below the HW, with the leader epoch field as stored).
func readTopicLogs(t *testing.T, dir string, partitions int32, hws map[int32]int64) map[int32][]byte {
	t.Helper()
	o := plog.DefaultOptions(dir)
	o.MemTableSize, o.BlockCacheSize, o.IndexCacheSize = 8<<20, 8<<20, 4<<20
	s, err := plog.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ids, err := s.StoredPartitions()
	if err != nil {
		t.Fatal(err)
	}
	byNum := map[uint64][]int32{}
	for _, id := range ids {
		byNum[id.TopicNum] = append(byNum[id.TopicNum], id.Partition)
	}
	var num uint64
	for n, ps := range byNum {
		if int32(len(ps)) == partitions && slices.Max(ps) == partitions-1 {
			num = n
		}
	}
	out := map[int32][]byte{}
	for part, hw := range hws {
		l, err := s.Partition(plog.PartitionID{TopicNum: num, Partition: part})
		if err != nil {
			t.Fatal(err)
		}
		var all []byte
		for off := l.LogStartOffset(); off < hw; {
			data, err := l.ReadLocal(nil, off, 1<<20)
			if err != nil || len(data) == 0 {
				t.Fatalf("%s: read partition %d at %d: %v", dir, part, off, err)
			}
			err = batch.Split(data, func(b []byte, h batch.Header) error {
				if h.BaseOffset >= hw {
					return nil
				}
				all = append(all, b...)
				off = h.NextOffset()
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		out[part] = all
	}
	return out
}

// metricAbove reports whether a Prometheus line of node's /metrics starts with prefix, contains every
// of contains, and has a value other than 0.
func metricAbove(c *cluster, node int32, prefix string, contains ...string) (bool, error) {
	resp, err := http.Get("http://" + c.nodes[node].http + "/metrics")
	if err != nil {
		return false, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
next:
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, prefix) || strings.HasSuffix(line, " 0") {
			continue
		}
		for _, want := range contains {
			if !strings.Contains(line, want) {
				continue next
			}
		}
		return true, nil
	}
	return false, nil
}

// produceN writes n records with acks and returns the first error.
func produceN(t *testing.T, brokers []string, topic string, part int32, acks client.Acks, n int, tag string) error {
	t.Helper()
	p, err := client.NewProducer(brokers, client.WithAcks(acks), client.WithDeliveryTimeout(4*time.Second),
		client.WithRequestTimeout(2*time.Second), client.WithRetryBackoff(50*time.Millisecond, 300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var first error
	var mu sync.Mutex
	for i := 0; i < n; i++ {
		r := client.NewRecord(topic, nil, []byte(fmt.Sprintf("%s-%d", tag, i)))
		r.Partition = part
		p.Produce(context.Background(), r, func(_ *client.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	return first
}

// TestISRAndUncleanElection: with min.insync.replicas=2, acks=all is refused with NOT_ENOUGH_REPLICAS
// once the followers are gone and works again when one is back in the ISR; a partition whose only
// in-sync replica died stays offline rather than elect an out-of-sync replica, until the topic sets
// unclean.leader.election.enable=true — and then the records only the dead leader had are lost.
func TestISRAndUncleanElection(t *testing.T) {
	// One controller voter (node 1) and three more brokers: the test kills brokers of one partition,
	// and the controller must keep its majority to change the ISR.
	c := startCluster(t, 4, 1)
	adm := c.admin()
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, "isr", 8, 3, map[string]string{"min.insync.replicas": "2"}); err != nil {
		t.Fatal(err)
	}
	d, err := adm.DescribeTopic(ctx, "isr")
	if err != nil {
		t.Fatal(err)
	}
	part := int32(-1)
	for _, p := range d.Partitions {
		if !slices.Contains(p.Replicas, 1) {
			part = p.Partition
			break
		}
	}
	if part < 0 {
		t.Fatalf("no partition without the controller among its replicas: %+v", d.Partitions)
	}
	pd := d.Partitions[part]
	if err := produceN(t, c.grpcAddrs(), "isr", part, client.AcksAll, 100, "a"); err != nil {
		t.Fatalf("acks=all with a full ISR: %v", err)
	}
	leader := pd.LeaderID
	var followers []int32
	for _, r := range pd.Replicas {
		if r != leader {
			followers = append(followers, r)
		}
	}
	for _, f := range followers {
		c.kill(f)
	}
	isrIs := func(what string, want ...int32) {
		t.Helper()
		waitFor(t, 15*time.Second, what, func() error {
			d, err := c.admin(leader).DescribeTopic(ctx, "isr")
			if err != nil {
				return err
			}
			if isr := d.Partitions[part].ISR; !slices.Equal(isr, want) {
				return fmt.Errorf("ISR %v", isr)
			}
			return nil
		})
	}
	isrIs("the ISR shrinks to the leader", leader)
	err = produceN(t, []string{c.nodes[leader].grpc}, "isr", part, client.AcksAll, 10, "b")
	if err == nil || !strings.Contains(err.Error(), "NOT_ENOUGH_REPLICAS") {
		t.Fatalf("acks=all with an ISR of 1 < min.insync.replicas=2: %v, want NOT_ENOUGH_REPLICAS", err)
	}
	if err := produceN(t, []string{c.nodes[leader].grpc}, "isr", part, client.AcksLeader, 50, "c"); err != nil {
		t.Fatalf("acks=1 with a short ISR: %v", err)
	}
	// The leader's /metrics shows the short ISR and the dead followers' lag (the 50 records above).
	waitFor(t, 10*time.Second, "the leader's metrics show the under-replicated partition and its lagging followers", func() error {
		under, err := metricAbove(c, leader, "runnel_partitions_under_replicated")
		if err != nil {
			return err
		}
		lag, err := metricAbove(c, leader, "runnel_partition_follower_lag{", `messaging_destination_name="isr"`,
			fmt.Sprintf(`messaging_destination_partition_id="%d"`, part))
		if err != nil {
			return err
		}
		if !under || !lag {
			return fmt.Errorf("under-replicated gauge above 0: %v, a follower lag above 0: %v", under, lag)
		}
		return nil
	})
	c.start(followers[0])
	waitFor(t, 30*time.Second, "the restarted follower back in the ISR", func() error {
		d, err := c.admin(leader).DescribeTopic(ctx, "isr")
		if err != nil {
			return err
		}
		if len(d.Partitions[part].ISR) != 2 {
			return fmt.Errorf("ISR %v", d.Partitions[part].ISR)
		}
		return nil
	})
	if err := produceN(t, c.grpcAddrs(leader, followers[0]), "isr", part, client.AcksAll, 10, "d"); err != nil {
		t.Fatalf("acks=all after the ISR grew back: %v", err)
	}

	// Unclean election: the leader alone in the ISR again, writes only it has, then it dies.
	c.kill(followers[0])
	isrIs("the ISR shrinks to the leader again", leader)
	if err := produceN(t, []string{c.nodes[leader].grpc}, "isr", part, client.AcksLeader, 20, "only-on-leader"); err != nil {
		t.Fatal(err)
	}
	hwBefore := int64(0)
	if d, err := c.admin(leader).DescribeTopic(ctx, "isr"); err == nil {
		hwBefore = d.Partitions[part].HighWatermark
	}
	c.kill(leader)
	c.start(followers[0])
	c.waitReady(30*time.Second, followers[0])
	survivor := c.admin(followers[0])
	// The out-of-sync follower is alive, but the partition has no leader.
	time.Sleep(3 * time.Second) // give a wrong election the time to happen
	d, err = survivor.DescribeTopic(ctx, "isr")
	if err != nil {
		t.Fatal(err)
	}
	if d.Partitions[part].LeaderID != -1 {
		t.Fatalf("an out-of-sync replica was elected by default: %+v", d.Partitions[part])
	}
	if _, err := survivor.AlterTopicConfig(ctx, "isr", map[string]string{"unclean.leader.election.enable": "true"}, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the unclean election", func() error {
		d, err = survivor.DescribeTopic(ctx, "isr")
		if err != nil {
			return err
		}
		if d.Partitions[part].LeaderID != followers[0] {
			return fmt.Errorf("leader %d", d.Partitions[part].LeaderID)
		}
		return nil
	})
	if hw := d.Partitions[part].HighWatermark; hw >= hwBefore {
		t.Fatalf("after the unclean election the HW is %d, the old leader's was %d: the records only it had should be gone", hw, hwBefore)
	}
	t.Logf("unclean election: HW %d -> %d, %d acknowledged (acks=1) records lost as documented", hwBefore, d.Partitions[part].HighWatermark, hwBefore-d.Partitions[part].HighWatermark)
}
