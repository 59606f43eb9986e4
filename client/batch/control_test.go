package batch

import (
	"errors"
	"testing"

	"github.com/runnel-io/runnel/api/rerr"
)

func TestControlRoundTrip(t *testing.T) {
	for _, m := range []ControlMarker{
		{Commit: true, CoordinatorEpoch: 7, FirstOffset: 1234},
		{Commit: false, CoordinatorEpoch: 0, FirstOffset: -1},
	} {
		b := BuildControl(42, 3, 1_700_000_000_000, m)
		h, err := Validate(b)
		if err != nil {
			t.Fatal(err)
		}
		if !h.IsControl() || !h.IsTransactional() || h.ProducerID != 42 || h.ProducerEpoch != 3 || h.BaseSequence != -1 || h.RecordCount != 1 {
			t.Fatalf("header %+v", h)
		}
		got, err := ParseControl(b)
		if err != nil || got != m {
			t.Fatalf("parsed %+v, %v; want %+v", got, err, m)
		}
	}
}

func TestParseControlRefusesOtherBatches(t *testing.T) {
	var b Builder
	b.Append(1, []byte("k"), []byte("v"), nil)
	if _, err := ParseControl(b.Build(CompressionNone)); !errors.Is(err, rerr.ErrCorruptMessage) {
		t.Fatalf("a data batch parsed as a marker: %v", err)
	}
	// A control batch whose record key names another control type (Kafka has others, e.g. leader change).
	var c Builder
	c.Append(1, []byte{0, 0, 0, 2}, []byte{0, 0, 0, 0, 0, 0}, nil)
	c.attrs = AttrControl | AttrTransactional
	if _, err := ParseControl(c.Build(CompressionNone)); !errors.Is(err, rerr.ErrCorruptMessage) {
		t.Fatalf("control type 2 parsed as a marker: %v", err)
	}
	// Kafka's version-0 value has no first offset.
	var k Builder
	k.Append(1, []byte{0, 0, 0, 1}, []byte{0, 0, 0, 0, 0, 9}, nil)
	k.attrs = AttrControl | AttrTransactional
	m, err := ParseControl(k.Build(CompressionNone))
	if err != nil || !m.Commit || m.CoordinatorEpoch != 9 || m.FirstOffset != -1 {
		t.Fatalf("Kafka v0 marker: %+v, %v", m, err)
	}
}

// FuzzParseControl: markers come from other brokers' logs (replication) and are untrusted bytes.
func FuzzParseControl(f *testing.F) {
	f.Add(BuildControl(1, 0, 0, ControlMarker{Commit: true, FirstOffset: 5}))
	f.Add(BuildControl(1, 0, 0, ControlMarker{FirstOffset: -1}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseControl(b)
		if err != nil {
			return
		}
		if m.FirstOffset < -1 {
			t.Fatalf("first offset %d accepted", m.FirstOffset)
		}
	})
}
