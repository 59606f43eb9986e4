package main

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/runnel-io/runnel/bench/report"
	"github.com/runnel-io/runnel/client"
)

// These tests never start a server: running the systems is the benchmark's job (make bench-compare).

func TestMatrix(t *testing.T) {
	p, c, l := matrix(false, 0.5)
	if len(p) != 4 || len(c) != 1 || len(l) != 1 {
		t.Fatalf("reduced matrix: %d produce, %d consume, %d latency workloads", len(p), len(c), len(l))
	}
	if w := p[0]; w.Size != 100 || w.Producers != 1 || w.Partitions != 12 || w.Keys {
		t.Fatalf("the base workload should be 100B, 1 producer, 12 partitions, no keys: %+v", w)
	}
	p, c, l = matrix(true, 0.5)
	if len(p) != 24 || len(c) != 2 || len(l) != 3 {
		t.Fatalf("full matrix: %d produce, %d consume, %d latency workloads", len(p), len(c), len(l))
	}
	seen := map[string]bool{}
	for _, w := range p {
		if seen[w.ID()] {
			t.Fatalf("duplicate workload %s", w.ID())
		}
		seen[w.ID()] = true
	}
	for _, want := range []string{"produce 1KiB 16prod 48part keys", "produce 100B 1prod 1part no keys"} {
		if !seen[want] {
			t.Errorf("full matrix lacks %s", want)
		}
	}
	for _, w := range l {
		if w.Kind != report.KindLatency || w.LoadFraction != 0.5 {
			t.Errorf("latency workload %+v", w)
		}
	}
}

func TestSticky(t *testing.T) {
	s := newSticky(3, 0)
	counts := map[int32]int{}
	prev, switches := int32(-1), 0
	for i := 0; i < 3*stickyRecords; i++ {
		p := s.next(-1)
		if p != prev {
			switches++
			prev = p
		}
		counts[p]++
	}
	if switches != 3 || len(counts) != 3 || counts[0] != stickyRecords {
		t.Fatalf("switches %d counts %v: want runs of %d on each partition", switches, counts, stickyRecords)
	}
	if s.next(2) != 2 {
		t.Fatal("an explicit partition must be kept")
	}
}

func TestLoadFlightKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.ndjson.zst")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	zw, _ := zstd.NewWriter(f)
	lines := []string{
		`{"date":"2001-01-01T00:01:00","delay":33,"distance":2176,"origin":"LAS","destination":"PHL"}`,
		`{"date":"2001-01-01T00:02:00","delay":1,"distance":100,"origin":"ORD","destination":"LAS"}`,
		`not json at all`,
		`{"date":"2001-01-01T00:03:00","delay":1,"distance":100,"origin":"LAS","destination":"ORD"}`,
	}
	zw.Write([]byte(strings.Join(lines, "\n") + "\n"))
	zw.Close()
	f.Close()
	k, err := loadFlightKeys(path, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(k.names) != 2 || len(k.seq) != 3 {
		t.Fatalf("%d distinct keys, %d records; want 2 and 3", len(k.names), len(k.seq))
	}
	got := []string{string(k.at(0)), string(k.at(1)), string(k.at(2)), string(k.at(3))}
	if strings.Join(got, ",") != "LAS,ORD,LAS,LAS" {
		t.Fatalf("keys %v", got)
	}
	if k, err := loadFlightKeys(path, 1); err != nil || len(k.seq) != 1 {
		t.Fatalf("max 1: %v, %v", k, err)
	}
}

func TestSourceStampsValues(t *testing.T) {
	src := newSource(&flightKeys{names: [][]byte{[]byte("ORD")}, seq: []uint16{0}})
	w := report.Workload{Kind: report.KindLatency, Size: 100, Partitions: 12, Keys: true}
	key, part, v := src.record(w, 0, 0, timeUnix(42))
	if string(key) != "ORD" || part < 0 || part >= 12 || len(v) != 100 {
		t.Fatalf("key %q part %d len %d", key, part, len(v))
	}
	if got := int64(v[7]) | int64(v[6])<<8; got != 42 {
		t.Fatalf("value does not start with the intended time: % x", v[:8])
	}
	w.Keys = false
	key, part, v2 := src.record(w, 1, 0, timeUnix(0).AddDate(0, 0, 0))
	if key != nil || part != -1 || len(v2) != 100 {
		t.Fatalf("keyless record: key %q part %d", key, part)
	}
}

func timeUnix(ns int64) time.Time { return time.Unix(0, ns) }

// TestTallySamples: every ack is counted, the first and one in latencyEvery after it are recorded as
// latency samples, errors are counted apart and cancellations ignored.
func TestTallySamples(t *testing.T) {
	tl := &tally{}
	intended := time.Now().Add(-time.Millisecond)
	tl.ack(intended, 100, nil)
	if got := tl.rec.H.Count(); got != 1 {
		t.Fatalf("the first ack gave %d latency samples, want 1", got)
	}
	for range 10*latencyEvery - 1 {
		tl.ack(intended, 100, nil)
	}
	tl.ack(intended, 100, errors.New("refused"))
	tl.ack(intended, 100, context.Canceled)
	if got, want := tl.acked.Load(), int64(10*latencyEvery); got != want {
		t.Fatalf("acked %d, want %d", got, want)
	}
	if got, want := tl.bytes.Load(), int64(10*latencyEvery*100); got != want {
		t.Fatalf("bytes %d, want %d", got, want)
	}
	if got := tl.rec.H.Count(); got != 10 {
		t.Fatalf("%d latency samples of %d acks, want 10 (one in %d)", got, 10*latencyEvery, latencyEvery)
	}
	if got := tl.rec.H.Min(); got < time.Millisecond {
		t.Fatalf("smallest sample %v, want at least the 1 ms since the intended time", got)
	}
	if tl.errs.Load() != 1 || tl.errString() != "refused" {
		t.Fatalf("errors %d (%q), want 1 (refused)", tl.errs.Load(), tl.errString())
	}
}

// TestReceiptsSample: an e2e consumer counts every record and samples the end-to-end latency of the
// first and one in latencyEvery after it, from the stamp in the value.
func TestReceiptsSample(t *testing.T) {
	r := &receipts{}
	value := make([]byte, 100)
	binary.BigEndian.PutUint64(value, uint64(time.Now().Add(-time.Millisecond).UnixNano()))
	r.receive(value)
	if got := r.rec.H.Count(); got != 1 {
		t.Fatalf("the first record gave %d samples, want 1", got)
	}
	for range 10*latencyEvery - 1 {
		r.receive(value)
	}
	if got := r.consumed.Load(); got != 10*latencyEvery {
		t.Fatalf("consumed %d, want %d", got, 10*latencyEvery)
	}
	if got := r.rec.H.Count(); got != 10 {
		t.Fatalf("%d samples of %d records, want 10", got, 10*latencyEvery)
	}
	if got := r.rec.H.Min(); got < time.Millisecond {
		t.Fatalf("smallest sample %v, want at least the 1 ms since the stamp", got)
	}
}

func TestMedianPass(t *testing.T) {
	p := func(ms int) consumePass {
		return consumePass{bytes: int64(ms), elapsed: time.Duration(ms) * time.Millisecond}
	}
	for _, c := range []struct {
		passes []consumePass
		want   int
	}{
		{[]consumePass{p(500)}, 500},
		{[]consumePass{p(700), p(400), p(500)}, 500}, // a slow first pass (a hiccup) is left out
		{[]consumePass{p(400), p(900), p(450), p(420), p(2000)}, 450},
		{[]consumePass{p(400), p(600)}, 600}, // of two middle ones, the slower
	} {
		if got := medianPass(c.passes); got.elapsed != time.Duration(c.want)*time.Millisecond || got.bytes != int64(c.want) {
			t.Errorf("medianPass(%v) = %v, want the %d ms pass", c.passes, got, c.want)
		}
	}
}

// TestSDKDefaults: the report states the SDK settings the Runnel runs had, from the SDK itself.
func TestSDKDefaults(t *testing.T) {
	for _, tc := range []struct {
		d    client.ProducerDefaults
		want string
	}{
		{client.ProducerDefaults{BatchBytes: 1 << 20, MaxBufferedBytes: 32 << 20, MaxInFlight: 5},
			"linger 0 (natural batching: a full batch goes when a request slot is free, one not full when none is in flight), 1.0 MiB batches, 32 MiB buffer, 5 requests in flight"},
		{client.ProducerDefaults{Linger: 5 * time.Millisecond, BatchBytes: 16 << 10, MaxBufferedBytes: 64 << 20, MaxInFlight: 1},
			"linger 5ms, 16 KiB batches, 64 MiB buffer, 1 requests in flight"},
	} {
		if got := sdkDefaults(tc.d); got != tc.want {
			t.Errorf("sdkDefaults(%+v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

// TestSummarizeRounds writes the summary of two saved rounds and checks that it links each round's
// report relative to the summary and carries both rounds' ratios; a missing results.json fails with
// the round it belongs to.
func TestSummarizeRounds(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	for k, jsRate := range []float64{100_000, 200_000} {
		r := &report.Results{
			Started: time.Date(2026, 12, 2, 18, k, 0, 0, time.UTC), Command: "peers",
			Systems: []report.System{{Name: "jetstream", Family: "jetstream"}, {Name: "runnel acks=all", Family: "runnel"}},
		}
		w := report.Workload{Kind: report.KindConsume, Size: 100, Producers: 1, Partitions: 12}
		r.Runs = []report.Run{{Workload: w, System: "jetstream", RecordsPerSec: jsRate}, {Workload: w, System: "runnel acks=all", RecordsPerSec: 2_400_000}}
		rd := filepath.Join(dir, "round-"+string(rune('1'+k)))
		if err := os.MkdirAll(rd, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(rd, "results.json")
		if err := r.Save(p); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	out := filepath.Join(dir, "report.md")
	// Round 1's own report is not there yet: the summary would link nothing.
	if err := report.Write(filepath.Dir(paths[1]), mustLoad(t, paths[1])); err != nil {
		t.Fatal(err)
	}
	if err := summarizeRounds(out, paths); err == nil || !strings.Contains(err.Error(), "round 1") {
		t.Errorf("round 1 without its report.md: err %v, want one naming round 1", err)
	}
	if err := report.Write(filepath.Dir(paths[0]), mustLoad(t, paths[0])); err != nil {
		t.Fatal(err)
	}
	if err := summarizeRounds(out, paths); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"[report](round-1/report.md)", "[report](round-2/report.md)", "| 24.0× | 12.0× | 12.0× | ≥ 10× | **yes** | 2 of 2 |"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("summary lacks %q:\n%s", want, b)
		}
	}
	if err := summarizeRounds(out, append(paths, filepath.Join(dir, "round-3", "results.json"))); err == nil || !strings.Contains(err.Error(), "round 3") {
		t.Errorf("a missing round's results: err %v, want one naming round 3", err)
	}
	// Rounds named relative to the working directory, the summary elsewhere by an absolute path.
	t.Chdir(dir)
	elsewhere := filepath.Join(t.TempDir(), "summary.md")
	if err := summarizeRounds(elsewhere, []string{"round-1/results.json", "round-2/results.json"}); err != nil {
		t.Fatalf("relative rounds, absolute summary: %v", err)
	}
	if b, err := os.ReadFile(elsewhere); err != nil || !strings.Contains(string(b), "round-1/report.md)") {
		t.Errorf("relative rounds, absolute summary: %v, links:\n%s", err, b)
	}
	if err := summarizeRounds(out, nil); err == nil {
		t.Error("summarizeRounds took no rounds")
	}
}

func mustLoad(t *testing.T, path string) *report.Results {
	t.Helper()
	r, err := report.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
