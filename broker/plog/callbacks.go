package plog

import "sync/atomic"

// maxIdleCallbackWorkers is how many callback workers may wait for work at once; a worker that finds
// this many waiting when it finishes a callback ends instead. Eight is more than a node's appends
// complete at once in the benchmarks (a group's appends complete one after another on the writer or
// syncer goroutine), so steady work reuses warm workers, while a burst of blocked callbacks does not
// leave hundreds of goroutines behind.
const maxIdleCallbackWorkers = 8

// callbackRunner runs AppendAsync's callbacks, each on a goroutine that runs nothing else meanwhile:
// an idle worker when one waits, else a new one. So a callback may block or take its caller's locks,
// as AppendAsync promises, without holding up the writer, the syncer or another callback.
//
// Why workers rather than a goroutine per callback: a callback answers a produce request, a call
// chain deep enough that a new goroutine's stack grew by copying on nearly every append: stack growth
// was 5.9 % of the node's CPU samples at 1.4 M records/s, where many small requests arrive, and 2.0 %
// with workers (docs/performance.md, "A goroutine per append"). A worker's stack has grown once;
// handing it a callback is one channel send to a waiting goroutine.
type callbackRunner struct {
	work chan func() // unbuffered: a send succeeds only when a worker is waiting in its receive
	idle atomic.Int32
	quit chan struct{} // closed by Store.Close: waiting workers end
}

func newCallbackRunner() *callbackRunner {
	return &callbackRunner{work: make(chan func()), quit: make(chan struct{})}
}

// run runs f on an idle worker, or on a new one when none waits.
func (cr *callbackRunner) run(f func()) {
	select {
	case cr.work <- f:
	default:
		go cr.worker(f)
	}
}

// worker runs f, then waits for more work until quit closes, unless maxIdleCallbackWorkers others
// wait already. Each worker ends by itself, so the Store that owns the runner only closes quit.
func (cr *callbackRunner) worker(f func()) {
	for {
		f()
		if cr.idle.Add(1) > maxIdleCallbackWorkers {
			cr.idle.Add(-1)
			return
		}
		select {
		case f = <-cr.work:
			cr.idle.Add(-1)
		case <-cr.quit:
			cr.idle.Add(-1)
			return
		}
	}
}

// stop ends the waiting workers; those running a callback end when it returns. A run after stop still
// runs its callback, on a new goroutine that then ends.
func (cr *callbackRunner) stop() { close(cr.quit) }
