package plog

import (
	"encoding/binary"
	"fmt"
)

// Key kinds: the first byte of every key plog writes. Metadata owns "m/..." keys in the same DB.
const (
	kindBatch byte = 'l' // l|topicNum|partition|baseOffset → the stored record batch
	kindTime  byte = 't' // t|topicNum|partition|maxTimestamp|baseOffset → empty (time index)
	kindState byte = 's' // s|topicNum|partition → logStartOffset(8) nextOffsetFloor(8) [cleanerCheckpoint(8)]
	kindSeg   byte = 'g' // g|topicNum|partition → activeSegmentBase(8) activeSegmentFirstWriteMs(8)
	kindHoriz byte = 'h' // h|topicNum|partition|baseOffset → deleteHorizonMs(8) of a batch holding tombstones
	kindEpoch byte = 'e' // e|topicNum|partition|leaderEpoch(4) → startOffset(8): the leader-epoch cache (KIP-101)
	kindHW    byte = 'w' // w|topicNum|partition → highWatermark(8): replicated mode's HW checkpoint
	kindTrunc byte = 'x' // x|topicNum|partition → newStart(8) newEnd(8): a Truncate too big for one transaction, in progress
	kindAbort byte = 'a' // a|topicNum|partition|markerOffset(8) → producerID(8) firstOffset(8): an aborted transaction (KIP-98)
)

// partKinds are all key kinds of a partition, for DeletePartition and StoredPartitions.
var partKinds = []byte{kindBatch, kindTime, kindState, kindSeg, kindHoriz, kindEpoch, kindHW, kindTrunc, kindAbort}

const (
	partPrefixLen = 1 + 8 + 4
	batchKeyLen   = partPrefixLen + 8
	timeKeyLen    = partPrefixLen + 8 + 8
	// The state was 16 bytes before compaction added the cleaner checkpoint; both lengths are read.
	stateValueLenV1 = 16
	stateValueLen   = 24
	segValueLen     = 16
	horizValueLen   = 8
	epochKeyLen     = partPrefixLen + 4
	epochValueLen   = 8
	hwValueLen      = 8
	truncValueLen   = 16
	abortValueLen   = 16
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

// partState is the value of the state key. It is written only by retention and the cleaner, both under
// the partition's maintenance lock (retMu), so a writer never overwrites a newer value with an older one.
type partState struct {
	logStart   int64 // first offset readers may ask for; compaction never moves it
	floor      int64 // LEO lower bound, for a log whose last batches are gone
	checkpoint int64 // cleaner checkpoint: [logStart, checkpoint) was cleaned and holds each key at most once
}

func encodeState(st partState) []byte {
	v := make([]byte, stateValueLen)
	binary.BigEndian.PutUint64(v, uint64(st.logStart))
	binary.BigEndian.PutUint64(v[8:], uint64(st.floor))
	binary.BigEndian.PutUint64(v[16:], uint64(st.checkpoint))
	return v
}

func decodeState(v []byte) (partState, error) {
	if len(v) != stateValueLen && len(v) != stateValueLenV1 {
		return partState{}, fmt.Errorf("partition state of %d bytes, want %d", len(v), stateValueLen)
	}
	st := partState{logStart: int64(binary.BigEndian.Uint64(v)), floor: int64(binary.BigEndian.Uint64(v[8:]))}
	if len(v) == stateValueLen {
		st.checkpoint = int64(binary.BigEndian.Uint64(v[16:]))
	}
	return st, nil
}

// encodeSeg is the value of the segment key: where the active segment starts and when its first batch
// was written (ms).
func encodeSeg(base, firstWriteMs int64) []byte {
	v := make([]byte, segValueLen)
	binary.BigEndian.PutUint64(v, uint64(base))
	binary.BigEndian.PutUint64(v[8:], uint64(firstWriteMs))
	return v
}

func decodeSeg(v []byte) (base, firstWriteMs int64, err error) {
	if len(v) != segValueLen {
		return 0, 0, fmt.Errorf("segment state of %d bytes, want %d", len(v), segValueLen)
	}
	return int64(binary.BigEndian.Uint64(v)), int64(binary.BigEndian.Uint64(v[8:])), nil
}

func encodeHorizon(ms int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(ms)) }

func decodeHorizon(v []byte) (int64, error) {
	if len(v) != horizValueLen {
		return 0, fmt.Errorf("delete horizon of %d bytes, want %d", len(v), horizValueLen)
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

// epochKey is the key of the leader-epoch cache entry of epoch (>= 0, so big-endian order is epoch
// order).
func epochKey(prefix []byte, epoch int32) []byte {
	k := make([]byte, epochKeyLen)
	copy(k, prefix)
	binary.BigEndian.PutUint32(k[partPrefixLen:], uint32(epoch))
	return k
}

// decodeEpochEntry decodes one stored leader-epoch cache entry, strictly: the key must be
// prefix|epoch(4) with epoch >= 0 and the value one start offset >= 0.
func decodeEpochEntry(k, v []byte) (EpochEntry, error) {
	if len(k) != epochKeyLen {
		return EpochEntry{}, fmt.Errorf("leader-epoch key of %d bytes, want %d", len(k), epochKeyLen)
	}
	if len(v) != epochValueLen {
		return EpochEntry{}, fmt.Errorf("leader-epoch entry of %d bytes, want %d", len(v), epochValueLen)
	}
	e := EpochEntry{Epoch: int32(binary.BigEndian.Uint32(k[partPrefixLen:])), StartOffset: int64(binary.BigEndian.Uint64(v))}
	if e.Epoch < 0 || e.StartOffset < 0 {
		return EpochEntry{}, fmt.Errorf("leader-epoch entry (%d, %d) is negative", e.Epoch, e.StartOffset)
	}
	return e, nil
}

// encodeOffset is the value of the epoch and HW keys: one offset.
func encodeOffset(off int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(off)) }

// decodeHW decodes the HW checkpoint strictly.
func decodeHW(v []byte) (int64, error) {
	if len(v) != hwValueLen {
		return 0, fmt.Errorf("high watermark checkpoint of %d bytes, want %d", len(v), hwValueLen)
	}
	hw := int64(binary.BigEndian.Uint64(v))
	if hw < 0 {
		return 0, fmt.Errorf("negative high watermark checkpoint %d", hw)
	}
	return hw, nil
}

// encodeTrunc is the value of the truncation key: the log keeps [newStart, newEnd).
func encodeTrunc(newStart, newEnd int64) []byte {
	v := make([]byte, truncValueLen)
	binary.BigEndian.PutUint64(v, uint64(newStart))
	binary.BigEndian.PutUint64(v[8:], uint64(newEnd))
	return v
}

func decodeTrunc(v []byte) (newStart, newEnd int64, err error) {
	if len(v) != truncValueLen {
		return 0, 0, fmt.Errorf("truncation record of %d bytes, want %d", len(v), truncValueLen)
	}
	newStart, newEnd = int64(binary.BigEndian.Uint64(v)), int64(binary.BigEndian.Uint64(v[8:]))
	if newStart < 0 || newEnd < newStart {
		return 0, 0, fmt.Errorf("truncation record keeps [%d, %d)", newStart, newEnd)
	}
	return newStart, newEnd, nil
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
