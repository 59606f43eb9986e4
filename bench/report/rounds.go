package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// RoundTarget is one of issue 9's targets followed over several complete runs of the harness (rounds)
// made one after another on the same machine: the same target, workload and Runnel configuration in
// each round that evaluated it.
type RoundTarget struct {
	// Name, Workload, System and Goal are as in Target.
	Name, Workload, System, Goal string
	// Min is the ratio the goal asks for (Target.Min).
	Min float64
	// Ratios holds each round's ratio, in round order, as Target.Ratio: Runnel's figure over the
	// peer's or the ceiling's (for a latency, the peer's p99 over Runnel's), so higher is better. NaN
	// where a round did not evaluate the target (a failed, filtered or interrupted run).
	Ratios []float64
	// Median is the lower median of the rounds that evaluated the target: the middle one for an odd
	// count, the lower of the middle two for an even one, so that Median >= Min means a strict majority
	// of those rounds met the goal, never a tie.
	Median float64
	// MetIn is how many rounds met the goal, of Evaluated that evaluated it.
	MetIn, Evaluated int
	// Met is whether the goal holds over the rounds: a strict majority of all rounds evaluated the target
	// and Median >= Min. A single run's ratio follows the moment of a shared machine (between two
	// adjacent runs of identical code a peer's produce figure moved 46 %, docs/benchmarks.md), so
	// neither one round, nor a tie between rounds, nor a target few rounds measured decides it.
	Met bool
}

// Rounds follows every target of Targets over rounds, in the order targets first appear. A target
// evaluated by no round is not listed.
func Rounds(rounds []*Results) []RoundTarget {
	var out []RoundTarget
	index := map[string]int{}
	for k, r := range rounds {
		for _, t := range Targets(r) {
			key := t.Name + "\x00" + t.Workload + "\x00" + t.System
			i, ok := index[key]
			if !ok {
				i = len(out)
				index[key] = i
				ratios := make([]float64, len(rounds))
				for j := range ratios {
					ratios[j] = math.NaN()
				}
				out = append(out, RoundTarget{Name: t.Name, Workload: t.Workload, System: t.System, Goal: t.Goal, Min: t.Min, Ratios: ratios})
			}
			out[i].Ratios[k] = t.Ratio
		}
	}
	for i := range out {
		rt := &out[i]
		var have []float64
		for _, v := range rt.Ratios {
			if !math.IsNaN(v) {
				have = append(have, v)
				if v >= rt.Min {
					rt.MetIn++
				}
			}
		}
		rt.Evaluated = len(have)
		rt.Median = lowerMedian(have)
		rt.Met = rt.Evaluated*2 > len(rounds) && rt.Median >= rt.Min
	}
	return out
}

// lowerMedian returns the ((n+1)/2)-th smallest of vs (which it sorts): the median for an odd count, the
// lower of the middle two for an even one; NaN for none.
func lowerMedian(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	slices.Sort(vs)
	return vs[(len(vs)-1)/2]
}

// RoundsMarkdown writes the summary of rounds: when each ran and what it measured as ceilings, then
// every target's ratio per round with the median and the verdict on it. reports[k] is the path of round
// k's own report.md relative to the summary, for the links; it must be as long as rounds.
func RoundsMarkdown(w io.Writer, rounds []*Results, reports []string) error {
	if len(reports) != len(rounds) {
		return fmt.Errorf("rounds summary: %d rounds but %d report paths", len(rounds), len(reports))
	}
	if len(rounds) == 0 {
		return fmt.Errorf("rounds summary: no rounds")
	}
	b := &strings.Builder{}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("# Runnel side by side with its peers: %d rounds\n\n", len(rounds))
	p("Each round is a complete run of the harness, one after another on this machine, with its own report (linked below), " +
		"which gives the records/s and milliseconds behind each ratio here. A target is met when most of the rounds that " +
		"measured it met it, and when most rounds measured it: its lower median (the middle round, or the lower of the middle " +
		"two) meets the goal. So no single moment of a shared machine decides it. How to read this: docs/benchmarks.md.\n\n")

	p("## Rounds\n\n| round | started | took | gRPC ceiling MB/s | disk sequential MB/s | disk with fdatasync MB/s | load average at start / end | complete | report |\n")
	p("|---:|---|---|---:|---:|---:|---|---|---|\n")
	ceil := func(r *Results, prefix string) string {
		if c, ok := r.Ceiling(prefix); ok {
			return fmt.Sprintf("%.0f", c.MBPerSec)
		}
		return "–"
	}
	for k, r := range rounds {
		complete := "yes"
		if r.Interrupted {
			complete = "**no: interrupted**"
		}
		p("| %d | %s | %s | %s | %s | %s | %s / %s | %s | [report](%s) |\n", k+1, r.Started.Format("2006-01-02 15:04 MST"),
			r.Finished.Sub(r.Started).Round(time.Second), ceil(r, "grpc"), ceil(r, "disk sequential write"), ceil(r, "disk write+fdatasync"),
			orDash(r.Machine.LoadAvg), orDash(r.Machine.LoadAvgEnd), complete, reports[k])
	}
	p("\nA ceiling is the higher of its measurements at the start and the end of its round.\n\n")

	p("## Targets (issue 9) over the rounds\n\n")
	rts := Rounds(rounds)
	if len(rts) == 0 {
		p("Not enough runs to evaluate the targets.\n\n")
	} else {
		p("| target | workload | Runnel |")
		for k := range rounds {
			p(" round %d |", k+1)
		}
		p(" lower median | goal | met | rounds that met it |\n|---|---|---|")
		for range rounds {
			p("---:|")
		}
		p("---:|---|---|---|\n")
		for _, rt := range rts {
			met := "no"
			switch {
			case rt.Met:
				met = "**yes**"
			case rt.Evaluated*2 <= len(rounds):
				met = fmt.Sprintf("no: measured in %d of %d rounds", rt.Evaluated, len(rounds))
			}
			p("| %s | %s | %s |", rt.Name, rt.Workload, rt.System)
			for _, v := range rt.Ratios {
				p(" %s |", fmtRatio(v))
			}
			p(" %s | %s | %s | %d of %d |\n", fmtRatio(rt.Median), rt.Goal, met, rt.MetIn, rt.Evaluated)
		}
		p("\n")
	}
	// A note a round's targets carry (e.g. the disk's ceiling below half the gRPC one) says in how many
	// rounds it held.
	var notes []string
	held := map[string][]int{}
	for k, r := range rounds {
		seen := map[string]bool{}
		for _, t := range Targets(r) {
			if t.Note != "" && !seen[t.Note] {
				seen[t.Note] = true
				key := t.Name
				if _, ok := held[key]; !ok {
					notes = append(notes, key)
				}
				held[key] = append(held[key], k+1)
			}
		}
	}
	for _, name := range notes {
		p("- %s: in round(s) %s a bound of the machine applied (that round's report says which).\n", name, joinInts(held[name]))
	}
	if len(notes) > 0 {
		p("\n")
	}
	p("Commands:\n\n")
	for k, r := range rounds {
		p("%d. `%s`\n", k+1, r.Command)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func joinInts(vs []int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}
