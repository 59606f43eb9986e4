package plog

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/runnel-io/runnel/client/batch"
)

// Defaults of Options. They size Badger for a node that shares a machine with others: Badger's own
// defaults (64 MiB memtables × 5, 256 MiB block cache) would cost ~600 MiB per node.
const (
	DefaultMemTableSize   = 16 << 20 // bytes per memtable
	DefaultNumMemtables   = 3        // memtables kept in memory (one active, the rest flushing)
	DefaultBlockCacheSize = 32 << 20 // bytes of cached LSM blocks (keys: the offset index)
	DefaultIndexCacheSize = 16 << 20 // bytes of cached table indexes and bloom filters
	// DefaultValueLogFileSize is the bytes per value-log file, the unit value-log GC reclaims. Each
	// rotation to a new file holds every append for the 10-20 ms of Badger's msync of the file it
	// leaves (flush.go); at 190 MB/s a 256 MiB file rotated every 1.3 s, and those holds set the
	// produce p99 at half the maximum throughput (7.2-7.9 ms with 1 GiB files against 11.7-48.8 ms,
	// docs/performance.md). 1 GiB is also Kafka's segment.bytes default.
	DefaultValueLogFileSize = 1 << 30
	DefaultGCInterval       = time.Minute
	DefaultPageCacheWindow  = 256 << 20 // bytes of the newest value log kept in the page cache (see Options.PageCacheWindow)
)

// valueThreshold is the value size (bytes) from which Badger stores a value in the value log instead of
// inline in the LSM tree. No record batch is shorter than its 61-byte header, so every batch goes to the
// value log, which thereby is the partition's append-only log, and the LSM tree holds only keys and
// 12-byte value pointers: the offset index. Time-index and state entries (0 and 16 bytes) stay inline.
const valueThreshold = batch.HeaderSize

// maxQueuedBytes caps the bytes of batches waiting for the writer goroutine. Appends beyond it wait
// (cancellable by their ctx): back-pressure on producers instead of unbounded memory.
const maxQueuedBytes = 64 << 20

// Options configure a Store. Zero sizes take the defaults above, so a Store opened with Options{Dir: d}
// works; DefaultOptions spells them out.
type Options struct {
	Dir              string        // Badger directory (keys and value log); created if missing
	MemTableSize     int64         // bytes per memtable (default 16 MiB); a Badger transaction holds at most 15% of it in keys
	NumMemtables     int           // memtables in memory (default 3)
	BlockCacheSize   int64         // bytes (default 32 MiB)
	IndexCacheSize   int64         // bytes (default 16 MiB)
	ValueLogFileSize int64         // bytes per value-log file (default 1 GiB, Badger allows 1 MiB to 2 GiB-1); also the largest batch Append accepts
	Fsync            bool          // true: fsync group-committed before acks=all (Sync) appends return and before the HW moves
	GCInterval       time.Duration // value-log GC period (default 1 min; < 0 disables the periodic GC, RunValueLogGC still works)
	Logger           *slog.Logger  // nil: slog.Default(); Badger's own messages go here at Warn and above (Info as Debug)
	// MinFreeBytes is the free space the store keeps on its filesystem: appends that would leave less
	// are refused with KAFKA_STORAGE_ERROR until space is freed (default DefaultMinFreeBytes; < 0: no
	// check). Badger writes its value log through a memory map, so a full disk would otherwise end the
	// process with SIGBUS instead of an error.
	MinFreeBytes int64
	// PageCacheWindow is how many bytes of the newest value log (the active file and the ones before
	// it) writes leave in the page cache; pages further behind the write position are dropped once
	// they are clean (written to disk), so reads of them go to the disk (and stay cached as any read's
	// until the kernel needs the memory). 0 takes
	// DefaultPageCacheWindow; < 0 keeps everything and leaves eviction to the kernel. Linux only
	// (elsewhere nothing is dropped); see pagecache.go for why.
	PageCacheWindow int64
	// CloseTimeout bounds how long Close waits for the store to close; 0 or less takes
	// DefaultCloseTimeout (there is no unbounded close: it is what a failed disk would get). A healthy
	// store's close is mostly Badger writing the memtables not yet on disk (up to NumMemtables of
	// MemTableSize each) as tables: 8 ms for a node stopped after 1,000 records. One whose directory
	// is gone or whose disk fails never closes (ErrCloseTimeout).
	CloseTimeout time.Duration
}

// DefaultCloseTimeout is Options.CloseTimeout's default: far above a healthy close (the default
// memtables written as tables), and low enough that a node's whole stop fits in what a supervisor
// waits before it kills a stopping process (systemd's TimeoutStopSec: 90 s), so the node exits with
// its own error. The node's other stop bounds are the controller's handover (5 s), the HTTP endpoint's
// and the gRPC server's graceful stops before the store, and telemetry's flush after it (each the
// node's ShutdownTimeout, 10 s by default): 35 s, 65 s with the store's.
const DefaultCloseTimeout = 30 * time.Second

// DefaultMinFreeBytes is Options.MinFreeBytes's default.
const DefaultMinFreeBytes = 64 << 20

// DefaultOptions returns the defaults for a store in dir, with Fsync on.
func DefaultOptions(dir string) Options {
	return Options{
		Dir:              dir,
		MemTableSize:     DefaultMemTableSize,
		NumMemtables:     DefaultNumMemtables,
		BlockCacheSize:   DefaultBlockCacheSize,
		IndexCacheSize:   DefaultIndexCacheSize,
		ValueLogFileSize: DefaultValueLogFileSize,
		Fsync:            true,
		GCInterval:       DefaultGCInterval,
		PageCacheWindow:  DefaultPageCacheWindow,
		CloseTimeout:     DefaultCloseTimeout,
	}
}

// withDefaults fills zero fields.
func (o Options) withDefaults() Options {
	if o.MemTableSize <= 0 {
		o.MemTableSize = DefaultMemTableSize
	}
	if o.MinFreeBytes == 0 {
		o.MinFreeBytes = DefaultMinFreeBytes
	}
	if o.NumMemtables <= 0 {
		o.NumMemtables = DefaultNumMemtables
	}
	if o.BlockCacheSize <= 0 {
		o.BlockCacheSize = DefaultBlockCacheSize
	}
	if o.IndexCacheSize <= 0 {
		o.IndexCacheSize = DefaultIndexCacheSize
	}
	if o.ValueLogFileSize <= 0 {
		o.ValueLogFileSize = DefaultValueLogFileSize
	}
	if o.GCInterval == 0 {
		o.GCInterval = DefaultGCInterval
	}
	if o.PageCacheWindow == 0 {
		o.PageCacheWindow = DefaultPageCacheWindow
	}
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = DefaultCloseTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// validate reports options Badger would refuse, with the field's name.
func (o Options) validate() error {
	if o.Dir == "" {
		return fmt.Errorf("plog options: Dir is empty")
	}
	if o.ValueLogFileSize < 1<<20 || o.ValueLogFileSize >= 2<<30 {
		return fmt.Errorf("plog options: ValueLogFileSize %d outside [1 MiB, 2 GiB)", o.ValueLogFileSize)
	}
	if o.MemTableSize < 1<<20 {
		return fmt.Errorf("plog options: MemTableSize %d below 1 MiB", o.MemTableSize)
	}
	return nil
}

// badgerOptions translates Options into Badger's.
func (o Options) badgerOptions() badger.Options {
	return badger.DefaultOptions(o.Dir).
		WithValueThreshold(valueThreshold).
		// We fsync ourselves, once per group of transactions (Store.syncToDisk in the syncer goroutine): Badger's
		// SyncWrites would fsync once per Badger write batch, on the writer's critical path.
		WithSyncWrites(false).
		WithMemTableSize(o.MemTableSize).
		WithNumMemtables(o.NumMemtables).
		WithBlockCacheSize(o.BlockCacheSize).
		WithIndexCacheSize(o.IndexCacheSize).
		WithValueLogFileSize(o.ValueLogFileSize).
		// Two compactors (Badger's minimum above zero) instead of four: several nodes share a few cores in tests.
		WithNumCompactors(2).
		WithNumGoroutines(2).
		// Badger's metrics are process-global expvars; the node exports its own through OpenTelemetry.
		WithMetricsEnabled(false).
		WithLogger(badgerLogger{o.Logger.With("component", "badger")})
}

// badgerLogger routes Badger's printf-style logging to slog. Badger logs every compaction and flush at
// Info; those go to Debug so a node's log shows only Badger's warnings and errors.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) log(level slog.Level, format string, args ...any) {
	if !b.l.Enabled(context.Background(), level) {
		return
	}
	b.l.Log(context.Background(), level, strings.TrimRight(fmt.Sprintf(format, args...), "\n"))
}

func (b badgerLogger) Errorf(f string, a ...any)   { b.log(slog.LevelError, f, a...) }
func (b badgerLogger) Warningf(f string, a ...any) { b.log(slog.LevelWarn, f, a...) }
func (b badgerLogger) Infof(f string, a ...any)    { b.log(slog.LevelDebug, f, a...) }
func (b badgerLogger) Debugf(f string, a ...any)   { b.log(slog.LevelDebug-4, f, a...) }
