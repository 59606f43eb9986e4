package group

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"
)

// Limits on request fields, so no request can make the coordinator store or loop over unbounded data.
const (
	// MaxIDBytes caps group ids, member ids, instance ids and rack ids (bytes of UTF-8).
	MaxIDBytes = 255
	// MaxRegexBytes caps a subscription regular expression.
	MaxRegexBytes = 1024
	// MaxOwnedPartitions caps the partitions one heartbeat may list as owned.
	MaxOwnedPartitions = 100_000
	// MaxCommitPartitions caps the partitions of one offset commit or fetch.
	MaxCommitPartitions = 100_000
)

// Special member epochs of GroupHeartbeatRequest.member_epoch (KIP-848).
const (
	// JoinEpoch joins the group.
	JoinEpoch int32 = 0
	// LeaveEpoch leaves the group: the member has revoked everything it owned.
	LeaveEpoch int32 = -1
	// StaticLeaveEpoch leaves for now: a static member keeps its partitions reserved for its session
	// timeout, so a restart with the same instance id gets them back without a rebalance.
	StaticLeaveEpoch int32 = -2
	// AdminEpoch is the member epoch of commits made by tools rather than members (empty member id).
	AdminEpoch int32 = -1
)

// Config holds the group coordinator's settings, each named after the Kafka broker property it mirrors.
// Zero fields take the defaults of DefaultConfig, so Config{} is valid.
type Config struct {
	// HeartbeatInterval is the interval returned to members whose assignment is reconciled
	// (group.consumer.heartbeat.interval.ms, default 5s).
	HeartbeatInterval time.Duration
	// ReconcilingHeartbeatInterval is the interval returned to members that are still revoking or still
	// waiting for partitions other members must release (default 200ms): a joining member learns of its
	// partitions this soon after they are freed, instead of one HeartbeatInterval later. No Kafka
	// equivalent.
	ReconcilingHeartbeatInterval time.Duration
	// SessionTimeout is used when a member does not ask for one (group.consumer.session.timeout.ms,
	// default 45s): a member not heard from for this long is removed and its partitions freed.
	SessionTimeout time.Duration
	// MinSessionTimeout and MaxSessionTimeout bound the session timeouts members may ask for
	// (group.min.session.timeout.ms 6s, group.max.session.timeout.ms 30m); outside them a heartbeat
	// fails with INVALID_SESSION_TIMEOUT.
	MinSessionTimeout time.Duration
	MaxSessionTimeout time.Duration
	// RebalanceTimeout is used when a member does not ask for one (default 5m, the consumer's
	// max.poll.interval.ms): a member that has not revoked partitions this long after being asked is
	// removed. MaxRebalanceTimeout caps what members may ask for (default 30m; INVALID_REQUEST above).
	RebalanceTimeout    time.Duration
	MaxRebalanceTimeout time.Duration
	// MaxGroupSize caps the members of a group (group.consumer.max.size, default 1000); a join beyond it
	// fails with GROUP_MAX_SIZE_REACHED.
	MaxGroupSize int
	// MaxSubscribedTopics caps the topic names one member may subscribe to (default 1000; INVALID_REQUEST
	// above). No Kafka equivalent.
	MaxSubscribedTopics int
	// MaxOffsetMetadataBytes caps a committed offset's metadata (offset.metadata.max.bytes, default 4096;
	// OFFSET_METADATA_TOO_LARGE above).
	MaxOffsetMetadataBytes int
	// OffsetsRetention is how long a group may stay empty before it and its committed offsets are
	// deleted (offsets.retention.minutes, default 7 days). OffsetsRetentionCheckInterval is how often
	// that is checked (offsets.retention.check.interval.ms, default 10m).
	OffsetsRetention              time.Duration
	OffsetsRetentionCheckInterval time.Duration
	// OffsetsTopicPartitions is the partition count of __consumer_offsets when the broker creates it
	// (offsets.topic.num.partitions, default 50). A group's coordinator leads partition
	// PartitionFor(group, n). Used by the broker, not by the Coordinator.
	OffsetsTopicPartitions int32
	// TickInterval is how often the broker drives Coordinator.Tick, which enforces session and rebalance
	// timeouts and notices topic changes (default 100ms): timeouts fire up to this late. Used by the
	// broker, not by the Coordinator.
	TickInterval time.Duration
	// NewMemberID makes the ids of joining members that bring none (default: 128 random bits in hex).
	// Scenario tests set a deterministic one.
	NewMemberID func() string
}

// DefaultConfig returns the defaults described on Config.
func DefaultConfig() Config {
	return Config{
		HeartbeatInterval:             5 * time.Second,
		ReconcilingHeartbeatInterval:  200 * time.Millisecond,
		SessionTimeout:                45 * time.Second,
		MinSessionTimeout:             6 * time.Second,
		MaxSessionTimeout:             30 * time.Minute,
		RebalanceTimeout:              5 * time.Minute,
		MaxRebalanceTimeout:           30 * time.Minute,
		MaxGroupSize:                  1000,
		MaxSubscribedTopics:           1000,
		MaxOffsetMetadataBytes:        4096,
		OffsetsRetention:              10080 * time.Minute,
		OffsetsRetentionCheckInterval: 10 * time.Minute,
		OffsetsTopicPartitions:        50,
		TickInterval:                  100 * time.Millisecond,
		NewMemberID:                   randomMemberID,
	}
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	setDur := func(v *time.Duration, dv time.Duration) {
		if *v == 0 {
			*v = dv
		}
	}
	setDur(&c.HeartbeatInterval, d.HeartbeatInterval)
	setDur(&c.ReconcilingHeartbeatInterval, d.ReconcilingHeartbeatInterval)
	setDur(&c.SessionTimeout, d.SessionTimeout)
	setDur(&c.MinSessionTimeout, d.MinSessionTimeout)
	setDur(&c.MaxSessionTimeout, d.MaxSessionTimeout)
	setDur(&c.RebalanceTimeout, d.RebalanceTimeout)
	setDur(&c.MaxRebalanceTimeout, d.MaxRebalanceTimeout)
	setDur(&c.OffsetsRetention, d.OffsetsRetention)
	setDur(&c.OffsetsRetentionCheckInterval, d.OffsetsRetentionCheckInterval)
	setDur(&c.TickInterval, d.TickInterval)
	if c.MaxGroupSize == 0 {
		c.MaxGroupSize = d.MaxGroupSize
	}
	if c.MaxSubscribedTopics == 0 {
		c.MaxSubscribedTopics = d.MaxSubscribedTopics
	}
	if c.MaxOffsetMetadataBytes == 0 {
		c.MaxOffsetMetadataBytes = d.MaxOffsetMetadataBytes
	}
	if c.OffsetsTopicPartitions == 0 {
		c.OffsetsTopicPartitions = d.OffsetsTopicPartitions
	}
	if c.NewMemberID == nil {
		c.NewMemberID = d.NewMemberID
	}
	return c
}

// Validate reports the first inconsistent setting of c after WithDefaults.
func (c Config) Validate() error {
	c = c.WithDefaults()
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"heartbeat interval", c.HeartbeatInterval}, {"reconciling heartbeat interval", c.ReconcilingHeartbeatInterval},
		{"session timeout", c.SessionTimeout}, {"min session timeout", c.MinSessionTimeout},
		{"max session timeout", c.MaxSessionTimeout}, {"rebalance timeout", c.RebalanceTimeout},
		{"max rebalance timeout", c.MaxRebalanceTimeout}, {"offsets retention", c.OffsetsRetention},
		{"offsets retention check interval", c.OffsetsRetentionCheckInterval}, {"tick interval", c.TickInterval},
	} {
		if d.v < time.Millisecond {
			return fmt.Errorf("group config: %s %v must be at least 1ms", d.name, d.v)
		}
	}
	if c.MinSessionTimeout > c.SessionTimeout || c.SessionTimeout > c.MaxSessionTimeout {
		return fmt.Errorf("group config: session timeout %v must lie within [%v, %v]", c.SessionTimeout, c.MinSessionTimeout, c.MaxSessionTimeout)
	}
	if c.MaxSessionTimeout > time.Duration(1<<31-1)*time.Millisecond || c.MaxRebalanceTimeout > time.Duration(1<<31-1)*time.Millisecond {
		return fmt.Errorf("group config: timeouts must fit in int32 milliseconds")
	}
	if c.RebalanceTimeout > c.MaxRebalanceTimeout {
		return fmt.Errorf("group config: rebalance timeout %v is above the max %v", c.RebalanceTimeout, c.MaxRebalanceTimeout)
	}
	if c.HeartbeatInterval >= c.SessionTimeout {
		return fmt.Errorf("group config: heartbeat interval %v must be below the session timeout %v", c.HeartbeatInterval, c.SessionTimeout)
	}
	if c.MaxGroupSize < 1 || c.MaxSubscribedTopics < 1 || c.MaxOffsetMetadataBytes < 0 || c.OffsetsTopicPartitions < 1 {
		return fmt.Errorf("group config: max group size, max subscribed topics and offsets topic partitions must be positive, max metadata bytes 0 or more")
	}
	return nil
}

func randomMemberID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
