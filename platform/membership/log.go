package membership

import (
	"context"
	"log"
	"log/slog"
	"strings"
	"sync/atomic"
)

// slogWriter turns the lines serf and memberlist write to their *log.Logger into slog records:
// lines starting "[WARN]" or "[ERR]"/"[ERROR]" at warn level (they cover routine events too, such as a
// refused join or a peer that went away, so none of them is an error of this node), everything else at
// debug level. The level prefix is dropped; the rest ("serf: ..." or "memberlist: ...") is the message.
type slogWriter struct {
	l *slog.Logger
}

// newStdLogger returns a *log.Logger for serf and memberlist that writes to l.
func newStdLogger(l *slog.Logger) *log.Logger {
	return log.New(slogWriter{l: l}, "", 0)
}

func (w slogWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelDebug
	if rest, ok := strings.CutPrefix(msg, "["); ok {
		if tag, text, ok := strings.Cut(rest, "]"); ok {
			switch tag {
			case "WARN", "ERR", "ERROR":
				level = slog.LevelWarn
				msg = strings.TrimSpace(text)
			case "TRACE", "DEBUG", "INFO":
				msg = strings.TrimSpace(text)
			}
		}
	}
	w.l.Log(context.Background(), level, msg)
	return len(p), nil
}

// gateHandler passes records on to h until closed is set: serf and memberlist goroutines can outlive
// Shutdown briefly (a probe waits for its ack timer; a stream being handled finishes), and nothing of a
// closed Membership should reach the caller's logger.
type gateHandler struct {
	h      slog.Handler
	closed *atomic.Bool
}

func (g gateHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return !g.closed.Load() && g.h.Enabled(ctx, l)
}

func (g gateHandler) Handle(ctx context.Context, r slog.Record) error {
	if g.closed.Load() {
		return nil
	}
	return g.h.Handle(ctx, r)
}

func (g gateHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return gateHandler{h: g.h.WithAttrs(attrs), closed: g.closed}
}

func (g gateHandler) WithGroup(name string) slog.Handler {
	return gateHandler{h: g.h.WithGroup(name), closed: g.closed}
}
