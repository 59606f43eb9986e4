package recordpool

import (
	"errors"
	"sync"
	"testing"
	"unsafe"

	"github.com/runnel-io/runnel/client"
)

// TestAddressOrder: a block's records are handed out one after the other in memory, all with the same
// promise, and the next block starts once the block is used up.
func TestAddressOrder(t *testing.T) {
	p := New(func(*client.Record, error) {})
	first, promise := p.Next()
	prev := first
	for i := 1; i < BlockSize; i++ {
		r, pr := p.Next()
		if uintptr(unsafe.Pointer(r)) != uintptr(unsafe.Pointer(prev))+unsafe.Sizeof(client.Record{}) {
			t.Fatalf("record %d at %p does not follow record %d at %p", i, r, i-1, prev)
		}
		if funcID(pr) != funcID(promise) {
			t.Fatalf("record %d has another promise than the block's first", i)
		}
		prev = r
	}
	next, pr := p.Next()
	if funcID(pr) == funcID(promise) {
		t.Fatal("the block after a full one has the same promise")
	}
	if next == first {
		t.Fatal("a block whose promises have not run was handed out again")
	}
}

// TestBlockComesBackWhenAllPromisesRan: a block is reused only once every one of its records' promises
// has run, each promise calls done with the record and the error first, and reused records are zeroed.
func TestBlockComesBackWhenAllPromisesRan(t *testing.T) {
	var got []*client.Record
	var errs []error
	p := New(func(r *client.Record, err error) {
		got = append(got, r)
		errs = append(errs, err)
	})
	a := make([]*client.Record, BlockSize)
	var promiseA func(*client.Record, error)
	for i := range a {
		a[i], promiseA = p.Next()
		a[i].Topic, a[i].Value, a[i].Offset = "t", []byte("v"), int64(i)
	}
	boom := errors.New("boom")
	for i := range BlockSize - 1 {
		promiseA(a[i], boom)
	}
	if len(got) != BlockSize-1 || got[3] != a[3] || !errors.Is(errs[3], boom) {
		t.Fatalf("done saw %d records (want %d), the fourth %p (want %p), err %v", len(got), BlockSize-1, got[3], a[3], errs[3])
	}
	// Block A still has a record in flight: the next block is a new one.
	b := make([]*client.Record, BlockSize)
	var promiseB func(*client.Record, error)
	for i := range b {
		b[i], promiseB = p.Next()
		if b[i] == a[0] {
			t.Fatal("block A handed out again with a promise still to run")
		}
	}
	promiseA(a[BlockSize-1], nil)
	for i := range BlockSize {
		promiseB(b[i], nil)
	}
	// Both blocks are free now; the one freed last (B) comes first, then A.
	r, _ := p.Next()
	if r != b[0] {
		t.Fatalf("got %p, want the first record of the block freed last, %p", r, b[0])
	}
	for range BlockSize - 1 {
		p.Next()
	}
	r, _ = p.Next()
	if r != a[0] {
		t.Fatalf("got %p, want the first record of block A, %p", r, a[0])
	}
	if r.Topic != "" || r.Value != nil || r.Offset != 0 {
		t.Fatalf("a reused record is not zeroed: %+v", *r)
	}
}

// TestConcurrentPromises: promises run on other goroutines than Next's, as a producer's answers come
// in; no record is handed out while its promise has not run, and every promise reaches done once.
func TestConcurrentPromises(t *testing.T) {
	const n = 200_000
	var (
		mu    sync.Mutex
		inUse = map[*client.Record]int64{} // the Offset each record in flight was sent with; -1: free
		done  int
	)
	p := New(func(r *client.Record, err error) {
		mu.Lock()
		want, ok := inUse[r]
		inUse[r] = -1
		done++
		mu.Unlock()
		// Read after the bookkeeping, as a promise's caller reads the record last: a block given back
		// before done returns would let Next zero or refill the record meanwhile.
		if !ok || want < 0 || r.Offset != want {
			t.Errorf("promise of %p with offset %d: in flight %v with offset %d", r, r.Offset, ok, want)
		}
	})
	type sent struct {
		r       *client.Record
		promise func(*client.Record, error)
	}
	work := make(chan []sent, 64)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range work {
				for i := len(batch) - 1; i >= 0; i-- { // out of order, as answers to other partitions
					batch[i].promise(batch[i].r, nil)
				}
			}
		}()
	}
	var batch []sent
	for i := range n {
		r, promise := p.Next()
		mu.Lock()
		if off, ok := inUse[r]; ok && off >= 0 {
			mu.Unlock()
			t.Fatalf("record %d: %p handed out while its promise for offset %d has not run", i, r, off)
		}
		inUse[r] = int64(i)
		mu.Unlock()
		r.Offset = int64(i)
		batch = append(batch, sent{r, promise})
		if len(batch) == 100 {
			work <- batch
			batch = nil
		}
	}
	work <- batch
	close(work)
	wg.Wait()
	if done != n {
		t.Fatalf("done ran %d times, want %d", done, n)
	}
	// At most 64 batches of 100 records wait in the channel and 3 more are being answered: about 26
	// blocks in flight. Blocks that never came back would make the pool allocate about n/BlockSize.
	if p.allocated > 40 {
		t.Fatalf("%d blocks allocated for %d records with at most about 6,700 in flight", p.allocated, n)
	}
}

// TestBlockReusedAgain: a block goes round more than once; each reuse starts its count of promises
// afresh.
func TestBlockReusedAgain(t *testing.T) {
	p := New(func(*client.Record, error) {})
	var first *client.Record
	for round := range 5 {
		recs := make([]*client.Record, BlockSize)
		var promise func(*client.Record, error)
		for i := range recs {
			recs[i], promise = p.Next()
		}
		if round == 0 {
			first = recs[0]
		} else if recs[0] != first {
			t.Fatalf("round %d: got block at %p, want the one block freed each round, at %p", round, recs[0], first)
		}
		for _, r := range recs {
			promise(r, nil)
		}
	}
	if p.allocated != 1 {
		t.Fatalf("%d blocks allocated for five rounds of one block each", p.allocated)
	}
}

// funcID tells promises apart: two closures over different blocks have different contexts.
func funcID(f func(*client.Record, error)) uintptr {
	return *(*uintptr)(unsafe.Pointer(&f))
}

// TestNilDone: as Produce's promise may be nil, so may done; the records still come back.
func TestNilDone(t *testing.T) {
	p := New(nil)
	recs := make([]*client.Record, BlockSize)
	var promise func(*client.Record, error)
	for i := range recs {
		recs[i], promise = p.Next()
	}
	for _, r := range recs {
		promise(r, errors.New("failed"))
	}
	if r, _ := p.Next(); r != recs[0] {
		t.Fatalf("got %p after every promise ran, want the block back (%p)", r, recs[0])
	}
}
