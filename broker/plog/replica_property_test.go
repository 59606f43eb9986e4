package plog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/runnel-io/runnel/client/batch"
)

// rapidTB lets the package's test helpers (which take a testing.TB) fail a rapid property, so rapid
// shrinks the failing case.
type rapidTB struct {
	testing.TB
	rt *rapid.T
}

func (r rapidTB) Helper()                   {}
func (r rapidTB) Fatal(args ...any)         { r.rt.Fatal(args...) }
func (r rapidTB) Fatalf(f string, a ...any) { r.rt.Fatalf(f, a...) }
func (r rapidTB) Errorf(f string, a ...any) { r.rt.Errorf(f, a...) }

// replicaModel drives three replicas of one partition in one store through leader appends, follower
// fetches (ReadLocal → AppendReplica), elections (clean or not: any replica may become leader, so logs
// diverge), truncation by the leader-epoch exchange (KIP-101/KIP-279), extra truncations at
// EndOffsetForEpoch answers or anywhere, and restarts.
type replicaModel struct {
	tb     rapidTB
	rt     *rapid.T
	s      **Store
	o      Options
	topic  uint64
	reps   []*Partition
	leader int
	epoch  int32
	// synced: the follower ran the epoch exchange since the last election, so its log is a prefix of
	// the leader's.
	synced []bool
	lastHW []int64
	ts     int64
}

func (m *replicaModel) open() {
	for i := range m.reps {
		m.reps[i] = mustPartition(m.tb, *m.s, PartitionID{TopicNum: m.topic, Partition: int32(i)})
	}
}

// reconcile runs the follower side of the leader-epoch exchange against the leader as the broker's
// fetcher does: ask for the end of the follower's latest epoch and truncate where TruncationOffset
// says, again while it reports the exchange incomplete.
//
// The exchange must keep exactly the longest run of batches the follower shares with the leader, byte
// for byte at the same offsets (each epoch has one leader, so batches of one epoch at one offset are
// the same): less would cut acknowledged records, more would keep batches the leader does not have.
func (m *replicaModel) reconcile(f *Partition) {
	leader := m.reps[m.leader]
	keep, shared := commonPrefix(m.tb, f, leader)
	defer func() {
		switch {
		case shared == 0 && f.Size() != 0:
			m.rt.Fatalf("%s shares no batch with the leader but keeps %d bytes after the exchange", f.ID(), f.Size())
		case shared > 0 && f.LogEndOffset() != keep:
			m.rt.Fatalf("%s shares %d batches (up to %d) with the leader but ends at %d after the exchange", f.ID(), shared, keep, f.LogEndOffset())
		}
	}()
	for range 64 {
		if f.LatestEpoch() < 0 {
			m.truncate(f, 0) // an empty log (every batch here has an epoch): the model copies from 0
			return
		}
		end, le := leader.EndOffsetForEpoch(f.LatestEpoch())
		off, complete := f.TruncationOffset(le, end)
		m.truncate(f, off)
		if complete {
			return
		}
	}
	m.rt.Fatal("the epoch exchange did not converge")
}

// commonPrefix returns how many of f's batches, from its log start, the leader holds byte for byte at
// the same offsets, and where the last of them ends.
func commonPrefix(tb testing.TB, f, leader *Partition) (end int64, n int) {
	theirs := map[int64][]byte{}
	_ = batch.Split(readLocalAll(tb, leader, leader.LogStartOffset()), func(b []byte, h batch.Header) error {
		theirs[h.BaseOffset] = b
		return nil
	})
	end = f.LogStartOffset()
	_ = batch.Split(readLocalAll(tb, f, f.LogStartOffset()), func(b []byte, h batch.Header) error {
		if !bytes.Equal(theirs[h.BaseOffset], b) {
			return errStop
		}
		end, n = h.NextOffset(), n+1
		return nil
	})
	return end, n
}

var errStop = errors.New("stop")

func (m *replicaModel) truncate(p *Partition, off int64) {
	before := p.LogEndOffset()
	end, err := p.Truncate(off)
	if err != nil {
		m.rt.Fatalf("truncate %s to %d: %v", p.ID(), off, err)
	}
	switch {
	case off < before && end <= off, off == before && end == before:
	case off > before && end == off && p.LogStartOffset() == off && p.Size() == 0:
		m.synced[slices.Index(m.reps, p)] = false // restarted above its old end: exchange again
	default:
		m.rt.Fatalf("truncate %s (LEO %d) to %d returned %d", p.ID(), before, off, end)
	}
	if p.LogEndOffset() != end || p.DurableEnd() != end || p.HighWatermark() > end {
		m.rt.Fatalf("after truncate to %d: LEO %d durable %d HW %d", end, p.LogEndOffset(), p.DurableEnd(), p.HighWatermark())
	}
	m.lastHW[slices.Index(m.reps, p)] = p.HighWatermark()
}

// fetch copies from the leader to follower f, once or until caught up, and moves the HWs as the
// replication layer would: the follower to min(leader's HW, own LEO), the leader to the min LEO over
// all replicas once every follower ran its exchange (before that the leader knows no follower LEO).
func (m *replicaModel) fetch(f *Partition, maxBytes int, all bool) {
	leader := m.reps[m.leader]
	for {
		from := f.LogEndOffset()
		b, err := leader.ReadLocal(nil, from, maxBytes)
		if err != nil {
			m.rt.Fatalf("leader read local at %d: %v", from, err)
		}
		if len(b) == 0 {
			break
		}
		if h, _ := batch.ParseHeader(b); h.BaseOffset != from {
			m.rt.Fatalf("leader's batch at %d for a follower at %d: not a batch boundary", h.BaseOffset, from)
		}
		end, err := f.AppendReplica(context.Background(), b, AppendOptions{Sync: true})
		if err != nil {
			m.rt.Fatalf("append replica at %d: %v", from, err)
		}
		if end <= from {
			m.rt.Fatalf("append replica at %d returned %d", from, end)
		}
		if !all {
			break
		}
	}
	if !slices.Contains(m.synced, false) {
		hw := leader.DurableEnd()
		for _, p := range m.reps {
			hw = min(hw, p.LogEndOffset())
		}
		if err := leader.SetHighWatermark(hw); err != nil {
			m.rt.Fatal(err)
		}
	}
	if err := f.SetHighWatermark(min(leader.HighWatermark(), f.LogEndOffset())); err != nil {
		m.rt.Fatal(err)
	}
}

// check verifies every replica's bookkeeping against its batches, and that a synced follower's log is
// a prefix of the leader's.
func (m *replicaModel) check() {
	leaderLog := readLocalAll(m.tb, m.reps[m.leader], 0)
	for i, p := range m.reps {
		all := readLocalAll(m.tb, p, p.LogStartOffset())
		next := p.LogStartOffset()
		for _, g := range decode(m.tb, all) {
			if g.h.BaseOffset != next {
				m.rt.Fatalf("replica %d: batch at %d, want %d", i, g.h.BaseOffset, next)
			}
			next = g.h.NextOffset()
		}
		if next != p.LogEndOffset() || p.DurableEnd() != next || int64(len(all)) != p.Size() {
			m.rt.Fatalf("replica %d: batches end at %d (%d bytes), LEO %d durable %d size %d", i, next, len(all), p.LogEndOffset(), p.DurableEnd(), p.Size())
		}
		if want := derivedEpochs(m.tb, all); !slices.Equal(p.EpochEntries(), want) {
			m.rt.Fatalf("replica %d: epoch cache %v, batches say %v", i, p.EpochEntries(), want)
		}
		if hw := p.HighWatermark(); hw > p.DurableEnd() || hw < m.lastHW[i] {
			m.rt.Fatalf("replica %d: HW %d (durable %d, was %d)", i, hw, p.DurableEnd(), m.lastHW[i])
		}
		m.lastHW[i] = p.HighWatermark()
		if m.synced[i] && (p.LogStartOffset() != 0 || !bytes.HasPrefix(leaderLog, all)) {
			m.rt.Fatalf("replica %d ran the epoch exchange but is no prefix of the leader's log", i)
		}
	}
}

// TestReplicationProperty: whatever the sequence of appends, fetches, elections, truncations and
// restarts, a follower that runs the leader-epoch exchange and fetches to the end holds exactly the
// leader's log (bytes, offsets, epochs, epoch cache, size), and every replica's bookkeeping matches its
// batches throughout.
func TestReplicationProperty(t *testing.T) {
	o := testOptions(t, false)
	s := openStore(t, o)
	var topic uint64
	rapid.Check(t, func(rt *rapid.T) {
		topic++
		m := &replicaModel{tb: rapidTB{t, rt}, rt: rt, s: &s, o: o, topic: topic, reps: make([]*Partition, 3),
			synced: []bool{true, true, true}, lastHW: make([]int64, 3)}
		m.open()
		for _, p := range m.reps {
			p.SetReplicated()
		}
		restartAt := rapid.IntRange(-1, 60).Draw(rt, "restartAt") // mostly never: a reopen costs
		steps := rapid.IntRange(1, 30).Draw(rt, "steps")
		for step := range steps {
			switch op := rapid.IntRange(0, 9).Draw(rt, "op"); {
			case op <= 3: // the leader appends 1-3 batches of 1-3 records in its epoch
				var b []byte
				for range rapid.IntRange(1, 3).Draw(rt, "batches") {
					m.ts++
					b = append(b, valueBatch(m.tb, fmt.Sprintf("t%d-e%d", topic, m.epoch), rapid.IntRange(1, 3).Draw(rt, "records"), m.ts)...)
				}
				if _, err := m.reps[m.leader].Append(context.Background(), b, AppendOptions{LeaderEpoch: m.epoch, LogAppendTime: -1}); err != nil {
					rt.Fatal(err)
				}
			case op <= 6: // a follower fetches (running the epoch exchange first after an election)
				i := rapid.IntRange(0, 2).Draw(rt, "follower")
				if i == m.leader {
					continue
				}
				if !m.synced[i] {
					m.reconcile(m.reps[i])
					m.synced[i] = true
				}
				m.fetch(m.reps[i], rapid.SampledFrom([]int{1, 200, 1 << 20}).Draw(rt, "maxBytes"), false)
			case op == 7: // an election, clean or not
				m.leader = rapid.IntRange(0, 2).Draw(rt, "leader")
				m.epoch += rapid.Int32Range(1, 2).Draw(rt, "epochStep")
				for i := range m.synced {
					m.synced[i] = i == m.leader
				}
			case op == 8: // a follower truncates further: at an EndOffsetForEpoch answer or anywhere
				i := rapid.IntRange(0, 2).Draw(rt, "follower")
				if i == m.leader {
					continue
				}
				p := m.reps[i]
				off := rapid.Int64Range(0, p.LogEndOffset()).Draw(rt, "offset")
				if rapid.Bool().Draw(rt, "byEpoch") {
					end, _ := p.EndOffsetForEpoch(rapid.Int32Range(-1, m.epoch+1).Draw(rt, "epoch"))
					if end < 0 {
						continue
					}
					off = end
				}
				m.truncate(p, off)
			case op == 9: // the leader's answers agree with its own cache
				l := m.reps[m.leader]
				for _, e := range l.EpochEntries() {
					if end, found := l.EndOffsetForEpoch(e.Epoch); found != e.Epoch || end < e.StartOffset || end > l.LogEndOffset() {
						rt.Fatalf("EndOffsetForEpoch(%d) = (%d, %d) with cache %v", e.Epoch, end, found, l.EpochEntries())
					}
				}
			}
			if step == restartAt {
				hws := make([]int64, 3)
				caches := make([][]EpochEntry, 3)
				for i, p := range m.reps {
					hws[i], caches[i] = p.HighWatermark(), p.EpochEntries()
				}
				if err := s.Close(); err != nil {
					rt.Fatal(err)
				}
				s = openStore(t, o)
				m.open()
				for i, p := range m.reps {
					if !p.Replicated() || p.HighWatermark() != hws[i] || !slices.Equal(p.EpochEntries(), caches[i]) {
						rt.Fatalf("replica %d after restart: replicated %v HW %d (was %d), epochs %v (were %v)",
							i, p.Replicated(), p.HighWatermark(), hws[i], p.EpochEntries(), caches[i])
					}
				}
			}
			m.check()
		}

		// Every follower runs the exchange and catches up: it equals the leader.
		leader := m.reps[m.leader]
		for i, f := range m.reps {
			if i == m.leader {
				continue
			}
			if !m.synced[i] {
				m.reconcile(f)
				m.synced[i] = true
			}
			m.fetch(f, 1<<20, true)
		}
		m.check()
		want := readLocalAll(m.tb, leader, 0)
		for i, f := range m.reps {
			if got := readLocalAll(m.tb, f, 0); !bytes.Equal(got, want) || f.LogEndOffset() != leader.LogEndOffset() ||
				!slices.Equal(f.EpochEntries(), leader.EpochEntries()) {
				rt.Fatalf("replica %d differs from leader %d after the re-sync: LEO %d/%d, epochs %v/%v",
					i, m.leader, f.LogEndOffset(), leader.LogEndOffset(), f.EpochEntries(), leader.EpochEntries())
			}
		}
	})
}
