package plog

import (
	"sync"
	"testing"
	"time"
)

// TestCallbackRunnerBlockedCallback: a callback that blocks holds up neither the caller of run nor the
// callbacks run after it, as AppendAsync promises ("done may block or take the caller's locks").
func TestCallbackRunnerBlockedCallback(t *testing.T) {
	cr := newCallbackRunner()
	defer cr.stop()
	release := make(chan struct{})
	blocked := make(chan struct{})
	cr.run(func() { close(blocked); <-release })
	<-blocked
	// The blocked worker is the only one; the next callbacks need others, started or waiting.
	done := make(chan int, 100)
	for i := range 100 {
		cr.run(func() { done <- i })
	}
	seen := make(map[int]bool)
	for range 100 {
		select {
		case i := <-done:
			seen[i] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of 100 callbacks ran while one was blocked", len(seen))
		}
	}
	if len(seen) != 100 {
		t.Fatalf("%d distinct callbacks ran, want 100", len(seen))
	}
	close(release)
}

// TestCallbackRunnerIdleWorkers: after a burst of concurrent callbacks, maxIdleCallbackWorkers workers
// stay to wait for work (the rest end), later callbacks are run by them, and stop ends them.
func TestCallbackRunnerIdleWorkers(t *testing.T) {
	cr := newCallbackRunner()
	const burst = 3 * maxIdleCallbackWorkers
	release := make(chan struct{})
	var started, finished sync.WaitGroup
	started.Add(burst)
	finished.Add(burst)
	for range burst {
		cr.run(func() { started.Done(); <-release; finished.Done() })
	}
	started.Wait() // every callback of the burst runs at once: each on its own worker
	if n := cr.idle.Load(); n != 0 {
		t.Fatalf("%d workers idle while all run a callback", n)
	}
	close(release)
	finished.Wait()
	waitFor(t, 10*time.Second, "the burst's workers to settle", func() bool { return cr.idle.Load() == maxIdleCallbackWorkers })
	// Sequential callbacks are taken by the waiting workers, not by new goroutines: while one runs,
	// one worker fewer waits.
	for k := range 50 {
		idleDuring := make(chan int32, 1)
		cr.run(func() { idleDuring <- cr.idle.Load() })
		if n := <-idleDuring; n != maxIdleCallbackWorkers-1 {
			t.Fatalf("callback %d ran with %d workers waiting, want %d: it was not given to a waiting worker", k, n, maxIdleCallbackWorkers-1)
		}
		waitFor(t, 10*time.Second, "the worker to wait again", func() bool { return cr.idle.Load() == maxIdleCallbackWorkers })
	}
	cr.stop()
	waitFor(t, 10*time.Second, "stop to end the idle workers", func() bool { return cr.idle.Load() == 0 })
	ran := make(chan struct{})
	cr.run(func() { close(ran) })
	if !closedWithin(ran, 10*time.Second) {
		t.Fatal("a callback run after stop did not run")
	}
}
