package platform_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/platform/platformtest"
)

// quake is one feature of the earthquake feed: its id and its JSON, decoded so revisions can change it.
type quake struct {
	id      string
	feature map[string]any
}

func loadQuakes(t *testing.T) []quake {
	t.Helper()
	path := platformtest.SharedData(t, "earthquakes.ndjson")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var qs []quake
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var feat map[string]any
		if err := json.Unmarshal(sc.Bytes(), &feat); err != nil {
			t.Fatalf("line %d: %v", len(qs)+1, err)
		}
		id, _ := feat["id"].(string)
		if id == "" {
			t.Fatalf("line %d has no id", len(qs)+1)
		}
		qs = append(qs, quake{id: id, feature: feat})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return qs
}

// revision returns the feature as revision rev: from 2 on, USGS-style updates (a revised magnitude for
// some, a later "updated" time for all).
func (q quake) revision(t *testing.T, i, rev int) []byte {
	t.Helper()
	props, _ := q.feature["properties"].(map[string]any)
	c := make(map[string]any, len(props)+1)
	for k, v := range props {
		c[k] = v
	}
	if rev > 1 {
		if upd, ok := c["updated"].(float64); ok {
			c["updated"] = upd + float64(rev-1)*60_000
		}
		if mag, ok := c["mag"].(float64); ok && i%3 == 0 {
			c["mag"] = mag + 0.1*float64(rev-1)
		}
		c["status"] = "reviewed"
	}
	out := make(map[string]any, len(q.feature))
	for k, v := range q.feature {
		out[k] = v
	}
	out["properties"] = c
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// write is one record produced to the changelog: value nil is a tombstone; seq (also in the record
// header "seq") orders all writes, so readers can check that per key nothing older follows newer.
type write struct {
	id    string
	value []byte
	seq   int
}

// placed is a write and the offset it got.
type placed struct {
	write
	offset int64
}

const quakePartitions = 3

func quakePartition(id string) int32 { return int32(crc32.ChecksumIEEE([]byte(id)) % quakePartitions) }

// TestCompaction is issue 3's Compaction test: the earthquake feed (key id) written twice with updates,
// then tombstones for every 7th id, then a third revision for every 25th id (bringing some deleted ids
// back), into a compacted topic through a node's gRPC API. While consumers read it from the start over
// and over, the broker's cleaner runs (called directly with its clock); afterwards, and once
// delete.retention.ms has passed on that clock, the topic holds exactly the latest revision per id, at
// the offsets it was written at, with no tombstones; every consumer pass saw offsets rising and, per id,
// never an older write after a newer one, and ended with the same latest state.
func TestCompaction(t *testing.T) {
	qs := loadQuakes(t)
	tn := startNode(t, t.TempDir())
	const topic = "earthquakes"
	const deleteRetention = 60_000
	tn.createTopic(t, topic, quakePartitions, map[string]string{
		"cleanup.policy":      "compact",
		"segment.ms":          "100",   // segments roll between the passes below
		"segment.bytes":       "65536", // and within them
		"delete.retention.ms": strconv.Itoa(deleteRetention),
	})

	// Four phases, each produced completely before the next, so the last batch of every partition
	// (which the cleaner never touches) holds only third revisions.
	var phases [4][]write
	for i, q := range qs {
		phases[0] = append(phases[0], write{id: q.id, value: q.revision(t, i, 1)})
		phases[1] = append(phases[1], write{id: q.id, value: q.revision(t, i, 2)})
		if i%7 == 0 {
			phases[2] = append(phases[2], write{id: q.id})
		}
		if i%25 == 0 {
			phases[3] = append(phases[3], write{id: q.id, value: q.revision(t, i, 3)})
		}
	}

	// Produce per partition in batches of up to 40 records with rotating codecs; remember offsets.
	latest := map[string]placed{} // id → its last write
	codecs := []batch.Compression{batch.CompressionNone, batch.CompressionZstd, batch.CompressionLZ4, batch.CompressionSnappy, batch.CompressionGzip}
	hws := make([]int64, quakePartitions)
	seq, n := 0, 0
	for _, phase := range phases {
		perPart := make([][]write, quakePartitions)
		for _, w := range phase {
			seq++
			w.seq = seq
			p := quakePartition(w.id)
			perPart[p] = append(perPart[p], w)
		}
		for p, ws := range perPart {
			for len(ws) > 0 {
				chunk := ws[:min(40, len(ws))]
				ws = ws[len(chunk):]
				var b batch.Builder
				for _, w := range chunk {
					b.Append(time.Now().UnixMilli(), []byte(w.id), w.value, []batch.RecordHeader{{Key: "seq", Value: []byte(strconv.Itoa(w.seq))}})
				}
				n++
				r, err := tn.produce(t, topic, int32(p), b.Build(codecs[n%len(codecs)]), runnelv1.Acks_ACKS_ALL)
				if err != nil {
					t.Fatalf("produce to %d: %v", p, err)
				}
				for i, w := range chunk {
					latest[w.id] = placed{w, r.BaseOffset + int64(i)}
				}
				hws[p] = r.BaseOffset + int64(len(chunk))
			}
		}
	}

	// The final state: every id's last write, unless that is a tombstone.
	want := make([]map[string]placed, quakePartitions)
	for p := range want {
		want[p] = map[string]placed{}
	}
	for id, w := range latest {
		if w.value != nil {
			want[quakePartition(id)][id] = w
		}
	}

	// Consumers read every partition from the start until they catch up, over and over.
	var stop atomic.Bool
	var passes [quakePartitions]atomic.Int64
	// tombClean is 1 while the clean past delete.retention.ms runs and 2 after it. A pass that overlaps
	// it may read an id's older revision before the clean and pass the offset of its tombstone after
	// the clean removed it: that is what delete.retention.ms bounds in Kafka (a reader must get from
	// the start to the head within it to see every deletion), and the jump of the cleaner's clock
	// gives such a pass no time at all. It may then end with a deleted id still holding a value.
	var tombClean atomic.Int32
	errs := make(chan error, quakePartitions)
	var wg sync.WaitGroup
	var spansMu sync.Mutex
	var spans [][2]time.Time // when each pass began and ended
	for p := range quakePartitions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				begin, beginPhase := time.Now(), tombClean.Load()
				final, err := consumePass(tn.records, topic, int32(p))
				overlapped := beginPhase != 2 && tombClean.Load() >= 1
				spansMu.Lock()
				spans = append(spans, [2]time.Time{begin, time.Now()})
				spansMu.Unlock()
				if err == nil {
					err = sameState(final, want[p], true, overlapped)
				}
				if err != nil {
					errs <- fmt.Errorf("consumer of partition %d, pass %d: %w", p, passes[p].Load()+1, err)
					return
				}
				passes[p].Add(1)
			}
		}()
	}
	waitPasses := func(what string, atLeast []int64) []int64 {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		now := make([]int64, quakePartitions)
		for p := range quakePartitions {
			for passes[p].Load() < atLeast[p] {
				select {
				case err := <-errs:
					t.Fatal(err)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("timed out waiting for %s", what)
				}
				time.Sleep(time.Millisecond)
			}
			now[p] = passes[p].Load()
		}
		return now
	}
	seen := waitPasses("a first pass of every consumer", []int64{1, 1, 1})

	// The cleaner runs while they read: first with the current time (the segments closed by segment.ms
	// roll), then once delete.retention.ms has passed on its clock.
	broker := tn.node.Broker()
	clock := time.Now().Add(time.Second)
	var cleaned int
	cleanBegin := time.Now()
	results := broker.Compact(context.Background(), clock)
	cleanEnd := time.Now()
	for _, r := range results {
		if r.Topic == topic && r.Stats.Reason != "" {
			t.Logf("first clean of partition %d: %+v", r.Partition, r.Stats)
			cleaned++
			if r.Stats.RecordsRemoved == 0 || r.Stats.TombstonesRemoved != 0 {
				t.Fatalf("first clean of partition %d: %+v", r.Partition, r.Stats)
			}
		}
	}
	if cleaned != quakePartitions {
		t.Fatalf("%d partitions cleaned, want %d", cleaned, quakePartitions)
	}
	seen = waitPasses("a pass after the first clean", []int64{seen[0] + 2, seen[1] + 2, seen[2] + 2})
	var tombstones int64
	tombClean.Store(1)
	second := broker.Compact(context.Background(), clock.Add(deleteRetention*time.Millisecond+time.Millisecond))
	tombClean.Store(2)
	for _, r := range second {
		if r.Topic == topic {
			if r.Stats.Reason != plog.ReasonTombstones {
				t.Fatalf("second clean of partition %d: %+v", r.Partition, r.Stats)
			}
			tombstones += r.Stats.TombstonesRemoved
		}
	}
	seen = waitPasses("a pass after the second clean", []int64{seen[0] + 2, seen[1] + 2, seen[2] + 2})
	stop.Store(true)
	wg.Wait()
	during := 0
	for _, sp := range spans {
		if sp[0].Before(cleanEnd) && sp[1].After(cleanBegin) {
			during++
		}
	}
	if during == 0 {
		t.Fatal("no consumer pass overlapped the first clean")
	}
	t.Logf("%d writes; consumer passes per partition: %v, %d during the first clean; %d tombstones removed at the horizon",
		seq, seen, during, tombstones)
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	// Tombstones of ids written again after them were obsolete at once; the others waited.
	var wantTombs int64
	for i := range qs {
		if i%7 == 0 && i%25 != 0 {
			wantTombs++
		}
	}
	if tombstones != wantTombs {
		t.Fatalf("%d tombstones removed at the horizon, want %d", tombstones, wantTombs)
	}

	// Now exactly the latest revision per id, at its original offset, no tombstones, log start 0, HW
	// unchanged, and the size the topic reports is what a consumer reads.
	desc, err := tn.admin.DescribeTopics(ctxT(t), &runnelv1.DescribeTopicsRequest{Topics: []string{topic}})
	if err != nil {
		t.Fatal(err)
	}
	for p := range quakePartitions {
		final, err := consumePass(tn.records, topic, int32(p))
		if err != nil {
			t.Fatal(err)
		}
		if err := sameState(final, want[p], false, false); err != nil {
			t.Fatalf("partition %d after compaction: %v", p, err)
		}
		for id, got := range final.records {
			if got.offset != want[p][id].offset {
				t.Fatalf("partition %d: id %s at offset %d, written at %d", p, id, got.offset, want[p][id].offset)
			}
		}
		pd := desc.Topics[0].Partitions[p]
		if pd.LogStartOffset != 0 || pd.HighWatermark != hws[p] || pd.SizeBytes != final.bytes {
			t.Fatalf("partition %d: log start %d, HW %d (want %d), size %d (read %d)", p, pd.LogStartOffset, pd.HighWatermark, hws[p], pd.SizeBytes, final.bytes)
		}
	}
}

// consumed is what one pass over a partition saw.
type consumed struct {
	records map[string]consumedRecord // id → the last record of the id (a tombstone has value nil)
	dups    int                       // records of an id seen before in the pass
	tombs   int
	bytes   int64 // batch bytes read
}

type consumedRecord struct {
	offset int64
	value  []byte
	seq    int
}

// consumePass fetches partition from offset 0 until it reaches the HW, as a consumer does (next offset =
// the last batch's next offset, small fetches), and checks the stream: offsets rise strictly and, per
// id, the write sequence numbers rise.
func consumePass(records runnelv1.RecordsClient, topic string, partition int32) (consumed, error) {
	out := consumed{records: map[string]consumedRecord{}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	next, last := int64(0), int64(-1)
	for {
		resp, err := records.Fetch(ctx, &runnelv1.FetchRequest{MaxBytes: 8 << 10, Partitions: []*runnelv1.FetchPartition{
			{Topic: topic, Partition: partition, FetchOffset: next, PartitionMaxBytes: 8 << 10}}})
		if err != nil {
			return out, rerr.FromStatus(err)
		}
		r := resp.Partitions[0]
		if err := rerr.FromInfo(r.Error); err != nil {
			return out, fmt.Errorf("fetch at %d: %w", next, err)
		}
		for b := r.Records; len(b) > 0; {
			h, err := batch.DecodeBatch(b, func(rec batch.Record) error {
				if rec.Offset < next {
					return nil // below the position, in the first batch
				}
				if rec.Offset <= last {
					return fmt.Errorf("offset %d after %d", rec.Offset, last)
				}
				last = rec.Offset
				if len(rec.Headers) != 1 || rec.Headers[0].Key != "seq" {
					return fmt.Errorf("offset %d: headers %v", rec.Offset, rec.Headers)
				}
				seq, _ := strconv.Atoi(string(rec.Headers[0].Value))
				id := string(rec.Key)
				if prev, ok := out.records[id]; ok {
					if seq <= prev.seq {
						return fmt.Errorf("id %s: write %d at offset %d after write %d at offset %d", id, seq, rec.Offset, prev.seq, prev.offset)
					}
					out.dups++
				}
				if rec.Value == nil {
					out.tombs++
				}
				var value []byte // nil: a tombstone
				if rec.Value != nil {
					value = append([]byte{}, rec.Value...)
				}
				out.records[id] = consumedRecord{offset: rec.Offset, value: value, seq: seq}
				return nil
			})
			if err != nil {
				return out, fmt.Errorf("batch fetched at %d: %w", next, err)
			}
			if h.NextOffset() > next { // a batch seen for the first time in this pass
				out.bytes += int64(h.Size())
			}
			next = max(next, h.NextOffset())
			b = b[h.Size():]
		}
		if next >= r.HighWatermark {
			return out, nil
		}
		if len(r.Records) == 0 {
			return out, fmt.Errorf("empty fetch at %d below HW %d", next, r.HighWatermark)
		}
	}
}

// sameState compares a pass's last record per id with want (ids whose last write is not a tombstone).
// during: the pass may still hold older revisions, and tombstones (as the last record of a deleted id,
// standing for its absence); after compaction (during false) each id appears once and no tombstone.
// staleDeletes: a deleted id may end with an older revision (the pass overlapped the removal of
// tombstones past delete.retention.ms); every id in want must still end exactly at its last write.
func sameState(got consumed, want map[string]placed, during, staleDeletes bool) error {
	live := 0
	for id, r := range got.records {
		if r.value == nil {
			if _, ok := want[id]; ok {
				return fmt.Errorf("id %s ends deleted, want write %d", id, want[id].seq)
			}
			continue
		}
		w, ok := want[id]
		if !ok && staleDeletes {
			continue
		}
		if !ok {
			return fmt.Errorf("id %s ends with write %d, want it deleted", id, r.seq)
		}
		if r.seq != w.seq || string(r.value) != string(w.value) {
			return fmt.Errorf("id %s ends with write %d, want %d", id, r.seq, w.seq)
		}
		live++
	}
	if live != len(want) {
		return fmt.Errorf("%d ids live, want %d", live, len(want))
	}
	if !during && (got.dups != 0 || got.tombs != 0) {
		return fmt.Errorf("%d older revisions and %d tombstones left", got.dups, got.tombs)
	}
	return nil
}

// TestCompactedTopicRefusesKeylessRecords: a record without a key can never be kept by compaction, so
// produce refuses a batch holding one on compacted topics with INVALID_RECORD (and stores none of it);
// other topics take it.
func TestCompactedTopicRefusesKeylessRecords(t *testing.T) {
	tn := startNode(t, t.TempDir())
	tn.createTopic(t, "changelog", 1, map[string]string{"cleanup.policy": "compact,delete"})
	tn.createTopic(t, "events", 1, nil)
	for _, c := range []batch.Compression{batch.CompressionNone, batch.CompressionZstd} {
		var b batch.Builder
		b.Append(1, []byte("k"), []byte("keyed"), nil)
		b.Append(2, nil, []byte("keyless"), nil)
		recs := append([]byte(nil), b.Build(c)...)
		if _, err := tn.produce(t, "changelog", 0, recs, runnelv1.Acks_ACKS_ALL); !errors.Is(err, rerr.ErrInvalidRecord) {
			t.Fatalf("%v: keyless record on a compacted topic: %v, want INVALID_RECORD", c, err)
		}
		if _, err := tn.produce(t, "events", 0, recs, runnelv1.Acks_ACKS_ALL); err != nil {
			t.Fatalf("%v: keyless record on a delete topic: %v", c, err)
		}
	}
	r, err := tn.fetch(t, "changelog", 0, 0, 0)
	if err != nil || r.HighWatermark != 0 || len(r.Records) != 0 {
		t.Fatalf("the refused batches left HW %d, %d bytes (%v)", r.GetHighWatermark(), len(r.GetRecords()), err)
	}
	var b batch.Builder
	b.Append(1, []byte("k"), nil, nil) // a tombstone has a key: fine
	if _, err := tn.produce(t, "changelog", 0, b.Build(batch.CompressionNone), runnelv1.Acks_ACKS_ALL); err != nil {
		t.Fatalf("tombstone: %v", err)
	}
}
