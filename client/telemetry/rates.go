package telemetry

import (
	"sync"
	"time"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// rateSlots is the number of one-minute buckets a partition keeps: the current minute and the five
// before it, which is what a five-minute rate needs when the oldest minute is weighted by its overlap.
const rateSlots = 6

// minuteMs is the bucket width in milliseconds.
const minuteMs = 60_000

// rateRing counts bytes and records per wall-clock minute for the last rateSlots minutes. Appends to one
// partition update it from the store's completion goroutines; a mutex costs ~20ns uncontended, far
// below the append it accounts for, and keeps a minute's reset and its first add together.
type rateRing struct {
	mu      sync.Mutex
	minute  [rateSlots]int64 // the minute (Unix ms / minuteMs) each slot counts
	bytes   [rateSlots]int64
	records [rateSlots]int64
}

// add counts an append of bytes and records at nowMs (Unix ms).
func (r *rateRing) add(nowMs, bytes, records int64) {
	m := nowMs / minuteMs
	i := m % rateSlots
	r.mu.Lock()
	if r.minute[i] != m {
		r.minute[i], r.bytes[i], r.records[i] = m, 0, 0
	}
	r.bytes[i] += bytes
	r.records[i] += records
	r.mu.Unlock()
}

// perMinute returns the counts of the current minute and the rateSlots-1 before it, newest first.
func (r *rateRing) perMinute(nowMs int64) (bytes, records [rateSlots]int64) {
	m := nowMs / minuteMs
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := int64(0); k < rateSlots; k++ {
		i := (m - k) % rateSlots
		if i < 0 {
			i += rateSlots
		}
		if r.minute[i] == m-k {
			bytes[k], records[k] = r.bytes[i], r.records[i]
		}
	}
	return bytes, records
}

// windowRate estimates a per-second rate over the last window (a whole number of minutes, at most
// rateSlots-1) from per-minute counts, newest first, at nowMs, counting since startMs. Sliding-window
// estimate: the current partial minute and the whole minutes after it count fully, the oldest minute by
// the fraction of it still inside the window. Within the first window after startMs every count is
// inside the window, and the rate divides by the time since startMs instead (at least one second, so a
// first burst does not read as a huge rate).
func windowRate(counts [rateSlots]int64, nowMs, startMs int64, minutes int) float64 {
	windowMs := int64(minutes) * minuteMs
	if elapsed := nowMs - startMs; elapsed < windowMs {
		var sum int64
		for k := 0; k <= minutes; k++ {
			sum += counts[k]
		}
		return float64(sum) / (float64(max(elapsed, 1000)) / 1000)
	}
	into := float64(nowMs%minuteMs) / minuteMs // fraction of the current minute gone
	sum := 0.0
	for k := 0; k < minutes; k++ {
		sum += float64(counts[k])
	}
	sum += float64(counts[minutes]) * (1 - into)
	return sum / (float64(windowMs) / 1000)
}

// stats returns the ring's numbers as PartitionStats at nowMs, counting since startMs, with totals.
func (r *rateRing) stats(nowMs, startMs, bytesTotal, recordsTotal int64) *runnelv1.PartitionStats {
	bytes, records := r.perMinute(nowMs)
	return &runnelv1.PartitionStats{
		LastMinute: &runnelv1.PartitionRate{BytesInPerSec: windowRate(bytes, nowMs, startMs, 1),
			RecordsInPerSec: windowRate(records, nowMs, startMs, 1)},
		LastFiveMinutes: &runnelv1.PartitionRate{BytesInPerSec: windowRate(bytes, nowMs, startMs, rateSlots-1),
			RecordsInPerSec: windowRate(records, nowMs, startMs, rateSlots-1)},
		BytesInPerMinute:   bytes[:],
		RecordsInPerMinute: records[:],
		BytesInTotal:       bytesTotal,
		RecordsInTotal:     recordsTotal,
		WindowMs:           min(nowMs-startMs, int64(rateSlots-1)*minuteMs),
	}
}

// nowMs is the clock of the rates; a variable so tests can drive minutes.
var nowMs = func() int64 { return time.Now().UnixMilli() }
