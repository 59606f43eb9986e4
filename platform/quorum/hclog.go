package quorum

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter is an hclog.Logger (what raft, its transport and raft-wal log to) that writes to slog.
// hclog's levels map to slog's as Trace → Debug-4, Debug → Debug, Info → Debug (raft's INFO lines are
// routine: elections, snapshots, connections; the shell logs leadership changes itself at Info),
// Warn → Warn, Error → Error. The logger's name goes into the attribute "component" ("raft",
// "raft.transport", "raft.wal", "raft.snapshots").
type hclogAdapter struct {
	l       *slog.Logger
	name    string
	implied []any
}

var _ hclog.Logger = (*hclogAdapter)(nil)

func newHclog(l *slog.Logger) *hclogAdapter { return &hclogAdapter{l: l, name: "raft"} }

func slogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug, hclog.Info, hclog.NoLevel:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	lv := slogLevel(level)
	ctx := context.Background()
	if !a.l.Enabled(ctx, lv) {
		return
	}
	attrs := make([]any, 0, 2+len(a.implied)+len(args)+1)
	if a.name != "" {
		attrs = append(attrs, "component", a.name)
	}
	attrs = append(attrs, a.implied...)
	for _, v := range args {
		attrs = append(attrs, hclogValue(v))
	}
	if len(args)%2 == 1 { // hclog allows a lone trailing value
		last := attrs[len(attrs)-1]
		attrs = append(attrs[:len(attrs)-1], "extra", last)
	}
	a.l.Log(ctx, lv, msg, attrs...)
}

// hclogValue formats hclog's value wrappers (hclog.Fmt and friends) the way hclog prints them.
func hclogValue(v any) any {
	switch v := v.(type) {
	case hclog.Format:
		if len(v) > 0 {
			if f, ok := v[0].(string); ok {
				return fmt.Sprintf(f, v[1:]...)
			}
		}
		return fmt.Sprint(v...)
	case hclog.Hex:
		return fmt.Sprintf("0x%x", int(v))
	case hclog.Octal:
		return fmt.Sprintf("0%o", int(v))
	case hclog.Binary:
		return fmt.Sprintf("0b%b", int(v))
	case hclog.Quote:
		return strconv.Quote(string(v))
	case hclog.CapturedStacktrace:
		return string(v)
	}
	return v
}

func (a *hclogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hclogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hclogAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hclogAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hclogAdapter) enabled(level hclog.Level) bool {
	return a.l.Enabled(context.Background(), slogLevel(level))
}

func (a *hclogAdapter) IsTrace() bool { return a.enabled(hclog.Trace) }
func (a *hclogAdapter) IsDebug() bool { return a.enabled(hclog.Debug) }
func (a *hclogAdapter) IsInfo() bool  { return a.enabled(hclog.Info) }
func (a *hclogAdapter) IsWarn() bool  { return a.enabled(hclog.Warn) }
func (a *hclogAdapter) IsError() bool { return a.enabled(hclog.Error) }

func (a *hclogAdapter) ImpliedArgs() []any { return a.implied }

func (a *hclogAdapter) With(args ...any) hclog.Logger {
	return &hclogAdapter{l: a.l, name: a.name, implied: append(append([]any(nil), a.implied...), args...)}
}

func (a *hclogAdapter) Name() string { return a.name }

func (a *hclogAdapter) Named(name string) hclog.Logger {
	if a.name != "" {
		name = a.name + "." + name
	}
	return a.ResetNamed(name)
}

func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	return &hclogAdapter{l: a.l, name: name, implied: a.implied}
}

// SetLevel does nothing: the slog handler decides.
func (a *hclogAdapter) SetLevel(hclog.Level) {}

// GetLevel reports the lowest hclog level the slog handler lets through.
func (a *hclogAdapter) GetLevel() hclog.Level {
	for _, l := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Warn, hclog.Error} {
		if a.enabled(l) {
			return l
		}
	}
	return hclog.Off
}

func (a *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(a.StandardWriter(opts), "", 0)
}

// StandardWriter returns a writer that logs each line written to it, at the level of its "[WARN]"
// style tag when it has one, at Info (slog Debug) otherwise.
func (a *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return lineWriter{a}
}

type lineWriter struct{ a *hclogAdapter }

func (w lineWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte{'\n'}) {
		s := string(line)
		level := hclog.Info
		for tag, l := range map[string]hclog.Level{"[TRACE]": hclog.Trace, "[DEBUG]": hclog.Debug,
			"[INFO]": hclog.Info, "[WARN]": hclog.Warn, "[ERR]": hclog.Error, "[ERROR]": hclog.Error} {
			if i := strings.Index(s, tag); i >= 0 {
				level, s = l, strings.TrimSpace(s[i+len(tag):])
				break
			}
		}
		w.a.Log(level, s)
	}
	return len(p), nil
}
