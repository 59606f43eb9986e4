package batch

import (
	"encoding/binary"
	"math"
)

// Reader walks the records of one batch without a callback per record, for readers that decode many
// records: OpenBatch validates the batch and decompresses its records once, Check finds damage without
// building records, Next decodes one record at a time into a Record the caller reuses, and PeekOffset
// with Skip pass over records undecoded. What a Reader accepts and rejects, and the errors it returns,
// are DecodeBatch's.
//
// The SDK's consumer opens a fetched batch when the answer arrives and decodes it with Next when the
// application polls, handing out the records before one that does not decode; it does not Check first,
// which would decode every record twice. The zero Reader reads nothing.
type Reader struct {
	h         Header
	area      []byte // the record area, decompressed
	pos       int    // of the next record in area
	i         int32  // records read
	logAppend bool
}

// OpenBatch validates the batch at the start of b (Validate: header, CRC, framing) and returns a Reader
// of its records, decompressed when the batch is compressed (at most MaxUncompressedSize bytes). Bytes
// after the batch are ignored; the batch is b[:r.Header().Size()]. Errors match rerr.ErrCorruptMessage,
// or rerr.ErrUnsupportedForFormat for another magic. The Reader aliases b (or the decompressed area).
func OpenBatch(b []byte) (Reader, error) {
	h, area, err := openArea(b)
	if err != nil {
		return Reader{h: h}, err
	}
	return Reader{h: h, area: area, logAppend: h.Attributes&AttrLogAppendTime != 0}, nil
}

// Header returns the batch's header.
func (r *Reader) Header() Header { return r.h }

// Check walks the records that Next has not read yet and returns the error Next would meet on the way
// (nil when every record decodes), without building records or moving the Reader. A batch that Check
// accepted decodes with Next without error.
func (r *Reader) Check() error {
	pos := r.pos
	for i := r.i; i < r.h.RecordCount; i++ {
		body, next, err := r.body(i, pos)
		if err != nil {
			return err
		}
		if msg := checkRecord(body); msg != "" {
			return corrupt("record %d of %d: %s", i, r.h.RecordCount, msg)
		}
		pos = next
	}
	if pos != len(r.area) {
		return corrupt("%d bytes after the last of %d records", len(r.area)-pos, r.h.RecordCount)
	}
	return nil
}

// Next decodes the next record into rec (every field is set; Key, Value and header values alias the
// batch, Headers is a fresh slice or nil) and reports whether there was one; after the last record it
// returns false, or the error of bytes left after it. Offsets and timestamps are as DecodeBatch reports
// them.
func (r *Reader) Next(rec *Record) (bool, error) {
	if r.i >= r.h.RecordCount {
		if r.pos != len(r.area) {
			return false, corrupt("%d bytes after the last of %d records", len(r.area)-r.pos, r.h.RecordCount)
		}
		return false, nil
	}
	body, next, err := r.body(r.i, r.pos)
	if err != nil {
		return false, err
	}
	tsDelta, offDelta, msg := readRecord(body, rec)
	if msg != "" {
		return false, corrupt("record %d of %d: %s", r.i, r.h.RecordCount, msg)
	}
	r.i++
	r.pos = next
	h := &r.h
	rec.Offset = h.BaseOffset + int64(offDelta)
	if r.logAppend {
		rec.Timestamp = h.MaxTimestamp
	} else {
		rec.Timestamp = h.BaseTimestamp + tsDelta
	}
	rec.LeaderEpoch, rec.ProducerID = h.PartitionLeaderEpoch, h.ProducerID
	rec.Control, rec.Transactional = h.IsControl(), h.IsTransactional()
	return true, nil
}

// PeekOffset returns the offset of the next record, reading only its offset delta, and false after the
// last record. A record whose delta cannot be read, or cannot be right (deltas grow from 0 by at least
// one a record, up to LastOffsetDelta), is given BaseOffset plus its index, the offset a batch without
// gaps gives it: enough for a consumer that seeks past a record that does not decode to find where to
// resume (Skip). A damaged delta that still looks right is taken as it reads.
func (r *Reader) PeekOffset() (int64, bool) {
	if r.i >= r.h.RecordCount {
		return 0, false
	}
	guess := r.h.BaseOffset + int64(r.i)
	body, _, err := r.body(r.i, r.pos)
	if err != nil {
		return guess, true
	}
	pos := 1 // attributes, unused
	if _, w := varint(body[min(pos, len(body)):]); w > 0 {
		pos += w
		if od, w := varint(body[min(pos, len(body)):]); w > 0 && od >= int64(r.i) && od <= int64(r.h.LastOffsetDelta) {
			return r.h.BaseOffset + od, true
		}
	}
	return guess, true
}

// Skip passes over the next record without decoding it (Next would fail on a damaged one), reading
// only its length. It fails only when that length does not fit the batch, as nothing after the record
// can be found then; Validate has ruled that out for an uncompressed batch.
func (r *Reader) Skip() error {
	end, ok := frameEnd(r.area, r.pos)
	if !ok {
		return corrupt("record %d of %d at byte %d has a bad length", r.i, r.h.RecordCount, r.pos)
	}
	r.i++
	r.pos = end
	return nil
}

// body returns the body of record i (after its length) at pos, and the position after it.
func (r *Reader) body(i int32, pos int) ([]byte, int, error) {
	n, w := varint(r.area[pos:])
	if w <= 0 || n < minRecordSize-1 || n > int64(len(r.area)-pos-w) {
		return nil, pos, corrupt("record %d of %d at byte %d has a bad length", i, r.h.RecordCount, pos)
	}
	end := pos + w + int(n)
	return r.area[pos+w : end], end, nil
}

// varint is binary.Varint with the one- and two-byte cases unrolled: most fields of a record (deltas,
// counts, lengths below 8 KiB) take one or two bytes.
func varint(b []byte) (int64, int) {
	var u uint64
	var w int
	switch {
	case len(b) > 0 && b[0] < 0x80:
		u, w = uint64(b[0]), 1
	case len(b) > 1 && b[1] < 0x80:
		u, w = uint64(b[0]&0x7f)|uint64(b[1])<<7, 2
	default:
		return binary.Varint(b)
	}
	return int64(u>>1) ^ -int64(u&1), w
}

// readRecord parses one record body (after its length) into r's key, value and headers (a fresh
// slice, or nil: callers keep them) and returns its timestamp and offset deltas, or what is wrong with
// it. DecodeBatch, the rewriter and Reader all use it.
func readRecord(body []byte, r *Record) (tsDelta int64, offDelta int32, problem string) {
	pos := 1 // attributes, unused
	tsDelta, w := varint(body[pos:])
	if w <= 0 {
		return 0, 0, "bad timestamp delta"
	}
	pos += w
	od, w := varint(body[pos:])
	if w <= 0 || od < 0 || od > math.MaxInt32 {
		return 0, 0, "bad offset delta"
	}
	pos += w
	if r.Key, pos, problem = nullable(body, pos, "key"); problem != "" {
		return 0, 0, problem
	}
	if r.Value, pos, problem = nullable(body, pos, "value"); problem != "" {
		return 0, 0, problem
	}
	nh, w := varint(body[pos:])
	if w <= 0 || nh < 0 || nh > int64(len(body)-pos-w)/2 { // a header takes at least 2 bytes
		return 0, 0, "bad header count"
	}
	pos += w
	r.Headers = nil
	if nh > 0 {
		hs := make([]RecordHeader, nh)
		for i := range hs {
			kl, w := varint(body[pos:])
			if w <= 0 || kl < 0 || kl > int64(len(body)-pos-w) {
				return 0, 0, "bad header key length"
			}
			pos += w
			hs[i].Key = string(body[pos : pos+int(kl)])
			pos += int(kl)
			if hs[i].Value, pos, problem = nullable(body, pos, "header value"); problem != "" {
				return 0, 0, problem
			}
		}
		r.Headers = hs
	}
	if pos != len(body) {
		return 0, 0, "bytes left over after the headers"
	}
	return tsDelta, int32(od), ""
}

// nullable reads a varint length (-1: null) and that many bytes at body[pos:].
func nullable(body []byte, pos int, what string) ([]byte, int, string) {
	if pos >= len(body) {
		return nil, pos, "record ends before its " + what
	}
	l, w := varint(body[pos:])
	if w <= 0 || l < -1 || l > int64(len(body)-pos-w) {
		return nil, pos, "bad " + what + " length"
	}
	pos += w
	if l == -1 {
		return nil, pos, ""
	}
	end := pos + int(l)
	return body[pos:end:end], end, ""
}

// checkRecord is readRecord without building anything: it returns what is wrong with a record body (in
// readRecord's words), or "". TestCheckRecordMatchesRead holds the two together.
func checkRecord(body []byte) string {
	pos := 1 // attributes, unused
	_, w := varint(body[pos:])
	if w <= 0 {
		return "bad timestamp delta"
	}
	pos += w
	od, w := varint(body[pos:])
	if w <= 0 || od < 0 || od > math.MaxInt32 {
		return "bad offset delta"
	}
	pos += w
	var problem string
	if pos, problem = skipNullable(body, pos, "key"); problem != "" {
		return problem
	}
	if pos, problem = skipNullable(body, pos, "value"); problem != "" {
		return problem
	}
	nh, w := varint(body[pos:])
	if w <= 0 || nh < 0 || nh > int64(len(body)-pos-w)/2 {
		return "bad header count"
	}
	pos += w
	for range nh {
		kl, w := varint(body[pos:])
		if w <= 0 || kl < 0 || kl > int64(len(body)-pos-w) {
			return "bad header key length"
		}
		pos += w + int(kl)
		if pos, problem = skipNullable(body, pos, "header value"); problem != "" {
			return problem
		}
	}
	if pos != len(body) {
		return "bytes left over after the headers"
	}
	return ""
}

// skipNullable is nullable without the slice.
func skipNullable(body []byte, pos int, what string) (int, string) {
	if pos >= len(body) {
		return pos, "record ends before its " + what
	}
	l, w := varint(body[pos:])
	if w <= 0 || l < -1 || l > int64(len(body)-pos-w) {
		return pos, "bad " + what + " length"
	}
	pos += w
	if l == -1 {
		return pos, ""
	}
	return pos + int(l), ""
}
