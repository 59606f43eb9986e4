package batch

import (
	"bytes"
	"testing"
)

// BenchmarkAppendWithin is a producer's size work per record: the buffer bound (RecordSize) before the
// record's batch is known, then the record appended to its batch when it fits under the batch cap
// (1 MiB), a new batch started when it does not. 100-byte keyless values, as `runnel bench produce`.
func BenchmarkAppendWithin(b *testing.B) {
	const limit = 1 << 20
	var bl Builder
	bl.Reset()
	v := bytes.Repeat([]byte("x"), 100)
	bound := 0
	b.ReportAllocs()
	b.SetBytes(100)
	for i := 0; b.Loop(); i++ {
		bound += RecordSize(nil, v, nil)
		if _, ok := bl.AppendWithin(limit, int64(i), nil, v, nil); !ok {
			bl.Build(CompressionNone)
			bl.Reset()
			bl.Append(int64(i), nil, v, nil)
		}
	}
	if bound == 0 {
		b.Fatal("no bound")
	}
}
