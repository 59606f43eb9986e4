package client

import (
	"fmt"
	"time"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
)

// decodeFetched decodes the batches of one partition's fetch answer into records at or after from, as
// scanFetched and a Poll do together: control records and, when aborted lists the answer's aborted
// transactions, the records of those transactions are left out. It returns the offset after the last
// whole batch, skipped batches included; a trailing batch cut short is left for the next fetch; damage
// anywhere else is an error, returned with the records before it (of the batches before it, when the
// scan found it; before the record, when decoding did).
func decodeFetched(b []byte, topic string, partition int32, from int64, aborted []*runnelv1.AbortedTransaction) ([]*Record, int64, error) {
	batches, count, next, err := scanFetched(b, from, aborted)
	t := &taken{fp: &fetched{p: &cpart{tp: tp{topic, partition}}, batches: batches, from: from, next: next, count: count}, floor: from, mv: -1}
	recs := make([]Record, 0, count)
	if _, _, derr := decodeTake(t, func(br *batch.Record) {
		recs = append(recs, Record{Topic: topic, Partition: partition, Offset: br.Offset, Timestamp: time.UnixMilli(br.Timestamp),
			Key: br.Key, Value: br.Value, Headers: br.Headers, LeaderEpoch: br.LeaderEpoch})
	}); derr != nil {
		return pointers(recs), next, fmt.Errorf("decode: %w", derr)
	}
	return pointers(recs), next, err
}

// pointers returns pointers into recs, which is never appended to again, so they stay valid (one
// allocation per answer instead of one per record).
func pointers(recs []Record) []*Record {
	if len(recs) == 0 {
		return nil
	}
	out := make([]*Record, len(recs))
	for i := range recs {
		out[i] = &recs[i]
	}
	return out
}
