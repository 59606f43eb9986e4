package platform

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"

	"github.com/runnel-io/runnel/client/telemetry"
)

// TelemetryConfig configures a node's OpenTelemetry. The zero value is the default: metrics on
// /metrics of the HTTP address, and everything else from the standard OTEL_* environment variables
// (docs/telemetry.md):
//
//   - traces are exported by OTLP/gRPC when OTEL_TRACES_EXPORTER=otlp, or when it is unset and
//     OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set; otherwise tracing is
//     off and costs nothing. The exporter reads the other OTEL_EXPORTER_OTLP_* variables (headers,
//     TLS, timeout, compression), the SDK reads OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG and
//     OTEL_BSP_*;
//   - metrics are also exported by OTLP/gRPC when OTEL_METRICS_EXPORTER includes otlp, or when it is
//     unset and OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set, every
//     OTEL_METRIC_EXPORT_INTERVAL;
//   - OTEL_PROPAGATORS picks among tracecontext and baggage (the default is both); others are ignored
//     with a warning;
//   - OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES name the node (default service.name "runnel",
//     service.instance.id the node id);
//   - OTEL_SDK_DISABLED=true is Disabled.
type TelemetryConfig struct {
	// Disabled turns all instrumentation off: no /metrics, no spans, no otelgrpc, no partition rates in
	// DescribeTopics. It is the uninstrumented baseline of the benchmarks.
	Disabled bool
	// TracerProvider, when set, receives the node's spans instead of what the environment says (tests:
	// an SDK provider with tracetest's in-memory exporter). The node does not shut it down.
	TracerProvider trace.TracerProvider
	// MetricReaders are added to the node's meter provider next to the Prometheus exporter (tests: a
	// sdkmetric.ManualReader). The node shuts them down with the provider.
	MetricReaders []sdkmetric.Reader
}

// nodeTelemetry is a started node's OpenTelemetry: its providers, the /metrics handler and the
// broker's instrumentation. A nil *nodeTelemetry is a disabled one.
type nodeTelemetry struct {
	tracing   trace.TracerProvider // nil: tracing off
	meters    *sdkmetric.MeterProvider
	prop      propagation.TextMapPropagator
	metrics   http.Handler
	broker    *telemetry.Broker
	shutdowns []func(context.Context) error // in order
}

// startTelemetry builds the node's telemetry from cfg and the environment. It returns nil when
// disabled.
func startTelemetry(ctx context.Context, cfg Config, log *slog.Logger) (_ *nodeTelemetry, err error) {
	tc := cfg.Telemetry
	if tc.Disabled || envBool("OTEL_SDK_DISABLED") {
		return nil, nil
	}
	t := &nodeTelemetry{prop: propagatorsFromEnv(log)}
	defer func() {
		if err != nil {
			t.shutdown(context.Background())
		}
	}()
	// Defaults first: the environment's attributes override them.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("runnel"), semconv.ServiceInstanceID(strconv.Itoa(int(cfg.NodeID)))),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}

	switch {
	case tc.TracerProvider != nil:
		t.tracing = tc.TracerProvider
	case exporterWanted("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", log):
		if err := grpcProtocol("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"); err != nil {
			return nil, err
		}
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTLP trace exporter: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		t.tracing = tp
		t.shutdowns = append(t.shutdowns, tp.Shutdown)
	}

	// Each node has its own registry: several nodes share a process in tests, and the global registry
	// would mix their series.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	prom, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	t.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom)}
	for _, r := range tc.MetricReaders {
		mopts = append(mopts, sdkmetric.WithReader(r))
	}
	if exporterWanted("OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", log) {
		if err := grpcProtocol("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"); err != nil {
			return nil, err
		}
		exp, err := otlpmetricgrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTLP metric exporter: %w", err)
		}
		mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
	}
	t.meters = sdkmetric.NewMeterProvider(mopts...)
	t.shutdowns = append(t.shutdowns, t.meters.Shutdown)

	bopts := []telemetry.Option{telemetry.WithMeterProvider(t.meters), telemetry.WithPropagator(t.prop)}
	if t.tracing != nil {
		bopts = append(bopts, telemetry.WithTracerProvider(t.tracing))
	}
	if t.broker, err = telemetry.NewBroker(bopts...); err != nil {
		return nil, fmt.Errorf("broker instrumentation: %w", err)
	}
	return t, nil
}

// serverOptions instruments the gRPC server with otelgrpc: a server span per call, continued from the
// caller's trace context in gRPC metadata, and the rpc.server.call.duration histogram per method. With
// tracing off its spans are no-ops that still carry the caller's span context, so logs of a traced call
// show its trace id.
func (t *nodeTelemetry) serverOptions() []grpc.ServerOption {
	if t == nil {
		return nil
	}
	var tp trace.TracerProvider = tracenoop.NewTracerProvider()
	if t.tracing != nil {
		tp = t.tracing
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp),
		otelgrpc.WithMeterProvider(t.meters), otelgrpc.WithPropagators(t.prop)))}
}

// brokerTelemetry returns the broker's instrumentation (nil when disabled).
func (t *nodeTelemetry) brokerTelemetry() *telemetry.Broker {
	if t == nil {
		return nil
	}
	return t.broker
}

// metricsHandler returns the /metrics handler, nil when disabled.
func (t *nodeTelemetry) metricsHandler() http.Handler {
	if t == nil {
		return nil
	}
	return t.metrics
}

// shutdown flushes and stops the exporters (spans still buffered are sent within ctx).
func (t *nodeTelemetry) shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	errs := []error{t.broker.Close()}
	for _, fn := range t.shutdowns {
		errs = append(errs, fn(ctx))
	}
	return errors.Join(errs...)
}

// exporterWanted reports whether the OTLP exporter of a signal is on: its OTEL_*_EXPORTER variable
// lists otlp, or is unset while an OTLP endpoint is set (generally or for the signal).
func exporterWanted(exporterVar, endpointVar string, log *slog.Logger) bool {
	v := strings.TrimSpace(os.Getenv(exporterVar))
	if v == "" {
		return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv(endpointVar) != ""
	}
	otlp := false
	for _, name := range strings.Split(v, ",") {
		switch name = strings.TrimSpace(strings.ToLower(name)); name {
		case "otlp":
			otlp = true
		case "none", "prometheus", "":
			// prometheus: /metrics is always served
		default:
			log.Warn("unsupported OpenTelemetry exporter ignored", "variable", exporterVar, "exporter", name, "supported", "otlp, none")
		}
	}
	return otlp
}

// grpcProtocol checks that the OTLP protocol asked for (signal-specific variable, then the general
// one) is grpc, the only one the node ships.
func grpcProtocol(signalVar string) error {
	for _, name := range []string{signalVar, "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := strings.TrimSpace(os.Getenv(name)); v != "" {
			if v != "grpc" {
				return fmt.Errorf("%s=%s: the node exports OTLP over gRPC only; set it to grpc (and the endpoint to the collector's gRPC port, usually 4317)", name, v)
			}
			return nil
		}
	}
	return nil
}

// propagatorsFromEnv builds the propagator OTEL_PROPAGATORS names (default tracecontext,baggage).
func propagatorsFromEnv(log *slog.Logger) propagation.TextMapPropagator {
	v := strings.TrimSpace(os.Getenv("OTEL_PROPAGATORS"))
	if v == "" {
		v = "tracecontext,baggage"
	}
	var ps []propagation.TextMapPropagator
	for _, name := range strings.Split(v, ",") {
		switch name = strings.TrimSpace(strings.ToLower(name)); name {
		case "tracecontext":
			ps = append(ps, propagation.TraceContext{})
		case "baggage":
			ps = append(ps, propagation.Baggage{})
		case "none", "":
		default:
			log.Warn("unsupported OpenTelemetry propagator ignored", "variable", "OTEL_PROPAGATORS", "propagator", name, "supported", "tracecontext, baggage, none")
		}
	}
	return propagation.NewCompositeTextMapPropagator(ps...)
}

func envBool(name string) bool {
	b, _ := strconv.ParseBool(strings.TrimSpace(os.Getenv(name)))
	return b
}
