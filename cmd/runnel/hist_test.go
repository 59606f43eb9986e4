package main

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHistogramBuckets(t *testing.T) {
	prev := -1
	for _, v := range []int64{0, 1, 127, 128, 129, 255, 256, 1000, 1 << 20, 1<<40 + 12345, 1<<62 + 1} {
		b := bucketOf(v)
		if b < prev || b >= histBuckets {
			t.Fatalf("bucketOf(%d) = %d after %d (of %d)", v, b, prev, histBuckets)
		}
		prev = b
		if hi := bucketHigh(b); hi < v || float64(hi-v) > float64(v)/64+1 {
			t.Fatalf("bucketHigh(bucketOf(%d)) = %d: outside 1/64", v, hi)
		}
		if b > 0 && bucketHigh(b-1) >= v {
			t.Fatalf("value %d also fits bucket %d", v, b-1)
		}
	}
	if got := bucketOf(-5); got != 0 {
		t.Fatalf("negative values go to bucket 0, got %d", got)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	if h.Quantile(0.5) != 0 {
		t.Fatal("empty histogram: want 0")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	vals := make([]int64, 100000)
	for i := range vals {
		vals[i] = int64(rng.ExpFloat64() * float64(time.Millisecond))
		h.Record(time.Duration(vals[i]))
	}
	slices.Sort(vals)
	for _, q := range []float64{0.5, 0.99, 0.999, 1} {
		exact := vals[int(q*float64(len(vals)-1))]
		got := int64(h.Quantile(q))
		if got < exact || float64(got-exact) > float64(exact)/50 {
			t.Errorf("q%.3f: got %d, exact %d", q, got, exact)
		}
	}
	if h.Max() != time.Duration(vals[len(vals)-1]) || h.Count() != uint64(len(vals)) {
		t.Errorf("max %v count %d", h.Max(), h.Count())
	}
}
