package main

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/runnel-io/runnel/client"
	"github.com/spf13/cobra"
)

func newDemoCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "End-to-end demonstrations on real data",
		Args:  groupArgs,
		RunE:  groupRun,
	}
	addBrokersFlag(cmd.PersistentFlags(), a)
	cmd.AddCommand(newDemoFlightsCmd(a))
	return cmd
}

// demoFlags are the settings of `demo flights`.
type demoFlags struct {
	file       string
	topic      string
	partitions int32
	keyField   string
	top        int
	stall      time.Duration
	output     string
	quiet      bool
}

func newDemoFlightsCmd(a *app) *cobra.Command {
	var (
		df demoFlags
		pf producerFlags
	)
	cmd := &cobra.Command{
		Use:   "flights --file PATH",
		Short: "Stream flight records keyed by origin airport through a topic and check per-key order",
		Long: `Stream an NDJSON file of flights (plain, .zst or .gz; e.g. ../shared/data/flights-3m.ndjson.zst) into
the topic 'flights' (created with 12 partitions if missing), keyed by the 'origin' field, then read
every partition back and check that:
  - exactly as many records arrived as were sent, and
  - for every key, the values arrived in the same order as in the file (each line is remembered as a
    64-bit hash, so memory stays small), and each key sits on a single partition.
It prints records per partition and the busiest keys, which shows the skew of real hot keys
(ORD, DFW, ATL). Records already in the topic are skipped: reading starts at the high watermark each
partition had before the run. The exit status is 1 on any mismatch.`,
		Example: `  runnel demo flights --file ../shared/data/flights-3m.ndjson.zst`,
		Args:    args(0, 0, "no arguments (the file is given with --file)"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if df.file == "" {
				return &usageError{errors.New("--file is required")}
			}
			out, err := parseOutput(df.output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			opts, err := pf.options(cmd)
			if err != nil {
				return err
			}
			brokers, err := a.brokerList()
			if err != nil {
				return err
			}
			return runDemoFlights(cmd.Context(), a, brokers, opts, &df, out, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&df.file, "file", "f", "", "NDJSON file of flights (.zst and .gz are decompressed)")
	fs.StringVar(&df.topic, "topic", "flights", "topic to use")
	fs.Int32Var(&df.partitions, "partitions", 12, "partitions of the topic when it has to be created")
	fs.StringVar(&df.keyField, "key-field", "origin", "top-level JSON field used as the record key")
	fs.IntVar(&df.top, "top", 10, "how many of the busiest keys to list")
	fs.DurationVar(&df.stall, "stall-timeout", time.Minute, "fail when reading back gets no record for this long")
	fs.StringVarP(&df.output, "output", "o", "table", "output format: table or json")
	fs.BoolVarP(&df.quiet, "quiet", "q", false, "no progress on stderr")
	pf.register(cmd)
	return cmd
}

// keyStats is what the demo tracks per key: the hashes of its values in file order, how many were
// read back (and matched), and the partition it was read from.
type keyStats struct {
	hashes    []uint64
	next      int   // index of the next hash expected when reading back
	partition int32 // -1 until a record of the key is read
}

// demoReport is the outcome of `demo flights`; -o json prints it.
type demoReport struct {
	Topic              string             `json:"topic"`
	File               string             `json:"file"`
	Partitions         int                `json:"partitions"`
	Sent               int64              `json:"sent"`
	Failed             int64              `json:"failed"`
	Received           int64              `json:"received"`
	Keys               int                `json:"keys"`
	ProduceSeconds     float64            `json:"produce_seconds"`
	ProduceRecordsPerS float64            `json:"produce_records_per_sec"`
	ConsumeSeconds     float64            `json:"consume_seconds"`
	ConsumeRecordsPerS float64            `json:"consume_records_per_sec"`
	OK                 bool               `json:"ok"`
	Problems           []string           `json:"problems"`
	PerPartition       []demoPartitionRow `json:"per_partition"`
	TopKeys            []demoKeyRow       `json:"top_keys"`
}

// demoPartitionRow is one partition's share of the records.
type demoPartitionRow struct {
	Partition int32 `json:"partition"`
	Records   int64 `json:"records"`
	Keys      int   `json:"keys"`
}

// demoKeyRow is one of the busiest keys.
type demoKeyRow struct {
	Key       string `json:"key"`
	Records   int    `json:"records"`
	Partition int32  `json:"partition"`
}

// maxProblems caps the problems listed; the rest are only counted.
const maxProblems = 10

func runDemoFlights(ctx context.Context, a *app, brokers []string, opts []client.ProducerOption, df *demoFlags, output string, stdout, stderr io.Writer) error {
	rep := demoReport{Topic: df.topic, File: df.file, Problems: []string{}}
	problem := func(format string, args ...any) {
		if len(rep.Problems) < maxProblems {
			rep.Problems = append(rep.Problems, fmt.Sprintf(format, args...))
		} else if len(rep.Problems) == maxProblems {
			rep.Problems = append(rep.Problems, "... (more problems not listed)")
		}
	}
	adm, err := a.newAdmin(brokers)
	if err != nil {
		return err
	}
	defer adm.Close()
	parts, err := ensureTopic(ctx, adm, df.topic, df.partitions)
	if err != nil {
		return err
	}
	rep.Partitions = len(parts)
	starts, err := latestOffsets(ctx, adm, df.topic, parts)
	if err != nil {
		return err
	}
	var skipped int64
	for _, s := range starts {
		skipped += s
	}
	logf := func(format string, args ...any) {
		if !df.quiet {
			fmt.Fprintf(stderr, format+"\n", args...)
		}
	}
	logf("demo: topic %s has %d partitions", df.topic, len(parts))
	if skipped > 0 {
		logf("demo: it already holds records up to offsets summing to %s; they are skipped", comma(skipped))
	}

	// Produce, remembering each key's values as hashes in file order.
	in, err := openInput(df.file, nil)
	if err != nil {
		return err
	}
	defer in.Close()
	p, err := client.NewProducer(brokers, opts...)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	seed := maphash.MakeSeed()
	keys := make(map[string]*keyStats)
	lp := lineProducer{topic: df.topic, keyField: df.keyField, partition: -1,
		onRecord: func(r *client.Record, _ int64) {
			ks := keys[string(r.Key)]
			if ks == nil {
				ks = &keyStats{partition: -1}
				keys[string(r.Key)] = ks
			}
			ks.hashes = append(ks.hashes, maphash.Bytes(seed, r.Value))
		}}
	var st produceStats
	var prog *progress
	if !df.quiet {
		lp.notice, lp.deliveryTimeout = stderr, client.DefaultProducer().DeliveryTimeout
		prog = startProgress(stderr, "demo: produce "+df.topic, in, &st.acked, &st.ackedBytes)
	}
	start := time.Now()
	err = lp.run(ctx, p, in, &st)
	if cerr := p.Close(); err == nil && st.failed.Load() == 0 && cerr != nil {
		err = fmt.Errorf("closing the producer: %w", cerr)
	}
	elapsed := time.Since(start)
	if prog != nil {
		prog.Stop()
	}
	if !df.quiet {
		st.summary(stderr, df.topic, elapsed)
	}
	if err := st.result(ctx, err); err != nil {
		return err
	}
	rep.Sent, rep.Failed, rep.Keys = st.acked.Load(), st.failed.Load(), len(keys)
	rep.ProduceSeconds, rep.ProduceRecordsPerS = elapsed.Seconds(), rate(rep.Sent, elapsed)

	// Read back from where the topic ended before, up to where it ends now.
	ends, err := latestOffsets(ctx, adm, df.topic, parts)
	if err != nil {
		return err
	}
	c, err := client.NewConsumer(brokers)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	defer c.Close()
	perPart := make(map[int32]int64, len(parts))
	keysPerPart := make(map[int32]int, len(parts))
	for _, pt := range parts {
		if err := c.Assign(df.topic, pt, client.OffsetAt(starts[pt])); err != nil {
			return fmt.Errorf("assign %s/%d: %w", df.topic, pt, err)
		}
	}
	var recv, readBytes int64
	var recvN, bytesN atomic.Int64 // copies of recv and readBytes for the progress line
	var rprog *progress
	if !df.quiet {
		rprog = startProgress(stderr, "demo: consume "+df.topic, nil, &recvN, &bytesN)
	}
	start = time.Now()
	for !reachedEnds(c, df.topic, ends) {
		pctx, cancel := context.WithTimeout(ctx, df.stall)
		recs, err := c.Poll(pctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return &exitError{code: 130, err: errors.New("interrupted")}
			}
			if pctx.Err() != nil {
				problem("reading back stalled: no record for %s with %s of %s read", df.stall, comma(recv), comma(rep.Sent))
				break
			}
			return fmt.Errorf("consume %s: %w", df.topic, err)
		}
		for _, r := range recs {
			if r.Offset < starts[r.Partition] || r.Offset >= ends[r.Partition] {
				continue // written before or after this run
			}
			recv++
			readBytes += int64(len(r.Key) + len(r.Value))
			perPart[r.Partition]++
			ks := keys[string(r.Key)]
			switch {
			case ks == nil:
				problem("partition %d offset %d: key %q is not in the file", r.Partition, r.Offset, r.Key)
			case ks.next >= len(ks.hashes):
				problem("partition %d offset %d: key %q has more records than the file (%d)", r.Partition, r.Offset, r.Key, len(ks.hashes))
			default:
				if ks.partition < 0 {
					ks.partition = r.Partition
					keysPerPart[r.Partition]++
				} else if ks.partition != r.Partition {
					problem("key %q is on partitions %d and %d", r.Key, ks.partition, r.Partition)
				}
				if maphash.Bytes(seed, r.Value) != ks.hashes[ks.next] {
					problem("partition %d offset %d: record %d of key %q differs from the file's (out of order, changed or lost)",
						r.Partition, r.Offset, ks.next+1, r.Key)
				}
				ks.next++
			}
		}
		recvN.Store(recv)
		bytesN.Store(readBytes)
	}
	elapsed = time.Since(start)
	if rprog != nil {
		rprog.Stop()
	}
	rep.Received = recv
	rep.ConsumeSeconds, rep.ConsumeRecordsPerS = elapsed.Seconds(), rate(recv, elapsed)
	if recv != rep.Sent {
		problem("sent %s records, received %s", comma(rep.Sent), comma(recv))
	}
	for k, ks := range keys {
		if ks.next < len(ks.hashes) {
			problem("key %q: %d of its %d records arrived", k, ks.next, len(ks.hashes))
		}
	}
	rep.OK = len(rep.Problems) == 0

	for _, pt := range parts {
		rep.PerPartition = append(rep.PerPartition, demoPartitionRow{Partition: pt, Records: perPart[pt], Keys: keysPerPart[pt]})
	}
	for k, ks := range keys {
		rep.TopKeys = append(rep.TopKeys, demoKeyRow{Key: k, Records: len(ks.hashes), Partition: ks.partition})
	}
	sort.Slice(rep.TopKeys, func(i, j int) bool {
		a, b := rep.TopKeys[i], rep.TopKeys[j]
		return a.Records > b.Records || a.Records == b.Records && a.Key < b.Key
	})
	rep.TopKeys = rep.TopKeys[:min(df.top, len(rep.TopKeys))]

	if output == formatJSON {
		if err := printJSON(stdout, rep); err != nil {
			return err
		}
	} else {
		printDemoReport(stdout, &rep)
	}
	if !rep.OK {
		return fmt.Errorf("demo flights failed: %s", strings.Join(rep.Problems, "; "))
	}
	return nil
}

// printDemoReport prints the per-partition table with a bar chart, the busiest keys and the verdict.
func printDemoReport(w io.Writer, rep *demoReport) {
	fmt.Fprintf(w, "\nproduced %s records (%s keys) in %.1fs: %s records/s\n", comma(rep.Sent), comma(int64(rep.Keys)),
		rep.ProduceSeconds, comma(int64(rep.ProduceRecordsPerS)))
	fmt.Fprintf(w, "consumed %s records in %.1fs: %s records/s\n\n", comma(rep.Received), rep.ConsumeSeconds, comma(int64(rep.ConsumeRecordsPerS)))
	var most int64
	for _, r := range rep.PerPartition {
		most = max(most, r.Records)
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "PARTITION\tRECORDS\tSHARE\tKEYS\t")
	for _, r := range rep.PerPartition {
		bar := ""
		if most > 0 {
			bar = strings.Repeat("#", int(r.Records*40/most))
		}
		fmt.Fprintf(tw, "%d\t%s\t%.1f%%\t%d\t%s\n", r.Partition, comma(r.Records), pct(r.Records, rep.Received), r.Keys, bar)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nbusiest keys (%d of %s):\n", len(rep.TopKeys), comma(int64(rep.Keys)))
	tw = newTable(w)
	fmt.Fprintln(tw, "KEY\tRECORDS\tSHARE\tPARTITION")
	for _, k := range rep.TopKeys {
		fmt.Fprintf(tw, "%s\t%s\t%.1f%%\t%d\n", k.Key, comma(int64(k.Records)), pct(int64(k.Records), rep.Sent), k.Partition)
	}
	tw.Flush()
	if rep.OK {
		fmt.Fprintf(w, "\nOK: %s records sent and received; per-key order intact for all %s keys, each on one partition\n",
			comma(rep.Sent), comma(int64(rep.Keys)))
	} else {
		fmt.Fprintln(w, "\nFAILED:")
		for _, p := range rep.Problems {
			fmt.Fprintln(w, "  "+p)
		}
	}
}

// pct is 100*n/total, 0 for a zero total.
func pct(n, total int64) float64 {
	if total == 0 {
		return 0
	}
	return 100 * float64(n) / float64(total)
}
