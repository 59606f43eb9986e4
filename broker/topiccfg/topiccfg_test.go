package topiccfg

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/runnel-io/runnel/api/rerr"
)

func TestParseDefaults(t *testing.T) {
	c, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{RetentionMs: 604800000, RetentionBytes: -1, MaxMessageBytes: 1048588, CleanupPolicy: "delete", MinInsyncReplicas: 1,
		DeleteRetentionMs: 86400000, MinCleanableDirtyRatio: 0.5, MinCompactionLagMs: 0, MaxCompactionLagMs: math.MaxInt64,
		SegmentMs: 604800000, SegmentBytes: 1073741824}
	if c != want {
		t.Fatalf("defaults = %+v, want %+v", c, want)
	}
}

func TestParseOverrides(t *testing.T) {
	c, err := Parse(map[string]string{RetentionMs: "-1", RetentionBytes: "1000", CleanupPolicy: "delete, compact",
		MessageTimestampType: LogAppendTime, MaxMessageBytes: "2048", MinInsyncReplicas: "2"})
	if err != nil {
		t.Fatal(err)
	}
	if c.RetentionMs != -1 || c.RetentionBytes != 1000 || c.CleanupPolicy != "compact,delete" || !c.LogAppendTime || c.MaxMessageBytes != 2048 || c.MinInsyncReplicas != 2 {
		t.Fatalf("parsed %+v", c)
	}
}

func TestParseRejects(t *testing.T) {
	for _, m := range []map[string]string{
		{"retention.mss": "1"},
		{RetentionMs: "abc"},
		{RetentionMs: "-2"},
		{MaxMessageBytes: "999999999"},
		{CleanupPolicy: "purge"},
		{MinInsyncReplicas: "0"},
		{MessageTimestampType: "Whenever"},
		{DeleteRetentionMs: "-1"},
		{MinCleanableDirtyRatio: "1.5"},
		{MinCleanableDirtyRatio: "-0.1"},
		{MinCleanableDirtyRatio: "NaN"},
		{MinCleanableDirtyRatio: "half"},
		{MinCompactionLagMs: "-1"},
		{MaxCompactionLagMs: "0"},
		{MinCompactionLagMs: "2000", MaxCompactionLagMs: "1000"},
		{SegmentMs: "0"},
		{SegmentBytes: "13"},
		{SegmentBytes: "2147483648"},
	} {
		_, err := Parse(m)
		if !errors.Is(err, rerr.ErrInvalidConfig) {
			t.Errorf("Parse(%v) = %v, want INVALID_CONFIG", m, err)
		}
	}
}

func TestValidateTopicName(t *testing.T) {
	for _, ok := range []string{"flights", "a.b_c-D9", strings.Repeat("x", 249)} {
		if err := ValidateTopicName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "has space", "slash/", "ünï", strings.Repeat("x", 250)} {
		if err := ValidateTopicName(bad); !errors.Is(err, rerr.ErrInvalidTopic) {
			t.Errorf("%q: %v, want INVALID_TOPIC_EXCEPTION", bad, err)
		}
	}
}

func TestEntriesMarkDefaults(t *testing.T) {
	es := Entries(map[string]string{RetentionMs: "1000"})
	if len(es) != len(Names()) {
		t.Fatalf("%d entries, want %d", len(es), len(Names()))
	}
	for _, e := range es {
		if (e.Name == RetentionMs) == e.IsDefault {
			t.Errorf("%s is_default=%v", e.Name, e.IsDefault)
		}
		if e.Name == RetentionMs && e.Value != "1000" {
			t.Errorf("retention.ms = %s", e.Value)
		}
	}
}

func TestParseCompactionConfigs(t *testing.T) {
	c, err := Parse(map[string]string{CleanupPolicy: "compact", DeleteRetentionMs: "0", MinCleanableDirtyRatio: "0.01",
		MinCompactionLagMs: "100", MaxCompactionLagMs: "60000", SegmentMs: "3600000", SegmentBytes: "14"})
	if err != nil {
		t.Fatal(err)
	}
	if c.DeleteRetentionMs != 0 || c.MinCleanableDirtyRatio != 0.01 || c.MinCompactionLagMs != 100 || c.MaxCompactionLagMs != 60000 ||
		c.SegmentMs != 3600000 || c.SegmentBytes != 14 {
		t.Fatalf("parsed %+v", c)
	}
	// The active segment of a compacted topic rolls by max.compaction.lag.ms when that is sooner.
	if !c.Compact() || c.Delete() || c.RollMs() != 60000 {
		t.Fatalf("compact %v delete %v roll %d", c.Compact(), c.Delete(), c.RollMs())
	}
	c.CleanupPolicy = PolicyDelete
	if c.Compact() || !c.Delete() || c.RollMs() != 3600000 {
		t.Fatalf("delete policy: compact %v delete %v roll %d", c.Compact(), c.Delete(), c.RollMs())
	}
	c.CleanupPolicy = PolicyCompactDelete
	if !c.Compact() || !c.Delete() {
		t.Fatalf("compact,delete: compact %v delete %v", c.Compact(), c.Delete())
	}
}
