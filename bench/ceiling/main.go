// Command ceiling measures this machine's ceilings for Runnel's produce path, so benchmark figures can
// be read as a share of what the hardware and transport allow:
//
//	disk: sequential 1 MiB writes to a file, fdatasync after every write (what a group commit pays) and
//	      only at the end (the raw sequential bandwidth);
//	grpc: a bare bidi gRPC stream on loopback carrying ProduceRequest messages of a given size to a
//	      server that answers each at once, with the same pipelining the SDK uses (no storage, no
//	      batch validation): the transport's ceiling.
//
// The measurements live in bench/internal/ceiling, shared with bench/peers (make bench-compare).
//
// Usage: go run ./bench/ceiling [-dir DIR] [-size BYTES] [-duration D] [-o json]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/runnel-io/runnel/bench/internal/ceiling"
)

func main() {
	dir := flag.String("dir", os.TempDir(), "directory for the disk test file")
	size := flag.Int("size", 1<<20, "bytes per write and per gRPC request")
	dur := flag.Duration("duration", 5*time.Second, "how long each measurement runs")
	out := flag.String("o", "table", "output: table or json")
	flag.Parse()
	var results []ceiling.Result
	for _, sync := range []bool{true, false} {
		r, err := ceiling.DiskWrite(*dir, *size, *dur, sync)
		if err != nil {
			fmt.Fprintln(os.Stderr, "disk:", err)
			os.Exit(1)
		}
		results = append(results, r)
	}
	r, err := ceiling.GRPCStream(*size, *dur)
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpc:", err)
		os.Exit(1)
	}
	results = append(results, r)
	if *out == "json" {
		json.NewEncoder(os.Stdout).Encode(results)
		return
	}
	fmt.Printf("%-28s %10s  %s\n", "CEILING", "MB/s", "HOW")
	for _, r := range results {
		fmt.Printf("%-28s %10.1f  %s\n", r.Name, r.MBPerSec, r.Note)
	}
}
