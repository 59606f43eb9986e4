package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The fault-injection runs (issue 8, docs/testing.md): a three-node cluster behind the fault proxies,
// the queue workload, and a nemesis applying one fault at a time from a seeded random schedule; then
// every fault is healed, every node is back, the partitions are read in full and the history checked.
// TestQueueUnderFaults is the short, fixed-seed run of `make test`; TestQueueUnderFaultsLong is
// `make e2e-long SEED=... DURATION=...`, which writes a report to e2e/out/.

// knownAnomalies are anomaly kinds the runs find today that are product issues not fixed yet: they are
// logged and written to the report but do not fail the test. Remove an entry once its fix lands; the
// fixed-seed TestQueueUnderFaults then guards it.
var knownAnomalies = map[string]string{
	// None now. (TestQueueUnderFaults, seed 1, once found a group member at p1@1426 reading p1@0 next
	// with no rebalance: fetches carried no leader epoch, so the isolated old leader's
	// OFFSET_OUT_OF_RANGE reset it to earliest. Consumers now send the leader epoch (KIP-320) and
	// refetch a position past the log end after a metadata refresh.)
}

// faultEntry is one fault the nemesis applied, for the report.
type faultEntry struct {
	At, Lasted time.Duration
	What       string
}

// nemesis applies faults to a faultCluster from a seeded schedule.
type nemesis struct {
	t      testing.TB
	fc     *faultCluster
	rng    *rand.Rand
	start  time.Time
	faults []faultEntry
	kinds  []string
	cycle  bool // take the kinds in order (the short run covers each), not at random
	next   int
}

func newNemesis(t testing.TB, fc *faultCluster, seed uint64, kinds ...string) *nemesis {
	if len(kinds) == 0 {
		kinds = []string{"isolate-leader", "isolate", "partition", "one-way", "latency", "kill", "kill-leader", "pause"}
	}
	return &nemesis{t: t, fc: fc, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), start: time.Now(), kinds: kinds}
}

// leader is the controller leader as a running node sees it (-1 unknown).
func (n *nemesis) leader() int32 {
	for _, id := range n.fc.ids {
		if n.fc.running(id) {
			if c := n.fc.controllerOf(id); c > 0 {
				return c
			}
		}
	}
	return -1
}

func (n *nemesis) pick() int32 { return n.fc.ids[n.rng.IntN(len(n.fc.ids))] }

// run applies faults until stop is closed: each lasts 4-12 s, followed by 4-10 s of calm. kinds
// restricts the schedule to some of the fault kinds. Every fault is repaired before run returns.
func (n *nemesis) run(stop <-chan struct{}) {
	sleep := func(d time.Duration) bool {
		select {
		case <-stop:
			return false
		case <-time.After(d):
			return true
		}
	}
	for {
		if !sleep(time.Duration(4000+n.rng.IntN(6000)) * time.Millisecond) {
			return
		}
		kind := n.kinds[n.rng.IntN(len(n.kinds))]
		if n.cycle {
			kind = n.kinds[n.next%len(n.kinds)]
			n.next++
		}
		lasts := time.Duration(4000+n.rng.IntN(8000)) * time.Millisecond
		at := time.Since(n.start)
		var what string
		var repair func()
		switch kind {
		case "isolate-leader", "isolate":
			id := n.pick()
			if kind == "isolate-leader" {
				if l := n.leader(); l > 0 {
					id = l
				}
			}
			n.fc.isolate(id)
			what, repair = fmt.Sprintf("%s %d", kind, id), n.fc.heal
		case "partition":
			id := n.pick()
			var rest []int32
			for _, j := range n.fc.ids {
				if j != id {
					rest = append(rest, j)
				}
			}
			n.fc.partition([]int32{id}, rest)
			what, repair = fmt.Sprintf("partition [%d] | %v", id, rest), n.fc.heal
		case "one-way":
			from := n.pick()
			to := from
			for to == from {
				to = n.pick()
			}
			n.fc.block(from, to)
			what, repair = fmt.Sprintf("block %d->%d", from, to), n.fc.heal
		case "latency":
			id := n.pick()
			d := time.Duration(50+n.rng.IntN(250)) * time.Millisecond
			for _, j := range n.fc.ids {
				if j != id {
					n.fc.latency(id, j, d)
					n.fc.latency(j, id, d)
				}
			}
			what, repair = fmt.Sprintf("latency %v around %d", d, id), n.fc.heal
		case "kill", "kill-leader":
			id := n.pick()
			if kind == "kill-leader" {
				if l := n.leader(); l > 0 {
					id = l
				}
			}
			n.fc.kill(id)
			what, repair = fmt.Sprintf("%s %d (kill -9, restart)", kind, id), func() {
				n.fc.restart(id)
				n.fc.waitReady(60*time.Second, id)
			}
		case "pause":
			id := n.pick()
			n.fc.pause(id)
			what, repair = fmt.Sprintf("pause %d (SIGSTOP, SIGCONT)", id), func() { n.fc.resume(id) }
		}
		n.t.Logf("nemesis %8s: %s for %v", at.Truncate(time.Millisecond), what, lasts)
		sleep(lasts)
		repair()
		n.faults = append(n.faults, faultEntry{At: at, Lasted: time.Since(n.start) - at, What: what})
		select {
		case <-stop:
			return
		default:
		}
	}
}

// runQueueUnderFaults runs the queue workload for duration under the nemesis of seed and returns the
// verdict and the faults applied.
func runQueueUnderFaults(t *testing.T, seed uint64, duration time.Duration, cycle bool) (checkResult, []faultEntry, *history) {
	fc := startFaultCluster(t, 3, 3)
	w := startQueue(t, fc.grpcAddrs(), "queue", 6, queueConfig{producers: 3, members: 2, interval: 15 * time.Millisecond, inFlight: 64})
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			w.close()
		}
	})
	nem := newNemesis(t, fc, seed)
	if cycle {
		nem.cycle = true
		nem.kinds = []string{"isolate-leader", "kill-leader", "partition", "pause", "one-way", "kill", "latency"}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		nem.run(stop)
	}()
	time.Sleep(duration)
	close(stop)
	<-done
	// Everything healed (run repairs its last fault): let the workload go on a little on a whole
	// cluster, then stop it and read everything.
	fc.heal()
	for _, id := range fc.ids {
		fc.resume(id)
		if !fc.running(id) {
			fc.restart(id)
		}
	}
	fc.waitReady(60*time.Second, fc.ids...)
	time.Sleep(5 * time.Second)
	w.close()
	stopped = true
	if err := w.finalRead("final", 60*time.Second); err != nil {
		t.Fatalf("final read: %v", err)
	}
	events := w.h.snapshot()
	r := check(events)
	t.Logf("seed %d, %v: %d faults; %s", seed, duration, len(nem.faults), r.summary())
	for _, a := range r.Anomalies {
		if why, known := knownAnomalies[a.Kind]; known {
			t.Logf("KNOWN PRODUCT ISSUE, not failing the test (%s):\n%s", why, a)
			continue
		}
		t.Errorf("%s", a)
	}
	return r, nem.faults, w.h
}

// TestQueueUnderFaults is the fixed-seed short schedule of `make test`: about 100 s of faults
// (isolation of the controller leader, partitions, one-way links, latency, kill -9 and restart,
// SIGSTOP) under the queue workload, then the checker: no acknowledged write lost, no duplicate, no
// reordering, readers agree, group members neither skip nor go back.
func TestQueueUnderFaults(t *testing.T) {
	r, faults, _ := runQueueUnderFaults(t, 1, 100*time.Second, true)
	if len(faults) < 4 {
		t.Errorf("only %d faults applied", len(faults))
	}
	if r.Acked < 1000 {
		t.Errorf("only %d acknowledged writes: the workload hardly ran", r.Acked)
	}
}

// TestQueueUnderFaultsLong is `make e2e-long SEED=... DURATION=...` (RUNNEL_E2E_LONG=1, E2E_SEED,
// E2E_DURATION): the random schedule of SEED for DURATION, and a report in e2e/out/.
func TestQueueUnderFaultsLong(t *testing.T) {
	if os.Getenv("RUNNEL_E2E_LONG") == "" {
		t.Skip("make e2e-long runs it (RUNNEL_E2E_LONG=1)")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("E2E_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("E2E_SEED=%q: %v", s, err)
		}
		seed = v
	}
	duration := 10 * time.Minute
	if s := os.Getenv("E2E_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("E2E_DURATION=%q: %v", s, err)
		}
		duration = d
	}
	began := time.Now()
	r, faults, h := runQueueUnderFaults(t, seed, duration, false)
	path, err := writeReport(seed, duration, began, r, faults, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report: %s", path)
}

// writeReport writes the run's report (and its whole history next to it) to e2e/out/.
func writeReport(seed uint64, duration time.Duration, began time.Time, r checkResult, faults []faultEntry, h *history) (string, error) {
	if err := os.MkdirAll("out", 0o755); err != nil {
		return "", err
	}
	name := fmt.Sprintf("queue-seed%d-%s", seed, began.Format("20060102-150405"))
	var b strings.Builder
	fmt.Fprintf(&b, "# Queue workload under faults\n\nseed %d, fault schedule %v, started %s, took %v\n\n", seed, duration, began.Format(time.RFC3339), time.Since(began).Truncate(time.Second))
	fmt.Fprintf(&b, "3 nodes (3 controller voters), topic of 6 partitions, RF 3, min.insync.replicas=2; 3 idempotent acks=all producers, a group of 2 members\n\n")
	fmt.Fprintf(&b, "## Figures\n\n- operations (sends): %d\n- acknowledged: %d\n- unknown outcome: %d (%d of them found in the log)\n- failed: %d\n- records read at the end: %d\n- records polled by the group: %d, commits: %d\n- faults: %d\n- anomalies: %v\n\n",
		r.Sends, r.Acked, r.Unknown, r.UnknownInLog, r.Failed, r.Read, r.Polled, r.Commits, len(faults), r.counts())
	fmt.Fprintf(&b, "## Faults\n\n| at | lasted | fault |\n|---|---|---|\n")
	for _, f := range faults {
		fmt.Fprintf(&b, "| %v | %v | %s |\n", f.At.Truncate(time.Millisecond), f.Lasted.Truncate(time.Millisecond), f.What)
	}
	fmt.Fprintf(&b, "\n## Anomalies\n\n")
	if len(r.Anomalies) == 0 {
		fmt.Fprintf(&b, "none\n")
	}
	for _, a := range r.Anomalies {
		fmt.Fprintf(&b, "```\n%s```\n", a)
	}
	path := filepath.Join("out", name+".md")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", err
	}
	var hist strings.Builder
	for _, e := range h.snapshot() {
		hist.WriteString(e.String())
		hist.WriteByte('\n')
	}
	if err := os.WriteFile(filepath.Join("out", name+".history"), []byte(hist.String()), 0o644); err != nil {
		return "", err
	}
	return path, nil
}
