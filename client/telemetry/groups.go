package telemetry

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// groupTracker turns observations of group epochs into rebalance counts and durations. The group
// coordinator's core is deterministic and reports nothing itself; its shell (broker/groups.go) tells
// the tracker a group's epoch and whether it is settled after every call that may change them
// (heartbeats, and timer ticks or topic changes that wrote something). Since every epoch bump happens in
// such a call, counting the differences between consecutive observations counts every bump.
type groupTracker struct {
	mu sync.Mutex
	m  map[string]*groupTrack
}

type groupTrack struct {
	epoch int32
	since time.Time // when the rebalance in progress began; zero when settled
	seen  time.Time // last observation, for retain
	attrs metric.MeasurementOption
}

// GroupLoaded tells the tracker about a group found when the coordinator loaded its state: its epoch is
// where counting starts, and a group not settled is rebalancing from now.
func (b *Broker) GroupLoaded(group string, epoch int32, settled bool, now time.Time) {
	if b == nil {
		return
	}
	b.groups.mu.Lock()
	defer b.groups.mu.Unlock()
	t := b.groups.track(group, now)
	t.epoch = epoch
	if !settled {
		t.since = now
	}
}

// GroupObserved tells the tracker a group's epoch and whether it is settled (stable or empty) after a
// call that may have changed them, at now. Bumps since the last observation count as rebalances; a
// group not seen before counts from epoch 0, and one whose epoch went down was deleted and created
// again, so it counts from 0 too. A rebalance lasts from the first bump of a settled group until it is
// settled again, when its duration is recorded.
func (b *Broker) GroupObserved(group string, epoch int32, settled bool, now time.Time) {
	if b == nil {
		return
	}
	b.groups.mu.Lock()
	defer b.groups.mu.Unlock()
	t := b.groups.track(group, now)
	bumps := epoch - t.epoch
	if epoch < t.epoch {
		bumps = epoch
	}
	t.epoch = epoch
	if bumps > 0 {
		b.rebalances.Add(context.Background(), int64(bumps), t.attrs)
		if t.since.IsZero() {
			t.since = now
		}
	}
	if settled && !t.since.IsZero() {
		b.rebalanceDur.Record(context.Background(), now.Sub(t.since).Seconds(), t.attrs)
		t.since = time.Time{}
	}
}

// GroupDeleted forgets a deleted group.
func (b *Broker) GroupDeleted(group string) {
	if b == nil {
		return
	}
	b.groups.mu.Lock()
	delete(b.groups.m, group)
	b.groups.mu.Unlock()
}

// track returns group's entry, creating it at epoch 0. Called with mu held.
func (g *groupTracker) track(group string, now time.Time) *groupTrack {
	if g.m == nil {
		g.m = map[string]*groupTrack{}
	}
	t := g.m[group]
	if t == nil {
		t = &groupTrack{attrs: metric.WithAttributeSet(attribute.NewSet(AttrGroup.String(group)))}
		g.m[group] = t
	}
	t.seen = now
	return t
}

// retain forgets groups that the coordinator no longer has (expired with their offsets) and that were
// not observed since before: groups observed after before may be new ones the scan missed.
func (g *groupTracker) retain(live map[string]bool, before time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for id, t := range g.m {
		if !live[id] && t.seen.Before(before) {
			delete(g.m, id)
		}
	}
}

// ISRChanged counts one ISR change of topic-partition made by this broker as leader: a shrink when
// the ISR lost members, else an expand.
func (b *Broker) ISRChanged(topic string, partition int32, shrink bool) {
	if b == nil {
		return
	}
	attrs := metric.WithAttributes(AttrTopic.String(topic), AttrPartition.String(partitionID(partition)))
	if shrink {
		b.isrShrinks.Add(context.Background(), 1, attrs)
	} else {
		b.isrExpands.Add(context.Background(), 1, attrs)
	}
}
