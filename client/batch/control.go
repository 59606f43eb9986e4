package batch

import (
	"encoding/binary"
	"math"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// Control record types (the key's second int16), as in Kafka's ControlRecordType.
const (
	ControlAbort  int16 = 0
	ControlCommit int16 = 1
)

// controlValueVersion is this project's end-transaction marker value: Kafka's version 0 (int16 version,
// int32 coordinator epoch) followed by the int64 first offset of the transaction on the partition, so a
// replica can index an aborted transaction from the marker's bytes alone.
const controlValueVersion = 1

const (
	controlKeyLen   = 4         // int16 version, int16 type
	controlValueLen = 2 + 4 + 8 // int16 version, int32 coordinator epoch, int64 first offset
)

// ControlMarker is what an end-transaction marker says (KIP-98): whether the producer's transaction on
// the partition committed or aborted, the coordinator epoch that wrote it (leaders drop markers of an
// older coordinator), and the offset of the transaction's first record on the partition (-1 when the
// transaction wrote no record there).
type ControlMarker struct {
	Commit           bool
	CoordinatorEpoch int32
	FirstOffset      int64
}

// BuildControl returns a control batch holding one end-transaction marker of the producer: attributes
// control and transactional, base sequence -1, timestamp ts (ms). The bytes are new and the caller's.
func BuildControl(producerID int64, producerEpoch int16, ts int64, m ControlMarker) []byte {
	key := make([]byte, controlKeyLen)
	typ := ControlAbort
	if m.Commit {
		typ = ControlCommit
	}
	binary.BigEndian.PutUint16(key[2:], uint16(typ))
	value := make([]byte, controlValueLen)
	binary.BigEndian.PutUint16(value[0:], controlValueVersion)
	binary.BigEndian.PutUint32(value[2:], uint32(m.CoordinatorEpoch))
	binary.BigEndian.PutUint64(value[6:], uint64(m.FirstOffset))
	var b Builder
	b.Append(ts, key, value, nil)
	b.SetProducer(producerID, producerEpoch, -1)
	b.attrs = AttrControl | AttrTransactional
	out := b.Build(CompressionNone)
	return append([]byte(nil), out...)
}

// ParseControl decodes the marker of one whole control batch b (as stored or fetched). A Kafka marker
// (value version 0, no first offset) parses with FirstOffset -1. Errors (rerr.ErrCorruptMessage,
// wrapped): b is not a valid control batch, its record is not an end-transaction marker, or a field
// is short.
func ParseControl(b []byte) (ControlMarker, error) {
	var m ControlMarker
	h, err := ParseHeader(b)
	if err != nil {
		return m, err
	}
	if !h.IsControl() {
		return m, corrupt("batch at %d is not a control batch", h.BaseOffset)
	}
	if h.Compression() != CompressionNone {
		return m, corrupt("control batch at %d is compressed", h.BaseOffset)
	}
	n := 0
	err = DecodeRecords(b, func(r Record) error {
		n++
		if len(r.Key) < controlKeyLen {
			return corrupt("control record key of %d bytes", len(r.Key))
		}
		switch typ := int16(binary.BigEndian.Uint16(r.Key[2:])); typ {
		case ControlAbort, ControlCommit:
			m.Commit = typ == ControlCommit
		default:
			return rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "control record type %d is not an end-transaction marker", typ)
		}
		if len(r.Value) < 6 {
			return corrupt("end-transaction marker value of %d bytes", len(r.Value))
		}
		m.CoordinatorEpoch = int32(binary.BigEndian.Uint32(r.Value[2:]))
		m.FirstOffset = -1
		if binary.BigEndian.Uint16(r.Value[0:]) >= controlValueVersion {
			if len(r.Value) < controlValueLen {
				return corrupt("end-transaction marker value of %d bytes, version 1 needs %d", len(r.Value), controlValueLen)
			}
			m.FirstOffset = int64(binary.BigEndian.Uint64(r.Value[6:]))
			if m.FirstOffset < -1 || m.FirstOffset == math.MinInt64 {
				return corrupt("end-transaction marker with first offset %d", m.FirstOffset)
			}
		}
		return nil
	})
	if err != nil {
		return ControlMarker{}, err
	}
	if n != 1 {
		return ControlMarker{}, corrupt("control batch with %d records", n)
	}
	return m, nil
}
