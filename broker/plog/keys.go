package plog

import (
	"encoding/binary"
	"fmt"
)

// Key kinds: the first byte of every key plog writes. Metadata owns "m/..." keys in the same DB.
const (
	kindBatch byte = 'l' // l|topicNum|partition|baseOffset → the stored record batch
	kindTime  byte = 't' // t|topicNum|partition|maxTimestamp|baseOffset → empty (time index)
	kindState byte = 's' // s|topicNum|partition → logStartOffset(8) nextOffsetFloor(8)
)

const (
	partPrefixLen = 1 + 8 + 4
	batchKeyLen   = partPrefixLen + 8
	timeKeyLen    = partPrefixLen + 8 + 8
	stateValueLen = 16
)

// PartitionID names a partition log. TopicNum is a number the controller gives a topic and never reuses,
// so a topic deleted and created again under the same name starts a fresh log.
type PartitionID struct {
	TopicNum  uint64
	Partition int32
}

// String returns "topicnum-partition", e.g. "7-0".
func (id PartitionID) String() string { return fmt.Sprintf("%d-%d", id.TopicNum, id.Partition) }

// partPrefix is kind|topicNum|partition, all big-endian, so one partition's keys of one kind are one
// contiguous range that Badger can iterate and DropPrefix can drop.
func partPrefix(kind byte, id PartitionID) []byte {
	k := make([]byte, partPrefixLen, timeKeyLen)
	k[0] = kind
	binary.BigEndian.PutUint64(k[1:], id.TopicNum)
	binary.BigEndian.PutUint32(k[9:], uint32(id.Partition))
	return k
}

// batchKey is the key of the batch with base offset base. Offsets are >= 0, so big-endian order is
// offset order and a seek finds the batch holding an offset.
func batchKey(prefix []byte, base int64) []byte {
	k := make([]byte, batchKeyLen)
	copy(k, prefix)
	binary.BigEndian.PutUint64(k[partPrefixLen:], uint64(base))
	return k
}

// timeKey is the time-index key of a batch. Timestamps may be negative (-1 is Kafka's "none"), so the
// sign bit is flipped to keep big-endian byte order equal to numeric order.
func timeKey(prefix []byte, ts, base int64) []byte {
	k := make([]byte, timeKeyLen)
	copy(k, prefix)
	binary.BigEndian.PutUint64(k[partPrefixLen:], uint64(ts)^(1<<63))
	binary.BigEndian.PutUint64(k[partPrefixLen+8:], uint64(base))
	return k
}

// batchKeyOffset decodes the base offset of a batch key.
func batchKeyOffset(k []byte) int64 { return int64(binary.BigEndian.Uint64(k[partPrefixLen:])) }

// timeKeyParts decodes a time-index key.
func timeKeyParts(k []byte) (ts, base int64) {
	return int64(binary.BigEndian.Uint64(k[partPrefixLen:]) ^ (1 << 63)), int64(binary.BigEndian.Uint64(k[partPrefixLen+8:]))
}

func encodeState(logStart, floor int64) []byte {
	v := make([]byte, stateValueLen)
	binary.BigEndian.PutUint64(v, uint64(logStart))
	binary.BigEndian.PutUint64(v[8:], uint64(floor))
	return v
}

func decodeState(v []byte) (logStart, floor int64, err error) {
	if len(v) != stateValueLen {
		return 0, 0, fmt.Errorf("partition state of %d bytes, want %d", len(v), stateValueLen)
	}
	return int64(binary.BigEndian.Uint64(v)), int64(binary.BigEndian.Uint64(v[8:])), nil
}

// varintLen is the length of the unsigned varint encoding of v.
func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// storedValueSize returns the exact length of a value stored in the value log from Badger's
// Item.ValueSize, which is only an estimate: Badger computes it as the value-log entry length minus the
// key, the CRC and 6 bytes for a header whose real length is 4 bytes plus the varint of the value length
// (meta, user meta, key length < 128, value length, expiresAt 0). So ValueSize = vlen + uvarintLen(vlen) - 2,
// which this inverts. Used to recover Size without reading every batch.
func storedValueSize(estimate int64) int64 {
	for n := 1; n <= 10; n++ {
		v := estimate + 2 - int64(n)
		if v >= 0 && uvarintLen(uint64(v)) == n {
			return v
		}
	}
	return estimate
}
