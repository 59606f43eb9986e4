package plog

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/dgraph-io/badger/v4"

	"github.com/runnel-io/runnel/client/batch"
)

// This file holds the aborted-transaction index (KIP-98; Kafka's .txnindex files): for every ABORT
// marker in the log, the producer and the offsets its aborted transaction spans on the partition, so a
// read_committed fetch can tell its consumer which transactional batches to drop without anyone
// reading the log backwards. The broker writes markers (Append) and followers copy them
// (AppendReplica); both index them from the marker's own bytes, whose value carries the transaction's
// first offset (batch.ControlMarker.FirstOffset), so every replica holds the same index and a new
// leader serves it at once.
//
// Keys: a|topicNum|partition|markerOffset(8) → producerID(8) firstOffset(8). Keyed by the marker's
// offset, the index is cut like the batches: retention drops the entries whose marker it deletes (below
// the new log start), Truncate those whose marker it removes (at or above the new end), DeletePartition
// all of them. The writer stores an entry in the Badger transaction of its marker, ahead of the
// marker, so a stored marker always has its entry; a crash between the transactions of a large group
// can leave an entry without its marker, at or above the recovered LEO, which recovery deletes.
// Aborted transactions are few, so the partition also keeps them all in memory (loaded on open).

// AbortedTxn is one aborted transaction of a partition: the producer, the offset of its first record on
// the partition, and the offset of its ABORT marker. A read_committed consumer drops every
// transactional batch of ProducerID from FirstOffset up to the marker.
type AbortedTxn struct {
	ProducerID  int64
	FirstOffset int64
	LastOffset  int64 // the ABORT marker's offset
}

// abortOf returns the producer id and the first offset of the aborted transaction that the batch b
// (header h) ends, or first = -1 when b is not an ABORT marker of a transaction that wrote to the
// partition. Control batches whose record is not an end-transaction marker, and markers that do not
// parse, are not indexed: the index is derived data, and refusing them would stop a follower.
func abortOf(b []byte, h batch.Header) (pid, first int64) {
	if !h.IsControl() {
		return -1, -1
	}
	m, err := batch.ParseControl(b)
	if err != nil || m.Commit || m.FirstOffset < 0 {
		return -1, -1
	}
	return h.ProducerID, m.FirstOffset
}

// encodeAborted is the value of an index entry: producer id and first offset.
func encodeAborted(a AbortedTxn) []byte {
	v := make([]byte, abortValueLen)
	binary.BigEndian.PutUint64(v, uint64(a.ProducerID))
	binary.BigEndian.PutUint64(v[8:], uint64(a.FirstOffset))
	return v
}

// decodeAborted decodes one stored index entry strictly: key prefix|markerOffset(8), value producer
// id and a first offset in [0, markerOffset].
func decodeAborted(k, v []byte) (AbortedTxn, error) {
	if len(k) != batchKeyLen {
		return AbortedTxn{}, fmt.Errorf("aborted-transaction key of %d bytes, want %d", len(k), batchKeyLen)
	}
	if len(v) != abortValueLen {
		return AbortedTxn{}, fmt.Errorf("aborted-transaction entry of %d bytes, want %d", len(v), abortValueLen)
	}
	a := AbortedTxn{ProducerID: int64(binary.BigEndian.Uint64(v)), FirstOffset: int64(binary.BigEndian.Uint64(v[8:])),
		LastOffset: batchKeyOffset(k)}
	if a.FirstOffset < 0 || a.LastOffset < a.FirstOffset {
		return AbortedTxn{}, fmt.Errorf("aborted transaction [%d, %d] of producer %d", a.FirstOffset, a.LastOffset, a.ProducerID)
	}
	return a, nil
}

// AbortedTransactions returns the aborted transactions that overlap [from, upto): those whose marker is
// at or after from (LastOffset >= from) and whose first record is before upto (FirstOffset < upto),
// sorted by FirstOffset. A read_committed fetch asks with its fetch offset and the end of the batches
// it returns. The slice is the caller's; nil when there is none.
func (p *Partition) AbortedTransactions(from, upto int64) []AbortedTxn {
	p.mu.Lock()
	var out []AbortedTxn
	// p.aborted is sorted by marker offset: skip those that ended before from.
	i, _ := slices.BinarySearchFunc(p.aborted, from, func(a AbortedTxn, off int64) int {
		switch {
		case a.LastOffset < off:
			return -1
		case a.LastOffset > off:
			return 1
		}
		return 0
	})
	for _, a := range p.aborted[i:] {
		if a.FirstOffset < upto {
			out = append(out, a)
		}
	}
	p.mu.Unlock()
	slices.SortStableFunc(out, func(a, b AbortedTxn) int {
		switch {
		case a.FirstOffset < b.FirstOffset:
			return -1
		case a.FirstOffset > b.FirstOffset:
			return 1
		}
		return 0
	})
	return out
}

// ReadUpTo is Read capped at end as well as at the HW: it never returns a batch that reaches end or
// beyond. A read_committed fetch reads up to the last stable offset with it (KIP-98). An offset in
// [end, HW] returns dst unchanged (nothing stable to read yet); the errors are Read's, with the HW as
// the bound of OFFSET_OUT_OF_RANGE.
func (p *Partition) ReadUpTo(dst []byte, offset int64, maxBytes int, end int64) ([]byte, error) {
	return p.readCapped(dst, offset, maxBytes, false, end)
}

// recoverAborted loads the aborted-transaction index into p (whose log start and LEO are recovered)
// and returns the fixes to store: entries whose marker lies below the log start (a retention a crash
// split) or at or past the LEO (an entry stored without its marker by a crash between the transactions
// of one write group) are deleted.
func (p *Partition) recoverAborted(txn *badger.Txn) ([]op, error) {
	var fix []op
	it := txn.NewIterator(badger.IteratorOptions{Prefix: p.aprefix})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		var a AbortedTxn
		err := item.Value(func(v []byte) error {
			var err error
			a, err = decodeAborted(item.Key(), v)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("aborted-transaction index: %w", err)
		}
		if a.LastOffset < p.logStart || a.LastOffset >= p.leo {
			fix = append(fix, op{key: item.KeyCopy(nil), del: true})
			continue
		}
		p.aborted = append(p.aborted, a)
	}
	return fix, nil
}

// keepAborted returns the entries of as whose marker lies in [start, end), in a new slice.
func keepAborted(as []AbortedTxn, start, end int64) []AbortedTxn {
	var out []AbortedTxn
	for _, a := range as {
		if a.LastOffset >= start && a.LastOffset < end {
			out = append(out, a)
		}
	}
	return out
}
