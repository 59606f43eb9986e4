package batch

import (
	"bytes"
	"testing"
)

// Grow reserves room without changing what was appended: records appended within the reserved room
// allocate nothing, and the batch decodes as if Grow had not been called.
func TestBuilderGrow(t *testing.T) {
	var b Builder
	b.Append(1000, []byte("k0"), []byte("v0"), nil)
	b.Grow(64 << 10)
	if c := b.Cap(); c < 64<<10 {
		t.Fatalf("Cap %d after Grow(64 KiB)", c)
	}
	v := bytes.Repeat([]byte("x"), 100)
	i := 1
	if allocs := testing.AllocsPerRun(100, func() {
		b.Append(1000+int64(i), nil, v, []RecordHeader{{Key: "h", Value: []byte("1")}})
		i++
	}); allocs != 0 {
		t.Fatalf("Append within Grow's room allocated %v times", allocs)
	}
	var got []Record
	if err := DecodeRecords(b.Build(CompressionNone), func(r Record) error {
		got = append(got, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != i || string(got[0].Key) != "k0" || string(got[0].Value) != "v0" || !bytes.Equal(got[i-1].Value, v) ||
		got[i-1].Timestamp != 1000+int64(i-1) || len(got[1].Headers) != 1 {
		t.Fatalf("decoded %d records, first %+v, last %+v", len(got), got[0], got[len(got)-1])
	}
	// Grow on a zero Builder, and Grow(0), are fine.
	var z Builder
	z.Grow(0)
	if z.Size() != HeaderSize || z.Len() != 0 {
		t.Fatalf("zero Builder after Grow(0): size %d, len %d", z.Size(), z.Len())
	}
}

// A batch built in a fresh Builder up to 1 MiB, as a producer's first batches are: Append doubles the
// buffer rather than growing it by a quarter at a time.
func BenchmarkBuilderFreshBatch(b *testing.B) {
	v := bytes.Repeat([]byte("x"), 100)
	b.ReportAllocs()
	b.SetBytes(1 << 20)
	for b.Loop() {
		var bl Builder
		for i := 0; bl.Size() < 1<<20; i++ {
			bl.Append(int64(i), nil, v, nil)
		}
		bl.Build(CompressionNone)
	}
}
