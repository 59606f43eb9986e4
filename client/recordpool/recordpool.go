// Package recordpool recycles client.Records for a loop that produces at a high rate: it hands them
// out in address order, a block at a time, and takes a block back once the promises of all its records
// have run. One Pool serves one producing goroutine:
//
//	pool := recordpool.New(func(r *client.Record, err error) { ... }) // r is reused once this returns
//	for ... {
//		r, promise := pool.Next()
//		r.Topic, r.Partition, r.Key, r.Value = "orders", -1, key, value // -1: the partitioner picks
//		p.Produce(ctx, r, promise)
//	}
//
// Why blocks: a producer at full speed has hundreds of thousands of records in flight (its buffer, 32
// MiB by default, holds about 300,000 records of 100 bytes), so a record whose promise has just run was
// last touched that many records ago and is no longer in the CPU caches. Given out again in the order
// the promises ran, which for keyed records is partition by partition rather than the order they were
// sent, every record missed the caches when it was filled, and the store that missed held up the
// producer's next atomic operation: together about 30 % of the CPU samples of `runnel bench produce
// --keys` (docs/performance.md, "Keyed records, and records handed out in address order"). Given out
// block by block in address order, filling them streams through memory, which the hardware
// prefetcher runs ahead of.
package recordpool

import (
	"sync"
	"sync/atomic"

	"github.com/runnel-io/runnel/client"
)

// BlockSize is how many records a block holds: 256 records of 136 bytes (on 64-bit machines), 34 KiB.
const BlockSize = 256

// block is BlockSize records handed out in order; pending counts those whose promise has not run yet.
type block struct {
	recs    [BlockSize]client.Record
	pending atomic.Int32
	promise func(*client.Record, error)
}

// Pool hands out Records to one producing goroutine (Next) and takes them back through the promises it
// gives with them, which may run on any goroutine. A Pool only ever grows by what is in flight: blocks
// come back to it, and it holds them until the next Next needs one. A Pool that is dropped, with
// records still in flight or a block half used, is left to the garbage collector.
type Pool struct {
	done func(*client.Record, error)
	cur  *block // the block Next hands out from; Next's alone
	next int    // index in cur of the next record
	// allocated counts the blocks made (Next's alone): what is in flight, in blocks, bounds it.
	allocated int

	mu   sync.Mutex
	free []*block // blocks whose records' promises have all run
}

// New returns a Pool whose promises call done(r, err) with each record's outcome, as
// client.Producer.Produce reports it; the record is reused once done returns, so done must not keep it.
// done may be nil, as Produce's promise may: the outcomes are then not looked at.
func New(done func(r *client.Record, err error)) *Pool {
	if done == nil {
		done = func(*client.Record, error) {}
	}
	return &Pool{done: done}
}

// Next returns a zeroed record and the promise to pass with it to Producer.Produce. Zeroed means
// Partition 0: set it to -1 for the producer's partitioner. The promise must be called exactly once,
// as Produce does: the record's block goes back to the Pool when every record of it has had its
// promise called. Records are zeroed here rather than when they come back, so that the clearing
// streams through the block with the filling; until then a free record keeps its last key and value
// reachable. Next must not be called from two goroutines at once.
func (p *Pool) Next() (*client.Record, func(*client.Record, error)) {
	if p.cur == nil || p.next == BlockSize {
		p.cur, p.next = p.take(), 0
	}
	r := &p.cur.recs[p.next]
	p.next++
	*r = client.Record{}
	return r, p.cur.promise
}

// take returns a block all of whose records are free, reused or new, with its pending count set.
func (p *Pool) take() *block {
	p.mu.Lock()
	var b *block
	if n := len(p.free); n > 0 {
		b, p.free = p.free[n-1], p.free[:n-1]
	}
	p.mu.Unlock()
	if b == nil {
		p.allocated++
		b = &block{}
		b.promise = func(r *client.Record, err error) {
			p.done(r, err)
			if b.pending.Add(-1) == 0 {
				p.put(b)
			}
		}
	}
	b.pending.Store(BlockSize)
	return b
}

func (p *Pool) put(b *block) {
	p.mu.Lock()
	p.free = append(p.free, b)
	p.mu.Unlock()
}
