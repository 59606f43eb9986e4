package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client"
)

// txnWorkload is the transactional workload of the fault-injection runs (consume–transform–produce,
// KIP-98/KIP-447): idempotent acks=all producers write unique values to an input topic (a
// queueWorkload without group members, so check() checks the input as a queue); copier processes
// (e2e/copier with -txn-header: a group member reading the input read_committed, a transactional
// producer writing one copy "IN_PARTITION/IN_OFFSET/LEN" per input record to the output partition of
// the same number and committing the input offsets in the same transaction) are started, killed with
// kill -9 on a seeded schedule and restarted by a supervisor; read_committed readers read the output
// during the run. The copiers are clients: they talk to the nodes directly, while the nodes' links go
// through the fault proxies. Everything goes into one history, which checkTxn checks.
type txnWorkload struct {
	t       testing.TB
	h       *history
	in      *queueWorkload
	brokers []string
	out     string
	parts   int32
	group   string
	dir     string
	args    []string // extra copier flags
	rng     *rand.Rand

	stopCopiers, stopReaders chan struct{}
	wgCopiers, wgReaders     sync.WaitGroup
	mu                       sync.Mutex
	procs                    map[int]*exec.Cmd // running copier of each slot
	kills, exits             int
	readerRestarts           int
}

// txnConfig sizes the workload.
type txnConfig struct {
	inputProducers int
	interval       time.Duration // between two sends of one input producer
	copiers        int
	readers        int
	killEvery      [2]time.Duration // a copier is killed every killEvery[0] + rand(killEvery[1]); 0: never
	copierArgs     []string
}

// startTxn creates name-in and name-out (partitions each, RF 3, min.insync.replicas=2) and starts the
// input producers, the copiers with their supervisors and killer (seeded by seed), and the readers.
func startTxn(t testing.TB, brokers []string, name string, partitions int32, seed uint64, cfg txnConfig) *txnWorkload {
	in := startQueue(t, brokers, name+"-in", partitions, queueConfig{producers: cfg.inputProducers, interval: cfg.interval, inFlight: 64})
	out := name + "-out"
	adm, err := client.NewAdmin(brokers, client.WithRequestTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, out, partitions, 3, map[string]string{"min.insync.replicas": "2"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "leaders of "+out, func() error {
		d, err := adm.DescribeTopic(ctx, out)
		if err != nil {
			return err
		}
		for _, p := range d.Partitions {
			if p.LeaderID < 0 {
				return fmt.Errorf("partition %d: no leader", p.Partition)
			}
		}
		return nil
	})
	w := &txnWorkload{t: t, h: in.h, in: in, brokers: brokers, out: out, parts: partitions, group: name + "-copiers", dir: t.TempDir(),
		args: cfg.copierArgs, rng: rand.New(rand.NewPCG(seed, seed^0x5bd1e995)), stopCopiers: make(chan struct{}), stopReaders: make(chan struct{}),
		procs: map[int]*exec.Cmd{}}
	for slot := 1; slot <= cfg.copiers; slot++ {
		w.wgCopiers.Add(1)
		go w.supervise(slot)
	}
	if cfg.killEvery[0] > 0 {
		w.wgCopiers.Add(1)
		go w.killer(cfg.killEvery)
	}
	for i := 1; i <= cfg.readers; i++ {
		w.wgReaders.Add(1)
		go w.read(fmt.Sprintf("r%d", i))
	}
	return w
}

// supervise runs the copier of slot until stopCopiers closes, starting it again whenever it ends
// (killed, fenced or failed), and turns its stdout ("txn begin|commit|abort|unknown NAME N [ERR]")
// into "txn" events of process c<slot>. A transaction begun and not ended when the process ends gets
// an unknown outcome.
func (w *txnWorkload) supervise(slot int) {
	defer w.wgCopiers.Done()
	proc := fmt.Sprintf("c%d", slot)
	for {
		select {
		case <-w.stopCopiers:
			return
		default:
		}
		logf, err := os.OpenFile(filepath.Join(w.dir, fmt.Sprintf("copier-%d.log", slot)), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			w.t.Errorf("%s: %v", proc, err)
			return
		}
		cmd := exec.Command(copierBin, append([]string{"-brokers", strings.Join(w.brokers, ","), "-group", w.group, "-in", w.in.topic, "-out", w.out,
			"-transactional-id", fmt.Sprintf("%s-%d", w.out, slot), "-txn-header"}, w.args...)...)
		cmd.Stderr = logf
		stdout, err := cmd.StdoutPipe()
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			logf.Close()
			w.t.Errorf("%s: start: %v", proc, err)
			return
		}
		w.mu.Lock()
		w.procs[slot] = cmd
		select {
		case <-w.stopCopiers: // stop signalled the copiers before this one started
			cmd.Process.Signal(syscall.SIGTERM)
		default:
		}
		w.mu.Unlock()
		open := map[string]int64{} // transactions begun, not ended
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			f := strings.SplitN(sc.Text(), " ", 5)
			if len(f) < 4 || f[0] != "txn" {
				continue
			}
			n, _ := strconv.ParseInt(f[3], 10, 64)
			e := event{Process: proc, F: "txn", Txn: f[2], Offset: n}
			if len(f) == 5 {
				e.Err = f[4]
			}
			switch f[1] {
			case "begin":
				e.Type = "invoke"
				open[e.Txn] = n
			case "commit":
				e.Type = "ok"
			case "abort":
				e.Type = "fail"
			default:
				e.Type = "info"
			}
			if e.Type != "invoke" {
				delete(open, e.Txn)
			}
			w.h.add(e)
		}
		err = cmd.Wait()
		logf.Close()
		w.mu.Lock()
		delete(w.procs, slot)
		w.exits++
		w.mu.Unlock()
		status := "exit 0"
		if err != nil {
			status = err.Error()
		}
		for name, n := range open {
			w.h.add(event{Process: proc, Type: "info", F: "txn", Txn: name, Offset: n, Err: "copier ended: " + status})
		}
		w.h.add(event{Process: proc, Type: "info", F: "exit", Err: status})
		select {
		case <-w.stopCopiers:
			return
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// killer kills a running copier with SIGKILL every every[0] + rand(every[1]) until stopCopiers
// closes; its supervisor starts it again (the new incarnation fences the old, KIP-98).
func (w *txnWorkload) killer(every [2]time.Duration) {
	defer w.wgCopiers.Done()
	for {
		d := every[0]
		if every[1] > 0 {
			d += time.Duration(w.rng.Int64N(int64(every[1])))
		}
		select {
		case <-w.stopCopiers:
			return
		case <-time.After(d):
		}
		w.mu.Lock()
		var slots []int
		for s := range w.procs {
			slots = append(slots, s)
		}
		if len(slots) > 0 {
			slices.Sort(slots) // map order is random; the seed picks among a sorted list
			slot := slots[w.rng.IntN(len(slots))]
			w.procs[slot].Process.Signal(syscall.SIGKILL)
			w.kills++
			w.h.add(event{Process: fmt.Sprintf("c%d", slot), Type: "info", F: "kill"})
		}
		w.mu.Unlock()
	}
}

// read is a live read_committed reader of every output partition from the start, until stopReaders
// closes. A consumer whose Poll fails is replaced by a new one from the next offsets.
func (w *txnWorkload) read(proc string) {
	defer w.wgReaders.Done()
	next := map[int32]int64{}
	for {
		cons, err := client.NewConsumer(w.brokers, client.WithIsolationLevel(client.ReadCommitted))
		if err != nil {
			w.t.Errorf("%s: %v", proc, err)
			return
		}
		for p := int32(0); p < w.parts; p++ {
			from := client.OffsetEarliest()
			if o, ok := next[p]; ok {
				from = client.OffsetAt(o)
			}
			if err := cons.Assign(w.out, p, from); err != nil {
				w.t.Errorf("%s: %v", proc, err)
				cons.Close()
				return
			}
		}
		for err == nil {
			select {
			case <-w.stopReaders:
				cons.Close()
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			var recs []*client.Record
			recs, err = cons.Poll(ctx)
			cancel()
			if errors.Is(err, context.DeadlineExceeded) {
				err = nil
			}
			for _, r := range recs {
				w.h.add(event{Process: proc, Type: "ok", F: "cread", Value: string(r.Value), Partition: r.Partition, Offset: r.Offset, Txn: txnHeader(r)})
				next[r.Partition] = r.Offset + 1
			}
		}
		cons.Close()
		w.mu.Lock()
		w.readerRestarts++
		w.mu.Unlock()
		select {
		case <-w.stopReaders:
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// txnHeader is the record's "txn" header (the copier's transaction name), "" when none.
func txnHeader(r *client.Record) string {
	for _, h := range r.Headers {
		if h.Key == "txn" {
			return string(h.Value)
		}
	}
	return ""
}

// finish ends the run on a healed cluster: the input producers stop, the copiers get up to catchUp
// to commit the whole input (recorded as "caught-up"), then they and the readers stop, the group's
// committed offsets are recorded ("group-offset"), and the input (final-in), the output
// read_committed (final-rc, once every transaction is complete) and read_uncommitted (final-ru) are
// read in full.
func (w *txnWorkload) finish(catchUp time.Duration) error {
	w.in.stopProducers()
	adm, err := client.NewAdmin(w.brokers, client.WithRequestTimeout(5*time.Second))
	if err != nil {
		return err
	}
	defer adm.Close()
	var caught error
	deadline := time.Now().Add(catchUp)
	for {
		caught = groupCaughtUp(adm, w.group, w.in.topic, w.parts)
		if caught == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if caught != nil {
		w.h.add(event{Process: "copiers", Type: "fail", F: "caught-up", Err: caught.Error()})
	} else {
		w.h.add(event{Process: "copiers", Type: "ok", F: "caught-up"})
	}
	w.stop()
	// The group's committed offsets: what the copiers claim to have copied.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		lags, err := adm.GroupLag(ctx, w.group)
		if err == nil {
			for _, l := range lags {
				if l.Topic == w.in.topic && l.Committed >= 0 {
					w.h.add(event{Process: "final-group", Type: "ok", F: "group-offset", Partition: l.Partition, Offset: l.Committed})
				}
			}
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("committed offsets of %s: %w", w.group, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := w.in.finalRead("final-in", 60*time.Second); err != nil {
		return fmt.Errorf("final read of the input: %w", err)
	}
	if err := w.finalReadOut("final-rc", "cread", client.ReadCommitted, 2*time.Minute); err != nil {
		return err
	}
	if err := w.finalReadOut("final-ru", "uread", client.ReadUncommitted, time.Minute); err != nil {
		return err
	}
	if caught != nil {
		return fmt.Errorf("the copiers did not copy the whole input within %v (the missing check covers what the group committed): %w", catchUp, caught)
	}
	return nil
}

// stop stops the copiers (SIGTERM), their killer and the readers, and waits for them.
func (w *txnWorkload) stop() {
	select {
	case <-w.stopCopiers:
	default:
		close(w.stopCopiers)
	}
	w.mu.Lock()
	for _, cmd := range w.procs {
		cmd.Process.Signal(syscall.SIGTERM)
	}
	w.mu.Unlock()
	done := make(chan struct{})
	go func() {
		w.wgCopiers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		w.mu.Lock()
		for _, cmd := range w.procs {
			cmd.Process.Kill()
		}
		w.mu.Unlock()
		<-done
	}
	select {
	case <-w.stopReaders:
	default:
		close(w.stopReaders)
	}
	w.wgReaders.Wait()
	w.in.close()
}

// finalReadOut reads every output partition from the start at isolation level iso until each
// position reaches the high watermark (read_committed: once every transaction is complete, the LSO
// is the HW), recording each record as an event f of process proc.
func (w *txnWorkload) finalReadOut(proc, f string, iso client.IsolationLevel, timeout time.Duration) error {
	cons, err := client.NewConsumer(w.brokers, client.WithIsolationLevel(iso))
	if err != nil {
		return err
	}
	defer cons.Close()
	for p := int32(0); p < w.parts; p++ {
		if err := cons.Assign(w.out, p, client.OffsetEarliest()); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		recs, err := cons.Poll(ctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			time.Sleep(200 * time.Millisecond)
		}
		for _, r := range recs {
			w.h.add(event{Process: proc, Type: "ok", F: f, Value: string(r.Value), Partition: r.Partition, Offset: r.Offset, Txn: txnHeader(r)})
		}
		done := true
		var left []string
		for p := int32(0); p < w.parts; p++ {
			hw, at := cons.HighWatermark(w.out, p), cons.Position(w.out, p)
			if hw < 0 || at < hw {
				done = false
				left = append(left, fmt.Sprintf("p%d at %d of %d", p, at, hw))
			}
		}
		if done && len(recs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: output not read to the high watermark within %v: %s", proc, timeout, strings.Join(left, ", "))
		}
	}
}
