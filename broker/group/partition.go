package group

import "unicode/utf16"

// OffsetsTopic is the internal compacted topic that holds committed offsets and group state.
const OffsetsTopic = "__consumer_offsets"

// PartitionFor returns the __consumer_offsets partition of a group, as Kafka computes it:
// Utils.abs(groupId.hashCode()) % partitions, with Java's String.hashCode over UTF-16 code units, so a
// group lands on the same partition number as in Kafka. The leader of that partition coordinates the
// group.
func PartitionFor(groupID string, partitions int32) int32 {
	var h int32
	for _, u := range utf16.Encode([]rune(groupID)) {
		h = 31*h + int32(u)
	}
	if h == -1<<31 {
		h = 0 // Kafka's Utils.abs maps Integer.MIN_VALUE to 0
	} else if h < 0 {
		h = -h
	}
	return h % partitions
}
