package group

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"
)

func sampleMember() memberValue {
	return memberValue{instanceID: "i1", rackID: "r", clientID: "c", clientHost: "10.0.0.1", names: []string{"a", "b"},
		assignor: "uniform", rebalanceTimeoutMs: 300000, sessionTimeoutMs: 45000, epoch: 7, prevEpoch: 6,
		state: stateUnrevoked, assigned: parts{"a": {0, 2}}, pending: parts{"b": {1}}, target: parts{"a": {0, 2}, "c": {5}}}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, k := range []recordKey{offsetKey("g", tp{"t", 3}), groupKey("группа"), memberKey("g", "m-1"), offsetKey("", tp{"", 0})} {
		got, err := decodeKey(k.encode())
		if err != nil || got != k {
			t.Errorf("key %+v: %+v, %v", k, got, err)
		}
	}
	ov := OffsetCommit{Offset: 1 << 40, LeaderEpoch: -1, Metadata: "meta", CommitTimestampMs: 1767225600000}
	if got, err := decodeOffsetValue(ov.encode()); err != nil || got != ov {
		t.Errorf("offset value: %+v, %v", got, err)
	}
	gv := groupValue{epoch: 9, assignmentEpoch: 9, assignor: "range", emptySinceMs: -1,
		topics: []subTopic{{"a", "id-a", 3}, {"b", "id-b", 1}}}
	if got, err := decodeGroupValue(gv.encode()); err != nil || !reflect.DeepEqual(got, gv) {
		t.Errorf("group value: %+v, %v", got, err)
	}
	mv := sampleMember()
	if got, err := decodeMemberValue(mv.encode()); err != nil || !reflect.DeepEqual(got, mv) {
		t.Errorf("member value: %+v, %v", got, err)
	}
}

// TestRecordRejects covers damage the decoders must refuse rather than load.
func TestRecordRejects(t *testing.T) {
	ov := OffsetCommit{Offset: 5}.encode()
	for name, b := range map[string][]byte{
		"empty key":        nil,
		"unknown kind":     {0, 9, 0},
		"truncated key":    offsetKey("group", tp{"topic", 1}).encode()[:6],
		"trailing bytes":   append(groupKey("g").encode(), 0),
		"huge string":      {0, 3, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"negative part":    append(append(groupKey("g").encode()[:0:0], 0, 1, 1, 'g', 1, 't'), 1),
		"offset version 2": append([]byte{0, 2}, ov[2:]...),
	} {
		var err error
		if name == "offset version 2" {
			_, err = decodeOffsetValue(b)
		} else {
			_, err = decodeKey(b)
		}
		if !errors.Is(err, errCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
	bad := sampleMember()
	bad.pending = bad.assigned
	if _, err := decodeMemberValue(bad.encode()); !errors.Is(err, errCorrupt) {
		t.Errorf("member revoking what it keeps: %v", err)
	}
	many := append([]byte{0, 1}, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f) // a member claiming 4G names
	if _, err := decodeMemberValue(many); !errors.Is(err, errCorrupt) {
		t.Errorf("huge count: %v", err)
	}
}

// loadAny feeds one record to a fresh coordinator and starts it: whatever the bytes, it must neither
// panic nor break an invariant (Start panics on those in tests).
func loadAny(t *testing.T, key, value []byte) {
	c := New(Config{})
	_ = c.Load(Record{Key: key, Value: value})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c.Start(now, map[string]TopicInfo{"a": {ID: "a", Partitions: 3}, "t": {ID: "t", Partitions: 4}})
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	c.Describe("g")
	c.List()
}

func FuzzDecodeOffsetRecord(f *testing.F) {
	f.Add(offsetKey("g", tp{"t", 1}).encode(), OffsetCommit{Offset: 9, LeaderEpoch: 2, Metadata: "m", CommitTimestampMs: 5}.encode())
	f.Add(offsetKey("g", tp{"t", 1}).encode(), []byte(nil))
	f.Fuzz(func(t *testing.T, key, value []byte) {
		if k, err := decodeKey(key); err == nil {
			if !bytes.Equal(k.encode(), key) {
				t.Fatalf("key %x decodes to %+v which encodes as %x", key, k, k.encode())
			}
		}
		if v, err := decodeOffsetValue(value); err == nil {
			if again, err := decodeOffsetValue(v.encode()); err != nil || again != v {
				t.Fatalf("offset value %+v: round trip %+v, %v", v, again, err)
			}
		}
		loadAny(t, key, value)
	})
}

func FuzzDecodeGroupRecord(f *testing.F) {
	f.Add(groupKey("g").encode(), groupValue{epoch: 3, assignmentEpoch: 3, assignor: "uniform", emptySinceMs: -1,
		topics: []subTopic{{"t", "id", 4}}}.encode())
	f.Add(groupKey("g").encode(), groupValue{epoch: 1, assignor: "range", emptySinceMs: 12}.encode())
	f.Fuzz(func(t *testing.T, key, value []byte) {
		if v, err := decodeGroupValue(value); err == nil {
			if again, err := decodeGroupValue(v.encode()); err != nil || !reflect.DeepEqual(again, v) {
				t.Fatalf("group value %+v: round trip %+v, %v", v, again, err)
			}
		}
		loadAny(t, key, value)
	})
}

func FuzzDecodeMemberRecord(f *testing.F) {
	mv := sampleMember()
	f.Add(memberKey("g", "m").encode(), mv.encode())
	mv.state, mv.pending, mv.departed = stateStable, nil, true
	f.Add(memberKey("g", "m").encode(), mv.encode())
	f.Fuzz(func(t *testing.T, key, value []byte) {
		if v, err := decodeMemberValue(value); err == nil {
			if again, err := decodeMemberValue(v.encode()); err != nil || !reflect.DeepEqual(again, v) {
				t.Fatalf("member value %+v: round trip %+v, %v", v, again, err)
			}
		}
		// A member record alone has no group record: loading it must still be safe, and with one.
		loadAny(t, key, value)
		c := New(Config{})
		_ = c.Load(Record{Key: groupKey("g").encode(), Value: groupValue{epoch: 7, assignmentEpoch: 7, assignor: "uniform", emptySinceMs: -1}.encode()})
		_ = c.Load(Record{Key: key, Value: value})
		c.Start(time.Unix(0, 0), map[string]TopicInfo{"a": {ID: "a", Partitions: 3}})
		if err := c.Check(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestLoadDropsInconsistentMembers: member records that cannot be loaded as they are — no group
// record, or an epoch ahead of the group's — are counted, left out and tombstoned, so the next load
// does not meet them again.
func TestLoadDropsInconsistentMembers(t *testing.T) {
	good := memberValue{rebalanceTimeoutMs: 1000, sessionTimeoutMs: 1000, epoch: 2, target: parts{"a": {0}}, assigned: parts{"a": {0}}}
	ahead := good
	ahead.epoch, ahead.target, ahead.assigned = 9, parts{"a": {1}}, parts{"a": {1}}
	c := New(Config{})
	for _, r := range []Record{
		{Key: memberKey("orphan", "m").encode(), Value: good.encode()},
		{Key: groupKey("g").encode(), Value: groupValue{epoch: 2, assignmentEpoch: 2, assignor: "uniform", emptySinceMs: -1}.encode()},
		{Key: memberKey("g", "ok").encode(), Value: good.encode()},
		{Key: memberKey("g", "ahead").encode(), Value: ahead.encode()},
	} {
		if err := c.Load(r); err != nil {
			t.Fatal(err)
		}
	}
	recs := c.Start(time.Unix(0, 0), map[string]TopicInfo{"a": {ID: "a", Partitions: 2}})
	tombstones := map[string]bool{}
	for _, r := range recs {
		if r.Value == nil {
			k, _ := decodeKey(r.Key)
			tombstones[k.group+"/"+k.member] = true
		}
	}
	if !tombstones["orphan/m"] || !tombstones["g/ahead"] || tombstones["g/ok"] || c.LoadErrors() != 2 {
		t.Fatalf("tombstones %v, load errors %d", tombstones, c.LoadErrors())
	}
	if g := c.groups["g"]; len(g.members) != 1 || g.members["ok"] == nil || g.epoch != 3 {
		t.Fatalf("group after load: %s", dumpState(c))
	}
}
