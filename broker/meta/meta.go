// Package meta keeps a node's topic metadata: names, ids, partition counts, replication factors and
// config overrides, persisted in the node's Badger DB under the "m/" prefix.
//
// On a single node this store is the metadata authority. The cluster work moves the authority to the
// Raft controller quorum, whose state machine applies the same Create, Delete and Alter operations; the
// topic shape and validation here are what it replicates.
package meta

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/google/uuid"
	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/topiccfg"
)

// MaxPartitions caps a topic's partition count, so one request cannot make a node open millions of logs.
const MaxPartitions = 10000

var (
	topicPrefix  = []byte("m/topic/")
	seqKey       = []byte("m/seq/topic")
	clusterIDKey = []byte("m/cluster-id")
)

// Topic is one topic's metadata. Values returned by Store are never changed afterwards (an alter
// stores a new *Topic), so readers need no lock.
type Topic struct {
	Name              string            `json:"name"`
	ID                string            `json:"id"`  // UUID, unique over the node's life
	Num               uint64            `json:"num"` // storage number, never reused (keys of its partitions)
	Partitions        int32             `json:"partitions"`
	ReplicationFactor int32             `json:"replication_factor"`
	Overrides         map[string]string `json:"overrides,omitempty"`
	Internal          bool              `json:"internal,omitempty"`
	CreatedMs         int64             `json:"created_ms"`
	// Config is the effective config parsed from Overrides.
	Config topiccfg.Config `json:"-"`
}

// Store holds every topic in memory and writes changes through to Badger.
type Store struct {
	db      *badger.DB
	brokers int32 // live brokers, the cap on replication factor

	clusterID string

	mu      sync.RWMutex
	topics  map[string]*Topic
	nextNum uint64
}

// ClusterID is the id this node's data dir was formatted with (a UUID chosen on first start).
func (s *Store) ClusterID() string { return s.clusterID }

// Open loads the topics stored in db. brokers is the number of live brokers (1 on a single node).
func Open(db *badger.DB, brokers int32) (*Store, error) {
	s := &Store{db: db, brokers: brokers, topics: map[string]*Topic{}, nextNum: 1}
	err := db.View(func(txn *badger.Txn) error {
		if item, err := txn.Get(seqKey); err == nil {
			if err := item.Value(func(v []byte) error {
				if len(v) != 8 {
					return fmt.Errorf("topic sequence of %d bytes", len(v))
				}
				s.nextNum = binary.BigEndian.Uint64(v)
				return nil
			}); err != nil {
				return err
			}
		} else if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: topicPrefix, PrefetchValues: true, PrefetchSize: 64})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			var t Topic
			if err := it.Item().Value(func(v []byte) error { return json.Unmarshal(v, &t) }); err != nil {
				return fmt.Errorf("decode topic %s: %w", it.Item().Key(), err)
			}
			cfg, err := topiccfg.Parse(t.Overrides)
			if err != nil {
				return fmt.Errorf("topic %s: %w", t.Name, err)
			}
			t.Config = cfg
			s.topics[t.Name] = &t
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load topic metadata: %w", err)
	}
	err = db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get(clusterIDKey)
		if errors.Is(err, badger.ErrKeyNotFound) {
			s.clusterID = uuid.NewString()
			return txn.Set(clusterIDKey, []byte(s.clusterID))
		} else if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		s.clusterID = string(v)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("load cluster id: %w", err)
	}
	return s, nil
}

// Get returns the topic called name.
func (s *Store) Get(name string) (*Topic, bool) {
	s.mu.RLock()
	t, ok := s.topics[name]
	s.mu.RUnlock()
	return t, ok
}

// List returns every topic sorted by name.
func (s *Store) List() []*Topic {
	s.mu.RLock()
	out := make([]*Topic, 0, len(s.topics))
	for _, t := range s.topics {
		out = append(out, t)
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Spec is what a create request asks for. Partitions or ReplicationFactor <= 0 take defaults.
type Spec struct {
	Name              string
	Partitions        int32
	ReplicationFactor int32
	Configs           map[string]string
	Internal          bool
}

// Defaults applied by Create (Kafka's num.partitions and default.replication.factor are 1 as well).
const (
	DefaultPartitions        = 1
	DefaultReplicationFactor = 1
)

// Validate checks spec against Kafka's rules and this store's topics, returning the topic it would
// create (without Num). Errors: rerr.ErrInvalidTopic, ErrTopicAlreadyExists, ErrInvalidPartitions,
// ErrInvalidReplicationFactor, ErrInvalidConfig.
func (s *Store) Validate(spec Spec) (*Topic, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.validateLocked(spec)
}

func (s *Store) validateLocked(spec Spec) (*Topic, error) {
	if err := topiccfg.ValidateTopicName(spec.Name); err != nil {
		return nil, err
	}
	if spec.Partitions <= 0 {
		spec.Partitions = DefaultPartitions
	}
	if spec.ReplicationFactor <= 0 {
		spec.ReplicationFactor = DefaultReplicationFactor
	}
	if spec.Partitions > MaxPartitions {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_PARTITIONS, "%d partitions asked, at most %d per topic", spec.Partitions, MaxPartitions)
	}
	if spec.ReplicationFactor > s.brokers {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REPLICATION_FACTOR, "replication factor %d is larger than the %d available broker(s)", spec.ReplicationFactor, s.brokers)
	}
	cfg, err := topiccfg.Parse(spec.Configs)
	if err != nil {
		return nil, err
	}
	if cfg.MinInsyncReplicas > spec.ReplicationFactor {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_CONFIG, "min.insync.replicas=%d is larger than the replication factor %d, so acks=all could never succeed", cfg.MinInsyncReplicas, spec.ReplicationFactor)
	}
	if _, ok := s.topics[spec.Name]; ok {
		return nil, rerr.New(runnelv1.ErrorCode_TOPIC_ALREADY_EXISTS, "topic %q already exists", spec.Name)
	}
	key := topiccfg.CollisionKey(spec.Name)
	for name := range s.topics {
		if topiccfg.CollisionKey(name) == key {
			return nil, rerr.New(runnelv1.ErrorCode_INVALID_TOPIC_EXCEPTION, "topic %q collides with existing topic %q ('.' and '_' are the same in metric names)", spec.Name, name)
		}
	}
	return &Topic{Name: spec.Name, ID: uuid.NewString(), Partitions: spec.Partitions,
		ReplicationFactor: spec.ReplicationFactor, Overrides: topiccfg.Normalize(spec.Configs),
		Internal: spec.Internal, Config: cfg}, nil
}

// Create validates spec (see Validate), stores the topic and returns it.
func (s *Store) Create(spec Spec) (*Topic, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.validateLocked(spec)
	if err != nil {
		return nil, err
	}
	t.Num = s.nextNum
	t.CreatedMs = time.Now().UnixMilli()
	if err := s.put(t, s.nextNum+1); err != nil {
		return nil, err
	}
	s.nextNum++
	s.topics[t.Name] = t
	return t, nil
}

// Delete removes the topic's metadata and returns it; its data is the caller's to drop. Errors:
// rerr.ErrUnknownTopicOrPartition.
func (s *Store) Delete(name string) (*Topic, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.topics[name]
	if !ok {
		return nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q does not exist", name)
	}
	if err := s.db.Update(func(txn *badger.Txn) error { return txn.Delete(topicKey(name)) }); err != nil {
		return nil, fmt.Errorf("delete topic %s metadata: %w", name, err)
	}
	delete(s.topics, name)
	return t, nil
}

// Alter sets and deletes config overrides of a topic (deleted ones return to the default) and returns
// the new topic. With validateOnly nothing is stored. Errors: rerr.ErrUnknownTopicOrPartition,
// rerr.ErrInvalidConfig.
func (s *Store) Alter(name string, set map[string]string, del []string, validateOnly bool) (*Topic, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.topics[name]
	if !ok {
		return nil, rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q does not exist", name)
	}
	overrides := make(map[string]string, len(old.Overrides)+len(set))
	for k, v := range old.Overrides {
		overrides[k] = v
	}
	for _, k := range del {
		if _, known := topiccfg.Default(k); !known {
			return nil, rerr.New(runnelv1.ErrorCode_INVALID_CONFIG, "unknown topic config %q", k)
		}
		delete(overrides, k)
	}
	for k, v := range set {
		overrides[k] = v
	}
	cfg, err := topiccfg.Parse(overrides)
	if err != nil {
		return nil, err
	}
	if cfg.MinInsyncReplicas > old.ReplicationFactor {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_CONFIG, "min.insync.replicas=%d is larger than the replication factor %d", cfg.MinInsyncReplicas, old.ReplicationFactor)
	}
	t := *old
	t.Overrides = topiccfg.Normalize(overrides)
	t.Config = cfg
	if validateOnly {
		return &t, nil
	}
	if err := s.put(&t, s.nextNum); err != nil {
		return nil, err
	}
	s.topics[name] = &t
	return &t, nil
}

func (s *Store) put(t *Topic, nextNum uint64) error {
	v, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("encode topic %s: %w", t.Name, err)
	}
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], nextNum)
	err = s.db.Update(func(txn *badger.Txn) error {
		if err := txn.Set(topicKey(t.Name), v); err != nil {
			return err
		}
		return txn.Set(seqKey, seq[:])
	})
	if err != nil {
		return fmt.Errorf("store topic %s metadata: %w", t.Name, err)
	}
	// Metadata changes are rare and must survive a crash even when the data path relaxes fsync.
	if err := s.db.Sync(); err != nil {
		return fmt.Errorf("sync topic %s metadata: %w", t.Name, err)
	}
	return nil
}

func topicKey(name string) []byte { return append(append([]byte{}, topicPrefix...), name...) }
