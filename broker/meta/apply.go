package meta

import (
	"fmt"
	"slices"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/topiccfg"
)

// Apply applies cmd, the entry at index of the metadata log, to m and returns the new image and what
// the command gave. A refused command (Result.Err set) leaves the image as it was, apart from Offset.
// Apply is deterministic: the same image and command give the same result on every node.
func Apply(m *Image, index uint64, cmd Command) (*Image, Result) {
	next := m.copyMaps()
	next.Offset = index
	var res Result
	switch cmd.Type {
	case CmdInitCluster:
		res = next.initCluster(cmd)
	case CmdRegisterBroker:
		res = next.registerBroker(index, cmd)
	case CmdUnfenceBroker:
		res = next.unfenceBroker(cmd)
	case CmdFenceBroker:
		res = next.fenceBroker(cmd)
	case CmdCreateTopic:
		res = next.createTopic(cmd)
	case CmdDeleteTopic:
		res = next.deleteTopic(cmd)
	case CmdAlterTopicConfig:
		res = next.alterTopicConfig(cmd)
	case CmdAlterPartition:
		res = next.alterPartition(cmd)
	case CmdAllocateProducerIDs:
		res = next.allocateProducerIDs(cmd)
	case CmdElectPreferredLeaders:
		res = next.electPreferred(cmd)
	case CmdReassignPartition:
		res = next.reassign(cmd)
	default:
		res.Err = rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "unknown metadata command %q", cmd.Type)
	}
	if res.Err != nil {
		unchanged := *m
		unchanged.Offset = index
		return &unchanged, res
	}
	return next, res
}

func (m *Image) initCluster(cmd Command) Result {
	if cmd.ClusterID == "" {
		return Result{Err: rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "empty cluster id")}
	}
	if m.ClusterID != "" && m.ClusterID != cmd.ClusterID {
		return Result{Err: rerr.New(runnelv1.ErrorCode_INCONSISTENT_CLUSTER_ID, "cluster id is already %s", m.ClusterID)}
	}
	m.ClusterID = cmd.ClusterID
	return Result{}
}

func (m *Image) registerBroker(index uint64, cmd Command) Result {
	b := cmd.Broker
	if b == nil || b.ID < 0 || b.GRPCAddr == "" || b.Incarnation == "" {
		return Result{Err: rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "a broker registration needs an id >= 0, a gRPC address and an incarnation")}
	}
	old, exists := m.Brokers[b.ID]
	if exists && old.Incarnation == b.Incarnation {
		// The same start registering again (its first answer was lost, or the controller changed):
		// keep the epoch and fencing, take any new addresses.
		nb := *old
		nb.GRPCAddr, nb.RaftAddr, nb.HTTPAddr, nb.Rack, nb.Controller = b.GRPCAddr, b.RaftAddr, b.HTTPAddr, b.Rack, b.Controller
		m.Brokers[b.ID] = &nb
		return Result{Broker: &nb}
	}
	for _, o := range m.Brokers {
		if o.ID != b.ID && !o.Fenced && o.GRPCAddr == b.GRPCAddr {
			return Result{Err: rerr.New(runnelv1.ErrorCode_DUPLICATE_BROKER_REGISTRATION,
				"gRPC address %s is already registered by live broker %d", b.GRPCAddr, o.ID)}
		}
	}
	nb := *b
	nb.Epoch = index
	nb.Fenced = true
	m.Brokers[b.ID] = &nb
	if exists {
		// A new incarnation: the old one's leaderships and ISR places go, as if it had failed.
		m.moveAway(b.ID)
	}
	return Result{Broker: &nb}
}

func (m *Image) unfenceBroker(cmd Command) Result {
	b, ok := m.Brokers[cmd.BrokerID]
	if !ok {
		return Result{Err: rerr.New(runnelv1.ErrorCode_BROKER_ID_NOT_REGISTERED, "broker %d is not registered", cmd.BrokerID)}
	}
	if cmd.BrokerEpoch != 0 && cmd.BrokerEpoch != b.Epoch {
		return Result{Err: rerr.New(runnelv1.ErrorCode_STALE_BROKER_EPOCH, "broker %d has epoch %d, not %d", b.ID, b.Epoch, cmd.BrokerEpoch)}
	}
	if !b.Fenced {
		return Result{Broker: b}
	}
	nb := *b
	nb.Fenced = false
	m.Brokers[b.ID] = &nb
	// Partitions that waited for this broker (it was the last of their ISR) get it back as leader.
	m.eachPartition(func(t *Topic, _ int32, p *PartitionState) bool {
		if p.Leader != NoLeader {
			return false
		}
		return m.elect(t, p)
	})
	return Result{Broker: &nb}
}

func (m *Image) fenceBroker(cmd Command) Result {
	b, ok := m.Brokers[cmd.BrokerID]
	if !ok {
		return Result{Err: rerr.New(runnelv1.ErrorCode_BROKER_ID_NOT_REGISTERED, "broker %d is not registered", cmd.BrokerID)}
	}
	if cmd.BrokerEpoch != 0 && cmd.BrokerEpoch != b.Epoch {
		return Result{Err: rerr.New(runnelv1.ErrorCode_STALE_BROKER_EPOCH, "broker %d has epoch %d, not %d", b.ID, b.Epoch, cmd.BrokerEpoch)}
	}
	nb := *b
	nb.Fenced = true
	m.Brokers[b.ID] = &nb
	m.moveAway(b.ID)
	return Result{Broker: &nb}
}

// moveAway takes fenced broker id out of every ISR it is in (unless it is the last member) and elects
// new leaders for the partitions it led.
func (m *Image) moveAway(id int32) {
	m.eachPartition(func(t *Topic, _ int32, p *PartitionState) bool {
		changed := false
		if p.InISR(id) && len(p.ISR) > 1 {
			p.ISR = slices.DeleteFunc(p.ISR, func(r int32) bool { return r == id })
			changed = true
		}
		if p.Leader == id {
			if !m.elect(t, p) {
				p.Leader = NoLeader
				p.LeaderEpoch++
				p.PartitionEpoch++
			}
			return true
		}
		if changed {
			p.PartitionEpoch++
		}
		return changed
	})
}

// elect makes the first alive ISR member (in replica order, so the preferred leader wins when it can)
// the leader of p, or with unclean.leader.election.enable the first alive replica, whose log then
// defines the partition: the ISR becomes that replica alone. It bumps the epochs and reports whether
// a leader was found.
func (m *Image) elect(t *Topic, p *PartitionState) bool {
	for _, r := range p.Replicas {
		if p.InISR(r) && m.Alive(r) {
			p.Leader = r
			p.LeaderEpoch++
			p.PartitionEpoch++
			return true
		}
	}
	if !t.Config.UncleanLeaderElection {
		return false
	}
	for _, r := range p.Replicas {
		if m.Alive(r) {
			p.Leader = r
			p.ISR = []int32{r}
			p.LeaderEpoch++
			p.PartitionEpoch++
			return true
		}
	}
	return false
}

// eachPartition calls fn with a copy of every partition's state; when fn changes it and returns true,
// the topic is copied and the change kept.
func (m *Image) eachPartition(fn func(t *Topic, partition int32, p *PartitionState) bool) {
	for name, t := range m.Topics {
		var nt *Topic
		for i := range t.Assignment {
			p := t.Assignment[i].clone()
			if fn(t, int32(i), &p) {
				if nt == nil {
					nt = t.clone()
				}
				nt.Assignment[i] = p
			}
		}
		if nt != nil {
			m.Topics[name] = nt
		}
	}
}

// ValidateCreate checks spec against Kafka's rules and the image (topics, unfenced brokers),
// returning the topic it would create, without id, number, time or placement. Errors:
// rerr.ErrInvalidTopic, ErrTopicAlreadyExists, ErrInvalidPartitions, ErrInvalidReplicationFactor,
// ErrInvalidConfig.
func (m *Image) ValidateCreate(spec Spec) (*Topic, error) {
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
	if alive := int32(len(m.AliveBrokers())); spec.ReplicationFactor > alive {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_REPLICATION_FACTOR, "replication factor %d is larger than the %d available broker(s)", spec.ReplicationFactor, alive)
	}
	cfg, err := topiccfg.Parse(spec.Configs)
	if err != nil {
		return nil, err
	}
	if cfg.MinInsyncReplicas > spec.ReplicationFactor {
		return nil, rerr.New(runnelv1.ErrorCode_INVALID_CONFIG, "min.insync.replicas=%d is larger than the replication factor %d, so acks=all could never succeed", cfg.MinInsyncReplicas, spec.ReplicationFactor)
	}
	if _, ok := m.Topics[spec.Name]; ok {
		return nil, rerr.New(runnelv1.ErrorCode_TOPIC_ALREADY_EXISTS, "topic %q already exists", spec.Name)
	}
	key := topiccfg.CollisionKey(spec.Name)
	for name := range m.Topics {
		if topiccfg.CollisionKey(name) == key {
			return nil, rerr.New(runnelv1.ErrorCode_INVALID_TOPIC_EXCEPTION, "topic %q collides with existing topic %q ('.' and '_' are the same in metric names)", spec.Name, name)
		}
	}
	return &Topic{Name: spec.Name, Partitions: spec.Partitions, ReplicationFactor: spec.ReplicationFactor,
		Overrides: topiccfg.Normalize(spec.Configs), Internal: spec.Internal, Config: cfg}, nil
}

func (m *Image) createTopic(cmd Command) Result {
	if cmd.Spec == nil || cmd.TopicID == "" {
		return Result{Err: rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "a topic creation needs a spec and a topic id")}
	}
	t, err := m.ValidateCreate(*cmd.Spec)
	if err != nil {
		return Result{Err: err}
	}
	t.ID = cmd.TopicID
	t.CreatedMs = cmd.CreatedMs
	t.Num = m.NextTopicNum
	m.NextTopicNum++
	placement := assignReplicas(m.AliveBrokers(), t.Partitions, t.ReplicationFactor, t.Num)
	t.Assignment = make([]PartitionState, t.Partitions)
	for i, replicas := range placement {
		// Every replica of a new partition is in sync: they are all empty.
		t.Assignment[i] = PartitionState{Replicas: replicas, ISR: slices.Clone(replicas), Leader: replicas[0]}
	}
	m.Topics[t.Name] = t
	return Result{Topic: t}
}

func (m *Image) deleteTopic(cmd Command) Result {
	t, ok := m.Topics[cmd.Name]
	if !ok {
		return Result{Err: rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q does not exist", cmd.Name)}
	}
	delete(m.Topics, cmd.Name)
	return Result{Topic: t}
}

// ValidateAlter returns the topic name would become with set and del applied to its overrides.
// Errors: rerr.ErrUnknownTopicOrPartition, rerr.ErrInvalidConfig.
func (m *Image) ValidateAlter(name string, set map[string]string, del []string) (*Topic, error) {
	old, ok := m.Topics[name]
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
	return &t, nil
}

func (m *Image) alterTopicConfig(cmd Command) Result {
	t, err := m.ValidateAlter(cmd.Name, cmd.Set, cmd.Delete)
	if err != nil {
		return Result{Err: err}
	}
	m.Topics[t.Name] = t
	// Turning unclean election on brings back partitions that have no leader.
	if t.Config.UncleanLeaderElection {
		m.eachPartition(func(tt *Topic, _ int32, p *PartitionState) bool {
			return tt.Name == t.Name && p.Leader == NoLeader && m.elect(tt, p)
		})
		t = m.Topics[t.Name]
	}
	return Result{Topic: t}
}

func (m *Image) alterPartition(cmd Command) Result {
	t, ok := m.Topics[cmd.Name]
	if !ok {
		return Result{Err: rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q does not exist", cmd.Name)}
	}
	if cmd.TopicID != "" && cmd.TopicID != t.ID {
		// The leader's topic was deleted and one of the same name created since it proposed: the new
		// topic's epochs start again and could match, so the name alone would apply the old topic's ISR
		// to it (why Kafka's AlterPartition names topics by ID from version 2 on). An empty
		// TopicID (commands logged before it was carried) is checked by name and epochs only.
		return Result{Err: rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q is now topic id %s, not %s (deleted and created again)", cmd.Name, t.ID, cmd.TopicID)}
	}
	p, ok := t.Partition(cmd.Partition)
	if !ok {
		return Result{Err: rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q has no partition %d", cmd.Name, cmd.Partition)}
	}
	switch {
	case p.Leader != cmd.BrokerID:
		return Result{Err: &rerr.Error{Code: runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER, LeaderID: p.Leader, LeaderEpoch: p.LeaderEpoch,
			Message: fmt.Sprintf("broker %d does not lead %s-%d", cmd.BrokerID, cmd.Name, cmd.Partition)}}
	case cmd.LeaderEpoch != p.LeaderEpoch:
		return Result{Err: rerr.New(runnelv1.ErrorCode_FENCED_LEADER_EPOCH, "%s-%d: leader epoch %d, not %d", cmd.Name, cmd.Partition, p.LeaderEpoch, cmd.LeaderEpoch)}
	case cmd.PartitionEpoch != p.PartitionEpoch:
		return Result{Err: rerr.New(runnelv1.ErrorCode_INVALID_UPDATE_VERSION, "%s-%d: partition epoch %d, not %d", cmd.Name, cmd.Partition, p.PartitionEpoch, cmd.PartitionEpoch)}
	}
	isr := make([]int32, 0, len(cmd.ISR))
	for _, r := range p.Replicas { // keep replica order, drop duplicates
		if slices.Contains(cmd.ISR, r) {
			isr = append(isr, r)
		}
	}
	if len(isr) != len(cmd.ISR) || !slices.Contains(isr, p.Leader) {
		return Result{Err: rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s-%d: ISR %v must be distinct replicas of %v including the leader %d", cmd.Name, cmd.Partition, cmd.ISR, p.Replicas, p.Leader)}
	}
	for _, r := range isr {
		if r != p.Leader && !m.Alive(r) && !p.InISR(r) {
			return Result{Err: rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s-%d: fenced broker %d cannot join the ISR", cmd.Name, cmd.Partition, r)}
		}
	}
	nt := t.clone()
	np := &nt.Assignment[cmd.Partition]
	np.ISR = isr
	np.PartitionEpoch++
	m.completeReassignment(nt, cmd.Partition) // a new replica that caught up may finish a move
	m.Topics[t.Name] = nt
	return Result{Topic: nt}
}

// PreferredLeaderMovable reports whether partition p of t would move its leadership to its preferred
// replica: it leads nothing now, is alive and in the ISR.
func (m *Image) PreferredLeaderMovable(p PartitionState) bool {
	if len(p.Replicas) == 0 {
		return false
	}
	pref := p.Replicas[0]
	return p.Leader != pref && p.InISR(pref) && m.Alive(pref)
}

func (m *Image) electPreferred(cmd Command) Result {
	if cmd.Name != "" {
		if _, ok := m.Topics[cmd.Name]; !ok {
			return Result{Err: rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q does not exist", cmd.Name)}
		}
	}
	m.eachPartition(func(t *Topic, i int32, p *PartitionState) bool {
		if cmd.Name != "" && t.Name != cmd.Name {
			return false
		}
		if len(cmd.Partitions) > 0 && !slices.Contains(cmd.Partitions, i) {
			return false
		}
		if !m.PreferredLeaderMovable(*p) {
			return false
		}
		p.Leader = p.Replicas[0]
		p.LeaderEpoch++
		p.PartitionEpoch++
		return true
	})
	return Result{}
}

func (m *Image) reassign(cmd Command) Result {
	t, ok := m.Topics[cmd.Name]
	if !ok {
		return Result{Err: rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q does not exist", cmd.Name)}
	}
	p, ok := t.Partition(cmd.Partition)
	if !ok {
		return Result{Err: rerr.New(runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, "topic %q has no partition %d", cmd.Name, cmd.Partition)}
	}
	if len(cmd.Replicas) == 0 {
		return Result{Err: rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s-%d: an empty replica list", cmd.Name, cmd.Partition)}
	}
	if len(p.Target) > 0 {
		return Result{Err: rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%s-%d is being reassigned to %v already", cmd.Name, cmd.Partition, p.Target)}
	}
	seen := map[int32]bool{}
	for _, r := range cmd.Replicas {
		if seen[r] {
			return Result{Err: rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "replica %d listed twice", r)}
		}
		seen[r] = true
		if _, ok := m.Brokers[r]; !ok {
			return Result{Err: rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "broker %d is not registered", r)}
		}
	}
	if int32(len(cmd.Replicas)) < t.Config.MinInsyncReplicas {
		return Result{Err: rerr.New(runnelv1.ErrorCode_INVALID_REPLICATION_FACTOR, "%d replicas, fewer than min.insync.replicas=%d", len(cmd.Replicas), t.Config.MinInsyncReplicas)}
	}
	// The replicas while moving: the target first (its order decides the preferred leader later), then
	// the old ones that are leaving.
	nt := t.clone()
	np := &nt.Assignment[cmd.Partition]
	all := slices.Clone(cmd.Replicas)
	for _, r := range p.Replicas {
		if !slices.Contains(all, r) {
			all = append(all, r)
		}
	}
	np.Replicas, np.Target = all, slices.Clone(cmd.Replicas)
	np.PartitionEpoch++
	m.Topics[t.Name] = nt
	m.completeReassignment(nt, cmd.Partition)
	return Result{Topic: m.Topics[t.Name]}
}

// completeReassignment finishes the move of t's partition p once every target replica is in the ISR:
// the replica list becomes the target, the others leave the ISR, and a leader that is not in the
// target hands over to the first target replica in the ISR (a leader epoch bump).
func (m *Image) completeReassignment(t *Topic, p int32) {
	st := &t.Assignment[p]
	if len(st.Target) == 0 {
		return
	}
	for _, r := range st.Target {
		if !slices.Contains(st.ISR, r) {
			return
		}
	}
	st.Replicas = st.Target
	st.Target = nil
	st.ISR = slices.DeleteFunc(st.ISR, func(r int32) bool { return !slices.Contains(st.Replicas, r) })
	if !slices.Contains(st.Replicas, st.Leader) {
		st.Leader = NoLeader
		for _, r := range st.Replicas {
			if slices.Contains(st.ISR, r) && m.Alive(r) {
				st.Leader = r
				break
			}
		}
		st.LeaderEpoch++
	}
	st.PartitionEpoch++
}

func (m *Image) allocateProducerIDs(cmd Command) Result {
	if _, ok := m.Brokers[cmd.BrokerID]; !ok {
		return Result{Err: rerr.New(runnelv1.ErrorCode_BROKER_ID_NOT_REGISTERED, "broker %d is not registered", cmd.BrokerID)}
	}
	m.ProducerIDBlocks[cmd.BrokerID] = m.NextProducerID
	m.NextProducerID += ProducerIDBlockSize
	return Result{}
}
