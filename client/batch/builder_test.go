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

// AppendWithin appends exactly the records that keep the batch within its limit, with the size Append
// would give them, and leaves the Builder as it was (even after Build) when a record does not fit.
func TestBuilderAppendWithin(t *testing.T) {
	const limit = 4096
	recs := sampleRecords(300, 7)
	var w, ref Builder // w through AppendWithin; ref through RecordSize, Size and Append
	w.Reset()
	ref.Reset()
	var batches int
	var got []testRecord // the records of w's batches, as appended
	check := func() {
		t.Helper()
		if !bytes.Equal(w.Build(CompressionNone), ref.Build(CompressionNone)) {
			t.Fatalf("batch %d: AppendWithin built other bytes than Append", batches)
		}
		_, decoded := decodeAll(t, w.Build(CompressionNone))
		if len(decoded) != len(got) {
			t.Fatalf("batch %d: decoded %d records, appended %d", batches, len(decoded), len(got))
		}
		for i, d := range decoded {
			if d.Timestamp != got[i].ts || !sameBytes(d.Key, got[i].key) || !sameBytes(d.Value, got[i].value) || len(d.Headers) != len(got[i].headers) {
				t.Fatalf("batch %d record %d: decoded %+v, appended %+v", batches, i, d, got[i])
			}
		}
	}
	for i, r := range recs {
		want := ref.RecordSize(r.ts, r.key, r.value, r.headers)
		fits := ref.Size()+want <= limit
		before, n := w.Size(), w.Len()
		size, ok := w.AppendWithin(limit, r.ts, r.key, r.value, r.headers)
		if size != want || ok != fits {
			t.Fatalf("record %d: AppendWithin returned %d, %v; want %d, %v (batch of %d bytes)", i, size, ok, want, fits, before)
		}
		if !ok {
			if w.Size() != before || w.Len() != n {
				t.Fatalf("record %d did not fit yet the batch went from %d bytes, %d records to %d, %d", i, before, n, w.Size(), w.Len())
			}
			check()
			batches++
			// As a producer does: the record starts the next batch. After Build, the Builder counts as
			// empty, so it fits the limit if any record can.
			if size, ok := w.AppendWithin(HeaderSize+want, r.ts, r.key, r.value, r.headers); !ok || w.Len() != 1 || w.Size() != HeaderSize+size {
				t.Fatalf("record %d after Build: %v, %d records, %d bytes", i, ok, w.Len(), w.Size())
			}
			ref.Reset()
			ref.Append(r.ts, r.key, r.value, r.headers)
			got = append(got[:0], r)
			continue
		}
		ref.Append(r.ts, r.key, r.value, r.headers)
		got = append(got, r)
		if w.Size() != before+size || w.Len() != n+1 {
			t.Fatalf("record %d of %d bytes took the batch from %d bytes, %d records to %d, %d", i, size, before, n, w.Size(), w.Len())
		}
	}
	check()
	if batches < 3 {
		t.Fatalf("only %d full batches: the limit was not reached often enough to test it", batches)
	}

	// The limit is inclusive, and a record refused after Build leaves the built batch as it was.
	var b Builder
	v := bytes.Repeat([]byte("v"), 100)
	b.Append(1000, nil, v, nil)
	n := b.RecordSize(1001, []byte("k"), v, nil)
	if _, ok := b.AppendWithin(b.Size()+n-1, 1001, []byte("k"), v, nil); ok {
		t.Fatal("a record one byte over the limit was appended")
	}
	if _, ok := b.AppendWithin(b.Size()+n, 1001, []byte("k"), v, nil); !ok || b.Len() != 2 {
		t.Fatalf("a record exactly at the limit: appended %v, %d records", ok, b.Len())
	}
	built := bytes.Clone(b.Build(CompressionNone))
	if _, ok := b.AppendWithin(HeaderSize, 1002, nil, v, nil); ok {
		t.Fatal("a record was appended within a limit of an empty batch")
	}
	if !bytes.Equal(b.Build(CompressionNone), built) || b.Len() != 2 {
		t.Fatal("a refused record changed the built batch")
	}
	// A zero Builder is an empty batch too.
	var z Builder
	first := z.RecordSize(1, nil, v, nil)
	if size, ok := z.AppendWithin(HeaderSize, 1, nil, v, nil); ok || z.Size() != HeaderSize || z.Len() != 0 || size != first {
		t.Fatalf("zero Builder: %d, %v, %d bytes, %d records", size, ok, z.Size(), z.Len())
	}
	if size, ok := z.AppendWithin(HeaderSize+first, 1, nil, v, nil); !ok || z.Size() != HeaderSize+first || z.Len() != 1 || size != first {
		t.Fatalf("zero Builder, record at the limit: %d, %v, %d bytes, %d records", size, ok, z.Size(), z.Len())
	}
}
