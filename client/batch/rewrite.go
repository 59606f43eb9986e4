package batch

import (
	"encoding/binary"
)

// FilterRecords returns the batch at the start of b without the records keep rejects: log compaction
// uses it to drop records that a later record with the same key made obsolete. keep sees each record as
// DecodeBatch reports it (absolute offset, timestamp, key, value; aliasing b or a decompressed buffer,
// valid only during the call).
//
// The result is a new slice, or nil when nothing changes: kept == the batch's record count means keep
// accepted every record (store the batch as it is), kept == 0 that it rejected every record (a batch
// without records is not valid, so the caller deletes it instead).
//
// Offsets never move: the rewritten batch keeps baseOffset, lastOffsetDelta, partitionLeaderEpoch,
// attributes (codec, timestamp type, transactional, control), baseTimestamp, maxTimestamp, producer id,
// epoch and base sequence, and the retained records' bytes unchanged, so their offset and timestamp
// deltas still apply and readers see gaps where records were removed (ParseHeader accepts a
// lastOffsetDelta above recordCount-1 for that reason). maxTimestamp therefore stays the original's, an
// upper bound of the retained records' timestamps, consistent with the time index the broker built from
// it. Only recordCount, the length and the CRC are new; compressed batches are compressed again with
// their own codec.
//
// Errors are those of DecodeBatch for a batch that does not validate or decode.
func FilterRecords(b []byte, keep func(Record) bool) (out []byte, kept int32, err error) {
	h, err := Validate(b)
	if err != nil {
		return nil, 0, err
	}
	codec := h.Compression()
	area := b[HeaderSize:h.Size()]
	if codec != CompressionNone {
		if area, err = decompress(codec, area); err != nil {
			return nil, 0, err
		}
	}
	rec := Record{
		LeaderEpoch:   h.PartitionLeaderEpoch,
		ProducerID:    h.ProducerID,
		Control:       h.IsControl(),
		Transactional: h.IsTransactional(),
	}
	logAppend := h.Attributes&AttrLogAppendTime != 0
	// Retained records as runs of whole encoded records in area, so the common case (a few records
	// dropped from a long batch) copies few, long pieces.
	type run struct{ from, to int }
	var runs []run
	pos := 0
	for i := int32(0); i < h.RecordCount; i++ {
		n, w := binary.Varint(area[pos:])
		if w <= 0 || n < minRecordSize-1 || n > int64(len(area)-pos-w) {
			return nil, 0, corrupt("record %d of %d at byte %d has a bad length", i, h.RecordCount, pos)
		}
		end := pos + w + int(n)
		tsDelta, offDelta, msg := readRecord(area[pos+w:end], &rec)
		if msg != "" {
			return nil, 0, corrupt("record %d of %d: %s", i, h.RecordCount, msg)
		}
		rec.Offset = h.BaseOffset + int64(offDelta)
		if logAppend {
			rec.Timestamp = h.MaxTimestamp
		} else {
			rec.Timestamp = h.BaseTimestamp + tsDelta
		}
		if keep(rec) {
			kept++
			if len(runs) > 0 && runs[len(runs)-1].to == pos {
				runs[len(runs)-1].to = end
			} else {
				runs = append(runs, run{pos, end})
			}
		}
		pos = end
	}
	if pos != len(area) {
		return nil, 0, corrupt("%d bytes after the last of %d records", len(area)-pos, h.RecordCount)
	}
	if kept == 0 || kept == h.RecordCount {
		return nil, kept, nil
	}
	var retained []byte
	if len(runs) == 1 {
		retained = area[runs[0].from:runs[0].to]
	} else {
		size := 0
		for _, r := range runs {
			size += r.to - r.from
		}
		retained = make([]byte, 0, size)
		for _, r := range runs {
			retained = append(retained, area[r.from:r.to]...)
		}
	}
	out = make([]byte, HeaderSize, HeaderSize+len(retained))
	copy(out, b[:HeaderSize])
	if codec == CompressionNone {
		out = append(out, retained...)
	} else {
		out = compress(codec, out, retained)
	}
	be := binary.BigEndian
	be.PutUint32(out[8:], uint32(len(out)-lengthFieldEnd))
	be.PutUint32(out[57:], uint32(kept))
	be.PutUint32(out[17:], Checksum(out))
	return out, kept, nil
}
