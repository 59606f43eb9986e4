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
	// None now. Issue #6's aborted reads (read_committed readers saw records of aborted transactions)
	// came from the partition leader taking the first of a transaction's appends to COMPLETE as its
	// start: each append's callback runs on its own goroutine, so a later batch could stand for it,
	// and the LSO and the ABORT marker's first offset then left the earlier batch's records visible.
	// (TestQueueUnderFaults, seed 1, once found a group member at p1@1426 reading p1@0 next with no
	// rebalance: fetches carried no leader epoch, so the isolated old leader's OFFSET_OUT_OF_RANGE
	// reset it to earliest. Consumers now send the leader epoch (KIP-320) and refetch a position past
	// the log end after a metadata refresh.)
}

// faultEntry is one fault the nemesis applied, for the report.
type faultEntry struct {
	At, Lasted time.Duration
	Kind       string // the nemesis's name for it (isolate-leader, kill, latency, ...)
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
	// diskCrashes counts fill-disk faults after which the node had crashed instead of refusing
	// writes with KAFKA_STORAGE_ERROR (TestFillDisk).
	diskCrashes int
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

// run applies faults until stop is closed: each lasts 4-12 s, after 4-10 s of calm (2-5 s when
// cycling, so that a short run reaches every kind). kinds restricts the schedule to some of the fault
// kinds. Every fault is repaired before run returns.
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
		calm := time.Duration(4000+n.rng.IntN(6000)) * time.Millisecond
		if n.cycle {
			calm = time.Duration(2000+n.rng.IntN(3000)) * time.Millisecond
		}
		if !sleep(calm) {
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
		case "fill-disk":
			// A node whose data dir is a filesystem of its own (E2E_DISK=1): fill it, then delete the
			// file and restart the node, whether it crashed or refuses appends (a failed store does
			// until restart).
			var withDisk []int32
			for _, j := range n.fc.ids {
				if n.fc.hasDisk(j) {
					withDisk = append(withDisk, j)
				}
			}
			if len(withDisk) == 0 {
				continue
			}
			id := withDisk[n.rng.IntN(len(withDisk))]
			filled, err := n.fc.fillDisk(id)
			if err != nil {
				n.t.Errorf("fill-disk %d: %v", id, err)
			}
			what, repair = fmt.Sprintf("fill-disk %d (%d MiB, then free and restart)", id, filled>>20), func() {
				if err := n.fc.freeDisk(id); err != nil {
					n.t.Errorf("free disk %d: %v", id, err)
				}
				crashed := !n.fc.running(id)
				if !crashed {
					n.fc.kill(id)
				}
				n.fc.restart(id)
				n.fc.waitReady(60*time.Second, id)
				n.diskCrashes += map[bool]int{true: 1}[crashed]
			}
		case "pause":
			id := n.pick()
			n.fc.pause(id)
			what, repair = fmt.Sprintf("pause %d (SIGSTOP, SIGCONT)", id), func() { n.fc.resume(id) }
		}
		n.t.Logf("nemesis %8s: %s for %v", at.Truncate(time.Millisecond), what, lasts)
		sleep(lasts)
		repair()
		n.faults = append(n.faults, faultEntry{At: at, Lasted: time.Since(n.start) - at, Kind: kind, What: what})
		select {
		case <-stop:
			return
		default:
		}
	}
}

// runNemesis runs nem for duration, then heals the network and brings every node back (resumed or
// restarted) and ready.
func runNemesis(nem *nemesis, fc *faultCluster, duration time.Duration) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		nem.run(stop)
	}()
	time.Sleep(duration)
	close(stop)
	<-done
	fc.heal()
	for _, id := range fc.ids {
		fc.resume(id)
		if !fc.running(id) {
			fc.restart(id)
		}
	}
	fc.waitReady(60*time.Second, fc.ids...)
}

// shortKinds is the fixed order in which the short runs take the fault kinds. With seed 1 the
// 100 s queue run started the last of them (latency) 73 s in (2026-11-30, kills restarting in about
// 4 s); TestQueueUnderFaults fails if one is missing.
var shortKinds = []string{"isolate-leader", "kill-leader", "partition", "pause", "one-way", "kill", "latency"}

// failOn fails the test on every anomaly but the known ones, which it logs.
func failOn(t *testing.T, anomalies []anomaly) {
	for _, a := range anomalies {
		if why, known := knownAnomalies[a.Kind]; known {
			t.Logf("KNOWN PRODUCT ISSUE, not failing the test (%s):\n%s", why, a)
			continue
		}
		t.Errorf("%s", a)
	}
}

// startRunCluster starts the three nodes of a run. With E2E_DISK=1 (long runs as root) every node's
// data dir is a tmpfs of 512 MiB of its own and the nemesis also fills disks (fill-disk).
func startRunCluster(t *testing.T, nem func(*faultCluster) *nemesis) (*faultCluster, *nemesis) {
	fc := newFaultCluster(t, 3, 3)
	disks := os.Getenv("E2E_DISK") == "1"
	if disks {
		for _, id := range fc.ids {
			if err := fc.mountDisk(id, 512<<20); err != nil {
				t.Fatalf("E2E_DISK=1: %v", err)
			}
		}
	}
	for _, id := range fc.ids {
		fc.start(id)
	}
	fc.waitReady(60*time.Second, fc.ids...)
	n := nem(fc)
	if disks {
		n.kinds = append(n.kinds, "fill-disk")
	}
	return fc, n
}

// runQueueUnderFaults runs the queue workload for duration under the nemesis of seed and returns the
// verdict and the faults applied.
func runQueueUnderFaults(t *testing.T, seed uint64, duration time.Duration, cycle bool) (checkResult, []faultEntry, *history) {
	fc, nem := startRunCluster(t, func(fc *faultCluster) *nemesis { return newNemesis(t, fc, seed) })
	w := startQueue(t, fc.grpcAddrs(), "queue", 6, queueConfig{producers: 3, members: 2, interval: 15 * time.Millisecond, inFlight: 64})
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			w.close()
		}
	})
	if cycle {
		nem.cycle = true
		nem.kinds = shortKinds
	}
	runNemesis(nem, fc, duration)
	if nem.diskCrashes > 0 {
		t.Logf("KNOWN PRODUCT ISSUE disk-full-crash: %d fill-disk faults crashed their node (TestFillDisk)", nem.diskCrashes)
	}
	// Everything healed: let the workload go on a little on a whole cluster, stop the producers, let
	// the group catch up with the high watermarks (so never-read covers the whole log), then stop it
	// and read everything.
	time.Sleep(5 * time.Second)
	w.stopProducers()
	if err := w.catchUp(90 * time.Second); err != nil {
		t.Errorf("liveness: %v", err)
	}
	w.close()
	stopped = true
	if err := w.finalRead("final", 60*time.Second); err != nil {
		t.Fatalf("final read: %v", err)
	}
	events := w.h.snapshot()
	r := check(events)
	t.Logf("seed %d, %v: %d faults; %s", seed, duration, len(nem.faults), r.summary())
	failOn(t, r.Anomalies)
	return r, nem.faults, w.h
}

// txnRun is what runTxnUnderFaults found.
type txnRun struct {
	input             checkResult // the input topic checked as a queue
	txn               txnResult
	faults            []faultEntry
	copierKills, exit int
	readerRestarts    int
	h                 *history
}

// runTxnUnderFaults runs the transactional workload for duration under the nemesis of seed (node
// faults) and the workload's own copier kills, then checks the input as a queue (check) and the
// copies (checkTxn).
func runTxnUnderFaults(t *testing.T, seed uint64, duration time.Duration, cycle bool) txnRun {
	fc, nem := startRunCluster(t, func(fc *faultCluster) *nemesis { return newNemesis(t, fc, seed) })
	w := startTxn(t, fc.grpcAddrs(), "txn", 6, seed, txnConfig{inputProducers: 2, interval: 20 * time.Millisecond, copiers: 2, readers: 2,
		killEvery: [2]time.Duration{6 * time.Second, 10 * time.Second}, copierArgs: []string{"-txn-records", "50", "-work", "100ms"}})
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			w.stop()
		}
		if t.Failed() {
			for slot := 1; slot <= 2; slot++ {
				b, _ := os.ReadFile(filepath.Join(w.dir, fmt.Sprintf("copier-%d.log", slot)))
				t.Logf("---- copier %d log (tail) ----\n%s", slot, tailLines(string(b), 30))
			}
		}
	})
	if cycle {
		nem.cycle = true
		nem.kinds = shortKinds
	}
	runNemesis(nem, fc, duration)
	if nem.diskCrashes > 0 {
		t.Logf("KNOWN PRODUCT ISSUE disk-full-crash: %d fill-disk faults crashed their node (TestFillDisk)", nem.diskCrashes)
	}
	time.Sleep(5 * time.Second)
	err := w.finish(2 * time.Minute)
	stopped = true
	if err != nil {
		t.Errorf("liveness: %v", err)
	}
	events := w.h.snapshot()
	run := txnRun{input: check(events), txn: checkTxn(events), faults: nem.faults, copierKills: w.kills, exit: w.exits, readerRestarts: w.readerRestarts, h: w.h}
	t.Logf("seed %d, %v: %d faults, %d copier kills, %d copier exits; input: %s", seed, duration, len(nem.faults), w.kills, w.exits, run.input.summary())
	t.Logf("copies: %s", run.txn.summary())
	failOn(t, run.input.Anomalies)
	failOn(t, run.txn.Anomalies)
	return run
}

// TestQueueUnderFaults is the fixed-seed short schedule of `make test`: about 100 s of faults
// (isolation of the controller leader, partitions, one-way links, latency, kill -9 and restart,
// SIGSTOP) under the queue workload, then the checker: no acknowledged write lost, no duplicate, no
// reordering, readers agree, group members neither skip nor go back, and every record is received by
// a group member.
func TestQueueUnderFaults(t *testing.T) {
	r, faults, _ := runQueueUnderFaults(t, 1, 100*time.Second, true)
	applied := map[string]bool{}
	for _, f := range faults {
		applied[f.Kind] = true
	}
	for _, k := range shortKinds {
		if !applied[k] {
			t.Errorf("fault kind %s was never applied (%d faults in all): the short schedule no longer reaches it", k, len(faults))
		}
	}
	if r.Acked < 1000 {
		t.Errorf("only %d acknowledged writes: the workload hardly ran", r.Acked)
	}
}

// TestTxnUnderFaults is the fixed-seed short transactional schedule of `make test`: about 50 s of
// node faults (the first kinds of the short order: isolation of the controller leader, kill -9 of
// it, a partition, SIGSTOP, a one-way link) and copier kills under the consume–transform–produce
// workload, then checkTxn: no aborted or uncommitted record read read_committed, no torn or lost
// transaction, no duplicate or missing copy.
func TestTxnUnderFaults(t *testing.T) {
	run := runTxnUnderFaults(t, 1, 50*time.Second, true)
	if len(run.faults) < 2 {
		t.Errorf("only %d faults applied", len(run.faults))
	}
	if run.txn.Committed < 20 || run.txn.Copied < 1000 {
		t.Errorf("only %d committed transactions, %d records copied: the workload hardly ran", run.txn.Committed, run.txn.Copied)
	}
}

// longRun reads the knobs of `make e2e-long` (RUNNEL_E2E_LONG=1, E2E_SEED, E2E_DURATION,
// E2E_WORKLOAD: queue, txn or all) and skips the test unless it is on and workload is selected.
func longRun(t *testing.T, workload string) (seed uint64, duration time.Duration) {
	if os.Getenv("RUNNEL_E2E_LONG") == "" {
		t.Skip("make e2e-long runs it (RUNNEL_E2E_LONG=1)")
	}
	if w := os.Getenv("E2E_WORKLOAD"); w != "" && w != "all" && w != workload {
		t.Skipf("E2E_WORKLOAD=%s", w)
	}
	seed = uint64(time.Now().UnixNano())
	if s := os.Getenv("E2E_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("E2E_SEED=%q: %v", s, err)
		}
		seed = v
	}
	duration = 10 * time.Minute
	if s := os.Getenv("E2E_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("E2E_DURATION=%q: %v", s, err)
		}
		duration = d
	}
	return seed, duration
}

// TestQueueUnderFaultsLong is `make e2e-long SEED=... DURATION=...` (WORKLOAD=queue or all): the
// random schedule of SEED for DURATION under the queue workload, and a report in e2e/out/.
func TestQueueUnderFaultsLong(t *testing.T) {
	seed, duration := longRun(t, "queue")
	began := time.Now()
	r, faults, h := runQueueUnderFaults(t, seed, duration, false)
	path, err := writeReport(report{
		name: "queue", title: "Queue workload under faults", seed: seed, duration: duration, began: began,
		setup: "3 nodes (3 controller voters), topic of 6 partitions, RF 3, min.insync.replicas=2; 3 idempotent acks=all producers, a group of 2 members",
		figures: []string{
			fmt.Sprintf("operations (sends): %d", r.Sends), fmt.Sprintf("acknowledged: %d", r.Acked),
			fmt.Sprintf("unknown outcome: %d (%d of them found in the log)", r.Unknown, r.UnknownInLog), fmt.Sprintf("failed: %d", r.Failed),
			fmt.Sprintf("records read at the end: %d", r.Read), fmt.Sprintf("records polled by the group: %d, commits: %d", r.Polled, r.Commits),
			fmt.Sprintf("faults: %d", len(faults)), fmt.Sprintf("anomalies: %v", r.counts()),
		},
		faults: faults, anomalies: r.Anomalies, h: h,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report: %s", path)
}

// TestTxnUnderFaultsLong is `make e2e-long SEED=... DURATION=...` (WORKLOAD=txn or all): the random
// schedule of SEED for DURATION under the transactional workload, and a report in e2e/out/.
func TestTxnUnderFaultsLong(t *testing.T) {
	seed, duration := longRun(t, "txn")
	began := time.Now()
	run := runTxnUnderFaults(t, seed, duration, false)
	r, x := run.input, run.txn
	path, err := writeReport(report{
		name: "txn", title: "Transactional workload (consume–transform–produce) under faults", seed: seed, duration: duration, began: began,
		setup: "3 nodes (3 controller voters), input and output topics of 6 partitions, RF 3, min.insync.replicas=2; 2 idempotent acks=all input producers, " +
			"2 copier processes (read_committed group members, transactional producers, 50 records per transaction), killed with kill -9 every 6-16 s, 2 live read_committed readers",
		figures: []string{
			fmt.Sprintf("input sends: %d, acknowledged %d, unknown %d (%d in the log), failed %d", r.Sends, r.Acked, r.Unknown, r.UnknownInLog, r.Failed),
			fmt.Sprintf("input records in the log: %d, claimed copied by the group's offsets: %d, copied: %d", x.Inputs, x.Claimed, x.Copied),
			fmt.Sprintf("transactions: %d, committed %d, aborted %d, unknown %d; %d committed in the log", x.Txns, x.Committed, x.Aborted, x.Unknown, x.CommittedInLog),
			fmt.Sprintf("records read read_committed live: %d; final read_committed %d, read_uncommitted %d", x.LiveReads, x.FinalRC, x.FinalRU),
			fmt.Sprintf("copier kills: %d, copier exits: %d, live reader restarts: %d", run.copierKills, run.exit, run.readerRestarts),
			fmt.Sprintf("faults: %d", len(run.faults)), fmt.Sprintf("anomalies: input %v, copies %v", r.counts(), x.Counts),
		},
		faults: run.faults, anomalies: append(append([]anomaly(nil), r.Anomalies...), x.Anomalies...), h: run.h,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report: %s", path)
}

// report is one long run's report.
type report struct {
	name, title, setup string
	seed               uint64
	duration           time.Duration
	began              time.Time
	figures            []string
	faults             []faultEntry
	anomalies          []anomaly
	h                  *history
}

// writeReport writes the run's report (and its whole history next to it) to
// e2e/out/<name>-seed<seed>-<time>.md and .history.
func writeReport(rp report) (string, error) {
	if err := os.MkdirAll("out", 0o755); err != nil {
		return "", err
	}
	name := fmt.Sprintf("%s-seed%d-%s", rp.name, rp.seed, rp.began.Format("20060102-150405"))
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\nseed %d, fault schedule %v, started %s, took %v\n\n", rp.title, rp.seed, rp.duration, rp.began.Format(time.RFC3339), time.Since(rp.began).Truncate(time.Second))
	fmt.Fprintf(&b, "%s\n\n## Figures\n\n", rp.setup)
	for _, f := range rp.figures {
		fmt.Fprintf(&b, "- %s\n", f)
	}
	fmt.Fprintf(&b, "\n## Faults\n\n| at | lasted | fault |\n|---|---|---|\n")
	for _, f := range rp.faults {
		fmt.Fprintf(&b, "| %v | %v | %s |\n", f.At.Truncate(time.Millisecond), f.Lasted.Truncate(time.Millisecond), f.What)
	}
	fmt.Fprintf(&b, "\n## Anomalies\n\n")
	if len(rp.anomalies) == 0 {
		fmt.Fprintf(&b, "none\n")
	}
	for _, a := range rp.anomalies {
		fmt.Fprintf(&b, "```\n%s```\n", a)
	}
	path := filepath.Join("out", name+".md")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", err
	}
	var hist strings.Builder
	for _, e := range rp.h.snapshot() {
		hist.WriteString(e.String())
		hist.WriteByte('\n')
	}
	if err := os.WriteFile(filepath.Join("out", name+".history"), []byte(hist.String()), 0o644); err != nil {
		return "", err
	}
	return path, nil
}
