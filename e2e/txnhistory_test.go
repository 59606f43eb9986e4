package e2e

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The transactional workload's checker (txnwork_test.go, docs/testing.md): the copiers'
// transactions ("txn" events, each named by the "txn" header of the records it wrote), what the
// read_committed readers read ("cread": the live readers and "final-rc") and what the read_uncommitted
// final reader read ("uread", "final-ru") of the output topic, the input topic's log (the input
// producers' "send" and the final "read" events, which check() checks as a queue) and the copiers'
// group's committed input offsets at the end ("group-offset").
//
// An output record's value is "IN_PARTITION/IN_OFFSET/TRANSFORMED" (e2e/copier): the input record it
// copies. The final read_committed read, once every transaction is complete (LSO = HW), is the
// committed output; the final read_uncommitted read also holds the aborted attempts.

// txnResult is checkTxn's verdict with the figures of the run.
type txnResult struct {
	Txns, Committed, Aborted, Unknown int // transactions begun and their outcomes as the copiers saw them
	CommittedInLog                    int // transactions the final read_committed read shows
	Inputs                            int // records in the input log
	Claimed                           int // input records below the group's committed offsets
	Copied                            int // input records with a copy in the final read_committed read
	LiveReads                         int // records the live read_committed readers read (with re-reads)
	FinalRC, FinalRU                  int // records the final readers read
	Anomalies                         []anomaly
	Counts                            map[string]int
}

func (r txnResult) summary() string {
	return fmt.Sprintf("transactions %d: committed %d, aborted %d, unknown %d (%d committed in the log); input %d records, %d claimed by the group's offsets, %d copied; live read_committed reads %d; final read_committed %d, read_uncommitted %d; anomalies %v",
		r.Txns, r.Committed, r.Aborted, r.Unknown, r.CommittedInLog, r.Inputs, r.Claimed, r.Copied, r.LiveReads, r.FinalRC, r.FinalRU, r.Counts)
}

// txnOf is one copier transaction as the history tells it.
type txnOf struct {
	begin, end event // end.Type "" while no outcome was seen
	finalRC    []event
	finalRU    []event
}

// copyOf parses an output value "IN_PARTITION/IN_OFFSET/TRANSFORMED".
func copyOf(v string) (in pos, transformed string, ok bool) {
	f := strings.SplitN(v, "/", 3)
	if len(f) != 3 {
		return pos{}, "", false
	}
	p, err1 := strconv.ParseInt(f[0], 10, 32)
	o, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return pos{}, "", false
	}
	return pos{int32(p), o}, f[2], true
}

// checkTxn runs the transactional checks over a history:
//   - aborted-read: a read_committed reader read a record of a transaction whose abort the copier saw
//     succeed;
//   - uncommitted-read: a live read_committed reader read a record of a transaction that never
//     committed: its copier saw no commit, and the final read_committed read has none of its records
//     (a committed transaction shows there whole, once every transaction is complete);
//   - lost-txn: a transaction whose commit the copier saw succeed has no record in the final
//     read_committed read;
//   - torn: the final read_committed read shows some of a transaction's records but not all of them
//     (or more: the begin event gives the count);
//   - duplicate: read_committed readers read two copies of one input record at two positions;
//   - missing: an input record below the group's final committed offset of its partition (the
//     copiers commit input offsets in the transaction that writes the copies, so the group claims to
//     have copied it) has no copy in the final read_committed read;
//   - reorder: the final read_committed copies of one partition are not in input order;
//   - bad-copy: an output value names no record of the input log, another partition, or a wrong
//     transformation;
//   - divergent-read: two readers of the output (read_committed or read_uncommitted) saw different
//     values at one position.
func checkTxn(events []event) txnResult {
	r := txnResult{Counts: map[string]int{}}
	report := func(a anomaly) {
		if r.Counts[a.Kind]++; r.Counts[a.Kind] <= maxPerKind {
			r.Anomalies = append(r.Anomalies, a)
		}
	}
	txns := map[string]*txnOf{}
	txn := func(name string) *txnOf {
		t := txns[name]
		if t == nil {
			t = &txnOf{}
			txns[name] = t
		}
		return t
	}
	var names []string                // transactions in order of their begin (or first sight)
	inLog := map[pos]event{}          // input position -> its final read
	sends := map[string][]event{}     // input value -> its send events
	groupOff := map[int32]event{}     // input partition -> the group's final committed offset
	outAt := map[pos]event{}          // output position -> first value read there
	divergent := map[pos]bool{}       // positions reported
	copies := map[pos]map[pos]event{} // input position -> rc output positions holding a copy -> first read
	finalCopy := map[pos]event{}      // input position -> a final rc copy
	finalSeen := map[pos]bool{}       // output positions the final rc reader read
	ruSeen := map[pos]bool{}
	for _, e := range events {
		switch e.F {
		case "send":
			sends[e.Value] = append(sends[e.Value], e)
		case "read":
			if _, ok := inLog[pos{e.Partition, e.Offset}]; !ok {
				inLog[pos{e.Partition, e.Offset}] = e
			}
		case "group-offset":
			groupOff[e.Partition] = e
		case "txn":
			if _, ok := txns[e.Txn]; !ok {
				names = append(names, e.Txn)
			}
			t := txn(e.Txn)
			if e.Type == "invoke" {
				t.begin = e
			} else if t.end.Type == "" {
				t.end = e
			}
		case "cread", "uread":
			p := pos{e.Partition, e.Offset}
			if s, ok := outAt[p]; !ok {
				outAt[p] = e
			} else if s.Value != e.Value && !divergent[p] {
				divergent[p] = true
				report(anomaly{Kind: "divergent-read", What: fmt.Sprintf("output p%d@%d: %s read %q, %s read %q", p.part, p.off, s.Process, s.Value, e.Process, e.Value),
					Excerpt: []event{s, e}})
			}
			if _, ok := txns[e.Txn]; !ok {
				names = append(names, e.Txn)
			}
			t := txn(e.Txn)
			if e.F == "uread" {
				if !ruSeen[p] {
					ruSeen[p] = true
					t.finalRU = append(t.finalRU, e)
					r.FinalRU++
				}
				continue
			}
			in, _, ok := copyOf(e.Value)
			if ok {
				if copies[in] == nil {
					copies[in] = map[pos]event{}
				}
				if _, seen := copies[in][p]; !seen {
					copies[in][p] = e
				}
			}
			if e.Process == "final-rc" {
				if !finalSeen[p] {
					finalSeen[p] = true
					t.finalRC = append(t.finalRC, e)
					r.FinalRC++
					if ok {
						finalCopy[in] = e
					}
				}
			} else {
				r.LiveReads++
			}
		}
	}
	r.Inputs = len(inLog)
	byIndex := func(ex []event) []event {
		slices.SortFunc(ex, func(a, b event) int { return cmp.Compare(a.Index, b.Index) })
		return ex
	}
	// The transaction's begin and outcome, for excerpts.
	life := func(t *txnOf, extra ...event) []event {
		var ex []event
		if t.begin.F != "" {
			ex = append(ex, t.begin)
		}
		if t.end.F != "" {
			ex = append(ex, t.end)
		}
		return byIndex(append(ex, extra...))
	}

	// Transactions: outcomes, torn and lost ones.
	for _, name := range names {
		t := txns[name]
		if t.begin.F != "" {
			r.Txns++
			switch t.end.Type {
			case "ok":
				r.Committed++
			case "fail":
				r.Aborted++
			default:
				r.Unknown++
			}
		}
		if len(t.finalRC) > 0 {
			r.CommittedInLog++
		}
		n := int(t.begin.Offset)
		switch {
		case t.begin.F == "":
			// Records of a transaction no copier reported beginning: nothing to compare with.
		case len(t.finalRC) > 0 && len(t.finalRC) != n:
			ex := []event{t.finalRC[0]}
			for _, u := range t.finalRU { // one of its records read_committed does not show
				if !finalSeen[pos{u.Partition, u.Offset}] {
					ex = append(ex, u)
					break
				}
			}
			report(anomaly{Kind: "torn", What: fmt.Sprintf("transaction %s wrote %d records; the final read_committed read shows %d of them", name, n, len(t.finalRC)),
				Excerpt: life(t, ex...)})
		case len(t.finalRC) == 0 && t.end.Type == "ok" && n > 0:
			var ex []event
			if len(t.finalRU) > 0 {
				ex = append(ex, t.finalRU[0])
			}
			report(anomaly{Kind: "lost-txn", What: fmt.Sprintf("transaction %s of %d records committed, none of them in the final read_committed read", name, n),
				Excerpt: life(t, ex...)})
		}
	}

	// What the read_committed readers should never have seen.
	reported := map[string]bool{}
	abortedRead := map[string]bool{} // transactions reported as aborted-read
	for _, e := range events {
		if e.F != "cread" || reported[e.Txn] {
			continue
		}
		t := txns[e.Txn]
		switch {
		case t.end.Type == "fail":
			reported[e.Txn], abortedRead[e.Txn] = true, true
			report(anomaly{Kind: "aborted-read", What: fmt.Sprintf("%s read %s at output p%d@%d, of transaction %s, which was aborted", e.Process, e.Value, e.Partition, e.Offset, e.Txn),
				Excerpt: life(t, e)})
		case e.Process != "final-rc" && t.end.Type != "ok" && len(t.finalRC) == 0:
			reported[e.Txn] = true
			var ex []event
			if len(t.finalRU) > 0 {
				ex = append(ex, t.finalRU[0])
			}
			report(anomaly{Kind: "uncommitted-read", What: fmt.Sprintf("%s read %s at output p%d@%d, of transaction %s, which never committed (not in the final read_committed read)", e.Process, e.Value, e.Partition, e.Offset, e.Txn),
				Excerpt: life(t, append(ex, e)...)})
		}
	}

	// Records of a transaction reported above as aborted-read are that anomaly, once: they are left
	// out of the copy checks, whose duplicates and reorderings they would otherwise count again.
	for in, cs := range copies {
		for p, e := range cs {
			if abortedRead[e.Txn] {
				delete(cs, p)
			}
		}
		if len(cs) == 0 {
			delete(copies, in)
		}
	}
	for p, e := range outAt {
		if abortedRead[e.Txn] {
			delete(outAt, p)
		}
	}
	for in, e := range finalCopy {
		if abortedRead[e.Txn] {
			delete(finalCopy, in)
		}
	}

	// Copies: duplicates, bad copies, missing inputs, order.
	ins := make([]pos, 0, len(copies))
	for in := range copies {
		ins = append(ins, in)
	}
	slices.SortFunc(ins, func(a, b pos) int { return cmp.Or(cmp.Compare(a.part, b.part), cmp.Compare(a.off, b.off)) })
	for _, in := range ins {
		if len(copies[in]) < 2 {
			continue
		}
		var ex []event
		for _, e := range copies[in] {
			ex = append(ex, e)
		}
		ex = byIndex(ex)[:2]
		report(anomaly{Kind: "duplicate", What: fmt.Sprintf("input p%d@%d has %d copies read_committed (output p%d@%d and p%d@%d)", in.part, in.off, len(copies[in]), ex[0].Partition, ex[0].Offset, ex[1].Partition, ex[1].Offset),
			Excerpt: ex})
	}
	outs := make([]pos, 0, len(outAt))
	for p := range outAt {
		outs = append(outs, p)
	}
	slices.SortFunc(outs, func(a, b pos) int { return cmp.Or(cmp.Compare(a.part, b.part), cmp.Compare(a.off, b.off)) })
	lastIn := map[int32]event{} // output partition -> the previous final rc copy
	for _, p := range outs {
		e := outAt[p]
		in, tr, ok := copyOf(e.Value)
		src, known := inLog[in]
		switch {
		case !ok:
			report(anomaly{Kind: "bad-copy", What: fmt.Sprintf("output p%d@%d: %q is not a copy", p.part, p.off, e.Value), Excerpt: []event{e}})
			continue
		case in.part != p.part || !known || tr != strconv.Itoa(len(src.Value)):
			ex := []event{e}
			if known {
				ex = append(ex, src)
			}
			report(anomaly{Kind: "bad-copy", What: fmt.Sprintf("output p%d@%d: %q does not copy input p%d@%d", p.part, p.off, e.Value, in.part, in.off), Excerpt: byIndex(ex)})
			continue
		}
		if !finalSeen[p] {
			continue
		}
		if prev, ok := lastIn[p.part]; ok {
			if pin, _, _ := copyOf(prev.Value); pin.off > in.off { // equal: a duplicate, reported above
				report(anomaly{Kind: "reorder", What: fmt.Sprintf("output p%d: input offset %d at %d after input offset %d at %d", p.part, in.off, p.off, pin.off, prev.Offset),
					Excerpt: []event{prev, e}})
			}
		}
		lastIn[p.part] = e
	}
	inPos := make([]pos, 0, len(inLog))
	for p := range inLog {
		inPos = append(inPos, p)
	}
	slices.SortFunc(inPos, func(a, b pos) int { return cmp.Or(cmp.Compare(a.part, b.part), cmp.Compare(a.off, b.off)) })
	for _, in := range inPos {
		g, claimed := groupOff[in.part]
		if !claimed || in.off >= g.Offset {
			continue
		}
		r.Claimed++
		if _, ok := finalCopy[in]; ok {
			r.Copied++
			continue
		}
		src := inLog[in]
		ex := []event{src, g}
		if s := sends[src.Value]; len(s) > 0 {
			ex = append(ex, s[len(s)-1])
		}
		for _, e := range copies[in] { // a live reader's copy the final read lacks
			ex = append(ex, e)
			break
		}
		report(anomaly{Kind: "missing", What: fmt.Sprintf("input p%d@%d (%s) is below the group's committed offset %d but has no copy read_committed", in.part, in.off, src.Value, g.Offset),
			Excerpt: byIndex(ex)})
	}
	for kind, n := range r.Counts {
		if n > maxPerKind {
			r.Anomalies = append(r.Anomalies, anomaly{Kind: kind, What: fmt.Sprintf("... and %d more", n-maxPerKind)})
		}
	}
	return r
}
