package report

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/runnel-io/runnel/bench/latency"
)

// Write renders report.md and the charts into dir.
func Write(dir string, r *Results) error {
	charts, err := WriteCharts(dir, r)
	if err != nil {
		return fmt.Errorf("charts: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, "report.md"))
	if err != nil {
		return err
	}
	if err := Markdown(f, r, charts); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Markdown writes the report; charts are the PNG file names to embed (relative to the report).
func Markdown(w io.Writer, r *Results, charts []string) error {
	b := &strings.Builder{}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("# Runnel side by side with its peers\n\n")
	p("Measured %s (%s, %s matrix). Every system ran on this machine in the same run, one server at a time, "+
		"driven from one harness process by its own Go client; the ceilings were measured in the same run. "+
		"Compare the ratios, not the absolute figures, across machines. How to read this: docs/benchmarks.md.\n\n",
		r.Started.Format("2006-01-02 15:04 MST"), r.Finished.Sub(r.Started).Round(time.Second), r.Matrix)

	p("## Machine\n\n| | |\n|---|---|\n")
	m := r.Machine
	p("| CPUs | %d × %s |\n| memory | %.1f GiB |\n| disk (data directory) | %s |\n| kernel | %s |\n| Go | %s |\n| load average (1, 5, 15 min) at start / end | %s / %s |\n\n",
		m.CPUs, orDash(m.CPUModel), m.MemoryGB, orDash(m.Disk), orDash(m.Kernel), orDash(m.GoVer), orDash(m.LoadAvg), orDash(m.LoadAvgEnd))

	p("## Systems and settings\n\n| system | version | client | an acknowledgement means | durability class | settings |\n|---|---|---|---|---|---|\n")
	for _, name := range r.SystemOrder() {
		s, _ := r.System(name)
		p("| %s | %s | %s | %s | %s | %s |\n", s.Name, esc(s.Version), esc(s.Client), esc(s.DurabilityNote), s.Durability, esc(s.Settings))
	}
	p("\nDurability classes: **fsync** = acknowledged after fsync (survives a machine crash); **os** = acknowledged once " +
		"written to the OS (survives a process crash; the newest writes can be lost in a machine crash). Ratios marked " +
		"*matching* compare systems of the same class.\n\n")

	p("## Ceilings (same run)\n\n")
	if slices.ContainsFunc(r.Ceilings, func(c Ceiling) bool { return len(c.Measured) > 1 }) {
		p("Each ceiling was measured when the run started and again when it ended; the ratios use the higher.\n\n")
	}
	p("| ceiling | MB/s | measured | how |\n|---|---:|---|---|\n")
	for _, c := range r.Ceilings {
		p("| %s | %.1f | %s | %s |\n", c.Name, c.MBPerSec, measured(c.Measured), esc(c.Note))
	}
	p("\n")

	p("## Targets (issue 9)\n\n")
	targets := Targets(r)
	if len(targets) == 0 {
		p("Not enough runs to evaluate the targets.\n\n")
	} else {
		p("| target | workload | Runnel | peer / ceiling | ratio | goal | met |\n|---|---|---|---|---:|---|---|\n")
		for _, t := range targets {
			met := "no"
			if t.Met {
				met = "**yes**"
			}
			p("| %s | %s | %s | %s | %s | %s | %s |\n", t.Name, t.Workload, t.Runnel, t.Peer, fmtRatio(t.Ratio), t.Goal, met)
		}
		p("\n")
		notes := map[string]bool{}
		for _, t := range targets {
			if t.Note != "" && !notes[t.Note] {
				notes[t.Note] = true
				p("- %s\n", t.Note)
			}
		}
		if len(notes) > 0 {
			p("\n")
		}
	}

	if len(charts) > 0 {
		p("## Charts\n\n")
		for _, c := range charts {
			p("![%s](%s)\n\n", strings.TrimSuffix(c, ".png"), c)
		}
	}

	p("## Results per workload\n\n")
	for _, w := range r.Workloads() {
		id := w.ID()
		p("### %s\n\n", id)
		p("%s\n\n", describe(w))
		runs := r.runsOf(id)
		switch w.Kind {
		case KindLatency, KindEndToEnd:
			p("| system | durability | paced at (rec/s) | achieved (rec/s) | ack p50 ms | ack p99 ms | ack p99.9 ms | e2e p50 ms | e2e p99 ms | e2e p99.9 ms | errors |\n")
			p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
			for _, run := range runs {
				p("| %s | %s | %s | %s | %s | %s |\n", run.System, r.durability(run.System), num(run.TargetRate), num(run.RecordsPerSec),
					lat3(run.Latency), lat3e(run.EndToEnd, run))
			}
		case KindConsume:
			p("| system | records/s (median pass) | MB/s | records | seconds | every pass, records/s | errors |\n|---|---:|---:|---:|---:|---|---|\n")
			for _, run := range runs {
				p("| %s | %s | %.1f | %s | %.2f | %s | %s |\n", run.System, num(run.RecordsPerSec), run.MBPerSec, num(float64(run.Records)), run.Seconds, passesCell(run.PassesPerSec), errCell(run))
			}
		default:
			p("| system | durability | records/s | MB/s | p50 ms | p99 ms | p99.9 ms | share of gRPC ceiling | share of disk write ceiling | share of disk fsync ceiling | errors |\n")
			p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
			share := func(prefix string, mbps float64) string {
				if c, ok := r.Ceiling(prefix); ok && c.MBPerSec > 0 {
					return fmt.Sprintf("%.0f %%", 100*mbps/c.MBPerSec)
				}
				return "–"
			}
			for _, run := range runs {
				p("| %s | %s | %s | %.1f | %s | %s | %s | %s | %s |\n", run.System, r.durability(run.System), num(run.RecordsPerSec), run.MBPerSec,
					lat3(run.Latency), share("grpc", run.MBPerSec), share("disk sequential write", run.MBPerSec), share("disk write+fdatasync", run.MBPerSec), errCell(run))
			}
		}
		if rt := r.ratioTable(id, w.Kind); rt != "" {
			p("\n%s", rt)
		}
		if w.Kind != KindConsume {
			if what := latencyNotes(runs); what != "" {
				p("\nLatency: %s.\n", what)
			}
		}
		p("\n")
	}
	if len(r.Notes) > 0 {
		p("## Notes\n\n")
		for _, n := range r.Notes {
			p("- %s\n", n)
		}
		p("\n")
	}
	p("Command: `%s`\n", r.Command)
	_, err := io.WriteString(w, b.String())
	return err
}

// passesCell lists the records/s of each pass of a consume run, in order ("–" for results without them).
func passesCell(ps []float64) string {
	if len(ps) == 0 {
		return "–"
	}
	cells := make([]string, len(ps))
	for i, v := range ps {
		cells[i] = num(v)
	}
	return strings.Join(cells, " / ")
}

func describe(w Workload) string {
	keys := "no keys (sticky partitioning)"
	if w.Keys {
		keys = "keys = origin airport of the flight data (murmur2 partitioning, real hot-key skew)"
	}
	switch w.Kind {
	case KindConsume:
		return fmt.Sprintf("A backlog of %d-byte records in %d partitions is read from the start several times, one consumer at a time, each a new one; records/s from its first call to its last record, of the median pass. The first pass reads what the server has not cached (Runnel: the backlog beyond its page-cache window comes from the disk); later ones what the first left in the page cache.", w.Size, w.Partitions)
	case KindLatency, KindEndToEnd:
		pace := fmt.Sprintf("paced at %.0f %% of each system's own maximum measured above", 100*w.LoadFraction)
		if w.PacedAs != "" {
			pace = fmt.Sprintf("every system paced at the same rate, %.0f %% of %s's maximum (the rate of %s's own run)", 100*w.LoadFraction, w.PacedAs, w.PacedAs)
		}
		what := "No consumer runs: ack = the producer's acknowledgement."
		if w.Kind == KindEndToEnd {
			what = "A consumer reads along (its load shares the machine): ack = the producer's acknowledgement, e2e = the consumer received the record."
		}
		return fmt.Sprintf("%d-byte values, %s, %s, %s; %s. "+
			"Latencies are measured from each record's intended send time on a fixed schedule (coordinated omission corrected), or from a clock reading just before its send for a record sent early (the latency note below says how early and how acknowledgements are sampled). %s",
			w.Size, count(w.Producers, "producer"), count(w.Partitions, "partition"), keys, pace, what)
	}
	return fmt.Sprintf("%d-byte values, %s each on its own connection, %s, %s; as fast as each system takes them. "+
		"Latency: send to acknowledgement from the actual send; saturated, so it is mostly time queued in the client.", w.Size, count(w.Producers, "producer"), count(w.Partitions, "partition"), keys)
}

// count writes n nouns: "1 producer", "16 producers".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// latencyNotes joins the distinct LatencyWhat notes of runs (the harness gives every system's run of a
// workload the same one), in order, with "; ".
func latencyNotes(runs []Run) string {
	var notes []string
	for _, run := range runs {
		if run.LatencyWhat != "" && !slices.Contains(notes, run.LatencyWhat) {
			notes = append(notes, run.LatencyWhat)
		}
	}
	return strings.Join(notes, "; ")
}

// runsOf returns the runs of workload id in SystemOrder. A workload paced as another system's run
// also lists that system's own run of the same shape, for comparison.
func (r *Results) runsOf(id string) []Run {
	var out []Run
	var paced Workload
	for _, name := range r.SystemOrder() {
		if run, ok := r.Find(id, name); ok {
			out = append(out, run)
			paced = run.Workload
		}
	}
	if paced.PacedAs != "" {
		own := paced
		own.PacedAs = ""
		if run, ok := r.Find(own.ID(), paced.PacedAs); ok {
			out = append(out, run)
		}
	}
	return out
}

func (r *Results) durability(system string) string {
	if s, ok := r.System(system); ok {
		return s.Durability
	}
	return "?"
}

// ratioTable returns, for throughput workloads, Runnel's records/s divided by each peer's, and for
// latency workloads each peer's ack p99 divided by Runnel's (above 1: Runnel is better).
func (r *Results) ratioTable(id, kind string) string {
	var runnel, peers []Run
	for _, run := range r.runsOf(id) {
		if run.Error != "" && run.RecordsPerSec == 0 {
			continue
		}
		if s, ok := r.System(run.System); ok && s.IsRunnel() {
			runnel = append(runnel, run)
		} else {
			peers = append(peers, run)
		}
	}
	if len(runnel) == 0 || len(peers) == 0 {
		return ""
	}
	b := &strings.Builder{}
	if kind == KindLatency || kind == KindEndToEnd {
		fmt.Fprintf(b, "Peer's ack p99 ÷ Runnel's (above 1×: Runnel's p99 is lower; *matching* = same durability class):\n\n")
	} else {
		fmt.Fprintf(b, "Runnel's records/s ÷ the peer's (*matching* = same durability class):\n\n")
	}
	fmt.Fprintf(b, "| Runnel ÷ |")
	for _, pr := range peers {
		fmt.Fprintf(b, " %s |", pr.System)
	}
	fmt.Fprintf(b, "\n|---|")
	for range peers {
		fmt.Fprintf(b, "---:|")
	}
	fmt.Fprintf(b, "\n")
	for _, rr := range runnel {
		fmt.Fprintf(b, "| %s |", rr.System)
		for _, pr := range peers {
			var ratio float64
			if kind == KindLatency || kind == KindEndToEnd {
				if rr.Latency != nil && pr.Latency != nil && rr.Latency.P99Ms > 0 {
					ratio = pr.Latency.P99Ms / rr.Latency.P99Ms
				}
			} else if pr.RecordsPerSec > 0 {
				ratio = rr.RecordsPerSec / pr.RecordsPerSec
			}
			cell := fmtRatio(ratio)
			if r.durability(rr.System) == r.durability(pr.System) {
				cell += " *matching*"
			}
			fmt.Fprintf(b, " %s |", cell)
		}
		fmt.Fprintf(b, "\n")
	}
	return b.String()
}

// Target is one of issue 9's targets evaluated on one workload.
type Target struct {
	Name, Workload, Runnel, Peer, Goal string
	// System is the Runnel configuration the target compares (e.g. "runnel acks=all no-fsync"), so that
	// the same target can be followed across runs (Rounds).
	System string
	Ratio  float64
	// Min is the ratio the goal asks for: Met is Ratio >= Min.
	Min float64
	Met bool
	// Note says what bounds the target on this machine, when the same run measured it (e.g. a bytes/s
	// goal above what the disk takes); empty otherwise.
	Note string
}

// Targets evaluates issue 9's targets on every 100-byte workload that has the runs they need:
// produce throughput at least 10× JetStream's with matching durability (and, for reference, Runnel
// with fsync against JetStream without), consume throughput at least 10× JetStream's, produce p99
// at 50 % load no worse than JetStream's, and produce bytes/s at least 50 % of the bare gRPC stream.
func Targets(r *Results) []Target {
	var out []Target
	js := func(id string) (Run, bool) { return r.Find(id, "jetstream") }
	// Runnel's configuration with JetStream's durability, and its default (fsync) one.
	matching := []string{"runnel acks=all no-fsync", "runnel acks=1"}
	grpc, hasGRPC := r.Ceiling("grpc")
	// Half the transport's ceiling can be more than the disk takes: a store that keeps the bytes cannot
	// write faster than the disk's sequential ceiling (through the page cache, where every system here
	// writes), whatever its transport does.
	var bytesNote string
	if disk, ok := r.Ceiling("disk sequential write"); ok && hasGRPC && disk.MBPerSec > 0 && disk.MBPerSec < grpc.MBPerSec/2 {
		bytesNote = fmt.Sprintf("Half the bare gRPC stream ceiling (%.0f MB/s) is more than this machine's disk sequential write ceiling "+
			"measured in the same run (%.0f MB/s, %.0f %% of gRPC): no system that stores what it acknowledges can meet the bytes/s goal here; "+
			"the produce tables give each run's share of the disk ceilings too.", grpc.MBPerSec/2, disk.MBPerSec, 100*disk.MBPerSec/grpc.MBPerSec)
	}
	for _, w := range r.Workloads() {
		if w.Size != 100 {
			continue
		}
		id := w.ID()
		peer, hasJS := js(id)
		ok := func(run Run) bool { return run.Error == "" || run.RecordsPerSec > 0 }
		switch w.Kind {
		case KindProduce:
			if hasJS && ok(peer) && peer.RecordsPerSec > 0 {
				for _, name := range matching {
					if rr, found := r.Find(id, name); found && ok(rr) {
						ratio := rr.RecordsPerSec / peer.RecordsPerSec
						out = append(out, Target{Name: "produce throughput vs JetStream, matching durability", Workload: id,
							Runnel: fmt.Sprintf("%s: %s rec/s", name, num(rr.RecordsPerSec)), Peer: fmt.Sprintf("jetstream: %s rec/s", num(peer.RecordsPerSec)),
							System: name, Goal: "≥ 10×", Ratio: ratio, Min: 10, Met: ratio >= 10})
						break
					}
				}
				if rr, found := r.Find(id, "runnel acks=all"); found && ok(rr) {
					ratio := rr.RecordsPerSec / peer.RecordsPerSec
					out = append(out, Target{Name: "produce throughput vs JetStream, Runnel fsyncing (stronger durability)", Workload: id,
						Runnel: fmt.Sprintf("runnel acks=all: %s rec/s", num(rr.RecordsPerSec)), Peer: fmt.Sprintf("jetstream: %s rec/s", num(peer.RecordsPerSec)),
						System: "runnel acks=all", Goal: "≥ 10×", Ratio: ratio, Min: 10, Met: ratio >= 10})
				}
			}
			if hasGRPC && grpc.MBPerSec > 0 {
				if rr, found := r.Find(id, "runnel acks=all"); found && ok(rr) {
					ratio := rr.MBPerSec / grpc.MBPerSec
					out = append(out, Target{Name: "produce bytes/s vs bare gRPC stream ceiling", Workload: id,
						Runnel: fmt.Sprintf("runnel acks=all: %.1f MB/s", rr.MBPerSec), Peer: fmt.Sprintf("%s: %.1f MB/s", grpc.Name, grpc.MBPerSec),
						System: "runnel acks=all", Goal: "≥ 0.5×", Ratio: ratio, Min: 0.5, Met: ratio >= 0.5, Note: bytesNote})
				}
			}
		case KindConsume:
			if rr, found := r.Find(id, "runnel acks=all"); found && hasJS && ok(rr) && peer.RecordsPerSec > 0 {
				ratio := rr.RecordsPerSec / peer.RecordsPerSec
				out = append(out, Target{Name: "consume throughput vs JetStream", Workload: id,
					Runnel: fmt.Sprintf("%s rec/s", num(rr.RecordsPerSec)), Peer: fmt.Sprintf("jetstream: %s rec/s", num(peer.RecordsPerSec)),
					System: "runnel acks=all", Goal: "≥ 10×", Ratio: ratio, Min: 10, Met: ratio >= 10})
			}
		case KindLatency:
			if w.PacedAs == "jetstream" { // Runnel at JetStream's rate: compare with JetStream's own run
				own := w
				own.PacedAs = ""
				peer, hasJS = js(own.ID())
			}
			if !hasJS || peer.Latency == nil || peer.Latency.Count == 0 {
				continue
			}
			for _, name := range []string{"runnel acks=all", "runnel acks=all no-fsync"} {
				rr, found := r.Find(id, name)
				if !found || rr.Latency == nil || rr.Latency.Count == 0 || rr.Latency.P99Ms <= 0 {
					continue
				}
				// Ratio: JetStream's p99 over Runnel's, so at least 1 means "no worse".
				ratio := peer.Latency.P99Ms / rr.Latency.P99Ms
				tname := "produce p99 at 50 % load vs JetStream, each at 50 % of its own maximum (JetStream p99 ÷ Runnel p99)"
				if w.PacedAs != "" {
					tname = "produce p99 at the same load as JetStream's 50 % run (JetStream p99 ÷ Runnel p99)"
				}
				out = append(out, Target{Name: tname, Workload: id,
					Runnel: fmt.Sprintf("%s: p99 %.2f ms at %s rec/s", name, rr.Latency.P99Ms, num(rr.TargetRate)),
					Peer:   fmt.Sprintf("jetstream: p99 %.2f ms at %s rec/s", peer.Latency.P99Ms, num(peer.TargetRate)),
					System: name, Goal: "≥ 1× (no worse)", Ratio: ratio, Min: 1, Met: ratio >= 1})
			}
		}
	}
	return out
}

func lat3(s *latency.Summary) string {
	if s == nil || s.Count == 0 {
		return "– | – | –"
	}
	return fmt.Sprintf("%s | %s | %s", ms(s.P50Ms), ms(s.P99Ms), ms(s.P999Ms))
}

func lat3e(s *latency.Summary, run Run) string {
	return lat3(s) + " | " + errCell(run)
}

func errCell(run Run) string {
	switch {
	case run.Error != "":
		return fmt.Sprintf("%d: %s", run.Errors, esc(truncate(run.Error, 120)))
	case run.Errors > 0:
		return fmt.Sprint(run.Errors)
	}
	return "0"
}

func ms(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// num formats a count with thousands separators.
func num(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

func fmtRatio(v float64) string {
	switch {
	case v <= 0 || math.IsNaN(v) || math.IsInf(v, 0):
		return "–"
	case v >= 10:
		return fmt.Sprintf("%.1f×", v)
	}
	return fmt.Sprintf("%.2f×", v)
}

func esc(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ") }

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return esc(s)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// measured lists a ceiling's measurements (MB/s) as "at the start, at the end"; "—" for none (results
// saved before the harness measured twice).
func measured(ms []float64) string {
	if len(ms) == 0 {
		return "—"
	}
	when := func(i int) string {
		switch {
		case i == 0:
			return "at the start"
		case i == len(ms)-1:
			return "at the end"
		}
		return fmt.Sprintf("#%d", i+1)
	}
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("%.1f %s", m, when(i))
	}
	return strings.Join(parts, ", ")
}
