package client

import (
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// Partitioner chooses the partition of records produced with Partition -1. Partition is called once per
// record, from the goroutine calling Produce (so implementations must be safe for concurrent use), with
// the topic's current partition count (> 0); it must return a partition in [0, numPartitions).
type Partitioner interface {
	Partition(r *Record, numPartitions int32) int32
}

// StickyPartitioner is a Partitioner that wants to know when a partition's batch is sealed (full, or
// taken to be sent). Kafka's sticky partitioning (KIP-480) sends keyless records to one partition until
// its batch is sealed and then moves on, which makes fewer, fuller batches than round-robin.
//
// OnBatchSealed may be called from the producer's goroutines, concurrently with Partition. When it is
// called for a batch that a record being produced could not join, that record is partitioned again, so
// it follows the sticky partition to its new place (KIP-480's "abort on new batch").
type StickyPartitioner interface {
	Partitioner
	OnBatchSealed(topic string, partition, numPartitions int32)
}

// NewKafkaPartitioner returns the partitioner of Kafka's Java client: a record with a key goes to
// toPositive(Murmur2(key)) % numPartitions, so keys land where a Java producer puts them; a record
// without a key (nil; an empty key is hashed) goes to the topic's sticky partition, which moves to
// another random partition when its batch is sealed (KIP-480).
func NewKafkaPartitioner() StickyPartitioner { return &kafkaPartitioner{} }

type kafkaPartitioner struct {
	sticky sync.Map // topic → *atomic.Int32, the sticky partition (-1 none yet); entries are never removed
}

// state returns topic's sticky partition. The pointer stays the topic's for the partitioner's life, so
// a producer may keep it (ptopic.sticky) rather than look the topic up for every record.
func (k *kafkaPartitioner) state(topic string) *atomic.Int32 {
	if v, ok := k.sticky.Load(topic); ok {
		return v.(*atomic.Int32)
	}
	s := new(atomic.Int32)
	s.Store(-1)
	v, _ := k.sticky.LoadOrStore(topic, s)
	return v.(*atomic.Int32)
}

// Partition implements Partitioner.
func (k *kafkaPartitioner) Partition(r *Record, n int32) int32 {
	if r.Key != nil {
		return KeyPartition(r.Key, n)
	}
	return stickyPartition(k.state(r.Topic), n)
}

// stickyPartition returns the sticky partition s holds, first choosing one at random when there is none
// in [0, n) (none yet, or the topic had more partitions when it was chosen).
func stickyPartition(s *atomic.Int32, n int32) int32 {
	for {
		cur := s.Load()
		if cur >= 0 && cur < n {
			return cur
		}
		if s.CompareAndSwap(cur, rand.Int32N(n)) {
			continue // read it back: another goroutine may have raced us to a different choice
		}
	}
}

// OnBatchSealed implements StickyPartitioner: if partition was the topic's sticky partition, another
// one (different when there are several) becomes sticky.
func (k *kafkaPartitioner) OnBatchSealed(topic string, partition, n int32) {
	stickySealed(k.state(topic), partition, n)
}

// stickySealed moves the sticky partition s holds to another one of n when it is partition, whose
// batch was sealed.
func stickySealed(s *atomic.Int32, partition, n int32) {
	if s.Load() != partition {
		return
	}
	next := rand.Int32N(n)
	if n > 1 && next == partition {
		next = (next + 1 + rand.Int32N(n-1)) % n
	}
	s.CompareAndSwap(partition, next)
}

// KeyPartition returns the partition of Kafka's default partitioner for a record with key:
// toPositive(Murmur2(key)) % numPartitions, toPositive being h & 0x7fffffff (not abs).
func KeyPartition(key []byte, numPartitions int32) int32 {
	return int32(uint32(Murmur2(key))&0x7fffffff) % numPartitions
}

// Murmur2 is the 32-bit murmur2 hash exactly as Kafka's Java client computes it
// (org.apache.kafka.common.utils.Utils.murmur2: seed 0x9747b28c, little-endian 4-byte words), returned
// as Java's signed int.
func Murmur2(b []byte) int32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(b))
	n4 := len(b) / 4
	for i := 0; i < n4; i++ {
		k := binary.LittleEndian.Uint32(b[i*4:])
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := b[n4*4:]
	switch len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}
