package assignor

import (
	"cmp"
	"slices"
)

// rangeAssignor is Kafka's range assignor run on the broker.
type rangeAssignor struct{}

// Name implements Assignor.
func (rangeAssignor) Name() string { return Range }

// Assign splits each topic's partitions into contiguous ranges over the members subscribed to it, sorted
// by instance id (or member id for dynamic members, after every static one with the same key), so a
// static member keeps its place across restarts.
func (rangeAssignor) Assign(s Spec) Assignment {
	owned := make([][]tp, len(s.Members))
	byTopic := map[string][]int{}
	for i, m := range s.Members {
		for _, t := range m.Topics {
			if _, ok := s.Partitions[t]; !ok {
				continue
			}
			if ms := byTopic[t]; len(ms) > 0 && ms[len(ms)-1] == i {
				continue // a duplicate topic in m.Topics
			}
			byTopic[t] = append(byTopic[t], i)
		}
	}
	key := func(i int) string {
		if s.Members[i].InstanceID != "" {
			return s.Members[i].InstanceID
		}
		return s.Members[i].ID
	}
	for _, t := range sortedKeys(byTopic) {
		ms := byTopic[t]
		slices.SortFunc(ms, func(a, b int) int {
			if c := cmp.Compare(key(a), key(b)); c != 0 {
				return c
			}
			return cmp.Compare(s.Members[a].ID, s.Members[b].ID)
		})
		np := int(s.Partitions[t])
		per, extra := np/len(ms), np%len(ms)
		start := 0
		for j, i := range ms {
			c := per
			if j < extra {
				c++
			}
			for p := start; p < start+c; p++ {
				owned[i] = append(owned[i], tp{t, int32(p)})
			}
			start += c
		}
	}
	return build(s.Members, owned)
}
