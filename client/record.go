package client

import (
	"errors"
	"fmt"
	"time"

	"github.com/runnel-io/runnel/client/batch"
)

// Header is one record header: a string key and a nullable value. It is the batch package's type, so
// headers travel between the SDK and the wire format without a copy.
type Header = batch.RecordHeader

// Record is one record, produced or consumed.
//
// On produce, the Producer reads Topic, Partition, Timestamp, Key, Value and Headers, and fills
// Partition, Offset and (when zero) Timestamp before the promise runs. The Record and the slices it
// references must not change between Produce and its promise.
//
// On consume, Key, Value and header values share memory with the fetched batch; they stay valid for as
// long as the caller keeps them (copy them to drop the rest of the fetch).
type Record struct {
	// Topic the record belongs to; required on produce.
	Topic string
	// Partition of the topic. On produce, -1 lets the partitioner choose (NewRecord sets -1); a record
	// built as a struct literal has Partition 0 unless it says otherwise.
	Partition int32
	// Offset is the record's position in its partition: set by a successful produce (-1 with
	// AcksNone) and on consume.
	Offset int64
	// Timestamp has millisecond precision on the wire. Zero on produce means the time of Produce. On
	// consume it is the producer's time, or the broker's append time for LogAppendTime topics.
	Timestamp time.Time
	// Key selects the partition with the default partitioner; nil is a null key (empty is not null).
	Key []byte
	// Value is the payload; nil is a null value, a tombstone in compacted topics.
	Value []byte
	// Headers are application metadata, in order; keys may repeat.
	Headers []Header
	// LeaderEpoch is the leader epoch of the batch the record was consumed from (-1 if unknown).
	LeaderEpoch int32
}

// NewRecord returns a record for topic with the key and value, to be partitioned by the producer's
// partitioner (Partition -1).
func NewRecord(topic string, key, value []byte) *Record {
	return &Record{Topic: topic, Partition: -1, Key: key, Value: value}
}

// ErrClosed is returned (or passed to promises) by a client used after Close.
var ErrClosed = errors.New("client: closed")

// PartitionError is an error about one partition, returned by Consumer.Poll. Err is a catalogue error
// (errors.Is(err, rerr.ErrOffsetOutOfRange), say) or a decoding error.
type PartitionError struct {
	Topic     string
	Partition int32
	Err       error
}

// Error says which partition failed and why.
func (e *PartitionError) Error() string {
	return fmt.Sprintf("%s-%d: %v", e.Topic, e.Partition, e.Err)
}

// Unwrap returns Err, so errors.Is and errors.As see the cause.
func (e *PartitionError) Unwrap() error { return e.Err }

// offsetKind says what an Offset means.
type offsetKind int8

const (
	offsetEarliest offsetKind = iota // the zero Offset
	offsetLatest
	offsetExact
	offsetTime
)

// Offset names where a consumer starts reading a partition: the earliest retained record, the end of
// the log, an exact offset, or the first record at or after a time. The zero Offset is OffsetEarliest().
type Offset struct {
	kind offsetKind
	at   int64 // the offset, or the time in ms
}

// OffsetEarliest is the first retained record of a partition (the log start offset). Kafka:
// auto.offset.reset=earliest.
func OffsetEarliest() Offset { return Offset{kind: offsetEarliest} }

// OffsetLatest is the end of the log (the high watermark): only records produced after it is resolved.
// Kafka: auto.offset.reset=latest.
func OffsetLatest() Offset { return Offset{kind: offsetLatest} }

// OffsetAt is the exact offset o; a negative o is treated as OffsetEarliest.
func OffsetAt(o int64) Offset {
	if o < 0 {
		return OffsetEarliest()
	}
	return Offset{kind: offsetExact, at: o}
}

// OffsetAfterTime is the first record whose timestamp is at or after t (millisecond precision), or the
// end of the log when no record is that recent. Kafka: offsetsForTimes.
func OffsetAfterTime(t time.Time) Offset { return Offset{kind: offsetTime, at: t.UnixMilli()} }

// String describes the offset: "earliest", "latest", "42" or "time 2024-...".
func (o Offset) String() string {
	switch o.kind {
	case offsetLatest:
		return "latest"
	case offsetExact:
		return fmt.Sprint(o.at)
	case offsetTime:
		return "time " + time.UnixMilli(o.at).UTC().Format(time.RFC3339Nano)
	}
	return "earliest"
}
