package platform

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-io/runnel/api/grpcbuf"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/platform/controller"
	"github.com/runnel-io/runnel/platform/membership"
	"github.com/runnel-io/runnel/platform/quorum"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
)

// Node is one running Runnel node.
type Node struct {
	cfg Config
	log *slog.Logger

	store  *plog.Store
	fsm    *meta.FSM
	quorum *quorum.Quorum
	memb   *membership.Membership // nil when gossip is off (a single node)
	ctl    *controller.Controller
	broker *broker.Broker
	groups *broker.GroupCoordinator
	txns   *broker.TxnCoordinator
	grpc   *grpc.Server
	health *health.Server
	http   *http.Server
	tel    *nodeTelemetry // nil when disabled
	// ready is true from the end of Start to the start of Close: /readyz answers 503 outside it, so a
	// load balancer stops sending before the node stops serving.
	ready atomic.Bool
	// fatal carries the error that makes the node stop (Fatal); stopping is closed by Close.
	fatal    chan error
	stopping chan struct{}

	grpcLn, httpLn, raftLn net.Listener
	wg                     sync.WaitGroup
	closeOnce              sync.Once
	closeErr               error
}

// New validates cfg and returns a node that is not started yet. logger may be nil (slog.Default).
func New(cfg Config, logger *slog.Logger) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &Node{cfg: cfg, log: logger, fatal: make(chan error, 1), stopping: make(chan struct{})}, nil
}

// Start opens storage (recovering it after a crash), binds the listeners and serves. On error nothing
// is left running.
func (n *Node) Start() (err error) {
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	if n.tel, err = startTelemetry(context.Background(), n.cfg, n.log); err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	opts := n.cfg.storeOptions()
	opts.Logger = n.log
	if n.store, err = plog.Open(opts); err != nil {
		return fmt.Errorf("open storage in %s: %w", n.cfg.DataDir, err)
	}
	props, err := loadProperties(n.cfg.DataDir)
	if err != nil {
		return err
	}
	if props.NodeID < 0 && legacyDataDir(n.store) {
		return fmt.Errorf("data dir %s was written by a Runnel version before the cluster (topics kept in the node's own store); start with an empty data dir: %w", n.cfg.DataDir, ErrWrongDataDir)
	}
	if props.NodeID >= 0 && props.NodeID != n.cfg.NodeID {
		return fmt.Errorf("data dir %s belongs to node %d, not node %d: %w", n.cfg.DataDir, props.NodeID, n.cfg.NodeID, ErrWrongDataDir)
	}
	if n.grpcLn, err = net.Listen("tcp", n.cfg.GRPCAddr); err != nil {
		return fmt.Errorf("listen on %s for gRPC (another node running? pick a free address with --grpc-addr): %w", n.cfg.GRPCAddr, err)
	}
	adv := n.cfg.AdvertisedGRPCAddr
	if adv == "" {
		adv = n.grpcLn.Addr().String()
	}
	if n.cfg.HTTPAddr != "" {
		if n.httpLn, err = net.Listen("tcp", n.cfg.HTTPAddr); err != nil {
			return fmt.Errorf("listen on %s for HTTP (pick a free address with --http-addr): %w", n.cfg.HTTPAddr, err)
		}
	}
	// Gossip first: a wrong key, a node id in use or another cluster's data dir is refused before raft
	// does anything.
	raftAddr, err := n.bindRaft()
	if err != nil {
		return err
	}
	if n.cfg.SerfAddr != "" {
		if err := n.startMembership(adv, raftAddr, props); err != nil {
			return err
		}
	}
	if err := n.startQuorum(raftAddr); err != nil {
		return err
	}
	voters, err := n.cfg.voters()
	if err != nil {
		return err
	}
	n.ctl = controller.New(controller.Config{
		Self: meta.Broker{ID: n.cfg.NodeID, GRPCAddr: adv, RaftAddr: n.quorum.Addr(), HTTPAddr: n.HTTPAddr(), Rack: n.cfg.Rack,
			Controller: n.cfg.isVoter()},
		HeartbeatInterval: n.cfg.BrokerHeartbeatInterval, SessionTimeout: n.cfg.BrokerSessionTimeout, Logger: n.log,
		DialOptions: n.cfg.dialRewrite().DialOptions(),
	}, n.fsm, n.quorum, n.memb)
	if n.broker, err = broker.New(broker.Config{NodeID: n.cfg.NodeID, AdvertisedAddr: adv, Rack: n.cfg.Rack, DialOptions: n.cfg.dialRewrite().DialOptions(),
		RetentionCheckInterval: n.cfg.RetentionCheckInterval, ControllerVoters: len(voters), ReplicaLagTimeMax: n.cfg.ReplicaLagTimeMax, ReplicationThrottle: n.cfg.ReplicationThrottle, Telemetry: n.tel.brokerTelemetry()}, n.store, n.ctl, n.log); err != nil {
		return err
	}
	if n.groups, err = broker.NewGroupCoordinator(n.broker, n.cfg.Groups, n.log); err != nil {
		return fmt.Errorf("start the group coordinator: %w", err)
	}
	if n.txns, err = broker.NewTxnCoordinator(n.broker, n.cfg.Transactions, n.log); err != nil {
		return fmt.Errorf("start the transaction coordinator: %w", err)
	}
	n.broker.SetTxnVerifier(n.txns)
	srvOpts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(broker.MaxMessageBytes),
		grpc.MaxSendMsgSize(broker.MaxMessageBytes),
		// Fetch answers go out with their records referenced, not copied (broker/fetch_codec.go).
		broker.ServerCodec(),
		// Produce streams and long polls live long; keep idle connections up and notice dead peers.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	// Received frames read into uncleared buffers, and the SDK's socket buffers and flow-control
	// windows (api/grpcbuf).
	srvOpts = append(srvOpts, grpcbuf.ServerOptions()...)
	n.grpc = grpc.NewServer(append(srvOpts, n.tel.serverOptions()...)...)
	runnelv1.RegisterRecordsServer(n.grpc, n.broker)
	runnelv1.RegisterAdminServer(n.grpc, n.broker)
	runnelv1.RegisterReplicationServer(n.grpc, n.broker)
	runnelv1.RegisterGroupsServer(n.grpc, n.groups)
	runnelv1.RegisterTransactionsServer(n.grpc, n.txns)
	n.ctl.Register(n.grpc)
	n.health = health.NewServer()
	healthpb.RegisterHealthServer(n.grpc, n.health)
	reflection.Register(n.grpc)
	for _, svc := range []string{"", runnelv1.Records_ServiceDesc.ServiceName, runnelv1.Admin_ServiceDesc.ServiceName,
		runnelv1.Groups_ServiceDesc.ServiceName, runnelv1.Cluster_ServiceDesc.ServiceName, runnelv1.Controller_ServiceDesc.ServiceName,
		runnelv1.Replication_ServiceDesc.ServiceName, runnelv1.Transactions_ServiceDesc.ServiceName} {
		n.health.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := n.grpc.Serve(n.grpcLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			n.log.Error("gRPC server stopped", "err", err)
		}
	}()
	if n.httpLn != nil {
		n.http = &http.Server{Handler: n.httpHandler(), ReadHeaderTimeout: 10 * time.Second}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if err := n.http.Serve(n.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				n.log.Error("HTTP server stopped", "err", err)
			}
		}()
	}
	n.wg.Add(1)
	go n.watchClusterID(props)
	n.ready.Store(true)
	// A node that is the whole quorum becomes ready on its own within a second or two: wait, so a
	// caller of Start (runnel dev, tests) may create topics at once. A node of a larger cluster waits
	// for the others; /readyz says when it is ready.
	if voters, _ := n.cfg.voters(); len(voters) == 1 && voters[0].ID == n.cfg.NodeID {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.WaitReady(ctx); err != nil {
			return fmt.Errorf("the single-node cluster did not become ready: %w", err)
		}
		if err := n.waitGroupsLoaded(ctx); err != nil {
			return fmt.Errorf("the single-node cluster did not load its consumer groups: %w", err)
		}
	}
	n.log.Info("node started", "node_id", n.cfg.NodeID, "raft", n.quorum.Addr(), "serf", n.SerfAddr(), "voter", n.cfg.isVoter(), "grpc", n.GRPCAddr(), "http", n.HTTPAddr(), "data_dir", n.cfg.DataDir, "fsync", n.cfg.Fsync,
		"tracing", n.tel.brokerTelemetry().Tracing(), "metrics", n.tel != nil)
	return nil
}

func (n *Node) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !n.ready.Load() || n.broker == nil || !n.broker.Ready() {
			http.Error(w, "not ready\n", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	// Metrics in the Prometheus text format (OpenMetrics when asked), for the OTel instruments of
	// client/telemetry, otelgrpc's RPC metrics and the Go runtime and process collectors.
	if h := n.tel.metricsHandler(); h != nil {
		mux.Handle("GET /metrics", h)
	}
	// Profiles of a running node (go tool pprof http://HOST:PORT/debug/pprof/profile), bound to the
	// HTTP address, which is loopback by default.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	return mux
}

// GRPCAddr returns the bound gRPC address (host:port), or "" before Start.
func (n *Node) GRPCAddr() string {
	if n.grpcLn == nil {
		return ""
	}
	return n.grpcLn.Addr().String()
}

// HTTPAddr returns the bound HTTP address, or "" when HTTP is off or before Start.
func (n *Node) HTTPAddr() string {
	if n.httpLn == nil {
		return ""
	}
	return n.httpLn.Addr().String()
}

// Broker returns the node's broker (nil before Start), for tests and the composition of later parts.
func (n *Node) Broker() *broker.Broker { return n.broker }

// Close stops serving (gracefully within ShutdownTimeout), then closes the broker and storage. It is
// safe to call more than once.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.ready.Store(false)
		close(n.stopping)
		if n.health != nil {
			n.health.Shutdown()
		}
		if n.ctl != nil {
			// Controlled shutdown: the controller moves this broker's leaderships while it still answers.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			n.ctl.Shutdown(ctx)
			cancel()
		}
		if n.broker != nil {
			n.broker.Drain()
		}
		if n.http != nil {
			ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ShutdownTimeout)
			n.http.Shutdown(ctx)
			cancel()
		} else if n.httpLn != nil {
			n.httpLn.Close()
		}
		if n.grpc != nil {
			stopped := make(chan struct{})
			go func() { n.grpc.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(n.cfg.ShutdownTimeout):
				n.grpc.Stop() // long polls and open produce streams are cut
				<-stopped
			}
		} else if n.grpcLn != nil {
			n.grpcLn.Close()
		}
		n.wg.Wait()
		if n.txns != nil {
			// Before the broker: its marker writers call the broker. Unset as the verifier first, so
			// transactional produce is refused rather than sent to a stopped coordinator.
			n.broker.SetTxnVerifier(nil)
			n.txns.Close()
		}
		if n.groups != nil {
			n.groups.Close()
		}
		if n.broker != nil {
			n.broker.Close()
		}
		if n.ctl != nil {
			n.ctl.Close()
		}
		if n.quorum != nil {
			if err := n.quorum.Close(); err != nil {
				n.log.Warn("closing the controller quorum member", "err", err)
			}
		} else if n.raftLn != nil {
			n.raftLn.Close()
		}
		if n.memb != nil {
			n.memb.Close()
		}
		if n.store != nil {
			n.closeErr = n.store.Close()
		}
		// Last: the exporters flush the spans of the calls that just ended.
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ShutdownTimeout)
		if err := n.tel.shutdown(ctx); err != nil {
			n.log.Warn("telemetry shutdown", "err", err)
		}
		cancel()
		if n.closeErr != nil {
			n.log.Error("node stopped, its storage not closed cleanly", "node_id", n.cfg.NodeID, "err", n.closeErr)
		} else {
			n.log.Info("node stopped", "node_id", n.cfg.NodeID)
		}
	})
	return n.closeErr
}
