package client

import (
	"testing"
)

// Finished batches are kept for reuse, with their buffers, unless the transport may still read them (a
// send not answered: produceCodec references the batch's bytes) or the pool already holds its share
// of the buffered-bytes cap; and a reused batch starts empty.
func TestBatchRecycling(t *testing.T) {
	h := newIdemHarness(t, WithMaxBufferedBytes(4<<20), WithBatchBytes(1<<20))
	p := h.p
	fill := func(b *pbatch, n int) {
		v := make([]byte, 1000)
		for range n {
			b.bld.Append(1, nil, v, nil)
			b.recs = append(b.recs, pending{r: &Record{}})
		}
		b.bytes = int64(n * 1000)
	}
	pooled := func() int {
		p.free.mu.Lock()
		defer p.free.mu.Unlock()
		return len(p.free.free)
	}

	// An answered batch is pooled and handed out again, empty but with its buffer.
	b := p.newBatch(h.pp)
	fill(b, 100)
	capBefore := b.bld.Cap()
	p.putBatch(b)
	if pooled() != 1 {
		t.Fatalf("%d batches pooled after an answered one finished, want 1", pooled())
	}
	again := p.newBatch(h.pp)
	if again != b || again.bld.Len() != 0 || len(again.recs) != 0 || again.bytes != 0 || again.wire != nil || again.bld.Cap() < capBefore {
		t.Fatalf("reused batch: same %v, %d records, %d pending, %d bytes, cap %d (was %d)",
			again == b, again.bld.Len(), len(again.recs), again.bytes, again.bld.Cap(), capBefore)
	}

	// A batch sent and never answered (its stream broke) is left to the garbage collector.
	fill(again, 10)
	again.unanswered.Add(1)
	p.putBatch(again)
	if pooled() != 0 {
		t.Fatal("a batch whose send was never answered was pooled")
	}

	// The pool keeps at most half the buffered-bytes cap of buffer capacity (here 2 MiB).
	var bs []*pbatch
	for range 8 {
		nb := p.newBatch(h.pp)
		fill(nb, 500) // about 512 KiB of buffer each
		bs = append(bs, nb)
	}
	for _, nb := range bs {
		p.putBatch(nb)
	}
	p.free.mu.Lock()
	held, n := p.free.bytes, len(p.free.free)
	p.free.mu.Unlock()
	if held > 2<<20 || n == 0 || n == len(bs) {
		t.Fatalf("pool holds %d batches, %d bytes of buffers, under a 2 MiB bound", n, held)
	}

	// A new batch's buffer is sized like the partition's last sealed batch.
	h.pp.mu.Lock()
	h.pp.lastSize = 300 << 10
	h.pp.mu.Unlock()
	p.free = batchPool{} // nothing to reuse: a fresh batch
	fresh := p.newBatch(h.pp)
	if c := fresh.bld.Cap(); c < 300<<10 {
		t.Fatalf("a fresh batch after one of 300 KiB has a %d-byte buffer", c)
	}
}
