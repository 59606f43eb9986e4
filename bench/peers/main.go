// Command peers runs Runnel and the systems users would pick instead, NATS JetStream and Redis
// Streams, side by side on this machine in one run, each driven by its own Go client from this one
// process, and writes bench/out/report.md with charts (see docs/benchmarks.md).
//
// The workloads follow the OpenMessaging Benchmark: 100-byte and 1 KiB records; 1 and 16 producers;
// 1, 12 and 48 partitions; Runnel with acks=1 and acks=all; records with and without keys (keys are the
// origin airports of the real flight data, so the hot-key skew is real); a consume-from-backlog run;
// and a latency run paced at half of each system's measured maximum, with coordinated omission
// corrected. The machine's ceilings (disk write with fdatasync, a bare gRPC stream) are measured in the
// same run, before the first system and after the last; the ratios use the higher. Every run gets a
// freshly started server (one at a time, on 127.0.0.1, with an empty data directory under -out), which
// is stopped by PID and its data removed afterwards.
//
// Usage: go run ./bench/peers [-full] [-runnel bin/runnel] [-out bench/out] ... (scripts/bench-compare.sh)
//
//	go run ./bench/peers -report-only bench/out/results.json   re-render the report from saved results
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/runnel-io/runnel/bench/internal/ceiling"
	"github.com/runnel-io/runnel/bench/profile"
	"github.com/runnel-io/runnel/bench/report"
	"github.com/runnel-io/runnel/client"
)

type options struct {
	out, runnelBin, natsBin, redisBin, data, runnelVersion string
	full                                                   bool
	systems, only                                          string
	natsMaxPending, redisPipeline                          int
	ceilingDur                                             time.Duration
	t                                                      timing
	loadFraction                                           float64
}

func main() {
	var o options
	reportOnly := flag.String("report-only", "", "only render the report from this results.json")
	summarize := flag.String("summarize", "", "only write this summary (e.g. bench/out/report.md) of the rounds whose results.json files follow as arguments, in round order; each round's report.md must sit beside its results.json (it is linked)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this harness process (its clients, not the servers) to this file")
	memProfile := flag.String("memprofile", "", "write an allocation profile of this harness process (its clients, not the servers) to this file at the end: every allocation of the run")
	flag.StringVar(&o.out, "out", "bench/out", "directory for the report, charts, results.json and the servers' data (-report-only writes next to its results.json instead)")
	flag.StringVar(&o.runnelBin, "runnel", "bin/runnel", "the runnel binary (make build)")
	flag.StringVar(&o.runnelVersion, "runnel-version", "", "how to name the runnel build in the report (default: the binary's path)")
	flag.StringVar(&o.natsBin, "nats-server", "nats-server", "the nats-server binary")
	flag.StringVar(&o.redisBin, "redis-server", "redis-server", "the redis-server binary")
	flag.StringVar(&o.data, "data", "../shared/data/flights-3m.ndjson.zst", "the flight data; keys are its origin airports")
	flag.BoolVar(&o.full, "full", false, "run the whole matrix (hours) instead of the reduced one (about 10 minutes)")
	flag.StringVar(&o.systems, "systems", "", "comma-separated system families to run: runnel,jetstream,redis (default all)")
	flag.StringVar(&o.only, "workloads", "", "run only workloads whose name contains this (e.g. \"100B 1prod\")")
	flag.IntVar(&o.natsMaxPending, "nats-max-pending", 4096, "JetStream async publishes in flight per producer (nats.go's default is 4000)")
	flag.IntVar(&o.redisPipeline, "redis-pipeline", 1000, "XADDs per pipeline round trip per producer")
	flag.DurationVar(&o.ceilingDur, "ceiling-duration", 3*time.Second, "how long each ceiling is measured")
	flag.DurationVar(&o.t.warmup, "warmup", 0, "warm-up of produce and latency runs (default 2s, -full 5s)")
	flag.DurationVar(&o.t.measure, "measure", 0, "measurement window of produce runs (default 8s, -full 20s)")
	flag.DurationVar(&o.t.latency, "latency-window", 0, "measurement window of latency and e2e runs (default 8s, -full 30s)")
	flag.Int64Var(&o.t.backlog, "backlog", 0, "records in the consume runs' backlog (default 3,000,000, -full 5,000,000)")
	flag.IntVar(&o.t.passes, "consume-passes", 3, "times each consume run reads its backlog, each with a new consumer; the median pass is reported")
	flag.Float64Var(&o.loadFraction, "load", 0.5, "fraction of each system's maximum the latency runs are paced at")
	flag.Parse()
	if *summarize != "" {
		if err := summarizeRounds(*summarize, flag.Args()); err != nil {
			fatal(err)
		}
		fmt.Println("wrote", *summarize)
		return
	}
	if *reportOnly != "" {
		res, err := report.Load(*reportOnly)
		if err == nil {
			err = report.Write(filepath.Dir(*reportOnly), res)
		}
		if err != nil {
			fatal(err)
		}
		fmt.Println("wrote", filepath.Join(filepath.Dir(*reportOnly), "report.md"))
		return
	}
	if o.t.passes < 1 {
		fatal(fmt.Errorf("-consume-passes %d: must be at least 1", o.t.passes))
	}
	def := func(d *time.Duration, reduced, full time.Duration) {
		if *d == 0 {
			*d = reduced
			if o.full {
				*d = full
			}
		}
	}
	def(&o.t.warmup, 2*time.Second, 5*time.Second)
	def(&o.t.measure, 8*time.Second, 20*time.Second)
	def(&o.t.latency, 8*time.Second, 30*time.Second)
	if o.t.backlog == 0 {
		o.t.backlog = 3_000_000
		if o.full {
			o.t.backlog = 5_000_000
		}
	}
	o.t.flush = 2 * time.Minute
	for _, bin := range []*string{&o.runnelBin, &o.natsBin, &o.redisBin} {
		if strings.ContainsRune(*bin, filepath.Separator) { // the servers run in their data directories
			if abs, err := filepath.Abs(*bin); err == nil {
				*bin = abs
			}
		}
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	stopCPU, err := profile.StartCPU(*cpuProfile)
	if err != nil {
		fatal(err)
	}
	if err := run(ctx, o); err != nil {
		stopCPU()
		fatal(err)
	}
	// The CPU profile stops before the allocation profile's collection and writing, which are not the
	// run's.
	stopCPU()
	if err := profile.WriteAllocs(*memProfile); err != nil {
		fatal(err)
	}
	// What was measured is saved; the exit status says it is not the whole run, so that a script running
	// several rounds stops instead of going on to the next.
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "interrupted: the partial results are in", filepath.Join(o.out, "results.json"))
		os.Exit(130)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench/peers:", err)
	os.Exit(1)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// server is a running server of one family; driver makes a Driver for one of its systems.
type server interface{ stop() }

// group is one server configuration and the systems (client settings) run against it.
type group struct {
	family  string
	label   string
	start   func(dir string) (server, error)
	systems []sysSpec
}

type sysSpec struct {
	info    report.System
	driver  func(server) (Driver, error)
	consume bool // run the consume workloads (the read path does not depend on acks or fsync)
}

func clientVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == path {
				return path + " " + d.Version
			}
		}
	}
	return path
}

func groups(o options) []group {
	runnelVer := o.runnelVersion
	if runnelVer == "" {
		runnelVer = o.runnelBin
	}
	natsVer := versionOf(o.natsBin, `v?\d+\.\d+\.\d+`, "--version")
	redisVer := versionOf(o.redisBin, `v=\S+`, "--version")
	redisVer = strings.TrimPrefix(redisVer, "v=")
	sdk := "runnel client/ (this tree), SDK defaults: " + sdkDefaults(client.DefaultProducer())
	runnelDrv := func(acks client.Acks) func(server) (Driver, error) {
		return func(s server) (Driver, error) { return newRunnelDriver(s.(*runnelServer).brokers, acks) }
	}
	redisSettings := func(fs string) string {
		return fmt.Sprintf("appendonly yes, appendfsync %s, RDB off; one stream per partition; XADD pipelines of up to %d per producer connection, one in flight; reads: XREAD COUNT %d over all streams", fs, o.redisPipeline, redisReadCount)
	}
	redisDrv := func(s server) (Driver, error) { return newRedisDriver(s.(*redisServer).addr, o.redisPipeline), nil }
	return []group{
		{family: "jetstream", label: "nats-server -js",
			start: func(dir string) (server, error) { return startNATS(o.natsBin, dir) },
			systems: []sysSpec{
				{info: report.System{Name: "jetstream", Family: "jetstream", Version: "nats-server " + natsVer,
					Client:     clientVersion("github.com/nats-io/nats.go") + " (jetstream package)",
					Durability: report.DurOS,
					DurabilityNote: "acknowledged once the message is in the stream's block file (OS page cache); nats-server 2.9 fsyncs every 2 minutes " +
						"and cannot fsync per write (sync_interval: always exists from 2.10 on)",
					Settings: fmt.Sprintf("file storage, 1 replica, one stream per partition (subjects <topic>.<partition>.<key>); async publish, %d in flight per producer connection; reads: one ordered consumer per stream", o.natsMaxPending)},
					driver: func(s server) (Driver, error) { return newJSDriver(s.(*natsServer).url, o.natsMaxPending) }, consume: true},
			}},
		{family: "redis", label: "redis-server appendfsync always",
			start: func(dir string) (server, error) { return startRedis(o.redisBin, dir, "always") },
			systems: []sysSpec{
				{info: report.System{Name: "redis always", Family: "redis", Version: "redis-server " + redisVer,
					Client: clientVersion("github.com/redis/go-redis/v9"), Durability: report.DurFsync,
					DurabilityNote: "acknowledged after the AOF is fsynced (once per event-loop pass, shared by a pipeline)",
					Settings:       redisSettings("always")},
					driver: redisDrv},
			}},
		{family: "redis", label: "redis-server appendfsync everysec",
			start: func(dir string) (server, error) { return startRedis(o.redisBin, dir, "everysec") },
			systems: []sysSpec{
				{info: report.System{Name: "redis everysec", Family: "redis", Version: "redis-server " + redisVer,
					Client: clientVersion("github.com/redis/go-redis/v9"), Durability: report.DurOS,
					DurabilityNote: "acknowledged once the AOF is written to the OS; fsynced every second",
					Settings:       redisSettings("everysec")},
					driver: redisDrv, consume: true},
			}},
		{family: "runnel", label: "runnel dev (fsync on)",
			start: func(dir string) (server, error) { return startRunnel(o.runnelBin, dir, true) },
			systems: []sysSpec{
				{info: report.System{Name: "runnel acks=all", Family: "runnel", Version: runnelVer, Client: sdk, Durability: report.DurFsync,
					DurabilityNote: "acknowledged after the batch is fsynced (group commit)",
					Settings:       "runnel dev, single node, fsync on; topic with N partitions; acks=all"},
					driver: runnelDrv(client.AcksAll), consume: true},
				{info: report.System{Name: "runnel acks=1", Family: "runnel", Version: runnelVer, Client: sdk, Durability: report.DurOS,
					DurabilityNote: "acknowledged once the leader wrote the batch, before fsync",
					Settings:       "runnel dev, single node, fsync on; topic with N partitions; acks=1"},
					driver: runnelDrv(client.AcksLeader)},
			}},
		{family: "runnel", label: "runnel dev --no-fsync",
			start: func(dir string) (server, error) { return startRunnel(o.runnelBin, dir, false) },
			systems: []sysSpec{
				{info: report.System{Name: "runnel acks=all no-fsync", Family: "runnel", Version: runnelVer, Client: sdk, Durability: report.DurOS,
					DurabilityNote: "acknowledged once written to the OS (--no-fsync): the durability JetStream 2.9 offers",
					Settings:       "runnel dev --no-fsync, single node; topic with N partitions; acks=all"},
					driver: runnelDrv(client.AcksAll)},
			}},
	}
}

// matrix returns the workloads to run.
func matrix(full bool, load float64) (produce, consume, lat []report.Workload) {
	p := func(size, prods, parts int, keys bool) report.Workload {
		return report.Workload{Kind: report.KindProduce, Size: size, Producers: prods, Partitions: parts, Keys: keys}
	}
	if !full {
		produce = []report.Workload{p(100, 1, 12, false), p(100, 16, 12, true), p(100, 1, 1, false), p(1024, 1, 12, false)}
		consume = []report.Workload{{Kind: report.KindConsume, Size: 100, Producers: 1, Partitions: 12}}
		lat = []report.Workload{{Kind: report.KindLatency, Size: 100, Producers: 1, Partitions: 12, LoadFraction: load}}
		return
	}
	for _, size := range []int{100, 1024} {
		for _, prods := range []int{1, 16} {
			for _, parts := range []int{1, 12, 48} {
				for _, keys := range []bool{false, true} {
					produce = append(produce, p(size, prods, parts, keys))
				}
			}
		}
		consume = append(consume, report.Workload{Kind: report.KindConsume, Size: size, Producers: 1, Partitions: 12})
		lat = append(lat, report.Workload{Kind: report.KindLatency, Size: size, Producers: 1, Partitions: 12, LoadFraction: load})
	}
	lat = append(lat, report.Workload{Kind: report.KindLatency, Size: 100, Producers: 16, Partitions: 12, Keys: true, LoadFraction: load})
	return
}

func selected(o options, w report.Workload) bool {
	return o.only == "" || strings.Contains(w.ID(), o.only)
}

func run(ctx context.Context, o options) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp(o.out, "run-")
	if err != nil {
		return err
	}
	if work, err = filepath.Abs(work); err != nil { // the servers run in their own directories
		return err
	}
	defer os.RemoveAll(work)
	res := &report.Results{Started: time.Now(), Matrix: "reduced", Command: strings.Join(os.Args, " ")}
	if o.full {
		res.Matrix = "full"
	}
	res.Machine = machineInfo(work)
	logf("machine: %d CPUs, %.0f GiB, %s; load %s", res.Machine.CPUs, res.Machine.MemoryGB, res.Machine.Kernel, res.Machine.LoadAvg)
	// The flight data is read only when a selected workload has keys, so a keyless subset runs
	// without it.
	var keys *flightKeys
	produce, consume, lat := matrix(o.full, o.loadFraction)
	if slices.ContainsFunc(slices.Concat(produce, consume, lat), func(w report.Workload) bool { return w.Keys && selected(o, w) }) {
		logf("loading keys from %s", o.data)
		if keys, err = loadFlightKeys(o.data, 1_000_000); err != nil {
			return fmt.Errorf("flight data (keys, -data): %w", err)
		}
	}
	src := newSource(keys)

	if err := measureCeilings(res, work, o.ceilingDur, "start"); err != nil {
		return err
	}

	families := map[string]bool{}
	for _, f := range strings.Split(o.systems, ",") {
		if f = strings.TrimSpace(f); f != "" {
			families[f] = true
		}
	}
	seq := 0
	topic := func() string { seq++; return fmt.Sprintf("rb%03d", seq) }
	shape := func(w report.Workload) string {
		return fmt.Sprintf("%d/%d/%d/%t", w.Size, w.Producers, w.Partitions, w.Keys)
	}
	pacedRate := map[string]float64{} // system + shape -> the rate of its latency run
	record := func(r report.Run) {
		res.Runs = append(res.Runs, r)
		line := fmt.Sprintf("  %-26s %-44s %11.0f rec/s %8.1f MB/s", r.System, r.Workload.ID(), r.RecordsPerSec, r.MBPerSec)
		if r.Latency != nil {
			line += fmt.Sprintf("  p50 %.2f p99 %.2f p99.9 %.2f ms", r.Latency.P50Ms, r.Latency.P99Ms, r.Latency.P999Ms)
		}
		if r.EndToEnd != nil {
			line += fmt.Sprintf("  e2e p50 %.2f p99 %.2f p99.9 %.2f ms", r.EndToEnd.P50Ms, r.EndToEnd.P99Ms, r.EndToEnd.P999Ms)
		}
		if r.Error != "" {
			line += "  ERROR " + r.Error
		}
		logf("%s", line)
	}
	maxRate := map[string]float64{} // system + shape -> records/s of its produce run
	runs := 0
	for gi, g := range groups(o) {
		if len(families) > 0 && !families[g.family] {
			continue
		}
		for _, s := range g.systems {
			res.Systems = append(res.Systems, s.info)
		}
		// fresh runs fn against a freshly started server with an empty data directory, which is
		// stopped and removed afterwards: no run pays for what an earlier one left behind
		// (compaction, deleted data, caches), on any system.
		fresh := func(s sysSpec, fn func(Driver)) {
			if ctx.Err() != nil {
				return
			}
			runs++
			dir := filepath.Join(work, fmt.Sprintf("%d-%s-%d", gi, g.family, runs))
			srv, err := g.start(dir)
			if err != nil {
				res.Notes = append(res.Notes, fmt.Sprintf("%s did not start: %v", g.label, err))
				logf("  %s did not start: %v", g.label, err)
				return
			}
			defer os.RemoveAll(dir)
			defer srv.stop()
			d, err := s.driver(srv)
			if err != nil {
				res.Notes = append(res.Notes, fmt.Sprintf("%s: client: %v", s.info.Name, err))
				return
			}
			defer d.Close()
			fn(d)
		}
		logf("%s", g.label)
		for _, w := range consume {
			for _, s := range g.systems {
				if s.consume && selected(o, w) {
					fresh(s, func(d Driver) { record(runConsume(ctx, d, s.info.Name, w, topic(), src, o.t)) })
				}
			}
		}
		for _, w := range produce {
			for _, s := range g.systems {
				if selected(o, w) {
					fresh(s, func(d Driver) {
						r := runProduce(ctx, d, s.info.Name, w, topic(), src, o.t)
						maxRate[s.info.Name+shape(w)] = r.RecordsPerSec
						record(r)
					})
				}
			}
		}
		for _, lw := range lat {
			// The latency run (no consumer: the produce latency) and then the e2e run (a consumer reading
			// along), both paced at the fraction of the system's maximum for the same shape.
			ew := lw
			ew.Kind = report.KindEndToEnd
			for _, w := range []report.Workload{lw, ew} {
				for _, s := range g.systems {
					if !selected(o, w) {
						continue
					}
					mw := w
					mw.Kind, mw.LoadFraction = report.KindProduce, 0
					if _, ok := maxRate[s.info.Name+shape(mw)]; !ok { // its produce run was filtered out: run it now
						fresh(s, func(d Driver) {
							r := runProduce(ctx, d, s.info.Name, mw, topic(), src, o.t)
							maxRate[s.info.Name+shape(mw)] = r.RecordsPerSec
							record(r)
						})
					}
					rate := maxRate[s.info.Name+shape(mw)] * w.LoadFraction
					fresh(s, func(d Driver) { record(runLatency(ctx, d, s.info.Name, w, topic(), src, rate, o.t)) })
					pacedRate[s.info.Name+w.Kind+shape(w)] = rate
					// Runnel also at JetStream's rate (the peers run first): the same absolute load.
					if js, ok := pacedRate["jetstream"+w.Kind+shape(w)]; ok && s.info.IsRunnel() {
						jw := w
						jw.PacedAs = "jetstream"
						fresh(s, func(d Driver) { record(runLatency(ctx, d, s.info.Name, jw, topic(), src, js, o.t)) })
					}
				}
			}
		}
	}
	// A failed measurement at the end costs only itself: the runs are saved with the ceilings of the
	// start, and a note says so.
	endCeilings := false
	if ctx.Err() == nil {
		if err := measureCeilings(res, work, o.ceilingDur, "end"); err != nil {
			res.Notes = append(res.Notes, fmt.Sprintf("the ceilings could not be measured again at the end (%v): the ratios use those of the start", err))
			logf("  %v", err)
		} else {
			endCeilings = true
		}
	}
	res.Finished = time.Now()
	res.Machine.LoadAvgEnd = loadAvg()
	if ctx.Err() != nil {
		res.Interrupted = true
		note := "the run was interrupted: some runs are missing"
		if !endCeilings {
			note += ", and the ceilings were measured only at its start"
		}
		res.Notes = append(res.Notes, note)
	}
	res.Notes = append(res.Notes, fmt.Sprintf("harness: Go %s, GOMAXPROCS %d; produce runs: %v warm-up then %v measured; latency runs: %v warm-up then %v measured; consume backlog %d records, read %d times (the median pass reported)",
		runtime.Version(), runtime.GOMAXPROCS(0), o.t.warmup, o.t.measure, o.t.warmup, o.t.latency, o.t.backlog, o.t.passes))
	if err := res.Save(filepath.Join(o.out, "results.json")); err != nil {
		return err
	}
	if err := report.Write(o.out, res); err != nil {
		return err
	}
	logf("wrote %s", filepath.Join(o.out, "report.md"))
	return nil
}

// summarizeRounds writes out, the summary of the rounds whose results.json files are paths (in round
// order), linking each round's report.md (beside its results.json) relative to out.
func summarizeRounds(out string, paths []string) error {
	if len(paths) == 0 {
		return errors.New("-summarize: no results.json files given")
	}
	rounds := make([]*report.Results, len(paths))
	links := make([]string, len(paths))
	for k, path := range paths {
		r, err := report.Load(path)
		if err != nil {
			return fmt.Errorf("round %d: %w", k+1, err)
		}
		rounds[k] = r
		own := filepath.Join(filepath.Dir(path), "report.md")
		if _, err := os.Stat(own); err != nil {
			return fmt.Errorf("round %d: its report, linked from the summary: %w", k+1, err)
		}
		rel, err := relPath(filepath.Dir(out), own)
		if err != nil {
			return fmt.Errorf("round %d: %w", k+1, err)
		}
		links[k] = filepath.ToSlash(rel)
	}
	var b bytes.Buffer
	if err := report.RoundsMarkdown(&b, rounds, links); err != nil {
		return err
	}
	return os.WriteFile(out, b.Bytes(), 0o644)
}

// relPath is target relative to base, made absolute first so that a relative and an absolute path (an
// -summarize output in /tmp, rounds under bench/out) still relate.
func relPath(base, target string) (string, error) {
	absBase, err := filepath.Abs(base)
	if err != nil {
		return "", err
	}
	absTarget, err := filepath.Abs(target)
	if err != nil {
		return "", err
	}
	return filepath.Rel(absBase, absTarget)
}

// measureCeilings measures the machine's ceilings (the disk with and without an fdatasync per MiB, the
// bare gRPC stream), dur each, and adds them to res (Results.AddCeiling keeps the higher of a
// ceiling's measurements); when names the moment for the log ("start", "end").
func measureCeilings(res *report.Results, work string, dur time.Duration, when string) error {
	logf("measuring the machine's ceilings at the %s (%v each)", when, dur)
	for _, sync := range []bool{true, false} {
		c, err := ceiling.DiskWrite(work, 1<<20, dur, sync)
		if err != nil {
			return fmt.Errorf("disk ceiling at the %s: %w", when, err)
		}
		res.AddCeiling(c.Name, c.MBPerSec, strings.ReplaceAll(c.Note, work, "the data directory"))
		logf("  %-28s %8.1f MB/s", c.Name, c.MBPerSec)
	}
	c, err := ceiling.GRPCStream(1<<20, dur)
	if err != nil {
		return fmt.Errorf("grpc ceiling at the %s: %w", when, err)
	}
	res.AddCeiling(c.Name, c.MBPerSec, c.Note)
	logf("  %-28s %8.1f MB/s", c.Name, c.MBPerSec)
	return nil
}

// sdkDefaults describes the Runnel SDK's producer defaults the harness runs with (it sets no option but
// acks), read from the SDK so the report states what ran.
func sdkDefaults(d client.ProducerDefaults) string {
	linger := "linger " + d.Linger.String()
	if d.Linger == 0 {
		linger = "linger 0 (natural batching: a full batch goes when a request slot is free, one not full when none is in flight)"
	}
	return fmt.Sprintf("%s, %s batches, %s buffer, %d requests in flight", linger,
		humanize.IBytes(uint64(d.BatchBytes)), humanize.IBytes(uint64(d.MaxBufferedBytes)), d.MaxInFlight)
}
