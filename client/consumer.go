package client

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/client/telemetry"
	"google.golang.org/grpc"
)

// Consumer reads explicitly assigned partitions (for partitions shared out by a consumer group, see
// GroupConsumer, which is built on it). Safe for concurrent use, though one goroutine calling Poll is
// the normal shape.
//
// A fetch goroutine per broker long-polls Fetch for the assigned partitions that broker leads and
// checks the answers (CRC, framing, every record's encoding; aborted transactions and control batches
// left out), while the application handles what Poll returned before: each partition has at most
// maxBufferedPerPartition answers waiting, bounded by the fetch max bytes, and the next fetch of a
// partition is in flight while the application processes the previous ones. Poll (or PollFunc)
// decodes the records of the answers it takes, as Kafka's consumer does in poll: records waiting in
// the buffer are bytes, not objects, which keeps the garbage collector's work small.
type Consumer struct {
	cfg consumerConfig
	cl  *cluster
	tr  *telemetry.Tracer // nil: tracing off (WithTelemetry(nil))

	mu       sync.Mutex
	parts    map[tp]*cpart
	ready    []*fetched    // decoded answers waiting for Poll, in arrival order
	readyCh  chan struct{} // signalled when ready grows
	fetchers map[int32]*fetcher
	nerr     int // partitions holding an error for Poll
	bufBytes int // record bytes of the answers in ready
	closed   bool

	metaMu   sync.Mutex
	lastMeta time.Time

	msgMu sync.Mutex          // held while msgs is in use
	msgs  []telemetry.Message // scratch of received, kept between polls

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type tp struct {
	topic     string
	partition int32
}

// cpart is one assigned partition.
type cpart struct {
	tp
	position    int64  // next offset Poll returns
	fetchOffset int64  // next offset to fetch (ahead of position by what is buffered or in flight)
	epoch       uint64 // bumped by Seek and Assign: answers to older fetches are dropped
	hw          int64
	leader      int32
	err         error // returned by Poll until Seek
	paused      bool  // not fetched, and its buffered answers are held back from Poll until Resume
	inflight    bool
	buffered    int // decoded answers waiting for Poll
	retryAt     time.Time
	attempts    int
	// aboveEndSince is when fetches of the partition began to answer OFFSET_OUT_OF_RANGE for a
	// position past the log end (zero: they do not); maxHW is the highest HW a successful fetch
	// reported.
	aboveEndSince time.Time
	maxHW         int64
}

// outOfRangeGrace is how long a position past a partition's log end is fetched again (after metadata
// refreshes) before the OFFSET_OUT_OF_RANGE reaches Poll: long enough for a failed-over partition's
// metadata to settle (a broker is fenced within its 3 s session timeout).
const outOfRangeGrace = 20 * time.Second

// fetched is one partition's share of a fetch answer: its batches, opened by the fetcher (scanFetched:
// header, CRC, decompression), decoded by the Poll that takes them.
type fetched struct {
	p       *cpart
	epoch   uint64
	batches []batch.Reader // opened (CRC checked, decompressed); control batches and aborted ones left out
	from    int64          // the fetch offset: records below it (in its batch) are not returned
	next    int64          // position after these records (after the last batch, control records included)
	size    int            // record bytes fetched, counted against the fetch max bytes
	count   int            // records in batches: at least as many as Poll returns
	// buf holds the batches' bytes (those not compressed): a recordBufs buffer that the part owns,
	// recycled once nothing can reference it (see recycle), or nil.
	buf *[]byte
}

// recycle returns fp's buffer to recordBufs: only for a part whose records nobody was given, or were
// given only for the duration of a PollFunc callback. fp must not be used afterwards.
func (fp *fetched) recycle() {
	if fp.buf != nil {
		recordBufs.Put(fp.buf)
		fp.buf = nil
	}
	fp.batches = nil
}

// maxBufferedPerPartition is how many decoded answers of one partition may wait for Poll: more than one
// keeps the next fetch of a partition in flight while the application works through the previous
// answers, so throughput does not hang on one fetch round trip per partition.
const maxBufferedPerPartition = 4

// fetcher long-polls one broker.
type fetcher struct {
	c      *Consumer
	node   int32
	wakeCh chan struct{}
	// slots holds a token per fetch slot taken (maxFetchesInFlight): from before a fetch's partitions
	// are collected until its answer is handled.
	slots chan struct{}

	mu    sync.Mutex
	calls map[*fetchCall]struct{} // fetches in flight
}

// fetchCall is one fetch in flight, cancellable by interrupt.
type fetchCall struct {
	cancel      context.CancelFunc
	items       []fetchItem // the partitions it fetches
	started     time.Time   // when it was sent
	interrupted bool
}

// maxFetchesInFlight bounds concurrent fetches to one broker. More than one lets partitions that have
// data be fetched while another fetch long-polls partitions that are caught up; otherwise a freed
// partition would wait out that poll's fetch.max.wait.
const maxFetchesInFlight = 4

// NewConsumer returns a consumer for the cluster reachable at brokers. It validates the options and
// connects lazily.
func NewConsumer(brokers []string, opts ...ConsumerOption) (*Consumer, error) {
	cfg, err := newConsumerConfig(opts)
	if err != nil {
		return nil, err
	}
	cl, err := newCluster(brokers, cfg.common)
	if err != nil {
		return nil, err
	}
	c := &Consumer{cfg: cfg, cl: cl, tr: cfg.common.tracer(), parts: map[tp]*cpart{}, readyCh: make(chan struct{}, 1), fetchers: map[int32]*fetcher{}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// Assign starts reading topic's partition from the given offset, resolving earliest, latest and time
// offsets with ListOffsets first (retrying retriable errors within the request timeout, so a topic just
// created is found). Assigning a partition again moves it, as Seek does. Records of the partition come
// from Poll in offset order.
func (c *Consumer) Assign(topic string, partition int32, from Offset) error {
	if topic == "" || partition < 0 {
		return rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "assign of topic %q partition %d", topic, partition)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	off, _, err := listOffsets(c.ctx, c.cl, topic, partition, from, true, c.cfg.isolation)
	if err != nil {
		if c.ctx.Err() != nil {
			return ErrClosed
		}
		return err
	}
	leader := c.cl.leader(topic, partition)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	key := tp{topic, partition}
	p := c.parts[key]
	if p == nil {
		p = &cpart{tp: key, hw: -1, maxHW: -1, leader: leader}
		c.parts[key] = p
	}
	c.resetLocked(p, off)
	f := c.fetcherLocked(p.leader)
	c.mu.Unlock()
	f.interrupt(key, true)
	return nil
}

// Unassign stops reading a partition and drops what was fetched of it. Unknown partitions are ignored.
func (c *Consumer) Unassign(topic string, partition int32) {
	c.mu.Lock()
	p := c.parts[tp{topic, partition}]
	if p == nil {
		c.mu.Unlock()
		return
	}
	c.resetLocked(p, p.position)
	delete(c.parts, p.tp)
	f := c.fetchers[p.leader]
	c.mu.Unlock()
	if f != nil {
		f.interrupt(p.tp, false)
	}
}

// Seek makes the next records Poll returns for the partition start at offset (a later Poll returns
// OFFSET_OUT_OF_RANGE if it is outside the log). It clears an error the partition held. Records
// fetched before are dropped. A partition that is not assigned is ignored.
func (c *Consumer) Seek(topic string, partition int32, offset int64) {
	c.mu.Lock()
	p := c.parts[tp{topic, partition}]
	if p == nil {
		c.mu.Unlock()
		return
	}
	c.resetLocked(p, offset)
	f := c.fetchers[p.leader]
	c.mu.Unlock()
	if f != nil {
		f.interrupt(p.tp, true)
	}
}

// resetLocked moves p to offset, dropping what was fetched for it.
func (c *Consumer) resetLocked(p *cpart, offset int64) {
	p.position, p.fetchOffset = offset, offset
	p.epoch++
	if p.err != nil {
		p.err = nil
		c.nerr--
	}
	p.retryAt, p.attempts = time.Time{}, 0
	if p.buffered > 0 {
		kept := c.ready[:0]
		for _, fp := range c.ready {
			if fp.p != p {
				kept = append(kept, fp)
			} else {
				c.bufBytes -= fp.size
				fp.recycle() // never handed out
			}
		}
		clear(c.ready[len(kept):])
		c.ready = kept
		p.buffered = 0
	}
}

// Position returns the offset of the next record Poll returns for the partition, or -1 if it is not
// assigned.
func (c *Consumer) Position(topic string, partition int32) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.parts[tp{topic, partition}]; p != nil {
		return p.position
	}
	return -1
}

// HighWatermark returns the partition's high watermark from the latest fetch answer (the offset after
// the last record a consumer can read), or -1 before the first answer or if it is not assigned. Lag is
// HighWatermark - Position.
func (c *Consumer) HighWatermark(topic string, partition int32) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.parts[tp{topic, partition}]; p != nil {
		return p.hw
	}
	return -1
}

// Poll returns the records fetched since the last call, each partition's in offset order from its
// position (records below it, which a fetch returns when they share a batch with it, and control
// records are skipped). It blocks until there is at least one record or ctx ends (returning ctx.Err()).
//
// A partition that failed in a way retrying cannot fix (OFFSET_OUT_OF_RANGE when its position left the
// log, CORRUPT_MESSAGE for a batch that fails its CRC or a record that does not decode) makes Poll
// return a *PartitionError naming it, on every call, until Seek, Assign or Unassign of that partition;
// the other partitions wait meanwhile, as in Kafka. The records before a record that does not decode
// are returned first and the position stays at it, so Seek(Position()+1) skips just that record; the
// error gives its offset and its batch's, as a Seek past the batch is needed when even the record's
// length is damaged (possible in a compressed batch only). After Close, Poll returns ErrClosed.
//
// The records' keys, values and header values share memory with the fetched answer (see Record). For
// the highest throughput, where the records need not outlive their processing, see PollFunc.
//
// With tracing on (WithTelemetry), each Poll that returns records records a "receive" span linked to
// the producers' batch spans; StartProcess starts the span of processing one record.
func (c *Consumer) Poll(ctx context.Context) ([]*Record, error) {
	start := time.Now()
	recs, _, err := c.poll(ctx, nil)
	c.received(ctx, "", start, recs)
	return recs, err
}

// PollFunc is Poll for throughput: it takes the records Poll would return, in the same order and with
// the same errors, and calls fn with each of them instead of returning them, reusing one Record and
// the fetched buffers. It returns how many records fn saw. fn runs on the calling goroutine, one record
// at a time, and cannot stop the poll: the positions have moved past every record it is given (Seek
// to go back). fn may call the Consumer's other methods; a Seek or Pause takes effect from the next
// poll, as after a Poll, and the records this call took are all handed to fn.
//
// The Record passed to fn and everything it references (Key, Value, Headers and header values) are
// valid only until fn returns: copy what must outlive the call. In exchange PollFunc allocates nothing
// per record, and the buffers of the answers it has handed out are reused by later fetches, so
// consuming costs the garbage collector almost nothing; with 100-byte records that is most of a
// consumer's CPU (docs/performance.md).
//
// With tracing on, each PollFunc that calls fn records a "receive" span as Poll does.
func (c *Consumer) PollFunc(ctx context.Context, fn func(*Record)) (int, error) {
	return c.pollFunc(ctx, time.Now(), nil, "", nil, fn)
}

// partGate lets a GroupConsumer take part in pollFunc, on the polling goroutine. begin runs before
// each take. enter runs before a taken part's records go to fn and reports whether they may (false:
// the member no longer owns the partition, and they are dropped); mv holds the take's moves (t.mv
// indexes it, -1 when the part moved nothing). leave runs after them with how many fn saw and the
// leader epoch of the last, once a record that did not decode has moved the part's move back to it
// (decodeFailed).
type partGate interface {
	begin()
	enter(t *taken, mv []moved) bool
	leave(t *taken, mv []moved, n int, epoch int32)
}

// pollFunc is PollFunc, which GroupConsumer shares: start is when the caller's call began (the
// receive span's start), wake ends a wait with errWoken (the group's rebalance events), group names
// the group in the receive span, and gate, when not nil, is asked about every part before its records
// go to fn and told what fn saw of it after.
func (c *Consumer) pollFunc(ctx context.Context, start time.Time, wake <-chan struct{}, group string, gate partGate, fn func(*Record)) (int, error) {
	var ms []telemetry.Message // the records that may link to a producer's span: those with headers
	traced := c.tr != nil
	rec := &Record{}
	first := ""
	emit := func(br *batch.Record) {
		rec.Offset, rec.Timestamp = br.Offset, time.UnixMilli(br.Timestamp)
		rec.Key, rec.Value, rec.Headers, rec.LeaderEpoch = br.Key, br.Value, br.Headers, br.LeaderEpoch
		if traced && len(br.Headers) > 0 {
			ms = append(ms, message(rec))
		}
		fn(rec)
	}
	for {
		if gate != nil {
			gate.begin()
		}
		taken, mv, err := c.take(ctx, wake)
		if err != nil {
			return 0, err
		}
		n := 0
		var bad map[*cpart]bool // partitions a record failed to decode in, in this poll
		for i := range taken {
			t := &taken[i]
			if bad[t.fp.p] {
				continue // after the record that failed: the partition was moved back to it
			}
			if gate != nil && !gate.enter(t, mv) {
				continue
			}
			rec.Topic, rec.Partition = t.fp.p.topic, t.fp.p.partition
			k, epoch, err := decodeTake(t, emit)
			if err != nil {
				c.decodeFailed(t, mv, err)
				if bad == nil {
					bad = map[*cpart]bool{}
				}
				bad[t.fp.p] = true
			}
			if gate != nil {
				gate.leave(t, mv, k, epoch)
			}
			if k > 0 && first == "" {
				first = t.fp.p.topic
			}
			n += k
		}
		if n > 0 && traced {
			c.tr.ReceiveCount(ctx, group, start, first, n, ms)
			clear(ms) // the headers are in buffers recycled below
		}
		for i := range taken {
			taken[i].fp.recycle() // fn has seen its records; nothing else has
		}
		*rec = Record{}
		if n > 0 {
			return n, nil
		}
		// Only control records, records below the positions, none the gate let through, or a record
		// that did not decode first (decodeFailed's signal ends the wait at once and the take returns
		// the error, unless the partition was unassigned meanwhile): wait for more as poll does, so
		// that wake and ctx are heard even while such parts keep coming.
		if err := c.waitReady(ctx, wake); err != nil {
			return 0, err
		}
	}
}

// errWoken is returned by poll when its wake channel fired before any record was ready.
var errWoken = errors.New("client: poll woken")

// moved is one partition whose position a poll advanced: next is the new position, leaderEpoch that of
// the last record returned for it (-1 when the move returned none, past control records say).
type moved struct {
	tp
	next        int64
	leaderEpoch int32
}

// taken is one fetched part a poll took: its records at or after floor are returned, and mv is the index
// of the move it made in the poll's moves (-1: none).
type taken struct {
	fp    *fetched
	floor int64
	mv    int
}

// poll is Poll, which GroupConsumer shares: it also returns the partitions whose position moved (the
// offsets a group member commits once the records are processed), and returns errWoken, without
// records, when wake fires first (the group's rebalance events wake it).
func (c *Consumer) poll(ctx context.Context, wake <-chan struct{}) ([]*Record, []moved, error) {
	for {
		tk, mv, err := c.take(ctx, wake)
		if err != nil {
			return nil, mv, err
		}
		count := 0
		for i := range tk {
			count += tk[i].fp.count
		}
		out := make([]*Record, 0, count)
		var bad map[*cpart]int64 // partitions a record failed to decode in, in this poll: its offset
		for i := range tk {
			t := &tk[i]
			p := t.fp.p
			if at, ok := bad[p]; ok {
				// After the record that failed: the partition was moved back to it.
				if t.mv >= 0 {
					mv[t.mv].next, mv[t.mv].leaderEpoch = at, -1
				}
				t.fp.recycle()
				continue
			}
			start := len(out)
			// One allocation of records per part (not per poll: an allocation of many megabytes
			// costs more than several of one); the pointers into it stay valid, as it is never
			// appended to.
			arr := make([]Record, t.fp.count)
			_, epoch, err := decodeTake(t, func(br *batch.Record) {
				r := &arr[len(out)-start]
				r.Topic, r.Partition, r.Offset, r.Timestamp = p.topic, p.partition, br.Offset, time.UnixMilli(br.Timestamp)
				r.Key, r.Value, r.Headers, r.LeaderEpoch = br.Key, br.Value, br.Headers, br.LeaderEpoch
				out = append(out, r)
			})
			if err != nil {
				c.decodeFailed(t, mv, err)
				if bad == nil {
					bad = map[*cpart]int64{}
				}
				bad[p] = t.floor
			}
			if t.mv >= 0 && len(out) > start {
				mv[t.mv].leaderEpoch = epoch
			}
			t.fp.batches, t.fp.buf = nil, nil // the records alias the buffer: never recycled
		}
		if len(out) > 0 {
			return out, mv, nil
		}
		// Only control records, or records below the positions: wait for more, as before the take.
		if err := c.waitReady(ctx, wake); err != nil {
			return nil, mv, err
		}
	}
}

// waitReady waits until a fetched answer may be ready (readyCh), and returns errWoken when wake fires
// first, ctx's error when it ends, ErrClosed when the consumer closes.
func (c *Consumer) waitReady(ctx context.Context, wake <-chan struct{}) error {
	select {
	case <-c.readyCh:
		return nil
	case <-wake:
		return errWoken
	case <-ctx.Done():
		return ctx.Err()
	case <-c.ctx.Done():
		return ErrClosed
	}
}

// take waits until fetched answers are ready for Poll (or a partition holds an error, wake fires, ctx
// ends or the consumer closes) and takes them: the partitions' positions move past them, and the
// fetchers may fetch those partitions again. It returns the parts to decode, in order, and the moves.
func (c *Consumer) take(ctx context.Context, wake <-chan struct{}) ([]taken, []moved, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, nil, ErrClosed
		}
		if c.nerr > 0 {
			for _, p := range c.parts {
				if p.err != nil {
					err := &PartitionError{Topic: p.topic, Partition: p.partition, Err: p.err}
					c.mu.Unlock()
					return nil, nil, err
				}
			}
		}
		var out []taken
		var mv []moved
		if len(c.ready) > 0 {
			woken := map[int32]bool{}
			kept := c.ready[:0] // answers of paused partitions wait for Resume, in order
			for _, fp := range c.ready {
				p := fp.p
				if c.parts[p.tp] != p || fp.epoch != p.epoch {
					c.bufBytes -= fp.size
					fp.recycle() // never handed out
					continue
				}
				if p.paused {
					kept = append(kept, fp)
					continue
				}
				c.bufBytes -= fp.size
				p.buffered--
				t := taken{fp: fp, floor: max(fp.from, p.position), mv: -1}
				if fp.next > p.position {
					p.position = fp.next
					t.mv = len(mv)
					mv = append(mv, moved{tp: p.tp, next: p.position, leaderEpoch: -1})
				}
				out = append(out, t)
				if f := c.fetchers[p.leader]; f != nil && !woken[p.leader] {
					woken[p.leader] = true
					f.wake() // its partition may be fetched again
				}
			}
			clear(c.ready[len(kept):])
			c.ready = kept
		}
		c.mu.Unlock()
		if len(out) > 0 || len(mv) > 0 {
			return out, mv, nil
		}
		if err := c.waitReady(ctx, wake); err != nil {
			return nil, mv, err
		}
	}
}

// decodeTake decodes t's records in order, the control records and those below t.floor left out (and,
// from a malformed answer only, records below an earlier one or past their batch's last offset, so no
// offset comes twice), calling emit with each. br and what it references are reused after emit
// returns. It returns how many it emitted and the leader epoch of the last one, and the error of a
// record that does not decode, with t.floor at that record's offset (past any gap before it: aborted
// transactions, markers, compaction), so that Seek(t.floor+1) skips just that record. The records before
// it have been emitted, as Kafka's consumer returns the records before a corrupt one. Bytes after the
// last record of a batch whose records all decoded are ignored: nothing is lost, and there is no record
// to stop at.
func decodeTake(t *taken, emit func(br *batch.Record)) (int, int32, error) {
	n, epoch, floor := 0, int32(-1), t.floor
	var br batch.Record
	for i := range t.fp.batches {
		rd := &t.fp.batches[i]
		h := rd.Header()
		end := h.NextOffset()
		// The records of a batch that starts below the floor are passed over undecoded up to it: after
		// a Seek past a record that does not decode, the fetch returns its batch again from the start.
		catchUp := floor > h.BaseOffset
		floor = max(floor, h.BaseOffset)
		for {
			if catchUp {
				if off, more := rd.PeekOffset(); more && off < floor {
					if err := rd.Skip(); err != nil {
						t.floor = floor
						return n, epoch, damagedAt(floor, h, err)
					}
					continue
				}
				catchUp = false
			}
			ok, err := rd.Next(&br)
			if err != nil {
				off, more := rd.PeekOffset() // Next failed without moving: the record that does not decode
				if !more {
					break // every record decoded; only bytes after the last one are wrong
				}
				if off >= floor && off < end {
					floor = off
				}
				t.floor = floor
				return n, epoch, damagedAt(floor, h, err)
			}
			if !ok {
				break
			}
			if br.Control || br.Offset < floor || br.Offset >= end {
				continue
			}
			floor = br.Offset + 1
			n++
			epoch = br.LeaderEpoch
			emit(&br)
		}
	}
	t.floor = floor
	return n, epoch, nil
}

// damagedAt adds to the error of a record that does not decode its offset and its batch's, so that the
// application can Seek past the record, or past the batch when even a length is damaged.
func damagedAt(offset int64, h batch.Header, err error) error {
	return fmt.Errorf("offset %d, in the batch of offsets %d-%d: %w", offset, h.BaseOffset, h.LastOffset(), err)
}

// decodeFailed handles a record that did not decode: the broker checks only a batch's CRC and, when it
// is not compressed, that its record lengths fit, so a producer can store a record that does not decode. The
// records after it, which the take's move skipped, must not be lost. Unless the partition moved
// meanwhile, its position goes back to the record (t.floor, past the records returned) and it holds
// err until Seek; mv's move of it, if given, says so. A partition unassigned meanwhile holds nothing
// (and no error reaches Poll), but its move still stops at the record, for a group member that owns
// it until its next poll; one sought meanwhile keeps the Seek's position and its move is left as is.
// A Seek past the record resumes after it (see decodeTake), or, when its length is damaged, past its
// batch.
func (c *Consumer) decodeFailed(t *taken, mv []moved, err error) {
	p := t.fp.p
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.parts[p.tp] != p {
		// Unassigned meanwhile (a group's revocation has begun: the member owns it until its next
		// poll, and commits its position then): nothing to hold, but the move still stops at the
		// record, so that the position does not pass records never handed out.
		if t.mv >= 0 && mv != nil {
			mv[t.mv].next = t.floor
		}
		return
	}
	if p.epoch != t.fp.epoch {
		return // sought meanwhile: the position is the Seek's
	}
	c.resetLocked(p, t.floor)
	if p.err == nil {
		c.nerr++
	}
	p.err = err
	if t.mv >= 0 && mv != nil {
		mv[t.mv].next = t.floor
	}
	select {
	case c.readyCh <- struct{}{}: // wake Poll to return it
	default:
	}
}

// Pause stops fetching the given partitions and holds back what was already fetched of them: Poll
// returns none of their records until Resume, while the other partitions go on (Kafka's
// KafkaConsumer.pause, for back-pressure on one partition). Positions do not change. Partitions not
// assigned are ignored.
func (c *Consumer) Pause(partitions ...TopicPartition) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range partitions {
		if p := c.parts[tp{k.Topic, k.Partition}]; p != nil {
			p.paused = true
		}
	}
}

// Resume undoes Pause: the partitions are fetched again and Poll returns what was held back. Partitions
// not assigned or not paused are ignored.
func (c *Consumer) Resume(partitions ...TopicPartition) {
	c.mu.Lock()
	var wake []*fetcher
	ready := false
	for _, k := range partitions {
		p := c.parts[tp{k.Topic, k.Partition}]
		if p == nil || !p.paused {
			continue
		}
		p.paused = false
		ready = ready || p.buffered > 0
		if f := c.fetchers[p.leader]; f != nil {
			wake = append(wake, f)
		}
	}
	c.mu.Unlock()
	for _, f := range wake {
		f.wake()
	}
	if ready {
		select {
		case c.readyCh <- struct{}{}: // a Poll waiting may return the held-back records now
		default:
		}
	}
}

// Paused returns the partitions that are paused, sorted.
func (c *Consumer) Paused() []TopicPartition {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []TopicPartition
	for _, p := range c.parts {
		if p.paused {
			out = append(out, TopicPartition{p.topic, p.partition})
		}
	}
	sortTopicPartitions(out)
	return out
}

// Close stops the fetch goroutines and closes the connections. Poll then returns ErrClosed.
func (c *Consumer) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	return c.cl.close()
}

// fetcherLocked returns the fetcher of broker node, starting it on first use.
func (c *Consumer) fetcherLocked(node int32) *fetcher {
	f := c.fetchers[node]
	if f == nil {
		f = &fetcher{c: c, node: node, wakeCh: make(chan struct{}, 1), slots: make(chan struct{}, maxFetchesInFlight)}
		c.fetchers[node] = f
		c.wg.Add(1)
		go f.run()
	}
	return f
}

func (f *fetcher) wake() {
	select {
	case f.wakeCh <- struct{}{}:
	default:
	}
}

// interrupt cancels the fetches in flight that carry partition k (their answers for it would be dropped
// anyway, after a Seek or Unassign) and wakes the fetcher, so a moved or new partition is fetched at
// once rather than after a long poll. Fetches of other partitions go on: a group member assigned many
// partitions one by one would otherwise throw away, for each, every answer on its way. When no fetch
// carries k, k needs a slot (needSlot: not after an Unassign) and every slot is taken, the oldest fetch
// (most likely a long poll of caught-up partitions) is cancelled instead, to free one. A fetch not yet
// registered in calls checks for itself (fetch).
func (f *fetcher) interrupt(k tp, needSlot bool) {
	f.mu.Lock()
	var oldest *fetchCall
	hit := false
	for call := range f.calls {
		if slices.ContainsFunc(call.items, func(it fetchItem) bool { return it.p.tp == k }) {
			call.interrupted, hit = true, true
			call.cancel()
		} else if oldest == nil || call.started.Before(oldest.started) {
			oldest = call
		}
	}
	if !hit && needSlot && oldest != nil && len(f.slots) >= cap(f.slots) {
		oldest.interrupted = true
		oldest.cancel()
	}
	f.mu.Unlock()
	f.wake()
}

type fetchItem struct {
	p      *cpart
	epoch  uint64
	offset int64
}

func (f *fetcher) run() {
	defer f.c.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	slots := f.slots
	for {
		select { // wait for a free slot before marking partitions in flight
		case slots <- struct{}{}:
		case <-f.c.ctx.Done():
			return
		}
		items, next := f.c.collectFetch(f.node, time.Now())
		if len(items) > 0 {
			f.c.wg.Add(1)
			go func() { // owned by the Consumer: Close cancels c.ctx and waits on c.wg
				defer f.c.wg.Done()
				f.fetch(items)
				<-slots
				f.wake()
			}()
			continue
		}
		<-slots
		var tc <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			tc = timer.C
		}
		select {
		case <-f.wakeCh:
		case <-tc:
		case <-f.c.ctx.Done():
			return
		}
	}
}

// collectFetch picks the partitions node leads that may be fetched now (no fetch in flight, nothing
// waiting for Poll, no error, no backoff) and marks them in flight. It also returns when a backoff ends.
func (c *Consumer) collectFetch(node int32, now time.Time) ([]fetchItem, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var items []fetchItem
	var next time.Time
	for _, p := range c.parts {
		if p.leader != node || p.inflight || p.buffered >= maxBufferedPerPartition || p.err != nil || p.paused {
			continue
		}
		if c.bufBytes >= int(c.cfg.fetchMaxBytes) && p.buffered > 0 {
			// The buffer is full: fetch only partitions with nothing waiting, so none starves.
			continue
		}
		if now.Before(p.retryAt) {
			next = earliest(next, p.retryAt)
			continue
		}
		p.inflight = true
		items = append(items, fetchItem{p: p, epoch: p.epoch, offset: p.fetchOffset})
	}
	return items, next
}

// fetch runs one long poll for items and hands the decoded answer to Poll.
func (f *fetcher) fetch(items []fetchItem) {
	c := f.c
	cfg := &c.cfg
	req := &runnelv1.FetchRequest{
		MaxWaitMs: int32(cfg.fetchMaxWait / time.Millisecond),
		MinBytes:  cfg.fetchMinBytes,
		MaxBytes:  cfg.fetchMaxBytes,
		// READ_COMMITTED: the leader answers up to the LSO and lists the aborted transactions
		// in the answer, which scanFetched drops.
		IsolationLevel: cfg.isolation.proto(),
	}
	for _, it := range items {
		fp := &runnelv1.FetchPartition{Topic: it.p.topic, Partition: it.p.partition,
			FetchOffset: it.offset, PartitionMaxBytes: cfg.partitionMaxBytes}
		if e := c.cl.leaderEpoch(it.p.topic, it.p.partition); e >= 0 {
			fp.CurrentLeaderEpoch = &e
		}
		req.Partitions = append(req.Partitions, fp)
	}
	ctx, cancel := context.WithTimeout(c.ctx, cfg.fetchMaxWait+cfg.common.requestTimeout)
	call := &fetchCall{cancel: cancel, items: items, started: time.Now()}
	f.mu.Lock()
	if f.calls == nil {
		f.calls = map[*fetchCall]struct{}{}
	}
	f.calls[call] = struct{}{}
	f.mu.Unlock()
	// A Seek, Assign or Unassign of one of items since collectFetch that came before the registration
	// above found no call to cancel; it changed the partition's epoch first, so it is seen here and
	// the partition does not wait out this poll.
	stale := false
	c.mu.Lock()
	for _, it := range items {
		if c.parts[it.p.tp] != it.p || it.p.epoch != it.epoch {
			stale = true
			break
		}
	}
	c.mu.Unlock()
	if stale {
		f.mu.Lock()
		call.interrupted = true
		f.mu.Unlock()
		cancel()
	}
	reply := &fetchReply{FetchResponse: &runnelv1.FetchResponse{}}
	cc, err := c.cl.nodeConn(f.node)
	if err == nil {
		// The generated client's Fetch, decoding into reply, which also gets each partition's records
		// buffer (fetchCodec).
		err = wireErr(cc.Invoke(ctx, runnelv1.Records_Fetch_FullMethodName, req, reply, grpc.StaticMethod(), fetchCallCodec))
	}
	resp := reply.FetchResponse
	cancel()
	f.mu.Lock()
	interrupted := call.interrupted
	delete(f.calls, call)
	f.mu.Unlock()

	// Each partition's records buffer, until a fetched part takes it; the rest are recycled on return.
	bufs := reply.bufs
	defer func() {
		for _, b := range bufs {
			if b != nil {
				recordBufs.Put(b)
			}
		}
	}()
	if err != nil {
		if c.ctx.Err() != nil {
			return
		}
		if interrupted {
			err = nil // dropped on purpose; fetch again
		}
		c.mu.Lock()
		for _, it := range items {
			it.p.inflight = false
			if err != nil && it.p.epoch == it.epoch {
				c.failLocked(it.p, err)
			}
		}
		c.mu.Unlock()
		if err != nil && retriable(err) {
			c.refreshLeaders()
		}
		return
	}

	// Check outside the lock: this is the work that overlaps the application's.
	type outcome struct {
		batches []batch.Reader
		count   int
		next    int64
		err     error
		hw      int64
		size    int
		buf     *[]byte
		// aboveEnd: OFFSET_OUT_OF_RANGE for a position past the answering broker's log end (not below
		// its log start, which retention explains).
		aboveEnd bool
	}
	outs := make([]outcome, len(items))
	for i, it := range items {
		var res *runnelv1.FetchPartitionResult
		j := -1
		if i < len(resp.Partitions) && resp.Partitions[i].Topic == it.p.topic && resp.Partitions[i].Partition == it.p.partition {
			j = i
		} else {
			for k, r := range resp.Partitions {
				if r.Topic == it.p.topic && r.Partition == it.p.partition {
					j = k
					break
				}
			}
		}
		if j >= 0 {
			res = resp.Partitions[j]
		}
		o := &outs[i]
		o.next, o.hw = it.offset, -1
		if res == nil {
			continue // not answered this time (the answer was full): fetch again
		}
		o.hw = res.HighWatermark
		if o.err = rerr.FromInfo(res.Error); o.err != nil {
			o.aboveEnd = errors.Is(o.err, rerr.ErrOffsetOutOfRange) && res.LogStartOffset >= 0 && it.offset >= res.LogStartOffset
			continue
		}
		o.size = len(res.Records)
		var aborted []*runnelv1.AbortedTransaction
		if cfg.isolation == ReadCommitted {
			aborted = res.AbortedTransactions
		}
		o.batches, o.count, o.next, o.err = scanFetched(res.Records, it.offset, aborted)
		if j < len(bufs) && len(o.batches) > 0 {
			o.buf, bufs[j] = bufs[j], nil
		}
	}

	refresh := false
	c.mu.Lock()
	added := false
	for i, it := range items {
		p, o := it.p, outs[i]
		p.inflight = false
		if c.parts[p.tp] != p || p.epoch != it.epoch {
			if o.buf != nil {
				recordBufs.Put(o.buf) // moved or unassigned while in flight: dropped unread
			}
			continue
		}
		if o.hw >= 0 {
			p.hw = o.hw
			if o.err == nil {
				p.maxHW = max(p.maxHW, o.hw)
			}
		}
		if len(o.batches) > 0 || o.next > it.offset {
			p.fetchOffset = o.next
			p.attempts = 0
			c.ready = append(c.ready, &fetched{p: p, epoch: it.epoch, batches: o.batches, from: it.offset, next: o.next, size: o.size, count: o.count, buf: o.buf})
			c.bufBytes += o.size
			p.buffered++
			added = true
			if o.err != nil {
				// Records before a damaged batch are delivered; the next fetch starts at the damage
				// and reports it.
				continue
			}
		}
		if o.err != nil && o.aboveEnd && (c.cfg.trustPositions || it.offset <= p.maxHW) {
			// A position the partition's log does not reach yet: most likely the answer of a broker
			// that leads with a stale log (restarted, or cut off) while the consumer's metadata is as
			// stale, or a new leader's. Kafka's consumers validate such a position against the leader
			// (KIP-320) instead of resetting it; here it is fetched again after a metadata refresh, and
			// only an answer that persists for outOfRangeGrace reaches the application (whose reset
			// policy then applies: the log really was truncated, an unclean leader election).
			if p.aboveEndSince.IsZero() {
				p.aboveEndSince = time.Now()
			}
			if time.Since(p.aboveEndSince) < outOfRangeGrace {
				p.retryAt = time.Now().Add(c.cl.backoff(p.attempts))
				p.attempts++
				refresh = true
				continue
			}
		}
		if o.err == nil {
			p.aboveEndSince = time.Time{}
		}
		if o.err != nil {
			c.failLocked(p, o.err)
			refresh = refresh || retriable(o.err)
		}
	}
	c.mu.Unlock()
	if added {
		select {
		case c.readyCh <- struct{}{}:
		default:
		}
	}
	if refresh {
		c.refreshLeaders()
	}
}

// failLocked handles a partition's fetch error: retriable ones back off and retry (after a metadata
// refresh); others are kept for Poll to return until Seek.
func (c *Consumer) failLocked(p *cpart, err error) {
	if retriable(err) && !errors.Is(err, rerr.ErrCorruptMessage) {
		p.retryAt = time.Now().Add(c.cl.backoff(p.attempts))
		p.attempts++
		c.cfg.common.logger.Debug("fetch will be retried", "topic", p.topic, "partition", p.partition, "err", err)
		return
	}
	if p.err == nil {
		c.nerr++
	}
	p.err = err
	select {
	case c.readyCh <- struct{}{}: // wake Poll to return it
	default:
	}
}

// refreshLeaders re-reads metadata of the assigned topics (at most once per retry backoff) and moves
// partitions whose leader changed to that broker's fetcher.
func (c *Consumer) refreshLeaders() {
	c.metaMu.Lock()
	if time.Since(c.lastMeta) < c.cfg.common.retryBackoff {
		c.metaMu.Unlock()
		return
	}
	c.lastMeta = time.Now()
	c.metaMu.Unlock()
	c.mu.Lock()
	seen := map[string]bool{}
	var topics []string
	for k := range c.parts {
		if !seen[k.topic] {
			seen[k.topic] = true
			topics = append(topics, k.topic)
		}
	}
	c.mu.Unlock()
	if len(topics) == 0 {
		return
	}
	if _, err := c.cl.metadata(c.ctx, topics); err != nil {
		return
	}
	c.mu.Lock()
	var wake []*fetcher
	for _, p := range c.parts {
		if l := c.cl.leader(p.topic, p.partition); l != p.leader && l >= 0 && !p.inflight {
			p.leader = l
			wake = append(wake, c.fetcherLocked(l))
		}
	}
	c.mu.Unlock()
	for _, f := range wake {
		f.wake()
	}
}

// scanFetched checks the batches of one partition's fetch answer that hold records at or after from, as
// the fetcher does before handing them to Poll: the batches of aborted transactions (when aborted lists
// the answer's aborted transactions, a read_committed fetch; see abortedFilter) and control batches are
// left out, every other batch's header and CRC are validated (and a compressed one decompressed). The
// records are decoded once, by Poll (decodeTake), which stops at one that does not decode: checking
// every record here first cost a fifth of a consumer's CPU (docs/performance.md). It returns the
// batches' readers (aliasing b, or the batch's decompressed records), how many records they hold, and
// the offset after the last whole batch, skipped batches included. A trailing batch cut short (a broker
// may end an answer mid-batch) is left for the next fetch; damage anywhere else is an error, returned
// with the batches before it.
func scanFetched(b []byte, from int64, aborted []*runnelv1.AbortedTransaction) ([]batch.Reader, int, int64, error) {
	var batches []batch.Reader
	count := 0
	next := from
	f := newAbortedFilter(aborted)
	for len(b) > 0 {
		if next > from && (len(b) < batch.HeaderSize || int64(binary.BigEndian.Uint32(b[8:]))+12 > int64(len(b))) {
			break
		}
		if h, err := batch.ParseHeader(b); err == nil && f != nil && f.skip(h) { // else OpenBatch reports the error below
			next = max(next, h.NextOffset())
			b = b[h.Size():]
			continue
		}
		rd, err := batch.OpenBatch(b)
		if err != nil {
			return batches, count, next, err
		}
		h := rd.Header()
		if !h.IsControl() { // control records are never returned
			if batches == nil {
				batches = make([]batch.Reader, 0, countBatches(b))
			}
			batches = append(batches, rd)
			count += int(h.RecordCount)
		}
		next = max(next, h.NextOffset())
		b = b[h.Size():]
	}
	return batches, count, next, nil
}

// abortedFilter drops the batches of aborted transactions from a read_committed fetch answer, as
// Kafka's consumer does (KIP-98): walking the answer's batches in offset order, an aborted transaction
// becomes active for its producer once the walk reaches its first offset (a batch whose last offset is
// at or past it), every transactional batch of an active producer is dropped, and the producer's next
// control batch (its ABORT marker) ends it. Batches of other producers, non-transactional batches and
// those of committed transactions are kept. Control batches are never returned in any mode, so skip
// reports them too.
type abortedFilter struct {
	pending []*runnelv1.AbortedTransaction // by first offset, not reached yet
	active  map[int64]bool                 // producer ids inside an aborted transaction
}

// newAbortedFilter returns the filter of an answer's aborted transactions, or nil when there are none
// (nothing to drop but control records, which decoding skips anyway).
func newAbortedFilter(aborted []*runnelv1.AbortedTransaction) *abortedFilter {
	if len(aborted) == 0 {
		return nil
	}
	f := &abortedFilter{pending: slices.Clone(aborted), active: map[int64]bool{}}
	slices.SortStableFunc(f.pending, func(a, b *runnelv1.AbortedTransaction) int { return cmp.Compare(a.FirstOffset, b.FirstOffset) })
	return f
}

// skip reports whether the whole batch h is dropped: a control batch, or a transactional batch of a
// producer inside an aborted transaction. Batches must come in offset order.
func (f *abortedFilter) skip(h batch.Header) bool {
	for len(f.pending) > 0 && f.pending[0].FirstOffset <= h.LastOffset() {
		f.active[f.pending[0].ProducerId] = true
		f.pending = f.pending[1:]
	}
	if h.IsControl() {
		delete(f.active, h.ProducerID) // the marker ends the producer's transaction
		return true
	}
	return h.IsTransactional() && f.active[h.ProducerID]
}

// countBatches returns how many whole batches b begins with, to size the list of an answer's batches
// once. The headers are not validated yet.
func countBatches(b []byte) int {
	n := 0
	for len(b) >= batch.HeaderSize {
		size := int64(binary.BigEndian.Uint32(b[8:])) + 12
		if size > int64(len(b)) || size < batch.HeaderSize {
			break
		}
		n++
		b = b[size:]
	}
	return n
}
