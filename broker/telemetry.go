package broker

import (
	"time"

	"github.com/runnel-io/runnel/broker/group"
	"github.com/runnel-io/runnel/client/telemetry"
)

// This file connects the broker's state to its instrumentation (client/telemetry.Broker): what the
// metrics read at collection time, and what the group coordinator reports after calls that may move a
// group's epoch. The handlers call these at one line each; all of them do nothing when the broker is
// uninstrumented.

// storageStats reports Badger's file sizes and value-log GC passes at metric collection.
func (b *Broker) storageStats() telemetry.StorageStats {
	var s telemetry.StorageStats
	if lsm, vlog, err := b.store.DiskUsage(); err == nil {
		s.LSMBytes, s.VlogBytes = lsm, vlog
	}
	gc := b.store.ValueLogGCStats()
	s.GCRewritten, s.GCNothing, s.GCErrors = gc.Rewritten, gc.Nothing, gc.Errors
	return s
}

// observeGroup reports group id's epoch and state after a call of the core (s.mu held), for the
// rebalance metrics.
func (gc *GroupCoordinator) observeGroup(c *group.Coordinator, id string, now time.Time) {
	if gc.b.tel == nil {
		return
	}
	if st, ok := c.GroupStatus(id); ok {
		gc.b.tel.GroupObserved(id, st.Epoch, st.Settled, now)
	}
}

// observeShard reports every group of s (s.mu held): after loading (loaded: counting starts at their
// epochs), and after a timer tick or a topic change wrote records, since those may remove members or
// bump epochs of any group of the shard.
func (gc *GroupCoordinator) observeShard(s *groupShard, now time.Time, loaded bool) {
	if gc.b.tel == nil {
		return
	}
	s.core.EachGroup(func(id string, st group.Status) {
		if loaded {
			gc.b.tel.GroupLoaded(id, st.Epoch, st.Settled, now)
		} else {
			gc.b.tel.GroupObserved(id, st.Epoch, st.Settled, now)
		}
	})
}

// reportGroups reports every group's members and every committed offset's lag at metric collection.
// Each shard is copied under its lock and reported after, so a scrape holds up heartbeats only for
// the copy; lag is then taken against the high watermark of the moment.
func (gc *GroupCoordinator) reportGroups(o telemetry.GroupObserver) {
	type member struct {
		id string
		n  int
	}
	type commit struct {
		group, topic string
		partition    int32
		offset       int64
	}
	var groups []member
	var commits []commit
	for _, s := range gc.loadedShards() {
		groups, commits = groups[:0], commits[:0]
		s.read(func(c *group.Coordinator) {
			c.EachGroup(func(id string, st group.Status) { groups = append(groups, member{id, st.Members}) })
			c.EachCommitted(func(g, topic string, p int32, off int64) { commits = append(commits, commit{g, topic, p, off}) })
		})
		for _, g := range groups {
			o.Group(g.id, g.n)
		}
		for _, c := range commits {
			if _, p, err := gc.b.partition(c.topic, c.partition); err == nil {
				o.Lag(c.group, c.topic, c.partition, p.HighWatermark()-c.offset)
			}
		}
	}
}
