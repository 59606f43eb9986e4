package txn

import (
	"bytes"
	"errors"
	"testing"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// FuzzDecodeRecord feeds arbitrary bytes to the decoders of __transaction_state records: they must
// never panic, must fail with errCorrupt, and whatever decodes must encode back to a value that
// decodes to the same state (seeds in testdata/fuzz/FuzzDecodeRecord).
func FuzzDecodeRecord(f *testing.F) {
	m := &txnMeta{producerID: 7, epoch: 3, lastEpoch: -1, state: 1, timeoutMs: 60000, startMs: 5, updateMs: 6,
		parts: map[tp]struct{}{{"a", 0}: {}, {"__consumer_offsets", 4}: {}}, groups: map[string]struct{}{"g": {}}}
	f.Add(encodeKey("t"), m.encode())
	ended := &txnMeta{producerID: 7, epoch: 4, lastEpoch: 3, state: runnelv1.TxnState_TXN_COMPLETE_COMMIT, timeoutMs: 60000, startMs: -1,
		updateMs: 7, parts: map[tp]struct{}{}, groups: map[string]struct{}{}}
	f.Add(encodeKey("t"), ended.encode())
	f.Add(encodeKey(""), []byte{0, 1})
	f.Add([]byte{0, 2, 'x'}, []byte{0, 1, 8, 1})
	f.Fuzz(func(t *testing.T, key, value []byte) {
		if id, err := decodeKey(key); err != nil {
			if !errors.Is(err, errCorrupt) {
				t.Fatalf("key error %v does not wrap errCorrupt", err)
			}
		} else if !bytes.Equal(encodeKey(id), key) {
			t.Fatalf("key %x decodes to %q, which encodes to %x", key, id, encodeKey(id))
		}
		m, err := decodeValue(value)
		if err != nil {
			if !errors.Is(err, errCorrupt) {
				t.Fatalf("value error %v does not wrap errCorrupt", err)
			}
			return
		}
		enc := m.encode()
		m2, err := decodeValue(enc)
		if err != nil {
			t.Fatalf("re-encoded value does not decode: %v", err)
		}
		if !bytes.Equal(m2.encode(), enc) {
			t.Fatalf("encoding is not stable: %x then %x", enc, m2.encode())
		}
	})
}
