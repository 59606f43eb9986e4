package broker

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unicode/utf8"
	"weak"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// Produce requests and their record buffers.
//
// The node's gRPC codec (fetchCodec, ServerCodec) decodes a *runnelv1.ProduceRequest by hand: the
// message is copied once out of gRPC's frame buffers into a buffer taken from recordBufs, and every
// ProducePartition.Records is a slice of that buffer instead of a copy of its own. gRPC's proto codec
// copied the message into a buffer of gRPC's pool, which the pool clears when it has to allocate (after
// every garbage collection empties it), and proto.Unmarshal then copied every records field again
// (protobuf-go copies bytes fields even with UnmarshalAliasBuffer). Profiles of issue 9 put the two at
// one of the node's largest CPU items under produce.
//
// Ownership: the codec records the buffer in produceBufs under the request; the handler (Produce,
// ProduceStream) takes it from there as soon as it has the request (takeProduceBuf) and hands it to
// startProduce, which returns it to recordBufs once every partition's append callback has run (or at
// once when it refuses the request before enqueueing anything). The records are not read after that:
// plog's writer hands them to Badger, which copies them into its value log and memtable before the
// commit returns and so before the callback; nothing else keeps them (telemetry reads only the batch
// headers, at the start of the append; followers fetch from the log, not from the request). The call
// may finish earlier (its timeout), but appends may still be queued then, so that is not the moment.
// A request whose buffer nobody takes (gRPC refused the call after decoding it, e.g. a second message
// on a unary call) loses its entry when the garbage collector frees the request, and its buffer goes
// to the collector too: a cleanup (runtime.AddCleanup) removes the entry, whose key is a weak pointer,
// so the table never keeps a request alive and never grows beyond the requests alive.

// produceBufs maps a request decoded by unmarshalProduceRequest (by weak pointer) to the recordBufs
// buffer its records alias (*[]byte).
var produceBufs sync.Map

// testHookProduceBufReleased, when set by a test, runs with a request's buffer just before it goes
// back to recordBufs.
// It is atomic: appends of an earlier test's node may still complete (their callbacks run on goroutines
// of their own) while the next test sets it.
var testHookProduceBufReleased atomic.Pointer[func(*[]byte)]

// takeProduceBuf removes and returns the buffer req's records alias, nil when req was not decoded by
// the node's codec (an in-process caller's) or had no records. The caller owns it: releaseProduceBuf
// once nothing reads the records any more.
func takeProduceBuf(req *runnelv1.ProduceRequest) *[]byte {
	if v, ok := produceBufs.LoadAndDelete(weak.Make(req)); ok {
		return v.(*[]byte)
	}
	return nil
}

// releaseProduceBuf returns buf (from takeProduceBuf; nil does nothing) to recordBufs.
func releaseProduceBuf(buf *[]byte) {
	if buf == nil {
		return
	}
	if hook := testHookProduceBufReleased.Load(); hook != nil {
		(*hook)(buf)
	}
	recordBufs.Put(buf)
}

// forgetProduceBuf is the cleanup of a decoded request: the entry of a request nobody took.
func forgetProduceBuf(key weak.Pointer[runnelv1.ProduceRequest]) { produceBufs.Delete(key) }

// unmarshalProduceRequest decodes data into req as proto.Unmarshal would (decodeProduceRequest), with
// the records in one buffer from recordBufs, recorded in produceBufs for the handler. Errors (wrapped,
// naming the field) are proto.Unmarshal's cases: malformed wire data, invalid UTF-8 in a string; req is
// left empty then.
func unmarshalProduceRequest(data mem.BufferSlice, req *runnelv1.ProduceRequest) error {
	buf := recordBufs.Get(data.Len())
	data.CopyTo(*buf) // the whole buffer: Get's contents are left over from earlier use
	aliased, err := decodeProduceRequest(*buf, req)
	if err != nil {
		req.Reset() // no partial partition keeps a slice of buf
		recordBufs.Put(buf)
		return fmt.Errorf("decode runnel.v1.ProduceRequest: %w", err)
	}
	if !aliased {
		recordBufs.Put(buf)
		return nil
	}
	key := weak.Make(req)
	produceBufs.Store(key, buf)
	runtime.AddCleanup(req, forgetProduceBuf, key)
	return nil
}

var (
	errInvalidUTF8 = errors.New("string field contains invalid UTF-8")
	errEndGroup    = errors.New("end-group tag without a group")
)

// decodeProduceRequest decodes b into req (reset first) with protobuf-go's rules for these messages,
// so that it succeeds exactly where proto.Unmarshal does and gives the same message: fields in any
// order, the last occurrence of a scalar or string wins, each partitions occurrence adds a partition, a
// known field with another wire type is an unknown field, unknown fields are kept as proto keeps them
// (ProtoReflect().SetUnknown), proto3 strings must be valid UTF-8, and a map entry without key or value
// has "" there. Records alias b (nil when empty, as proto's copy is); strings are copies. aliased
// reports whether any partition's records do.
func decodeProduceRequest(b []byte, req *runnelv1.ProduceRequest) (aliased bool, _ error) {
	req.Reset()
	var unknown []byte
	for len(b) > 0 {
		num, typ, n, err := consumeTag(b)
		if err != nil {
			return false, err
		}
		b = b[n:]
		switch {
		case typ == protowire.EndGroupType:
			return false, errEndGroup
		case num == runnelv1.FieldProduceCorrelationID && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(b)
			req.CorrelationId = int64(v)
		case num == runnelv1.FieldProduceAcks && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(b)
			req.Acks = runnelv1.Acks(int32(v))
		case num == runnelv1.FieldProduceTimeoutMs && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(b)
			req.TimeoutMs = int32(v)
		case num == runnelv1.FieldProducePartitions && typ == protowire.BytesType:
			var v []byte
			if v, n = protowire.ConsumeBytes(b); n < 0 {
				break
			}
			pp := &runnelv1.ProducePartition{}
			if err := decodeProducePartition(v, pp); err != nil {
				return false, fmt.Errorf("partitions[%d]: %w", len(req.Partitions), err)
			}
			aliased = aliased || pp.Records != nil
			req.Partitions = append(req.Partitions, pp)
		case num == runnelv1.FieldProduceTransactionalID && typ == protowire.BytesType:
			var s string
			if s, n, err = consumeString(b); err != nil {
				return false, fmt.Errorf("transactional_id: %w", err)
			}
			req.TransactionalId = s
		default:
			if n = protowire.ConsumeFieldValue(num, typ, b); n >= 0 {
				unknown = protowire.AppendTag(unknown, num, typ)
				unknown = append(unknown, b[:n]...)
			}
		}
		if n < 0 {
			return false, fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	if unknown != nil {
		req.ProtoReflect().SetUnknown(unknown)
	}
	return aliased, nil
}

// decodeProducePartition decodes one ProducePartition (decodeProduceRequest's rules) into the empty pp.
func decodeProducePartition(b []byte, pp *runnelv1.ProducePartition) error {
	var unknown []byte
	for len(b) > 0 {
		num, typ, n, err := consumeTag(b)
		if err != nil {
			return err
		}
		b = b[n:]
		switch {
		case typ == protowire.EndGroupType:
			return errEndGroup
		case num == runnelv1.FieldPartitionTopic && typ == protowire.BytesType:
			var s string
			if s, n, err = consumeString(b); err != nil {
				return fmt.Errorf("topic: %w", err)
			}
			pp.Topic = s
		case num == runnelv1.FieldPartitionPartition && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(b)
			pp.Partition = int32(v)
		case num == runnelv1.FieldPartitionRecords && typ == protowire.BytesType:
			var v []byte
			v, n = protowire.ConsumeBytes(b)
			pp.Records = nil // proto3 bytes: empty is nil
			if len(v) > 0 {
				pp.Records = v[:len(v):len(v)] // an append to them never runs into the next field
			}
		case num == runnelv1.FieldPartitionTraceContext && typ == protowire.BytesType:
			var v []byte
			if v, n = protowire.ConsumeBytes(b); n < 0 {
				break
			}
			k, val, err := decodeStringMapEntry(v)
			if err != nil {
				return fmt.Errorf("trace_context: %w", err)
			}
			if pp.TraceContext == nil {
				pp.TraceContext = make(map[string]string, 2)
			}
			pp.TraceContext[k] = val
		case num == runnelv1.FieldPartitionCurrentLeaderEpoch && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(b)
			e := int32(v)
			pp.CurrentLeaderEpoch = &e
		default:
			if n = protowire.ConsumeFieldValue(num, typ, b); n >= 0 {
				unknown = protowire.AppendTag(unknown, num, typ)
				unknown = append(unknown, b[:n]...)
			}
		}
		if n < 0 {
			return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	if unknown != nil {
		pp.ProtoReflect().SetUnknown(unknown)
	}
	return nil
}

// decodeStringMapEntry decodes one entry of a map<string, string>: a missing key or value is "", the
// last occurrence of each wins, and unknown fields (other numbers, or key or value with another wire
// type) are skipped, as protobuf-go's map decoder drops them.
func decodeStringMapEntry(b []byte) (key, val string, _ error) {
	for len(b) > 0 {
		num, typ, n, err := consumeTag(b)
		if err != nil {
			return "", "", err
		}
		b = b[n:]
		switch {
		case num == runnelv1.FieldMapKey && typ == protowire.BytesType:
			if key, n, err = consumeString(b); err != nil {
				return "", "", fmt.Errorf("key: %w", err)
			}
		case num == runnelv1.FieldMapValue && typ == protowire.BytesType:
			if val, n, err = consumeString(b); err != nil {
				return "", "", fmt.Errorf("value: %w", err)
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b) // an end-group tag fails here
		}
		if n < 0 {
			return "", "", fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return key, val, nil
}

// consumeTag is protowire.ConsumeTag that also refuses field numbers above protowire.MaxValidNumber,
// as protobuf-go's decoder does (ConsumeTag refuses only those below 1).
func consumeTag(b []byte) (protowire.Number, protowire.Type, int, error) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, 0, n, protowire.ParseError(n)
	}
	if num > protowire.MaxValidNumber {
		return 0, 0, -1, fmt.Errorf("invalid field number %d", num)
	}
	return num, typ, n, nil
}

// consumeString consumes a length-delimited proto3 string: a copy, valid UTF-8. n < 0 is a
// protowire error code (err nil); err is errInvalidUTF8.
func consumeString(b []byte) (s string, n int, err error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return "", n, nil
	}
	if !utf8.Valid(v) {
		return "", n, errInvalidUTF8
	}
	return string(v), n, nil
}
