package client

import "time"

// WithOpenHold sets how long natural batching holds a batch that is not full for the requests in
// flight (defaultOpenHold otherwise), so that a test can hold answers back for longer than that.
func WithOpenHold(d time.Duration) ProducerOption {
	return producerOpt(func(c *producerConfig) { c.openHold = d })
}

// Crash abandons the group consumer as a crashed process would: no commit, no leave heartbeat, its
// goroutines stopped and connections cut. The coordinator removes the member after its session timeout.
func (g *GroupConsumer) Crash() { g.crash() }

// OpenBatches sums the partitions' counts of batches sent and not finished (ppart.open): 0 once every
// promise has run.
func (p *Producer) OpenBatches() int {
	n := 0
	for _, pp := range *p.allParts.Load() {
		pp.mu.Lock()
		n += pp.open
		pp.mu.Unlock()
	}
	return n
}

// StopFetching stops the consumer fetching a partition the member still owns, as the heartbeat loop
// does for a revoked partition before the next Poll finishes the revocation.
func (g *GroupConsumer) StopFetching(topic string, partition int32) { g.c.Unassign(topic, partition) }
