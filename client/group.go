package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// GroupConsumer is a member of a consumer group: the group's coordinator shares the partitions of the
// subscribed topics among the members (broker-side assignment, KIP-848), and the consumer reads the
// partitions it is given from their committed offsets, commits what it has processed, and hands
// partitions over when the group rebalances. It is built on Consumer, whose fetch machinery it uses
// for the partitions it owns.
//
// The shape is Kafka's KafkaConsumer (and franz-go's group consuming): NewGroupConsumer, Subscribe,
// then a loop of Poll and processing; Close when done.
//
//	c, err := client.NewGroupConsumer(brokers, "billing", client.WithAutoOffsetReset(client.OffsetEarliest()))
//	err = c.Subscribe("orders")
//	for {
//		recs, err := c.Poll(ctx)
//		... // process recs; the next Poll counts them as processed
//	}
//	c.Close() // commits, leaves the group
//
// Membership runs on a goroutine of the consumer (stopped by Close): it joins with member epoch 0,
// heartbeats at the interval the coordinator returns, reports the partitions it owns, and applies each
// new assignment incrementally. A partition taken away stops being fetched at once and its buffered
// records are dropped; in the next Poll (so never while the application still processes records
// returned before), the processed offsets are committed (with auto-commit on) and OnRevoked runs, and
// only then is the partition reported released, so the coordinator never gives it to another member
// while this one may still be processing it. A partition given is started from the group's committed
// offset, or from the auto-offset-reset position when there is none, and announced by OnAssigned
// before its first record. A member the coordinator fenced (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID,
// after missing its session timeout) drops every partition without committing (OnLost) and joins
// again.
//
// Processed offsets: a record returned by Poll counts as processed when Poll is called again (as in
// Kafka), and on Close. Auto-commit (on by default, every 5s) and the commit on revocation commit only
// processed offsets, the offset after the last processed record of each partition, so a crash
// re-delivers the records of the batch being processed and those since the last commit, and never
// skips one. CommitSync and CommitAsync commit everything Poll returned so far (call them once it is
// processed); CommitOffsets commits what it is given.
//
// Errors that end membership (UNRELEASED_INSTANCE_ID, FENCED_INSTANCE_ID, GROUP_MAX_SIZE_REACHED,
// INVALID_REGULAR_EXPRESSION, UNSUPPORTED_ASSIGNOR, INVALID_SESSION_TIMEOUT, INVALID_GROUP_ID, a
// broker without the Groups service) are returned by every Poll; the consumer must be closed.
// Retriable ones (the coordinator loading or moving, a broker unreachable) are retried with backoff.
//
// Poll, the callbacks and the commit methods are meant for one goroutine (the one processing the
// records); the other methods are safe for concurrent use.
type GroupConsumer struct {
	cfg   groupConfig
	group string
	c     *Consumer
	cl    *cluster
	coord *coordinator
	log   loggerLike

	ctx      context.Context // ends when the consumer is closed: callbacks, async commits
	cancel   context.CancelFunc
	hbCtx    context.Context // ends when the heartbeat loop must stop (before the leave heartbeat)
	hbCancel context.CancelFunc
	hbDone   chan struct{}
	wg       sync.WaitGroup // async commits

	eventCh chan struct{} // wakes Poll: a rebalance event, a fatal error, Close
	hbWake  chan struct{} // wakes the heartbeat loop: subscription changed, revocation acknowledged

	commitMu sync.Mutex // one commit at a time, so commits land in the order they were taken

	mu sync.Mutex
	// Subscription: topic names or a regular expression; subVer bumps on every Subscribe.
	topics []string
	regex  string
	subVer int
	// Membership as last heard from the coordinator.
	memberID string
	epoch    int32
	started  bool // Subscribe started the heartbeat loop
	closed   bool
	crashed  bool // abandoned without commit or leave (tests simulate crashes so)
	fatal    error
	// parts are the partitions the application owns: announced by OnAssigned, not yet revoked or lost.
	parts  map[tp]*gpart
	events []groupEvent // for Poll, in order
	// State of the heartbeat loop (shared with Poll, which acknowledges revocations and losses).
	gen         int         // membership generation: bumps when the member loses everything
	owned       map[tp]bool // reported as owned: assigned to this member and not released yet
	revoking    map[tp]bool // asked to revoke, waiting for Poll to finish it
	resolving   map[tp]bool // assigned, start positions being looked up
	resolvers   sync.WaitGroup
	target      map[tp]bool   // the assignment last received
	acked       []tp          // revocations Poll finished, to release in the next heartbeat
	lostPending bool          // waiting for Poll to run OnLost before joining again
	gate        *groupGate    // the PollFunc in progress, which seek tells of the partitions it moves
	subSent     int           // subscription version the coordinator acknowledged
	commitSeq   uint64        // numbers commit snapshots, so an older one never overwrites a newer
	nextAuto    time.Time     // when auto-commit is next due
	autoTimer   *time.Timer   // wakes a waiting Poll when auto-commit is due
	lastHB      time.Time     // when the last heartbeat that was answered was sent
	interval    time.Duration // heartbeat interval last returned
}

// loggerLike is the subset of *slog.Logger the group consumer uses.
type loggerLike interface {
	Debug(msg string, args ...any)
	Info(msg string, args ...any)
	Warn(msg string, args ...any)
}

// gpart is one partition the application owns, with the positions the commits are made from.
type gpart struct {
	delivered  pos    // after the last record Poll returned
	processed  pos    // after the last record counted as processed
	committed  int64  // last offset known committed for the group (-1: none)
	commitSeq  uint64 // snapshot of the last successful commit of this partition
	assignedAt uint64 // snapshot number when it was assigned: older snapshots do not commit it
}

// pos is a position: the next offset and the leader epoch of the record before it (-1 unknown).
type pos struct {
	offset int64
	epoch  int32
}

type eventKind int8

const (
	evAssign eventKind = iota
	evRevoke
	evLost
)

// groupEvent is a rebalance step for Poll to finish: start partitions, revoke or lose them.
type groupEvent struct {
	kind  eventKind
	gen   int
	parts []tp
	start map[tp]startPos // evAssign
}

// startPos is where a newly assigned partition starts.
type startPos struct {
	offset    int64
	committed int64 // -1: the group had no commit
}

// NewGroupConsumer returns a member of group for the cluster reachable at brokers. It validates the
// options and connects lazily; it joins the group when Subscribe is called. Options are the
// GroupOptions above and every ConsumerOption (fetch sizes and waits) and shared Option.
func NewGroupConsumer(brokers []string, group string, opts ...GroupOption) (*GroupConsumer, error) {
	if group == "" {
		return nil, errors.New("client: NewGroupConsumer: empty group id")
	}
	cfg, err := newGroupConfig(opts)
	if err != nil {
		return nil, err
	}
	cl, err := newCluster(brokers, cfg.consumer.common)
	if err != nil {
		return nil, err
	}
	ccfg := cfg.consumer
	ccfg.trustPositions = true
	c := &Consumer{cfg: ccfg, cl: cl, tr: cfg.consumer.common.tracer(), parts: map[tp]*cpart{}, readyCh: make(chan struct{}, 1), fetchers: map[int32]*fetcher{}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	g := &GroupConsumer{cfg: cfg, group: group, c: c, cl: cl, coord: newCoordinator(cl), log: cfg.consumer.common.logger,
		eventCh: make(chan struct{}, 1), hbWake: make(chan struct{}, 1), hbDone: make(chan struct{}),
		parts: map[tp]*gpart{}, owned: map[tp]bool{}, revoking: map[tp]bool{}, resolving: map[tp]bool{}, target: map[tp]bool{}}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.hbCtx, g.hbCancel = context.WithCancel(g.ctx)
	return g, nil
}

// GroupID returns the group's id.
func (g *GroupConsumer) GroupID() string { return g.group }

// Subscribe sets the topics the member consumes (replacing an earlier subscription) and, the first
// time, joins the group. The coordinator then assigns partitions of these topics; topics that do not
// exist yet are picked up when they are created.
func (g *GroupConsumer) Subscribe(topics ...string) error {
	names := slices.Compact(slices.Sorted(slices.Values(topics)))
	if len(names) == 0 || names[0] == "" {
		return rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "subscribe to no topic, or to an empty topic name")
	}
	return g.subscribe(names, "")
}

// SubscribeRegex subscribes to every topic whose whole name matches expr (RE2 syntax, as Go's regexp;
// internal topics never match), now and as topics are created and deleted. An expression that does
// not compile gives INVALID_REGULAR_EXPRESSION at once; one the broker refuses (longer than 1 KiB)
// gives it from Poll.
func (g *GroupConsumer) SubscribeRegex(expr string) error {
	if expr == "" {
		return rerr.New(runnelv1.ErrorCode_INVALID_REGULAR_EXPRESSION, "empty regular expression")
	}
	if _, err := regexp.Compile(expr); err != nil {
		return rerr.New(runnelv1.ErrorCode_INVALID_REGULAR_EXPRESSION, "%v", err)
	}
	return g.subscribe(nil, expr)
}

func (g *GroupConsumer) subscribe(names []string, regex string) error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return ErrClosed
	}
	g.topics, g.regex = names, regex
	g.subVer++
	start := !g.started
	g.started = true
	g.mu.Unlock()
	if start {
		go g.heartbeatLoop()
	} else {
		wake(g.hbWake)
	}
	return nil
}

// wake signals a capacity-1 channel without blocking.
func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Poll returns the next records of the partitions the member owns, each partition's in offset order,
// blocking until there are some or ctx ends (ctx.Err()). Calling it marks the records the previous
// call returned as processed. Rebalance steps happen inside it: commits of revoked partitions and the
// OnAssigned, OnRevoked and OnLost callbacks run on its goroutine before it returns records.
//
// Errors: a fatal membership error (see GroupConsumer), returned by every call; a *PartitionError for
// a partition that cannot be read (a corrupt batch; an out-of-range position is reset by the
// auto-offset-reset rule instead); ErrClosed after Close. Poll before Subscribe is an error.
//
// With tracing on (WithTelemetry), each Poll that returns records records a "receive" span linked to
// the producers' batch spans; StartProcess starts the span of processing one record.
func (g *GroupConsumer) Poll(ctx context.Context) ([]*Record, error) {
	start := time.Now()
	recs, err := g.poll(ctx)
	g.c.received(ctx, g.group, start, recs)
	return recs, err
}

func (g *GroupConsumer) poll(ctx context.Context) ([]*Record, error) {
	if err := g.pollStart("Poll"); err != nil {
		return nil, err
	}
	for {
		if err := g.pollReady(); err != nil {
			return nil, err
		}
		recs, mv, err := g.c.poll(ctx, g.eventCh)
		if len(mv) > 0 {
			recs = g.delivered(recs, mv)
		}
		if err == nil && len(recs) > 0 {
			return recs, nil
		}
		if err := g.pollFailed(ctx, err); err != nil {
			return nil, err
		}
	}
}

// PollFunc is Poll for throughput, as Consumer.PollFunc is Consumer.Poll's: it calls fn with each
// record Poll would return, in the same order, on the calling goroutine, reusing one Record and the
// fetched buffers, and returns how many records fn saw. The Record and everything it references are
// valid only until fn returns. Everything else is Poll's: the rebalance steps and callbacks run inside
// it before any record, the records fn saw count as processed when PollFunc or Poll is next called
// (and on Close), CommitSync commits them once PollFunc has returned, and the errors are Poll's.
//
// fn may call Seek, Pause and Resume; they take effect from the next poll, and the records this call
// took are all handed to fn, up to a record that does not decode as with Poll (a partition fn sought
// keeps the Seek's position). fn must not call PollFunc (which refuses with an error while another
// runs), Poll, Close or the commit methods: the position of a partition already counts the rest of
// the fetched part fn is reading, so a commit from fn could store offsets of records fn has not seen.
// It allocates nothing per record (docs/performance.md), which is what a member that processes every
// batch before it commits, as the function and connector runtimes will, needs.
func (g *GroupConsumer) PollFunc(ctx context.Context, fn func(*Record)) (int, error) {
	start := time.Now()
	if err := g.pollStart("PollFunc"); err != nil {
		return 0, err
	}
	g.mu.Lock()
	if g.gate != nil {
		g.mu.Unlock()
		return 0, errors.New("client: GroupConsumer.PollFunc called while another PollFunc runs (from fn, or on another goroutine)")
	}
	gate := &groupGate{g: g, sought: map[tp]bool{}}
	g.gate = gate
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.gate = nil
		g.mu.Unlock()
	}()
	for {
		if err := g.pollReady(); err != nil {
			return 0, err
		}
		n, err := g.c.pollFunc(ctx, start, g.eventCh, g.group, gate, fn)
		if err == nil && n > 0 {
			return n, nil
		}
		if err := g.pollFailed(ctx, err); err != nil {
			return 0, err
		}
	}
}

// pollStart begins a Poll or PollFunc (method names it in the error): what the previous call returned
// counts as processed now.
func (g *GroupConsumer) pollStart(method string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return ErrClosed
	}
	if !g.started {
		return fmt.Errorf("client: GroupConsumer.%s before Subscribe", method)
	}
	for _, p := range g.parts {
		p.processed = p.delivered
	}
	return nil
}

// pollReady runs before every wait of a Poll or PollFunc for records: the auto-commit when it is due
// (also when Poll waits: what the previous call returned is processed, and must not wait for the next
// record to be committed), the queued rebalance steps, and the checks for Close and fatal errors.
func (g *GroupConsumer) pollReady() error {
	g.maybeAutoCommit()
	if err := g.runEvents(); err != nil {
		return err
	}
	g.mu.Lock()
	closed, fatal := g.closed, g.fatal
	g.mu.Unlock()
	if closed {
		return ErrClosed
	}
	return fatal
}

// pollFailed decides what a wait for records that returned none ends in: nil to wait again (no
// records, woken by a rebalance event, or a position out of range that the auto-offset-reset rule
// moved), or the error Poll returns.
func (g *GroupConsumer) pollFailed(ctx context.Context, err error) error {
	switch {
	case err == nil, errors.Is(err, errWoken):
		return nil
	case errors.Is(err, ErrClosed):
		return ErrClosed
	}
	var pe *PartitionError
	if errors.As(err, &pe) && errors.Is(pe.Err, rerr.ErrOffsetOutOfRange) && g.resetOutOfRange(ctx, tp{pe.Topic, pe.Partition}) {
		return nil
	}
	if ctx.Err() == nil && g.closedNow() {
		return ErrClosed
	}
	return err
}

// groupGate is PollFunc's partGate: records of a partition the member no longer owns are dropped (as
// delivered drops them for Poll), and each owned partition's delivered position follows its move.
// The move is applied before fn sees the records, with the leader epoch unknown (-1) until leave
// knows the last record's, so that the position never pairs the new offset with the old epoch; leave
// then adds the epoch and a decode failure's move back. A partition sought since the take began (by
// fn, or by another goroutine: seek marks it in sought before it moves the consumer) keeps the Seek's
// position: its parts of the take, fetched before the Seek or taken while it ran, move nothing, so
// a Seek racing the take errs towards reading records again, never past them. The marks are cleared
// before each take, whose parts come after every Seek that finished before it. Whether the consumer
// still fetches the partition does not matter: the heartbeat loop stops fetching a revoked partition
// at once, while the member owns it (and fn gets its records) until the next poll finishes the
// revocation; decodeFailed stops its move at a record that does not decode all the same.
type groupGate struct {
	g      *GroupConsumer
	sought map[tp]bool // partitions sought since the last begin, before the take (guarded by g.mu)
	skip   bool        // the current part moves nothing
	prev   int32       // the leader epoch enter replaced, kept when fn saw no record of the part
}

func (gg *groupGate) begin() {
	gg.g.mu.Lock()
	clear(gg.sought)
	gg.g.mu.Unlock()
}

func (gg *groupGate) enter(t *taken, mv []moved) bool {
	g := gg.g
	g.mu.Lock()
	defer g.mu.Unlock()
	k := t.fp.p.tp
	p := g.parts[k]
	if p == nil {
		return false
	}
	gg.skip = t.mv < 0 || gg.sought[k]
	if !gg.skip {
		gg.prev = p.delivered.epoch
		p.delivered = pos{mv[t.mv].next, -1}
	}
	return true
}

func (gg *groupGate) leave(t *taken, mv []moved, n int, epoch int32) {
	if gg.skip {
		return
	}
	g := gg.g
	g.mu.Lock()
	defer g.mu.Unlock()
	k := t.fp.p.tp
	p := g.parts[k]
	if p == nil || gg.sought[k] {
		return // sought while fn read the part: the position is the Seek's
	}
	p.delivered = pos{mv[t.mv].next, gg.prev}
	if n > 0 {
		p.delivered.epoch = epoch
	}
}

func (g *GroupConsumer) closedNow() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// delivered records the positions Poll moved, and drops records of partitions the application does
// not own (none, unless a partition was lost while its records were on their way).
func (g *GroupConsumer) delivered(recs []*Record, mv []moved) []*Record {
	g.mu.Lock()
	defer g.mu.Unlock()
	foreign := false
	for _, m := range mv {
		p := g.parts[m.tp]
		if p == nil {
			foreign = true
			continue
		}
		p.delivered.offset = m.next
		if m.leaderEpoch >= 0 {
			p.delivered.epoch = m.leaderEpoch
		}
	}
	if !foreign {
		return recs
	}
	kept := recs[:0]
	for _, r := range recs {
		if g.parts[tp{r.Topic, r.Partition}] != nil {
			kept = append(kept, r)
		}
	}
	return kept
}

// resetOutOfRange moves an owned partition whose position left the log to the auto-offset-reset
// position, as Kafka's auto.offset.reset does. It reports whether it did.
func (g *GroupConsumer) resetOutOfRange(ctx context.Context, k tp) bool {
	g.mu.Lock()
	p := g.parts[k]
	g.mu.Unlock()
	if p == nil {
		return false
	}
	off, _, err := listOffsets(ctx, g.cl, k.topic, k.partition, g.cfg.resetOffset, true, g.cfg.consumer.isolation)
	if err != nil {
		g.log.Warn("reset of an out-of-range position failed", "group", g.group, "topic", k.topic, "partition", k.partition, "err", err)
		return false
	}
	g.log.Info("position out of range: reset", "group", g.group, "topic", k.topic, "partition", k.partition,
		"from", g.c.Position(k.topic, k.partition), "to", off, "reset", g.cfg.resetOffset)
	g.seek(k, off)
	return true
}

// runEvents finishes the rebalance steps the heartbeat loop queued, in order, on Poll's goroutine.
func (g *GroupConsumer) runEvents() error {
	for {
		g.mu.Lock()
		if len(g.events) == 0 || g.closed {
			g.mu.Unlock()
			return nil
		}
		ev := g.events[0]
		g.events = g.events[1:]
		var list []TopicPartition
		switch ev.kind {
		case evAssign:
			g.commitSeq++ // commits taken before do not concern this assignment of the partitions
			for _, k := range ev.parts {
				sp := ev.start[k]
				g.parts[k] = &gpart{delivered: pos{sp.offset, -1}, processed: pos{sp.offset, -1}, committed: sp.committed,
					assignedAt: g.commitSeq}
				list = append(list, TopicPartition{k.topic, k.partition})
			}
		default:
			for _, k := range ev.parts {
				if g.parts[k] != nil {
					list = append(list, TopicPartition{k.topic, k.partition})
				}
			}
		}
		g.mu.Unlock()

		switch ev.kind {
		case evAssign:
			for _, k := range ev.parts {
				if err := g.c.Assign(k.topic, k.partition, OffsetAt(ev.start[k].offset)); err != nil {
					return err // closed
				}
			}
			if g.cfg.onAssigned != nil && len(list) > 0 {
				g.cfg.onAssigned(g.ctx, g, list)
			}
		case evRevoke:
			for _, k := range ev.parts {
				g.c.Unassign(k.topic, k.partition)
			}
			if g.cfg.autoCommit && len(list) > 0 {
				ctx, cancel := context.WithTimeout(g.ctx, g.cfg.consumer.common.requestTimeout)
				if err := g.commit(ctx, g.snapshot(false, ev.parts)); err != nil {
					// The next owner re-reads from the last commit: duplicates, never a gap.
					g.log.Warn("commit of revoked partitions failed", "group", g.group, "partitions", list, "err", err)
				}
				cancel()
			}
			if g.cfg.onRevoked != nil && len(list) > 0 {
				g.cfg.onRevoked(g.ctx, g, list)
			}
			g.mu.Lock()
			for _, k := range ev.parts {
				delete(g.parts, k)
			}
			if ev.gen == g.gen {
				g.acked = append(g.acked, ev.parts...)
			}
			g.mu.Unlock()
			wake(g.hbWake) // release them now, not after the heartbeat interval
		case evLost:
			for _, k := range ev.parts {
				g.c.Unassign(k.topic, k.partition)
			}
			if g.cfg.onLost != nil && len(list) > 0 {
				g.cfg.onLost(g.ctx, g, list)
			}
			g.mu.Lock()
			for _, k := range ev.parts {
				delete(g.parts, k)
			}
			if ev.gen == g.gen {
				g.lostPending = false
			}
			g.mu.Unlock()
			wake(g.hbWake)
		}
	}
}

// Seek makes the next records Poll returns for an owned partition start at offset, and counts
// everything before it as processed (so the next commit stores offset, as Kafka commits positions).
// Partitions not owned are ignored. Use it in OnAssigned to start a partition elsewhere than its
// committed offset.
func (g *GroupConsumer) Seek(topic string, partition int32, offset int64) {
	g.seek(tp{topic, partition}, offset)
}

func (g *GroupConsumer) seek(k tp, offset int64) {
	g.mu.Lock()
	owned := g.parts[k] != nil
	g.mu.Unlock()
	if !owned {
		return
	}
	// The consumer first, then the position and the mark: a PollFunc whose take raced the Seek
	// either finds the mark at its part (and moves nothing) or sees its move overwritten here before
	// its leave, which finds the mark; either way the position ends at the Seek's offset.
	g.c.Seek(k.topic, k.partition, offset)
	g.mu.Lock()
	if p := g.parts[k]; p != nil {
		p.delivered, p.processed = pos{offset, -1}, pos{offset, -1}
		if g.gate != nil {
			g.gate.sought[k] = true // a PollFunc in progress must not move it past the Seek
		}
	}
	g.mu.Unlock()
}

// Pause stops fetching owned partitions and holds back their buffered records until Resume (see
// Consumer.Pause); the member keeps them. A rebalance that revokes and later re-assigns a partition
// starts it unpaused, as Kafka does.
func (g *GroupConsumer) Pause(partitions ...TopicPartition) { g.c.Pause(partitions...) }

// Resume undoes Pause.
func (g *GroupConsumer) Resume(partitions ...TopicPartition) { g.c.Resume(partitions...) }

// Paused returns the paused partitions, sorted.
func (g *GroupConsumer) Paused() []TopicPartition { return g.c.Paused() }

// Assignment returns the partitions the application owns now (announced by OnAssigned and not yet
// revoked or lost), sorted.
func (g *GroupConsumer) Assignment() []TopicPartition {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]TopicPartition, 0, len(g.parts))
	for k := range g.parts {
		out = append(out, TopicPartition{k.topic, k.partition})
	}
	sortTopicPartitions(out)
	return out
}

// Position returns the offset of the next record Poll returns for an owned partition (the offset
// CommitSync would commit for it), or -1 when the partition is not owned. It still answers in OnRevoked
// for the partitions being revoked.
func (g *GroupConsumer) Position(topic string, partition int32) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p := g.parts[tp{topic, partition}]; p != nil {
		return p.delivered.offset
	}
	return -1
}

// HighWatermark returns an owned partition's high watermark from the latest fetch, or -1 (see
// Consumer.HighWatermark).
func (g *GroupConsumer) HighWatermark(topic string, partition int32) int64 {
	return g.c.HighWatermark(topic, partition)
}

// MemberID returns the member id the coordinator gave this member ("" before it joined).
func (g *GroupConsumer) MemberID() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.memberID
}

// GroupMetadata returns the member's group id, member id and member epoch as of now, for
// Producer.SendOffsetsToTransaction: the group's coordinator accepts the transaction's offsets only
// from the member that owns the partitions at that epoch (KIP-447), so a member that lost them to a
// rebalance cannot commit them. Take it right before SendOffsetsToTransaction. Kafka:
// KafkaConsumer.groupMetadata().
func (g *GroupConsumer) GroupMetadata() GroupMetadata {
	g.mu.Lock()
	defer g.mu.Unlock()
	return GroupMetadata{GroupID: g.group, MemberID: g.memberID, MemberEpoch: g.epoch}
}

// MemberEpoch returns the member epoch last received (0 while joining).
func (g *GroupConsumer) MemberEpoch() int32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.epoch
}

// Close ends membership cleanly: it stops the heartbeats, commits every record Poll returned (with
// auto-commit on: Close counts them as processed), runs OnRevoked for the partitions still owned, and
// leaves the group (member epoch -1, or -2 for a static member, whose partitions then stay reserved
// for its session timeout), so the partitions move to other members at once. A member that was fenced
// and has not joined again commits nothing. It then closes the connections; Poll returns ErrClosed.
// Call it from Poll's goroutine, or after that goroutine stopped polling. It returns the error of the
// final commit, if any.
func (g *GroupConsumer) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	started := g.started
	g.mu.Unlock()
	wake(g.eventCh) // a Poll waiting returns ErrClosed
	g.resolvers.Wait()

	var errs []error
	g.mu.Lock()
	member := g.memberID != "" && g.epoch > 0 && !g.lostPending && g.fatal == nil
	var list []TopicPartition
	var keys []tp
	for k := range g.parts {
		keys = append(keys, k)
		list = append(list, TopicPartition{k.topic, k.partition})
	}
	sortTopicPartitions(list)
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.consumer.common.requestTimeout)
	defer cancel()
	// The final commit goes while the heartbeats still run, as Kafka's consumer does on close: if the
	// group moved the member's epoch meanwhile, a heartbeat brings the new one and the commit's retry
	// carries it (with the heartbeats stopped it would stay STALE_MEMBER_EPOCH to the end).
	if member && g.cfg.autoCommit && len(keys) > 0 {
		if err := g.commit(ctx, g.snapshot(true, keys)); err != nil {
			errs = append(errs, fmt.Errorf("final commit of group %q: %w", g.group, err))
		}
	}
	g.hbCancel()
	if started {
		<-g.hbDone
	}
	if member {
		if g.cfg.onRevoked != nil && len(list) > 0 {
			g.cfg.onRevoked(g.ctx, g, list)
		}
		g.leave(ctx)
	}
	g.mu.Lock()
	if g.autoTimer != nil {
		g.autoTimer.Stop()
	}
	g.mu.Unlock()
	g.cancel()
	g.wg.Wait()
	if err := g.c.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// leave sends the leave heartbeat: -1, or -2 for a static member. Failures are logged: the session
// timeout removes a member that could not say goodbye.
func (g *GroupConsumer) leave(ctx context.Context) {
	g.mu.Lock()
	req := &runnelv1.GroupHeartbeatRequest{GroupId: g.group, MemberId: g.memberID, MemberEpoch: -1, InstanceId: g.cfg.instanceID}
	g.mu.Unlock()
	if g.cfg.instanceID != "" {
		req.MemberEpoch = -2
	}
	err := g.coord.call(ctx, func(ctx context.Context, gc runnelv1.GroupsClient) error {
		_, err := gc.Heartbeat(ctx, req)
		return wireErr(err)
	})
	if err != nil {
		g.log.Warn("leaving the group failed; the session timeout will remove the member", "group", g.group, "member", req.MemberId, "err", err)
	}
}

// crash abandons the consumer as a crashed process would: no commit, no leave heartbeat, connections
// cut. The coordinator removes the member after its session timeout. For tests (export_test.go).
func (g *GroupConsumer) crash() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.closed, g.crashed = true, true
	started := g.started
	if g.autoTimer != nil {
		g.autoTimer.Stop()
	}
	g.mu.Unlock()
	wake(g.eventCh)
	g.cancel()
	if started {
		<-g.hbDone
	}
	g.resolvers.Wait()
	g.wg.Wait()
	g.commitMu.Lock() // a commit in flight has ended (its context is cancelled)
	g.commitMu.Unlock()
	g.c.Close()
}

// Heartbeat loop.

// heartbeatLoop owns membership: join, heartbeats, applying assignments, rejoining after fencing.
func (g *GroupConsumer) heartbeatLoop() {
	defer close(g.hbDone)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	attempts := 0
	g.mu.Lock()
	g.lastHB = time.Now()
	g.mu.Unlock()
	for {
		var wait time.Duration
		req, gen, ok := g.nextHeartbeat()
		if !ok {
			wait = time.Hour // OnLost has not run yet: Poll wakes the loop when it has
		} else {
			sent := time.Now()
			resp, err := g.sendHeartbeat(req)
			if g.hbCtx.Err() != nil {
				return
			}
			if err == nil {
				attempts = 0
				wait = g.onHeartbeat(req, resp, gen, sent)
			} else {
				wait = g.onHeartbeatError(err, attempts)
				attempts++
			}
			if g.stopped() {
				return
			}
		}
		if wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-g.hbWake:
				if !timer.Stop() {
					<-timer.C
				}
			case <-g.hbCtx.Done():
				return
			}
		} else if g.hbCtx.Err() != nil {
			return
		}
	}
}

// stopped reports whether the loop must end: closed, or a fatal error.
func (g *GroupConsumer) stopped() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed || g.fatal != nil
}

// nextHeartbeat builds the next heartbeat, first releasing the revocations Poll acknowledged. ok is
// false while the member waits for OnLost before joining again.
func (g *GroupConsumer) nextHeartbeat() (*runnelv1.GroupHeartbeatRequest, int, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range g.acked {
		delete(g.owned, k)
		delete(g.revoking, k)
	}
	g.acked = g.acked[:0]
	if g.lostPending {
		return nil, g.gen, false
	}
	req := &runnelv1.GroupHeartbeatRequest{GroupId: g.group, MemberId: g.memberID, MemberEpoch: g.epoch,
		InstanceId: g.cfg.instanceID, RackId: g.cfg.rackID, ServerAssignor: g.cfg.assignor,
		RebalanceTimeoutMs: int32(g.cfg.rebalanceTimeout / time.Millisecond),
		SessionTimeoutMs:   int32(g.cfg.sessionTimeout / time.Millisecond)}
	if g.epoch == 0 || g.subSent != g.subVer {
		req.SubscribedTopicNames, req.SubscribedTopicRegex = g.topics, g.regex
	} else {
		req.SubscriptionUnchanged = true
	}
	owned := make([]TopicPartition, 0, len(g.owned)+len(g.resolving))
	for k := range g.owned {
		owned = append(owned, TopicPartition{k.topic, k.partition})
	}
	// Partitions of the target whose start positions are being looked up (resolve) count as owned:
	// the coordinator frees at once what a heartbeat does not list, and resolve would then start them
	// here although another member may have been given them. Listed, they stay this member's until a
	// heartbeat after resolve dropped them (no longer in the target) or revoked them.
	for k := range g.resolving {
		if g.target[k] && !g.owned[k] {
			owned = append(owned, TopicPartition{k.topic, k.partition})
		}
	}
	req.OwnedPartitions = toProtoPartitions(owned)
	return req, g.gen, true
}

// sessionTimeout is the session timeout the coordinator applies: the option, or the broker's default.
func (g *GroupConsumer) sessionTimeout() time.Duration {
	if g.cfg.sessionTimeout > 0 {
		return g.cfg.sessionTimeout
	}
	return 45 * time.Second // group.consumer.session.timeout.ms's default
}

// expiryLocked returns when the member must consider its partitions lost if no heartbeat is answered
// by then, and whether it owns any. The coordinator's session timer runs from when it received the
// last heartbeat, which is after it was sent: expiring at nine tenths of the session timeout after
// sending leaves the member time to stop before another member can be given its partitions.
func (g *GroupConsumer) expiryLocked() (time.Time, bool) {
	return g.lastHB.Add(g.sessionTimeout() * 9 / 10), len(g.owned) > 0
}

// sendHeartbeat sends one heartbeat to the coordinator, bounded by the request timeout and, while the
// member owns partitions, by its session expiry (a heartbeat stuck on a dead connection must not keep
// the member reading past it).
func (g *GroupConsumer) sendHeartbeat(req *runnelv1.GroupHeartbeatRequest) (*runnelv1.GroupHeartbeatResponse, error) {
	timeout := g.cfg.consumer.common.requestTimeout
	g.mu.Lock()
	if exp, owns := g.expiryLocked(); owns {
		timeout = min(timeout, max(time.Until(exp), 10*time.Millisecond))
	}
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(g.hbCtx, timeout)
	defer cancel()
	gc, err := g.coord.client(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := gc.Heartbeat(ctx, req)
	if err != nil {
		if ctx.Err() != nil && g.hbCtx.Err() == nil {
			err = rerr.New(runnelv1.ErrorCode_REQUEST_TIMED_OUT, "heartbeat unanswered after %v", timeout)
		}
		err = wireErr(err)
		g.coord.failed(err)
		return nil, err
	}
	return resp, nil
}

// onHeartbeat applies a heartbeat's answer and returns the wait before the next one.
func (g *GroupConsumer) onHeartbeat(req *runnelv1.GroupHeartbeatRequest, resp *runnelv1.GroupHeartbeatResponse, gen int, sent time.Time) time.Duration {
	g.mu.Lock()
	if gen != g.gen {
		g.mu.Unlock()
		return 0 // the member lost everything meanwhile; start over
	}
	if g.epoch == 0 || resp.MemberEpoch != g.epoch {
		g.log.Debug("group member epoch", "group", g.group, "member", resp.MemberId, "epoch", resp.MemberEpoch)
	}
	g.memberID, g.epoch = resp.MemberId, resp.MemberEpoch
	g.lastHB = sent
	if !req.SubscriptionUnchanged {
		// The subscription this request carried is known now, unless Subscribe changed it meanwhile.
		if slices.Equal(req.SubscribedTopicNames, g.topics) && req.SubscribedTopicRegex == g.regex {
			g.subSent = g.subVer
		}
	}
	if resp.Assignment != nil {
		g.target = map[tp]bool{}
		for _, k := range fromProtoPartitions(resp.Assignment.Partitions) {
			g.target[tp{k.Topic, k.Partition}] = true
		}
	}
	interval := time.Duration(resp.HeartbeatIntervalMs) * time.Millisecond
	if interval <= 0 {
		interval = time.Second
	}
	if g.cfg.heartbeatInterval > 0 {
		interval = min(interval, g.cfg.heartbeatInterval)
	}
	g.interval = interval
	g.mu.Unlock()
	g.reconcile(gen)
	return interval
}

// reconcile moves the member towards the assignment last received: partitions no longer in it stop
// being fetched and are queued for Poll to revoke; new ones get their start positions looked up on
// another goroutine (resolve), so heartbeats go on meanwhile however slow the look-up, and are then
// queued for Poll to start.
func (g *GroupConsumer) reconcile(gen int) {
	g.mu.Lock()
	var revoke, add []tp
	for k := range g.owned {
		if !g.target[k] && !g.revoking[k] {
			revoke = append(revoke, k)
			g.revoking[k] = true
		}
	}
	for k := range g.target {
		if !g.owned[k] && !g.resolving[k] {
			add = append(add, k)
			g.resolving[k] = true
		}
	}
	sortTPs(revoke)
	sortTPs(add)
	if len(revoke) > 0 {
		g.events = append(g.events, groupEvent{kind: evRevoke, gen: gen, parts: revoke})
	}
	if len(add) > 0 {
		g.resolvers.Add(1)
		go g.resolve(gen, add)
	}
	g.mu.Unlock()
	for _, k := range revoke {
		g.c.Unassign(k.topic, k.partition) // stop fetching and drop what is buffered, at once
	}
	if len(revoke) > 0 {
		wake(g.eventCh)
	}
}

// resolve looks up where newly assigned partitions start, then makes them owned and queues them for
// Poll, and wakes the heartbeat loop to report them owned at once. After a failure it waits a backoff
// before the partitions may be tried again (at a later heartbeat).
func (g *GroupConsumer) resolve(gen int, add []tp) {
	defer g.resolvers.Done()
	start, err := g.startPositions(add)
	if err != nil {
		if g.hbCtx.Err() == nil {
			g.log.Warn("start positions of assigned partitions unknown; retrying", "group", g.group, "err", err)
		}
		_ = sleep(g.hbCtx, g.cl.backoff(0))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range add {
		delete(g.resolving, k)
	}
	if err != nil || gen != g.gen || g.closed {
		return // the partitions are gone (lost) or will be tried again
	}
	var got []tp
	for _, k := range add {
		if g.target[k] && !g.owned[k] { // still assigned: an assignment may have moved on meanwhile
			g.owned[k] = true
			got = append(got, k)
		}
	}
	if len(got) > 0 {
		g.events = append(g.events, groupEvent{kind: evAssign, gen: gen, parts: got, start: start})
		wake(g.eventCh)
		wake(g.hbWake)
	}
}

// startPositions returns where newly assigned partitions start: the group's committed offset, or the
// auto-offset-reset position.
func (g *GroupConsumer) startPositions(add []tp) (map[tp]startPos, error) {
	ctx, cancel := context.WithTimeout(g.hbCtx, g.cfg.consumer.common.requestTimeout)
	defer cancel()
	list := make([]TopicPartition, len(add))
	topics := map[string]bool{}
	for i, k := range add {
		list[i] = TopicPartition{k.topic, k.partition}
		topics[k.topic] = true
	}
	committed, err := fetchOffsets(ctx, g.coord, g.group, list, g.cfg.consumer.isolation == ReadCommitted)
	if err != nil {
		return nil, fmt.Errorf("fetch committed offsets: %w", err)
	}
	// Leaders for the fetchers (and for resolving reset positions).
	if _, err := g.cl.metadata(ctx, slices.Sorted(maps.Keys(topics))); err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	out := make(map[tp]startPos, len(add))
	for _, k := range add {
		c, ok := committed[TopicPartition{k.topic, k.partition}]
		if ok && c.Offset >= 0 {
			out[k] = startPos{offset: c.Offset, committed: c.Offset}
			continue
		}
		off, _, err := listOffsets(ctx, g.cl, k.topic, k.partition, g.cfg.resetOffset, true, g.cfg.consumer.isolation)
		if err != nil {
			return nil, err
		}
		out[k] = startPos{offset: off, committed: -1}
	}
	return out, nil
}

// onHeartbeatError handles a failed heartbeat and returns the wait before the next one.
func (g *GroupConsumer) onHeartbeatError(err error, attempts int) time.Duration {
	switch {
	case isCode(err, runnelv1.ErrorCode_FENCED_MEMBER_EPOCH), isCode(err, runnelv1.ErrorCode_UNKNOWN_MEMBER_ID):
		g.log.Info("group member fenced: its partitions are lost; joining again", "group", g.group, "err", err)
		g.loseAll(nil)
		return 0
	case retriable(err):
		wait := g.cl.backoff(attempts)
		g.mu.Lock()
		exp, owns := g.expiryLocked()
		g.mu.Unlock()
		switch {
		case owns && !time.Now().Before(exp):
			// The coordinator is about to remove the member, if it has not already, and give its
			// partitions to others: stop reading them before someone else reads them too.
			g.log.Warn("no heartbeat answered within the session timeout: partitions lost", "group", g.group, "err", err)
			g.loseAll(nil)
		case owns:
			wait = min(wait, time.Until(exp)) // retry, at the latest when the session would expire
			g.log.Debug("heartbeat failed; retrying", "group", g.group, "err", err)
		default:
			g.log.Debug("heartbeat failed; retrying", "group", g.group, "err", err)
		}
		return wait
	default:
		fatal := fmt.Errorf("group %q: membership ended: %w", g.group, err)
		g.log.Warn("group membership ended", "group", g.group, "err", err)
		g.loseAll(fatal)
		return 0
	}
}

// loseAll drops every partition without a commit: the application's are queued for OnLost, the rest
// forgotten, and the member joins again with epoch 0 once Poll has run OnLost (or stops, with fatal).
func (g *GroupConsumer) loseAll(fatal error) {
	g.mu.Lock()
	g.gen++
	drop := make(map[tp]bool, len(g.owned)+len(g.parts))
	for k := range g.owned {
		drop[k] = true
	}
	var lost []tp
	for k := range g.parts {
		drop[k] = true
		lost = append(lost, k)
	}
	sortTPs(lost)
	g.events = g.events[:0] // steps not yet taken concern partitions that are gone
	if len(lost) > 0 {
		g.events = append(g.events, groupEvent{kind: evLost, gen: g.gen, parts: lost})
		g.lostPending = fatal == nil
	}
	g.owned, g.revoking, g.target = map[tp]bool{}, map[tp]bool{}, map[tp]bool{}
	g.acked = g.acked[:0]
	g.epoch = 0
	if fatal != nil {
		g.fatal = fatal
	}
	g.mu.Unlock()
	for k := range drop {
		g.c.Unassign(k.topic, k.partition)
	}
	wake(g.eventCh)
}

func sortTPs(ks []tp) {
	slices.SortFunc(ks, func(a, b tp) int {
		if a.topic != b.topic {
			if a.topic < b.topic {
				return -1
			}
			return 1
		}
		return int(a.partition) - int(b.partition)
	})
}
