package group

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Record is one record of the __consumer_offsets topic, as the Coordinator emits and loads it. A nil
// Value is a tombstone: the key's earlier records no longer count, and compaction may drop them.
//
// Transactions (KIP-98, KIP-447) add two shapes, both carrying Producer, the producer id and epoch of
// the batch header:
//
//   - an offset record of a transactional batch (TxnOffsetCommit; Marker is NoMarker): the shell appends
//     the records of one call as one batch with that producer id and epoch and the transactional
//     attribute, and on replay passes Producer for every record of a transactional batch;
//   - an end-transaction marker (Marker is CommitMarker or AbortMarker; Key and Value are nil): the
//     control batch the shell writes with batch.BuildControl, and on replay parses with
//     batch.ParseControl.
//
// Records without Producer are the ordinary ones: membership state and plain commits.
type Record struct {
	Key, Value []byte
	Producer   *Producer
	Marker     TxnMarker
}

// Producer is a transactional producer incarnation (KIP-98): its producer id and producer epoch.
type Producer struct {
	ID    int64
	Epoch int16
}

// TxnMarker says whether a Record is an end-transaction marker, and which.
type TxnMarker uint8

// The end-transaction markers (batch.ControlAbort and batch.ControlCommit on the log).
const (
	NoMarker TxnMarker = iota
	AbortMarker
	CommitMarker
)

// String names the marker as the log would.
func (m TxnMarker) String() string {
	switch m {
	case NoMarker:
		return "none"
	case AbortMarker:
		return "ABORT"
	case CommitMarker:
		return "COMMIT"
	}
	return fmt.Sprintf("marker(%d)", uint8(m))
}

// Record layout. Keys start with a big-endian uint16 saying what the record is, values with a
// big-endian uint16 version, as Kafka's __consumer_offsets records do (the numbers are ours, not
// Kafka's). Then fields follow in order: strings and lists as a uvarint length then the bytes or
// elements, integers as zig-zag varints (encoding/binary.AppendVarint). One partition set ("parts") is a
// uvarint topic count, then per topic its name and a uvarint count of partition numbers, ascending.
//
//	key kind 1 (offset commit)  group, topic, partition
//	  value v1                  offset, leader epoch, metadata, commit timestamp (ms)
//	key kind 3 (group)          group
//	  value v1                  group epoch, assignment epoch, assignor, empty since (ms, -1: has members),
//	                            subscribed topics: count, then per topic name, topic id, partition count
//	key kind 4 (member)         group, member id
//	  value v1                  instance id, rack id, client id, client host, subscribed topic names
//	                            (count, names), regex, assignor, rebalance timeout (ms), session timeout (ms),
//	                            member epoch, previous member epoch, state, flags (1: left as a static member),
//	                            assigned parts, parts pending revocation, target parts
//
// Compaction keeps the latest record per key, so a key holds one fact: one committed offset, one group's
// epochs, one member's state and target. A deleted group or member gets tombstones for all its keys.
const (
	kindOffset uint16 = 1
	kindGroup  uint16 = 3
	kindMember uint16 = 4

	valueVersion uint16 = 1
)

// errCorrupt is wrapped by every decoding error.
var errCorrupt = errors.New("corrupt __consumer_offsets record")

// recordKey is a decoded key. topic and partition are set for offset keys, member for member keys.
type recordKey struct {
	kind      uint16
	group     string
	topic     string
	partition int32
	member    string
}

func offsetKey(group string, k tp) recordKey {
	return recordKey{kind: kindOffset, group: group, topic: k.topic, partition: k.part}
}
func groupKey(group string) recordKey { return recordKey{kind: kindGroup, group: group} }
func memberKey(group, member string) recordKey {
	return recordKey{kind: kindMember, group: group, member: member}
}

func (k recordKey) encode() []byte {
	b := binary.BigEndian.AppendUint16(nil, k.kind)
	b = appendString(b, k.group)
	switch k.kind {
	case kindOffset:
		b = appendString(b, k.topic)
		b = binary.AppendVarint(b, int64(k.partition))
	case kindMember:
		b = appendString(b, k.member)
	}
	return b
}

// decodeKey parses a key. Unknown kinds are an error wrapping errCorrupt.
func decodeKey(b []byte) (recordKey, error) {
	r := reader{b: b}
	k := recordKey{kind: r.uint16()}
	k.group = r.string()
	switch k.kind {
	case kindOffset:
		k.topic = r.string()
		k.partition = r.int32()
		if r.err == nil && k.partition < 0 {
			r.fail("negative partition %d", k.partition)
		}
	case kindGroup:
	case kindMember:
		k.member = r.string()
	default:
		if r.err == nil {
			r.fail("unknown key kind %d", k.kind)
		}
	}
	if err := r.end("key"); err != nil {
		return k, err
	}
	// Compaction compares key bytes: a key must have one encoding, or an old record under a different
	// spelling of the same key could outlive the tombstone that deleted it.
	if !bytes.Equal(k.encode(), b) {
		return k, fmt.Errorf("decode key: %w: not in canonical form", errCorrupt)
	}
	return k, nil
}

// OffsetCommit is one committed offset, the value of an offset record.
type OffsetCommit struct {
	// Offset is the next offset to read; LeaderEpoch the leader epoch of the last record read (-1 unknown).
	Offset      int64
	LeaderEpoch int32
	// Metadata is the member's string, kept as it was sent.
	Metadata string
	// CommitTimestampMs is when the coordinator accepted the commit (ms since the Unix epoch).
	CommitTimestampMs int64
}

func (v OffsetCommit) encode() []byte {
	b := binary.BigEndian.AppendUint16(nil, valueVersion)
	b = binary.AppendVarint(b, v.Offset)
	b = binary.AppendVarint(b, int64(v.LeaderEpoch))
	b = appendString(b, v.Metadata)
	return binary.AppendVarint(b, v.CommitTimestampMs)
}

func decodeOffsetValue(b []byte) (OffsetCommit, error) {
	r := reader{b: b}
	r.version()
	v := OffsetCommit{Offset: r.varint(), LeaderEpoch: r.int32(), Metadata: r.string(), CommitTimestampMs: r.varint()}
	if r.err == nil && v.Offset < 0 {
		r.fail("negative offset %d", v.Offset)
	}
	return v, r.end("offset value")
}

// subTopic is one topic of a group's subscription metadata: what the target assignment was computed
// from, so a topic that changed while the coordinator was down is noticed when it loads.
type subTopic struct {
	name, id   string
	partitions int32
}

type groupValue struct {
	epoch, assignmentEpoch int32
	assignor               string
	emptySinceMs           int64
	topics                 []subTopic // sorted by name
}

func (v groupValue) encode() []byte {
	b := binary.BigEndian.AppendUint16(nil, valueVersion)
	b = binary.AppendVarint(b, int64(v.epoch))
	b = binary.AppendVarint(b, int64(v.assignmentEpoch))
	b = appendString(b, v.assignor)
	b = binary.AppendVarint(b, v.emptySinceMs)
	b = binary.AppendUvarint(b, uint64(len(v.topics)))
	for _, t := range v.topics {
		b = appendString(b, t.name)
		b = appendString(b, t.id)
		b = binary.AppendVarint(b, int64(t.partitions))
	}
	return b
}

func decodeGroupValue(b []byte) (groupValue, error) {
	r := reader{b: b}
	r.version()
	v := groupValue{epoch: r.int32(), assignmentEpoch: r.int32(), assignor: r.string(), emptySinceMs: r.varint()}
	n := r.count(3) // a topic takes at least 3 bytes
	for i := 0; i < n && r.err == nil; i++ {
		t := subTopic{name: r.string(), id: r.string(), partitions: r.int32()}
		if r.err == nil && (t.partitions < 0 || len(v.topics) > 0 && v.topics[len(v.topics)-1].name >= t.name) {
			r.fail("subscribed topic %q out of order or with %d partitions", t.name, t.partitions)
		}
		v.topics = append(v.topics, t)
	}
	if r.err == nil && (v.epoch < 0 || v.assignmentEpoch < 0 || v.assignmentEpoch > v.epoch) {
		r.fail("group epoch %d, assignment epoch %d", v.epoch, v.assignmentEpoch)
	}
	return v, r.end("group value")
}

// memberState is where a member is in reconciling its assignment with the target (KIP-848).
type memberState uint8

const (
	// stable: the member owns its whole target at the assignment epoch, or waits for nothing.
	stateStable memberState = iota
	// unrevoked: the member must revoke pending partitions before it moves to the next epoch.
	stateUnrevoked
	// unreleased: the member is at the assignment epoch but some target partitions are still owned by
	// members that have not released them yet.
	stateUnreleased
)

// String names the state as scenario outputs show it.
func (s memberState) String() string {
	switch s {
	case stateStable:
		return "stable"
	case stateUnrevoked:
		return "unrevoked"
	case stateUnreleased:
		return "unreleased"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

const flagDeparted = 1

type memberValue struct {
	instanceID, rackID, clientID, clientHost string
	names                                    []string
	regex                                    string
	assignor                                 string
	rebalanceTimeoutMs, sessionTimeoutMs     int32
	epoch, prevEpoch                         int32
	state                                    memberState
	departed                                 bool
	assigned, pending, target                parts
}

func (v memberValue) encode() []byte {
	b := binary.BigEndian.AppendUint16(nil, valueVersion)
	for _, s := range []string{v.instanceID, v.rackID, v.clientID, v.clientHost} {
		b = appendString(b, s)
	}
	b = binary.AppendUvarint(b, uint64(len(v.names)))
	for _, n := range v.names {
		b = appendString(b, n)
	}
	b = appendString(b, v.regex)
	b = appendString(b, v.assignor)
	for _, n := range []int32{v.rebalanceTimeoutMs, v.sessionTimeoutMs, v.epoch, v.prevEpoch} {
		b = binary.AppendVarint(b, int64(n))
	}
	var flags byte
	if v.departed {
		flags |= flagDeparted
	}
	b = append(b, byte(v.state), flags)
	for _, p := range []parts{v.assigned, v.pending, v.target} {
		b = appendParts(b, p)
	}
	return b
}

func decodeMemberValue(b []byte) (memberValue, error) {
	r := reader{b: b}
	r.version()
	v := memberValue{instanceID: r.string(), rackID: r.string(), clientID: r.string(), clientHost: r.string()}
	n := r.count(1)
	for i := 0; i < n && r.err == nil; i++ {
		v.names = append(v.names, r.string())
	}
	v.regex, v.assignor = r.string(), r.string()
	v.rebalanceTimeoutMs, v.sessionTimeoutMs = r.int32(), r.int32()
	v.epoch, v.prevEpoch = r.int32(), r.int32()
	v.state = memberState(r.byte())
	flags := r.byte()
	v.departed = flags&flagDeparted != 0
	v.assigned, v.pending, v.target = r.parts(), r.parts(), r.parts()
	if r.err == nil {
		switch {
		case v.state > stateUnreleased:
			r.fail("member state %d", v.state)
		case flags&^flagDeparted != 0:
			r.fail("member flags %#x", flags)
		case v.rebalanceTimeoutMs <= 0 || v.sessionTimeoutMs <= 0:
			r.fail("member timeouts %d/%d ms", v.rebalanceTimeoutMs, v.sessionTimeoutMs)
		case v.epoch < 0:
			r.fail("member epoch %d", v.epoch)
		case v.assigned.intersects(v.pending):
			r.fail("member both owns and revokes a partition")
		}
	}
	return v, r.end("member value")
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendParts(b []byte, p parts) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	for _, t := range p.topics() {
		b = appendString(b, t)
		b = binary.AppendUvarint(b, uint64(len(p[t])))
		for _, n := range p[t] {
			b = binary.AppendVarint(b, int64(n))
		}
	}
	return b
}

// reader decodes untrusted bytes: the first problem sticks in err and every later read returns zero
// values, so decoders read straight through and check once. No length read from the input sizes an
// allocation before it is checked against the bytes left.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", errCorrupt, fmt.Sprintf(format, args...))
	}
}

func (r *reader) uint16() uint16 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 2 {
		r.fail("truncated")
		return 0
	}
	v := binary.BigEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}

// version reads a value's version and fails on any but valueVersion.
func (r *reader) version() {
	if v := r.uint16(); r.err == nil && v != valueVersion {
		r.fail("value version %d (this broker reads %d)", v, valueVersion)
	}
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 1 {
		r.fail("truncated")
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("bad uvarint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) int32() int32 {
	v := r.varint()
	if v < -1<<31 || v > 1<<31-1 {
		r.fail("%d does not fit int32", v)
		return 0
	}
	return int32(v)
}

// count reads a list length whose elements take at least minElem bytes each.
func (r *reader) count(minElem int) int {
	n := r.uvarint()
	if r.err == nil && n > uint64(len(r.b)/minElem) {
		r.fail("list of %d elements in %d bytes", n, len(r.b))
		return 0
	}
	return int(n)
}

func (r *reader) string() string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.b)) {
		r.fail("string of %d bytes in %d", n, len(r.b))
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *reader) parts() parts {
	var out parts
	nt := r.count(2) // a topic takes at least 2 bytes: name length and partition count
	for i := 0; i < nt && r.err == nil; i++ {
		t := r.string()
		np := r.count(1)
		if r.err != nil {
			break
		}
		if t == "" || np == 0 || out[t] != nil {
			r.fail("partition list of topic %q: empty or repeated", t)
			break
		}
		ps := make([]int32, 0, np)
		for j := 0; j < np && r.err == nil; j++ {
			p := r.int32()
			if r.err == nil && (p < 0 || len(ps) > 0 && ps[len(ps)-1] >= p) {
				r.fail("partitions of %q not ascending from 0", t)
			}
			ps = append(ps, p)
		}
		if out == nil {
			out = parts{}
		}
		out[t] = ps
	}
	if r.err != nil {
		return nil
	}
	return out
}

// end returns the first error, or one for bytes left over.
func (r *reader) end(what string) error {
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d bytes after the %s", len(r.b), what)
	}
	if r.err != nil {
		return fmt.Errorf("decode %s: %w", what, r.err)
	}
	return nil
}

// sortedSubTopics returns m's topics as subTopics sorted by name.
func sortedSubTopics(m map[string]TopicInfo) []subTopic {
	out := make([]subTopic, 0, len(m))
	for name, ti := range m {
		out = append(out, subTopic{name: name, id: ti.ID, partitions: ti.Partitions})
	}
	slices.SortFunc(out, func(a, b subTopic) int {
		switch {
		case a.name < b.name:
			return -1
		case a.name > b.name:
			return 1
		}
		return 0
	})
	return out
}
