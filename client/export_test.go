package client

// Crash abandons the group consumer as a crashed process would: no commit, no leave heartbeat, its
// goroutines stopped and connections cut. The coordinator removes the member after its session timeout.
func (g *GroupConsumer) Crash() { g.crash() }
