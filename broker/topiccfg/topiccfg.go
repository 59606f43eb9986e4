// Package topiccfg defines the per-topic configs Runnel understands, with Kafka's names, defaults and
// validation rules, and the Kafka rules for topic names.
//
// Configs travel as strings (as in Kafka's AlterConfigs) and are parsed once into Config when a topic is
// created or altered, so the produce and fetch paths read typed fields.
package topiccfg

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// Config names.
const (
	RetentionMs          = "retention.ms"
	RetentionBytes       = "retention.bytes"
	MaxMessageBytes      = "max.message.bytes"
	CleanupPolicy        = "cleanup.policy"
	MinInsyncReplicas    = "min.insync.replicas"
	MessageTimestampType = "message.timestamp.type"
	// UncleanLeaderElection lets the controller elect a replica outside the ISR when no ISR member is
	// alive: the partition comes back at the price of the acknowledged records that replica lacks.
	UncleanLeaderElection = "unclean.leader.election.enable"

	// Compaction (cleanup.policy=compact) and the segments it works on; see broker/plog's package doc.
	DeleteRetentionMs      = "delete.retention.ms"
	MinCleanableDirtyRatio = "min.cleanable.dirty.ratio"
	MinCompactionLagMs     = "min.compaction.lag.ms"
	MaxCompactionLagMs     = "max.compaction.lag.ms"
	SegmentMs              = "segment.ms"
	SegmentBytes           = "segment.bytes"
)

// Cleanup policies (cleanup.policy values, in the canonical form Normalize writes).
const (
	PolicyDelete        = "delete"
	PolicyCompact       = "compact"
	PolicyCompactDelete = "compact,delete"
)

// MinSegmentBytes is the smallest segment.bytes accepted: Kafka (up to 3.9) allows segments as small as
// one record's overhead, which tests use to make segments roll after every batch. (Kafka 4 raised the
// floor to 1 MiB and moved smaller values to an internal config; one public config is simpler here.)
const MinSegmentBytes = 14

// Timestamp types (message.timestamp.type).
const (
	CreateTime    = "CreateTime"
	LogAppendTime = "LogAppendTime"
)

// Config is a topic's effective configuration.
type Config struct {
	// RetentionMs: batches whose newest record is older than this many ms are deleted; -1 keeps them.
	RetentionMs int64
	// RetentionBytes: oldest batches are deleted while a partition is larger than this; -1 means no limit.
	RetentionBytes int64
	// MaxMessageBytes: the largest record batch, in bytes, a producer may send (Kafka's default 1048588).
	MaxMessageBytes int32
	// CleanupPolicy: "delete" (retention deletes old batches), "compact" (the cleaner keeps the latest
	// record per key) or "compact,delete" (both).
	CleanupPolicy string
	// MinInsyncReplicas: with acks=all, the fewest in-sync replicas that must have a write.
	MinInsyncReplicas int32
	// UncleanLeaderElection: unclean.leader.election.enable (default false, as in Kafka since 0.11).
	UncleanLeaderElection bool
	// LogAppendTime: message.timestamp.type=LogAppendTime, the broker stamps batches with its append time.
	LogAppendTime bool
	// DeleteRetentionMs: how long the cleaner keeps a tombstone (a record with a null value) after the
	// clean that first kept it as the latest record of its key, so consumers reading from the start
	// within that time still see the delete (Kafka's default 1 day).
	DeleteRetentionMs int64
	// MinCleanableDirtyRatio: the cleaner cleans a partition once bytes written since its last clean
	// make up at least this share of its closed segments (0 to 1, default 0.5).
	MinCleanableDirtyRatio float64
	// MinCompactionLagMs: records stay uncompacted at least this long after their timestamp (default 0).
	MinCompactionLagMs int64
	// MaxCompactionLagMs: a record stays uncompacted at most about this long after its timestamp: the
	// cleaner ignores the dirty ratio once the oldest dirty record is older (default: no limit). For
	// compacted topics it also caps segment.ms (RollMs).
	MaxCompactionLagMs int64
	// SegmentMs: the active segment rolls when it is older than this (default 7 days).
	SegmentMs int64
	// SegmentBytes: the active segment rolls before it would exceed this size (default 1 GiB).
	SegmentBytes int64
}

// Compact reports whether the cleanup policy includes compaction.
func (c Config) Compact() bool {
	return c.CleanupPolicy == PolicyCompact || c.CleanupPolicy == PolicyCompactDelete
}

// Delete reports whether the cleanup policy includes deletion by retention.ms and retention.bytes.
func (c Config) Delete() bool {
	return c.CleanupPolicy == PolicyDelete || c.CleanupPolicy == PolicyCompactDelete
}

// RollMs is the age at which the active segment rolls: segment.ms, capped by max.compaction.lag.ms for
// compacted topics (Kafka's LogConfig.maxSegmentMs), since the cleaner never touches the active segment
// and could otherwise not keep the max-lag promise.
func (c Config) RollMs() int64 {
	if c.Compact() {
		return min(c.SegmentMs, c.MaxCompactionLagMs)
	}
	return c.SegmentMs
}

type def struct {
	dflt  string
	parse func(c *Config, v string) error
	doc   string
}

var defs = map[string]def{
	RetentionMs: {"604800000", func(c *Config, v string) error {
		n, err := parseInt(v, -1, 1<<62)
		c.RetentionMs = n
		return err
	}, "ms to keep a batch after its newest record's timestamp; -1 forever"},
	RetentionBytes: {"-1", func(c *Config, v string) error {
		n, err := parseInt(v, -1, 1<<62)
		c.RetentionBytes = n
		return err
	}, "largest size of a partition in bytes before the oldest batches are deleted; -1 unlimited"},
	MaxMessageBytes: {"1048588", func(c *Config, v string) error {
		n, err := parseInt(v, 0, 64<<20)
		c.MaxMessageBytes = int32(n)
		return err
	}, "largest record batch in bytes (at most 64 MiB, the gRPC message cap)"},
	CleanupPolicy: {"delete", func(c *Config, v string) error {
		switch norm := normPolicy(v); norm {
		case PolicyDelete, PolicyCompact, PolicyCompactDelete:
			c.CleanupPolicy = norm
			return nil
		}
		return fmt.Errorf("must be delete, compact or compact,delete")
	}, "delete old batches (delete), keep the latest record per key (compact), or both"},
	MinInsyncReplicas: {"1", func(c *Config, v string) error {
		n, err := parseInt(v, 1, 1<<31-1)
		c.MinInsyncReplicas = int32(n)
		return err
	}, "with acks=all, the fewest in-sync replicas that must have a write"},
	MessageTimestampType: {CreateTime, func(c *Config, v string) error {
		switch v {
		case CreateTime:
			c.LogAppendTime = false
		case LogAppendTime:
			c.LogAppendTime = true
		default:
			return fmt.Errorf("must be %s or %s", CreateTime, LogAppendTime)
		}
		return nil
	}, "CreateTime keeps the producer's timestamps; LogAppendTime stamps batches with the broker's time"},
	UncleanLeaderElection: {"false", func(c *Config, v string) error {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("must be true or false")
		}
		c.UncleanLeaderElection = b
		return nil
	}, "elect an out-of-sync replica when no in-sync one is alive (availability over acknowledged records)"},
	DeleteRetentionMs: {"86400000", func(c *Config, v string) error {
		n, err := parseInt(v, 0, math.MaxInt64)
		c.DeleteRetentionMs = n
		return err
	}, "ms the cleaner keeps a tombstone after the clean that first kept it, so slow readers still see the delete"},
	MinCleanableDirtyRatio: {"0.5", func(c *Config, v string) error {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(f) {
			return fmt.Errorf("not a number")
		}
		if f < 0 || f > 1 {
			return fmt.Errorf("must be between 0 and 1")
		}
		c.MinCleanableDirtyRatio = f
		return nil
	}, "share of a compacted partition's closed segments written since the last clean at which the cleaner runs"},
	MinCompactionLagMs: {"0", func(c *Config, v string) error {
		n, err := parseInt(v, 0, math.MaxInt64)
		c.MinCompactionLagMs = n
		return err
	}, "ms after its timestamp before a record may be compacted away"},
	MaxCompactionLagMs: {"9223372036854775807", func(c *Config, v string) error {
		n, err := parseInt(v, 1, math.MaxInt64)
		c.MaxCompactionLagMs = n
		return err
	}, "ms after its timestamp by which a record is eligible for compaction whatever the dirty ratio"},
	SegmentMs: {"604800000", func(c *Config, v string) error {
		n, err := parseInt(v, 1, math.MaxInt64)
		c.SegmentMs = n
		return err
	}, "ms after which the active segment rolls (compaction never touches the active segment)"},
	SegmentBytes: {"1073741824", func(c *Config, v string) error {
		n, err := parseInt(v, MinSegmentBytes, math.MaxInt32)
		c.SegmentBytes = n
		return err
	}, "bytes at which the active segment rolls (compaction never touches the active segment)"},
}

func normPolicy(v string) string {
	parts := strings.Split(strings.ReplaceAll(v, " ", ""), ",")
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func parseInt(v string, lo, hi int64) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not an integer")
	}
	if n < lo || n > hi {
		return 0, fmt.Errorf("must be between %d and %d", lo, hi)
	}
	return n, nil
}

// Names returns every known config name, sorted.
func Names() []string {
	names := make([]string, 0, len(defs))
	for n := range defs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Default returns the broker default of a config, and false for an unknown name.
func Default(name string) (string, bool) {
	d, ok := defs[name]
	return d.dflt, ok
}

// Doc returns a one-line description of a config.
func Doc(name string) string { return defs[name].doc }

// Parse validates the topic's overrides (name → value) and returns the effective Config. Unknown
// names and bad values give rerr.ErrInvalidConfig naming the config.
func Parse(overrides map[string]string) (Config, error) {
	var c Config
	for _, name := range Names() {
		v, ok := overrides[name]
		if !ok {
			v = defs[name].dflt
		}
		if err := defs[name].parse(&c, v); err != nil {
			return Config{}, rerr.New(runnelv1.ErrorCode_INVALID_CONFIG, "config %s=%q: %v", name, v, err)
		}
	}
	for name := range overrides {
		if _, ok := defs[name]; !ok {
			return Config{}, rerr.New(runnelv1.ErrorCode_INVALID_CONFIG, "unknown topic config %q (known: %s)", name, strings.Join(Names(), ", "))
		}
	}
	if c.MinCompactionLagMs > c.MaxCompactionLagMs {
		// Kafka refuses the pair too: no record could satisfy both.
		return Config{}, rerr.New(runnelv1.ErrorCode_INVALID_CONFIG, "config %s=%d is greater than %s=%d",
			MinCompactionLagMs, c.MinCompactionLagMs, MaxCompactionLagMs, c.MaxCompactionLagMs)
	}
	return c, nil
}

// Normalize returns overrides with values in canonical form (cleanup.policy parts sorted), after Parse
// accepted them.
func Normalize(overrides map[string]string) map[string]string {
	out := make(map[string]string, len(overrides))
	for k, v := range overrides {
		if k == CleanupPolicy {
			v = normPolicy(v)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out
}

// Entries lists every config with its effective value for describe calls.
func Entries(overrides map[string]string) []*runnelv1.ConfigEntry {
	out := make([]*runnelv1.ConfigEntry, 0, len(defs))
	for _, name := range Names() {
		v, set := overrides[name]
		if !set {
			v = defs[name].dflt
		}
		out = append(out, &runnelv1.ConfigEntry{Name: name, Value: v, IsDefault: !set})
	}
	return out
}

// MaxTopicNameLength is Kafka's limit on topic names.
const MaxTopicNameLength = 249

// ValidateTopicName applies Kafka's rules: 1 to 249 characters from [a-zA-Z0-9._-], and not "." or "..".
// Errors are rerr.ErrInvalidTopic.
func ValidateTopicName(name string) error {
	if name == "" {
		return rerr.New(runnelv1.ErrorCode_INVALID_TOPIC_EXCEPTION, "topic name is empty")
	}
	if name == "." || name == ".." {
		return rerr.New(runnelv1.ErrorCode_INVALID_TOPIC_EXCEPTION, "topic name %q is not allowed", name)
	}
	if len(name) > MaxTopicNameLength {
		return rerr.New(runnelv1.ErrorCode_INVALID_TOPIC_EXCEPTION, "topic name is %d characters, the limit is %d", len(name), MaxTopicNameLength)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return rerr.New(runnelv1.ErrorCode_INVALID_TOPIC_EXCEPTION, "topic name %q has the character %q; only ASCII letters, digits, '.', '_' and '-' are allowed", name, c)
		}
	}
	return nil
}

// CollisionKey is the name with '.' replaced by '_': Kafka refuses a topic whose collision key equals an
// existing topic's, because metric names cannot tell them apart.
func CollisionKey(name string) string { return strings.ReplaceAll(name, ".", "_") }
