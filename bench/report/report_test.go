package report

import (
	"bytes"
	"fmt"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnel-io/runnel/bench/latency"
)

// synthetic returns results shaped like a reduced run, with round numbers so ratios are known.
func synthetic() *Results {
	start := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	r := &Results{
		Started: start, Finished: start.Add(9 * time.Minute), Matrix: "reduced", Command: "go run ./bench/peers",
		Machine: Machine{CPUs: 2, CPUModel: "Test CPU", MemoryGB: 24, Kernel: "Linux 6.1", Disk: "/dev/vda (ext4)", GoVer: "go1.26.8", LoadAvg: "0.1 0.2 0.3"},
		Systems: []System{
			{Name: "jetstream", Family: "jetstream", Version: "nats-server v2.9.10", Client: "nats.go v1.55.0", Durability: DurOS, DurabilityNote: "page cache"},
			{Name: "redis always", Family: "redis", Version: "redis-server 7.0.15", Client: "go-redis v9.23.0", Durability: DurFsync, DurabilityNote: "fsync|always"},
			{Name: "runnel acks=all", Family: "runnel", Version: "abc123", Client: "client/", Durability: DurFsync, DurabilityNote: "fsynced"},
			{Name: "runnel acks=all no-fsync", Family: "runnel", Version: "abc123", Client: "client/", Durability: DurOS, DurabilityNote: "os"},
		},
		Ceilings: []Ceiling{
			{Name: "disk write+fdatasync", MBPerSec: 400, Note: "1 MiB writes"},
			{Name: "disk sequential write", MBPerSec: 300, Note: "1 MiB writes, fsync at the end"},
			{Name: "grpc bare stream (loopback)", MBPerSec: 1000, Note: "1 MiB requests"},
		},
	}
	prod := Workload{Kind: KindProduce, Size: 100, Producers: 1, Partitions: 12}
	big := Workload{Kind: KindProduce, Size: 1024, Producers: 1, Partitions: 12}
	cons := Workload{Kind: KindConsume, Size: 100, Producers: 1, Partitions: 12}
	lat := Workload{Kind: KindLatency, Size: 100, Producers: 1, Partitions: 12, LoadFraction: 0.5}
	same := lat
	same.PacedAs = "jetstream"
	sum := func(p50, p99 float64) *latency.Summary {
		return &latency.Summary{Count: 1000, P50Ms: p50, P99Ms: p99, P999Ms: p99 * 1.5, MaxMs: p99 * 2}
	}
	add := func(w Workload, sys string, rps float64, l *latency.Summary) {
		run := Run{Workload: w, System: sys, Records: int64(rps * 6), Bytes: int64(rps * 6 * float64(w.Size)), Seconds: 6,
			RecordsPerSec: rps, MBPerSec: rps * float64(w.Size) / 1e6, Latency: l}
		if w.Kind == KindLatency {
			run.TargetRate, run.LatencyWhat = rps, "ack minus intended send (one ack in 8 sampled)"
		}
		if w.Kind == KindEndToEnd {
			run.TargetRate, run.EndToEnd = rps, sum(l.P50Ms*2, l.P99Ms*2)
		}
		r.Runs = append(r.Runs, run)
	}
	add(prod, "jetstream", 100_000, sum(20, 40))
	add(prod, "redis always", 200_000, sum(10, 30))
	add(prod, "runnel acks=all", 1_200_000, sum(100, 300)) // 12× JetStream; 120 MB/s = 0.12 of gRPC
	add(prod, "runnel acks=all no-fsync", 800_000, sum(90, 250))
	add(big, "jetstream", 50_000, sum(20, 40))
	add(big, "runnel acks=all", 400_000, sum(20, 40))
	add(cons, "jetstream", 500_000, nil)
	add(cons, "runnel acks=all", 6_000_000, nil)                                    // 12×
	r.Runs[len(r.Runs)-1].PassesPerSec = []float64{4_500_000, 6_000_000, 7_250_000} // the median is the run's figure
	add(lat, "jetstream", 50_000, sum(1, 20))
	add(lat, "runnel acks=all", 600_000, sum(8, 40)) // p99 twice JetStream's: missed
	add(same, "runnel acks=all", 50_000, sum(6, 10)) // at JetStream's rate: better
	e2e := lat
	e2e.Kind = KindEndToEnd
	add(e2e, "jetstream", 50_000, sum(2, 30))
	add(e2e, "runnel acks=all", 600_000, sum(9, 45))
	r.Runs = append(r.Runs, Run{Workload: big, System: "redis always", Error: "create: boom", Errors: 3})
	return r
}

func TestWorkloadIDs(t *testing.T) {
	cases := map[string]Workload{
		"produce 100B 16prod 48part keys":                    {Kind: KindProduce, Size: 100, Producers: 16, Partitions: 48, Keys: true},
		"produce 1KiB 1prod 1part no keys":                   {Kind: KindProduce, Size: 1024, Producers: 1, Partitions: 1},
		"consume 100B 12part backlog":                        {Kind: KindConsume, Size: 100, Producers: 1, Partitions: 12},
		"latency 100B 1prod 12part no keys @50%":             {Kind: KindLatency, Size: 100, Producers: 1, Partitions: 12, LoadFraction: 0.5},
		"latency 100B 1prod 12part no keys @jetstream's 50%": {Kind: KindLatency, Size: 100, Producers: 1, Partitions: 12, LoadFraction: 0.5, PacedAs: "jetstream"},
		"e2e 100B 16prod 12part keys @50%":                   {Kind: KindEndToEnd, Size: 100, Producers: 16, Partitions: 12, Keys: true, LoadFraction: 0.5},
	}
	for want, w := range cases {
		if got := w.ID(); got != want {
			t.Errorf("ID() = %q, want %q", got, want)
		}
	}
}

func TestTargets(t *testing.T) {
	got := map[string]Target{}
	for _, tg := range Targets(synthetic()) {
		got[tg.Name+" / "+tg.Workload] = tg
	}
	check := func(name, workload string, ratio float64, met bool) {
		t.Helper()
		tg, ok := got[name+" / "+workload]
		if !ok {
			t.Fatalf("target %q on %q missing; have %v", name, workload, keys(got))
		}
		if d := tg.Ratio - ratio; d > 1e-9 || d < -1e-9 || tg.Met != met {
			t.Errorf("%s on %s: ratio %.4f met %t, want %.4f %t", name, workload, tg.Ratio, tg.Met, ratio, met)
		}
	}
	base := "produce 100B 1prod 12part no keys"
	check("produce throughput vs JetStream, matching durability", base, 8, false)
	check("produce throughput vs JetStream, Runnel fsyncing (stronger durability)", base, 12, true)
	check("produce bytes/s vs bare gRPC stream ceiling", base, 0.12, false)
	check("consume throughput vs JetStream", "consume 100B 12part backlog", 12, true)
	check("produce p99 at 50 % load vs JetStream, each at 50 % of its own maximum (JetStream p99 ÷ Runnel p99)",
		"latency 100B 1prod 12part no keys @50%", 0.5, false)
	check("produce p99 at the same load as JetStream's 50 % run (JetStream p99 ÷ Runnel p99)",
		"latency 100B 1prod 12part no keys @jetstream's 50%", 2, true)
	if n := got["produce bytes/s vs bare gRPC stream ceiling / "+base].Note; !strings.Contains(n, "300 MB/s") {
		t.Errorf("the bytes/s target's note %q does not name the disk ceiling (300 MB/s) that bounds it", n)
	}
	// A disk that takes half the gRPC ceiling or more bounds nothing: no note.
	r := synthetic()
	for i := range r.Ceilings {
		if r.Ceilings[i].Name == "disk sequential write" {
			r.Ceilings[i].MBPerSec = 600
		}
	}
	for _, tg := range Targets(r) {
		if tg.Note != "" {
			t.Errorf("%s: note %q with a disk ceiling above half the gRPC one", tg.Name, tg.Note)
		}
	}
	for k := range got {
		if strings.Contains(k, "1KiB") {
			t.Errorf("targets are for 100-byte records only, got %q", k)
		}
	}
}

func keys(m map[string]Target) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestMarkdown(t *testing.T) {
	var b bytes.Buffer
	if err := Markdown(&b, synthetic(), []string{"throughput.png"}); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"| CPUs | 2 × Test CPU |", "| memory | 24.0 GiB |", "Linux 6.1", "/dev/vda (ext4)",
		"nats-server v2.9.10", "redis-server 7.0.15", "go-redis v9.23.0",
		"fsync\\|always", // table cells escape pipes
		"100-byte values, 1 producer each on its own connection, 12 partitions,",
		"| grpc bare stream (loopback) | 1000.0 |",
		"### produce 100B 1prod 12part no keys",
		"| runnel acks=all | fsync | 1,200,000 | 120.0 | 100 | 300 | 450 | 12 % | 40 % | 30 % | 0 |",
		"| jetstream | os | 100,000 | 10.0 | 20.0 | 40.0 | 60.0 | 1 % | 3 % | 2 % | 0 |",
		"- Half the bare gRPC stream ceiling (500 MB/s) is more than this machine's disk sequential write ceiling measured in the same run (300 MB/s, 30 % of gRPC)",
		"| runnel acks=all no-fsync | 8.00× *matching* | 4.00× |",
		"| runnel acks=all | 12.0× | 6.00× *matching* |",
		"| consume 100B 12part backlog |", "6,000,000",
		"| runnel acks=all | 6,000,000 | 600.0 | 36,000,000 | 6.00 | 4,500,000 / 6,000,000 / 7,250,000 | 0 |",
		"| jetstream | 500,000 | 50.0 | 3,000,000 | 6.00 | – | 0 |", // results.json from before passes
		"| runnel acks=all | fsync | 600,000 | 600,000 | 8.00 | 40.0 | 60.0 | – | – | – | 0 |",
		"| runnel acks=all | fsync | 600,000 | 600,000 | 9.00 | 45.0 | 67.5 | 18.0 | 90.0 | 135 | 0 |",
		"### e2e 100B 1prod 12part no keys @50%",
		// JetStream's own run is listed beside Runnel's run at JetStream's rate, with the ratio.
		"| jetstream | os | 50,000 | 50,000 | 1.00 | 20.0 | 30.0 | – | – | – | 0 |\n\nPeer's ack p99 ÷ Runnel's",
		"| runnel acks=all | 2.00× |",
		"3: create: boom",
		"Latency: ack minus intended send (one ack in 8 sampled).\n", // the runs' note, once per workload
		"| runnel acks=all: p99 40.00 ms at 600,000 rec/s | jetstream: p99 20.00 ms at 50,000 rec/s | 0.50× |",
		"![throughput](throughput.png)",
		"| produce throughput vs JetStream, Runnel fsyncing (stronger durability) | produce 100B 1prod 12part no keys |",
		"| 12.0× | ≥ 10× | **yes** |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// Runnel's rows come before the peers' in every table.
	i, j := strings.Index(md, "| runnel acks=all | fsync | 1,200,000"), strings.Index(md, "| jetstream | os | 100,000")
	if i < 0 || j < 0 || i > j {
		t.Errorf("Runnel's row should precede JetStream's (%d, %d)", i, j)
	}
}

func TestWriteProducesReadableCharts(t *testing.T) {
	dir := t.TempDir()
	r := synthetic()
	if err := Write(dir, r); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"throughput.png", "ratios.png", "latency.png"} {
		if !bytes.Contains(md, []byte("("+name+")")) {
			t.Errorf("report.md does not embed %s", name)
		}
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if b := img.Bounds(); b.Dx() < 500 || b.Dy() < 300 {
			t.Errorf("%s is %dx%d, too small to read", name, b.Dx(), b.Dy())
		}
	}
	// Saved results render the same report again.
	if err := r.Save(filepath.Join(dir, "results.json")); err != nil {
		t.Fatal(err)
	}
	back, err := Load(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var a, b bytes.Buffer
	Markdown(&a, r, nil)
	Markdown(&b, back, nil)
	if a.String() != b.String() {
		t.Error("report from results.json differs from the original")
	}
}

func TestEmptyResults(t *testing.T) {
	dir := t.TempDir()
	r := &Results{Matrix: "reduced"}
	if err := Write(dir, r); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	if !bytes.Contains(md, []byte("Not enough runs to evaluate the targets")) {
		t.Error("empty results should say the targets could not be evaluated")
	}
	if _, err := os.Stat(filepath.Join(dir, "throughput.png")); !os.IsNotExist(err) {
		t.Error("no chart should be drawn without runs")
	}
}

func TestNum(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.4: "1,234,567", -4500: "-4,500"} {
		if got := num(v); got != want {
			t.Errorf("num(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestAddCeilingKeepsTheHigher holds the rule the bytes/s target rests on: a ceiling measured twice is
// the higher of its measurements, whichever came first, and the report lists both.
func TestAddCeilingKeepsTheHigher(t *testing.T) {
	for _, order := range [][2]float64{{500, 1000}, {1000, 500}} {
		r := synthetic()
		r.Ceilings = nil
		r.AddCeiling("grpc bare stream (loopback)", order[0], "first note")
		r.AddCeiling("disk sequential write", 2000, "disk")
		r.AddCeiling("grpc bare stream (loopback)", order[1], "second note")
		c, ok := r.Ceiling("grpc")
		if !ok || c.MBPerSec != 1000 || c.Note != "first note" || len(c.Measured) != 2 || c.Measured[0] != order[0] || c.Measured[1] != order[1] {
			t.Fatalf("measured %v: ceiling %+v, want 1000 MB/s from both measurements in order, with the first note", order, c)
		}
		if len(r.Ceilings) != 2 {
			t.Fatalf("measured %v: %d ceilings, want 2: %+v", order, len(r.Ceilings), r.Ceilings)
		}
		// Runnel's fsync run carries 120 MB/s (synthetic): 12 % of the higher ceiling, not 24 % of the lower.
		found := false
		for _, tg := range Targets(r) {
			if tg.Name == "produce bytes/s vs bare gRPC stream ceiling" && tg.Workload == "produce 100B 1prod 12part no keys" {
				found = true
				if d := tg.Ratio - 0.12; d > 1e-9 || d < -1e-9 {
					t.Errorf("measured %v: bytes ratio %.4f, want 0.12 (against 1000 MB/s)", order, tg.Ratio)
				}
			}
		}
		if !found {
			t.Fatalf("measured %v: no bytes/s target", order)
		}
		var b bytes.Buffer
		if err := Markdown(&b, r, nil); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("| grpc bare stream (loopback) | 1000.0 | %.1f at the start, %.1f at the end | first note |", order[0], order[1])
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// TestCeilingFromOlderResults: a results.json saved before the ceilings were measured twice has no
// "measured" list. It loads with its one figure, renders with a dash and without the claim of two
// measurements, and a measurement added to it keeps the loaded figure among its measurements.
func TestCeilingFromOlderResults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.json")
	old := `{"matrix": "reduced", "ceilings": [{"name": "grpc bare stream (loopback)", "mb_per_s": 1071.5, "note": "1 MiB requests"}]}`
	if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := Markdown(&b, r, nil); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	if want := "| grpc bare stream (loopback) | 1071.5 | — | 1 MiB requests |"; !strings.Contains(md, want) {
		t.Errorf("report lacks %q", want)
	}
	if strings.Contains(md, "again when it ended") {
		t.Error("the report claims two measurements of ceilings measured once")
	}
	r.AddCeiling("grpc bare stream (loopback)", 900, "")
	if c, _ := r.Ceiling("grpc"); c.MBPerSec != 1071.5 || len(c.Measured) != 2 || c.Measured[0] != 1071.5 || c.Measured[1] != 900 {
		t.Errorf("after a lower measurement: %+v, want 1071.5 MB/s measured as [1071.5 900]", c)
	}
	// A round trip keeps the measurements.
	if err := r.Save(path); err != nil {
		t.Fatal(err)
	}
	back, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := back.Ceiling("grpc"); len(c.Measured) != 2 || c.Measured[1] != 900 {
		t.Errorf("after Save and Load: %+v", c)
	}
}

// TestRounds follows targets over three rounds: the verdict is the median of the rounds that evaluated
// a target (not the mean, not the last round), a round without the runs leaves a gap, and the summary
// lists every round's ratio.
func TestRounds(t *testing.T) {
	r1, r2, r3 := synthetic(), synthetic(), synthetic()
	setRunnel := func(r *Results, id string, f func(*Run)) {
		t.Helper()
		for i := range r.Runs {
			if r.Runs[i].System == "runnel acks=all" && r.Runs[i].Workload.ID() == id {
				f(&r.Runs[i])
				return
			}
		}
		t.Fatalf("no runnel acks=all run of %s", id)
	}
	const cons, own, prod, same = "consume 100B 12part backlog", "latency 100B 1prod 12part no keys @50%",
		"produce 100B 1prod 12part no keys", "latency 100B 1prod 12part no keys @jetstream's 50%"
	// Consume: 12× in round 1, 8× in round 2, no Runnel run in round 3. The lower median, 8×, misses: a
	// tie between the rounds is no majority (the mean of the middle two, 10×, would meet it).
	setRunnel(r2, cons, func(r *Run) { r.RecordsPerSec = 4_000_000 })
	r3.Runs = slices.DeleteFunc(r3.Runs, func(r Run) bool { return r.System == "runnel acks=all" && r.Workload.ID() == cons })
	// Own-half p99 (JetStream's is 20 ms): 0.5×, 4× and 0.8×. The median, 0.8×, misses; the mean
	// (1.77×) or the best round (4×) would meet it.
	setRunnel(r2, own, func(r *Run) { r.Latency.P99Ms = 5 })
	setRunnel(r3, own, func(r *Run) { r.Latency.P99Ms = 25 })
	// Produce (JetStream 100,000/s): 11×, 9× and 9.5×. The first round meets it, the median misses.
	setRunnel(r1, prod, func(r *Run) { r.RecordsPerSec = 1_100_000 })
	setRunnel(r2, prod, func(r *Run) { r.RecordsPerSec = 900_000 })
	setRunnel(r3, prod, func(r *Run) { r.RecordsPerSec = 950_000 })
	// p99 at JetStream's rate (JetStream's is 20 ms): 0.5× in round 1, 2× and 2.5× after: the first
	// round misses, the median meets it.
	setRunnel(r1, same, func(r *Run) { r.Latency.P99Ms = 40 })
	setRunnel(r3, same, func(r *Run) { r.Latency.P99Ms = 8 })
	r3.Interrupted = true
	rounds := []*Results{r1, r2, r3}

	rts := Rounds(rounds)
	got := map[string]RoundTarget{}
	for _, rt := range rts {
		got[rt.Name+" / "+rt.Workload+" / "+rt.System] = rt
	}
	if n := len(Targets(synthetic())); len(rts) != n || len(got) != n {
		t.Errorf("%d round targets (%d distinct), want one per target: %d", len(rts), len(got), n)
	}
	check := func(got map[string]RoundTarget, key string, ratios []float64, med float64, metIn, evaluated int, met bool) {
		t.Helper()
		rt, ok := got[key]
		if !ok {
			t.Fatalf("round target %q missing", key)
		}
		if len(rt.Ratios) != len(ratios) {
			t.Fatalf("%s: %d ratios, want %d", key, len(rt.Ratios), len(ratios))
		}
		for i, want := range ratios {
			if g := rt.Ratios[i]; (math.IsNaN(want) != math.IsNaN(g)) || (!math.IsNaN(want) && math.Abs(g-want) > 1e-9) {
				t.Errorf("%s: round %d ratio %v, want %v", key, i+1, g, want)
			}
		}
		if math.Abs(rt.Median-med) > 1e-9 || rt.MetIn != metIn || rt.Evaluated != evaluated || rt.Met != met {
			t.Errorf("%s: median %v met in %d of %d, met %t; want %v, %d of %d, %t", key, rt.Median, rt.MetIn, rt.Evaluated, rt.Met, med, metIn, evaluated, met)
		}
	}
	nan := math.NaN()
	const consName = "consume throughput vs JetStream / " + cons + " / runnel acks=all"
	check(got, consName, []float64{12, 8, nan}, 8, 1, 2, false)
	check(got, "produce p99 at 50 % load vs JetStream, each at 50 % of its own maximum (JetStream p99 ÷ Runnel p99) / "+own+" / runnel acks=all",
		[]float64{0.5, 4, 0.8}, 0.8, 1, 3, false)
	check(got, "produce throughput vs JetStream, Runnel fsyncing (stronger durability) / "+prod+" / runnel acks=all",
		[]float64{11, 9, 9.5}, 9.5, 1, 3, false)
	check(got, "produce p99 at the same load as JetStream's 50 % run (JetStream p99 ÷ Runnel p99) / "+same+" / runnel acks=all",
		[]float64{0.5, 2, 2.5}, 2, 2, 3, true)

	// A target only one round of three measured, and first in round 2, is listed in its place but not
	// met, however well that round did.
	q1, q2, q3 := synthetic(), synthetic(), synthetic()
	for _, r := range []*Results{q1, q3} {
		r.Runs = slices.DeleteFunc(r.Runs, func(r Run) bool { return r.System == "runnel acks=all" && r.Workload.ID() == cons })
	}
	few := map[string]RoundTarget{}
	for _, rt := range Rounds([]*Results{q1, q2, q3}) {
		few[rt.Name+" / "+rt.Workload+" / "+rt.System] = rt
	}
	check(few, consName, []float64{nan, 12, nan}, 12, 1, 1, false)

	var b bytes.Buffer
	links := []string{"round-1/report.md", "round-2/report.md", "round-3/report.md"}
	if err := RoundsMarkdown(&b, rounds, links); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"# Runnel side by side with its peers: 3 rounds",
		"[report](round-2/report.md)",
		"| consume throughput vs JetStream | " + cons + " | runnel acks=all | 12.0× | 8.00× | – | 8.00× | ≥ 10× | no | 1 of 2 |",
		"| " + same + " | runnel acks=all | 0.50× | 2.00× | 2.50× | 2.00× | ≥ 1× (no worse) | **yes** | 2 of 3 |",
		"| " + own + " | runnel acks=all | 0.50× | 4.00× | 0.80× | 0.80× | ≥ 1× (no worse) | no | 1 of 3 |",
		"| 1 | 2026-11-29 10:00 UTC | 9m0s | 1000 | 300 | 400 | 0.1 0.2 0.3 / – | yes |",
		"| 3 | 2026-11-29 10:00 UTC | 9m0s | 1000 | 300 | 400 | 0.1 0.2 0.3 / – | **no: interrupted** |",
		"produce bytes/s vs bare gRPC stream ceiling: in round(s) 1, 2, 3 a bound of the machine applied",
		"2. `go run ./bench/peers`",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("summary lacks %q:\n%s", want, md)
		}
	}
	b.Reset()
	if err := RoundsMarkdown(&b, []*Results{q1, q2, q3}, links); err != nil {
		t.Fatal(err)
	}
	if want := "| ≥ 10× | no: measured in 1 of 3 rounds | 1 of 1 |"; !strings.Contains(b.String(), want) {
		t.Errorf("summary of a target one round measured lacks %q:\n%s", want, b.String())
	}
	if err := RoundsMarkdown(&b, rounds, links[:2]); err == nil {
		t.Error("RoundsMarkdown took 3 rounds with 2 report paths")
	}
	if err := RoundsMarkdown(&b, nil, nil); err == nil {
		t.Error("RoundsMarkdown took no rounds")
	}
}
