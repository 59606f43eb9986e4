package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"

	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/platform"
	"github.com/runnel-io/runnel/platform/membership"
	"github.com/runnel-io/runnel/platform/netmap"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Exit statuses of `runnel server` and `runnel dev` beyond 0, 1 and 2: the node refused to start
// because of the cluster it found, which a supervisor should not retry blindly.
const (
	exitJoinRefused = 3 // wrong gossip key, duplicate node id
	exitWrongData   = 4 // the data dir belongs to another node or cluster
)

const telemetryHelp = `Traces and metrics go to an OpenTelemetry collector by OTLP (gRPC) when the standard variables say so:
OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://127.0.0.1:4317), OTEL_TRACES_SAMPLER and
OTEL_TRACES_SAMPLER_ARG (e.g. parentbased_traceidratio and 0.01), OTEL_SERVICE_NAME, ...;
OTEL_SDK_DISABLED=true turns all instrumentation off. Without them nothing is exported and tracing
costs nothing. See docs/telemetry.md.

Logs go to stderr as text or JSON (--log-format); lines logged within a traced request carry its
trace_id and span_id.

By default an acks=all write is fsynced (group-committed with concurrent writes) before it is
acknowledged; --no-fsync acknowledges it once written, which is faster and loses the newest writes if
the machine (not just the process) crashes.`

// nodeFlags are the flags `runnel dev` and `runnel server` share.
type nodeFlags struct {
	cfg       platform.Config
	noFsync   bool
	cacheWin  string
	vlogSize  string
	logFormat string
	logLevel  string
}

func (f *nodeFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.cfg.DataDir, "data-dir", f.cfg.DataDir, "directory for the node's data")
	fs.StringVar(&f.cfg.GRPCAddr, "grpc-addr", f.cfg.GRPCAddr, "host:port of the gRPC API (port 0: any free port)")
	fs.StringVar(&f.cfg.HTTPAddr, "http-addr", f.cfg.HTTPAddr, "host:port of the HTTP endpoint: /metrics, /healthz, /readyz, /debug/pprof/ (port 0: any free port)")
	fs.StringVar(&f.cfg.RaftAddr, "raft-addr", f.cfg.RaftAddr, "host:port of the controller quorum's raft transport")
	fs.StringVar(&f.cfg.SerfAddr, "serf-addr", f.cfg.SerfAddr, "host:port of serf gossip, UDP and TCP (empty: no gossip, single node only)")
	fs.BoolVar(&f.noFsync, "no-fsync", false, "acknowledge acks=all writes without waiting for fsync")
	fs.StringVar(&f.cacheWin, "page-cache-window", humanize.IBytes(plog.DefaultPageCacheWindow), "how much of the newest log stays in the page cache; older pages are dropped once on disk, so the kernel reuses their memory (a size such as 256MiB or 2GiB, at least 16MiB; unlimited: leave eviction to the kernel)")
	fs.StringVar(&f.vlogSize, "value-log-file-size", humanize.IBytes(plog.DefaultValueLogFileSize), "size at which the store starts a new value-log file, like Kafka's segment.bytes: larger files pause appends less often (each start holds them ~10-20 ms), smaller ones give disk back sooner after retention; also the largest batch accepted (at least 1MiB, less than 2GiB)")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format on stderr: text or json")
	fs.StringVar(&f.logLevel, "log-level", "info", "least severe level logged: debug, info, warn or error")
}

func newDevCmd() *cobra.Command {
	f := &nodeFlags{cfg: platform.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run one node with embedded storage, for development and trying things out",
		Long: `Run a single-node Runnel on this machine until Ctrl-C (SIGINT) or SIGTERM, then close it cleanly.

The node is a whole cluster of one: its own controller quorum and its only broker. Data is kept in
--data-dir (./data/dev by default), so records survive a restart. Clients reach the node at
--grpc-addr; --http-addr serves GET /metrics (Prometheus text format), GET /healthz (the process is
up), GET /readyz (it serves) and Go profiles under /debug/pprof/. Any address may use port 0 to pick
a free port; the bound addresses are printed on start as a line
  runnel dev: listening grpc=HOST:PORT http=HOST:PORT raft=HOST:PORT serf=HOST:PORT data=DIR fsync=BOOL

For a cluster of several nodes use runnel server (docs/operations.md).

` + telemetryHelp,
		Args: args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error { return runNode(cmd, "runnel dev", f) },
	}
	f.register(cmd.Flags())
	return cmd
}

func newServerCmd() *cobra.Command {
	f := &nodeFlags{cfg: platform.DefaultConfig()}
	var join, gossipKeyFile string
	cmd := &cobra.Command{
		Use:   "server --node-id N [--controller-voters 1@HOST:PORT,...] [--join HOST:PORT,...]",
		Short: "Run a node of a Runnel cluster",
		Long: `Run one node of a cluster until Ctrl-C (SIGINT) or SIGTERM; then it stops cleanly: the controller
moves the partitions it leads to other replicas and it leaves the gossip.

Nodes find each other with serf gossip (--join lists the serf address of any running node) and agree
on topics, partitions and leaders through a Raft quorum of controllers: --controller-voters names
them in Kafka's form ID@RAFT-HOST:PORT (1, 3 or 5 voters, the same list on every node). A node in the
list is a voter; any other follows the metadata log as a non-voter. Every node is a broker.

Start the voters first (in any order: the quorum forms once a majority runs), then any others.
The data dir remembers its node id and cluster id; a node started with another node's or another
cluster's data dir refuses to start (exit status 4). A wrong gossip key or a node id that a running
node already uses is refused too (exit status 3). docs/operations.md walks through a 3-node cluster.

The gossip key (base64 of 16, 24 or 32 bytes, e.g. from: head -c 32 /dev/urandom | base64) comes
from --gossip-key-file or the RUNNEL_GOSSIP_KEY variable, never a flag, so it stays out of ps.

` + telemetryHelp,
		Args: args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("node-id") {
				return &usageError{errors.New("--node-id is required")}
			}
			if !cmd.Flags().Changed("data-dir") {
				f.cfg.DataDir = filepath.Join("data", "node-"+strconv.Itoa(int(f.cfg.NodeID)))
			}
			for _, j := range strings.Split(join, ",") {
				if j = strings.TrimSpace(j); j != "" {
					f.cfg.Join = append(f.cfg.Join, j)
				}
			}
			f.cfg.GossipKey = os.Getenv("RUNNEL_GOSSIP_KEY")
			if gossipKeyFile != "" {
				b, err := os.ReadFile(gossipKeyFile)
				if err != nil {
					return &usageError{fmt.Errorf("--gossip-key-file: %w", err)}
				}
				f.cfg.GossipKey = strings.TrimSpace(string(b))
			}
			return runNode(cmd, "runnel server", f)
		},
	}
	fs := cmd.Flags()
	fs.Int32Var(&f.cfg.NodeID, "node-id", f.cfg.NodeID, "this node's id, unique in the cluster (required)")
	f.register(fs)
	fs.Lookup("data-dir").DefValue = "data/node-ID"
	fs.Lookup("node-id").DefValue = "0" // no default: required
	fs.StringVar(&f.cfg.ControllerVoters, "controller-voters", "", "the controller quorum, ID@RAFT-HOST:PORT,... (empty: this node alone)")
	fs.StringVar(&join, "join", "", "serf addresses (host:port,...) of running nodes to join")
	fs.StringVar(&f.cfg.Rack, "rack", "", "this node's rack; replicas of a partition go to different racks")
	fs.StringVar(&f.cfg.AdvertisedGRPCAddr, "advertise-grpc-addr", "", "gRPC host:port clients are told to use (default: the bound --grpc-addr)")
	fs.DurationVar(&f.cfg.ReplicaLagTimeMax, "replica-lag-time-max", f.cfg.ReplicaLagTimeMax, "how long a follower may lag before its leader drops it from the ISR (Kafka's replica.lag.time.max.ms)")
	fs.Int64Var(&f.cfg.ReplicationThrottle, "replication-throttle", 0, "bytes/s this broker as leader sends to followers out of the ISR (catching up or copying a reassigned partition); 0: no cap")
	fs.StringVar(&gossipKeyFile, "gossip-key-file", "", "file holding the base64 gossip encryption key (default: $RUNNEL_GOSSIP_KEY)")
	// Fault injection only (e2e/, docs/testing.md): inter-node dials go to proxies; hidden from --help.
	fs.StringVar(&f.cfg.DialRewrite, "dial-rewrite", os.Getenv(netmap.EnvVar), "inter-node dial rewrites FROM=TO,... (default: $"+netmap.EnvVar+")")
	_ = fs.MarkHidden("dial-rewrite")
	return cmd
}

// runNode starts a node with f's config, prints where it listens, and runs until the command's context
// ends (Ctrl-C) or the node finds it must stop.
func runNode(cmd *cobra.Command, name string, f *nodeFlags) error {
	logger, err := platform.NewLogger(f.logFormat, f.logLevel, cmd.ErrOrStderr())
	if err != nil {
		return &usageError{fmt.Errorf("--log-format/--log-level: %w", err)}
	}
	cfg := f.cfg
	if f.noFsync {
		cfg.Fsync = false
	}
	win, err := parsePageCacheWindow(f.cacheWin)
	if err != nil {
		return &usageError{err}
	}
	cfg.PageCacheWindow = win
	vlog, err := parseValueLogFileSize(f.vlogSize)
	if err != nil {
		return &usageError{err}
	}
	cfg.ValueLogFileBytes = vlog
	if err := cfg.Validate(); err != nil {
		return &usageError{err}
	}
	node, err := platform.New(cfg, logger)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if err := node.Start(); err != nil {
		node.Close()
		return startErr(err)
	}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "%s: listening grpc=%s http=%s raft=%s serf=%s data=%s fsync=%t\n", name, node.GRPCAddr(), node.HTTPAddr(),
		node.RaftAddr(), node.SerfAddr(), cfg.DataDir, cfg.Fsync)
	if name == "runnel dev" {
		// Name the binary as it was started (./bin/runnel under make run), since it is rarely on PATH.
		hint := os.Args[0] + " topic create hello"
		if node.GRPCAddr() != defaultBrokers {
			hint = "RUNNEL_BROKERS=" + node.GRPCAddr() + " " + hint
		}
		fmt.Fprintf(out, "%s: try, in another terminal:  %s\n", name, hint)
	}
	fmt.Fprintf(out, "%s: press Ctrl-C to stop\n", name)
	var fatal error
	select {
	case <-cmd.Context().Done():
		fmt.Fprintf(out, "%s: stopping (Ctrl-C again to force)\n", name)
	case fatal = <-node.Fatal():
	}
	if err := node.Close(); err != nil && fatal == nil {
		return fmt.Errorf("close node: %w", err)
	}
	if fatal != nil {
		return startErr(fatal)
	}
	fmt.Fprintf(out, "%s: stopped\n", name)
	return nil
}

// startErr gives the refusals a supervisor must not retry blindly their own exit status.
func startErr(err error) error {
	switch {
	case errors.Is(err, membership.ErrEncryption), errors.Is(err, membership.ErrDuplicateNodeID):
		return &exitError{code: exitJoinRefused, err: fmt.Errorf("start node: %w", err)}
	case errors.Is(err, platform.ErrWrongDataDir):
		return &exitError{code: exitWrongData, err: fmt.Errorf("start node: %w", err)}
	}
	return fmt.Errorf("start node: %w", err)
}
