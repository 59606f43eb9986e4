// Package batch reads and writes Kafka RecordBatch v2 (magic 2), the one record format of Runnel on the
// wire and on disk.
//
// Layout of the 61-byte header (big-endian), from Kafka's KIP-98 message format:
//
//	offset  size  field
//	0       8     baseOffset            (assigned by the broker; not covered by the CRC)
//	8       4     batchLength           (bytes after this field)
//	12      4     partitionLeaderEpoch  (set by the broker; not covered by the CRC)
//	16      1     magic                 (2)
//	17      4     crc                   (CRC-32C of everything from attributes to the end)
//	21      2     attributes            (bits 0-2 compression, 3 timestamp type, 4 transactional, 5 control)
//	23      4     lastOffsetDelta
//	27      8     baseTimestamp         (ms)
//	35      8     maxTimestamp          (ms)
//	43      8     producerId
//	51      2     producerEpoch
//	53      4     baseSequence
//	57      4     recordCount
//	61      ...   records (compressed as a whole when attributes say so)
//
// The broker only reads and rewrites headers (ParseHeader, Validate, SetBaseOffset, SetLogAppendTime); it
// never re-encodes records. Clients build batches with Builder and read them with DecodeRecords.
package batch

import (
	"encoding/binary"
	"hash/crc32"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// HeaderSize is the size in bytes of a RecordBatch v2 header; the smallest batch is this long.
const HeaderSize = 61

// Magic is the only supported message format version.
const Magic = 2

// lengthFieldEnd is where batchLength's count starts: a batch is lengthFieldEnd+batchLength bytes long.
const lengthFieldEnd = 12

// crcStart is the first byte covered by the CRC (attributes).
const crcStart = 21

// Attribute bits of the header.
const (
	AttrCompressionMask = 0x07
	AttrLogAppendTime   = 0x08
	AttrTransactional   = 0x10
	AttrControl         = 0x20
)

// Compression is the codec in attributes bits 0-2, numbered as in Kafka.
type Compression int8

// Codecs.
const (
	CompressionNone   Compression = 0
	CompressionGzip   Compression = 1
	CompressionSnappy Compression = 2
	CompressionLZ4    Compression = 3
	CompressionZstd   Compression = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Header is a decoded RecordBatch v2 header.
type Header struct {
	BaseOffset           int64
	Length               int32 // bytes after the length field; the batch is Length+12 bytes
	PartitionLeaderEpoch int32
	Magic                int8
	CRC                  uint32
	Attributes           int16
	LastOffsetDelta      int32
	BaseTimestamp        int64 // ms
	MaxTimestamp         int64 // ms
	ProducerID           int64
	ProducerEpoch        int16
	BaseSequence         int32
	RecordCount          int32
}

// Size is the encoded size of the whole batch in bytes.
func (h Header) Size() int { return lengthFieldEnd + int(h.Length) }

// LastOffset is the offset of the batch's last record.
func (h Header) LastOffset() int64 { return h.BaseOffset + int64(h.LastOffsetDelta) }

// NextOffset is the offset after the batch's last record.
func (h Header) NextOffset() int64 { return h.LastOffset() + 1 }

// Compression returns the batch's codec.
func (h Header) Compression() Compression { return Compression(h.Attributes & AttrCompressionMask) }

// IsControl reports whether the batch holds transaction markers rather than application records.
func (h Header) IsControl() bool { return h.Attributes&AttrControl != 0 }

// IsTransactional reports whether the batch belongs to a transaction.
func (h Header) IsTransactional() bool { return h.Attributes&AttrTransactional != 0 }

// ParseHeader decodes the header at the start of b and checks that b holds the whole batch. It checks
// sizes and magic only; Validate also checks the CRC and the record framing. Errors are
// rerr.ErrCorruptMessage (wrapped with what is wrong) or rerr.ErrUnsupportedForFormat for another magic.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "batch of %d bytes is shorter than the %d-byte header", len(b), HeaderSize)
	}
	h := Header{
		BaseOffset:           int64(binary.BigEndian.Uint64(b[0:])),
		Length:               int32(binary.BigEndian.Uint32(b[8:])),
		PartitionLeaderEpoch: int32(binary.BigEndian.Uint32(b[12:])),
		Magic:                int8(b[16]),
		CRC:                  binary.BigEndian.Uint32(b[17:]),
		Attributes:           int16(binary.BigEndian.Uint16(b[21:])),
		LastOffsetDelta:      int32(binary.BigEndian.Uint32(b[23:])),
		BaseTimestamp:        int64(binary.BigEndian.Uint64(b[27:])),
		MaxTimestamp:         int64(binary.BigEndian.Uint64(b[35:])),
		ProducerID:           int64(binary.BigEndian.Uint64(b[43:])),
		ProducerEpoch:        int16(binary.BigEndian.Uint16(b[51:])),
		BaseSequence:         int32(binary.BigEndian.Uint32(b[53:])),
		RecordCount:          int32(binary.BigEndian.Uint32(b[57:])),
	}
	if h.Magic != Magic {
		return h, rerr.New(runnelv1.ErrorCode_UNSUPPORTED_FOR_MESSAGE_FORMAT, "batch magic %d, only magic %d is supported", h.Magic, Magic)
	}
	if h.Length < HeaderSize-lengthFieldEnd {
		return h, rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "batch length %d is shorter than the header", h.Length)
	}
	if int64(h.Length)+lengthFieldEnd > int64(len(b)) {
		return h, rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "batch length %d runs past the %d bytes received (truncated batch)", h.Length, len(b)-lengthFieldEnd)
	}
	if h.RecordCount < 0 || h.LastOffsetDelta < 0 {
		return h, rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "negative record count %d or last offset delta %d", h.RecordCount, h.LastOffsetDelta)
	}
	if h.IsControl() {
		if h.RecordCount != 1 {
			return h, rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "control batch with %d records", h.RecordCount)
		}
	} else if h.RecordCount == 0 {
		return h, rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "batch without records")
	}
	// Compaction can remove records from a stored batch, so the delta may exceed count-1, never fall short.
	if int64(h.LastOffsetDelta) < int64(h.RecordCount)-1 {
		return h, rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "last offset delta %d below record count %d", h.LastOffsetDelta, h.RecordCount)
	}
	if c := h.Compression(); c > CompressionZstd {
		return h, rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "unknown compression codec %d", c)
	}
	return h, nil
}

// Checksum returns the CRC-32C a batch's header should carry (over attributes to the end).
func Checksum(b []byte) uint32 { return crc32.Checksum(b[crcStart:], castagnoli) }

// Validate parses the header of the batch at the start of b and checks its CRC and, for uncompressed
// batches, that the records' length prefixes tile the record area exactly with recordCount records
// (compressed records are checked by consumers when they decompress). It returns the header; the batch
// is b[:h.Size()].
func Validate(b []byte) (Header, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return h, err
	}
	whole := b[:h.Size()]
	if got := Checksum(whole); got != h.CRC {
		return h, rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "batch CRC %08x does not match its contents (%08x)", h.CRC, got)
	}
	if h.Compression() == CompressionNone {
		if err := checkFraming(whole[HeaderSize:], h.RecordCount); err != nil {
			return h, err
		}
	}
	return h, nil
}

// checkFraming walks the varint length of each record: n records must fill area exactly.
func checkFraming(area []byte, n int32) error {
	pos := 0
	for i := int32(0); i < n; i++ {
		end, ok := frameEnd(area, pos)
		if !ok {
			return rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "record %d of %d has a bad length", i, n)
		}
		pos = end
	}
	if pos != len(area) {
		return rerr.New(runnelv1.ErrorCode_CORRUPT_MESSAGE, "%d bytes after the last of %d records", len(area)-pos, n)
	}
	return nil
}

// frameEnd reads the varint length of the record at pos and returns where the record ends, or false
// when the length is not a varint or the record does not fit in area: the framing a broker checks, and
// all a reader needs to pass over a record without decoding it (Reader.Skip).
func frameEnd(area []byte, pos int) (int, bool) {
	l, w := varint(area[pos:])
	if w <= 0 || l < 0 || l > int64(len(area)-pos-w) {
		return pos, false
	}
	return pos + w + int(l), true
}

// Split calls fn with each batch of a concatenation of batches, after Validate. It stops at the first
// error (fn's or a corrupt batch's). An empty b calls fn never and returns nil.
func Split(b []byte, fn func(batch []byte, h Header) error) error {
	for len(b) > 0 {
		h, err := Validate(b)
		if err != nil {
			return err
		}
		if err := fn(b[:h.Size()], h); err != nil {
			return err
		}
		b = b[h.Size():]
	}
	return nil
}

// SetBaseOffset writes the broker-assigned base offset into the header of the batch at b. The base
// offset is outside the CRC, so the checksum stays valid.
func SetBaseOffset(b []byte, offset int64) { binary.BigEndian.PutUint64(b[0:], uint64(offset)) }

// SetPartitionLeaderEpoch writes the leader epoch of the appending leader (outside the CRC).
func SetPartitionLeaderEpoch(b []byte, epoch int32) {
	binary.BigEndian.PutUint32(b[12:], uint32(epoch))
}

// SetLogAppendTime marks the batch at b as carrying the broker's append time (ms) for topics with
// message.timestamp.type=LogAppendTime: it sets the timestamp-type bit and maxTimestamp (which readers
// then use for every record, as in Kafka) and recomputes the CRC. The records themselves are untouched.
func SetLogAppendTime(b []byte, ts int64) {
	attrs := binary.BigEndian.Uint16(b[21:]) | AttrLogAppendTime
	binary.BigEndian.PutUint16(b[21:], attrs)
	binary.BigEndian.PutUint64(b[35:], uint64(ts))
	binary.BigEndian.PutUint32(b[17:], Checksum(b[:lengthFieldEnd+int(int32(binary.BigEndian.Uint32(b[8:])))]))
}
