package broker

import (
	"context"
	"reflect"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/client/batch"
)

// Fetch implements runnelv1.RecordsServer as a long poll: it reads every listed partition from its
// fetch offset and answers once min_bytes are available, max_wait_ms has passed, or a partition has
// an error. Sizes: max_bytes 0 means DefaultFetchMaxBytes and is capped at MaxFetchBytes;
// partition_max_bytes 0 means DefaultPartitionMaxBytes. Negative sizes are INVALID_FETCH_SIZE.
//
// Isolation (KIP-98): READ_UNCOMMITTED reads up to the high watermark; READ_COMMITTED up to the last
// stable offset (lastStableOffset), and lists the aborted transactions that overlap the answer, whose
// transactional batches the consumer drops. Both report the LSO.
func (b *Broker) Fetch(ctx context.Context, req *runnelv1.FetchRequest) (resp *runnelv1.FetchResponse, err error) {
	defer func(start time.Time) { b.tel.FetchDone(ctx, start, req, resp, err) }(time.Now())
	if req.MaxBytes < 0 || req.MinBytes < 0 || req.MaxWaitMs < 0 {
		return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_INVALID_FETCH_SIZE, "negative max_bytes (%d), min_bytes (%d) or max_wait_ms (%d)", req.MaxBytes, req.MinBytes, req.MaxWaitMs))
	}
	if len(req.Partitions) == 0 {
		return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "fetch without partitions"))
	}
	maxBytes := int(req.MaxBytes)
	if maxBytes == 0 {
		maxBytes = DefaultFetchMaxBytes
	}
	maxBytes = min(maxBytes, MaxFetchBytes)
	wait := min(time.Duration(req.MaxWaitMs)*time.Millisecond, MaxFetchWait)
	deadline := time.Now().Add(wait)
	for _, fp := range req.Partitions {
		if fp.PartitionMaxBytes < 0 {
			return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_INVALID_FETCH_SIZE, "%s-%d: negative partition_max_bytes %d", fp.Topic, fp.Partition, fp.PartitionMaxBytes))
		}
	}
	return longPoll(ctx, deadline, int(req.MinBytes), func() (*runnelv1.FetchResponse, int, bool, []<-chan struct{}) {
		return b.readOnce(req, maxBytes)
	})
}

// longPoll calls read until its answer holds minBytes (at least one byte when minBytes is 0 and there is
// time left), a partition failed, or the deadline passed, waiting between calls for any of the change
// channels read returned (taken before reading, so no change is missed), the deadline or ctx. Fetch and
// ReplicaFetch share it.
func longPoll[T any](ctx context.Context, deadline time.Time, minBytes int, read func() (T, int, bool, []<-chan struct{})) (T, error) {
	var timer *time.Timer
	for {
		resp, total, anyErr, changed := read()
		if total >= minBytes && (total > 0 || minBytes > 0) || anyErr || !time.Now().Before(deadline) {
			return resp, nil
		}
		// Nothing worth answering yet: wait for any partition to change, the deadline, or the caller.
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
			defer timer.Stop()
		}
		cases := make([]reflect.SelectCase, 0, len(changed)+2)
		cases = append(cases,
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer.C)})
		for _, ch := range changed {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
		}
		chosen, _, _ := reflect.Select(cases)
		switch chosen {
		case 0:
			var zero T
			return zero, rerr.ToStatus(ctx.Err())
		case 1:
			resp, _, _, _ = read()
			return resp, nil
		}
	}
}

// readOnce reads every partition of req once. It returns the answer, its record bytes, whether any
// partition failed, and the change channels to wait on (taken before reading, so no append is missed).
func (b *Broker) readOnce(req *runnelv1.FetchRequest, maxBytes int) (*runnelv1.FetchResponse, int, bool, []<-chan struct{}) {
	resp := &runnelv1.FetchResponse{Partitions: make([]*runnelv1.FetchPartitionResult, len(req.Partitions))}
	changed := make([]<-chan struct{}, 0, len(req.Partitions))
	committed := req.IsolationLevel == runnelv1.IsolationLevel_READ_COMMITTED
	total, anyErr := 0, false
	for i, fp := range req.Partitions {
		r := &runnelv1.FetchPartitionResult{Topic: fp.Topic, Partition: fp.Partition, HighWatermark: -1, LastStableOffset: -1, LogStartOffset: -1}
		resp.Partitions[i] = r
		t, p, err := b.partition(fp.Topic, fp.Partition)
		if err == nil {
			err = checkEpoch(fp.Topic, fp.Partition, t, fp.CurrentLeaderEpoch)
		}
		if err != nil {
			r.Error, anyErr = rerr.ToInfo(err), true
			continue
		}
		changed = append(changed, p.Changed())
		r.HighWatermark, r.LogStartOffset = p.HighWatermark(), p.LogStartOffset()
		lso, err := b.lastStableOffset(t, fp.Partition, p)
		if err != nil {
			r.Error, anyErr = rerr.ToInfo(storeErr(fp.Topic, fp.Partition, err)), true
			continue
		}
		// The HW was read first; a later one only lets the LSO be higher, never the answer unsafe.
		r.LastStableOffset = min(lso, r.HighWatermark)
		end := r.HighWatermark
		if committed {
			end = r.LastStableOffset
		}
		limit := int(fp.PartitionMaxBytes)
		if limit == 0 {
			limit = DefaultPartitionMaxBytes
		}
		limit = min(limit, maxBytes-total)
		if limit <= 0 && total > 0 {
			continue // the answer is full; the client fetches the rest next time
		}
		if limit <= 0 {
			limit = 1 // still return one batch: KIP-74
		}
		if fp.FetchOffset > r.HighWatermark && fp.FetchOffset <= p.LogEndOffset() {
			// Past the HW but within the log (a new leader whose HW still trails the old one's): nothing
			// to read yet, not out of range, as Kafka answers.
			continue
		}
		recs, err := readPartition(p, fp.FetchOffset, limit, total == 0, end)
		if err != nil {
			r.Error, anyErr = rerr.ToInfo(storeErr(fp.Topic, fp.Partition, err)), true
			continue
		}
		r.Records = recs
		total += len(recs)
		if committed && len(recs) > 0 {
			for _, a := range p.AbortedTransactions(fp.FetchOffset, lastNextOffset(recs)) {
				r.AbortedTransactions = append(r.AbortedTransactions, &runnelv1.AbortedTransaction{ProducerId: a.ProducerID, FirstOffset: a.FirstOffset})
			}
		}
	}
	return resp, total, anyErr, changed
}

// readPartition reads from offset up to limit bytes, never a batch reaching end (the HW, or the LSO for
// read_committed). Only the first partition with data in an answer may exceed limit with its one first
// batch (KIP-74), so one oversized batch cannot stall a consumer. The records are in a buffer from
// recordBufs, sized for them beforehand (readBufSize), which the answer owns.
func readPartition(p *plog.Partition, offset int64, limit int, first bool, end int64) ([]byte, error) {
	if offset < 0 {
		return nil, rerr.New(runnelv1.ErrorCode_OFFSET_OUT_OF_RANGE, "negative fetch offset %d", offset)
	}
	buf := recordBufs.GetCap(readBufSize(p, offset, end, limit))
	recs, err := p.ReadUpTo(*buf, offset, limit, end)
	if err != nil || len(recs) == 0 || !first && len(recs) > limit {
		recordBufs.Put(buf) // recs (nothing or an error) did not use it
		return nil, err
	}
	return recs, nil // in the buffer (or in a larger one append made): the answer's, see fetch_codec.go
}

// lastNextOffset returns the offset after the last of the whole stored batches in recs (read output,
// so the headers are the store's): the end of what an answer returns.
func lastNextOffset(recs []byte) int64 {
	end := int64(-1)
	for len(recs) >= batch.HeaderSize {
		h, err := batch.ParseHeader(recs)
		if err != nil || h.Size() > len(recs) {
			break
		}
		end = h.NextOffset()
		recs = recs[h.Size():]
	}
	return end
}
