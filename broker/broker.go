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

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/client/telemetry"
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
	// Rack is reported in metadata (rack-aware placement comes with the cluster work).
	Rack string
	// RetentionCheckInterval is how often retention runs over every partition (Kafka's
	// log.retention.check.interval.ms, default 5 minutes).
	RetentionCheckInterval time.Duration
	// CompactionCheckInterval is how often the log cleaner looks at the partitions of compacted topics
	// (default DefaultCompactionCheckInterval, 15 s); a partition that is not due costs a key scan.
	CompactionCheckInterval time.Duration
	// Telemetry records the broker's metrics and spans and keeps the partition rates of DescribeTopics;
	// nil leaves the broker uninstrumented. The node owns it and closes it after the broker.
	Telemetry *telemetry.Broker
}

// Broker serves produce, fetch, offsets, metadata and topic admin for one node.
type Broker struct {
	runnelv1.UnimplementedRecordsServer
	runnelv1.UnimplementedAdminServer

	cfg   Config
	store *plog.Store
	meta  *meta.Store
	log   *slog.Logger
	tel   *telemetry.Broker // nil: uninstrumented

	mu    sync.RWMutex
	parts map[string][]*plog.Partition // by topic name; replaced, never changed in place

	stop chan struct{}
	wg   sync.WaitGroup
}

// New opens the topic metadata kept in store's DB and every topic's partition logs, and starts the
// retention and log-cleaner loops. Close stops them; the caller closes store afterwards.
func New(cfg Config, store *plog.Store, logger *slog.Logger) (*Broker, error) {
	if cfg.RetentionCheckInterval <= 0 {
		cfg.RetentionCheckInterval = 5 * time.Minute
	}
	if cfg.CompactionCheckInterval <= 0 {
		cfg.CompactionCheckInterval = DefaultCompactionCheckInterval
	}
	if logger == nil {
		logger = slog.Default()
	}
	m, err := meta.Open(store.DB(), 1)
	if err != nil {
		return nil, err
	}
	b := &Broker{cfg: cfg, store: store, meta: m, log: logger, tel: cfg.Telemetry, parts: map[string][]*plog.Partition{}, stop: make(chan struct{})}
	b.tel.ObserveStorage(b.storageStats)
	for _, t := range m.List() {
		ps, err := b.openPartitions(t)
		if err != nil {
			return nil, err
		}
		b.parts[t.Name] = ps
	}
	b.wg.Add(1)
	go b.retentionLoop()
	b.startCompaction()
	return b, nil
}

// Close stops the broker's background work. In-flight requests finish with the store's errors.
func (b *Broker) Close() {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	b.wg.Wait()
}

// Ready reports whether the broker is serving (its metadata is loaded: always, once New returned).
func (b *Broker) Ready() bool { return true }

func (b *Broker) openPartitions(t *meta.Topic) ([]*plog.Partition, error) {
	ps := make([]*plog.Partition, t.Partitions)
	for i := range ps {
		p, err := b.store.Partition(plog.PartitionID{TopicNum: t.Num, Partition: int32(i)})
		if err != nil {
			return nil, fmt.Errorf("open partition %s-%d: %w", t.Name, i, err)
		}
		ps[i] = p
	}
	return ps, nil
}

// partition returns the topic and the log of topic-partition, or rerr.ErrUnknownTopicOrPartition.
func (b *Broker) partition(topic string, partition int32) (*meta.Topic, *plog.Partition, error) {
	t, ok := b.meta.Get(topic)
	b.mu.RLock()
	ps := b.parts[topic]
	b.mu.RUnlock()
	if !ok || ps == nil {
		return nil, nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q does not exist", topic)
	}
	if partition < 0 || int(partition) >= len(ps) {
		return nil, nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q has no partition %d (it has %d)", topic, partition, len(ps))
	}
	return t, ps[partition], nil
}

// storeErr maps storage errors to catalogue errors: a partition deleted under a request is an unknown
// partition to the client; anything else that is not already a catalogue error is a storage error.
func storeErr(topic string, partition int32, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, plog.ErrPartitionDeleted) {
		return rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q partition %d was deleted", topic, partition)
	}
	var e *rerr.Error
	if errors.As(err, &e) {
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
	for _, t := range b.meta.List() {
		if !t.Config.Delete() {
			continue
		}
		b.mu.RLock()
		ps := b.parts[t.Name]
		b.mu.RUnlock()
		for i, p := range ps {
			n, err := p.ApplyRetention(now, t.Config.RetentionMs, t.Config.RetentionBytes)
			if err != nil && !errors.Is(err, plog.ErrPartitionDeleted) {
				b.log.Warn("retention failed", "topic", t.Name, "partition", i, "err", err)
			}
			deleted += n
		}
	}
	return deleted
}
