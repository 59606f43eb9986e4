package txn

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"unicode/utf8"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"google.golang.org/protobuf/proto"
)

// Record is one record of the __transaction_state topic, as the Coordinator emits and loads it. A nil
// Value is a tombstone: the transactional id was forgotten (expired), and compaction may drop its
// earlier records.
type Record struct {
	Key, Value []byte
}

// Record layout. One key per transactional id, and its value the id's whole state, so the compacted
// topic keeps exactly the latest state of every id:
//
//	key    big-endian uint16 kind (1), then the transactional id's bytes (the rest of the key)
//	value  big-endian uint16 version (1), then a runnel.v1.TransactionDescription in protobuf's wire
//	       format (deterministic): state, producer_id, producer_epoch, transaction_timeout_ms,
//	       transaction_start_ms, last_update_ms, partitions (by topic, partitions ascending; a group's
//	       __consumer_offsets partition included), groups (sorted) and, after EndTxn's epoch bump,
//	       last_producer_epoch (producer_epoch - 1). transactional_id, error and coordinator_id are
//	       left empty.
//
// Reusing the wire message keeps the value self-describing and lets later versions add fields that
// older brokers skip. Decoding checks every field, since a compacted log outlives the code that wrote
// it (FuzzDecodeRecord).
const (
	kindState    uint16 = 1
	valueVersion uint16 = 1
)

// errCorrupt is wrapped by every decoding error.
var errCorrupt = errors.New("corrupt __transaction_state record")

// tp is one topic-partition.
type tp struct {
	topic     string
	partition int32
}

func cmpTP(a, b tp) int {
	if c := cmp.Compare(a.topic, b.topic); c != 0 {
		return c
	}
	return cmp.Compare(a.partition, b.partition)
}

// txnMeta is one transactional id's state (Kafka's TransactionMetadata).
type txnMeta struct {
	producerID int64
	epoch      int16
	// lastEpoch is the epoch the producer ended its last transaction with when EndTxn bumped it to
	// epoch (KIP-890 part 2), -1 otherwise: a retry of that EndTxn still carries it.
	lastEpoch int16
	state     runnelv1.TxnState
	timeoutMs int32
	// startMs is when the ongoing transaction began (its first add), -1 when none is ongoing;
	// updateMs when the id last changed state (ms since the Unix epoch).
	startMs, updateMs int64
	// parts are the partitions in the transaction, the groups' __consumer_offsets partitions included;
	// groups are the groups added with AddOffsetsToTxn. Both are empty unless ONGOING or PREPARE_*.
	parts  map[tp]struct{}
	groups map[string]struct{}
}

func (m *txnMeta) clone() *txnMeta {
	c := *m
	c.parts, c.groups = maps.Clone(m.parts), maps.Clone(m.groups)
	return &c
}

// sortedParts returns the transaction's partitions in wire form: by topic, partitions ascending.
func (m *txnMeta) sortedParts() []*runnelv1.TopicPartitions {
	keys := slices.SortedFunc(maps.Keys(m.parts), cmpTP)
	var out []*runnelv1.TopicPartitions
	for _, k := range keys {
		if n := len(out); n == 0 || out[n-1].Topic != k.topic {
			out = append(out, &runnelv1.TopicPartitions{Topic: k.topic})
		}
		last := out[len(out)-1]
		last.Partitions = append(last.Partitions, k.partition)
	}
	return out
}

// describe returns m in wire form, without the id and the coordinator.
func (m *txnMeta) describe() *runnelv1.TransactionDescription {
	d := &runnelv1.TransactionDescription{State: m.state, ProducerId: m.producerID, ProducerEpoch: int32(m.epoch),
		TransactionTimeoutMs: m.timeoutMs, TransactionStartMs: m.startMs, LastUpdateMs: m.updateMs,
		Partitions: m.sortedParts(), Groups: slices.Sorted(maps.Keys(m.groups))}
	if m.lastEpoch >= 0 {
		d.LastProducerEpoch = proto.Int32(int32(m.lastEpoch))
	}
	return d
}

func encodeKey(id string) []byte {
	return append(binary.BigEndian.AppendUint16(nil, kindState), id...)
}

// decodeKey returns the transactional id of a key; errors wrap errCorrupt.
func decodeKey(b []byte) (string, error) {
	if len(b) < 2 {
		return "", fmt.Errorf("decode key: %w: %d bytes", errCorrupt, len(b))
	}
	if k := binary.BigEndian.Uint16(b); k != kindState {
		return "", fmt.Errorf("decode key: %w: unknown key kind %d", errCorrupt, k)
	}
	id := string(b[2:])
	if err := checkID("transactional id", id); err != nil {
		return "", fmt.Errorf("decode key: %w: %v", errCorrupt, err)
	}
	return id, nil
}

func (m *txnMeta) encode() []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m.describe())
	if err != nil {
		panic(fmt.Sprintf("marshal transaction state: %v", err)) // a message of plain fields always marshals
	}
	return append(binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(b)), valueVersion), b...)
}

// decodeValue parses and checks a value; errors wrap errCorrupt.
func decodeValue(b []byte) (*txnMeta, error) {
	fail := func(format string, args ...any) (*txnMeta, error) {
		return nil, fmt.Errorf("decode value: %w: %s", errCorrupt, fmt.Sprintf(format, args...))
	}
	if len(b) < 2 {
		return fail("%d bytes", len(b))
	}
	if v := binary.BigEndian.Uint16(b); v != valueVersion {
		return fail("value version %d (this broker reads %d)", v, valueVersion)
	}
	var d runnelv1.TransactionDescription
	if err := proto.Unmarshal(b[2:], &d); err != nil {
		return fail("%v", err)
	}
	m := &txnMeta{producerID: d.ProducerId, lastEpoch: -1, state: d.State, timeoutMs: d.TransactionTimeoutMs, startMs: d.TransactionStartMs,
		updateMs: d.LastUpdateMs, parts: map[tp]struct{}{}, groups: map[string]struct{}{}}
	switch {
	case d.State < runnelv1.TxnState_TXN_EMPTY || d.State > runnelv1.TxnState_TXN_COMPLETE_ABORT:
		return fail("state %v", d.State)
	case d.ProducerId < 0:
		return fail("producer id %d", d.ProducerId)
	case d.ProducerEpoch < 0 || d.ProducerEpoch > math.MaxInt16:
		return fail("producer epoch %d", d.ProducerEpoch)
	case d.TransactionTimeoutMs <= 0:
		return fail("transaction timeout %dms", d.TransactionTimeoutMs)
	case d.TransactionStartMs < -1:
		return fail("transaction start %d", d.TransactionStartMs)
	case d.LastProducerEpoch != nil && (*d.LastProducerEpoch < 0 || *d.LastProducerEpoch != d.ProducerEpoch-1):
		return fail("last producer epoch %d with producer epoch %d", *d.LastProducerEpoch, d.ProducerEpoch)
	}
	m.epoch = int16(d.ProducerEpoch)
	if d.LastProducerEpoch != nil {
		m.lastEpoch = int16(*d.LastProducerEpoch)
	}
	n := 0
	for _, t := range d.Partitions {
		if err := checkTopic(t.Topic); err != nil {
			return fail("%v", err)
		}
		for _, p := range t.Partitions {
			if p < 0 {
				return fail("partition %d of %q", p, t.Topic)
			}
			m.parts[tp{t.Topic, p}] = struct{}{}
			n++
		}
	}
	for _, g := range d.Groups {
		if err := checkID("group id", g); err != nil {
			return fail("%v", err)
		}
		m.groups[g] = struct{}{}
	}
	active := m.state == runnelv1.TxnState_TXN_ONGOING || m.state == runnelv1.TxnState_TXN_PREPARE_COMMIT || m.state == runnelv1.TxnState_TXN_PREPARE_ABORT
	switch {
	case n > MaxPartitions:
		return fail("%d partitions, at most %d", n, MaxPartitions)
	case !active && (len(m.parts) > 0 || len(m.groups) > 0 || m.startMs != -1):
		return fail("state %v with partitions, groups or a start time", m.state)
	case active && m.startMs < 0:
		return fail("state %v without a start time", m.state)
	}
	return m, nil
}

// checkID checks a transactional or group id: non-empty UTF-8 of at most MaxIDBytes.
func checkID(what, id string) error {
	switch {
	case id == "":
		return fmt.Errorf("empty %s", what)
	case len(id) > MaxIDBytes:
		return fmt.Errorf("%s of %d bytes, at most %d", what, len(id), MaxIDBytes)
	case !utf8.ValidString(id):
		return fmt.Errorf("%s is not UTF-8", what)
	}
	return nil
}

// checkTopic checks a topic name as far as the records need: non-empty UTF-8 of at most 249 bytes
// (Kafka's limit); whether the topic exists is the shell's question.
func checkTopic(name string) error {
	if name == "" || len(name) > 249 || !utf8.ValidString(name) {
		return fmt.Errorf("bad topic name %q", name)
	}
	return nil
}
