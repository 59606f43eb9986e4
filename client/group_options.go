package client

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Group consumer options. NewGroupConsumer takes GroupOptions: the ones below, and every
// ConsumerOption and shared Option (fetch sizes, timeouts, logger, ...), which mean what they mean for
// NewConsumer.

// GroupOption configures NewGroupConsumer.
type GroupOption interface{ applyGroup(*groupConfig) }

// PartitionsFunc is a rebalance callback (Kafka's ConsumerRebalanceListener, franz-go's
// OnPartitions*): it gets the consumer and the partitions concerned, sorted. It runs on the goroutine
// that called Poll (or Close), never concurrently with Poll's caller processing records, so it may
// commit (CommitSync) or Seek; it must not call Poll or Close. ctx ends when the consumer is closed.
type PartitionsFunc func(ctx context.Context, c *GroupConsumer, partitions []TopicPartition)

type groupConfig struct {
	consumer           consumerConfig
	instanceID         string
	rackID             string
	assignor           string
	sessionTimeout     time.Duration // 0: the broker's default
	rebalanceTimeout   time.Duration
	heartbeatInterval  time.Duration // 0: as the coordinator says
	autoCommit         bool
	autoCommitInterval time.Duration
	resetOffset        Offset
	onAssigned         PartitionsFunc
	onRevoked          PartitionsFunc
	onLost             PartitionsFunc
	errs               []error
}

func defaultGroupConfig() groupConfig {
	return groupConfig{
		consumer:           defaultConsumerConfig(),
		rebalanceTimeout:   5 * time.Minute,
		autoCommit:         true,
		autoCommitInterval: 5 * time.Second,
		resetOffset:        OffsetLatest(),
	}
}

// maxGroupTimeout is the largest session or rebalance timeout the wire carries (int32 milliseconds).
const maxGroupTimeout = time.Duration(1<<31-1) * time.Millisecond

func (c *groupConfig) validate() error {
	errs := []error{c.consumer.validate()}
	errs = append(errs, c.errs...)
	if len(c.instanceID) > 255 {
		errs = append(errs, fmt.Errorf("WithInstanceID: %d bytes, at most 255", len(c.instanceID)))
	}
	if len(c.rackID) > 255 {
		errs = append(errs, fmt.Errorf("WithRackID: %d bytes, at most 255", len(c.rackID)))
	}
	if c.sessionTimeout < 0 || c.sessionTimeout > maxGroupTimeout || (c.sessionTimeout > 0 && c.sessionTimeout < time.Millisecond) {
		errs = append(errs, fmt.Errorf("WithSessionTimeout(%v): must be 0 (the broker's default) or within [1ms, %v]", c.sessionTimeout, maxGroupTimeout))
	}
	if c.rebalanceTimeout < time.Millisecond || c.rebalanceTimeout > maxGroupTimeout {
		errs = append(errs, fmt.Errorf("WithRebalanceTimeout(%v): must be within [1ms, %v]", c.rebalanceTimeout, maxGroupTimeout))
	}
	if c.heartbeatInterval < 0 {
		errs = append(errs, fmt.Errorf("WithHeartbeatInterval(%v): must not be negative", c.heartbeatInterval))
	}
	if c.autoCommitInterval <= 0 {
		errs = append(errs, fmt.Errorf("WithAutoCommitInterval(%v): must be positive", c.autoCommitInterval))
	}
	if c.resetOffset.kind == offsetExact {
		errs = append(errs, fmt.Errorf("WithAutoOffsetReset(%v): want OffsetEarliest, OffsetLatest or OffsetAfterTime", c.resetOffset))
	}
	return errors.Join(errs...)
}

func newGroupConfig(opts []GroupOption) (groupConfig, error) {
	cfg := defaultGroupConfig()
	for _, o := range opts {
		if o == nil {
			cfg.errs = append(cfg.errs, errors.New("nil GroupOption"))
			continue
		}
		o.applyGroup(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return cfg, fmt.Errorf("client: invalid group consumer options: %w", err)
	}
	return cfg, nil
}

type groupOpt func(*groupConfig)

func (o groupOpt) applyGroup(c *groupConfig) { o(c) }

// WithInstanceID makes the member static: a consumer that closes and comes back with the same instance
// id within its session timeout gets the same partitions back, and the group does not rebalance
// meanwhile (KIP-345, carried over to KIP-848). Close then leaves with member epoch -2 ("back soon")
// instead of -1. Two live consumers with one instance id are refused: the second gets
// UNRELEASED_INSTANCE_ID from Poll, and so does a restart after a crash until the session timeout has
// removed the crashed incarnation. Default "" (a dynamic member). Kafka: group.instance.id.
func WithInstanceID(id string) GroupOption {
	return groupOpt(func(c *groupConfig) { c.instanceID = id })
}

// WithRackID tells the coordinator the member's rack, for rack-aware assignors. Default "". Kafka:
// client.rack.
func WithRackID(rack string) GroupOption {
	return groupOpt(func(c *groupConfig) { c.rackID = rack })
}

// WithGroupAssignor asks the coordinator for a server-side assignor: "uniform" (sticky, the broker's
// default) or "range"; the group uses the one most members ask for. An unknown name fails Poll with
// UNSUPPORTED_ASSIGNOR. Default "" (the broker's default). Kafka: group.remote.assignor (KIP-848).
func WithGroupAssignor(name string) GroupOption {
	return groupOpt(func(c *groupConfig) { c.assignor = name })
}

// WithSessionTimeout sets how long the coordinator waits without a heartbeat before it removes the
// member and gives its partitions to others; the member itself also drops its partitions (OnLost) when
// it has not reached the coordinator for this long, so two members never fetch one partition for
// long. It must lie within the broker's group.min.session.timeout.ms and
// group.max.session.timeout.ms (6s and 30m by default), else Poll fails with INVALID_SESSION_TIMEOUT.
// Default 0: the broker's group.consumer.session.timeout.ms (45s), assumed 45s on the client side.
// Kafka: session.timeout.ms.
func WithSessionTimeout(d time.Duration) GroupOption {
	return groupOpt(func(c *groupConfig) { c.sessionTimeout = d })
}

// WithRebalanceTimeout bounds how long the member may take to give up partitions it is asked to
// revoke: that happens in the next Poll (which commits and runs OnRevoked), so it is also the longest
// the application may spend between two Polls while the group rebalances. A member slower than this
// is removed from the group. At most 30m by default on the broker. Default 5m. Kafka:
// max.poll.interval.ms (which KIP-848 sends as the rebalance timeout).
func WithRebalanceTimeout(d time.Duration) GroupOption {
	return groupOpt(func(c *groupConfig) { c.rebalanceTimeout = d })
}

// WithHeartbeatInterval caps the time between heartbeats. Under KIP-848 the coordinator says when to
// heartbeat next (group.consumer.heartbeat.interval.ms, 5s by default, and faster while the member's
// assignment is moving); a lower cap makes the member notice rebalances sooner at the cost of more
// requests. Default 0: as the coordinator says. Kafka: heartbeat.interval.ms (of the classic
// protocol).
func WithHeartbeatInterval(d time.Duration) GroupOption {
	return groupOpt(func(c *groupConfig) { c.heartbeatInterval = d })
}

// WithAutoCommit turns automatic commits on or off. When on, the consumer commits, every auto-commit
// interval, on revocation and on Close, the offsets of the records it counts as processed: those
// returned by a Poll before the latest one (as Kafka, a record counts as processed once Poll is called
// again), and on Close every record returned. A crash therefore re-delivers at most the records since
// the last commit, and never skips one. Turn it off to commit yourself with CommitSync, CommitAsync
// or CommitOffsets (then also commit in OnRevoked, or the next owner re-reads from the last commit).
// Default true. Kafka: enable.auto.commit.
func WithAutoCommit(enabled bool) GroupOption {
	return groupOpt(func(c *groupConfig) { c.autoCommit = enabled })
}

// WithAutoCommitInterval sets how often automatic commits happen (checked in Poll). Default 5s.
// Kafka: auto.commit.interval.ms.
func WithAutoCommitInterval(d time.Duration) GroupOption {
	return groupOpt(func(c *groupConfig) { c.autoCommitInterval = d })
}

// WithAutoOffsetReset sets where a member starts reading a partition the group has no committed offset
// for, and where it goes when its position falls outside the log (OFFSET_OUT_OF_RANGE, after
// retention deleted the records): OffsetEarliest, OffsetLatest or OffsetAfterTime. Default
// OffsetLatest, as Kafka: a new group reads only records produced after it joined. Kafka:
// auto.offset.reset.
func WithAutoOffsetReset(o Offset) GroupOption {
	return groupOpt(func(c *groupConfig) { c.resetOffset = o })
}

// WithOnAssigned sets a callback run (in Poll) when partitions are assigned to the member, after their
// start positions are known and before any of their records is returned; Seek in it to start
// elsewhere. Default none. Kafka: ConsumerRebalanceListener.onPartitionsAssigned.
func WithOnAssigned(fn PartitionsFunc) GroupOption {
	return groupOpt(func(c *groupConfig) { c.onAssigned = fn })
}

// WithOnRevoked sets a callback run (in Poll, or Close) when partitions are taken from the member in a
// rebalance: no more of their records will be returned, and they go to another member only once the
// callback has returned, so commit in it what was processed. With auto-commit on, the processed
// offsets of those partitions are committed before the callback runs. Default none. Kafka:
// ConsumerRebalanceListener.onPartitionsRevoked.
func WithOnRevoked(fn PartitionsFunc) GroupOption {
	return groupOpt(func(c *groupConfig) { c.onRevoked = fn })
}

// WithOnLost sets a callback run (in Poll) when the member lost its partitions without a chance to
// commit: the coordinator fenced it (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID, after a session timeout)
// and they may already belong to another member, so committing is pointless. The member then rejoins.
// Default none. Kafka: ConsumerRebalanceListener.onPartitionsLost.
func WithOnLost(fn PartitionsFunc) GroupOption {
	return groupOpt(func(c *groupConfig) { c.onLost = fn })
}
