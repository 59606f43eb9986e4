package main

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// histogram records durations in log-linear buckets, as HdrHistogram does with two significant
// digits: values below 128ns are exact, larger ones fall in one of 64 buckets per power of two, so a
// reported percentile is at most 1/64 (1.6%) above the true value. Recording is lock-free, so the
// producer's callbacks may record concurrently.
type histogram struct {
	counts [histBuckets]atomic.Uint64
	total  atomic.Uint64
	max    atomic.Int64
}

const (
	histSubBits = 7
	histSub     = 1 << histSubBits // 128 exact values, then 64 buckets per power of two
	histBuckets = histSub + (64-histSubBits)*histSub/2
)

// bucketOf maps a non-negative value to its bucket.
func bucketOf(v int64) int {
	if v < histSub {
		return int(max(v, 0))
	}
	e := bits.Len64(uint64(v)) - histSubBits // v>>e is in [64, 128)
	return histSub + (e-1)*histSub/2 + int(v>>e) - histSub/2
}

// bucketHigh is the largest value in bucket i.
func bucketHigh(i int) int64 {
	if i < histSub {
		return int64(i)
	}
	e := (i-histSub)/(histSub/2) + 1
	m := int64((i-histSub)%(histSub/2) + histSub/2)
	return (m+1)<<e - 1
}

// Record adds one duration.
func (h *histogram) Record(d time.Duration) {
	v := int64(d)
	h.counts[bucketOf(v)].Add(1)
	h.total.Add(1)
	for {
		m := h.max.Load()
		if v <= m || h.max.CompareAndSwap(m, v) {
			return
		}
	}
}

// Count is the number of values recorded.
func (h *histogram) Count() uint64 { return h.total.Load() }

// Max is the largest value recorded.
func (h *histogram) Max() time.Duration { return time.Duration(h.max.Load()) }

// Quantile returns the value at or below which a fraction q of the values lie (q in [0,1]), reported
// as its bucket's upper bound (never above Max). It is 0 when nothing was recorded.
func (h *histogram) Quantile(q float64) time.Duration {
	total := h.total.Load()
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	rank = min(max(rank, 1), total)
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			return time.Duration(min(bucketHigh(i), h.max.Load()))
		}
	}
	return h.Max()
}
