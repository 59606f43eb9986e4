package assignor

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// specGen draws a group: up to 12 members over up to 4 topics, homogeneous or not, with some previous
// target (possibly stale: partitions that no longer exist or that another member also claims).
func specGen(homogeneous bool) *rapid.Generator[Spec] {
	return rapid.Custom(func(t *rapid.T) Spec {
		nt := rapid.IntRange(1, 4).Draw(t, "topics")
		s := Spec{Partitions: map[string]int32{}}
		var topics []string
		for i := 0; i < nt; i++ {
			name := fmt.Sprintf("t%d", i)
			topics = append(topics, name)
			s.Partitions[name] = int32(rapid.IntRange(0, 12).Draw(t, "partitions"))
		}
		nm := rapid.IntRange(0, 12).Draw(t, "members")
		for i := 0; i < nm; i++ {
			m := Member{ID: fmt.Sprintf("m%02d", i), Current: map[string][]int32{}}
			if i%3 == 0 {
				m.InstanceID = fmt.Sprintf("i%02d", nm-i)
			}
			if homogeneous {
				m.Topics = topics
			} else {
				for _, tn := range topics {
					if rapid.Bool().Draw(t, "sub") {
						m.Topics = append(m.Topics, tn)
					}
				}
			}
			for _, tn := range topics {
				ps := rapid.SliceOfNDistinct(rapid.Int32Range(0, 14), 0, 6, rapid.ID[int32]).Draw(t, "current")
				slices.Sort(ps)
				if len(ps) > 0 {
					m.Current[tn] = ps
				}
			}
			s.Members = append(s.Members, m)
		}
		return s
	})
}

// checkValid asserts that every partition of a subscribed topic goes to exactly one subscriber.
func checkValid(t *rapid.T, s Spec, a Assignment) map[string]int {
	count := map[string]int{}
	owner := map[tp]string{}
	for _, m := range s.Members {
		got, ok := a[m.ID]
		if !ok {
			t.Fatalf("member %s missing from the assignment", m.ID)
		}
		for topic, ps := range got {
			if !slices.Contains(m.Topics, topic) {
				t.Fatalf("%s got %s without subscribing", m.ID, topic)
			}
			if !slices.IsSorted(ps) || len(ps) == 0 {
				t.Fatalf("%s: partitions of %s not sorted or empty: %v", m.ID, topic, ps)
			}
			for _, p := range ps {
				k := tp{topic, p}
				if o, dup := owner[k]; dup {
					t.Fatalf("%s-%d assigned to %s and %s", topic, p, o, m.ID)
				}
				if p < 0 || p >= s.Partitions[topic] {
					t.Fatalf("%s got %s-%d, which does not exist", m.ID, topic, p)
				}
				owner[k] = m.ID
				count[m.ID]++
			}
		}
	}
	for topic, n := range s.Partitions {
		subscribed := false
		for _, m := range s.Members {
			subscribed = subscribed || slices.Contains(m.Topics, topic)
		}
		for p := int32(0); subscribed && p < n; p++ {
			if _, ok := owner[tp{topic, p}]; !ok {
				t.Fatalf("%s-%d is subscribed but not assigned", topic, p)
			}
		}
	}
	return count
}

// checkBalanced asserts the uniform assignor's balance: no partition could go to another subscriber of
// its topic that holds at least two fewer.
func checkBalanced(t *rapid.T, s Spec, a Assignment, count map[string]int) {
	for _, m := range s.Members {
		for topic := range a[m.ID] {
			for _, o := range s.Members {
				if slices.Contains(o.Topics, topic) && count[o.ID] < count[m.ID]-1 {
					t.Fatalf("unbalanced: %s holds %d, %s (subscribed to %s) holds %d", m.ID, count[m.ID], o.ID, topic, count[o.ID])
				}
			}
		}
	}
}

func TestUniformValidAndBalanced(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := specGen(rapid.Bool().Draw(t, "homogeneous")).Draw(t, "spec")
		a := uniform{}.Assign(s)
		checkBalanced(t, s, a, checkValid(t, s, a))
		if again := (uniform{}).Assign(s); !reflect.DeepEqual(a, again) {
			t.Fatalf("not deterministic")
		}
	})
}

func TestRangeValid(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := specGen(rapid.Bool().Draw(t, "homogeneous")).Draw(t, "spec")
		a := rangeAssignor{}.Assign(s)
		checkValid(t, s, a)
	})
}

// TestUniformSticky: assigning again from a balanced target moves nothing; after one member joins or
// leaves a homogeneous group, only the partitions that must move do.
func TestUniformSticky(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		homog := rapid.Bool().Draw(t, "homogeneous")
		s := specGen(homog).Draw(t, "spec")
		first := uniform{}.Assign(s)
		withCurrent := func(s Spec, a Assignment) Spec {
			out := Spec{Partitions: s.Partitions}
			for _, m := range s.Members {
				m.Current = a[m.ID]
				out.Members = append(out.Members, m)
			}
			return out
		}
		s2 := withCurrent(s, first)
		if again := (uniform{}).Assign(s2); !reflect.DeepEqual(first, again) {
			t.Fatalf("a balanced target changed when nothing else did:\n%v\n%v", first, again)
		}
		if !homog || len(s.Members) == 0 {
			return
		}
		total := 0
		for _, n := range s.Partitions {
			total += int(n)
		}
		// A member joins: it takes floor(total/(n+1)) or one more, and nothing else moves.
		joined := s2
		joined.Members = append(slices.Clone(s2.Members), Member{ID: "new", Topics: s2.Members[0].Topics})
		after := uniform{}.Assign(joined)
		got := size(after["new"])
		moved := 0
		for _, m := range s2.Members {
			moved += size(first[m.ID]) - size(intersect(first[m.ID], after[m.ID]))
		}
		if moved != got {
			t.Fatalf("join moved %d partitions, the new member got %d", moved, got)
		}
		// A member leaves: only its partitions move.
		left := Spec{Partitions: s2.Partitions, Members: s2.Members[1:]}
		after = uniform{}.Assign(left)
		for _, m := range left.Members {
			if kept := size(intersect(first[m.ID], after[m.ID])); kept != size(first[m.ID]) {
				t.Fatalf("%s lost %d partitions when another member left", m.ID, size(first[m.ID])-kept)
			}
		}
	})
}

// TestUniformDonorOrder: when partitions must move off equally loaded members, the ones listed first
// give them up (the coordinator lists members whose heartbeat is due soonest first).
func TestUniformDonorOrder(t *testing.T) {
	s := Spec{Partitions: map[string]int32{"t": 8}}
	for i, ps := range [][]int32{{0, 1}, {2, 3}, {4, 5}, {6, 7}} {
		s.Members = append(s.Members, Member{ID: fmt.Sprintf("m%d", 3-i), Topics: []string{"t"}, Current: map[string][]int32{"t": ps}})
	}
	s.Members = append(s.Members, Member{ID: "new", Topics: []string{"t"}})
	a := uniform{}.Assign(s)
	// 8 partitions over 5 members: three keep 2, the new one and the first-listed (m3) keep or get 1.
	want := Assignment{"m3": {"t": {0}}, "m2": {"t": {2, 3}}, "m1": {"t": {4, 5}}, "m0": {"t": {6, 7}}, "new": {"t": {1}}}
	if !reflect.DeepEqual(a, want) {
		t.Fatalf("got %v, want %v", a, want)
	}
}

func TestRangeLayout(t *testing.T) {
	s := Spec{Partitions: map[string]int32{"a": 5, "b": 2}, Members: []Member{
		{ID: "z", InstanceID: "i1", Topics: []string{"a", "b"}},
		{ID: "y", Topics: []string{"a"}},
		{ID: "x", InstanceID: "i0", Topics: []string{"a", "b"}},
	}}
	got := rangeAssignor{}.Assign(s)
	// Sorted by instance id, else member id: i0 (x), i1 (z), y.
	want := Assignment{"x": {"a": {0, 1}, "b": {0}}, "z": {"a": {2, 3}, "b": {1}}, "y": {"a": {4}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestGet(t *testing.T) {
	for _, n := range Names() {
		if a, ok := Get(n); !ok || a.Name() != n {
			t.Fatalf("Get(%q)", n)
		}
	}
	if _, ok := Get("sticky"); ok {
		t.Fatal("unknown assignor found")
	}
}

// BenchmarkUniform50x600 is the join benchmark's group: 51 members over 600 partitions, one new.
func BenchmarkUniform50x600(b *testing.B) {
	s := Spec{Partitions: map[string]int32{"t": 600}}
	for i := 0; i < 50; i++ {
		var ps []int32
		for p := i * 12; p < i*12+12; p++ {
			ps = append(ps, int32(p))
		}
		s.Members = append(s.Members, Member{ID: fmt.Sprintf("m%02d", i), Topics: []string{"t"}, Current: map[string][]int32{"t": ps}})
	}
	s.Members = append(s.Members, Member{ID: "new", Topics: []string{"t"}})
	for b.Loop() {
		uniform{}.Assign(s)
	}
}

func size(m map[string][]int32) int {
	n := 0
	for _, ps := range m {
		n += len(ps)
	}
	return n
}

func intersect(a, b map[string][]int32) map[string][]int32 {
	out := map[string][]int32{}
	for _, topic := range slices.Sorted(maps.Keys(a)) {
		for _, p := range a[topic] {
			if slices.Contains(b[topic], p) {
				out[topic] = append(out[topic], p)
			}
		}
	}
	return out
}
