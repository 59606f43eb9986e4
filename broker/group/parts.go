package group

import (
	"slices"
	"strconv"
	"strings"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// tp names one topic-partition.
type tp struct {
	topic string
	part  int32
}

// parts is a set of partitions: topic → partition numbers, sorted ascending without duplicates; no
// topic maps to an empty list. nil is the empty set. Methods never change their receiver; they return
// new sets (sharing no slices with the inputs), so a set handed out stays as it was.
type parts map[string][]int32

func (p parts) has(k tp) bool {
	_, ok := slices.BinarySearch(p[k.topic], k.part)
	return ok
}

func (p parts) size() int {
	n := 0
	for _, ps := range p {
		n += len(ps)
	}
	return n
}

func (p parts) topics() []string {
	ts := make([]string, 0, len(p))
	for t := range p {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// each calls fn for every partition in topic-partition order.
func (p parts) each(fn func(k tp)) {
	for _, t := range p.topics() {
		for _, n := range p[t] {
			fn(tp{t, n})
		}
	}
}

func (p parts) list() []tp {
	out := make([]tp, 0, p.size())
	p.each(func(k tp) { out = append(out, k) })
	return out
}

func (p parts) equal(q parts) bool {
	if len(p) != len(q) {
		return false
	}
	for t, ps := range p {
		if !slices.Equal(ps, q[t]) {
			return false
		}
	}
	return true
}

// filter returns the partitions of p for which keep holds.
func (p parts) filter(keep func(k tp) bool) parts {
	var out parts
	for t, ps := range p {
		var kept []int32
		for _, n := range ps {
			if keep(tp{t, n}) {
				kept = append(kept, n)
			}
		}
		if len(kept) > 0 {
			if out == nil {
				out = parts{}
			}
			out[t] = kept
		}
	}
	return out
}

func (p parts) minus(q parts) parts     { return p.filter(func(k tp) bool { return !q.has(k) }) }
func (p parts) intersect(q parts) parts { return p.filter(q.has) }

func (p parts) intersects(q parts) bool {
	for t, ps := range p {
		for _, n := range ps {
			if q.has(tp{t, n}) {
				return true
			}
		}
	}
	return false
}

// subsetOf reports whether every partition of p is in q.
func (p parts) subsetOf(q parts) bool {
	for t, ps := range p {
		for _, n := range ps {
			if !q.has(tp{t, n}) {
				return false
			}
		}
	}
	return true
}

func (p parts) union(q parts) parts {
	out := p.clone()
	q.each(func(k tp) { out = out.with(k) })
	return out
}

// with returns p plus k. Unlike the other methods it may reuse p's map (not its slices) when p is not
// nil, so callers use it on sets they own.
func (p parts) with(k tp) parts {
	if p == nil {
		p = parts{}
	}
	ps := p[k.topic]
	i, ok := slices.BinarySearch(ps, k.part)
	if ok {
		return p
	}
	p[k.topic] = slices.Insert(slices.Clone(ps), i, k.part)
	return p
}

func (p parts) clone() parts {
	if len(p) == 0 {
		return nil
	}
	out := make(parts, len(p))
	for t, ps := range p {
		out[t] = slices.Clone(ps)
	}
	return out
}

// proto returns p as wire TopicPartitions, topics sorted.
func (p parts) proto() []*runnelv1.TopicPartitions {
	out := make([]*runnelv1.TopicPartitions, 0, len(p))
	for _, t := range p.topics() {
		out = append(out, &runnelv1.TopicPartitions{Topic: t, Partitions: slices.Clone(p[t])})
	}
	return out
}

// String formats p as "t1:0,1,2 t2:5" ("-" when empty), for tests and logs.
func (p parts) String() string {
	if len(p) == 0 {
		return "-"
	}
	var b strings.Builder
	for i, t := range p.topics() {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(t)
		b.WriteByte(':')
		for j, n := range p[t] {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(int(n)))
		}
	}
	return b.String()
}

// partsFromProto validates and normalises wire partitions: topics non-empty, partitions >= 0, at most
// limit partitions in all. Duplicates merge. Errors are INVALID_REQUEST naming what.
func partsFromProto(what string, in []*runnelv1.TopicPartitions, limit int) (parts, error) {
	var out parts
	n := 0
	for _, tps := range in {
		if tps == nil {
			continue
		}
		if tps.Topic == "" {
			return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s: a topic name is empty", what)
		}
		n += len(tps.Partitions)
		if n > limit {
			return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s: more than %d partitions", what, limit)
		}
		for _, pn := range tps.Partitions {
			if pn < 0 {
				return nil, rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s: negative partition %d of topic %q", what, pn, tps.Topic)
			}
			out = out.with(tp{tps.Topic, pn})
		}
	}
	return out, nil
}

// partsFromMap converts an assignor's topic → partitions map (sorted lists) into a set.
func partsFromMap(m map[string][]int32) parts {
	var out parts
	for t, ps := range m {
		if len(ps) == 0 {
			continue
		}
		if out == nil {
			out = parts{}
		}
		out[t] = slices.Clone(ps)
	}
	return out
}
