package batch

import (
	"encoding/binary"
	"math"
	"math/bits"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// Record layout inside a batch (Kafka's v2 record, all integers zig-zag varints as protobuf's sint):
//
//	length          varint  bytes after this field
//	attributes      int8    unused, 0
//	timestampDelta  varlong ms from the batch's baseTimestamp
//	offsetDelta     varint  from the batch's baseOffset
//	keyLength       varint  -1 for a null key
//	key             bytes
//	valueLength     varint  -1 for a null value (a tombstone)
//	value           bytes
//	headerCount     varint
//	headers         keyLength varint, key bytes, valueLength varint (-1: null), value bytes

// RecordHeader is one record header: a string key and a nullable value, as in Kafka.
type RecordHeader struct {
	Key   string
	Value []byte
}

// Record is one record decoded from a batch. Key, Value and header values alias the bytes passed to
// DecodeRecords (or a buffer decompressed for that call) and stay valid as long as those bytes do; nil
// means null on the wire (a nil Value is a tombstone).
type Record struct {
	Offset      int64 // absolute: the batch's baseOffset + the record's offsetDelta
	Timestamp   int64 // ms since the Unix epoch; the batch's maxTimestamp for LogAppendTime batches
	Key, Value  []byte
	Headers     []RecordHeader
	LeaderEpoch int32 // partitionLeaderEpoch of the batch (-1 before the broker stamps it)
	ProducerID  int64 // -1 for non-idempotent producers
	// Control marks a transaction marker of a control batch; Key holds the marker's version and type.
	// Applications normally skip control records.
	Control bool
	// Transactional marks records written inside a transaction.
	Transactional bool
}

// minRecordSize is the smallest encoding of a record: a one-byte varint for each of length, timestamp
// delta, offset delta, key length, value length and header count, plus attributes. It bounds how many
// records a record area can hold, so untrusted counts never size an allocation.
const minRecordSize = 7

// varintLen returns the size of v as a zig-zag varint (encoding/binary.AppendVarint).
func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	return (bits.Len64(u|1) + 6) / 7
}

// bytesLen returns the size of a nullable byte field: its varint length then the bytes.
func bytesLen(b []byte) int {
	if b == nil {
		return 1 // varint -1
	}
	return varintLen(int64(len(b))) + len(b)
}

func recordBodyLen(tsDelta int64, offsetDelta int32, key, value []byte, headers []RecordHeader) int {
	n := 1 + varintLen(tsDelta) + varintLen(int64(offsetDelta)) + bytesLen(key) + bytesLen(value) + varintLen(int64(len(headers)))
	for i := range headers {
		h := &headers[i]
		n += varintLen(int64(len(h.Key))) + len(h.Key) + bytesLen(h.Value)
	}
	return n
}

// RecordSize returns an upper bound of the encoded size of a record with this key, value and headers in
// any batch (it assumes the largest timestamp and offset deltas a producer writes). Producers use it to
// account buffered bytes before a record is placed in a batch.
func RecordSize(key, value []byte, headers []RecordHeader) int {
	n := recordBodyLen(0, 0, key, value, headers) + 4 + 9 // offset delta up to 5 bytes, timestamp delta up to 10
	return varintLen(int64(n)) + n
}

// Builder accumulates records into one RecordBatch v2. Records are encoded as they are appended, straight
// into the batch buffer; Build then compresses the record area and fills the header. A Builder is reused
// with Reset, keeping its buffers, so a producer that pools Builders allocates nothing per record.
//
// The zero Builder is ready to use. A Builder is not safe for concurrent use.
type Builder struct {
	buf    []byte // HeaderSize bytes of header space, then the encoded records
	out    []byte // the built batch when compressed
	count  int32
	baseTs int64
	maxTs  int64
	built  bool
	// Producer fields for Build, set by SetProducer; hasProducer false means -1, -1, -1 (so the zero
	// Builder needs no initialisation).
	hasProducer   bool
	producerID    int64
	producerEpoch int16
	baseSequence  int32
	// attrs are the transactional and control bits Build writes (SetTransactional, BuildControl).
	attrs int16
}

// Reset empties the builder for a new batch, keeping its buffers. The producer fields go back to -1.
func (b *Builder) Reset() {
	if cap(b.buf) < HeaderSize {
		b.buf = make([]byte, HeaderSize, 4096)
	}
	b.buf = b.buf[:HeaderSize]
	b.out = b.out[:0]
	b.count, b.baseTs, b.maxTs, b.built = 0, 0, 0, false
	b.hasProducer, b.producerID, b.producerEpoch, b.baseSequence = false, 0, 0, 0
	b.attrs = 0
}

// SetTransactional marks the next Build's batch as part of a transaction (AttrTransactional, KIP-98):
// read_committed readers hold it back until its producer's COMMIT marker, and drop it after an ABORT.
// Like SetProducer it lasts until Reset, and goes with SetProducer (a transactional batch is idempotent).
func (b *Builder) SetTransactional(on bool) {
	if on {
		b.attrs |= AttrTransactional
	} else {
		b.attrs &^= AttrTransactional
	}
}

// SetProducer sets the producer id, producer epoch and base sequence that the next Build writes into
// the header (inside the CRC), for an idempotent producer (KIP-98): the leader drops a batch whose
// sequence it has already stored for that producer id and partition and refuses one that leaves a gap.
// They stay until Reset (or an Append after Build, which resets), which restores -1, -1, -1: "no
// producer". Call it after the last Append, since an Append following a Build starts a new batch.
func (b *Builder) SetProducer(id int64, epoch int16, baseSequence int32) {
	b.hasProducer, b.producerID, b.producerEpoch, b.baseSequence = true, id, epoch, baseSequence
}

// NextSequence returns the base sequence of the batch after one of count records starting at seq:
// seq+count, wrapping past math.MaxInt32 to 0 as Kafka's DefaultRecordBatch.incrementSequence does
// (MaxInt32 is followed by 0). count must be within [0, MaxInt32].
func NextSequence(seq, count int32) int32 {
	if seq > math.MaxInt32-count {
		return count - (math.MaxInt32 - seq) - 1
	}
	return seq + count
}

// Len returns the number of records appended since the last Reset.
func (b *Builder) Len() int { return int(b.count) }

// Size returns the uncompressed size in bytes of the batch built so far (header included); an empty
// Builder has size HeaderSize.
func (b *Builder) Size() int {
	if len(b.buf) < HeaderSize {
		return HeaderSize
	}
	return len(b.buf)
}

// Cap returns the bytes of memory the Builder's buffers hold (their capacity), which Reset keeps for
// the next batch: what a pool of Builders costs.
func (b *Builder) Cap() int { return cap(b.buf) + cap(b.out) }

// RecordSize returns the exact number of bytes appending this record would add to the batch.
func (b *Builder) RecordSize(ts int64, key, value []byte, headers []RecordHeader) int {
	delta := int64(0)
	if b.count > 0 {
		delta = ts - b.baseTs
	}
	n := recordBodyLen(delta, b.count, key, value, headers)
	return varintLen(int64(n)) + n
}

// Append encodes one record at the end of the batch and returns its encoded size. ts is the record's
// timestamp in ms since the Unix epoch; the first record's becomes the batch's baseTimestamp. A nil key
// or value is encoded as null (a nil value is a tombstone). Appending after Build starts a new batch.
func (b *Builder) Append(ts int64, key, value []byte, headers []RecordHeader) int {
	n, _ := b.AppendWithin(math.MaxInt, ts, key, value, headers)
	return n
}

// AppendWithin appends the record as Append does when the batch's Size would then be at most limit
// bytes, and returns the record's encoded size and true. Otherwise it changes nothing and returns the
// size the record would have taken and false. After Build the Builder counts as empty, since the record
// would start a new batch. A producer that caps its batches needs the record's size to decide, and
// Append needs it again for the record's length field: computing it once for both is cheaper than
// RecordSize followed by Append.
func (b *Builder) AppendWithin(limit int, ts int64, key, value []byte, headers []RecordHeader) (int, bool) {
	fresh := b.built || len(b.buf) < HeaderSize
	count, size := b.count, len(b.buf)
	if fresh {
		count, size = 0, HeaderSize
	}
	delta := int64(0)
	if count > 0 {
		delta = ts - b.baseTs
	}
	bodyLen := recordBodyLen(delta, count, key, value, headers)
	n := varintLen(int64(bodyLen)) + bodyLen
	if size+n > limit {
		return n, false
	}
	if fresh {
		b.Reset()
	}
	if count == 0 {
		b.baseTs, b.maxTs = ts, ts
	} else if ts > b.maxTs {
		b.maxTs = ts
	}
	if cap(b.buf)-len(b.buf) < n {
		b.Grow(n)
	}
	buf := b.buf
	buf = binary.AppendVarint(buf, int64(bodyLen))
	buf = append(buf, 0) // attributes
	buf = binary.AppendVarint(buf, delta)
	buf = binary.AppendVarint(buf, int64(count))
	buf = appendNullableBytes(buf, key)
	buf = appendNullableBytes(buf, value)
	buf = binary.AppendVarint(buf, int64(len(headers)))
	for i := range headers {
		h := &headers[i]
		buf = binary.AppendVarint(buf, int64(len(h.Key)))
		buf = append(buf, h.Key...)
		buf = appendNullableBytes(buf, h.Value)
	}
	b.buf = buf
	b.count++
	return n, true
}

// Grow makes room for at least n more bytes of records without another allocation. A producer that
// knows how large its batches get calls it once for a new batch, so the buffer is allocated at its size
// rather than grown to it by copying. Append grows the buffer itself when needed, doubling it (where a
// plain append grows a large slice by a quarter, copying it many times on its way to a full batch).
func (b *Builder) Grow(n int) {
	if len(b.buf) < HeaderSize {
		b.Reset()
	}
	if cap(b.buf)-len(b.buf) >= n {
		return
	}
	nb := make([]byte, len(b.buf), max(2*cap(b.buf), len(b.buf)+n))
	copy(nb, b.buf)
	b.buf = nb
}

func appendNullableBytes(dst, b []byte) []byte {
	if b == nil {
		return append(dst, 1) // zig-zag -1
	}
	dst = binary.AppendVarint(dst, int64(len(b)))
	return append(dst, b...)
}

// Build returns the finished batch: records compressed with c as a whole (Kafka's format), header filled
// (magic 2, baseOffset 0, partitionLeaderEpoch -1, producerId, producerEpoch and baseSequence from
// SetProducer or else -1, timestamps, lastOffsetDelta, recordCount, length) and its CRC-32C. When compression does not make the
// record area smaller the batch is sent uncompressed, which every reader accepts.
//
// The returned bytes belong to the Builder and stay valid until its next Reset or Append (or AppendWithin
// that appends); Build may be called again (with the same or another codec) until then. A Builder
// without records builds a batch with recordCount 0, which brokers refuse. Build panics on a codec
// outside CompressionNone..Zstd, a programming error the producer's options rule out.
func (b *Builder) Build(c Compression) []byte {
	if len(b.buf) < HeaderSize {
		b.Reset()
	}
	b.built = true
	out := b.buf
	attrs := int16(0)
	if c != CompressionNone && b.count > 0 {
		b.out = compress(c, append(b.out[:0], b.buf[:HeaderSize]...), b.buf[HeaderSize:])
		if len(b.out) < len(b.buf) {
			out = b.out
			attrs = int16(c)
		}
	}
	lastDelta := b.count - 1
	if lastDelta < 0 {
		lastDelta = 0
	}
	be := binary.BigEndian
	be.PutUint64(out[0:], 0)
	be.PutUint32(out[8:], uint32(len(out)-lengthFieldEnd))
	be.PutUint32(out[12:], math.MaxUint32) // partitionLeaderEpoch -1
	out[16] = Magic
	be.PutUint16(out[21:], uint16(attrs|b.attrs))
	be.PutUint32(out[23:], uint32(lastDelta))
	be.PutUint64(out[27:], uint64(b.baseTs))
	be.PutUint64(out[35:], uint64(b.maxTs))
	if b.hasProducer {
		be.PutUint64(out[43:], uint64(b.producerID))
		be.PutUint16(out[51:], uint16(b.producerEpoch))
		be.PutUint32(out[53:], uint32(b.baseSequence))
	} else {
		be.PutUint64(out[43:], math.MaxUint64) // producerId -1
		be.PutUint16(out[51:], math.MaxUint16) // producerEpoch -1
		be.PutUint32(out[53:], math.MaxUint32) // baseSequence -1
	}
	be.PutUint32(out[57:], uint32(b.count))
	be.PutUint32(out[17:], Checksum(out))
	return out
}

func corrupt(format string, args ...any) error {
	return rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, format, args...)
}

// DecodeRecords decodes the batch at the start of b and calls fn with each record in order. It is
// DecodeBatch without the header; see there.
func DecodeRecords(b []byte, fn func(Record) error) error {
	_, err := DecodeBatch(b, fn)
	return err
}

// openArea validates the batch at the start of b (Validate) and returns its header and record area,
// decompressed. The header's record count must fit in the area (minRecordSize bytes a record): Validate
// checks that through the framing of an uncompressed batch, and here it is checked for a compressed
// one, so that nobody sizes memory by a count the records cannot have.
func openArea(b []byte) (Header, []byte, error) {
	h, err := Validate(b)
	if err != nil {
		return h, nil, err
	}
	area := b[HeaderSize:h.Size()]
	if c := h.Compression(); c != CompressionNone {
		if area, err = decompress(c, area); err != nil {
			return h, nil, err
		}
		if int64(h.RecordCount)*minRecordSize > int64(len(area)) {
			return h, nil, corrupt("%d records cannot fit in %d decompressed bytes", h.RecordCount, len(area))
		}
	}
	return h, area, nil
}

// DecodeBatch validates the batch at the start of b (Validate: header, CRC, framing), decompresses its
// records (at most MaxUncompressedSize bytes) and calls fn with each record in order; bytes after the
// batch are ignored, and the batch is b[:h.Size()]. Offsets are absolute (baseOffset+offsetDelta);
// timestamps are baseTimestamp+timestampDelta, or the batch's maxTimestamp when the broker stamped it
// with LogAppendTime. Records of control batches are reported with Control set.
//
// b is untrusted: DecodeBatch never panics and never sizes an allocation from an unchecked length. A
// malformed batch returns an error matching rerr.ErrCorruptMessage (errors.Is) that says what is wrong,
// after fn has seen the records before the damage; another magic returns rerr.ErrUnsupportedForFormat.
// An error from fn stops the walk and is returned as it is.
func DecodeBatch(b []byte, fn func(Record) error) (Header, error) {
	h, area, err := openArea(b)
	if err != nil {
		return h, err
	}
	rec := Record{
		LeaderEpoch:   h.PartitionLeaderEpoch,
		ProducerID:    h.ProducerID,
		Control:       h.IsControl(),
		Transactional: h.IsTransactional(),
	}
	logAppend := h.Attributes&AttrLogAppendTime != 0
	pos := 0
	for i := int32(0); i < h.RecordCount; i++ {
		n, w := binary.Varint(area[pos:])
		if w <= 0 || n < minRecordSize-1 || n > int64(len(area)-pos-w) {
			return h, corrupt("record %d of %d at byte %d has a bad length", i, h.RecordCount, pos)
		}
		body := area[pos+w : pos+w+int(n)]
		pos += w + int(n)
		tsDelta, offDelta, msg := readRecord(body, &rec)
		if msg != "" {
			return h, corrupt("record %d of %d: %s", i, h.RecordCount, msg)
		}
		rec.Offset = h.BaseOffset + int64(offDelta)
		if logAppend {
			rec.Timestamp = h.MaxTimestamp
		} else {
			rec.Timestamp = h.BaseTimestamp + tsDelta
		}
		if err := fn(rec); err != nil {
			return h, err
		}
	}
	if pos != len(area) {
		return h, corrupt("%d bytes after the last of %d records", len(area)-pos, h.RecordCount)
	}
	return h, nil
}
