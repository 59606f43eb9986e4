// Package platformtest starts real Runnel nodes for tests of any package: in-process, on 127.0.0.1 with
// ports chosen by the kernel, data in a temporary directory, Badger sized small so many nodes fit on
// one machine. It also finds the shared data sets that live beside the repository.
package platformtest

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/runnel-io/runnel/platform"
)

// Config returns a node config for tests: a single-node cluster with data in dir, gRPC, HTTP and raft
// on 127.0.0.1 port 0, no gossip, small Badger memtables and caches, a short shutdown timeout.
func Config(dir string) platform.Config {
	cfg := platform.DefaultConfig()
	cfg.DataDir = dir
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.RaftAddr = "127.0.0.1:0"
	cfg.SerfAddr = ""
	cfg.MemTableBytes = 8 << 20
	cfg.BlockCacheBytes = 8 << 20
	cfg.IndexCacheBytes = 4 << 20
	cfg.ShutdownTimeout = 2 * time.Second
	return cfg
}

// StartNode starts a node with Config(dir) changed by mutate, and closes it when the test ends. Logs are
// discarded unless RUNNEL_TEST_LOG=1.
func StartNode(t testing.TB, dir string, mutate ...func(*platform.Config)) *platform.Node {
	t.Helper()
	cfg := Config(dir)
	for _, m := range mutate {
		m(&cfg)
	}
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("RUNNEL_TEST_LOG") == "1" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	n, err := platform.New(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// SharedData returns the path of a file of the shared data sets, which sit in ../shared/data beside the
// repository root (the directory holding go.mod), in development and in CI alike. It skips the test
// when the file is not there, except under RUNNEL_LONG=1 (make test-long), whose runs exist for those
// data: there a missing file fails the test rather than letting the target pass having run nothing.
func SharedData(t testing.TB, name string) string {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("RUNNEL_LONG") == "1" {
		skip = t.Fatalf
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			skip("no go.mod above the test's directory, so ../shared/data/%s cannot be found", name)
		}
		dir = parent
	}
	path := filepath.Join(dir, "..", "shared", "data", name)
	if _, err := os.Stat(path); err != nil {
		skip("shared data set %s is not there: %v", path, err)
	}
	return path
}
