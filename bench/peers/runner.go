package main

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-io/runnel/bench/latency"
	"github.com/runnel-io/runnel/bench/report"
	"github.com/runnel-io/runnel/client"
)

// timing is how long the phases of a run last.
type timing struct {
	warmup  time.Duration // produce/latency runs: sent but not counted
	measure time.Duration // produce runs: the measurement window
	latency time.Duration // latency runs: the measurement window
	backlog int64         // consume runs: records in the backlog
	passes  int           // consume runs: how many times the backlog is read, each by a new consumer
	flush   time.Duration // the most a producer may take to finish after the window
}

// tally counts acknowledged records and bytes, errors, and latency, from AckFuncs on any goroutine.
type tally struct {
	acked, bytes, errs atomic.Int64
	firstErr           atomic.Pointer[error]
	rec                latency.Recorder
}

// latencyEvery is how many acks share one latency sample: the latency of the first ack and of every
// latencyEvery-th after it (in the order acks arrive, which has nothing to do with how long they took)
// is recorded, with a clock reading of its own, and the others are only counted. The clock reading and
// the histogram's atomic updates cost the harness 100-150 ns per record on the 2-core machine of issue
// 9, taken from the CPUs the system under test uses: a system paced at 1.8 M records/s paid about a
// quarter of a core for them, one paced at 70,000 nothing to speak of. Kafka's producer-perf-test
// samples its percentiles the same way. One in 8 leaves a paced run of 70,000 records/s over 8 s about
// 70,000 samples, 70 of them above its p99.9.
const latencyEvery = 8

func (t *tally) ack(intended time.Time, n int, err error) {
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return // records refused after the window closed
		}
		if t.errs.Add(1) == 1 {
			e := err // a copy, so that err itself does not escape: the success path then allocates nothing
			t.firstErr.Store(&e)
		}
		return
	}
	k := t.acked.Add(1)
	t.bytes.Add(int64(n))
	if k%latencyEvery == 1 { // the first ack, and every latencyEvery-th after it
		t.rec.Record(intended, time.Now())
	}
}

// receipts counts the records an e2e run's consumer receives and samples their end-to-end latency as
// tally samples acknowledgements: the first and every latencyEvery-th, from the intended send time
// stamped in the value's first 8 bytes (source.record) to a clock reading at receipt. A reading and a
// histogram update per record cost the harness's consumer as much as they cost its acknowledgements,
// at the rate of the system under test.
type receipts struct {
	consumed atomic.Int64
	rec      latency.Recorder
}

func (r *receipts) receive(value []byte) {
	if r.consumed.Add(1)%latencyEvery == 1 && len(value) >= 8 {
		r.rec.Record(time.Unix(0, int64(binary.BigEndian.Uint64(value))), time.Now())
	}
}

func (t *tally) errString() string {
	if e := t.firstErr.Load(); e != nil {
		return (*e).Error()
	}
	return ""
}

// source makes record keys and values: values are slices of a random buffer of lowercase letters
// (compressible about as well as text, as runnel bench's), keys come from the flight data.
type source struct {
	payload []byte
	keys    *flightKeys
}

func newSource(keys *flightKeys) *source {
	rng := rand.New(rand.NewPCG(1, 2))
	p := make([]byte, 8<<20)
	for i := range p {
		p[i] = 'a' + byte(rng.IntN(26))
	}
	return &source{payload: p, keys: keys}
}

// record returns the key (nil without keys), the partition the key maps to (Kafka's murmur2, as
// Runnel's default partitioner; -1 without keys) and a value of size bytes, for record i of producer
// w. With stamp, the value is a fresh copy whose first 8 bytes hold stamp (the time latency is measured
// from), for the end-to-end latency measured by the consumer.
func (s *source) record(w report.Workload, i, offset int, stamp time.Time) ([]byte, int32, []byte) {
	var key []byte
	part := int32(-1)
	if w.Keys {
		key = s.keys.at(offset + i)
		part = client.KeyPartition(key, int32(w.Partitions))
	}
	// Consecutive records take consecutive slices, as an application's values are freshly written
	// memory: slices at random offsets of the buffer missed the CPU caches twice per record, which
	// cost the harness more than its client library's whole produce path.
	off := ((offset + i) * w.Size) % (len(s.payload) - w.Size)
	v := s.payload[off : off+w.Size : off+w.Size]
	if !stamp.IsZero() && w.Size >= 8 {
		c := make([]byte, w.Size)
		copy(c, v)
		binary.BigEndian.PutUint64(c, uint64(stamp.UnixNano()))
		v = c
	}
	return key, part, v
}

func newProducers(ctx context.Context, d Driver, topic string, w report.Workload, ack AckFunc) ([]Producer, error) {
	ps := make([]Producer, 0, w.Producers)
	for i := 0; i < w.Producers; i++ {
		p, err := d.NewProducer(ctx, topic, w.Partitions, ack)
		if err != nil {
			for _, q := range ps {
				q.Close()
			}
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// finish flushes and closes the producers, waiting at most t.flush.
func finish(ps []Producer, t timing) error {
	ctx, cancel := context.WithTimeout(context.Background(), t.flush)
	defer cancel()
	var errs []error
	for _, p := range ps {
		if err := p.Flush(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range ps {
		p.Close()
	}
	return errors.Join(errs...)
}

// clockEvery is how many sends of a saturated run share one reading of the clock as their send time
// (runnel bench produce does the same): a reading costs about 40 ns on this kind of virtual machine,
// a tenth of the harness's time per record, and 16 sends take a few microseconds, against latencies
// of milliseconds when saturated.
const clockEvery = 16

// runProduce produces as fast as the system takes records, from w.Producers producers, and measures
// acknowledged records in the window after the warm-up.
func runProduce(ctx context.Context, d Driver, sys string, w report.Workload, topic string, src *source, t timing) report.Run {
	run := report.Run{Workload: w, System: sys, LatencyWhat: "send to ack, from the actual send (the clock read once per 16 sends; one ack in 8 sampled; saturated: mostly time queued in the client)"}
	if err := d.CreateTopic(ctx, topic, w.Partitions); err != nil {
		run.Error = "create: " + err.Error()
		return run
	}
	tl := &tally{}
	ps, err := newProducers(ctx, d, topic, w, tl.ack)
	if err != nil {
		run.Error = "producer: " + err.Error()
		return run
	}
	start := time.Now()
	tl.rec.From, tl.rec.To = start.Add(t.warmup), start.Add(t.warmup+t.measure)
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for k, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			offset := k * 7919
			var now time.Time
			for i := 0; sctx.Err() == nil; i++ {
				if i%clockEvery == 0 {
					now = time.Now()
				}
				key, part, v := src.record(w, i, offset, time.Time{})
				p.Send(sctx, part, key, v, now)
			}
		}()
	}
	r0, b0, t0 := snapshotAt(ctx, tl, tl.rec.From)
	r1, b1, t1 := snapshotAt(ctx, tl, tl.rec.To)
	stop()
	wg.Wait()
	ferr := finish(ps, t)
	fill(&run, r1-r0, b1-b0, t1.Sub(t0))
	s := tl.rec.H.Summary()
	run.Latency = &s
	run.Errors, run.Error = tl.errs.Load(), tl.errString()
	if ferr != nil && run.Error == "" {
		run.Error = "flush: " + ferr.Error()
	}
	if ctx.Err() != nil {
		run.Error = "interrupted"
	}
	return run
}

// snapshotAt waits until at and returns the counters then.
func snapshotAt(ctx context.Context, tl *tally, at time.Time) (int64, int64, time.Time) {
	latency.RealClock{}.Sleep(ctx, time.Until(at))
	return tl.acked.Load(), tl.bytes.Load(), time.Now()
}

func fill(run *report.Run, records, bytes int64, el time.Duration) {
	run.Records, run.Bytes, run.Seconds = records, bytes, el.Seconds()
	if el > 0 {
		run.RecordsPerSec = float64(records) / el.Seconds()
		run.MBPerSec = float64(bytes) / el.Seconds() / 1e6
	}
}

// runConsume fills topic with t.backlog records (as fast as the system takes them, not measured),
// then reads them all from the start t.passes times, each time with a new consumer, and reports the
// median pass (PassesPerSec lists them all).
func runConsume(ctx context.Context, d Driver, sys string, w report.Workload, topic string, src *source, t timing) report.Run {
	run := report.Run{Workload: w, System: sys}
	if err := d.CreateTopic(ctx, topic, w.Partitions); err != nil {
		run.Error = "create: " + err.Error()
		return run
	}
	tl := &tally{} // the fill is saturated, and its latency is not reported
	ps, err := newProducers(ctx, d, topic, w, tl.ack)
	if err != nil {
		run.Error = "producer: " + err.Error()
		return run
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var now time.Time
			for n := 0; ctx.Err() == nil; n++ {
				i := next.Add(1) - 1
				if i >= t.backlog {
					return
				}
				if n%clockEvery == 0 {
					now = time.Now()
				}
				key, part, v := src.record(w, int(i), 0, time.Time{})
				p.Send(ctx, part, key, v, now)
			}
		}()
	}
	wg.Wait()
	if err := finish(ps, timing{flush: 5 * time.Minute}); err != nil {
		run.Error = "fill: " + err.Error()
		return run
	}
	want := tl.acked.Load()
	if want == 0 {
		run.Error = "fill: nothing acknowledged: " + tl.errString()
		return run
	}
	var passes []consumePass
	for range max(t.passes, 1) { // a timing built without passes (tests) reads once
		cp, err := consumeAll(ctx, d, topic, w.Partitions, want)
		if err != nil {
			run.Error = err.Error()
			return run
		}
		passes = append(passes, cp)
		run.PassesPerSec = append(run.PassesPerSec, float64(want)/cp.elapsed.Seconds())
	}
	m := medianPass(passes)
	fill(&run, want, m.bytes, m.elapsed)
	return run
}

// consumePass is one reading of a consume run's backlog: its keys' and values' bytes and how long it
// took from the consumer's first call to its last record.
type consumePass struct {
	bytes   int64
	elapsed time.Duration
}

// medianPass returns the pass of median duration (of an even count, the slower of the two middle
// ones). One pass of a fast system lasts well under a second, which a hiccup of this VM (another
// tenant, the host reclaiming memory) can stretch by half or more: reading the same 3 M records
// three times in a row on one node took 7.9, 5.5 and 4.8 M records/s. The median of a few passes keeps
// such a hiccup out of the ratio, for every system alike.
func medianPass(ps []consumePass) consumePass {
	s := slices.SortedFunc(slices.Values(ps), func(a, b consumePass) int { return cmp.Compare(a.elapsed, b.elapsed) })
	return s[len(s)/2]
}

// consumeAll reads want records of topic from the start with a new consumer.
func consumeAll(ctx context.Context, d Driver, topic string, partitions int, want int64) (consumePass, error) {
	c, err := d.NewConsumer(ctx, topic, partitions)
	if err != nil {
		return consumePass{}, fmt.Errorf("consumer: %w", err)
	}
	defer c.Close()
	var n, bytes atomic.Int64
	done := make(chan struct{})
	var once sync.Once
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	start := time.Now()
	var end time.Time
	errc := make(chan error, 1)
	go func() {
		errc <- c.Run(cctx, func(key, value []byte) {
			bytes.Add(int64(len(key) + len(value)))
			if n.Add(1) == want {
				end = time.Now()
				once.Do(func() { close(done) })
			}
		})
	}()
	select {
	case <-done:
		cancel()
		<-errc
	case err := <-errc:
		if err == nil {
			err = fmt.Errorf("stopped after %d of %d records", n.Load(), want)
		}
		return consumePass{}, fmt.Errorf("consume: %w", err)
	}
	return consumePass{bytes: bytes.Load(), elapsed: end.Sub(start)}, nil
}

// pacerEarly is how far ahead of its intended time a paced record may be sent (latency.Pacer.Early),
// measured then from the pacer's clock reading before it (why: latency.Pacer). Every system is paced
// alike.
const pacerEarly = 100 * time.Microsecond

// runLatency paces w.Producers producers at rate records/s in total, each on its own schedule
// (their starts staggered so records interleave evenly); for an e2e workload one consumer reads
// along. Produce latency is ack time minus intended send time, end-to-end latency consumer receipt
// minus intended send time (for a record sent early, the clock reading before it, at most pacerEarly
// earlier): both corrected for coordinated omission, both sampled (latencyEvery).
func runLatency(ctx context.Context, d Driver, sys string, w report.Workload, topic string, src *source, rate float64, t timing) report.Run {
	run := report.Run{Workload: w, System: sys, TargetRate: rate,
		LatencyWhat: fmt.Sprintf("ack time minus intended send time (schedule-based, coordinated omission corrected; a record handed out up to %v early counts from the clock reading before it; one ack in 8 sampled, and one received record in 8 for e2e)", pacerEarly)}
	if rate <= 0 {
		run.Error = "no maximum throughput measured to pace at"
		return run
	}
	if err := d.CreateTopic(ctx, topic, w.Partitions); err != nil {
		run.Error = "create: " + err.Error()
		return run
	}
	tl := &tally{}
	e2e := &receipts{}
	withConsumer := w.Kind == report.KindEndToEnd
	cctx, cancelConsumer := context.WithCancel(ctx)
	defer cancelConsumer()
	cerr := make(chan error, 1)
	if withConsumer {
		c, err := d.NewConsumer(ctx, topic, w.Partitions)
		if err != nil {
			run.Error = "consumer: " + err.Error()
			return run
		}
		defer c.Close()
		go func() {
			cerr <- c.Run(cctx, func(_, value []byte) { e2e.receive(value) })
		}()
	} else {
		cerr <- nil
	}
	ps, err := newProducers(ctx, d, topic, w, tl.ack)
	if err != nil {
		run.Error = "producer: " + err.Error()
		return run
	}
	start := time.Now().Add(50 * time.Millisecond)
	tl.rec.From, tl.rec.To = start.Add(t.warmup), start.Add(t.warmup+t.latency)
	e2e.rec.From, e2e.rec.To = tl.rec.From, tl.rec.To
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	per := rate / float64(len(ps))
	for k, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pacer := &latency.Pacer{Clock: latency.RealClock{}, Early: pacerEarly,
				S: latency.Schedule{Start: start.Add(time.Duration(float64(k) / rate * 1e9)), Rate: per}}
			offset := k * 7919
			for {
				i, from, ok := pacer.Next(sctx) // from: the intended send time, or the reading before an early send
				if !ok || !from.Before(tl.rec.To) {
					return
				}
				// Only a consumer reads the stamp; stamping copies the value into a fresh buffer,
				// garbage at the paced rate (134 MB/s at 1.2 M records/s) whose collections the
				// harness's process would otherwise add to the latency of whatever system it drives.
				var stamp time.Time
				if withConsumer {
					stamp = from
				}
				key, part, v := src.record(w, int(i), offset, stamp)
				p.Send(sctx, part, key, v, from)
			}
		}()
	}
	r0, b0, t0 := snapshotAt(ctx, tl, tl.rec.From)
	r1, b1, t1 := snapshotAt(ctx, tl, tl.rec.To)
	wg.Wait() // the producers stop at the end of the schedule's window on their own
	stop()
	ferr := finish(ps, t)
	// Let the consumer catch up with everything acknowledged, for the end-to-end figures.
	deadline := time.Now().Add(30 * time.Second)
	for withConsumer && e2e.consumed.Load() < tl.acked.Load() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	cancelConsumer()
	if err := <-cerr; err != nil && run.Error == "" {
		run.Error = "consumer: " + err.Error()
	}
	fill(&run, r1-r0, b1-b0, t1.Sub(t0))
	s := tl.rec.H.Summary()
	run.Latency = &s
	if withConsumer {
		es := e2e.rec.H.Summary()
		run.EndToEnd = &es
	}
	run.Errors = tl.errs.Load()
	if e := tl.errString(); e != "" && run.Error == "" {
		run.Error = e
	}
	if ferr != nil && run.Error == "" {
		run.Error = "flush: " + ferr.Error()
	}
	return run
}
