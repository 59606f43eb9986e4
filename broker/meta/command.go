package meta

import (
	"encoding/json"
	"fmt"
)

// CommandType names what a Command does.
type CommandType string

// The commands of the metadata log.
const (
	// CmdInitCluster sets the cluster id; the first controller leader proposes it once.
	CmdInitCluster CommandType = "init_cluster"
	// CmdRegisterBroker adds or updates Broker (registered fenced; a new incarnation fences the old one).
	CmdRegisterBroker CommandType = "register_broker"
	// CmdUnfenceBroker unfences BrokerID at BrokerEpoch once it has caught up with the metadata log.
	CmdUnfenceBroker CommandType = "unfence_broker"
	// CmdFenceBroker fences BrokerID (failed, left, or missed heartbeats) and moves its leaderships.
	CmdFenceBroker CommandType = "fence_broker"
	// CmdCreateTopic creates Spec with the proposer's TopicID and CreatedMs.
	CmdCreateTopic CommandType = "create_topic"
	// CmdDeleteTopic deletes the topic Name.
	CmdDeleteTopic CommandType = "delete_topic"
	// CmdAlterTopicConfig sets Set and removes Delete from the config overrides of topic Name.
	CmdAlterTopicConfig CommandType = "alter_topic_config"
	// CmdAlterPartition changes the ISR of Name/Partition as asked by its leader BrokerID, valid only at
	// LeaderEpoch and PartitionEpoch, and, when TopicID is set, only for the topic of that ID (Kafka's
	// AlterPartition, KIP-497; topic IDs as in its version 2).
	CmdAlterPartition CommandType = "alter_partition"
	// CmdAllocateProducerIDs gives broker BrokerID the next block of ProducerIDBlockSize producer ids.
	CmdAllocateProducerIDs CommandType = "allocate_producer_ids"
	// CmdElectPreferredLeaders gives the leadership of topic Name's partitions (every topic when Name is
	// empty; the partitions in Partitions, all when empty) back to their preferred replica where that
	// replica is alive and in the ISR.
	CmdElectPreferredLeaders CommandType = "elect_preferred_leaders"
	// CmdReassignPartition starts moving partition Name/Partition to the replica list Replicas
	// (preferred leader first); an empty Replicas cancels a reassignment that has not completed.
	CmdReassignPartition CommandType = "reassign_partition"
)

// Command is one entry of the metadata log. Only the fields of its Type are set. Everything that is
// not a pure function of the image (ids, timestamps) is chosen by the proposer and carried here.
type Command struct {
	Type CommandType `json:"type"`

	ClusterID string `json:"cluster_id,omitempty"`

	Broker      *Broker `json:"broker,omitempty"`
	BrokerID    int32   `json:"broker_id,omitempty"`
	BrokerEpoch uint64  `json:"broker_epoch,omitempty"` // 0: whatever the current epoch
	Reason      string  `json:"reason,omitempty"`

	Spec      *Spec  `json:"spec,omitempty"`
	TopicID   string `json:"topic_id,omitempty"`
	CreatedMs int64  `json:"created_ms,omitempty"`

	Name   string            `json:"name,omitempty"`
	Set    map[string]string `json:"set,omitempty"`
	Delete []string          `json:"delete,omitempty"`

	Partition      int32   `json:"partition,omitempty"`
	LeaderEpoch    int32   `json:"leader_epoch,omitempty"`
	PartitionEpoch int32   `json:"partition_epoch,omitempty"`
	ISR            []int32 `json:"isr,omitempty"`
	Partitions     []int32 `json:"partitions,omitempty"`
	Replicas       []int32 `json:"replicas,omitempty"`
}

// Spec is what a create request asks for. Partitions or ReplicationFactor <= 0 take defaults.
type Spec struct {
	Name              string            `json:"name"`
	Partitions        int32             `json:"partitions"`
	ReplicationFactor int32             `json:"replication_factor"`
	Configs           map[string]string `json:"configs,omitempty"`
	Internal          bool              `json:"internal,omitempty"`
}

// Defaults applied by create (Kafka's num.partitions and default.replication.factor are 1 as well).
const (
	DefaultPartitions        = 1
	DefaultReplicationFactor = 1
)

// Encode returns the command as a log entry (JSON: metadata commands are few and small, and a
// readable log is worth more than the bytes).
func (c Command) Encode() []byte {
	b, err := json.Marshal(c)
	if err != nil {
		panic(fmt.Sprintf("meta: encode %s command: %v", c.Type, err)) // only plain fields: cannot fail
	}
	return b
}

// DecodeCommand parses a log entry written by Encode.
func DecodeCommand(data []byte) (Command, error) {
	var c Command
	if err := json.Unmarshal(data, &c); err != nil {
		return Command{}, fmt.Errorf("decode metadata command: %w", err)
	}
	if c.Type == "" {
		return Command{}, fmt.Errorf("decode metadata command: no type")
	}
	return c, nil
}

// Result is what applying a command gave: the topic or broker it made or changed, or the error that
// refused it (a catalogue error from api/rerr; the image is then unchanged).
type Result struct {
	Topic  *Topic
	Broker *Broker
	Err    error
}
