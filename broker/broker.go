// Package broker is Runnel's data plane on one node: it owns the partition logs (broker/plog), the topic
// metadata (broker/meta), and serves the Records and Admin gRPC services of api/runnel/v1.
//
// Every request from outside is validated here before anything is stored: batch framing and CRC, sizes
// against max.message.bytes, topic names and configs, offsets. Bad input gets a catalogue error
// (api/rerr) and changes nothing.
package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/grpcbuf"
	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/client/telemetry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
)

// Limits of fetch sizes, in bytes. A fetch answer must fit the gRPC message cap (MaxMessageBytes).
const (
	DefaultFetchMaxBytes     = 50 << 20 // Kafka's fetch.max.bytes
	MaxFetchBytes            = 64 << 20
	DefaultPartitionMaxBytes = 1 << 20 // Kafka's max.partition.fetch.bytes
	// MaxMessageBytes is the gRPC message size cap of the node, both ways: the largest fetch answer
	// (MaxFetchBytes plus framing) and the largest produce request. Larger requests are refused by gRPC
	// with RESOURCE_EXHAUSTED before they reach the broker.
	MaxMessageBytes = MaxFetchBytes + 4<<20
	// MaxFetchWait caps a long poll's max_wait_ms.
	MaxFetchWait = 60 * time.Second
	// DefaultProduceTimeout is used when a produce request gives no timeout_ms.
	DefaultProduceTimeout = 30 * time.Second
)

// Config is what the broker needs from the node config.
type Config struct {
	// NodeID is this broker's id in metadata answers.
	NodeID int32
	// AdvertisedAddr is the gRPC host:port clients are told to use.
	AdvertisedAddr string
	// Rack is reported in metadata and used for rack-aware placement.
	Rack string
	// RetentionCheckInterval is how often retention runs over every partition (Kafka's
	// log.retention.check.interval.ms, default 5 minutes).
	RetentionCheckInterval time.Duration
	// CompactionCheckInterval is how often the log cleaner looks at the partitions of compacted topics
	// (default DefaultCompactionCheckInterval, 15 s); a partition that is not due costs a key scan.
	CompactionCheckInterval time.Duration
	// ReplicaLagTimeMax is how long a follower may go without catching up before the leader drops it
	// from the ISR (Kafka's replica.lag.time.max.ms; default DefaultReplicaLagTimeMax).
	ReplicaLagTimeMax time.Duration
	// ReplicationThrottle caps, in bytes per second, what this broker as leader sends to followers that are
	// not in the ISR: replicas catching up after a restart or copying a partition moved to them (Kafka's
	// leader.replication.throttled.rate). 0: no cap. In-sync followers are never throttled.
	ReplicationThrottle int64
	// DialOptions are added to every connection this broker opens to another broker (follower fetches,
	// transaction markers, verification): the fault-injection tests route them through proxies
	// (platform/netmap). Empty in production.
	DialOptions []grpc.DialOption
	// ControllerVoters is the number of controller voters, each a broker too: the fewest brokers the
	// cluster will have, so internal topics wait for them before choosing a replication factor.
	ControllerVoters int
	// Telemetry records the broker's metrics and spans and keeps the partition rates of DescribeTopics;
	// nil leaves the broker uninstrumented. The node owns it and closes it after the broker.
	Telemetry *telemetry.Broker
}

// Metadata is the broker's window on the controller quorum (platform/controller implements it): the
// metadata image this node has applied, and a way to change it.
type Metadata interface {
	// Image returns the latest metadata image applied on this node.
	Image() *meta.Image
	// Changed returns a channel closed when a newer image is applied.
	Changed() <-chan struct{}
	// Propose sends cmd to the controller leader (forwarding when this node is not it) and waits until
	// this node has applied it; it returns that image. A command the controller refused returns its
	// catalogue error (TOPIC_ALREADY_EXISTS, ...); a controller that cannot be reached or has no majority
	// returns NOT_CONTROLLER or REQUEST_TIMED_OUT.
	Propose(ctx context.Context, cmd meta.Command) (*meta.Image, error)
	// ControllerID is the node id of the controller leader, -1 while none is known.
	ControllerID() int32
	// Epoch is this broker's epoch: the metadata offset of the registration of this run (this
	// incarnation), 0 until the controller has it.
	Epoch() uint64
}

// Broker serves produce, fetch, offsets, metadata and topic admin for one node.
type Broker struct {
	runnelv1.UnimplementedRecordsServer
	runnelv1.UnimplementedAdminServer
	runnelv1.UnimplementedReplicationServer

	cfg   Config
	store *plog.Store
	md    Metadata
	log   *slog.Logger
	tel   *telemetry.Broker // nil: uninstrumented

	mu    sync.RWMutex
	parts map[string]*topicLogs // by topic name: the logs of the partitions this node holds
	repl  *replication

	pids           producerIDs
	psMu           sync.Mutex
	producerStates map[plog.PartitionID]*producerState // idempotence and transaction state of partitions led here

	// Transactions (txnmarkers.go): the coordinator's partition verification and the group
	// coordinator's marker writer, set by the node (SetTxnVerifier, SetOffsetsMarkers); nil: not enabled.
	txnMu          sync.RWMutex
	txnVerifier    TxnVerifier
	offsetsMarkers OffsetsMarkerWriter

	stop     chan struct{}
	draining chan struct{} // closed by Drain
	drainMu  sync.Once
	wg       sync.WaitGroup
}

// SetTxnVerifier installs the transaction coordinator's partition verification (KIP-890), which
// transactional produce needs: until it is set (or after it is set to nil) transactional batches are
// refused with INVALID_REQUEST. Safe to call at any time.
func (b *Broker) SetTxnVerifier(v TxnVerifier) {
	b.txnMu.Lock()
	defer b.txnMu.Unlock()
	b.txnVerifier = v
}

// SetOffsetsMarkers installs the group coordinator's writer of transaction markers on
// __consumer_offsets partitions, to which WriteTxnMarkers hands those partitions; until it is set they
// get COORDINATOR_NOT_AVAILABLE (retriable). Safe to call at any time.
func (b *Broker) SetOffsetsMarkers(w OffsetsMarkerWriter) {
	b.txnMu.Lock()
	defer b.txnMu.Unlock()
	b.offsetsMarkers = w
}

// topicLogs are the local logs of one topic incarnation (a topic deleted and created again has a new
// number, so its new logs never see the old data).
type topicLogs struct {
	num  uint64
	logs []*plog.Partition // indexed by partition; nil where this node is no replica
}

// New opens the logs of the partitions the metadata image places on this node and starts the loops
// that follow the image (opening and dropping logs as topics come and go), retention and the log
// cleaner. Close stops them; the caller closes store afterwards.
func New(cfg Config, store *plog.Store, md Metadata, logger *slog.Logger) (*Broker, error) {
	if cfg.RetentionCheckInterval <= 0 {
		cfg.RetentionCheckInterval = 5 * time.Minute
	}
	if cfg.CompactionCheckInterval <= 0 {
		cfg.CompactionCheckInterval = DefaultCompactionCheckInterval
	}
	if logger == nil {
		logger = slog.Default()
	}
	b := &Broker{cfg: cfg, store: store, md: md, log: logger, tel: cfg.Telemetry, parts: map[string]*topicLogs{}, stop: make(chan struct{}), draining: make(chan struct{}),
		producerStates: map[plog.PartitionID]*producerState{}}
	b.tel.ObserveStorage(b.storageStats)
	b.tel.ObserveReplicas(b.replicaStats)
	b.repl = newReplication(b)
	if err := b.reconcile(md.Image()); err != nil {
		return nil, err
	}
	b.wg.Add(3)
	go b.repl.loop()
	go b.metadataLoop()
	go b.retentionLoop()
	b.startCompaction()
	return b, nil
}

// replicaStats counts, from the metadata, the partitions led here, those with a short ISR, and on the
// controller leader the partitions without a leader.
func (b *Broker) replicaStats() telemetry.ReplicaStats {
	var s telemetry.ReplicaStats
	controller := b.md.ControllerID() == b.cfg.NodeID
	for _, t := range b.md.Image().TopicList() {
		for _, p := range t.Assignment {
			if p.Leader == b.cfg.NodeID {
				s.Leaders++
				if len(p.ISR) < len(p.Replicas) {
					s.UnderReplicated++
				}
			}
			if controller && p.Leader == meta.NoLeader {
				s.Offline++
			}
		}
	}
	s.FollowerLags = b.repl.followerLags()
	return s
}

// Drain ends the open produce streams (their clients reconnect elsewhere), so a graceful stop of the
// gRPC server does not wait for idle streams. The node calls it after its controlled shutdown.
func (b *Broker) Drain() { b.drainMu.Do(func() { close(b.draining) }) }

// Close stops the broker's background work. In-flight requests finish with the store's errors.
func (b *Broker) Close() {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	b.wg.Wait()
}

// Ready reports whether the broker is serving: this run of the node is registered and unfenced in the
// metadata it has applied (registration fenced it until it caught up, KIP-631). The registration of a
// previous run, replayed from the node's own metadata log, does not count: until this run's is applied
// the image may still be missing whatever happened since.
func (b *Broker) Ready() bool {
	br, ok := b.md.Image().Broker(b.cfg.NodeID)
	epoch := b.md.Epoch()
	return ok && !br.Fenced && epoch != 0 && br.Epoch == epoch
}

// metadataLoop applies every new image to the local logs, and once this broker is unfenced (its
// metadata caught up) drops the stray logs.
func (b *Broker) metadataLoop() {
	defer b.wg.Done()
	strayDone := false
	for {
		ch := b.md.Changed()
		if err := b.reconcile(b.md.Image()); err != nil {
			b.log.Error("applying metadata to the local logs failed", "err", err)
		}
		if !strayDone && b.Ready() {
			strayDone = true
			if err := b.dropStray(b.md.Image()); err != nil {
				b.log.Error("dropping stray partition logs failed", "err", err)
			}
		}
		select {
		case <-b.stop:
			return
		case <-ch:
		}
	}
}

// reconcile opens the logs of partitions img places here and drops the data of topics img no longer
// has (deleted, or deleted and created again under a new number).
func (b *Broker) reconcile(img *meta.Image) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for name, tl := range b.parts {
		if t, ok := img.Topic(name); ok && t.Num == tl.num {
			continue
		}
		delete(b.parts, name)
		b.tel.ForgetTopic(name)
		b.psMu.Lock()
		for id := range b.producerStates {
			if id.TopicNum == tl.num {
				delete(b.producerStates, id)
			}
		}
		b.psMu.Unlock()
		for i, p := range tl.logs {
			if p == nil {
				continue
			}
			if err := b.store.DeletePartition(plog.PartitionID{TopicNum: tl.num, Partition: int32(i)}); err != nil {
				errs = append(errs, fmt.Errorf("drop data of %s-%d: %w", name, i, err))
			}
		}
		b.log.Info("topic data dropped", "topic", name)
	}
	for _, t := range img.TopicList() {
		for i, st := range t.Assignment {
			if !st.IsReplica(b.cfg.NodeID) {
				// Moved away by a reassignment: the data goes.
				if tl := b.parts[t.Name]; tl != nil && tl.num == t.Num && i < len(tl.logs) && tl.logs[i] != nil {
					tl.logs[i] = nil
					if err := b.store.DeletePartition(plog.PartitionID{TopicNum: t.Num, Partition: int32(i)}); err != nil {
						errs = append(errs, fmt.Errorf("drop data of %s-%d: %w", t.Name, i, err))
					}
					b.log.Info("partition replica removed from this broker", "topic", t.Name, "partition", i)
				}
				continue
			}
			if _, err := b.openLocked(t, int32(i)); err != nil {
				errs = append(errs, err)
			}
		}
	}
	b.repl.apply(img, func(t *meta.Topic, p int32) *plog.Partition {
		if tl := b.parts[t.Name]; tl != nil && tl.num == t.Num && int(p) < len(tl.logs) {
			return tl.logs[p]
		}
		return nil
	})
	return errors.Join(errs...)
}

// dropStray deletes the stored logs of partitions img does not place on this node: topics deleted while
// it was down. Only called once the broker is unfenced, so img holds everything up to its registration
// and no log a current topic needs is taken for a stray one.
func (b *Broker) dropStray(img *meta.Image) error {
	stored, err := b.store.StoredPartitions()
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	placed := map[plog.PartitionID]bool{}
	for _, t := range img.TopicList() {
		for i, st := range t.Assignment {
			if st.IsReplica(b.cfg.NodeID) {
				placed[plog.PartitionID{TopicNum: t.Num, Partition: int32(i)}] = true
			}
		}
	}
	var errs []error
	for _, id := range stored {
		if placed[id] {
			continue
		}
		if err := b.store.DeletePartition(id); err != nil {
			errs = append(errs, fmt.Errorf("drop stray log %s: %w", id, err))
			continue
		}
		b.log.Info("stray partition log dropped (its topic is gone or placed elsewhere)", "partition", id.String())
	}
	return errors.Join(errs...)
}

// openLocked returns the local log of t's partition p, opening it (and recovering it from Badger) on
// first use. b.mu must be held for writing.
func (b *Broker) openLocked(t *meta.Topic, p int32) (*plog.Partition, error) {
	tl := b.parts[t.Name]
	if tl == nil || tl.num != t.Num {
		tl = &topicLogs{num: t.Num}
		b.parts[t.Name] = tl
	}
	if int(p) >= len(tl.logs) {
		tl.logs = append(tl.logs, make([]*plog.Partition, int(p)+1-len(tl.logs))...)
	}
	if tl.logs[p] == nil {
		l, err := b.store.Partition(plog.PartitionID{TopicNum: t.Num, Partition: p})
		if err != nil {
			return nil, fmt.Errorf("open partition %s-%d: %w", t.Name, p, err)
		}
		tl.logs[p] = l
	}
	return tl.logs[p], nil
}

// localLog returns the local log of t's partition p, or nil when this node holds none.
func (b *Broker) localLog(t *meta.Topic, p int32) *plog.Partition {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if tl := b.parts[t.Name]; tl != nil && tl.num == t.Num && int(p) < len(tl.logs) {
		return tl.logs[p]
	}
	return nil
}

// partition returns the topic and the log of topic-partition if this node leads it. Errors:
// rerr.ErrUnknownTopicOrPartition; NOT_LEADER_OR_FOLLOWER naming the leader and its epoch when another
// broker leads it; LEADER_NOT_AVAILABLE when none does.
func (b *Broker) partition(topic string, partition int32) (*meta.Topic, *plog.Partition, error) {
	t, ok := b.md.Image().Topic(topic)
	if !ok {
		return nil, nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q does not exist", topic)
	}
	st, ok := t.Partition(partition)
	if !ok {
		return nil, nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q has no partition %d (it has %d)", topic, partition, t.Partitions)
	}
	if err := b.checkLeader(topic, partition, st); err != nil {
		return nil, nil, err
	}
	if l := b.localLog(t, partition); l != nil {
		return t, l, nil
	}
	// The image placed the partition here a moment ago and the metadata loop has not opened it yet.
	b.mu.Lock()
	defer b.mu.Unlock()
	l, err := b.openLocked(t, partition)
	if err != nil {
		return nil, nil, storeErr(topic, partition, err)
	}
	return t, l, nil
}

// checkLeader refuses requests for a partition this node does not lead, naming the one that does.
func (b *Broker) checkLeader(topic string, partition int32, st meta.PartitionState) error {
	switch st.Leader {
	case b.cfg.NodeID:
		return nil
	case meta.NoLeader:
		return &rerr.Error{Code: runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, LeaderID: -1, LeaderEpoch: st.LeaderEpoch,
			Message: fmt.Sprintf("%s-%d has no leader: none of its in-sync replicas %v is alive", topic, partition, st.ISR)}
	default:
		return &rerr.Error{Code: runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER, LeaderID: st.Leader, LeaderEpoch: st.LeaderEpoch,
			Message: fmt.Sprintf("broker %d does not lead %s-%d; broker %d does (leader epoch %d)", b.cfg.NodeID, topic, partition, st.Leader, st.LeaderEpoch)}
	}
}

// checkEpoch compares the leader epoch a client sent (KIP-320) with the partition's: an older one means
// the client's metadata is stale (FENCED_LEADER_EPOCH), a newer one that this broker's is
// (UNKNOWN_LEADER_EPOCH). Both are retriable after a metadata refresh. nil: not sent.
func checkEpoch(topic string, partition int32, t *meta.Topic, sent *int32) error {
	if sent == nil {
		return nil
	}
	st, _ := t.Partition(partition)
	switch {
	case *sent < st.LeaderEpoch:
		return &rerr.Error{Code: runnelv1.ErrorCode_FENCED_LEADER_EPOCH, LeaderID: st.Leader, LeaderEpoch: st.LeaderEpoch,
			Message: fmt.Sprintf("%s-%d: leader epoch %d is older than the current %d", topic, partition, *sent, st.LeaderEpoch)}
	case *sent > st.LeaderEpoch:
		return &rerr.Error{Code: runnelv1.ErrorCode_UNKNOWN_LEADER_EPOCH, LeaderID: st.Leader, LeaderEpoch: st.LeaderEpoch,
			Message: fmt.Sprintf("%s-%d: leader epoch %d is newer than this broker's %d", topic, partition, *sent, st.LeaderEpoch)}
	}
	return nil
}

// localTopicLogs returns the local logs of t (nil entries where not held).
func (b *Broker) localTopicLogs(t *meta.Topic) []*plog.Partition {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if tl := b.parts[t.Name]; tl != nil && tl.num == t.Num {
		return tl.logs
	}
	return nil
}

// storeErr maps storage errors to catalogue errors: a partition deleted under a request is an unknown
// partition to the client; anything else that is not already a catalogue error is a storage error. A
// catalogue error the store wrapped keeps its code and gets the topic's name and the partition in
// front of the store's context.
func storeErr(topic string, partition int32, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, plog.ErrPartitionDeleted) {
		return rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q partition %d was deleted", topic, partition)
	}
	var e *rerr.Error
	if errors.As(err, &e) {
		if err != error(e) {
			// Wrapped by the store, whose context names the partition by its topic number ("append to
			// 6-0: ..."), which the client does not know: name it as the client did too.
			return fmt.Errorf("%s-%d: %w", topic, partition, err)
		}
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return rerr.New(runnelv1.ErrorCode_REQUEST_TIMED_OUT, "%s-%d: %v", topic, partition, err)
	}
	return rerr.New(runnelv1.ErrorCode_KAFKA_STORAGE_ERROR, "%s-%d: %v", topic, partition, err)
}

func (b *Broker) retentionLoop() {
	defer b.wg.Done()
	t := time.NewTicker(b.cfg.RetentionCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case now := <-t.C:
			b.ApplyRetention(now)
		}
	}
}

// ApplyRetention runs retention.ms and retention.bytes over every partition of every topic whose
// cleanup.policy includes delete. It returns the number of batches deleted. The retention loop calls it
// every RetentionCheckInterval; tests call it directly.
func (b *Broker) ApplyRetention(now time.Time) int {
	deleted := 0
	for _, t := range b.md.Image().TopicList() {
		if !t.Config.Delete() {
			continue
		}
		for i, p := range b.localTopicLogs(t) {
			if p == nil {
				continue
			}
			n, err := p.ApplyRetention(now, t.Config.RetentionMs, t.Config.RetentionBytes)
			if err != nil && !errors.Is(err, plog.ErrPartitionDeleted) {
				b.log.Warn("retention failed", "topic", t.Name, "partition", i, "err", err)
			}
			deleted += n
		}
	}
	return deleted
}

// peerDialOptions are the options of every connection to another broker: plaintext, messages up to
// MaxMessageBytes, frames read into uncleared buffers (api/grpcbuf: followers receive every
// replicated byte), reconnects backing off from 100 ms to 1 s (a restarted leader is back within
// seconds), then Config.DialOptions.
func (b *Broker) peerDialOptions() []grpc.DialOption {
	return append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes)),
		experimental.WithBufferPool(grpcbuf.Shared),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6,
			Jitter: 0.2, MaxDelay: time.Second}, MinConnectTimeout: time.Second})}, b.cfg.DialOptions...)
}
