package e2e

import (
	"strings"
	"testing"
)

// hb builds hand-made histories for the checker's tests.
type hb struct{ h *history }

func newHB() *hb { return &hb{h: newHistory()} }

func (b *hb) send(proc, value string, part int32) *hb {
	b.h.add(event{Process: proc, Type: "invoke", F: "send", Value: value, Partition: part})
	return b
}

func (b *hb) ack(proc, value string, part int32, off int64) *hb {
	b.h.add(event{Process: proc, Type: "ok", F: "send", Value: value, Partition: part, Offset: off})
	return b
}

func (b *hb) unknown(proc, value string, part int32) *hb {
	b.h.add(event{Process: proc, Type: "info", F: "send", Value: value, Partition: part, Err: "timeout"})
	return b
}

func (b *hb) read(proc, f, value string, part int32, off int64) *hb {
	b.h.add(event{Process: proc, Type: "ok", F: f, Value: value, Partition: part, Offset: off})
	return b
}

func (b *hb) commit(proc string, part int32, off int64) *hb {
	b.h.add(event{Process: proc, Type: "ok", F: "commit", Partition: part, Offset: off})
	return b
}

func (b *hb) rebalance(proc string, parts ...int32) *hb {
	b.h.add(event{Process: proc, Type: "ok", F: "assign", Parts: parts})
	return b
}

// clean is a history without anomalies: two producers on two partitions, an unknown send that made
// it, a group member re-reading after a rebalance, two final readers.
func clean() *hb {
	b := newHB()
	b.send("p1", "a1", 0).send("p2", "b1", 0).ack("p1", "a1", 0, 0).ack("p2", "b1", 0, 1)
	b.send("p1", "a2", 0).ack("p1", "a2", 0, 2).send("p1", "a3", 1).ack("p1", "a3", 1, 0)
	b.send("p2", "b2", 1).unknown("p2", "b2", 1)
	b.rebalance("g1", 0, 1).read("g1", "poll", "a1", 0, 0).read("g1", "poll", "b1", 0, 1)
	b.rebalance("g1", 0).read("g1", "poll", "a1", 0, 0).read("g1", "poll", "b1", 0, 1).read("g1", "poll", "a2", 0, 2).commit("g1", 0, 3)
	// Partition 1 was never committed by the group: never-read does not apply to it.
	for _, r := range []string{"final", "final2"} {
		b.read(r, "read", "a1", 0, 0).read(r, "read", "b1", 0, 1).read(r, "read", "a2", 0, 2)
		b.read(r, "read", "a3", 1, 0).read(r, "read", "b2", 1, 1)
	}
	return b
}

func TestCheckerClean(t *testing.T) {
	r := check(clean().h.snapshot())
	if len(r.Anomalies) != 0 {
		t.Fatalf("anomalies in a clean history:\n%v", r.Anomalies)
	}
	if r.Sends != 5 || r.Acked != 4 || r.Unknown != 1 || r.UnknownInLog != 1 || r.Read != 5 || r.Polled != 5 || r.Commits != 1 {
		t.Fatalf("figures: %s", r.summary())
	}
}

// TestCheckerCatches: each hand-made anomaly is found, alone, with an excerpt that shows it.
func TestCheckerCatches(t *testing.T) {
	cases := []struct {
		name, kind string
		build      func() *hb
		excerpt    []string // strings the excerpt must hold
	}{
		{"lost write", "lost", func() *hb {
			b := newHB().send("p1", "x1", 0).ack("p1", "x1", 0, 0).send("p1", "x2", 0).ack("p1", "x2", 0, 1)
			return b.read("final", "read", "x1", 0, 0).read("final", "read", "y9", 0, 1)
		}, []string{"x2 p0@1", "y9"}},
		{"duplicate", "duplicate", func() *hb {
			b := newHB().send("p1", "x1", 0).unknown("p1", "x1", 0).send("p1", "x2", 0).ack("p1", "x2", 0, 2)
			return b.read("final", "read", "x1", 0, 0).read("final", "read", "x1", 0, 1).read("final", "read", "x2", 0, 2)
		}, []string{"x1 p0@0", "x1 p0@1"}},
		{"reorder", "reorder", func() *hb {
			b := newHB().send("p1", "x1", 0).send("p1", "x2", 0).ack("p1", "x2", 0, 0).ack("p1", "x1", 0, 1)
			return b.read("final", "read", "x2", 0, 0).read("final", "read", "x1", 0, 1)
		}, []string{"x1", "x2"}},
		{"readers disagree", "divergent-read", func() *hb {
			b := newHB().send("p1", "x1", 0).ack("p1", "x1", 0, 0).send("p1", "x2", 0).unknown("p1", "x2", 0)
			b.rebalance("g1", 0).read("g1", "poll", "x2", 0, 0)
			return b.read("final", "read", "x1", 0, 0)
		}, []string{"g1", "x2 p0@0", "final", "x1 p0@0"}},
		{"acknowledged offset is not where the record is", "offset-mismatch", func() *hb {
			b := newHB().send("p1", "x1", 0).ack("p1", "x1", 0, 5)
			return b.read("final", "read", "x1", 0, 0)
		}, []string{"x1 p0@5", "x1 p0@0"}},
		{"group member skips", "skip", func() *hb {
			b := newHB()
			for i, v := range []string{"x0", "x1", "x2"} {
				b.send("p1", v, 0).ack("p1", v, 0, int64(i))
			}
			b.rebalance("g1", 0).read("g1", "poll", "x0", 0, 0).read("g1", "poll", "x2", 0, 2)
			return b.read("final", "read", "x0", 0, 0).read("final", "read", "x1", 0, 1).read("final", "read", "x2", 0, 2)
		}, []string{"x0 p0@0", "x1 p0@1", "x2 p0@2"}},
		{"group member goes backwards", "backwards", func() *hb {
			b := newHB()
			for i, v := range []string{"x0", "x1"} {
				b.send("p1", v, 0).ack("p1", v, 0, int64(i))
			}
			b.rebalance("g1", 0).read("g1", "poll", "x0", 0, 0).read("g1", "poll", "x1", 0, 1).read("g1", "poll", "x0", 0, 0)
			return b.read("final", "read", "x0", 0, 0).read("final", "read", "x1", 0, 1)
		}, []string{"x1 p0@1", "x0 p0@0"}},
		{"record no group member received", "never-read", func() *hb {
			b := newHB()
			for i, v := range []string{"x0", "x1", "x2"} {
				b.send("p1", v, 0).ack("p1", v, 0, int64(i))
			}
			// A rebalance between the two polls: not a skip of g1's, but the group committed past x1.
			b.rebalance("g1", 0).read("g1", "poll", "x0", 0, 0).commit("g1", 0, 1)
			b.rebalance("g1", 0).read("g1", "poll", "x2", 0, 2).commit("g1", 0, 3)
			return b.read("final", "read", "x0", 0, 0).read("final", "read", "x1", 0, 1).read("final", "read", "x2", 0, 2)
		}, []string{"invoke send   x1", "x1 p0@1", "p0=3"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := check(tc.build().h.snapshot())
			if len(r.Anomalies) != 1 || r.Anomalies[0].Kind != tc.kind {
				t.Fatalf("want exactly one %s, got %d: %v", tc.kind, len(r.Anomalies), r.Anomalies)
			}
			a := r.Anomalies[0]
			text := a.String()
			for _, s := range tc.excerpt {
				if !strings.Contains(text, s) {
					t.Errorf("excerpt lacks %q:\n%s", s, text)
				}
			}
			if len(a.Excerpt) > 5 {
				t.Errorf("excerpt of %d events is not minimal:\n%s", len(a.Excerpt), text)
			}
			t.Logf("\n%s", text)
		})
	}
	// The same anomalies inside the clean history are still caught, and only they.
	b := clean()
	b.send("p9", "z1", 0).ack("p9", "z1", 0, 7)
	if r := check(b.h.snapshot()); r.Counts["lost"] != 1 || len(r.Anomalies) != 1 {
		t.Fatalf("clean history plus a lost write: %v", r.Anomalies)
	}
}

// Transactional histories (checkTxn).

func (b *hb) txn(proc, name, typ string, n int64) *hb {
	b.h.add(event{Process: proc, Type: typ, F: "txn", Txn: name, Offset: n})
	return b
}

// out records an output read: f "cread" (read_committed) or "uread" (read_uncommitted).
func (b *hb) out(proc, f, value string, part int32, off int64, txn string) *hb {
	b.h.add(event{Process: proc, Type: "ok", F: f, Value: value, Partition: part, Offset: off, Txn: txn})
	return b
}

func (b *hb) groupOffset(part int32, off int64) *hb {
	b.h.add(event{Process: "final-group", Type: "ok", F: "group-offset", Partition: part, Offset: off})
	return b
}

// input writes the input records "a" (p0@0), "bb" (p0@1) and "ccc" (p1@0) and reads them at the end.
// A copy of "a" is "0/0/1" (its length), of "bb" "0/1/2", of "ccc" "1/0/3".
func (b *hb) input() *hb {
	b.send("i1", "a", 0).ack("i1", "a", 0, 0).send("i1", "bb", 0).ack("i1", "bb", 0, 1).send("i1", "ccc", 1).ack("i1", "ccc", 1, 0)
	return b.read("final-in", "read", "a", 0, 0).read("final-in", "read", "bb", 0, 1).read("final-in", "read", "ccc", 1, 0)
}

// cleanTxn is a transactional history without anomalies: a committed transaction over two output
// partitions, an aborted attempt and its committed retry, a transaction killed before it wrote
// anything, a live reader that re-reads after a restart, and the final readers.
func cleanTxn() *hb {
	b := newHB().input()
	b.txn("c1", "T1", "invoke", 2).txn("c1", "T1", "ok", 2)   // out p0@0 "0/0/1", p1@0 "1/0/3"
	b.txn("c1", "T2", "invoke", 1).txn("c1", "T2", "fail", 1) // out p0@2 "0/1/2", aborted
	b.txn("c2", "T3", "invoke", 1).txn("c2", "T3", "ok", 1)   // out p0@4 "0/1/2"
	b.txn("c2", "T4", "invoke", 1).txn("c2", "T4", "info", 1) // killed, nothing written
	b.out("r1", "cread", "0/0/1", 0, 0, "T1").out("r1", "cread", "1/0/3", 1, 0, "T1")
	b.out("r1", "cread", "0/0/1", 0, 0, "T1").out("r1", "cread", "0/1/2", 0, 4, "T3") // re-read of p0@0
	b.groupOffset(0, 2).groupOffset(1, 1)
	b.out("final-rc", "cread", "0/0/1", 0, 0, "T1").out("final-rc", "cread", "0/1/2", 0, 4, "T3").out("final-rc", "cread", "1/0/3", 1, 0, "T1")
	b.out("final-ru", "uread", "0/0/1", 0, 0, "T1").out("final-ru", "uread", "0/1/2", 0, 2, "T2").out("final-ru", "uread", "0/1/2", 0, 4, "T3")
	return b.out("final-ru", "uread", "1/0/3", 1, 0, "T1")
}

func TestCheckerTxnClean(t *testing.T) {
	events := cleanTxn().h.snapshot()
	r := checkTxn(events)
	if len(r.Anomalies) != 0 {
		t.Fatalf("anomalies in a clean history:\n%v", r.Anomalies)
	}
	if r.Txns != 4 || r.Committed != 2 || r.Aborted != 1 || r.Unknown != 1 || r.CommittedInLog != 2 || r.Inputs != 3 || r.Claimed != 3 ||
		r.Copied != 3 || r.LiveReads != 4 || r.FinalRC != 3 || r.FinalRU != 4 {
		t.Fatalf("figures: %s", r.summary())
	}
	if q := check(events); len(q.Anomalies) != 0 || q.Acked != 3 {
		t.Fatalf("the input checked as a queue: %s %v", q.summary(), q.Anomalies)
	}
}

// TestCheckerTxnCatches: each hand-made transactional anomaly is found, alone, with an excerpt that
// shows it.
func TestCheckerTxnCatches(t *testing.T) {
	cases := []struct {
		name, kind string
		build      func() *hb
		excerpt    []string
	}{
		{"read_committed reads an aborted transaction", "aborted-read", func() *hb {
			b := newHB().input().txn("c1", "T1", "invoke", 1).txn("c1", "T1", "fail", 1)
			b.out("r1", "cread", "0/0/1", 0, 0, "T1")
			return b.out("final-ru", "uread", "0/0/1", 0, 0, "T1")
		}, []string{"invoke txn    T1", "fail   txn    T1", "r1     ok     cread  0/0/1"}},
		{"read_committed reads a transaction that never committed", "uncommitted-read", func() *hb {
			b := newHB().input().txn("c1", "T1", "invoke", 1).txn("c1", "T1", "info", 1)
			b.out("r1", "cread", "0/0/1", 0, 0, "T1")
			return b.out("final-ru", "uread", "0/0/1", 0, 0, "T1")
		}, []string{"info   txn    T1", "r1", "final-ru"}},
		{"a committed transaction is lost", "lost-txn", func() *hb {
			b := newHB().input().txn("c1", "T1", "invoke", 1).txn("c1", "T1", "ok", 1)
			return b.out("final-ru", "uread", "0/0/1", 0, 0, "T1")
		}, []string{"ok     txn    T1"}},
		{"torn transaction", "torn", func() *hb {
			b := newHB().input().txn("c1", "T1", "invoke", 2).txn("c1", "T1", "ok", 2)
			b.out("final-rc", "cread", "0/0/1", 0, 0, "T1")
			return b.out("final-ru", "uread", "0/0/1", 0, 0, "T1").out("final-ru", "uread", "1/0/3", 1, 0, "T1")
		}, []string{"T1 n=2", "final-rc", "1/0/3 p1@0"}},
		{"two copies of one input", "duplicate", func() *hb {
			b := newHB().input().txn("c1", "T1", "invoke", 1).txn("c1", "T1", "ok", 1).txn("c2", "T2", "invoke", 1).txn("c2", "T2", "ok", 1)
			return b.out("final-rc", "cread", "0/0/1", 0, 0, "T1").out("final-rc", "cread", "0/0/1", 0, 2, "T2")
		}, []string{"0/0/1 p0@0", "0/0/1 p0@2"}},
		{"an input the group committed has no copy", "missing", func() *hb {
			b := newHB().input().txn("c1", "T1", "invoke", 1).txn("c1", "T1", "ok", 1).groupOffset(0, 2)
			return b.out("final-rc", "cread", "0/0/1", 0, 0, "T1")
		}, []string{"bb p0@1", "p0=2"}},
		{"copies out of input order", "reorder", func() *hb {
			b := newHB().input().txn("c1", "T1", "invoke", 2).txn("c1", "T1", "ok", 2)
			return b.out("final-rc", "cread", "0/1/2", 0, 0, "T1").out("final-rc", "cread", "0/0/1", 0, 1, "T1")
		}, []string{"0/1/2 p0@0", "0/0/1 p0@1"}},
		{"a copy that copies nothing", "bad-copy", func() *hb {
			b := newHB().input().txn("c1", "T1", "invoke", 1).txn("c1", "T1", "ok", 1)
			return b.out("final-rc", "cread", "0/0/5", 0, 0, "T1")
		}, []string{"0/0/5", "a p0@0"}},
		{"readers disagree on the output", "divergent-read", func() *hb {
			b := newHB().input().txn("c1", "T1", "invoke", 1).txn("c1", "T1", "ok", 1)
			return b.out("r1", "cread", "0/0/1", 0, 0, "T1").out("final-rc", "cread", "0/1/2", 0, 0, "T1")
		}, []string{"r1", "final-rc"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := checkTxn(tc.build().h.snapshot())
			if len(r.Anomalies) != 1 || r.Anomalies[0].Kind != tc.kind {
				t.Fatalf("want exactly one %s, got %d: %v", tc.kind, len(r.Anomalies), r.Anomalies)
			}
			a := r.Anomalies[0]
			text := a.String()
			for _, s := range tc.excerpt {
				if !strings.Contains(text, s) {
					t.Errorf("excerpt lacks %q:\n%s", s, text)
				}
			}
			if len(a.Excerpt) > 5 {
				t.Errorf("excerpt of %d events is not minimal:\n%s", len(a.Excerpt), text)
			}
			t.Logf("\n%s", text)
		})
	}
	// An aborted read added to the clean history is caught, and only it: its record, also a second
	// copy of input p0@1, is that one anomaly, not a duplicate as well.
	b := cleanTxn().out("r2", "cread", "0/1/2", 0, 2, "T2")
	if r := checkTxn(b.h.snapshot()); r.Counts["aborted-read"] != 1 || r.Counts["duplicate"] != 0 || len(r.Anomalies) != 1 {
		t.Fatalf("clean history plus an aborted read: %v", r.Anomalies)
	}
}
