package main

import (
	"testing"
	"time"
)

// TestBenchPacerCorrectsCoordinatedOmission: a paced producer's records are stamped with the time the
// schedule meant to send them, interleaved between producers; one that is early waits for that time,
// one that fell behind (a stall) sends at once and keeps the schedule's stamps, so the stall counts
// in every overdue record's latency instead of vanishing from the measurement.
func TestBenchPacerCorrectsCoordinatedOmission(t *testing.T) {
	start := time.Unix(1000, 0)
	clock := start
	var slept time.Duration
	// Producer 1 of 2 at 1,000 records/s in total: its records are due 2 ms apart, from 1 ms.
	bp := newBenchPacer(start, 1, 2, 1000)
	bp.clock = func() time.Time { return clock }
	bp.sleep = func(d time.Duration) { slept += d; clock = clock.Add(d) }

	stamp, after := bp.next(0, clock)
	if want := start.Add(time.Millisecond); !stamp.Equal(want) || !after.Equal(want) || slept != time.Millisecond {
		t.Fatalf("record 0: stamp %v after %v slept %v; want both at %v after a 1ms wait", stamp.Sub(start), after.Sub(start), slept, want.Sub(start))
	}
	// The producer stalls for 100 ms after record 0: records 1 to 49 are overdue.
	clock = clock.Add(100 * time.Millisecond)
	slept = 0
	for i := 1; i < 50; i++ {
		stamp, after = bp.next(i, clock)
		if want := start.Add(time.Duration(1+2*i) * time.Millisecond); !stamp.Equal(want) {
			t.Fatalf("overdue record %d stamped %v, want its due time %v", i, stamp.Sub(start), want.Sub(start))
		}
		if !after.Equal(clock) {
			t.Fatalf("overdue record %d: clock moved to %v", i, after.Sub(start))
		}
	}
	if slept != 0 {
		t.Fatalf("an overdue producer slept %v", slept)
	}
	// Caught up again: record 51 is due at 103 ms, 2 ms after the clock.
	if stamp, _ = bp.next(51, clock); !stamp.Equal(start.Add(103*time.Millisecond)) || slept != 2*time.Millisecond {
		t.Fatalf("record 51 stamped %v after sleeping %v; want 103ms after 2ms", stamp.Sub(start), slept)
	}
	if newBenchPacer(start, 0, 1, 0) != nil {
		t.Fatal("an unpaced run got a pacer")
	}
}
