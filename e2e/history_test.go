package e2e

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// A history is what the clients of a fault-injection run saw, in the order they saw it, the way Jepsen
// records one: every operation's invocation and completion with the client's view of the outcome.
//
// Operations (event.F):
//   - "send": a producer's write of one unique value. invoke (value, partition) then ok (offset),
//     fail (definitely not written) or info (unknown: a timeout or an error after which the record
//     may or may not be in the log).
//   - "poll": one record a group consumer received (partition, offset, value), type ok.
//   - "commit": a group consumer's offset commit of one partition (offset = next to read), ok or fail.
//   - "assign", "revoke", "lost": a group consumer's partitions changed (a rebalance), type ok.
//   - "read": one record a final reader read after the run (partition, offset, value), type ok.
//
// The transactional workload (txnwork_test.go) adds, on its output topic:
//   - "txn": a copier's transaction (Txn its name, Offset its number of records): invoke when it
//     began, then ok (committed), fail (aborted: AbortTransaction succeeded) or info (unknown: the
//     abort failed, the copier was fenced or killed);
//   - "cread": one record a read_committed reader read (the live readers "r1", "r2" during the run,
//     "final-rc" after it), with the transaction named in its header (Txn);
//   - "uread": one record the read_uncommitted final reader ("final-ru") read, with its Txn;
//   - "group-offset": the copiers' group's committed offset of an input partition at the end;
//   - "kill", "exit": a copier killed by the workload, a copier process that ended (Err: its status).
//
// Every event has an index (its position in the history) and the time since the run started.

// event is one entry of a history.
type event struct {
	Index     int
	Time      time.Duration
	Process   string // "p3" producer 3, "g1" group member 1, "final" reader ...
	Type      string // "invoke", "ok", "fail", "info"
	F         string // "send", "poll", "commit", "assign", "revoke", "lost", "read"
	Value     string
	Partition int32
	Offset    int64
	Parts     []int32 // assign, revoke, lost
	Txn       string  // txn, cread, uread: the transaction's name
	Err       string
}

func (e event) String() string {
	s := fmt.Sprintf("%6d %9s %-6s %-6s %-6s", e.Index, e.Time.Truncate(time.Millisecond), e.Process, e.Type, e.F)
	switch e.F {
	case "send":
		s += fmt.Sprintf(" %s p%d", e.Value, e.Partition)
		if e.Type == "ok" {
			s += fmt.Sprintf("@%d", e.Offset)
		}
	case "poll", "read":
		s += fmt.Sprintf(" %s p%d@%d", e.Value, e.Partition, e.Offset)
	case "commit", "group-offset":
		s += fmt.Sprintf(" p%d=%d", e.Partition, e.Offset)
	case "txn":
		s += fmt.Sprintf(" %s n=%d", e.Txn, e.Offset)
	case "cread", "uread":
		s += fmt.Sprintf(" %s p%d@%d txn=%s", e.Value, e.Partition, e.Offset, e.Txn)
	case "kill", "exit", "caught-up":
	default:
		s += fmt.Sprintf(" %v", e.Parts)
	}
	if e.Err != "" {
		s += " err=" + e.Err
	}
	return s
}

// history is a concurrent-safe, append-only list of events.
type history struct {
	mu     sync.Mutex
	start  time.Time
	events []event
}

func newHistory() *history { return &history{start: time.Now()} }

// add appends e (Index and Time are set here) and returns its index.
func (h *history) add(e event) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	e.Index = len(h.events)
	e.Time = time.Since(h.start)
	h.events = append(h.events, e)
	return e.Index
}

// snapshot returns a copy of the events so far.
func (h *history) snapshot() []event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

// anomaly is one violation the checker found, with the smallest excerpt of the history showing it.
type anomaly struct {
	Kind    string // "lost", "duplicate", "reorder", "divergent-read", "offset-mismatch", "skip", "backwards", "never-read", and checkTxn's
	What    string
	Excerpt []event
}

func (a anomaly) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s\n", a.Kind, a.What)
	for _, e := range a.Excerpt {
		fmt.Fprintf(&b, "    %s\n", e)
	}
	return b.String()
}

// checkResult is the checker's verdict with the figures of the run.
type checkResult struct {
	Sends, Acked, Failed, Unknown int // send operations and their outcomes
	UnknownInLog                  int // unknown-outcome sends found in the log (so they were written)
	Read                          int // distinct records the final readers read
	Polled                        int // records the group consumers received (with re-deliveries)
	Commits                       int // successful commits
	// Anomalies are the first maxPerKind of each kind, with a last "... and N more" entry per kind
	// when there were more; Counts has the totals.
	Anomalies []anomaly
	Counts    map[string]int
}

// counts returns the number of anomalies of each kind.
func (r checkResult) counts() map[string]int { return r.Counts }

func (r checkResult) summary() string {
	return fmt.Sprintf("sends %d: acknowledged %d, failed %d, unknown %d (%d of them in the log); final read %d records; group polled %d, committed %d times; anomalies %v",
		r.Sends, r.Acked, r.Failed, r.Unknown, r.UnknownInLog, r.Read, r.Polled, r.Commits, r.counts())
}

// maxPerKind bounds the anomalies reported of one kind (the first ones, in history order).
const maxPerKind = 20

// pos is a record position.
type pos struct {
	part int32
	off  int64
}

// check runs every check over a history:
//   - lost: an acknowledged send whose value no final reader read;
//   - duplicate: a value at two positions of the log (any send, whatever its outcome);
//   - offset-mismatch: an acknowledged send whose value is in the log at another position than the
//     acknowledgement said;
//   - reorder: two acknowledged sends of one producer to one partition, invoked in one order, found in
//     the log in the other (the idempotent producer keeps a partition's order even with retries);
//   - divergent-read: two readers (final readers or group members) that saw different values at one
//     position;
//   - skip, backwards: a group member that, between two records of a partition with no rebalance of its
//     own in between, jumped over a record the log has, or went back to an offset at or below one it
//     had already received;
//   - never-read: a record in the log (an acknowledged write, or an unknown-outcome one that made it)
//     that no group member received although the group committed past it: its offset is below the
//     highest offset a member committed successfully for the partition. The group's commit claims it
//     consumed everything before that offset, so the check is sound whatever the rebalances were, and
//     says nothing about a partition's records at or above its last commit (nor about a partition the
//     group never committed, e.g. never assigned). The workload lets the group catch up with the high
//     watermarks before the final read, so there the whole log is covered.
//
// The final reads are the log: readers are expected to have read every partition from the start to
// its high watermark.
func check(events []event) checkResult {
	var r checkResult
	add := func(a anomaly) { r.Anomalies = append(r.Anomalies, a) }
	kinds := map[string]int{}
	report := func(a anomaly) {
		if kinds[a.Kind]++; kinds[a.Kind] <= maxPerKind {
			add(a)
		}
	}

	// The log as the final readers and the group members saw it.
	type seen struct {
		value string
		ev    event
	}
	atPos := map[pos]seen{}              // first value read at each position
	where := map[string][]event{}        // value -> final read events (distinct positions)
	logPos := map[int32][]int64{}        // partition -> offsets the final readers read, sorted below
	invokes := map[string]event{}        // value -> its send invocation
	outcome := map[string]event{}        // value -> its send completion
	divergent := map[pos]bool{}          // positions already reported
	readAt := map[pos]map[string]event{} // position -> value -> first event of a reader
	for _, e := range events {
		switch {
		case e.F == "send" && e.Type == "invoke":
			r.Sends++
			invokes[e.Value] = e
		case e.F == "send":
			outcome[e.Value] = e
			switch e.Type {
			case "ok":
				r.Acked++
			case "fail":
				r.Failed++
			default:
				r.Unknown++
			}
		case (e.F == "read" || e.F == "poll") && e.Type == "ok":
			p := pos{e.Partition, e.Offset}
			if e.F == "poll" {
				r.Polled++
			}
			if readAt[p] == nil {
				readAt[p] = map[string]event{}
			}
			if _, ok := readAt[p][e.Value]; !ok {
				readAt[p][e.Value] = e
			}
			if s, ok := atPos[p]; !ok {
				atPos[p] = seen{e.Value, e}
			} else if s.value != e.Value && !divergent[p] {
				divergent[p] = true
				report(anomaly{Kind: "divergent-read", What: fmt.Sprintf("p%d@%d: %s read %q, %s read %q", p.part, p.off, s.ev.Process, s.value, e.Process, e.Value),
					Excerpt: []event{s.ev, e}})
			}
			if e.F == "read" {
				dup := false
				for _, o := range where[e.Value] {
					if o.Partition == e.Partition && o.Offset == e.Offset {
						dup = true // read twice at one position (two final readers): not a duplicate
					}
				}
				if !dup {
					where[e.Value] = append(where[e.Value], e)
					logPos[e.Partition] = append(logPos[e.Partition], e.Offset)
				}
			}
		case e.F == "commit" && e.Type == "ok":
			r.Commits++
		}
	}
	r.Read = len(where)
	for part := range logPos {
		slices.Sort(logPos[part])
		logPos[part] = slices.Compact(logPos[part])
	}

	// Sends in history order of their invocation.
	values := make([]string, 0, len(invokes))
	for v := range invokes {
		values = append(values, v)
	}
	sort.Slice(values, func(i, j int) bool { return invokes[values[i]].Index < invokes[values[j]].Index })
	excerpt := func(v string, extra ...event) []event {
		var ex []event
		if e, ok := invokes[v]; ok {
			ex = append(ex, e)
		}
		if e, ok := outcome[v]; ok {
			ex = append(ex, e)
		}
		ex = append(ex, extra...)
		slices.SortFunc(ex, func(a, b event) int { return cmp.Compare(a.Index, b.Index) })
		return ex
	}
	for _, v := range values {
		out, done := outcome[v]
		ws := where[v]
		if done && out.Type == "info" && len(ws) > 0 {
			r.UnknownInLog++
		}
		if len(ws) > 1 {
			report(anomaly{Kind: "duplicate", What: fmt.Sprintf("%s is in the log %d times", v, len(ws)), Excerpt: excerpt(v, ws...)})
		}
		if !done || out.Type != "ok" {
			continue
		}
		if len(ws) == 0 {
			var near []event // what the readers found at the acknowledged position instead
			for _, e := range readAt[pos{out.Partition, out.Offset}] {
				near = append(near, e)
			}
			report(anomaly{Kind: "lost", What: fmt.Sprintf("%s acknowledged at p%d@%d, not in the log", v, out.Partition, out.Offset), Excerpt: excerpt(v, near...)})
			continue
		}
		if w := ws[0]; len(ws) == 1 && (w.Partition != out.Partition || w.Offset != out.Offset) {
			report(anomaly{Kind: "offset-mismatch", What: fmt.Sprintf("%s acknowledged at p%d@%d, in the log at p%d@%d", v, out.Partition, out.Offset, w.Partition, w.Offset),
				Excerpt: excerpt(v, w)})
		}
	}

	// Reordering: per producer and partition, the log positions of its acknowledged sends in the order
	// they were invoked must increase.
	type pp struct {
		proc string
		part int32
	}
	last := map[pp]string{} // the previous acknowledged value of each producer and partition
	for _, v := range values {
		out := outcome[v]
		ws := where[v]
		if out.Type != "ok" || len(ws) != 1 {
			continue
		}
		k := pp{invokes[v].Process, ws[0].Partition}
		if prev, ok := last[k]; ok {
			if pw := where[prev][0]; pw.Offset > ws[0].Offset {
				report(anomaly{Kind: "reorder", What: fmt.Sprintf("%s: %s was sent before %s but is after it in p%d (%d > %d)", k.proc, prev, v, k.part, pw.Offset, ws[0].Offset),
					Excerpt: excerpt(v, excerpt(prev)...)}) // the acknowledgements say where they are (else offset-mismatch)
			}
		}
		last[k] = v
	}

	// Group members: per member and partition, consecutive received records without a rebalance of the
	// member in between.
	type mp struct {
		member string
		part   int32
	}
	prev := map[mp]event{}
	for _, e := range events {
		switch e.F {
		case "assign", "revoke", "lost":
			for k := range prev {
				if k.member == e.Process {
					delete(prev, k)
				}
			}
		case "poll":
			k := mp{e.Process, e.Partition}
			if p, ok := prev[k]; ok {
				switch {
				case e.Offset <= p.Offset:
					report(anomaly{Kind: "backwards", What: fmt.Sprintf("%s read p%d@%d after p%d@%d without a rebalance", e.Process, e.Partition, e.Offset, p.Partition, p.Offset),
						Excerpt: []event{p, e}})
				case e.Offset > p.Offset+1:
					offs := logPos[e.Partition]
					i, _ := slices.BinarySearch(offs, p.Offset+1)
					if i < len(offs) && offs[i] < e.Offset {
						missed := pos{e.Partition, offs[i]}
						ex := []event{p}
						for _, m := range readAt[missed] {
							if m.F == "read" {
								ex = append(ex, m)
								break
							}
						}
						ex = append(ex, e)
						slices.SortFunc(ex, func(a, b event) int { return cmp.Compare(a.Index, b.Index) })
						report(anomaly{Kind: "skip", What: fmt.Sprintf("%s read p%d@%d then p%d@%d without a rebalance, skipping offset %d", e.Process, p.Partition, p.Offset, e.Partition, e.Offset, offs[i]),
							Excerpt: ex})
					}
				}
			}
			prev[k] = e
		}
	}
	// Records the group committed past without any member receiving them.
	committed := map[int32]int64{}  // partition -> highest offset committed successfully
	commitEv := map[int32][]event{} // partition -> its successful commits, in history order
	for _, e := range events {
		if e.F == "commit" && e.Type == "ok" {
			committed[e.Partition] = max(committed[e.Partition], e.Offset)
			commitEv[e.Partition] = append(commitEv[e.Partition], e)
		}
	}
	parts := make([]int32, 0, len(logPos))
	for part := range logPos {
		parts = append(parts, part)
	}
	slices.Sort(parts)
	for _, part := range parts {
		for _, off := range logPos[part] {
			if off >= committed[part] {
				break
			}
			p := pos{part, off}
			polled := false
			var read event
			for _, e := range readAt[p] {
				switch e.F {
				case "poll":
					polled = true
				case "read":
					read = e
				}
			}
			if polled {
				continue
			}
			ex := excerpt(read.Value, read)
			for _, c := range commitEv[part] { // the first commit that covered it
				if c.Offset > off {
					ex = append(ex, c)
					break
				}
			}
			slices.SortFunc(ex, func(a, b event) int { return cmp.Compare(a.Index, b.Index) })
			report(anomaly{Kind: "never-read", What: fmt.Sprintf("%s at p%d@%d: no group member received it, the group committed p%d=%d", read.Value, part, off, part, committed[part]),
				Excerpt: ex})
		}
	}

	r.Counts = kinds
	for kind, n := range kinds {
		if n > maxPerKind {
			add(anomaly{Kind: kind, What: fmt.Sprintf("... and %d more", n-maxPerKind)})
		}
	}
	return r
}
