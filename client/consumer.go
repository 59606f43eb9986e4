package client

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/client/telemetry"
)

// Consumer reads explicitly assigned partitions (for partitions shared out by a consumer group, see
// GroupConsumer, which is built on it). Safe for concurrent use, though one goroutine calling Poll is
// the normal shape.
//
// A fetch goroutine per broker long-polls Fetch for the assigned partitions that broker leads and
// decodes the answers, while the application handles what Poll returned before: each partition has at
// most one decoded answer waiting, so the buffer is bounded (by the fetch max bytes per broker) and the
// next fetch of a partition is in flight while the application processes the previous one.
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

// fetched is one partition's decoded share of a fetch answer.
type fetched struct {
	p     *cpart
	epoch uint64
	recs  []*Record
	next  int64 // position after these records (after the last batch, control records included)
	size  int   // record bytes fetched, counted against the fetch max bytes
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

	mu    sync.Mutex
	calls map[*fetchCall]struct{} // fetches in flight
}

// fetchCall is one fetch in flight, cancellable by interrupt.
type fetchCall struct {
	cancel      context.CancelFunc
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
	f.interrupt()
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
		f.interrupt()
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
		f.interrupt()
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
// log, a corrupt batch) makes Poll return a *PartitionError naming it, on every call, until Seek,
// Assign or Unassign of that partition; the other partitions wait meanwhile, as in Kafka. After Close,
// Poll returns ErrClosed.
//
// With tracing on (WithTelemetry), each Poll that returns records records a "receive" span linked to
// the producers' batch spans; StartProcess starts the span of processing one record.
func (c *Consumer) Poll(ctx context.Context) ([]*Record, error) {
	start := time.Now()
	recs, _, err := c.poll(ctx, nil)
	c.received(ctx, "", start, recs)
	return recs, err
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

// poll is Poll, which GroupConsumer shares: it also returns the partitions whose position moved (the
// offsets a group member commits once the records are processed), and returns errWoken, without
// records, when wake fires first (the group's rebalance events wake it).
func (c *Consumer) poll(ctx context.Context, wake <-chan struct{}) ([]*Record, []moved, error) {
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
		var out []*Record
		var mv []moved
		if len(c.ready) > 0 {
			woken := map[int32]bool{}
			kept := c.ready[:0] // answers of paused partitions wait for Resume, in order
			for _, fp := range c.ready {
				p := fp.p
				if c.parts[p.tp] != p || fp.epoch != p.epoch {
					c.bufBytes -= fp.size
					continue
				}
				if p.paused {
					kept = append(kept, fp)
					continue
				}
				c.bufBytes -= fp.size
				p.buffered--
				recs := fp.recs
				for len(recs) > 0 && recs[0].Offset < p.position {
					recs = recs[1:]
				}
				out = append(out, recs...)
				if fp.next > p.position {
					p.position = fp.next
					m := moved{tp: p.tp, next: p.position, leaderEpoch: -1}
					if len(recs) > 0 {
						m.leaderEpoch = recs[len(recs)-1].LeaderEpoch
					}
					mv = append(mv, m)
				}
				if f := c.fetchers[p.leader]; f != nil && !woken[p.leader] {
					woken[p.leader] = true
					f.wake() // its partition may be fetched again
				}
			}
			clear(c.ready[len(kept):])
			c.ready = kept
		}
		c.mu.Unlock()
		if len(out) > 0 {
			return out, mv, nil
		}
		select {
		case <-c.readyCh:
		case <-wake:
			return nil, mv, errWoken
		case <-ctx.Done():
			return nil, mv, ctx.Err()
		case <-c.ctx.Done():
			return nil, mv, ErrClosed
		}
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
		f = &fetcher{c: c, node: node, wakeCh: make(chan struct{}, 1)}
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

// interrupt cancels the fetch in flight (its answer would be dropped anyway, after a Seek) and wakes the
// fetcher, so a moved or new partition is fetched at once rather than after the long poll.
func (f *fetcher) interrupt() {
	f.mu.Lock()
	for call := range f.calls {
		call.interrupted = true
		call.cancel()
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
	slots := make(chan struct{}, maxFetchesInFlight)
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
		// in the answer, which decodeFetched drops.
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
	call := &fetchCall{cancel: cancel}
	f.mu.Lock()
	if f.calls == nil {
		f.calls = map[*fetchCall]struct{}{}
	}
	f.calls[call] = struct{}{}
	f.mu.Unlock()
	var resp *runnelv1.FetchResponse
	cc, err := c.cl.nodeConn(f.node)
	if err == nil {
		resp, err = runnelv1.NewRecordsClient(cc).Fetch(ctx, req)
		err = wireErr(err)
	}
	cancel()
	f.mu.Lock()
	interrupted := call.interrupted
	delete(f.calls, call)
	f.mu.Unlock()

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

	// Decode outside the lock: this is the work that overlaps the application's.
	type outcome struct {
		recs []*Record
		next int64
		err  error
		hw   int64
		size int
		// aboveEnd: OFFSET_OUT_OF_RANGE for a position past the answering broker's log end (not below
		// its log start, which retention explains).
		aboveEnd bool
	}
	outs := make([]outcome, len(items))
	for i, it := range items {
		var res *runnelv1.FetchPartitionResult
		if i < len(resp.Partitions) && resp.Partitions[i].Topic == it.p.topic && resp.Partitions[i].Partition == it.p.partition {
			res = resp.Partitions[i]
		} else {
			for _, r := range resp.Partitions {
				if r.Topic == it.p.topic && r.Partition == it.p.partition {
					res = r
					break
				}
			}
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
		o.recs, o.next, o.err = decodeFetched(res.Records, it.p.topic, it.p.partition, it.offset, aborted)
	}

	refresh := false
	c.mu.Lock()
	added := false
	for i, it := range items {
		p, o := it.p, outs[i]
		p.inflight = false
		if c.parts[p.tp] != p || p.epoch != it.epoch {
			continue // moved or unassigned while in flight
		}
		if o.hw >= 0 {
			p.hw = o.hw
			if o.err == nil {
				p.maxHW = max(p.maxHW, o.hw)
			}
		}
		if len(o.recs) > 0 || o.next > it.offset {
			p.fetchOffset = o.next
			p.attempts = 0
			c.ready = append(c.ready, &fetched{p: p, epoch: it.epoch, recs: o.recs, next: o.next, size: o.size})
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

// decodeFetched decodes the batches of one partition's fetch answer into records at or after from,
// skipping control records and, when aborted lists the answer's aborted transactions (a
// read_committed fetch), the records of those transactions (see abortedFilter). It returns the offset
// after the last whole batch, skipped batches included. A trailing batch cut short (a broker may end an
// answer mid-batch) is left for the next fetch; damage anywhere else is an error, returned with the
// records before it.
func decodeFetched(b []byte, topic string, partition int32, from int64, aborted []*runnelv1.AbortedTransaction) ([]*Record, int64, error) {
	recs := make([]Record, 0, countRecords(b))
	next := from
	floor := from // no record below it is returned: the answer's records come out strictly increasing
	f := newAbortedFilter(aborted)
	for len(b) > 0 {
		if next > from && (len(b) < batch.HeaderSize || int64(binary.BigEndian.Uint32(b[8:]))+12 > int64(len(b))) {
			break
		}
		end := int64(math.MaxInt64)
		if h, err := batch.ParseHeader(b); err == nil { // else DecodeBatch reports the error below
			if f != nil && f.skip(h) {
				next = max(next, h.NextOffset())
				b = b[h.Size():]
				continue
			}
			end = h.NextOffset()
		}
		kept := len(recs)
		h, err := batch.DecodeBatch(b, func(br batch.Record) error {
			// Records below the fetch offset share its batch with it. Those below an earlier record
			// or past their batch's last offset only come from a malformed answer (overlapping
			// batches, offset deltas out of order): dropped, so Poll never returns an offset twice.
			if br.Control || br.Offset < floor || br.Offset >= end {
				return nil
			}
			floor = br.Offset + 1
			recs = append(recs, Record{Topic: topic, Partition: partition, Offset: br.Offset, Timestamp: time.UnixMilli(br.Timestamp),
				Key: br.Key, Value: br.Value, Headers: br.Headers, LeaderEpoch: br.LeaderEpoch})
			return nil
		})
		if err != nil {
			// Drop the damaged batch's records: they are returned (or not) when it is fetched again.
			return pointers(recs[:kept]), next, err
		}
		next = max(next, h.NextOffset())
		b = b[h.Size():]
	}
	return pointers(recs), next, nil
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

// countRecords sums the record counts of the batch headers in b, so the answer's records are allocated
// once. The sum is capped by what b could hold, since the headers are not validated yet.
func countRecords(b []byte) int {
	n, total := 0, len(b)
	for len(b) >= batch.HeaderSize {
		size := int64(binary.BigEndian.Uint32(b[8:])) + 12
		if size > int64(len(b)) || size < batch.HeaderSize {
			break
		}
		n += int(int32(binary.BigEndian.Uint32(b[57:])))
		b = b[size:]
	}
	return max(0, min(n, total/7)) // a record takes at least 7 bytes
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
