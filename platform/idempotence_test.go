package platform_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
)

// withProducer returns a copy of a built batch with the producer id, epoch and base sequence set (the
// RecordBatch v2 header fields at bytes 43, 51 and 53, inside the CRC).
func withProducer(b []byte, pid int64, epoch int16, seq int32) []byte {
	out := append([]byte(nil), b...)
	binary.BigEndian.PutUint64(out[43:], uint64(pid))
	binary.BigEndian.PutUint16(out[51:], uint16(epoch))
	binary.BigEndian.PutUint32(out[53:], uint32(seq))
	binary.BigEndian.PutUint32(out[17:], batch.Checksum(out))
	return out
}

// TestIdempotentProduce: a retried batch is answered with its first offsets and stored once, also
// after a restart (the state is rebuilt from the log); a gap in the sequence, a new epoch not starting
// at 0 and an older epoch are refused and change nothing.
func TestIdempotentProduce(t *testing.T) {
	dir := t.TempDir()
	tn := startNode(t, dir)
	tn.createTopic(t, "idem", 1, nil)
	init, err := tn.records.InitProducerId(ctxT(t), &runnelv1.InitProducerIdRequest{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := tn.records.InitProducerId(ctxT(t), &runnelv1.InitProducerIdRequest{})
	if err != nil || other.ProducerId == init.ProducerId {
		t.Fatalf("second producer id %v (first %d): %v", other, init.ProducerId, err)
	}
	pid := init.ProducerId
	a := withProducer(makeBatch("a", 3, 1, batch.CompressionNone), pid, 0, 0)
	b := withProducer(makeBatch("b", 2, 1, batch.CompressionNone), pid, 0, 3)
	mustAt := func(records []byte, want int64) {
		t.Helper()
		r, err := tn.produce(t, "idem", 0, records, runnelv1.Acks_ACKS_ALL)
		if err != nil || r.BaseOffset != want {
			t.Fatalf("produce: offset %v err %v, want %d", r.GetBaseOffset(), err, want)
		}
	}
	refused := func(records []byte, code runnelv1.ErrorCode) {
		t.Helper()
		_, err := tn.produce(t, "idem", 0, records, runnelv1.Acks_ACKS_ALL)
		var e *rerr.Error
		if !errors.As(err, &e) || e.Code != code {
			t.Fatalf("produce: %v, want %v", err, code)
		}
	}
	mustAt(a, 0)
	mustAt(a, 0) // a retry: same offsets, not written again
	mustAt(b, 3)
	mustAt(a, 0) // still one of the last 5
	refused(withProducer(makeBatch("gap", 1, 1, batch.CompressionNone), pid, 0, 9), runnelv1.ErrorCode_OUT_OF_ORDER_SEQUENCE_NUMBER)
	refused(withProducer(makeBatch("e1", 1, 1, batch.CompressionNone), pid, 1, 5), runnelv1.ErrorCode_OUT_OF_ORDER_SEQUENCE_NUMBER)
	if got := tn.readAll(t, "idem", 0); len(got) != 5 {
		t.Fatalf("log after retries and refusals: %v, want 5 records", got)
	}
	tn.close()

	tn = startNode(t, dir)
	mustAt(b, 3) // the state was rebuilt from the log
	mustAt(withProducer(makeBatch("c", 1, 1, batch.CompressionNone), pid, 0, 5), 5)
	mustAt(withProducer(makeBatch("e1", 1, 1, batch.CompressionNone), pid, 1, 0), 6) // a new epoch starts at 0
	refused(withProducer(makeBatch("old", 1, 1, batch.CompressionNone), pid, 0, 6), runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH)
	if got := tn.readAll(t, "idem", 0); len(got) != 7 {
		t.Fatalf("log at the end: %v, want 7 records", got)
	}
	// Two batches of one producer in one request are refused: each needs its own sequence check.
	two := append(withProducer(makeBatch("x", 1, 1, batch.CompressionNone), pid, 1, 1), withProducer(makeBatch("y", 1, 1, batch.CompressionNone), pid, 1, 2)...)
	refused(two, runnelv1.ErrorCode_INVALID_REQUEST)
}
