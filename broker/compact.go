package broker

import (
	"context"
	"errors"
	"time"

	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/broker/topiccfg"
)

// DefaultCompactionCheckInterval is how often the cleaner looks at compacted partitions when
// Config.CompactionCheckInterval is zero (Kafka's cleaner backs off 15 s when no log is due).
const DefaultCompactionCheckInterval = 15 * time.Second

// PartitionCompaction is the outcome of one partition's cleaner run.
type PartitionCompaction struct {
	Topic     string
	Partition int32
	Stats     plog.CompactStats
}

// startCompaction starts the cleaner loop, and a goroutine that cancels a running clean when Close
// closes b.stop, so Close does not wait for a long clean to finish. Both are in b.wg.
func (b *Broker) startCompaction() {
	ctx, cancel := context.WithCancel(context.Background())
	b.wg.Add(2)
	go func() {
		defer b.wg.Done()
		<-b.stop
		cancel()
	}()
	go func() {
		defer b.wg.Done()
		b.compactionLoop(ctx)
	}()
}

func (b *Broker) compactionLoop(ctx context.Context) {
	t := time.NewTicker(b.cfg.CompactionCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			b.Compact(ctx, now)
		}
	}
}

// Compact runs the log cleaner once over every partition of every topic whose cleanup.policy includes
// compact (plog.Partition.Compact: partitions that are not due return at once) and returns what each
// run did. Failures are logged and skip that partition; a cancelled ctx stops the pass. The cleaner
// loop calls it every CompactionCheckInterval; tests call it directly with their clock.
func (b *Broker) Compact(ctx context.Context, now time.Time) []PartitionCompaction {
	var out []PartitionCompaction
	for _, t := range b.md.Image().TopicList() {
		if !t.Config.Compact() {
			continue
		}
		for i, p := range b.localTopicLogs(t) {
			if p == nil {
				continue
			}
			cfg := compactConfig(t.Config)
			cfg.StableEnd = func() (int64, error) { return b.stableEnd(t, int32(i), p) }
			st, err := p.Compact(ctx, now, cfg)
			if ctx.Err() != nil {
				return out
			}
			if err != nil {
				if !errors.Is(err, plog.ErrPartitionDeleted) && !errors.Is(err, plog.ErrClosed) {
					b.log.Warn("log compaction failed", "topic", t.Name, "partition", i, "err", err)
				}
				continue
			}
			if st.Reason != "" {
				b.log.Debug("log compacted", "topic", t.Name, "partition", i, "reason", st.Reason,
					"dirty_ratio", st.DirtyRatio, "records_removed", st.RecordsRemoved,
					"batches_removed", st.BatchesRemoved, "bytes_removed", st.BytesRemoved)
			}
			out = append(out, PartitionCompaction{Topic: t.Name, Partition: int32(i), Stats: st})
		}
	}
	return out
}

// compactConfig is the cleaner's view of a topic config.
func compactConfig(c topiccfg.Config) plog.CompactConfig {
	return plog.CompactConfig{
		DeleteRetentionMs:      c.DeleteRetentionMs,
		MinCleanableDirtyRatio: c.MinCleanableDirtyRatio,
		MinCompactionLagMs:     c.MinCompactionLagMs,
		MaxCompactionLagMs:     c.MaxCompactionLagMs,
		SegmentMs:              c.RollMs(),
	}
}

// stableEnd is the cleaner's bound for a partition (plog.CompactConfig.StableEnd): the LSO. A leader
// of a topic producers write has it from its producer state; otherwise it is worked out from the log's
// tail each time (the cleaner asks only when the partition is due): the cached producer state belongs
// to leaderships and a follower's copy would go stale, and internal topics (__consumer_offsets, whose
// transactional offset commits the group coordinator writes itself) never pass through it.
func (b *Broker) stableEnd(t *meta.Topic, partition int32, l *plog.Partition) (int64, error) {
	if st, ok := t.Partition(partition); ok && st.Leader == b.cfg.NodeID && !t.Internal {
		return b.lastStableOffset(t, partition, l)
	}
	r, err := rebuildProducers(l)
	if err != nil {
		return -1, err
	}
	ps := producerState{ongoing: r.ongoing, completing: r.completing}
	return ps.lsoLocked(l.HighWatermark()), nil
}
