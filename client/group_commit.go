package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// OffsetAndMetadata is an offset to commit for a partition: Offset is the next offset to read (the
// offset after the last processed record), Metadata a string kept with it (at most 4096 bytes by
// default on the broker: OFFSET_METADATA_TOO_LARGE). Kafka: OffsetAndMetadata.
type OffsetAndMetadata struct {
	Offset   int64
	Metadata string
}

// CommittedOffset is a group's committed offset of one partition, as FetchOffsets returns it.
type CommittedOffset struct {
	Topic     string
	Partition int32
	// Offset is the next offset to read, or -1 when the group has no commit for the partition.
	Offset int64
	// LeaderEpoch is the leader epoch of the last processed record, or -1.
	LeaderEpoch int32
	Metadata    string
	// CommitTime is when the coordinator accepted the commit (millisecond precision); zero when none.
	CommitTime time.Time
}

// commitSnap is what one commit stores: offsets taken at one moment, numbered so that a commit taken
// earlier never overwrites one taken later (async commits may queue behind each other).
type commitSnap struct {
	seq     uint64
	offsets map[tp]commitOffset
	owned   bool // taken from owned partitions: commit only those still owned
}

type commitOffset struct {
	offset   int64
	epoch    int32
	metadata string
}

// snapshot takes the offsets to commit of the given owned partitions (all when only is nil): delivered
// (everything Poll returned) or processed. Partitions whose offset is already committed are left out.
func (g *GroupConsumer) snapshot(delivered bool, only []tp) commitSnap {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.commitSeq++
	s := commitSnap{seq: g.commitSeq, offsets: map[tp]commitOffset{}, owned: true}
	add := func(k tp, p *gpart) {
		at := p.processed
		if delivered {
			at = p.delivered
		}
		if at.offset != p.committed {
			s.offsets[k] = commitOffset{offset: at.offset, epoch: at.epoch}
		}
	}
	if only == nil {
		for k, p := range g.parts {
			add(k, p)
		}
	} else {
		for _, k := range only {
			if p := g.parts[k]; p != nil {
				add(k, p)
			}
		}
	}
	return s
}

// maybeAutoCommit starts an asynchronous commit of the processed offsets when the auto-commit interval
// has passed. Commits happen in Poll, as Kafka's do: between Polls nothing new counts as processed.
func (g *GroupConsumer) maybeAutoCommit() {
	if !g.cfg.autoCommit {
		return
	}
	now := time.Now()
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	if g.nextAuto.IsZero() {
		g.nextAuto = now.Add(g.cfg.autoCommitInterval)
		g.autoTimer = time.AfterFunc(g.cfg.autoCommitInterval, func() { wake(g.eventCh) })
	}
	if now.Before(g.nextAuto) || g.epoch <= 0 {
		g.mu.Unlock()
		return
	}
	g.nextAuto = now.Add(g.cfg.autoCommitInterval)
	g.autoTimer.Reset(g.cfg.autoCommitInterval)
	g.mu.Unlock()
	s := g.snapshot(false, nil)
	if len(s.offsets) == 0 {
		return
	}
	g.async(func() {
		if err := g.commit(g.ctx, s); err != nil && g.ctx.Err() == nil {
			g.log.Warn("auto-commit failed; the next one retries", "group", g.group, "err", err)
		}
	})
}

// async runs fn on a goroutine Close waits for; after Close it does not run it and reports false.
func (g *GroupConsumer) async(fn func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		fn()
	}()
	return true
}

// CommitSync commits, for every owned partition, the offset after the last record Poll returned (the
// caller says so it has processed them; Kafka's commitSync()), and waits for the coordinator's answer,
// retrying retriable errors within the request timeout and ctx. A partition whose commit failed is
// named in a *PartitionError (joined with the others'); a member fenced meanwhile gets
// FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID.
func (g *GroupConsumer) CommitSync(ctx context.Context) error {
	return g.commit(ctx, g.snapshot(true, nil))
}

// CommitAsync commits like CommitSync without waiting, then calls onDone (if not nil) on another
// goroutine with the offsets it committed and the error. Commits land in the order they were made: an
// older one never overwrites a newer one. Kafka: commitAsync(callback).
func (g *GroupConsumer) CommitAsync(onDone func(offsets map[TopicPartition]OffsetAndMetadata, err error)) {
	s := g.snapshot(true, nil)
	ok := g.async(func() {
		err := g.commit(g.ctx, s)
		if onDone != nil {
			onDone(s.public(), err)
		}
	})
	if !ok && onDone != nil {
		go onDone(s.public(), ErrClosed)
	}
}

// CommitOffsets commits the given offsets (each the next offset to read) and waits, as CommitSync. The
// member may commit only partitions it owns (STALE_MEMBER_EPOCH for others); offsets below 0 or beyond
// the log end offset give OFFSET_OUT_OF_RANGE. Kafka: commitSync(offsets).
func (g *GroupConsumer) CommitOffsets(ctx context.Context, offsets map[TopicPartition]OffsetAndMetadata) error {
	g.mu.Lock()
	g.commitSeq++
	s := commitSnap{seq: g.commitSeq, offsets: make(map[tp]commitOffset, len(offsets))}
	g.mu.Unlock()
	for k, o := range offsets {
		s.offsets[tp{k.Topic, k.Partition}] = commitOffset{offset: o.Offset, epoch: -1, metadata: o.Metadata}
	}
	return g.commit(ctx, s)
}

func (s commitSnap) public() map[TopicPartition]OffsetAndMetadata {
	out := make(map[TopicPartition]OffsetAndMetadata, len(s.offsets))
	for k, o := range s.offsets {
		out[TopicPartition{k.topic, k.partition}] = OffsetAndMetadata{Offset: o.offset, Metadata: o.metadata}
	}
	return out
}

// maxStaleRetries bounds retries of partitions answered STALE_MEMBER_EPOCH on their own: a commit
// racing a heartbeat that moved the member's epoch succeeds on the next try, while a partition the
// member does not own never will.
const maxStaleRetries = 3

// commit stores a snapshot with the member's id and current epoch, one commit at a time. Retriable
// errors and STALE_MEMBER_EPOCH (the member's epoch moved while the commit was on its way) are retried
// with backoff within the request timeout and ctx.
func (g *GroupConsumer) commit(ctx context.Context, s commitSnap) error {
	if len(s.offsets) == 0 {
		return nil
	}
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, g.cfg.consumer.common.requestTimeout)
	defer cancel()
	pending := make(map[tp]commitOffset, len(s.offsets))
	g.mu.Lock()
	for k, o := range s.offsets {
		p := g.parts[k]
		if p == nil && s.owned {
			continue // revoked or lost since the snapshot
		}
		if p != nil && (p.commitSeq > s.seq || p.assignedAt > s.seq) {
			continue // a later commit stored a newer offset, or the partition was assigned again since
		}
		pending[k] = o
	}
	g.mu.Unlock()
	var errs []error
	stale := map[tp]int{}
	for attempt := 0; len(pending) > 0; attempt++ {
		g.mu.Lock()
		member, epoch, crashed := g.memberID, g.epoch, g.crashed
		g.mu.Unlock()
		if crashed {
			return ErrClosed
		}
		if member == "" || epoch <= 0 {
			errs = append(errs, rerr.New(runnelv1.ErrorCode_UNKNOWN_MEMBER_ID, "commit to group %q: the consumer is not a member of the group now (joining)", g.group))
			break
		}
		req := &runnelv1.CommitOffsetsRequest{GroupId: g.group, MemberId: member, MemberEpoch: epoch}
		for k, o := range pending {
			req.Partitions = append(req.Partitions, &runnelv1.CommitPartition{Topic: k.topic, Partition: k.partition,
				Offset: o.offset, LeaderEpoch: o.epoch, Metadata: o.metadata})
		}
		var resp *runnelv1.CommitOffsetsResponse
		gc, err := g.coord.client(ctx)
		if err == nil {
			resp, err = gc.CommitOffsets(ctx, req)
			if err != nil {
				err = wireErr(err)
				g.coord.failed(err)
			}
		}
		if err != nil {
			if !retriable(err) && !isCode(err, runnelv1.ErrorCode_STALE_MEMBER_EPOCH) {
				errs = append(errs, fmt.Errorf("commit to group %q: %w", g.group, err))
				break
			}
			if ctx.Err() != nil || sleep(ctx, g.cl.backoff(attempt)) != nil {
				errs = append(errs, fmt.Errorf("commit to group %q: gave up after %d attempts: %w", g.group, attempt+1, err))
				break
			}
			continue
		}
		retry := false
		for _, r := range resp.Partitions {
			k := tp{r.Topic, r.Partition}
			o, ok := pending[k]
			if !ok {
				continue
			}
			perr := rerr.FromInfo(r.Error)
			if perr == nil {
				delete(pending, k)
				g.mu.Lock()
				if p := g.parts[k]; p != nil && p.commitSeq <= s.seq {
					p.committed, p.commitSeq = o.offset, s.seq
				}
				g.mu.Unlock()
				continue
			}
			if (retriable(perr) || isCode(perr, runnelv1.ErrorCode_STALE_MEMBER_EPOCH)) && stale[k] < maxStaleRetries {
				stale[k]++
				retry = true
				continue
			}
			delete(pending, k)
			errs = append(errs, &PartitionError{Topic: r.Topic, Partition: r.Partition, Err: perr})
		}
		for k := range pending { // not in the answer at all
			if !retry {
				errs = append(errs, &PartitionError{Topic: k.topic, Partition: k.partition,
					Err: rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "commit answer without the partition")})
				delete(pending, k)
			}
		}
		if len(pending) > 0 && (ctx.Err() != nil || sleep(ctx, g.cl.backoff(attempt)) != nil) {
			for k := range pending {
				errs = append(errs, &PartitionError{Topic: k.topic, Partition: k.partition, Err: fmt.Errorf("commit not confirmed: %w", ctx.Err())})
			}
			break
		}
	}
	return errors.Join(errs...)
}

// Committed returns the group's committed offsets of the given partitions (Offset -1 where there is
// none), or of every partition the group has committed when none is given. Kafka: committed().
func (g *GroupConsumer) Committed(ctx context.Context, partitions ...TopicPartition) (map[TopicPartition]CommittedOffset, error) {
	return fetchOffsets(ctx, g.coord, g.group, partitions, g.cfg.consumer.isolation == ReadCommitted)
}

// fetchOffsets asks the group's coordinator for committed offsets. With requireStable (a read_committed
// member, KIP-447) a partition whose offsets a transaction still holds answers UNSTABLE_OFFSET_COMMIT,
// and the call is retried with backoff (within the request timeout and ctx) until the transaction has
// ended, so the member does not start from an offset about to be replaced.
func fetchOffsets(ctx context.Context, coord *coordinator, group string, partitions []TopicPartition, requireStable bool) (map[TopicPartition]CommittedOffset, error) {
	var out map[TopicPartition]CommittedOffset
	err := coord.call(ctx, func(ctx context.Context, gc runnelv1.GroupsClient) error {
		resp, err := gc.FetchOffsets(ctx, &runnelv1.FetchOffsetsRequest{GroupId: group, Partitions: toProtoPartitions(partitions),
			RequireStable: requireStable})
		if err != nil {
			return wireErr(err)
		}
		out = make(map[TopicPartition]CommittedOffset, len(resp.Offsets))
		var errs []error
		for _, o := range resp.Offsets {
			if err := rerr.FromInfo(o.Error); err != nil {
				if isCode(err, runnelv1.ErrorCode_UNSTABLE_OFFSET_COMMIT) {
					// Retriable and not final: the whole call is made again after a backoff.
					return fmt.Errorf("%s-%d: %w", o.Topic, o.Partition, err)
				}
				errs = append(errs, &PartitionError{Topic: o.Topic, Partition: o.Partition, Err: err})
				continue
			}
			c := CommittedOffset{Topic: o.Topic, Partition: o.Partition, Offset: o.Offset, LeaderEpoch: o.LeaderEpoch, Metadata: o.Metadata}
			if o.Offset < 0 {
				c.Offset, c.LeaderEpoch = -1, -1
			}
			if o.CommitTimestampMs >= 0 && o.Offset >= 0 {
				c.CommitTime = time.UnixMilli(o.CommitTimestampMs)
			}
			out[TopicPartition{o.Topic, o.Partition}] = c
		}
		if err := errors.Join(errs...); err != nil {
			return final{err}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fetch committed offsets of group %q: %w", group, err)
	}
	return out, nil
}
