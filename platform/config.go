// Package platform composes a Runnel node: config, storage, the broker, the gRPC and HTTP servers,
// telemetry (OpenTelemetry providers from OTEL_* variables, /metrics, a slog handler with trace ids).
// Membership (serf) and the controller (raft) join here as the cluster work lands.
package platform

import (
	"fmt"
	"net"
	"time"

	"github.com/runnel-io/runnel/broker"
	"github.com/runnel-io/runnel/broker/group"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/broker/txn"
	"github.com/runnel-io/runnel/platform/controller"
	"github.com/runnel-io/runnel/platform/membership"
	"github.com/runnel-io/runnel/platform/netmap"
	"github.com/runnel-io/runnel/platform/quorum"
)

// Config is a node's configuration. Start from DefaultConfig, change fields, then Validate (New does).
type Config struct {
	// NodeID is the broker id, unique in a cluster (default 1).
	NodeID int32
	// DataDir holds the node's Badger DB (default ./data/dev).
	DataDir string
	// GRPCAddr is the gRPC API listen address (default 127.0.0.1:7070; port 0 picks a free port).
	GRPCAddr string
	// AdvertisedGRPCAddr is the address clients are told to use; empty means the bound GRPCAddr.
	AdvertisedGRPCAddr string
	// HTTPAddr serves /healthz, /readyz, /metrics and /debug/pprof/ (default 127.0.0.1:7071; empty
	// disables it).
	HTTPAddr string
	// Rack is this node's rack, reported in metadata and used to spread replicas over racks.
	Rack string
	// RaftAddr is the controller quorum's raft transport address, bound and advertised (default
	// 127.0.0.1:7072; port 0 picks a free port, for a single node only, since voters are named by it).
	RaftAddr string
	// ControllerVoters are the raft voters of the controller quorum in Kafka's controller.quorum.voters
	// form "1@host:7072,2@host:7072,3@host:7072" (1, 3 or 5 of them). Empty: this node alone, a
	// single-node cluster. A node not listed follows the metadata log as a non-voter.
	ControllerVoters string
	// SerfAddr is the gossip (serf) address, UDP and TCP (default 127.0.0.1:7946; port 0 picks a free
	// port). Empty turns gossip off, which only a single-node cluster may do.
	SerfAddr string
	// Join lists serf addresses of existing members to join (any one that answers is enough).
	Join []string
	// GossipKey is a base64 AES key (16, 24 or 32 bytes) that encrypts serf gossip; every node of a
	// cluster needs the same one. Empty: gossip in clear.
	GossipKey string
	// ReplicaLagTimeMax is how long a follower may go without catching up with its leader before the
	// leader removes it from the ISR (Kafka's replica.lag.time.max.ms; default 10s).
	ReplicaLagTimeMax time.Duration
	// ReplicationThrottle caps the bytes per second this broker as leader sends to followers out of the
	// ISR (catching up, or copying a reassigned partition); 0: no cap (Kafka's
	// leader.replication.throttled.rate).
	ReplicationThrottle int64
	// BrokerHeartbeatInterval and BrokerSessionTimeout: how often this broker heartbeats to the
	// controller leader, and how long the leader waits for one before fencing a broker (defaults 500ms
	// and 3s; Kafka's broker.heartbeat.interval.ms and broker.session.timeout.ms).
	BrokerHeartbeatInterval time.Duration
	BrokerSessionTimeout    time.Duration
	// Fsync makes acks=all answers wait for an fsync of the data (group-committed), and keeps consumers
	// below the fsynced offset. false relaxes this to "written to the OS", as Kafka's default
	// flush settings do (default true).
	Fsync bool
	// RetentionCheckInterval is how often retention runs (Kafka's log.retention.check.interval.ms,
	// default 5m).
	RetentionCheckInterval time.Duration
	// MemTableBytes, BlockCacheBytes and IndexCacheBytes size Badger (defaults 64 MiB, 64 MiB,
	// 32 MiB), so several nodes fit on one machine in tests.
	MemTableBytes   int64
	BlockCacheBytes int64
	IndexCacheBytes int64
	// ValueLogGCInterval is how often Badger's value-log GC reclaims space freed by retention (default 1m).
	ValueLogGCInterval time.Duration
	// PageCacheWindow is how many bytes of the newest value log stay in the page cache; older pages are
	// dropped once written to disk (plog.Options.PageCacheWindow: 0 takes its default, 256 MiB; < 0
	// keeps everything).
	PageCacheWindow int64
	// ValueLogFileBytes is the size at which the store starts a new value-log file, and the largest
	// batch it accepts (plog.Options.ValueLogFileSize: 0 takes its default, 1 GiB; Badger takes
	// [1 MiB, 2 GiB)).
	ValueLogFileBytes int64
	// ShutdownTimeout bounds the graceful stop of the gRPC server before open calls are cut (default 10s).
	ShutdownTimeout time.Duration
	// Groups configures the consumer group coordinator (heartbeat interval, session timeout bounds, group
	// size, offsets retention, ...); zero fields take group.DefaultConfig's values.
	Groups group.Config
	// Transactions configures the transaction coordinator (default and max transaction timeouts,
	// transactional id expiration, __transaction_state partitions); zero fields take
	// txn.DefaultConfig's values.
	Transactions txn.Config
	// DialRewrite is a table of inter-node dial rewrites, "FROM=TO,..." (netmap.Parse): raft, gossip
	// and broker-to-broker gRPC aimed at FROM dial TO instead. The e2e fault-injection harness uses it to
	// route each link through a proxy it controls (docs/testing.md); empty (the default) changes nothing.
	DialRewrite string
	// Telemetry configures metrics (/metrics on HTTPAddr, OTLP) and tracing; the zero value takes
	// everything from the OTEL_* environment variables (see TelemetryConfig).
	Telemetry TelemetryConfig
}

// DefaultConfig returns the configuration of `runnel dev`.
func DefaultConfig() Config {
	return Config{
		NodeID:                  1,
		DataDir:                 "./data/dev",
		GRPCAddr:                "127.0.0.1:7070",
		HTTPAddr:                "127.0.0.1:7071",
		RaftAddr:                "127.0.0.1:7072",
		SerfAddr:                "127.0.0.1:7946",
		ReplicaLagTimeMax:       broker.DefaultReplicaLagTimeMax,
		BrokerHeartbeatInterval: controller.DefaultHeartbeatInterval,
		BrokerSessionTimeout:    controller.DefaultSessionTimeout,
		Fsync:                   true,
		RetentionCheckInterval:  5 * time.Minute,
		MemTableBytes:           64 << 20,
		BlockCacheBytes:         64 << 20,
		IndexCacheBytes:         32 << 20,
		ValueLogGCInterval:      time.Minute,
		ShutdownTimeout:         10 * time.Second,
		Groups:                  group.DefaultConfig(),
		Transactions:            txn.DefaultConfig(),
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if c.NodeID < 0 {
		return fmt.Errorf("node id %d: must be 0 or more", c.NodeID)
	}
	if c.DataDir == "" {
		return fmt.Errorf("data dir is empty")
	}
	if _, _, err := net.SplitHostPort(c.GRPCAddr); err != nil {
		return fmt.Errorf("grpc addr %q: %w", c.GRPCAddr, err)
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			return fmt.Errorf("http addr %q: %w", c.HTTPAddr, err)
		}
	}
	if _, _, err := net.SplitHostPort(c.RaftAddr); err != nil {
		return fmt.Errorf("raft addr %q: %w", c.RaftAddr, err)
	}
	voters, err := c.voters()
	if err != nil {
		return err
	}
	for _, v := range voters {
		if v.ID == c.NodeID && len(voters) > 1 && v.Addr != c.RaftAddr {
			return fmt.Errorf("raft addr %s differs from this node's entry %d@%s in the controller voters: the others would look for it there", c.RaftAddr, v.ID, v.Addr)
		}
	}
	if c.SerfAddr == "" && (len(voters) > 1 || len(c.Join) > 0) {
		return fmt.Errorf("a cluster of several nodes needs gossip: set the serf address")
	}
	if c.SerfAddr != "" {
		if _, _, err := net.SplitHostPort(c.SerfAddr); err != nil {
			return fmt.Errorf("serf addr %q: %w", c.SerfAddr, err)
		}
	}
	if c.GossipKey != "" {
		if _, err := membership.ParseKey(c.GossipKey); err != nil {
			return err
		}
	}
	if c.ReplicationThrottle < 0 {
		return fmt.Errorf("replication throttle %d: 0 (none) or more bytes/s", c.ReplicationThrottle)
	}
	if c.ReplicaLagTimeMax < 100*time.Millisecond {
		return fmt.Errorf("replica lag time max %v: at least 100ms", c.ReplicaLagTimeMax)
	}
	if c.BrokerHeartbeatInterval <= 0 || c.BrokerSessionTimeout < 2*c.BrokerHeartbeatInterval {
		return fmt.Errorf("broker heartbeat interval %v and session timeout %v: the timeout must be at least two intervals", c.BrokerHeartbeatInterval, c.BrokerSessionTimeout)
	}
	if c.RetentionCheckInterval <= 0 || c.ValueLogGCInterval <= 0 || c.ShutdownTimeout <= 0 {
		return fmt.Errorf("retention check interval, value-log GC interval and shutdown timeout must be positive")
	}
	if c.MemTableBytes < 1<<20 || c.BlockCacheBytes < 0 || c.IndexCacheBytes < 0 {
		return fmt.Errorf("memtable must be at least 1 MiB and caches 0 or more")
	}
	if _, err := netmap.Parse(c.DialRewrite); err != nil {
		return err
	}
	if err := c.Groups.Validate(); err != nil {
		return err
	}
	if err := c.Transactions.Validate(); err != nil {
		return err
	}
	return nil
}

// voters returns the controller quorum: ControllerVoters parsed, or this node alone at RaftAddr.
func (c Config) voters() ([]quorum.Voter, error) {
	if c.ControllerVoters == "" {
		return []quorum.Voter{{ID: c.NodeID, Addr: c.RaftAddr}}, nil
	}
	v, err := quorum.ParseVoters(c.ControllerVoters)
	if err != nil {
		return nil, fmt.Errorf("controller voters: %w", err)
	}
	return v, nil
}

// isVoter reports whether this node is a voter of the controller quorum.
func (c Config) isVoter() bool {
	v, _ := c.voters()
	for _, x := range v {
		if x.ID == c.NodeID {
			return true
		}
	}
	return false
}

func (c Config) storeOptions() plog.Options {
	o := plog.DefaultOptions(c.DataDir)
	o.Fsync = c.Fsync
	o.MemTableSize = c.MemTableBytes
	o.BlockCacheSize = c.BlockCacheBytes
	o.IndexCacheSize = c.IndexCacheBytes
	o.GCInterval = c.ValueLogGCInterval
	o.PageCacheWindow = c.PageCacheWindow
	o.ValueLogFileSize = c.ValueLogFileBytes
	return o
}

// dialRewrite returns DialRewrite parsed (empty when it does not parse, which Validate refuses).
func (c Config) dialRewrite() *netmap.Table {
	t, err := netmap.Parse(c.DialRewrite)
	if err != nil {
		return nil
	}
	return t
}
