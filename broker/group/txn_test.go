package group

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// txnModel is Kafka's rule for offsets in transactions written out independently of the coordinator
// (OffsetMetadataManager.replayEndTransactionMarker): every offset record and tombstone has a log
// position; a COMMIT marker installs each of its producer's pending offsets whose position is after
// that of the record that last wrote the partition's committed offset (a plain commit, an installed
// transactional offset, or a tombstone); ABORT drops them. A partition is unstable while some pending
// offset could still be installed.
type txnModel struct {
	pos       int
	committed map[tp]int64
	lastWrite map[tp]int // position of the record behind committed (or of the tombstone)
	pending   map[int64]map[tp]txnModelOffset
	epochs    map[int64]int16
}

type txnModelOffset struct {
	offset int64
	pos    int
}

func (m *txnModel) write(k tp, offset int64) {
	m.pos++
	m.committed[k] = offset
	m.lastWrite[k] = m.pos
}

func (m *txnModel) tombstone(k tp) {
	m.pos++
	delete(m.committed, k)
	m.lastWrite[k] = m.pos
}

func (m *txnModel) unstable(k tp) bool {
	for _, p := range m.pending {
		if o, ok := p[k]; ok && o.pos > m.lastWrite[k] {
			return true
		}
	}
	return false
}

// live returns the partitions with committed offsets or pending offsets that could still be installed.
func (m *txnModel) live() map[tp]bool {
	out := map[tp]bool{}
	for k := range m.committed {
		out[k] = true
	}
	for _, p := range m.pending {
		for k, o := range p {
			if o.pos > m.lastWrite[k] {
				out[k] = true
			}
		}
	}
	return out
}

// TestPropertyTxnOffsets runs random histories of plain commits, transactional commits of three
// producers at random epochs, markers, deletions of a topic, group deletions and coordinator restarts
// against txnModel: after every step the committed offsets, the require_stable answers and the
// refusals must match the model, and a restart (a replay of every record written) must rebuild the
// same state.
func TestPropertyTxnOffsets(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		cfg := Config{}
		topics := map[string]TopicInfo{"t": {ID: "t1", Partitions: 3}, "u": {ID: "u1", Partitions: 2}}
		c := New(cfg)
		var log []Record
		persist := func(recs []Record) {
			log = append(log, recs...)
			c.Apply(recs)
		}
		persist(c.Start(now, topics))
		m := &txnModel{committed: map[tp]int64{}, lastWrite: map[tp]int{}, pending: map[int64]map[tp]txnModelOffset{}, epochs: map[int64]int16{}}
		logEnd := func(topic string, p int32) (int64, bool) {
			ti, ok := topics[topic]
			return 1000, ok && p >= 0 && p < ti.Partitions
		}
		all := []tp{{"t", 0}, {"t", 1}, {"t", 2}, {"u", 0}, {"u", 1}}
		drawParts := func(t *rapid.T) []*runnelv1.CommitPartition {
			ks := rapid.SliceOfNDistinct(rapid.SampledFrom(all), 1, 3, func(k tp) string { return fmt.Sprint(k) }).Draw(t, "partitions")
			var ps []*runnelv1.CommitPartition
			for _, k := range ks {
				ps = append(ps, &runnelv1.CommitPartition{Topic: k.topic, Partition: k.part, Offset: int64(rapid.IntRange(0, 999).Draw(t, "offset")), LeaderEpoch: -1})
			}
			return ps
		}
		drawProducer := func(t *rapid.T) Producer {
			pid := int64(rapid.IntRange(1, 3).Draw(t, "producer"))
			e := m.epochs[pid] + int16(rapid.IntRange(-1, 1).Draw(t, "epoch change"))
			return Producer{ID: pid, Epoch: max(e, 0)}
		}
		t.Repeat(map[string]func(*rapid.T){
			"commit": func(t *rapid.T) {
				ps := drawParts(t)
				resp, recs, err := c.Commit(now, &runnelv1.CommitOffsetsRequest{GroupId: "g", MemberEpoch: AdminEpoch, Partitions: ps}, logEnd)
				if err != nil {
					t.Fatalf("admin commit: %v", err)
				}
				for i, p := range ps {
					if resp.Partitions[i].Error != nil {
						t.Fatalf("admin commit of %s-%d: %v", p.Topic, p.Partition, resp.Partitions[i].Error)
					}
					m.write(tp{p.Topic, p.Partition}, p.Offset)
				}
				persist(recs)
			},
			"txn commit": func(t *rapid.T) {
				p := drawProducer(t)
				ps := drawParts(t)
				resp, recs, err := c.TxnOffsetCommit(now, &runnelv1.TxnOffsetCommitRequest{GroupId: "g", TransactionalId: fmt.Sprintf("tx-%d", p.ID),
					ProducerId: p.ID, ProducerEpoch: int32(p.Epoch), MemberEpoch: AdminEpoch, Partitions: ps}, logEnd)
				if known, ok := m.epochs[p.ID]; ok && p.Epoch < known {
					if !errors.Is(err, rerr.ErrProducerFenced) {
						t.Fatalf("producer %d epoch %d after epoch %d: %v", p.ID, p.Epoch, known, err)
					}
					return
				}
				if err != nil {
					t.Fatalf("txn commit: %v", err)
				}
				m.epochs[p.ID] = max(m.epochs[p.ID], p.Epoch)
				if m.pending[p.ID] == nil {
					m.pending[p.ID] = map[tp]txnModelOffset{}
				}
				for i, cp := range ps {
					if resp.Partitions[i].Error != nil {
						t.Fatalf("txn commit of %s-%d: %v", cp.Topic, cp.Partition, resp.Partitions[i].Error)
					}
					m.pos++
					m.pending[p.ID][tp{cp.Topic, cp.Partition}] = txnModelOffset{offset: cp.Offset, pos: m.pos}
				}
				persist(recs)
			},
			"marker": func(t *rapid.T) {
				p := drawProducer(t)
				commit := rapid.Bool().Draw(t, "commit")
				recs, err := c.Marker(p, commit)
				// KIP-890 part 2: a transaction's marker carries the epoch its end bumped to, so one at
				// the epoch of the open transaction's offsets is a late marker of an earlier
				// transaction. The epoch drawn is known+{-1,0,1}: known+1 always ends the transaction.
				if known, ok := m.epochs[p.ID]; ok && (p.Epoch < known || m.pending[p.ID] != nil && p.Epoch == known) {
					if !errors.Is(err, rerr.ErrInvalidProducerEpoch) {
						t.Fatalf("marker of producer %d epoch %d after epoch %d (transaction open %t): %v", p.ID, p.Epoch, known, m.pending[p.ID] != nil, err)
					}
					return
				}
				if err != nil {
					t.Fatalf("marker: %v", err)
				}
				m.epochs[p.ID] = max(m.epochs[p.ID], p.Epoch)
				m.pos++
				if commit {
					for k, o := range m.pending[p.ID] {
						if o.pos > m.lastWrite[k] {
							m.committed[k] = o.offset
							m.lastWrite[k] = o.pos
						}
					}
				}
				delete(m.pending, p.ID)
				persist(recs)
			},
			"delete topic": func(t *rapid.T) {
				// u is deleted and created again: its offsets, pending ones included, are tombstoned.
				delete(topics, "u")
				for _, k := range all {
					if k.topic == "u" && m.live()[k] {
						m.tombstone(k)
					}
				}
				persist(c.SetTopics(now, topics))
				topics["u"] = TopicInfo{ID: fmt.Sprintf("u%d", m.pos), Partitions: 2}
				persist(c.SetTopics(now, topics))
			},
			"delete group": func(t *rapid.T) {
				recs, err := c.DeleteGroup(now, "g")
				live := m.live()
				switch {
				case len(live) == 0:
					if !errors.Is(err, &rerr.Error{Code: runnelv1.ErrorCode_GROUP_ID_NOT_FOUND}) {
						t.Fatalf("delete of a group without offsets: %v", err)
					}
				case slices.ContainsFunc(all, m.unstable):
					if !errors.Is(err, &rerr.Error{Code: runnelv1.ErrorCode_NON_EMPTY_GROUP}) {
						t.Fatalf("delete of a group with pending transactional offsets: %v", err)
					}
				default:
					if err != nil {
						t.Fatalf("delete: %v", err)
					}
					for _, k := range all {
						if live[k] {
							m.tombstone(k)
						}
					}
					persist(recs)
				}
			},
			"restart": func(t *rapid.T) {
				fresh := New(cfg)
				for _, rec := range log {
					if err := fresh.Load(rec); err != nil {
						t.Fatalf("replay: %v", err)
					}
				}
				want := dumpState(c)
				c = fresh
				persist(c.Start(now, topics))
				if got := dumpState(c); got != want {
					t.Fatalf("state after restart:\n%s\nbefore:\n%s", got, want)
				}
			},
			"": func(t *rapid.T) {
				if err := c.Check(); err != nil {
					t.Fatal(err)
				}
				resp, err := c.FetchOffsets(&runnelv1.FetchOffsetsRequest{GroupId: "g"})
				if err != nil {
					t.Fatal(err)
				}
				got := map[tp]int64{}
				for _, o := range resp.Offsets {
					got[tp{o.Topic, o.Partition}] = o.Offset
				}
				if !maps.Equal(got, m.committed) {
					t.Fatalf("committed offsets %v, model %v", got, m.committed)
				}
				resp, err = c.FetchOffsets(&runnelv1.FetchOffsetsRequest{GroupId: "g", RequireStable: true})
				if err != nil {
					t.Fatal(err)
				}
				listed := map[tp]bool{}
				for _, o := range resp.Offsets {
					k := tp{o.Topic, o.Partition}
					listed[k] = true
					unstable := o.Error != nil && o.Error.Code == runnelv1.ErrorCode_UNSTABLE_OFFSET_COMMIT
					if unstable != m.unstable(k) {
						t.Fatalf("%s-%d: require_stable answers unstable=%t, model %t", k.topic, k.part, unstable, m.unstable(k))
					}
					if want, ok := m.committed[k]; !unstable && (!ok || want != o.Offset) {
						t.Fatalf("%s-%d: require_stable answers %d, model %d (%t)", k.topic, k.part, o.Offset, want, ok)
					}
				}
				for _, k := range all {
					if _, ok := m.committed[k]; (ok || m.unstable(k)) != listed[k] {
						t.Fatalf("%s-%d: listed by require_stable %t, model committed %t unstable %t", k.topic, k.part, listed[k], ok, m.unstable(k))
					}
				}
			},
		})
	})
}

// TestTxnRecordsReplayStrictly covers what a log could hold but this coordinator never writes:
// a transactional record that is not an offset value, a marker without a producer. Each is skipped
// and counted, and the rest of the log still loads.
func TestTxnRecordsReplayStrictly(t *testing.T) {
	c := New(Config{})
	p := &Producer{ID: 1, Epoch: 0}
	k := offsetKey("g", tp{"t", 0}).encode()
	v := OffsetCommit{Offset: 5, LeaderEpoch: -1}.encode()
	for _, rec := range []Record{
		{Key: k, Producer: p},                                // a transactional tombstone
		{Key: groupKey("g").encode(), Value: v, Producer: p}, // not an offset key
		{Marker: CommitMarker},                               // no producer
		{Key: []byte{0xff}, Value: v, Producer: p},           // no key at all
	} {
		if err := c.Load(rec); !errors.Is(err, errCorrupt) {
			t.Errorf("load %+v: %v, want a corrupt record", rec, err)
		}
	}
	for _, rec := range []Record{{Key: k, Value: v, Producer: p}, {Producer: p, Marker: CommitMarker}} {
		if err := c.Load(rec); err != nil {
			t.Fatal(err)
		}
	}
	c.Start(time.Now(), map[string]TopicInfo{"t": {ID: "t", Partitions: 1}})
	if c.LoadErrors() != 4 {
		t.Errorf("%d load errors, want 4", c.LoadErrors())
	}
	resp, err := c.FetchOffsets(&runnelv1.FetchOffsetsRequest{GroupId: "g"})
	if err != nil || len(resp.Offsets) != 1 || resp.Offsets[0].Offset != 5 {
		t.Fatalf("offsets after load: %v %v", resp, err)
	}
}

// TestTxnOffsetCommitRequestChecks covers the producer fields of a TxnOffsetCommit.
func TestTxnOffsetCommitRequestChecks(t *testing.T) {
	c := New(Config{})
	c.Start(time.Now(), map[string]TopicInfo{"t": {ID: "t", Partitions: 1}})
	logEnd := func(string, int32) (int64, bool) { return 10, true }
	for _, req := range []*runnelv1.TxnOffsetCommitRequest{
		{GroupId: "g", ProducerId: 1, MemberEpoch: AdminEpoch},                                          // no transactional id
		{GroupId: "g", TransactionalId: "x", ProducerId: -1, MemberEpoch: AdminEpoch},                   // negative producer id
		{GroupId: "g", TransactionalId: "x", ProducerId: 1, ProducerEpoch: -1, MemberEpoch: AdminEpoch}, // negative epoch
		{GroupId: "g", TransactionalId: "x", ProducerId: 1, ProducerEpoch: 1 << 15, MemberEpoch: AdminEpoch},
		{GroupId: "g", TransactionalId: "x\x00", ProducerId: 1, MemberEpoch: AdminEpoch},
	} {
		if _, _, err := c.TxnOffsetCommit(time.Now(), req, logEnd); !errors.Is(err, &rerr.Error{Code: runnelv1.ErrorCode_INVALID_REQUEST}) {
			t.Errorf("%v: %v, want INVALID_REQUEST", req, err)
		}
	}
	if _, err := c.Marker(Producer{ID: -1}, true); !errors.Is(err, &rerr.Error{Code: runnelv1.ErrorCode_INVALID_REQUEST}) {
		t.Errorf("marker of producer -1: %v", err)
	}
	_, recs, err := c.TxnOffsetCommit(time.Now(), &runnelv1.TxnOffsetCommitRequest{GroupId: "g", TransactionalId: "x", ProducerId: 1, ProducerEpoch: 3,
		MemberEpoch: AdminEpoch, Partitions: []*runnelv1.CommitPartition{{Topic: "t", Offset: 4}}}, logEnd)
	if err != nil || len(recs) != 1 || recs[0].Producer == nil || *recs[0].Producer != (Producer{ID: 1, Epoch: 3}) {
		t.Fatalf("txn commit: %v %+v", err, recs)
	}
	// Before the records are applied, the offset is unstable and the group is not deletable already.
	resp, _ := c.FetchOffsets(&runnelv1.FetchOffsetsRequest{GroupId: "g", RequireStable: true})
	if len(resp.Offsets) != 1 || resp.Offsets[0].Error.GetCode() != runnelv1.ErrorCode_UNSTABLE_OFFSET_COMMIT {
		t.Errorf("require_stable with the record in flight: %v", resp)
	}
	if _, err := c.DeleteGroup(time.Now(), "g"); !errors.Is(err, &rerr.Error{Code: runnelv1.ErrorCode_NON_EMPTY_GROUP}) {
		t.Errorf("delete with the record in flight: %v", err)
	}
	c.Apply(recs)
	if n := c.PendingTxnOffsets("g"); n != 1 {
		t.Errorf("%d pending transactional offsets, want 1", n)
	}
}
