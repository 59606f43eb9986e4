package main

import (
	"fmt"
	"os"

	"github.com/runnel-io/runnel/platform"
	"github.com/spf13/cobra"
)

func newDevCmd() *cobra.Command {
	cfg := platform.DefaultConfig()
	var (
		noFsync   bool
		logFormat string
		logLevel  string
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run one node with embedded storage, for development and trying things out",
		Long: `Run a single-node Runnel on this machine until Ctrl-C (SIGINT) or SIGTERM, then close it cleanly.

Data is kept in --data-dir (./data/dev by default), so records survive a restart. Clients reach the
node at --grpc-addr; --http-addr serves GET /metrics (Prometheus text format), GET /healthz (the
process is up), GET /readyz (it serves) and Go profiles under /debug/pprof/. Either address may use
port 0 to pick a free port; the bound addresses are printed on start as a line
  runnel dev: listening grpc=HOST:PORT http=HOST:PORT data=DIR fsync=BOOL

Traces and metrics go to an OpenTelemetry collector by OTLP (gRPC) when the standard variables say so:
OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://127.0.0.1:4317), OTEL_TRACES_SAMPLER and
OTEL_TRACES_SAMPLER_ARG (e.g. parentbased_traceidratio and 0.01), OTEL_SERVICE_NAME, ...;
OTEL_SDK_DISABLED=true turns all instrumentation off. Without them nothing is exported and tracing
costs nothing. See docs/telemetry.md.

Logs go to stderr as text or JSON (--log-format); lines logged within a traced request carry its
trace_id and span_id.

By default an acks=all write is fsynced (group-committed with concurrent writes) before it is
acknowledged; --no-fsync acknowledges it once written, which is faster and loses the newest writes if
the machine (not just the process) crashes.`,
		Args: args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := platform.NewLogger(logFormat, logLevel, cmd.ErrOrStderr())
			if err != nil {
				return &usageError{fmt.Errorf("--log-format/--log-level: %w", err)}
			}
			if noFsync {
				cfg.Fsync = false
			}
			if err := cfg.Validate(); err != nil {
				return &usageError{err}
			}
			node, err := platform.New(cfg, logger)
			if err != nil {
				return fmt.Errorf("node: %w", err)
			}
			if err := node.Start(); err != nil {
				node.Close()
				return fmt.Errorf("start node: %w", err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "runnel dev: listening grpc=%s http=%s data=%s fsync=%t\n", node.GRPCAddr(), node.HTTPAddr(), cfg.DataDir, cfg.Fsync)
			// Name the binary as it was started (./bin/runnel under make run), since it is rarely on PATH.
			hint := os.Args[0] + " topic create hello"
			if node.GRPCAddr() != defaultBrokers {
				hint = "RUNNEL_BROKERS=" + node.GRPCAddr() + " " + hint
			}
			fmt.Fprintf(out, "runnel dev: try, in another terminal:  %s\n", hint)
			fmt.Fprintln(out, "runnel dev: press Ctrl-C to stop")
			<-cmd.Context().Done()
			fmt.Fprintln(out, "runnel dev: stopping (Ctrl-C again to force)")
			if err := node.Close(); err != nil {
				return fmt.Errorf("close node: %w", err)
			}
			fmt.Fprintln(out, "runnel dev: stopped")
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the node's data")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", cfg.GRPCAddr, "host:port of the gRPC API (port 0: any free port)")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "host:port of the HTTP endpoint: /metrics, /healthz, /readyz, /debug/pprof/ (port 0: any free port)")
	fs.BoolVar(&noFsync, "no-fsync", false, "acknowledge acks=all writes without waiting for fsync")
	fs.StringVar(&logFormat, "log-format", "text", "log format on stderr: text or json")
	fs.StringVar(&logLevel, "log-level", "info", "least severe level logged: debug, info, warn or error")
	return cmd
}
