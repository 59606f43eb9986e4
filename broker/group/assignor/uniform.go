package assignor

import (
	"cmp"
	"slices"
)

// uniform is the sticky, balanced assignor (KIP-848's UniformAssignor).
type uniform struct{}

// Name implements Assignor.
func (uniform) Name() string { return Uniform }

// Assign keeps every previous owner that is still subscribed, then balances. When every member
// subscribes to the same topics (the common case) balance means partition counts within one of each
// other, reached in one pass that moves only what must move. Otherwise it assigns the partitions with
// the fewest candidate members first to the least loaded candidate, then moves single partitions from a
// member to a candidate with at least two fewer until no such move exists; every move lowers the sum of
// squared counts, so this ends.
func (uniform) Assign(s Spec) Assignment {
	n := len(s.Members)
	if n == 0 {
		return Assignment{}
	}
	subs := make([]map[string]bool, n)
	eligible := map[string][]int{} // topic → member indexes subscribed to it, ascending
	for i, m := range s.Members {
		subs[i] = make(map[string]bool, len(m.Topics))
		for _, t := range m.Topics {
			if _, ok := s.Partitions[t]; !ok || subs[i][t] {
				continue
			}
			subs[i][t] = true
			eligible[t] = append(eligible[t], i)
		}
	}
	var all []tp // every partition some member can take, in topic-partition order
	for _, t := range sortedKeys(eligible) {
		for p := int32(0); p < s.Partitions[t]; p++ {
			all = append(all, tp{t, p})
		}
	}
	byID := make([]int, n) // member indexes in member id order: ties never depend on input order
	for i := range byID {
		byID[i] = i
	}
	slices.SortFunc(byID, func(a, b int) int { return cmp.Compare(s.Members[a].ID, s.Members[b].ID) })

	owner := make(map[tp]int, len(all))
	count := make([]int, n)
	for _, i := range byID {
		cur := s.Members[i].Current
		for _, t := range sortedKeys(cur) {
			if !subs[i][t] {
				continue
			}
			for _, p := range cur[t] {
				k := tp{t, p}
				if p < 0 || p >= s.Partitions[t] {
					continue
				}
				if _, taken := owner[k]; taken {
					continue // a previous target never has two owners; keep the first if it did
				}
				owner[k] = i
				count[i]++
			}
		}
	}
	if homogeneous(subs) {
		balanceHomogeneous(all, owner, count, byID)
	} else {
		balanceHeterogeneous(s.Members, all, owner, count, eligible)
	}
	owned := make([][]tp, n)
	for _, k := range all {
		if i, ok := owner[k]; ok {
			owned[i] = append(owned[i], k)
		}
	}
	return build(s.Members, owned)
}

// homogeneous reports whether every member subscribes to the same topics.
func homogeneous(subs []map[string]bool) bool {
	for _, s := range subs[1:] {
		if len(s) != len(subs[0]) {
			return false
		}
		for t := range s {
			if !subs[0][t] {
				return false
			}
		}
	}
	return true
}

// balanceHomogeneous gives each member floor(P/N) partitions and P mod N of them one more. The extra ones
// go to the members that keep the most, and among equals to those latest in donor order, so members
// early in donor order give up partitions first. A member above its quota gives up its last partitions;
// the free partitions go round-robin (member id order) to members below theirs.
func balanceHomogeneous(all []tp, owner map[tp]int, count []int, byID []int) {
	n := len(count)
	base, extra := len(all)/n, len(all)%n
	rank := make([]int, n)
	for i := range rank {
		rank[i] = i
	}
	slices.SortStableFunc(rank, func(a, b int) int {
		if c := cmp.Compare(count[b], count[a]); c != 0 {
			return c
		}
		return cmp.Compare(b, a)
	})
	quota := make([]int, n)
	for pos, i := range rank {
		quota[i] = base
		if pos < extra {
			quota[i]++
		}
	}
	mine := make([][]tp, n)
	for _, k := range all {
		if i, ok := owner[k]; ok {
			mine[i] = append(mine[i], k)
		}
	}
	for i := range mine {
		if count[i] > quota[i] {
			for _, k := range mine[i][quota[i]:] {
				delete(owner, k)
			}
			count[i] = quota[i]
		}
	}
	var receivers []int
	for _, i := range byID {
		if count[i] < quota[i] {
			receivers = append(receivers, i)
		}
	}
	next := 0
	for _, k := range all {
		if _, ok := owner[k]; ok {
			continue
		}
		// The free partitions number exactly the room left, so some receiver has room.
		for count[receivers[next]] >= quota[receivers[next]] {
			next = (next + 1) % len(receivers)
		}
		i := receivers[next]
		owner[k] = i
		count[i]++
		next = (next + 1) % len(receivers)
	}
}

// balanceHeterogeneous assigns free partitions to the least loaded eligible member, scarcest topics
// first, then moves partitions one at a time until no partition can go to an eligible member with at
// least two fewer partitions than its owner.
func balanceHeterogeneous(members []Member, all []tp, owner map[tp]int, count []int, eligible map[string][]int) {
	least := func(k tp) int {
		best := -1
		for _, i := range eligible[k.topic] {
			if best < 0 || count[i] < count[best] || count[i] == count[best] && members[i].ID < members[best].ID {
				best = i
			}
		}
		return best
	}
	var free []tp
	for _, k := range all {
		if _, ok := owner[k]; !ok {
			free = append(free, k)
		}
	}
	slices.SortStableFunc(free, func(a, b tp) int { return cmp.Compare(len(eligible[a.topic]), len(eligible[b.topic])) })
	for _, k := range free {
		i := least(k)
		owner[k] = i
		count[i]++
	}
	n := len(members)
	order := make([]int, n)
	for {
		mine := make([][]tp, n)
		for _, k := range all {
			mine[owner[k]] = append(mine[owner[k]], k)
		}
		for i := range order {
			order[i] = i
		}
		// The most loaded give first; among equals, those early in donor order.
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(count[b], count[a]) })
		moved := false
		for _, a := range order {
			for _, k := range mine[a] {
				if b := least(k); count[b] < count[a]-1 {
					owner[k] = b
					count[a]--
					count[b]++
					moved = true
				}
			}
		}
		if !moved {
			return
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
