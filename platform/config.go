// Package platform composes a Runnel node: config, storage, the broker, the gRPC and HTTP servers,
// telemetry (OpenTelemetry providers from OTEL_* variables, /metrics, a slog handler with trace ids).
// Membership (serf) and the controller (raft) join here as the cluster work lands.
package platform

import (
	"fmt"
	"net"
	"time"

	"github.com/runnel-io/runnel/broker/group"
	"github.com/runnel-io/runnel/broker/plog"
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
	// Rack is this node's rack, reported in metadata.
	Rack string
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
	// ShutdownTimeout bounds the graceful stop of the gRPC server before open calls are cut (default 10s).
	ShutdownTimeout time.Duration
	// Groups configures the consumer group coordinator (heartbeat interval, session timeout bounds, group
	// size, offsets retention, ...); zero fields take group.DefaultConfig's values.
	Groups group.Config
	// Telemetry configures metrics (/metrics on HTTPAddr, OTLP) and tracing; the zero value takes
	// everything from the OTEL_* environment variables (see TelemetryConfig).
	Telemetry TelemetryConfig
}

// DefaultConfig returns the configuration of `runnel dev`.
func DefaultConfig() Config {
	return Config{
		NodeID:                 1,
		DataDir:                "./data/dev",
		GRPCAddr:               "127.0.0.1:7070",
		HTTPAddr:               "127.0.0.1:7071",
		Fsync:                  true,
		RetentionCheckInterval: 5 * time.Minute,
		MemTableBytes:          64 << 20,
		BlockCacheBytes:        64 << 20,
		IndexCacheBytes:        32 << 20,
		ValueLogGCInterval:     time.Minute,
		ShutdownTimeout:        10 * time.Second,
		Groups:                 group.DefaultConfig(),
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
	if c.RetentionCheckInterval <= 0 || c.ValueLogGCInterval <= 0 || c.ShutdownTimeout <= 0 {
		return fmt.Errorf("retention check interval, value-log GC interval and shutdown timeout must be positive")
	}
	if c.MemTableBytes < 1<<20 || c.BlockCacheBytes < 0 || c.IndexCacheBytes < 0 {
		return fmt.Errorf("memtable must be at least 1 MiB and caches 0 or more")
	}
	if err := c.Groups.Validate(); err != nil {
		return err
	}
	return nil
}

func (c Config) storeOptions() plog.Options {
	o := plog.DefaultOptions(c.DataDir)
	o.Fsync = c.Fsync
	o.MemTableSize = c.MemTableBytes
	o.BlockCacheSize = c.BlockCacheBytes
	o.IndexCacheSize = c.IndexCacheBytes
	o.GCInterval = c.ValueLogGCInterval
	return o
}
