package client

import "testing"

// BenchmarkStickyPartition is the built-in partitioner's work for a keyless record of a 12-partition
// topic: through the Partitioner interface, which looks the topic up in the partitioner, and as the
// producer does it, through the topic's state the producer keeps (ptopic.sticky).
func BenchmarkStickyPartition(b *testing.B) {
	k := NewKafkaPartitioner().(*kafkaPartitioner)
	r := &Record{Topic: "bench-topic", Partition: -1}
	b.Run("interface", func(b *testing.B) {
		var sum int32
		for b.Loop() {
			sum += k.Partition(r, 12)
		}
		if sum < 0 {
			b.Fatal(sum)
		}
	})
	b.Run("cached", func(b *testing.B) {
		s := k.state(r.Topic)
		var sum int32
		for b.Loop() {
			sum += stickyPartition(s, 12)
		}
		if sum < 0 {
			b.Fatal(sum)
		}
	})
}
