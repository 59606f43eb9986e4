// Package assignor computes a consumer group's target assignment on the broker, as KIP-848's server-side
// assignors do: given the members, what each subscribes to and the previous target, it says which member
// should own each partition. It is a pure function of its input (no clock, no randomness, no map-order
// dependence), so the group coordinator that calls it stays deterministic.
//
// Two assignors exist, with KIP-848's names:
//
//   - "uniform" (the default, Kafka's UniformAssignor): balanced and sticky. Every member ends with a
//     partition count within one of every other member that could take its partitions, and partitions
//     stay with their previous owner wherever that keeps the balance, so a rebalance moves the fewest
//     partitions. When some partitions must move and several members could give them up, the member
//     listed earlier in Spec.Members gives them up: the coordinator lists members by when it expects their
//     next heartbeat, so the revocations it needs are heard soonest.
//   - "range" (Kafka's RangeAssignor): per topic, the subscribed members sorted by instance id (member id
//     for dynamic members) get contiguous ranges of partitions, the first ones one more when the count
//     does not divide. Members subscribed to co-partitioned topics get the same partition numbers of
//     each, which joins need. It is not sticky.
package assignor

import (
	"cmp"
	"slices"
)

// Names of the assignors, as GroupHeartbeatRequest.server_assignor carries them.
const (
	Uniform = "uniform"
	Range   = "range"
	// Default is used when no member asks for an assignor.
	Default = Uniform
)

// Member is one group member as an assignor sees it.
type Member struct {
	// ID is the member id; InstanceID the static member's instance id ("" for dynamic members).
	ID         string
	InstanceID string
	// Topics are the topics the member subscribes to that exist, sorted, without duplicates.
	Topics []string
	// Current is the member's previous target assignment: topic → sorted partition numbers. Partitions
	// of topics the member no longer subscribes to, or that no longer exist, are ignored.
	Current map[string][]int32
}

// Spec is the input of an assignment.
type Spec struct {
	// Members in donor order: where partitions must move and several members could give them up, earlier
	// members give them up first. Member ids are unique.
	Members []Member
	// Partitions maps every topic some member subscribes to to its partition count.
	Partitions map[string]int32
}

// Assignment maps member id → topic → sorted partition numbers. Every member of the Spec has an entry
// (possibly empty); topics with no partitions for a member are absent from its map.
type Assignment map[string]map[string][]int32

// Assignor computes a target assignment.
type Assignor interface {
	// Name is the name members ask for in server_assignor.
	Name() string
	// Assign returns the target assignment for spec: every partition of every subscribed topic goes to
	// exactly one member subscribed to its topic (none when no member subscribes).
	Assign(spec Spec) Assignment
}

// Get returns the assignor called name.
func Get(name string) (Assignor, bool) {
	switch name {
	case Uniform:
		return uniform{}, true
	case Range:
		return rangeAssignor{}, true
	}
	return nil, false
}

// Names lists the assignors in preference order: when members ask for different ones and two are asked
// for equally often, the earlier one wins.
func Names() []string { return []string{Uniform, Range} }

// tp is one topic-partition.
type tp struct {
	topic string
	part  int32
}

func cmpTP(a, b tp) int {
	if c := cmp.Compare(a.topic, b.topic); c != 0 {
		return c
	}
	return cmp.Compare(a.part, b.part)
}

// build turns per-member partition lists into an Assignment with sorted partitions.
func build(members []Member, owned [][]tp) Assignment {
	out := make(Assignment, len(members))
	for i, m := range members {
		a := map[string][]int32{}
		for _, p := range owned[i] {
			a[p.topic] = append(a[p.topic], p.part)
		}
		for _, ps := range a {
			slices.Sort(ps)
		}
		out[m.ID] = a
	}
	return out
}
