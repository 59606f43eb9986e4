package latency

import (
	"context"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"
)

func TestHistogramQuantilesWithinPrecision(t *testing.T) {
	var h Histogram
	rng := rand.New(rand.NewPCG(1, 2))
	vals := make([]time.Duration, 100000)
	for i := range vals {
		// log-uniform from 1µs to 10s
		vals[i] = time.Duration(float64(time.Microsecond) * pow10(rng.Float64()*7))
		h.Record(vals[i])
	}
	sort.Slice(vals, func(i, j int) bool { return vals[i] < vals[j] })
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999, 1} {
		rank := int(float64(len(vals))*q+0.999999) - 1
		want := vals[rank]
		got := h.Quantile(q)
		if got < want || float64(got) > float64(want)*(1+1.0/64)+1 {
			t.Errorf("q%.3f: got %v, want %v (at most 1/64 above)", q, got, want)
		}
	}
	if h.Count() != uint64(len(vals)) {
		t.Errorf("count %d, want %d", h.Count(), len(vals))
	}
	if h.Max() != vals[len(vals)-1] || h.Min() != vals[0] {
		t.Errorf("min/max %v/%v, want %v/%v", h.Min(), h.Max(), vals[0], vals[len(vals)-1])
	}
}

func pow10(x float64) float64 {
	r := 1.0
	for x >= 1 {
		r *= 10
		x--
	}
	// 10^x for x in [0,1) by a few terms of exp(x ln 10)
	y, term := 1.0, 1.0
	for k := 1; k < 30; k++ {
		term *= x * 2.302585092994046 / float64(k)
		y += term
	}
	return r * y
}

func TestBucketsAreContiguous(t *testing.T) {
	prev := int64(-1)
	for i := 0; i < numBuckets-1; i++ {
		hi := bucketHigh(i)
		if hi <= prev {
			t.Fatalf("bucket %d high %d not above previous %d", i, hi, prev)
		}
		if bucketOf(hi) != i || bucketOf(prev+1) != i {
			t.Fatalf("bucket %d: [%d, %d] maps to %d and %d", i, prev+1, hi, bucketOf(prev+1), bucketOf(hi))
		}
		prev = hi
	}
}

func TestHistogramEmptyAndNegative(t *testing.T) {
	var h Histogram
	if h.Quantile(0.99) != 0 || h.Max() != 0 || h.Mean() != 0 || h.Min() != 0 {
		t.Fatal("empty histogram should report zeros")
	}
	h.Record(-5)
	if h.Count() != 1 || h.Max() != 0 {
		t.Fatalf("negative duration should count as 0, got count %d max %v", h.Count(), h.Max())
	}
}

func TestHistogramConcurrentAndMerge(t *testing.T) {
	var a, b Histogram
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= 1000; i++ {
				a.Record(time.Duration(i) * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	b.Record(time.Hour)
	b.Merge(&a)
	if a.Count() != 8000 || b.Count() != 8001 {
		t.Fatalf("counts %d %d", a.Count(), b.Count())
	}
	if b.Max() != time.Hour || b.Min() != time.Microsecond {
		t.Fatalf("merged min/max %v %v", b.Min(), b.Max())
	}
	if p := a.Quantile(0.5); p < 500*time.Microsecond || p > 508*time.Microsecond {
		t.Fatalf("p50 %v", p)
	}
}

func TestScheduleAtAndDue(t *testing.T) {
	start := time.Unix(1000, 0)
	s := Schedule{Start: start, Rate: 3}
	if got := s.At(3); !got.Equal(start.Add(time.Second)) {
		t.Fatalf("At(3) = %v", got)
	}
	cases := []struct {
		after time.Duration
		want  int64
	}{{-time.Second, 0}, {0, 1}, {333 * time.Millisecond, 1}, {334 * time.Millisecond, 2}, {time.Second, 4}}
	for _, c := range cases {
		if got := s.Due(start.Add(c.after)); got != c.want {
			t.Errorf("Due(start%+v) = %d, want %d", c.after, got, c.want)
		}
	}
}

// fakeClock advances only when slept on or moved by the simulation.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time                           { return c.now }
func (c *fakeClock) Sleep(_ context.Context, d time.Duration) { c.now = c.now.Add(d) }

// server is a FIFO queue with a fixed service time that does nothing during one stall.
type server struct {
	free                  time.Time
	service               time.Duration
	stallFrom, stallUntil time.Time
}

// serve returns when a request arriving at t completes.
func (s *server) serve(t time.Time) time.Time {
	begin := t
	if s.free.After(begin) {
		begin = s.free
	}
	if !begin.Before(s.stallFrom) && begin.Before(s.stallUntil) {
		begin = s.stallUntil
	}
	s.free = begin.Add(s.service)
	return s.free
}

// TestCoordinatedOmissionCorrected drives a simulated system that stalls for 1 s in a 10 s run at
// 1000 records/s, from a generator that blocks while its request is outstanding (as a producer blocks
// when its buffer is full). Measured from the actual send time, the stall is one slow sample and p99
// looks healthy; measured from the schedule's intended time, every record that should have been sent
// during the stall is late, and p99 shows it.
func TestCoordinatedOmissionCorrected(t *testing.T) {
	start := time.Unix(0, 0)
	run := func(corrected bool) *Histogram {
		clk := &fakeClock{now: start}
		srv := &server{service: 100 * time.Microsecond, stallFrom: start.Add(5 * time.Second), stallUntil: start.Add(6 * time.Second)}
		p := &Pacer{S: Schedule{Start: start, Rate: 1000}, Clock: clk}
		rec := &Recorder{From: start.Add(time.Second), To: start.Add(10 * time.Second)}
		ctx := context.Background()
		for {
			_, intended, _ := p.Next(ctx)
			if !intended.Before(start.Add(10 * time.Second)) {
				break
			}
			sent := clk.Now()
			done := srv.serve(sent)
			clk.now = done // closed loop: the generator waits for the answer
			if corrected {
				rec.Record(intended, done)
			} else if !sent.Before(rec.From) && sent.Before(rec.To) {
				rec.H.Record(done.Sub(sent))
			}
		}
		return &rec.H
	}
	naive, fixed := run(false), run(true)
	if naive.Quantile(0.99) > time.Millisecond {
		t.Fatalf("naive p99 = %v: the simulation should hide the stall from it", naive.Quantile(0.99))
	}
	if naive.Max() < 900*time.Millisecond {
		t.Fatalf("naive max = %v: the one stalled request should still show", naive.Max())
	}
	if fixed.Count() != 9000 {
		t.Fatalf("corrected count %d, want every scheduled record of the 9 s window (9000)", fixed.Count())
	}
	// 1000 of 9000 records were due during the stall: about 11 % of them wait between 0 and 1 s.
	if p := fixed.Quantile(0.99); p < 800*time.Millisecond {
		t.Fatalf("corrected p99 = %v, want the stall to show (> 800ms)", p)
	}
	if p := fixed.Quantile(0.95); p < 400*time.Millisecond || p > 700*time.Millisecond {
		t.Fatalf("corrected p95 = %v, want about 550ms", p)
	}
	if p := fixed.Quantile(0.5); p > time.Millisecond {
		t.Fatalf("corrected p50 = %v, want the unaffected majority (<1ms)", p)
	}
}

func TestPacerNeverEarlyAndCatchesUp(t *testing.T) {
	start := time.Unix(0, 0)
	clk := &fakeClock{now: start}
	p := &Pacer{S: Schedule{Start: start, Rate: 100}, Clock: clk}
	ctx := context.Background()
	for k := 0; k < 3; k++ {
		i, from, ok := p.Next(ctx)
		if !ok || clk.Now().Before(from) || !from.Equal(p.S.At(i)) {
			t.Fatalf("record %d sent at %v, measured from %v, intended %v: without Early nothing is early", k, clk.Now(), from, p.S.At(i))
		}
	}
	clk.now = clk.now.Add(time.Second) // the generator was blocked for a second
	for k := 3; k < 103; k++ {
		before := clk.Now()
		i, intended, _ := p.Next(ctx)
		if i != int64(k) || !intended.Equal(start.Add(time.Duration(k)*10*time.Millisecond)) {
			t.Fatalf("record %d: index %d intended %v", k, i, intended)
		}
		if k < 102 && clk.Now() != before {
			t.Fatalf("record %d was overdue but the pacer slept", k)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	clk.now = start
	if _, _, ok := p.Next(cctx); ok {
		t.Fatal("Next should give up when ctx ended")
	}
}

// TestPacerEarly: with Early, records due within Early of the clock go out at once, measured from
// the clock's reading (their actual send), never from a later time; the pacer sleeps only for a record
// due further ahead, and never runs more than Early ahead of the schedule. Overdue records keep their
// intended time.
func TestPacerEarly(t *testing.T) {
	start := time.Unix(0, 0)
	clk := &sleepCounter{fakeClock: fakeClock{now: start}}
	const early = 100 * time.Microsecond
	p := &Pacer{S: Schedule{Start: start, Rate: 1e6}, Clock: clk, Early: early} // one record a microsecond
	ctx := context.Background()
	for k := 0; k < 5000; k++ {
		i, from, ok := p.Next(ctx)
		intended := start.Add(time.Duration(k) * time.Microsecond)
		if !ok || i != int64(k) {
			t.Fatalf("record %d: index %d ok %t", k, i, ok)
		}
		if from.After(intended) || from.After(clk.now) {
			t.Fatalf("record %d: measured from %v, after its intended time %v or its send %v", k, from, intended, clk.now)
		}
		if intended.Sub(from) > early {
			t.Fatalf("record %d measured from %v, more than Early before its intended time %v", k, from, intended)
		}
		if intended.Sub(clk.now) > early {
			t.Fatalf("record %d sent %v ahead of its time, more than Early", k, intended.Sub(clk.now))
		}
	}
	// 5,000 records over 5 ms at most Early ahead, waking Early/2 before a record is due: a sleep per
	// half Early's worth of records, not one each, and a clock reading per sleep, not per record.
	if clk.sleeps < 80 || clk.sleeps > 120 {
		t.Fatalf("%d sleeps for 5,000 records due 1 µs apart with Early %v, want about 100", clk.sleeps, early)
	}
	if clk.reads < clk.sleeps || clk.reads > 2*clk.sleeps+2 {
		t.Fatalf("%d clock readings for 5,000 records and %d sleeps, want one or two per sleep", clk.reads, clk.sleeps)
	}
	clk.now = clk.now.Add(time.Second) // blocked: the next records are overdue
	// Those due within Early of the last reading are measured from that reading, at most Early before
	// their time; the next are overdue by a new reading and keep their intended times.
	for k := 5000; k < 5300; k++ {
		_, from, _ := p.Next(ctx)
		intended := start.Add(time.Duration(k) * time.Microsecond)
		if from.After(intended) || intended.Sub(from) > early {
			t.Fatalf("overdue record %d measured from %v, want within Early before its intended %v", k, from, intended)
		}
		if k >= 5000+int(early/time.Microsecond) && !from.Equal(intended) {
			t.Fatalf("overdue record %d measured from %v, want its intended %v", k, from, intended)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, ok := p.Next(cctx); ok {
		t.Fatal("Next handed out an overdue record after ctx ended")
	}
}

// sleepCounter is a fakeClock that counts its sleeps and readings.
type sleepCounter struct {
	fakeClock
	sleeps, reads int
}

func (c *sleepCounter) Now() time.Time {
	c.reads++
	return c.fakeClock.Now()
}

func (c *sleepCounter) Sleep(ctx context.Context, d time.Duration) {
	c.sleeps++
	c.fakeClock.Sleep(ctx, d)
}

func TestRecorderWindow(t *testing.T) {
	t0 := time.Unix(100, 0)
	r := &Recorder{From: t0, To: t0.Add(time.Second)}
	if r.Record(t0.Add(-time.Nanosecond), t0) || r.Record(t0.Add(time.Second), t0.Add(2*time.Second)) {
		t.Fatal("records outside the window were kept")
	}
	if !r.Record(t0, t0.Add(3*time.Millisecond)) || r.H.Count() != 1 || r.H.Max() != 3*time.Millisecond {
		t.Fatal("record inside the window was lost")
	}
	s := r.H.Summary()
	if s.Count != 1 || s.MaxMs != 3 {
		t.Fatalf("summary %+v", s)
	}
}
