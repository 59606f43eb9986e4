package meta

import (
	"slices"
	"sort"
)

// assignReplicas places partitions partitions of rf replicas each over brokers (sorted by id), the
// way Kafka's AdminUtils.assignReplicasToBrokers does: leaders go round the brokers from start, and the
// followers of each round are shifted by one more, so leaders and followers both spread evenly and a
// failed broker's load spreads over all the others. When racks are set the brokers are first
// interleaved by rack (Kafka's rack-alternated list) and followers prefer racks the partition does not
// use yet, so rf <= racks puts every replica on a different rack. start comes from the topic number, so
// topics created one after another do not all start on the same broker and the result is the same on
// every node.
func assignReplicas(brokers []*Broker, partitions, rf int32, start uint64) [][]int32 {
	list := rackAlternated(brokers)
	n := len(list)
	racks := map[string]bool{}
	for _, b := range list {
		racks[b.Rack] = true
	}
	out := make([][]int32, partitions)
	first := int(start % uint64(n))
	shift := int(start % uint64(n))
	for p := 0; p < int(partitions); p++ {
		if p > 0 && p%n == 0 {
			shift++
		}
		leader := (p + first) % n
		replicas := []int32{list[leader].ID}
		usedRacks := map[string]bool{list[leader].Rack: true}
		for j := 0; len(replicas) < int(rf) && j < 2*n; j++ {
			idx := followerIndex(leader, shift, j, n)
			b := list[idx]
			if slices.Contains(replicas, b.ID) {
				continue
			}
			// Prefer a new rack while some rack is still unused by this partition; the second pass
			// (j >= n) takes any broker.
			if j < n && len(usedRacks) < len(racks) && usedRacks[b.Rack] {
				continue
			}
			replicas = append(replicas, b.ID)
			usedRacks[b.Rack] = true
		}
		out[p] = replicas
	}
	return out
}

// followerIndex is the j-th candidate follower of the replica at leader: Kafka's
// (first + 1 + (shift + j) mod (n-1)) mod n, extended past n-1 candidates for the rack pass.
func followerIndex(leader, shift, j, n int) int {
	if n == 1 {
		return leader
	}
	return (leader + 1 + (shift+j)%(n-1)) % n
}

// rackAlternated orders brokers rack by rack in turn (rack a's first, rack b's first, ..., rack a's
// second, ...), racks and brokers within a rack sorted, so neighbours in the list are on different
// racks. Without racks it is the brokers sorted by id.
func rackAlternated(brokers []*Broker) []*Broker {
	byRack := map[string][]*Broker{}
	for _, b := range brokers {
		byRack[b.Rack] = append(byRack[b.Rack], b)
	}
	if len(byRack) <= 1 {
		out := slices.Clone(brokers)
		sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
		return out
	}
	racks := make([]string, 0, len(byRack))
	for r, bs := range byRack {
		racks = append(racks, r)
		sort.Slice(bs, func(i, j int) bool { return bs[i].ID < bs[j].ID })
	}
	sort.Strings(racks)
	var out []*Broker
	for i := 0; len(out) < len(brokers); i++ {
		for _, r := range racks {
			if i < len(byRack[r]) {
				out = append(out, byRack[r][i])
			}
		}
	}
	return out
}
