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
	b.rebalance("g1", 0).read("g1", "poll", "a1", 0, 0).read("g1", "poll", "b1", 0, 1).read("g1", "poll", "a2", 0, 2)
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
	if r.Sends != 5 || r.Acked != 4 || r.Unknown != 1 || r.UnknownInLog != 1 || r.Read != 5 || r.Polled != 5 {
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
