package platform

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// NewLogger returns the node's logger writing to w: format "text" or "json" (case-insensitive), level
// "debug", "info", "warn" or "error" (slog.Level's names, offsets like "info+2" too). Its handler
// adds trace_id and span_id to records logged with a context that carries a span
// (logger.InfoContext(ctx, ...)), so a log line can be found from a trace and back.
func NewLogger(format, level string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(NewTraceHandler(slog.NewTextHandler(w, opts))), nil
	case "json":
		return slog.New(NewTraceHandler(slog.NewJSONHandler(w, opts))), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}

// TraceHandler is a slog.Handler that adds the trace and span ids of the record's context, when it
// carries a valid span context, as the attributes trace_id and span_id (32 and 16 lowercase hex
// digits, as in W3C traceparent) before passing the record on.
type TraceHandler struct {
	next slog.Handler
}

// NewTraceHandler wraps next.
func NewTraceHandler(next slog.Handler) *TraceHandler { return &TraceHandler{next: next} }

// Enabled reports what the wrapped handler does.
func (h *TraceHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle adds the ids and passes the record on. Like any record attribute, they go under the groups
// opened with WithGroup.
func (h *TraceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.next.Handle(ctx, r)
}

// WithAttrs returns a TraceHandler over the wrapped handler with attrs.
func (h *TraceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &TraceHandler{next: h.next.WithAttrs(attrs)}
}

// WithGroup returns a TraceHandler over the wrapped handler with the group.
func (h *TraceHandler) WithGroup(name string) slog.Handler {
	return &TraceHandler{next: h.next.WithGroup(name)}
}
