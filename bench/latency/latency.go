// Package latency records latency distributions for the benchmark harness, with coordinated omission
// corrected.
//
// A closed-loop load generator (send, wait for the answer, send the next) stops sending while the
// system under test stalls, so the requests that would have been sent during the stall are never
// measured: the generator "coordinates" with the system and omits exactly the bad samples (Gil
// Tene's coordinated omission). The harness avoids it the way wrk2 and HdrHistogram's corrected
// mode do: each record has an intended send time from a fixed Schedule (start + i/rate), the
// generator sends a record as soon as its time has come, however late it is, and the latency of a
// record is measured from its intended send time, not from the moment it was actually handed to the
// client (from a clock reading taken before its actual send when it was handed out early, see
// Pacer.Early). A stall then shows up as a ramp of large latencies for every record that should
// have gone out during it.
//
// Histogram is a log-linear histogram (as HdrHistogram with 2 significant digits): values are kept in
// buckets at most 1/64 (1.6 %) wide relative to their value, counts are atomic so producers and ack
// callbacks on any goroutine can record without a lock.
package latency

import (
	"context"
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

const (
	subBits    = 6 // 64 sub-buckets per power of two: relative error below 1/64
	subCount   = 1 << subBits
	maxExp     = 41 // values up to 2^47 ns (about 39 hours)
	numBuckets = (maxExp + 1) * subCount
)

// Histogram counts durations in log-linear buckets. The zero value is ready to use and safe for
// concurrent Record calls; reads (Quantile, Count, ...) may run concurrently but see a moving target.
type Histogram struct {
	counts [numBuckets]atomic.Uint64
	n      atomic.Uint64
	sum    atomic.Uint64 // ns, saturating is not needed within a benchmark's range
	max    atomic.Int64
	min    atomic.Int64 // stored as value+1 so that 0 means unset
}

// bucketOf returns the bucket index of v (ns, v >= 0).
func bucketOf(v int64) int {
	if v < subCount {
		return int(v)
	}
	exp := bits.Len64(uint64(v)) - subBits - 1 // v>>exp is in [64, 128)
	i := (exp+1)*subCount + int(v>>exp) - subCount
	if i >= numBuckets {
		return numBuckets - 1
	}
	return i
}

// bucketHigh returns the largest value that falls into bucket i.
func bucketHigh(i int) int64 {
	if i < subCount {
		return int64(i)
	}
	exp := i/subCount - 1
	sub := int64(i%subCount + subCount)
	return (sub+1)<<exp - 1
}

// Record adds one duration; negative durations count as 0.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[bucketOf(v)].Add(1)
	h.n.Add(1)
	h.sum.Add(uint64(v))
	for {
		m := h.max.Load()
		if v <= m || h.max.CompareAndSwap(m, v) {
			break
		}
	}
	for {
		m := h.min.Load()
		if (m != 0 && v+1 >= m) || h.min.CompareAndSwap(m, v+1) {
			break
		}
	}
}

// Count returns the number of values recorded.
func (h *Histogram) Count() uint64 { return h.n.Load() }

// Max returns the largest value recorded (exact), or 0.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max.Load()) }

// Min returns the smallest value recorded (exact), or 0.
func (h *Histogram) Min() time.Duration {
	if m := h.min.Load(); m > 0 {
		return time.Duration(m - 1)
	}
	return 0
}

// Mean returns the mean of the values recorded (exact), or 0.
func (h *Histogram) Mean() time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load() / n)
}

// Quantile returns the value at quantile q in [0, 1]: the highest value of the bucket holding the
// ceil(q*count)-th smallest value (at most 1.6 % above the true value, never above the maximum).
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(n)))
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			v := time.Duration(bucketHigh(i))
			if m := h.Max(); v > m {
				v = m
			}
			return v
		}
	}
	return h.Max()
}

// Merge adds every value of o to h.
func (h *Histogram) Merge(o *Histogram) {
	for i := range o.counts {
		if c := o.counts[i].Load(); c > 0 {
			h.counts[i].Add(c)
		}
	}
	h.n.Add(o.n.Load())
	h.sum.Add(o.sum.Load())
	if o.n.Load() > 0 {
		for {
			m := h.max.Load()
			if v := o.max.Load(); v <= m || h.max.CompareAndSwap(m, v) {
				break
			}
		}
		for {
			m, v := h.min.Load(), o.min.Load()
			if (m != 0 && v >= m) || h.min.CompareAndSwap(m, v) {
				break
			}
		}
	}
}

// Summary is a histogram's percentiles in milliseconds, as the report shows them.
type Summary struct {
	Count  uint64  `json:"count"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	MaxMs  float64 `json:"max_ms"`
	MeanMs float64 `json:"mean_ms"`
}

// Summary returns the percentiles of h.
func (h *Histogram) Summary() Summary {
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	return Summary{Count: h.Count(), P50Ms: ms(h.Quantile(0.5)), P99Ms: ms(h.Quantile(0.99)),
		P999Ms: ms(h.Quantile(0.999)), MaxMs: ms(h.Max()), MeanMs: ms(h.Mean())}
}

// Schedule is the constant-rate send plan of one open-loop generator: record i is due at
// Start + i/Rate. Several generators sharing a total rate each get Rate = total/n and a Start offset
// of k/total, so their records interleave evenly.
type Schedule struct {
	Start time.Time
	Rate  float64 // records per second, > 0
}

// At returns the intended send time of record i.
func (s Schedule) At(i int64) time.Time {
	return s.Start.Add(time.Duration(float64(i) * 1e9 / s.Rate))
}

// Due returns how many records (counting from 0) are due at now: the first index whose intended time is
// after now.
func (s Schedule) Due(now time.Time) int64 {
	el := now.Sub(s.Start)
	if el < 0 {
		return 0
	}
	n := int64(float64(el)*s.Rate/1e9) + 1
	// float rounding: make At(n-1) <= now < At(n)
	for n > 0 && s.At(n-1).After(now) {
		n--
	}
	for !s.At(n).After(now) {
		n++
	}
	return n
}

// Clock is the time source of a Pacer: the real clock in benchmarks, a fake one in tests.
type Clock interface {
	Now() time.Time
	Sleep(ctx context.Context, d time.Duration)
}

// RealClock is the wall clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// Sleep sleeps for d or until ctx ends.
func (RealClock) Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Pacer hands out the records of a Schedule as they become due. With Early 0 it never sends early:
// Next sleeps until record i is due. When the generator is late (the client blocked, the machine was
// busy) it returns the overdue records at once, each with its intended time, so the lateness is
// counted.
//
// A timer cannot sleep for less than tens of microseconds, and at a million records a second records
// are due a microsecond apart: sleeping for each record the generator was ahead of made it late, by
// milliseconds in bursts, and that lateness was counted as the system's. With Early > 0, a record due
// at most Early after the clock's reading is handed out at once, and its returned time is that
// reading, its actual send, so its latency runs from when it was sent and is never understated; the
// pacer sleeps only when the next record is due more than Early ahead, so it never runs more than
// Early ahead of the schedule, and it wakes Early/2 before the record is due, so a timer that
// overshoots by less than that makes no record late.
//
// Records due within Early of the last reading are handed out without reading the clock again, and
// are measured from that reading: it precedes both their actual send and their intended time, by at
// most Early, so their latency is overstated by at most Early (100 µs in bench/peers), never
// understated. A reading per record cost the
// harness about 65 ns on the 2-core machine of issue 9, taken from the CPUs the system under test
// uses, so a system paced at millions of records a second paid for it more than one paced at
// thousands.
//
// The Clock must not go backwards (RealClock's readings carry Go's monotonic clock): a record due
// before the last reading is taken as overdue without reading the clock again.
type Pacer struct {
	S     Schedule
	Clock Clock
	Early time.Duration // how far ahead of its intended time a record may be handed out; 0: never
	next  int64
	last  time.Time // the clock's last reading
}

// Next waits until the next record is due (or, with Early, until it is due within Early) and returns
// its index and the time its latency is measured from: the intended send time, or, for a record handed
// out early, the clock reading before it (at most Early before the intended time). ok is false when
// ctx ended first.
func (p *Pacer) Next(ctx context.Context) (i int64, from time.Time, ok bool) {
	intended := p.S.At(p.next)
	from = intended
	switch {
	case !intended.After(p.last): // overdue by the last reading: no need to read the clock
		if ctx.Err() != nil {
			return 0, time.Time{}, false
		}
	case !p.last.IsZero() && intended.Sub(p.last) <= p.Early:
		if ctx.Err() != nil {
			return 0, time.Time{}, false
		}
		from = p.last // due within Early of the last reading: handed out now, measured from that reading
	default: // perhaps not due yet: read the clock
		for {
			if ctx.Err() != nil {
				return 0, time.Time{}, false
			}
			p.last = p.Clock.Now()
			if !intended.After(p.last) {
				break
			}
			wait := intended.Sub(p.last)
			if wait <= p.Early {
				from = p.last
				break
			}
			p.Clock.Sleep(ctx, wait-p.Early/2)
		}
	}
	i = p.next
	p.next++
	return i, from, true
}

// Recorder measures latency from the time a Pacer gave a record (its intended send time, or its actual
// send when that was earlier) to completion, keeping only records whose time falls in the measurement
// window [From, To) (warm-up and wind-down excluded). A zero From or To leaves that side open.
type Recorder struct {
	H        Histogram
	From, To time.Time
}

// Record adds the latency of a record intended to be sent at intended and completed at done. It
// reports whether the record was inside the window.
func (r *Recorder) Record(intended, done time.Time) bool {
	if (!r.From.IsZero() && intended.Before(r.From)) || (!r.To.IsZero() && !intended.Before(r.To)) {
		return false
	}
	r.H.Record(done.Sub(intended))
	return true
}
