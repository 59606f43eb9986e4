package plog

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/runnel-io/runnel/client/batch"
)

// CompactConfig is what one Compact run needs from a compacted topic's config (the topiccfg names are
// in brackets). The broker builds it from the topic's config on every run, so changes apply at once.
type CompactConfig struct {
	// DeleteRetentionMs [delete.retention.ms]: a tombstone that is the latest record of its key stays
	// this long after the clean that first kept it, then the next clean removes it.
	DeleteRetentionMs int64
	// MinCleanableDirtyRatio [min.cleanable.dirty.ratio]: clean when the bytes written since the last
	// clean (the dirty part of the closed segments) are at least this share of all closed bytes.
	MinCleanableDirtyRatio float64
	// MinCompactionLagMs [min.compaction.lag.ms]: batches whose running max timestamp is younger than
	// this are not cleaned yet (0: no lag).
	MinCompactionLagMs int64
	// MaxCompactionLagMs [max.compaction.lag.ms]: clean regardless of the dirty ratio once the first
	// dirty batch's max timestamp is older than this (<= 0 or math.MaxInt64: no limit).
	MaxCompactionLagMs int64
	// SegmentMs [segment.ms, capped by max.compaction.lag.ms]: an active segment whose first batch was
	// written longer ago than this is rolled by Compact even if no append came to roll it (<= 0:
	// DefaultSegmentMs).
	SegmentMs int64
	// StableEnd, when set, returns the partition's last stable offset (KIP-98): the first offset of
	// its earliest open transaction, else the HW. The cleaner neither cleans nor maps keys at or after
	// it, as Kafka's cleaner stops at the first unstable offset: a record of an open transaction may
	// still be aborted, and must not make the committed version of its key obsolete. It is called only
	// when the partition is due, since working it out may read the log's tail.
	StableEnd func() (int64, error)
}

// Reasons a Compact run cleaned (CompactStats.Reason).
const (
	ReasonDirtyRatio       = "dirty-ratio"        // min.cleanable.dirty.ratio reached
	ReasonMaxCompactionLag = "max-compaction-lag" // a dirty record waited longer than max.compaction.lag.ms
	ReasonTombstones       = "tombstone-expiry"   // a kept tombstone passed its delete horizon
)

// CompactStats says what one Compact run found and did.
type CompactStats struct {
	// Reason is why it cleaned (Reason* constants), or "" when the partition was not due.
	Reason string
	// The range considered: [LogStart, CleanableEnd) is cleaned, [FirstDirty, CleanableEnd) was
	// written since the last clean. CleanableEnd is the least of the active segment's start, the HW,
	// the first batch younger than min.compaction.lag.ms and the last batch's base (never cleaned).
	LogStart, FirstDirty, CleanableEnd int64
	// CleanBytes and DirtyBytes are the bytes of [LogStart, FirstDirty) and [FirstDirty,
	// CleanableEnd) before the run; DirtyRatio = DirtyBytes / (CleanBytes + DirtyBytes).
	CleanBytes, DirtyBytes int64
	DirtyRatio             float64
	// Keys is the number of distinct keys mapped from FirstDirty to the HW.
	Keys int
	// Batches read from the cleaned range, rewritten with fewer records, and removed (left empty).
	BatchesRead, BatchesRewritten, BatchesRemoved int
	// Records read from the cleaned range and removed from it (obsolete, keyless or expired
	// tombstones); TombstonesRemoved counts the expired tombstones among them.
	RecordsRead, RecordsRemoved, TombstonesRemoved int64
	// BytesRemoved is how much Size shrank.
	BytesRemoved int64
}

// Limits of one cleaner transaction: the rewritten batches of a group are held in memory until the group
// commits, and a Badger transaction holds a bounded number of keys. Variables so tests can make groups
// small.
var (
	cleanGroupBytes   = 4 << 20
	cleanGroupBatches = 512
)

// testHookCleanGroup, when set by a test, runs after each group a clean commits before its last, so a
// test can interrupt a clean between groups as a crash would.
var testHookCleanGroup func()

// Compact runs the log cleaner once over the partition if it is due, as Kafka's cleaner does for a
// cleanup.policy=compact log: it keeps the latest record of every key and never moves offsets.
//
// It first rolls an active segment older than cfg.SegmentMs that has nothing in flight. It considers
// only the closed segments: batches below the active segment's start and the HW, older than
// min.compaction.lag.ms, and never the last batch. It is due when the dirty ratio reaches
// cfg.MinCleanableDirtyRatio, when max.compaction.lag.ms has passed for the first dirty batch, or when a
// kept tombstone's delete horizon has passed. Then it maps every key from the cleaner checkpoint to the
// HW (the dirty part and the active tail: a key rewritten in the tail makes older copies obsolete; the
// part below the checkpoint holds each key at most once already) to its latest offset, and rewrites each
// batch of the cleaned range keeping only records that are the latest of their key (batch.FilterRecords:
// same base offset and last offset delta, producer fields and codec, new CRC). Keyless records are
// dropped, as Kafka's cleaner does (produce refuses them on compacted topics). Tombstones are kept until
// their batch's delete horizon (the clean that first kept them + cfg.DeleteRetentionMs), then removed.
// A batch left without records is deleted; readers skip the gap (Read) and the log start stays.
//
// Safety: the rewrite commits in Badger transactions of whole batches, each one leaving a valid log (a
// reader's snapshot sees a batch either old or new, both valid), and the checkpoint moves only with the
// last one, so a crash or ctx leaves a valid mixture that the next run finishes. It holds the
// partition's maintenance lock (no retention meanwhile), touches nothing at or after the active segment
// (appends go on), and stops with ErrPartitionDeleted if the partition is deleted. now is the cleaner's
// clock (tests inject it). Errors (wrapped): ctx.Err(); ErrPartitionDeleted; ErrClosed; Badger errors.
// Stored batches that do not decode are kept as they are and logged.
func (p *Partition) Compact(ctx context.Context, now time.Time, cfg CompactConfig) (CompactStats, error) {
	s := p.s
	if err := s.acquire("compaction of " + p.id.String()); err != nil {
		return CompactStats{}, err
	}
	defer s.lifeMu.RUnlock()
	p.retMu.Lock()
	defer p.retMu.Unlock()
	nowMs := now.UnixMilli()
	segMs := cfg.SegmentMs
	if segMs <= 0 {
		segMs = DefaultSegmentMs
	}
	p.mu.Lock()
	if p.segBytes > 0 && p.next == p.durable && nowMs-p.segTime > segMs {
		// Kafka rolls only on append, so a quiet log's active segment is never cleaned. Rolling it
		// here once it is older than segment.ms (and nothing is being written) lets the cleaner reach
		// it; the next append starts a new segment and persists it.
		p.segBytes = 0
	}
	gone, start, hw := p.gone, p.logStart, p.hw
	segStart := p.segBase
	if p.segBytes == 0 {
		segStart = p.next
	}
	st := partState{logStart: p.logStart, floor: p.floor, checkpoint: p.checkpoint}
	p.mu.Unlock()
	if gone != nil {
		return CompactStats{}, p.check("compaction of")
	}

	txn := s.db.NewTransaction(false)
	defer txn.Discard()
	plan, err := p.planClean(txn, nowMs, cfg, start, hw, segStart, st.checkpoint)
	if err == nil && plan.stats.Reason != "" && cfg.StableEnd != nil {
		var stable int64
		if stable, err = cfg.StableEnd(); err == nil && stable < hw {
			hw = max(stable, start)
			plan, err = p.planClean(txn, nowMs, cfg, start, hw, segStart, st.checkpoint)
		}
	}
	if err != nil || plan.stats.Reason == "" {
		if err != nil {
			err = fmt.Errorf("compaction of %s: %w", p.id, err)
		}
		return plan.stats, err
	}
	keys, err := p.mapKeys(ctx, txn, plan.stats.FirstDirty, hw)
	if err != nil {
		return plan.stats, fmt.Errorf("compaction of %s: map keys: %w", p.id, err)
	}
	plan.stats.Keys = len(keys.latest)
	c := &cleaner{p: p, cfg: cfg, nowMs: nowMs, keys: keys, plan: plan, state: st}
	if err := c.clean(ctx, txn); err != nil {
		return c.plan.stats, fmt.Errorf("compaction of %s: %w", p.id, err)
	}
	return c.plan.stats, nil
}

// cleanPlan is the cleanable range of a run and what is known about it before any record is read.
type cleanPlan struct {
	stats    CompactStats
	horizons map[int64]int64 // base offset → delete horizon (ms), for batches below CleanableEnd
}

// planClean finds the cleanable range and decides whether the partition is due, from keys, the time
// index and the horizons, reading one batch header (the first dirty batch's, for max.compaction.lag.ms).
func (p *Partition) planClean(txn *badger.Txn, nowMs int64, cfg CompactConfig, start, hw, segStart, checkpoint int64) (cleanPlan, error) {
	plan := cleanPlan{stats: CompactStats{LogStart: start}}
	end := min(segStart, hw)
	if cfg.MinCompactionLagMs > 0 {
		// The time index rises with offsets: its first entry younger than the lag bounds the range,
		// as Kafka bounds it by the first segment with a too-young largest timestamp.
		tit := txn.NewIterator(badger.IteratorOptions{Prefix: p.tprefix, PrefetchValues: false})
		tit.Seek(timeKey(p.tprefix, nowMs-cfg.MinCompactionLagMs+1, 0))
		if tit.Valid() {
			_, base := timeKeyParts(tit.Item().Key())
			end = min(end, base)
		}
		tit.Close()
	}
	if hw > 0 {
		// The last batch is never cleaned, as Kafka's active segment always holds the last batch: a
		// reader at the end of the log always finds a batch that takes it to the HW, and the LEO
		// survives a restart without relying on the floor.
		if last, ok, err := p.floorBatch(txn, hw-1); err != nil {
			return plan, err
		} else if ok {
			end = min(end, last)
		}
	}
	firstDirty := min(max(checkpoint, start), max(end, start))
	plan.stats.FirstDirty, plan.stats.CleanableEnd = firstDirty, max(end, start)
	if end <= start {
		return plan, nil
	}

	firstDirtyMaxTs := int64(math.MinInt64)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: p.lprefix, PrefetchValues: false})
	for it.Seek(batchKey(p.lprefix, start)); it.Valid(); it.Next() {
		item := it.Item()
		base := batchKeyOffset(item.Key())
		if base >= end {
			break
		}
		n := storedValueSize(item.ValueSize())
		if base < firstDirty {
			plan.stats.CleanBytes += n
			continue
		}
		if plan.stats.DirtyBytes == 0 {
			err := item.Value(func(v []byte) error {
				h, err := batch.ParseHeader(v)
				firstDirtyMaxTs = h.MaxTimestamp
				return err
			})
			if err != nil {
				it.Close()
				return plan, fmt.Errorf("batch at %d: %w", base, err)
			}
		}
		plan.stats.DirtyBytes += n
	}
	it.Close()
	if total := plan.stats.CleanBytes + plan.stats.DirtyBytes; total > 0 {
		plan.stats.DirtyRatio = float64(plan.stats.DirtyBytes) / float64(total)
	}

	tombstonesDue := false
	plan.horizons = make(map[int64]int64)
	hit := txn.NewIterator(badger.IteratorOptions{Prefix: p.hprefix})
	for hit.Rewind(); hit.Valid(); hit.Next() {
		item := hit.Item()
		base := batchKeyOffset(item.Key())
		if base >= end {
			break
		}
		var horizon int64
		err := item.Value(func(v []byte) error {
			var err error
			horizon, err = decodeHorizon(v)
			return err
		})
		if err != nil {
			hit.Close()
			return plan, fmt.Errorf("delete horizon of batch %d: %w", base, err)
		}
		plan.horizons[base] = horizon
		tombstonesDue = tombstonesDue || horizon <= nowMs
	}
	hit.Close()

	dirty := plan.stats.DirtyBytes > 0
	switch {
	case dirty && plan.stats.DirtyRatio >= cfg.MinCleanableDirtyRatio:
		plan.stats.Reason = ReasonDirtyRatio
	case dirty && cfg.MaxCompactionLagMs > 0 && cfg.MaxCompactionLagMs < math.MaxInt64 &&
		firstDirtyMaxTs < nowMs-cfg.MaxCompactionLagMs:
		plan.stats.Reason = ReasonMaxCompactionLag
	case tombstonesDue:
		// Kafka's cleaner also takes a log with nothing dirty when a tombstone's horizon has passed,
		// so deletes disappear from quiet topics too.
		plan.stats.Reason = ReasonTombstones
	}
	return plan, nil
}

// keyMap maps keys to the offset of their latest record. Keys are stored as 128-bit hashes with seeds
// random per map, so memory does not grow with key length and colliding keys cannot be crafted; an
// accidental collision (odds ~n²/2¹²⁹) would drop the older of two records, as Kafka's MD5 map accepts.
type keyMap struct {
	seed1, seed2 maphash.Seed
	latest       map[[2]uint64]int64
	aborted      abortedSet // the aborted transactions of the mapped range
}

// abortedSet answers whether a stored batch belongs to an aborted transaction: a transactional data
// batch of a producer at or after the transaction's first offset and before its ABORT marker.
type abortedSet map[int64][]AbortedTxn

func newAbortedSet(as []AbortedTxn) abortedSet {
	if len(as) == 0 {
		return nil
	}
	m := abortedSet{}
	for _, a := range as {
		m[a.ProducerID] = append(m[a.ProducerID], a)
	}
	return m
}

func (m abortedSet) holds(h batch.Header) bool {
	if len(m) == 0 || !h.IsTransactional() || h.IsControl() {
		return false
	}
	for _, a := range m[h.ProducerID] {
		if a.FirstOffset <= h.BaseOffset && h.BaseOffset < a.LastOffset {
			return true
		}
	}
	return false
}

func (m *keyMap) hash(key []byte) [2]uint64 {
	return [2]uint64{maphash.Bytes(m.seed1, key), maphash.Bytes(m.seed2, key)}
}

// mapKeys maps every key of the batches in [from, hw) to its latest offset. Control batches carry no
// application keys; batches that do not decode are logged and left out (their records are kept).
func (p *Partition) mapKeys(ctx context.Context, txn *badger.Txn, from, hw int64) (*keyMap, error) {
	m := &keyMap{seed1: maphash.MakeSeed(), seed2: maphash.MakeSeed(), latest: make(map[[2]uint64]int64),
		aborted: newAbortedSet(p.AbortedTransactions(p.LogStartOffset(), hw))}
	it := txn.NewIterator(badger.IteratorOptions{Prefix: p.lprefix, PrefetchValues: false})
	defer it.Close()
	n := 0
	for it.Seek(batchKey(p.lprefix, from)); it.Valid(); it.Next() {
		item := it.Item()
		base := batchKeyOffset(item.Key())
		if base >= hw {
			break
		}
		if n++; n%64 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		var decodeErr error
		err := item.Value(func(v []byte) error {
			h, err := batch.ParseHeader(v)
			if err != nil {
				decodeErr = err
				return nil
			}
			if h.IsControl() || m.aborted.holds(h) {
				return nil // no application keys; an aborted record never supersedes a committed one
			}
			_, decodeErr = batch.DecodeBatch(v, func(r batch.Record) error {
				if r.Key != nil {
					m.latest[m.hash(r.Key)] = r.Offset
				}
				return nil
			})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("read batch at %d: %w", base, err)
		}
		if decodeErr != nil {
			p.s.log.Warn("cleaner: stored batch does not decode; its keys are not compacted", "partition", p.id, "base_offset", base, "err", decodeErr)
		}
	}
	return m, nil
}

// cleaner is one run's rewrite of the cleanable range.
type cleaner struct {
	p     *Partition
	cfg   CompactConfig
	nowMs int64
	keys  *keyMap
	plan  cleanPlan
	state partState // the stored state as of the run's start; checkpoint moves at the end

	ops        []op
	opBytes    int
	opBatches  int
	sizeChange int64 // bytes the pending group takes off Size
}

// clean rewrites the batches of [LogStart, CleanableEnd) in offset order, in groups of whole batches.
func (c *cleaner) clean(ctx context.Context, txn *badger.Txn) error {
	p := c.p
	st := &c.plan.stats
	it := txn.NewIterator(badger.IteratorOptions{Prefix: p.lprefix, PrefetchValues: false})
	defer it.Close()
	for it.Seek(batchKey(p.lprefix, st.LogStart)); it.Valid(); it.Next() {
		item := it.Item()
		base := batchKeyOffset(item.Key())
		if base >= st.CleanableEnd {
			break
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := item.Value(func(v []byte) error { return c.cleanBatch(base, item.KeyCopy(nil), v) }); err != nil {
			return fmt.Errorf("read batch at %d: %w", base, err)
		}
		if c.opBatches >= cleanGroupBatches || c.opBytes >= cleanGroupBytes {
			if err := c.flush(false); err != nil {
				return err
			}
			if testHookCleanGroup != nil {
				testHookCleanGroup()
			}
		}
	}
	return c.flush(true)
}

// cleanBatch decides one stored batch v at base and queues its rewrite, deletion or new horizon.
func (c *cleaner) cleanBatch(base int64, key, v []byte) error {
	p := c.p
	st := &c.plan.stats
	h, err := batch.ParseHeader(v)
	if err != nil {
		p.s.log.Warn("cleaner: stored batch has a bad header; kept as it is", "partition", p.id, "base_offset", base, "err", err)
		return nil
	}
	st.BatchesRead++
	if h.IsControl() {
		return nil // transaction markers stay until transactions get their own cleaning rules
	}
	pending := len(c.ops)
	defer func() {
		if len(c.ops) > pending {
			c.opBatches++
		}
	}()
	horizon, hasHorizon := c.plan.horizons[base]
	var removed, tombsRemoved int64
	keptTombstone := false
	aborted := c.keys.aborted.holds(h) // records of an aborted transaction are never read committed: drop them, as Kafka's cleaner does
	out, kept, err := batch.FilterRecords(v, func(r batch.Record) bool {
		st.RecordsRead++
		if aborted || r.Key == nil {
			removed++
			return false
		}
		if latest, ok := c.keys.latest[c.keys.hash(r.Key)]; ok && latest > r.Offset {
			removed++
			return false
		}
		if r.Value == nil {
			if hasHorizon && horizon <= c.nowMs {
				removed++
				tombsRemoved++
				return false
			}
			keptTombstone = true
		}
		return true
	})
	if err != nil {
		p.s.log.Warn("cleaner: stored batch does not decode; kept as it is", "partition", p.id, "base_offset", base, "err", err)
		return nil
	}
	st.RecordsRemoved += removed
	st.TombstonesRemoved += tombsRemoved
	hkey := batchKey(p.hprefix, base)
	switch {
	case kept == 0:
		// Horizon first: if a crash splits the group, a batch without horizon only keeps its
		// tombstones longer, while a horizon without batch would force cleans forever.
		if hasHorizon {
			c.add(op{key: hkey, del: true})
		}
		c.add(op{key: key, del: true})
		c.sizeChange -= int64(len(v))
		st.BatchesRemoved++
		st.BytesRemoved += int64(len(v))
	case kept < h.RecordCount:
		c.add(op{key: key, value: out})
		c.opBytes += len(out)
		c.sizeChange -= int64(len(v) - len(out))
		st.BatchesRewritten++
		st.BytesRemoved += int64(len(v) - len(out))
		if hasHorizon && !keptTombstone {
			c.add(op{key: hkey, del: true})
		}
	}
	if kept > 0 && keptTombstone && !hasHorizon {
		// The first clean that keeps a tombstone as the latest of its key starts its delete.retention.ms.
		c.add(op{key: hkey, value: encodeHorizon(satAdd(c.nowMs, c.cfg.DeleteRetentionMs))})
	}
	return nil
}

func (c *cleaner) add(o op) { c.ops = append(c.ops, o) }

// flush commits the pending group in one transaction (apply splits it only if Badger finds it too
// big, and then between whole ops in order). The state goes first with the log start and the old
// checkpoint, so a first batch removed by this group cannot make recovery move the log start; the last
// group ends with the new checkpoint, so it moves only once every batch below it is clean.
func (c *cleaner) flush(final bool) error {
	p, s := c.p, c.p.s
	if len(c.ops) == 0 && !final {
		return nil
	}
	ops := make([]op, 0, len(c.ops)+2)
	if len(c.ops) > 0 {
		ops = append(ops, op{key: p.sprefix, value: encodeState(c.state)})
		ops = append(ops, c.ops...)
	}
	newState := c.state
	if final {
		newState.checkpoint = max(c.state.checkpoint, c.plan.stats.CleanableEnd)
		ops = append(ops, op{key: p.sprefix, value: encodeState(newState)})
	}
	s.dropMu.RLock()
	if err := p.check("compaction of"); err != nil {
		s.dropMu.RUnlock()
		return err
	}
	err := s.apply(ops)
	s.dropMu.RUnlock()
	if err != nil {
		return fmt.Errorf("write %d cleaned entries: %w", len(ops), err)
	}
	p.mu.Lock()
	if p.gone == nil {
		p.size += c.sizeChange
		if final {
			p.checkpoint = newState.checkpoint
		}
	}
	p.mu.Unlock()
	c.ops, c.opBytes, c.opBatches, c.sizeChange = c.ops[:0], 0, 0, 0
	return nil
}

// satAdd is a+b for b >= 0, saturating at math.MaxInt64 (delete.retention.ms may be huge).
func satAdd(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}
