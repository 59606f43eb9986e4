package plog

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/runnel-io/runnel/client/batch"
)

// BenchmarkAppend measures group-committed acks=all appends of 16 KiB batches from many goroutines
// (16 per GOMAXPROCS) to 8 partitions, with and without fsync.
func BenchmarkAppend(b *testing.B) {
	const batchSize = 16 << 10
	for _, fsync := range []bool{false, true} {
		b.Run(fmt.Sprintf("fsync=%v", fsync), func(b *testing.B) {
			o := testOptions(b, fsync)
			o.MemTableSize = 16 << 20
			o.ValueLogFileSize = 256 << 20
			s := openStore(b, o)
			ps := make([]*Partition, 8)
			for i := range ps {
				ps[i] = mustPartition(b, s, PartitionID{TopicNum: 1, Partition: int32(i)})
			}
			template := makeBatch(b, batch.CompressionNone, rec{ts: 1, value: make([]byte, batchSize-80)})
			var next atomic.Int64
			b.SetBytes(int64(len(template)))
			b.SetParallelism(16)
			b.ReportAllocs()
			b.ResetTimer()
			groups0, fsyncs0 := s.groups.Load(), s.fsyncs.Load()
			b.RunParallel(func(pb *testing.PB) {
				p := ps[next.Add(1)%int64(len(ps))]
				for pb.Next() {
					// A fresh slice per append, as each produce request brings one: Append owns it.
					buf := append([]byte(nil), template...)
					if _, err := p.Append(context.Background(), buf, syncAppend); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			if g := s.groups.Load() - groups0; g > 0 {
				b.ReportMetric(float64(b.N)/float64(g), "appends/group")
			}
			if f := s.fsyncs.Load() - fsyncs0; f > 0 {
				b.ReportMetric(float64(b.N)/float64(f), "appends/fsync")
			}
		})
	}
}
