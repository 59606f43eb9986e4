package group

// Status is what the broker's metrics need of one group (client/telemetry: rebalances, their duration,
// members). Reading it changes nothing, so observing a group never perturbs the core.
type Status struct {
	// Epoch is the group epoch, which bumps with every rebalance.
	Epoch int32
	// Settled is true when the group is stable (every member owns its target at the assignment epoch)
	// or empty: no rebalance is in progress.
	Settled bool
	// Members counts the members, static members that left and whose partitions are reserved included.
	Members int
}

func (g *group) status() Status {
	st := g.state()
	return Status{Epoch: g.epoch, Settled: st == StateStable || st == StateEmpty, Members: len(g.members)}
}

// GroupStatus returns the status of group id, and false when the group has no membership state (it is
// unknown, or has only committed offsets). It costs a walk over the group's members.
func (c *Coordinator) GroupStatus(id string) (Status, bool) {
	g := c.groups[id]
	if g == nil {
		return Status{}, false
	}
	return g.status(), true
}

// EachGroup calls fn with every group that has membership state, in no particular order.
func (c *Coordinator) EachGroup(fn func(id string, s Status)) {
	for id, g := range c.groups {
		fn(id, g.status())
	}
}

// EachCommitted calls fn with every durable committed offset (the next offset to read), in no
// particular order: what lag is computed from.
func (c *Coordinator) EachCommitted(fn func(group, topic string, partition int32, offset int64)) {
	for gid, offs := range c.offsets {
		for k, o := range offs {
			fn(gid, k.topic, k.part, o.Offset)
		}
	}
}
