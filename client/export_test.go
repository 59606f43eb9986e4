package client

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
