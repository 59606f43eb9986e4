package main

import (
	"context"
	"time"
)

// AckFunc is called once per record when the system acknowledged it (err nil) or gave up on it.
// intended is the time its latency is measured from (the actual send time in throughput runs; in
// paced runs the schedule's time, or the pacer's clock reading before an early send); bytes counts its key
// and value. It may run on any goroutine.
type AckFunc func(intended time.Time, bytes int, err error)

// RecordFunc is called for every record a consumer reads; it may run on several goroutines at once.
// key and value are valid only during the call (the Runnel driver reads with PollFunc, which reuses them).
type RecordFunc func(key, value []byte)

// Driver is one system under test as the harness sees it, through that system's own Go client. A
// "topic" with n partitions is a Runnel topic, n JetStream streams, or n Redis streams.
type Driver interface {
	CreateTopic(ctx context.Context, topic string, partitions int) error
	// NewProducer returns a producer with its own connection.
	NewProducer(ctx context.Context, topic string, partitions int, ack AckFunc) (Producer, error)
	// NewConsumer returns a consumer of every partition of topic, from the first record.
	NewConsumer(ctx context.Context, topic string, partitions int) (Consumer, error)
	Close() error
}

// Producer sends records asynchronously. Send is called from one goroutine at a time (each of the
// harness's producing goroutines has its own Producer); Flush and Close after the last Send.
type Producer interface {
	// Send hands over one record for partition (-1: no key, the producer picks, sticky for a while as
	// Kafka's sticky partitioner does). It may block while the client applies back-pressure. key and
	// value must not change until the record is acknowledged.
	Send(ctx context.Context, partition int32, key, value []byte, intended time.Time)
	// Flush waits until every record sent has been acknowledged or has failed.
	Flush(ctx context.Context) error
	Close() error
}

// Consumer reads records until its context ends.
type Consumer interface {
	// Run calls fn for every record read, until ctx ends or a fatal error.
	Run(ctx context.Context, fn RecordFunc) error
	Close() error
}

// sticky picks partitions for keyless records on the peers' producers: it stays on one partition for
// stickyRecords records, then moves to the next, so records go in runs as Kafka's sticky partitioner
// sends them (Runnel's SDK does the same per batch on its own).
type sticky struct {
	n, cur, left int32
}

const stickyRecords = 1000

func newSticky(n int, seed int) *sticky {
	return &sticky{n: int32(n), cur: int32(seed % n)}
}

func (s *sticky) next(partition int32) int32 {
	if partition >= 0 {
		return partition
	}
	if s.left == 0 {
		s.cur = (s.cur + 1) % s.n
		s.left = stickyRecords
	}
	s.left--
	return s.cur
}
