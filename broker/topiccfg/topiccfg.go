// Package topiccfg defines the per-topic configs Runnel understands, with Kafka's names, defaults and
// validation rules, and the Kafka rules for topic names.
//
// Configs travel as strings (as in Kafka's AlterConfigs) and are parsed once into Config when a topic is
// created or altered, so the produce and fetch paths read typed fields.
package topiccfg

import (
	"fmt"
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
)

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
	// CleanupPolicy: "delete", "compact" or "compact,delete". Compaction is done by the consumer-groups work;
	// until then "compact" topics keep everything.
	CleanupPolicy string
	// MinInsyncReplicas: with acks=all, the fewest in-sync replicas that must have a write.
	MinInsyncReplicas int32
	// LogAppendTime: message.timestamp.type=LogAppendTime, the broker stamps batches with its append time.
	LogAppendTime bool
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
		case "delete", "compact", "compact,delete":
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
