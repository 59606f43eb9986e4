// Package report turns the results of a side-by-side benchmark run (bench/peers) into
// bench/out/report.md and PNG charts. It reads only the Results value, so it is tested on synthetic
// results and can re-render a saved results.json without running anything.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/runnel-io/runnel/bench/latency"
)

// Results is everything one run measured and the context needed to read it.
type Results struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Matrix   string    `json:"matrix"` // "reduced" or "full"
	Command  string    `json:"command"`
	Machine  Machine   `json:"machine"`
	Systems  []System  `json:"systems"`
	Ceilings []Ceiling `json:"ceilings"`
	Runs     []Run     `json:"runs"`
	Notes    []string  `json:"notes,omitempty"`
	// Interrupted is set when the run was stopped (SIGINT or SIGTERM) before its last workload: what it
	// measured by then is saved, the rest is missing.
	Interrupted bool `json:"interrupted,omitempty"`
}

// Machine describes the computer the run used.
type Machine struct {
	CPUs     int     `json:"cpus"`
	CPUModel string  `json:"cpu_model"`
	MemoryGB float64 `json:"memory_gib"`
	Kernel   string  `json:"kernel"`
	Disk     string  `json:"disk"` // device, file system and free space of the data directory
	GoVer    string  `json:"go"`
	LoadAvg  string  `json:"load_avg"` // at the start, since the machine may be shared
	// LoadAvgEnd is the load average at the end of the run.
	LoadAvgEnd string `json:"load_avg_end,omitempty"`
}

// Durability classes, so the report can pair systems whose acknowledgements promise the same thing.
const (
	// DurFsync: acknowledged after the write was fsynced (survives a machine crash).
	DurFsync = "fsync"
	// DurOS: acknowledged after the write reached the OS (survives a process crash, not a machine
	// crash; fsync happens later, on a timer or never).
	DurOS = "os"
)

// System is one system under test with its settings: a server configuration plus client settings.
type System struct {
	Name       string `json:"name"`   // e.g. "runnel acks=all fsync"
	Family     string `json:"family"` // "runnel", "jetstream", "redis"
	Version    string `json:"version"`
	Client     string `json:"client"` // Go client and version
	Durability string `json:"durability"`
	// DurabilityNote says in words what an acknowledgement means for this system.
	DurabilityNote string `json:"durability_note"`
	Settings       string `json:"settings"`
}

// IsRunnel reports whether s is one of Runnel's configurations.
func (s System) IsRunnel() bool { return s.Family == "runnel" }

// Ceiling is one of the machine's ceilings, measured in the same run: the harness measures each at
// the run's start and again at its end, and MBPerSec is the higher of the two, so every share of a
// ceiling is the stricter one. (On a virtual machine 9 minutes after its boot, whose memory the host
// had taken back, a run's first seconds measured the bare gRPC stream at about half of what the same
// machine carried half an hour later, which would have flattered every system's share of it.)
type Ceiling struct {
	Name     string  `json:"name"`
	MBPerSec float64 `json:"mb_per_s"` // the highest of Measured, MB (10^6 bytes) per second
	// Measured is every measurement in the order taken, MB/s; empty in results saved before the
	// harness measured twice, whose MBPerSec is their one measurement.
	Measured []float64 `json:"measured,omitempty"`
	Note     string    `json:"note"`
}

// AddCeiling records a measurement of the ceiling called name (MB/s): a new ceiling with note if
// there is none of that name yet, else one more measurement of it, which raises its MBPerSec if
// higher. note is kept from the first measurement.
func (r *Results) AddCeiling(name string, mbPerSec float64, note string) {
	for i := range r.Ceilings {
		if c := &r.Ceilings[i]; c.Name == name {
			if len(c.Measured) == 0 { // loaded from results saved before the harness measured twice
				c.Measured = []float64{c.MBPerSec}
			}
			c.Measured = append(c.Measured, mbPerSec)
			c.MBPerSec = max(c.MBPerSec, mbPerSec)
			return
		}
	}
	r.Ceilings = append(r.Ceilings, Ceiling{Name: name, MBPerSec: mbPerSec, Measured: []float64{mbPerSec}, Note: note})
}

// Kinds of runs.
const (
	KindProduce = "produce" // as fast as possible, throughput
	KindConsume = "consume" // read a backlog from the start
	KindLatency = "latency" // paced at a fraction of the measured maximum, produce (ack) latency
	// KindEndToEnd is paced as KindLatency with a consumer reading along: end-to-end latency.
	KindEndToEnd = "e2e"
)

// Workload is the shape of a run, shared by all systems.
type Workload struct {
	Kind       string `json:"kind"`
	Size       int    `json:"size"`       // value bytes
	Producers  int    `json:"producers"`  // concurrent producers, each with its own connection
	Partitions int    `json:"partitions"` // Runnel partitions = JetStream streams = Redis streams
	Keys       bool   `json:"keys"`       // keys from the flight data's origin airport
	// LoadFraction is the fraction of the system's own measured maximum a latency run is paced at.
	LoadFraction float64 `json:"load_fraction,omitempty"`
	// PacedAs, when set, names the system whose latency run (same shape) set the rate instead: the
	// same absolute load for every system, e.g. Runnel at JetStream's 50 %.
	PacedAs string `json:"paced_as,omitempty"`
}

// ID names the workload, e.g. "produce 100B 1p 12part nokeys".
func (w Workload) ID() string {
	keys := "no keys"
	if w.Keys {
		keys = "keys"
	}
	id := fmt.Sprintf("%s %s %dprod %dpart %s", w.Kind, sizeName(w.Size), w.Producers, w.Partitions, keys)
	if (w.Kind == KindLatency || w.Kind == KindEndToEnd) && w.LoadFraction > 0 {
		if w.PacedAs != "" {
			id += fmt.Sprintf(" @%s's %.0f%%", w.PacedAs, w.LoadFraction*100)
		} else {
			id += fmt.Sprintf(" @%.0f%%", w.LoadFraction*100)
		}
	}
	if w.Kind == KindConsume {
		id = fmt.Sprintf("consume %s %dpart backlog", sizeName(w.Size), w.Partitions)
	}
	return id
}

func sizeName(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%dKiB", n/1024)
	}
	return fmt.Sprintf("%dB", n)
}

// Run is one system's result on one workload.
type Run struct {
	Workload      Workload `json:"workload"`
	System        string   `json:"system"`
	Records       int64    `json:"records"`
	Bytes         int64    `json:"bytes"` // keys + values
	Seconds       float64  `json:"seconds"`
	RecordsPerSec float64  `json:"records_per_s"`
	MBPerSec      float64  `json:"mb_per_s"`
	// TargetRate is the paced rate of a latency run (records/s over all producers).
	TargetRate float64 `json:"target_rate,omitempty"`
	// Latency: produce runs, send-to-ack from the actual send; latency and e2e runs, ack minus the
	// intended send time (coordinated omission corrected; for a record sent early, the pacer's clock
	// reading before it, LatencyWhat says how early); consume runs, none. Acks are sampled (LatencyWhat).
	Latency     *latency.Summary `json:"latency,omitempty"`
	LatencyWhat string           `json:"latency_what,omitempty"`
	// EndToEnd is, in e2e runs, consumer receipt minus the time Latency is measured from.
	EndToEnd *latency.Summary `json:"end_to_end,omitempty"`
	// PassesPerSec is, in consume runs, the records/s of each reading of the backlog in order (each
	// by a new consumer); RecordsPerSec and the rest are the median pass's.
	PassesPerSec []float64 `json:"passes_records_per_s,omitempty"`
	Errors       int64     `json:"errors"`
	Error        string    `json:"error,omitempty"` // why the run failed, if it did
}

// Load reads results.json.
func Load(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

// Save writes r as indented JSON.
func (r *Results) Save(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// System returns the system named name.
func (r *Results) System(name string) (System, bool) {
	for _, s := range r.Systems {
		if s.Name == name {
			return s, true
		}
	}
	return System{}, false
}

// SystemOrder returns the systems' names, Runnel's configurations first, then the peers, each in the
// order of r.Systems: the order of rows and bars in the report.
func (r *Results) SystemOrder() []string {
	var runnel, peers []string
	for _, s := range r.Systems {
		if s.IsRunnel() {
			runnel = append(runnel, s.Name)
		} else {
			peers = append(peers, s.Name)
		}
	}
	return append(runnel, peers...)
}

// Workloads returns the distinct workloads: produce, consume, then latency runs, each kind in the
// order they first appear.
func (r *Results) Workloads() []Workload {
	var out []Workload
	seen := map[string]bool{}
	for _, kind := range []string{KindProduce, KindConsume, KindLatency, KindEndToEnd} {
		for _, run := range r.Runs {
			id := run.Workload.ID()
			if run.Workload.Kind == kind && !seen[id] {
				seen[id] = true
				out = append(out, run.Workload)
			}
		}
	}
	return out
}

// Find returns the run of system on workload id.
func (r *Results) Find(id, system string) (Run, bool) {
	for _, run := range r.Runs {
		if run.System == system && run.Workload.ID() == id {
			return run, true
		}
	}
	return Run{}, false
}

// Ceiling returns the ceiling whose name starts with prefix.
func (r *Results) Ceiling(prefix string) (Ceiling, bool) {
	for _, c := range r.Ceilings {
		if len(c.Name) >= len(prefix) && c.Name[:len(prefix)] == prefix {
			return c, true
		}
	}
	return Ceiling{}, false
}
