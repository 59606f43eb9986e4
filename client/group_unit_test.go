package client

import (
	"strings"
	"testing"
	"time"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

func TestGroupOptionValidation(t *testing.T) {
	cfg, err := newGroupConfig(nil)
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if !cfg.autoCommit || cfg.autoCommitInterval != 5*time.Second || cfg.resetOffset.kind != offsetLatest ||
		cfg.rebalanceTimeout != 5*time.Minute || cfg.sessionTimeout != 0 {
		t.Fatalf("defaults are not Kafka's: %+v", cfg)
	}
	// Group, consumer and shared options all configure a group consumer.
	cfg, err = newGroupConfig([]GroupOption{WithInstanceID("i"), WithRackID("r"), WithGroupAssignor("range"),
		WithSessionTimeout(10 * time.Second), WithRebalanceTimeout(time.Minute), WithHeartbeatInterval(time.Second),
		WithAutoCommit(false), WithAutoCommitInterval(time.Second), WithAutoOffsetReset(OffsetEarliest()),
		WithFetchMaxWait(time.Second), WithClientID("x")})
	if err != nil {
		t.Fatalf("valid options refused: %v", err)
	}
	if cfg.instanceID != "i" || cfg.rackID != "r" || cfg.assignor != "range" || cfg.sessionTimeout != 10*time.Second ||
		cfg.autoCommit || cfg.resetOffset.kind != offsetEarliest || cfg.consumer.fetchMaxWait != time.Second || cfg.consumer.common.clientID != "x" {
		t.Fatalf("options not applied: %+v", cfg)
	}
	for _, tc := range []struct {
		opt  GroupOption
		want string
	}{
		{WithSessionTimeout(-1), "WithSessionTimeout"},
		{WithSessionTimeout(time.Microsecond), "WithSessionTimeout"},
		{WithRebalanceTimeout(0), "WithRebalanceTimeout"},
		{WithRebalanceTimeout(1000 * time.Hour), "WithRebalanceTimeout"},
		{WithHeartbeatInterval(-time.Second), "WithHeartbeatInterval"},
		{WithAutoCommitInterval(0), "WithAutoCommitInterval"},
		{WithAutoOffsetReset(OffsetAt(5)), "WithAutoOffsetReset"},
		{WithInstanceID(strings.Repeat("x", 256)), "WithInstanceID"},
		{WithFetchMaxBytes(0), "WithFetchMaxBytes"},
		{WithRequestTimeout(0), "WithRequestTimeout"},
		{nil, "nil GroupOption"},
	} {
		_, err := newGroupConfig([]GroupOption{tc.opt})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v", tc.want, err)
		}
	}
	if _, err := NewGroupConsumer([]string{"x:1"}, ""); err == nil {
		t.Error("NewGroupConsumer took an empty group id")
	}
	if _, err := NewGroupConsumer(nil, "g"); err == nil {
		t.Error("NewGroupConsumer took no brokers")
	}
	g, err := NewGroupConsumer([]string{"x:1"}, "g")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Subscribe(); err == nil {
		t.Error("Subscribe to nothing worked")
	}
	if err := g.SubscribeRegex("("); !isCode(err, runnelv1.ErrorCode_INVALID_REGULAR_EXPRESSION) {
		t.Errorf("bad regex: %v", err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := g.Subscribe("t"); err != ErrClosed {
		t.Errorf("Subscribe after Close: %v", err)
	}
}

func TestPartitionsWire(t *testing.T) {
	in := []TopicPartition{{"b", 2}, {"a", 1}, {"b", 0}, {"a", 1}, {"b", 2}}
	got := toProtoPartitions(in)
	if len(got) != 2 || got[0].Topic != "a" || len(got[0].Partitions) != 1 || got[1].Topic != "b" ||
		len(got[1].Partitions) != 2 || got[1].Partitions[0] != 0 || got[1].Partitions[1] != 2 {
		t.Fatalf("toProtoPartitions(%v) = %v", in, got)
	}
	if in[0] != (TopicPartition{"b", 2}) {
		t.Fatal("toProtoPartitions changed its input")
	}
	back := fromProtoPartitions(append(got, nil, &runnelv1.TopicPartitions{Topic: "a", Partitions: []int32{1, 0}}))
	want := []TopicPartition{{"a", 0}, {"a", 1}, {"b", 0}, {"b", 2}}
	if len(back) != len(want) {
		t.Fatalf("fromProtoPartitions = %v", back)
	}
	for i := range want {
		if back[i] != want[i] {
			t.Fatalf("fromProtoPartitions = %v, want %v", back, want)
		}
	}
	if s := (TopicPartition{"orders", 7}).String(); s != "orders-7" {
		t.Fatalf("String = %q", s)
	}
}

func TestResetSpecString(t *testing.T) {
	at := time.Date(2001, 1, 2, 3, 4, 5, 0, time.UTC)
	for spec, want := range map[ResetSpec]string{
		ResetToEarliest(): "to-earliest", ResetToLatest(): "to-latest", ResetToOffset(5): "to-offset 5",
		ResetShiftBy(-3): "shift-by -3", ResetToDatetime(at): "to-datetime 2001-01-02T03:04:05Z",
	} {
		if got := spec.String(); got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
}
