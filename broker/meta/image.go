package meta

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	"github.com/runnel-io/runnel/broker/topiccfg"
)

// MaxPartitions caps a topic's partition count, so one request cannot make a node open millions of logs.
const MaxPartitions = 10000

// NoLeader is the leader id of a partition that has none (offline: no eligible replica is alive).
const NoLeader int32 = -1

// Broker is one registered broker.
type Broker struct {
	ID       int32  `json:"id"`
	GRPCAddr string `json:"grpc"`           // host:port of its gRPC API, what clients are told
	RaftAddr string `json:"raft,omitempty"` // host:port of its raft transport
	HTTPAddr string `json:"http,omitempty"` // host:port of /metrics and health, may be empty
	Rack     string `json:"rack,omitempty"`
	// Controller is true for a voter of the controller quorum.
	Controller bool `json:"controller,omitempty"`
	// Incarnation is a random id the broker picks at each start; a registration with a new one means
	// the broker restarted, so what it led is fenced and moved (KIP-631's incarnation id).
	Incarnation string `json:"incarnation"`
	// Epoch is the broker epoch: the metadata offset of its latest registration. Heartbeats and
	// requests that carry an older epoch come from a previous incarnation and are refused.
	Epoch uint64 `json:"epoch"`
	// Fenced brokers lead nothing and are in no ISR (except as the last member). A broker registers
	// fenced and is unfenced once caught up; it is fenced again when it fails or misses heartbeats.
	Fenced bool `json:"fenced"`
}

// PartitionState is one partition's replica set and leadership.
type PartitionState struct {
	// Replicas are the brokers that hold the partition, the preferred leader first.
	Replicas []int32 `json:"replicas"`
	// ISR are the in-sync replicas, in replica order; never empty.
	ISR []int32 `json:"isr"`
	// Leader is the broker that takes produce and fetch requests, or NoLeader.
	Leader int32 `json:"leader"`
	// LeaderEpoch grows by one at every leader change (KIP-101); requests carrying an older one are
	// fenced, and each batch records the epoch that wrote it.
	LeaderEpoch int32 `json:"leader_epoch"`
	// PartitionEpoch grows by one at every change of leader, ISR or replicas (KIP-497), so an ISR change
	// computed from an old state is refused.
	PartitionEpoch int32 `json:"partition_epoch"`
	// Target is the replica list a reassignment moves the partition to (KIP-455), empty when none runs.
	// While it runs, Replicas holds the old and the new replicas, so the new ones copy the log as
	// followers; once every target replica is in the ISR the reassignment completes: Replicas becomes
	// Target, the replicas left out leave the ISR, and a leader left out hands over to one in it.
	Target []int32 `json:"target,omitempty"`
}

// InISR reports whether broker id is in the ISR.
func (p PartitionState) InISR(id int32) bool { return slices.Contains(p.ISR, id) }

// IsReplica reports whether broker id holds the partition.
func (p PartitionState) IsReplica(id int32) bool { return slices.Contains(p.Replicas, id) }

func (p PartitionState) clone() PartitionState {
	p.Replicas = slices.Clone(p.Replicas)
	p.ISR = slices.Clone(p.ISR)
	p.Target = slices.Clone(p.Target)
	return p
}

// Topic is one topic's metadata. Values reachable from an Image are never changed afterwards.
type Topic struct {
	Name              string            `json:"name"`
	ID                string            `json:"id"`  // UUID, unique over the cluster's life
	Num               uint64            `json:"num"` // storage number, never reused (keys of its partitions)
	Partitions        int32             `json:"partitions"`
	ReplicationFactor int32             `json:"replication_factor"`
	Overrides         map[string]string `json:"overrides,omitempty"`
	Internal          bool              `json:"internal,omitempty"`
	CreatedMs         int64             `json:"created_ms"`
	// Assignment holds one state per partition, indexed by partition number.
	Assignment []PartitionState `json:"assignment"`
	// Config is the effective config parsed from Overrides.
	Config topiccfg.Config `json:"-"`
}

// Partition returns the state of partition p and whether the topic has it.
func (t *Topic) Partition(p int32) (PartitionState, bool) {
	if p < 0 || int(p) >= len(t.Assignment) {
		return PartitionState{}, false
	}
	return t.Assignment[p], true
}

func (t *Topic) clone() *Topic {
	c := *t
	c.Assignment = make([]PartitionState, len(t.Assignment))
	for i, p := range t.Assignment {
		c.Assignment[i] = p.clone()
	}
	return &c
}

// Image is the whole metadata at one offset of the metadata log. Never changed once built.
type Image struct {
	// ClusterID is chosen once by the first controller leader; a node whose data dir belongs to another
	// cluster refuses to start.
	ClusterID string `json:"cluster_id"`
	// Offset is the metadata log index of the last command applied (0: none).
	Offset       uint64            `json:"offset"`
	Brokers      map[int32]*Broker `json:"brokers"`
	Topics       map[string]*Topic `json:"topics"`
	NextTopicNum uint64            `json:"next_topic_num"`
	// NextProducerID is the first producer id not handed out yet; ProducerIDBlocks holds, per broker, the
	// start of the latest block of ProducerIDBlockSize ids it was given (KIP-730: brokers hand out ids
	// from blocks, so the controller is asked once per block, not per producer).
	NextProducerID   int64           `json:"next_producer_id"`
	ProducerIDBlocks map[int32]int64 `json:"producer_id_blocks,omitempty"`
}

// ProducerIDBlockSize is how many producer ids one AllocateProducerIDs gives a broker (Kafka's 1000).
const ProducerIDBlockSize = 1000

// Empty returns the image before the first command.
func Empty() *Image {
	return &Image{Brokers: map[int32]*Broker{}, Topics: map[string]*Topic{}, NextTopicNum: 1, ProducerIDBlocks: map[int32]int64{}}
}

// Topic returns the topic called name.
func (m *Image) Topic(name string) (*Topic, bool) {
	t, ok := m.Topics[name]
	return t, ok
}

// TopicList returns every topic sorted by name.
func (m *Image) TopicList() []*Topic {
	out := make([]*Topic, 0, len(m.Topics))
	for _, t := range m.Topics {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Broker returns the registered broker id.
func (m *Image) Broker(id int32) (*Broker, bool) {
	b, ok := m.Brokers[id]
	return b, ok
}

// BrokerList returns every registered broker sorted by id.
func (m *Image) BrokerList() []*Broker {
	out := make([]*Broker, 0, len(m.Brokers))
	for _, b := range m.Brokers {
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Alive reports whether broker id is registered and unfenced.
func (m *Image) Alive(id int32) bool {
	b, ok := m.Brokers[id]
	return ok && !b.Fenced
}

// AliveBrokers returns the unfenced brokers sorted by id.
func (m *Image) AliveBrokers() []*Broker {
	var out []*Broker
	for _, b := range m.BrokerList() {
		if !b.Fenced {
			out = append(out, b)
		}
	}
	return out
}

// Encode returns the image as JSON (the snapshot format).
func (m *Image) Encode() ([]byte, error) { return json.Marshal(m) }

// DecodeImage parses a snapshot written by Encode and re-derives each topic's Config.
func DecodeImage(data []byte) (*Image, error) {
	m := Empty()
	if err := json.Unmarshal(data, m); err != nil {
		return nil, fmt.Errorf("decode metadata image: %w", err)
	}
	if m.Brokers == nil {
		m.Brokers = map[int32]*Broker{}
	}
	if m.Topics == nil {
		m.Topics = map[string]*Topic{}
	}
	if m.ProducerIDBlocks == nil {
		m.ProducerIDBlocks = map[int32]int64{}
	}
	for name, t := range m.Topics {
		cfg, err := topiccfg.Parse(t.Overrides)
		if err != nil {
			return nil, fmt.Errorf("decode metadata image: topic %s: %w", name, err)
		}
		t.Config = cfg
		if int(t.Partitions) != len(t.Assignment) {
			return nil, fmt.Errorf("decode metadata image: topic %s has %d partitions and %d assignments", name, t.Partitions, len(t.Assignment))
		}
	}
	return m, nil
}

// copyMaps returns a shallow copy whose maps may be changed (the values they hold may not).
func (m *Image) copyMaps() *Image {
	c := *m
	c.Brokers = make(map[int32]*Broker, len(m.Brokers)+1)
	for k, v := range m.Brokers {
		c.Brokers[k] = v
	}
	c.Topics = make(map[string]*Topic, len(m.Topics)+1)
	for k, v := range m.Topics {
		c.Topics[k] = v
	}
	c.ProducerIDBlocks = make(map[int32]int64, len(m.ProducerIDBlocks)+1)
	for k, v := range m.ProducerIDBlocks {
		c.ProducerIDBlocks[k] = v
	}
	return &c
}
