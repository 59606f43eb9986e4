package client

import (
	"math/rand"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client/batch"
)

// fetchAnswer returns n bytes or more of 100-byte keyless records in batches of about batchBytes, at
// consecutive offsets from 0, as a broker answers a fetch, and how many records it holds.
func fetchAnswer(n, batchBytes int) ([]byte, int) {
	rnd := rand.New(rand.NewSource(1))
	val := make([]byte, 100)
	var out []byte
	var b batch.Builder
	off := int64(0)
	for len(out) < n {
		b.Reset()
		for b.Size() < batchBytes {
			for i := range val {
				val[i] = 'a' + byte(rnd.Intn(26))
			}
			b.Append(1700000000000+off, nil, val, nil)
		}
		bb := append([]byte(nil), b.Build(batch.CompressionNone)...)
		batch.SetBaseOffset(bb, off)
		off += int64(b.Len())
		out = append(out, bb...)
	}
	return out, int(off)
}

// BenchmarkConsumeDecode measures the consumer's CPU per record of a 1 MiB answer of 100-byte records
// (the fetcher's scan, then the decode a poll does): into records as Poll returns them, and into one
// reused Record as PollFunc does. cpu-ns/record counts the process's CPU time, the garbage collector's
// included, which on a shared machine is steadier than ns/op.
func BenchmarkConsumeDecode(b *testing.B) {
	ans, n := fetchAnswer(1<<20, 64<<10)
	b.Run("Poll", func(b *testing.B) {
		b.SetBytes(int64(len(ans)))
		b.ReportAllocs()
		cpu0 := cpuTime()
		for b.Loop() {
			recs, _, err := decodeFetched(ans, "t", 0, 0, nil)
			if err != nil || len(recs) != n {
				b.Fatal(err, len(recs), n)
			}
		}
		b.ReportMetric(float64(cpuTime()-cpu0)/float64(n*b.N), "cpu-ns/record")
	})
	b.Run("PollFunc", func(b *testing.B) {
		b.SetBytes(int64(len(ans)))
		b.ReportAllocs()
		cpu0 := cpuTime()
		var rec Record
		for b.Loop() {
			batches, count, next, err := scanFetched(ans, 0, nil)
			if err != nil {
				b.Fatal(err)
			}
			t := &taken{fp: &fetched{batches: batches, count: count, next: next}, mv: -1}
			got, _, err := decodeTake(t, func(br *batch.Record) {
				rec.Offset, rec.Timestamp = br.Offset, time.UnixMilli(br.Timestamp)
				rec.Key, rec.Value, rec.Headers, rec.LeaderEpoch = br.Key, br.Value, br.Headers, br.LeaderEpoch
			})
			if err != nil || got != n {
				b.Fatal(err, got, n)
			}
		}
		b.ReportMetric(float64(cpuTime()-cpu0)/float64(n*b.N), "cpu-ns/record")
	})
}

// cpuTime returns the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
