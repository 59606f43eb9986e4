package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/runnel-io/runnel/api/rerr"
	"github.com/runnel-io/runnel/bench/profile"
	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/recordpool"
	"github.com/spf13/cobra"
)

// benchFlags are the settings both bench verbs share.
type benchFlags struct {
	topic      string
	count      int64
	duration   time.Duration
	output     string
	cpuProfile string
	memProfile string
	quiet      bool
}

func newBenchCmd(a *app) *cobra.Command {
	var bf benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure produce and consume throughput and latency against a node",
		Long: `Measure throughput (records/s, MB/s where MB = 10^6 bytes of keys and values) and latency
percentiles against a running node. Run 'bench produce' first: 'bench consume' reads what it wrote.
Progress goes to stderr; the result to stdout, as a table or (-o json) exactly one JSON line.`,
		Args: groupArgs,
		RunE: groupRun,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&bf.topic, "topic", "bench", "topic to use")
	pf.Int64Var(&bf.count, "count", 0, "records to produce or consume (0: no count; consume reads the records present at start)")
	pf.DurationVar(&bf.duration, "duration", 0, "stop after this long, or at --count if sooner (produce without --count: 10s)")
	pf.StringVarP(&bf.output, "output", "o", "table", "output format: table or json (one line)")
	pf.StringVar(&bf.cpuProfile, "cpuprofile", "", "write a CPU profile of this client process to the file")
	pf.StringVar(&bf.memProfile, "memprofile", "", "bench produce: write an allocation profile of this client process to the file at the end")
	pf.BoolVarP(&bf.quiet, "quiet", "q", false, "no progress on stderr")
	addBrokersFlag(pf, a)
	cmd.AddCommand(newBenchProduceCmd(a, &bf), newBenchConsumeCmd(a, &bf))
	return cmd
}

// benchResult is the outcome of a bench run; -o json prints it as one line.
type benchResult struct {
	Mode          string  `json:"mode"`
	Topic         string  `json:"topic"`
	Partitions    int     `json:"partitions"`
	Size          int     `json:"size,omitempty"`
	Acks          string  `json:"acks,omitempty"`
	Compression   string  `json:"compression,omitempty"`
	Producers     int     `json:"producers,omitempty"`
	Keys          int     `json:"keys,omitempty"`
	Rate          float64 `json:"rate,omitempty"` // the --rate asked for; 0: unlimited
	Records       int64   `json:"records"`
	Bytes         int64   `json:"bytes"`
	Errors        int64   `json:"errors"`
	Seconds       float64 `json:"seconds"`
	RecordsPerSec float64 `json:"records_per_sec"`
	MBPerSec      float64 `json:"mb_per_sec"`
	// Group and Members describe a `bench consume --group` run; FirstRecordMs is the time from the
	// start (before the members joined) to the first record.
	Group         string  `json:"group,omitempty"`
	Members       int     `json:"members,omitempty"`
	FirstRecordMs float64 `json:"first_record_ms,omitempty"`
	// Latency is what the percentiles measure: "produce-to-ack" of a record, "due-to-ack" of a record of
	// a paced (--rate) run (from its scheduled send time: coordinated omission corrected), or "poll" per
	// PollFunc call. LatencySamples is how many values they are taken from: bench produce samples one
	// acknowledgement in latencyEvery.
	Latency        string  `json:"latency"`
	LatencySamples uint64  `json:"latency_samples"`
	LatP50Ms       float64 `json:"p50_ms"`
	LatP99Ms       float64 `json:"p99_ms"`
	LatP999Ms      float64 `json:"p999_ms"`
	LatMaxMs       float64 `json:"max_ms"`
	FirstError     string  `json:"first_error,omitempty"`
	// Transactional runs (`bench produce --transactional`): the commit interval asked for, commits and
	// aborts made, commits per second, and the latency of CommitTransaction (flush and EndTxn).
	Transactional bool    `json:"transactional,omitempty"`
	TxnIntervalMs float64 `json:"txn_interval_ms,omitempty"`
	Commits       int64   `json:"commits,omitempty"`
	Aborts        int64   `json:"aborts,omitempty"`
	CommitsPerSec float64 `json:"commits_per_sec,omitempty"`
	CommitP50Ms   float64 `json:"commit_p50_ms,omitempty"`
	CommitP99Ms   float64 `json:"commit_p99_ms,omitempty"`
}

func (r *benchResult) fill(n, bytes int64, elapsed time.Duration, h *histogram) {
	r.Records, r.Bytes = n, bytes
	r.Seconds = elapsed.Seconds()
	r.RecordsPerSec = rate(n, elapsed)
	r.MBPerSec = rate(bytes, elapsed) / 1e6
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	r.LatP50Ms, r.LatP99Ms, r.LatP999Ms, r.LatMaxMs = ms(h.Quantile(0.5)), ms(h.Quantile(0.99)), ms(h.Quantile(0.999)), ms(h.Max())
	r.LatencySamples = h.Count()
}

func (r *benchResult) print(w io.Writer, output string) error {
	if output == formatJSON {
		return printJSONLine(w, r)
	}
	tw := newTable(w)
	fmt.Fprintf(tw, "topic\t%s (%d partitions)\n", r.Topic, r.Partitions)
	if r.Mode == "produce" {
		keys := "none"
		if r.Keys > 0 {
			keys = comma(int64(r.Keys)) + " distinct"
		}
		pace := "as fast as possible"
		if r.Rate > 0 {
			pace = "paced to " + comma(int64(r.Rate)) + " records/s"
		}
		fmt.Fprintf(tw, "settings\t%d-byte values, keys %s, acks=%s, compression=%s, %d producer(s), %s\n", r.Size, keys, r.Acks, r.Compression, r.Producers, pace)
		if r.Transactional {
			fmt.Fprintf(tw, "transactions\tone commit per %.0f ms per producer: %s commits (%.1f/s), %s aborts, commit p50 %.3f ms, p99 %.3f ms\n",
				r.TxnIntervalMs, comma(r.Commits), r.CommitsPerSec, comma(r.Aborts), r.CommitP50Ms, r.CommitP99Ms)
		}
	}
	if r.Members > 0 {
		fmt.Fprintf(tw, "group\t%s, %d members (each its own client), first record after %.0f ms\n", r.Group, r.Members, r.FirstRecordMs)
	}
	fmt.Fprintf(tw, "records\t%s in %.2fs, %s errors\n", comma(r.Records), r.Seconds, comma(r.Errors))
	fmt.Fprintf(tw, "throughput\t%s records/s, %.1f MB/s\n", comma(int64(r.RecordsPerSec)), r.MBPerSec)
	fmt.Fprintf(tw, "latency (%s)\tp50 %.3f ms, p99 %.3f ms, p99.9 %.3f ms, max %.3f ms, of %s samples\n", r.Latency, r.LatP50Ms, r.LatP99Ms, r.LatP999Ms, r.LatMaxMs, comma(int64(r.LatencySamples)))
	if r.FirstError != "" {
		fmt.Fprintf(tw, "first error\t%s\n", r.FirstError)
	}
	return tw.Flush()
}

// ensureTopic creates topic with partitions unless it exists, and returns its partition numbers.
func ensureTopic(ctx context.Context, adm *client.Admin, topic string, partitions int32) ([]int32, error) {
	if _, err := adm.CreateTopic(ctx, topic, partitions, -1, nil); err != nil && !errors.Is(err, rerr.ErrTopicAlreadyExists) {
		return nil, fmt.Errorf("create topic %q: %w", topic, err)
	}
	return topicPartitionsWith(ctx, adm, topic)
}

func newBenchProduceCmd(a *app, bf *benchFlags) *cobra.Command {
	var (
		pf         producerFlags
		size       int
		partitions int32
		producers  int
		keys       int
		rateLimit  float64
		txnal      bool
		txnEvery   time.Duration
		bufBytes   int64
		inFlight   int
	)
	cmd := &cobra.Command{
		Use:   "produce",
		Short: "Produce records as fast as the node takes them",
		Long: `Produce --count records (or for --duration, default 10s) of --size bytes to --topic, created with
--partitions if missing, from --producers concurrent producers, and report records/s, MB/s and the
latency from handing a record to the producer to its acknowledgement (p50, p99, p99.9, max), sampled
from one acknowledgement in 8.

Without --rate the producers go as fast as they can, so the buffer (` + sdkBuffer + `) stays full and the latency
is mostly time spent queued in it: use --rate below the maximum throughput to measure latency under
a given load (as Kafka's producer-perf-test --throughput). Paced, each record's latency runs from the
time the schedule meant to send it (coordinated omission corrected, as wrk2 does): when the producer
falls behind, the records it sends late count the time they were overdue.

Values are random lowercase letters (consecutive slices of a 4 MiB random buffer, so they differ and
compress about as well as text). With --keys N, records carry one of N distinct keys in turn;
without, they have no key and the sticky partitioner fills one partition's batch at a time.

With --transactional each producer is transactional (its own transactional id) and commits a
transaction every --txn-interval (default 100ms): producing stops while CommitTransaction flushes and
ends the transaction, as in an application. The result adds commits/s and the commit latency; compare
records/s with a run without --transactional (idempotent, the default) to see what transactions cost.`,
		Example: `  runnel bench produce --acks 1 --count 5000000
  runnel bench produce --acks all --duration 30s --producers 2 -o json
  runnel bench produce --transactional --txn-interval 100ms --duration 30s`,
		Args: args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, err := parseOutput(bf.output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			if size < 0 || producers < 1 || keys < 0 || bf.count < 0 || rateLimit < 0 {
				return &usageError{errors.New("--size, --keys, --count and --rate cannot be negative, --producers must be at least 1")}
			}
			if cmd.Flags().Changed("txn-interval") && !txnal {
				return &usageError{errors.New("--txn-interval needs --transactional")}
			}
			if txnal && (txnEvery <= 0 || pf.acks != "all") {
				return &usageError{errors.New("--transactional needs --acks all and a positive --txn-interval")}
			}
			opts, err := pf.options(cmd)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("buffer-bytes") {
				if batchBytes := pf.effectiveBatchBytes(cmd); bufBytes < int64(batchBytes) {
					return &usageError{fmt.Errorf("--buffer-bytes %d: must be at least the batch size, --batch-bytes (%d)", bufBytes, batchBytes)}
				}
				opts = append(opts, client.WithMaxBufferedBytes(bufBytes))
			}
			if cmd.Flags().Changed("max-in-flight") {
				if inFlight < 1 {
					return &usageError{fmt.Errorf("--max-in-flight %d: must be at least 1", inFlight)}
				}
				opts = append(opts, client.WithMaxInFlight(inFlight))
			}
			interval := time.Duration(0)
			if txnal {
				interval = txnEvery
			}
			brokers, err := a.brokerList()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			adm, err := a.newAdmin(brokers)
			if err != nil {
				return err
			}
			parts, err := ensureTopic(ctx, adm, bf.topic, partitions)
			adm.Close()
			if err != nil {
				return err
			}
			duration := bf.duration
			if bf.count == 0 && duration == 0 {
				duration = 10 * time.Second
			}
			stopProf, err := profile.StartCPU(bf.cpuProfile)
			if err != nil {
				return err
			}
			res := benchResult{Mode: "produce", Topic: bf.topic, Partitions: len(parts), Size: size,
				Acks: pf.acks, Compression: pf.compression, Producers: producers, Keys: keys, Rate: rateLimit, Latency: "produce-to-ack"}
			if rateLimit > 0 {
				res.Latency = "due-to-ack" // benchPacer: from the schedule's time, coordinated omission corrected
			}
			st, h, elapsed, err := benchProduce(ctx, brokers, opts, bf, duration, size, producers, keys, rateLimit, interval, cmd.ErrOrStderr())
			stopProf()
			if err != nil {
				return err
			}
			if err := profile.WriteAllocs(bf.memProfile); err != nil {
				return err
			}
			res.fill(st.acked.Load(), st.ackedBytes.Load(), elapsed, h)
			res.Errors = st.failed.Load()
			if txnal {
				res.Transactional, res.TxnIntervalMs = true, float64(interval)/1e6
				res.Commits, res.Aborts = st.commits.Load(), st.aborts.Load()
				res.CommitsPerSec = rate(res.Commits, elapsed)
				res.CommitP50Ms, res.CommitP99Ms = float64(st.commitLat.Quantile(0.5))/1e6, float64(st.commitLat.Quantile(0.99))/1e6
			}
			if first := st.first(); first != nil {
				res.FirstError = first.Error()
			}
			if err := res.print(cmd.OutOrStdout(), out); err != nil {
				return err
			}
			return st.result(context.Background(), nil)
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&size, "size", 100, "bytes per record value")
	fs.Int32Var(&partitions, "partitions", 4, "partitions of the topic when it has to be created")
	fs.IntVar(&producers, "producers", 1, "concurrent producers (each its own client and connection)")
	fs.IntVar(&keys, "keys", 0, "give records keys, cycling through this many distinct ones (0: no keys; --keys alone: 10000)")
	fs.Lookup("keys").NoOptDefVal = "10000"
	fs.Float64Var(&rateLimit, "rate", 0, "target records/s over all producers (0: as fast as possible); latency is only meaningful below saturation")
	fs.BoolVar(&txnal, "transactional", false, "produce in transactions (each producer its own transactional id), committing every --txn-interval")
	fs.DurationVar(&txnEvery, "txn-interval", 100*time.Millisecond, "with --transactional: how often each producer commits its transaction")
	sdk := client.DefaultProducer()
	fs.Int64Var(&bufBytes, "buffer-bytes", sdk.MaxBufferedBytes, "cap on each producer's buffered bytes (the SDK's default: "+sdkBuffer+")")
	fs.IntVar(&inFlight, "max-in-flight", sdk.MaxInFlight, "produce requests in flight per broker (the SDK's default)")
	pf.register(cmd)
	return cmd
}

// letters is the alphabet of bench values.
const letters = "abcdefghijklmnopqrstuvwxyz"

// benchProduce runs the producers and returns the counts, the latency histogram and the time from the
// first record to the last acknowledgement. With txnEvery > 0 each producer is transactional and
// commits every txnEvery (and once more at the end).
func benchProduce(ctx context.Context, brokers []string, opts []client.ProducerOption, bf *benchFlags,
	duration time.Duration, size, producers, nkeys int, rateLimit float64, txnEvery time.Duration, stderr io.Writer) (*produceStats, *histogram, time.Duration, error) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	payload := make([]byte, 4<<20+size)
	for i := range payload {
		payload[i] = letters[rng.IntN(len(letters))]
	}
	keys := make([][]byte, nkeys)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%07d", i)
	}
	ps := make([]*client.Producer, producers)
	run := time.Now().UnixNano()
	for i := range ps {
		popts := opts
		if txnEvery > 0 {
			popts = append(slices.Clip(opts), client.WithTransactionalID(fmt.Sprintf("runnel-bench-%d-%d", run, i)))
		}
		p, err := client.NewProducer(brokers, popts...)
		if err == nil && txnEvery > 0 {
			if err = p.InitTransactions(ctx); err == nil {
				err = p.BeginTransaction()
			}
			if err != nil {
				p.Close()
			}
		}
		if err != nil {
			for _, q := range ps[:i] {
				q.Close()
			}
			return nil, nil, 0, fmt.Errorf("producer: %w", err)
		}
		ps[i] = p
	}
	st := &produceStats{commitLat: &histogram{}}
	h := &histogram{}
	// Each producer recycles its own records (recordpool), so producers do not contend for one list.
	done := func(r *client.Record, err error) {
		if err != nil {
			st.fail(fmt.Errorf("record for partition %d: %w", r.Partition, err))
			return
		}
		if st.acked.Add(1)%latencyEvery == 1 { // the first, so that a short run has a sample
			h.Record(time.Since(r.Timestamp))
		}
		st.ackedBytes.Add(int64(len(r.Key) + len(r.Value)))
	}
	var prog *progress
	if !bf.quiet {
		prog = startProgress(stderr, "bench produce "+bf.topic, nil, &st.acked, &st.ackedBytes)
	}
	start := time.Now()
	deadline := start.Add(duration)
	var wg sync.WaitGroup
	errs := make([]error, producers)
	for w, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), rand.Uint64()))
			nextCommit := time.Now().Add(txnEvery)
			recs := recordpool.New(done)
			var (
				now   time.Time
				stamp time.Time                           // the records' timestamp, from which latency is measured
				off   = rng.IntN(len(payload) - size + 1) // where the previous value started
				pace  = newBenchPacer(start, w, producers, rateLimit)
			)
			// --count is shared out among the producers beforehand, and each counts what it sent in a
			// variable of its own: an atomic per record here (a shared countdown, the count of records
			// sent) waited for the stores into the record just filled, which was cold, and cost about
			// a tenth of this process's CPU at full speed (docs/performance.md).
			quota := int64(-1)
			if bf.count > 0 {
				quota = bf.count / int64(producers)
				if int64(w) < bf.count%int64(producers) {
					quota++
				}
			}
			var sent int64
			defer func() { st.read.Add(sent) }()
			every := stampEvery(rateLimit / float64(producers))
			for i := 0; ctx.Err() == nil; i++ {
				if sent == quota {
					break
				}
				if i%every == 0 {
					// One clock read for a few records (a few microseconds of producing): the record's
					// timestamp, from which its latency is measured, is then at most that much early,
					// which overstates the latency by as much, where a read per record cost about a
					// tenth of this process's CPU. Paced, the stamp is the schedule's time for the
					// first of them (see benchPacer), and the producer waits for it.
					now = time.Now()
					stamp = now
					if pace != nil {
						stamp, now = pace.next(i, now)
					}
					if duration > 0 && now.After(deadline) {
						break
					}
					if txnEvery > 0 && !now.Before(nextCommit) {
						if errs[w] = st.endTxn(ctx, p, true); errs[w] != nil {
							return
						}
						nextCommit = time.Now().Add(txnEvery)
					}
				}
				r, promise := recs.Next()
				r.Topic, r.Partition = bf.topic, -1
				// Consecutive slices of the buffer, from a random start: every value differs, and
				// reading them is sequential, as reading values an application has just encoded is.
				// Slices at random offsets missed the CPU caches on nearly every record, which cost
				// more than the rest of producing a 100-byte record.
				if off += size; off > len(payload)-size {
					off = rng.IntN(min(size, len(payload)-size) + 1) // payload is 4 MiB longer than a value
				}
				r.Value = payload[off : off+size : off+size]
				if nkeys > 0 {
					r.Key = keys[(i*producers+w)%nkeys]
				}
				r.Timestamp = stamp
				p.Produce(ctx, r, promise)
				sent++
			}
			if txnEvery > 0 {
				errs[w] = st.endTxn(context.Background(), p, false)
				return
			}
			errs[w] = p.Flush(context.Background())
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if prog != nil {
		prog.Stop()
	}
	for _, p := range ps {
		p.Close()
	}
	if err := errors.Join(errs...); err != nil && st.failed.Load() == 0 {
		return nil, nil, 0, fmt.Errorf("flush: %w", err)
	}
	return st, h, elapsed, nil
}

// sdkBuffer is the SDK's default producer buffer, as the help texts give it.
var sdkBuffer = humanize.IBytes(uint64(client.DefaultProducer().MaxBufferedBytes))

// clockEvery is the most records bench produce stamps with one clock read.
const clockEvery = 16

// stampEvery returns how many records a producer paced at rate records/s (0: unpaced) stamps with one
// clock read: clockEvery when they are due within about 20 µs, fewer at lower rates, down to one.
// Paced, the records of one stamp go out together, so at 10 records/s a stamp per 16 sent bursts of
// 16 every 1.6 s, and a --duration ran over by as much.
func stampEvery(rate float64) int {
	if rate <= 0 {
		return clockEvery
	}
	return max(1, min(clockEvery, int(rate*20e-6)))
}

// latencyEvery is how many acknowledgements share one latency sample: bench produce records the
// latency of the first acknowledgement and of every latencyEvery-th after it (in arrival order, which
// has nothing to do with how long they took), as bench/peers does, and counts the others. In a CPU
// profile of this process at full speed (make bench-profile) the clock reading per record took 10.8 %
// and the histogram's updates 4.7 %: CPU the node on the same machine could have used. Kafka's
// producer-perf-test samples the same way.
const latencyEvery = 8

// benchPacer paces one producer of `bench produce --rate` to its share of the rate, with coordinated
// omission corrected (as wrk2 and the bench/peers harness do): record i of producer w of n is due at
// start + (i*n+w)/rate (the producers' records interleave), and its latency is measured from then, not
// from when the producer got to it. A producer that falls behind (Produce blocked on a full buffer, the
// machine busy) sends the overdue records at once, and each counts the time it was overdue; measured
// from the actual send, a stall of the node would hold the producer back and hide the records that
// should have been sent meanwhile. Records are stamped per clockEvery, with the due time of the first of
// them, so their latency is overstated by at most clockEvery/rate*n.
type benchPacer struct {
	start time.Time
	first float64 // ns from start to this producer's record 0
	every float64 // ns between this producer's records
	sleep func(time.Duration)
	clock func() time.Time
}

// newBenchPacer returns the pacer of producer w of n at rate records/s in total, or nil when rate is
// 0 (unpaced).
func newBenchPacer(start time.Time, w, n int, rate float64) *benchPacer {
	if rate <= 0 {
		return nil
	}
	return &benchPacer{start: start, first: float64(w) / rate * 1e9, every: float64(n) / rate * 1e9,
		sleep: time.Sleep, clock: time.Now}
}

// due returns when record i is due.
func (bp *benchPacer) due(i int) time.Time {
	return bp.start.Add(time.Duration(bp.first + float64(i)*bp.every))
}

// next waits until record i is due (now is the clock's reading) and returns its due time, the stamp
// of the records from i on, and the clock after the wait.
func (bp *benchPacer) next(i int, now time.Time) (stamp, after time.Time) {
	stamp = bp.due(i)
	if wait := stamp.Sub(now); wait > 0 {
		bp.sleep(wait)
		now = bp.clock()
	}
	return stamp, now
}

func newBenchConsumeCmd(a *app, bf *benchFlags) *cobra.Command {
	var (
		group   string
		members int
	)
	cmd := &cobra.Command{
		Use:   "consume",
		Short: "Read a topic from the start as fast as the node serves it",
		Long: `Read --topic from the earliest offset of every partition: all records present at start, or --count
records (waiting for more if needed), or for --duration. Reports records/s, MB/s and the latency of
each PollFunc call (p50, p99, p99.9, max).

With --members N (and optionally --group), N members of a consumer group, each its own client and
connection, share the partitions and read from the group's committed offsets (from the start for a
new group), committing as they go. The time runs from before they join to the last record, so it
includes the join; the time to the first record is reported too. Without --group a new group named
bench-<time> is used, so every run reads everything.`,
		Example: `  runnel bench produce --count 5000000 && runnel bench consume
  runnel bench consume --topic flights --members 4`,
		Args: args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if members < 0 {
				return &usageError{errors.New("--members cannot be negative")}
			}
			if group != "" || members > 0 {
				if members == 0 {
					members = 1
				}
				if group == "" {
					group = fmt.Sprintf("bench-%d", time.Now().UnixNano())
				}
				return benchConsumeGroup(cmd, a, bf, group, members)
			}
			out, err := parseOutput(bf.output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			ctx := cmd.Context()
			brokers, adm, parts, err := openTopic(ctx, a, bf.topic)
			if err != nil {
				return err
			}
			defer adm.Close()
			target := bf.count
			if target == 0 {
				ends, err := latestOffsets(ctx, adm, bf.topic, parts)
				if err != nil {
					return err
				}
				for _, p := range parts {
					start, _, err := adm.ListOffsets(ctx, bf.topic, p, client.OffsetEarliest())
					if err != nil {
						return fmt.Errorf("earliest offset of %s/%d: %w", bf.topic, p, err)
					}
					target += ends[p] - start
				}
				if target == 0 {
					return fmt.Errorf("topic %q has no records: run 'runnel bench produce --topic %s' first", bf.topic, bf.topic)
				}
			}
			c, err := client.NewConsumer(brokers)
			if err != nil {
				return fmt.Errorf("consumer: %w", err)
			}
			defer c.Close()
			for _, p := range parts {
				if err := c.Assign(bf.topic, p, client.OffsetEarliest()); err != nil {
					return fmt.Errorf("assign %s/%d: %w", bf.topic, p, err)
				}
			}
			stopProf, err := profile.StartCPU(bf.cpuProfile)
			if err != nil {
				return err
			}
			defer stopProf()
			var n, bytes atomic.Int64
			var prog *progress
			if !bf.quiet {
				prog = startProgress(cmd.ErrOrStderr(), "bench consume "+bf.topic, nil, &n, &bytes)
			}
			h := &histogram{}
			pctx := ctx
			if bf.duration > 0 {
				var cancel context.CancelFunc
				pctx, cancel = context.WithTimeout(ctx, bf.duration)
				defer cancel()
			}
			start := time.Now()
			var pollErr error
			var b int64
			count := func(r *client.Record) { b += int64(len(r.Key) + len(r.Value)) }
			for n.Load() < target {
				t0 := time.Now()
				// PollFunc, as the SDK recommends for throughput: the records are looked at, not kept.
				got, err := c.PollFunc(pctx, count)
				if err != nil {
					if pctx.Err() == nil {
						pollErr = err
					}
					break
				}
				h.Record(time.Since(t0))
				n.Add(int64(got))
				bytes.Add(b)
				b = 0
			}
			elapsed := time.Since(start)
			if prog != nil {
				prog.Stop()
			}
			if pollErr != nil {
				return fmt.Errorf("consume %s: %w", bf.topic, pollErr)
			}
			if ctx.Err() != nil {
				return &exitError{code: 130, err: errors.New("interrupted")}
			}
			res := benchResult{Mode: "consume", Topic: bf.topic, Partitions: len(parts), Latency: "poll"}
			res.fill(n.Load(), bytes.Load(), elapsed, h)
			return res.print(cmd.OutOrStdout(), out)
		},
	}
	cmd.Flags().StringVarP(&group, "group", "g", "", "consume as this consumer group (default with --members: a new group bench-<time>)")
	cmd.Flags().IntVar(&members, "members", 0, "group members sharing the partitions, each its own client (0: no group, one consumer assigned every partition)")
	return cmd
}

// benchConsumeGroup is `bench consume --group/--members`: members of one group read the topic
// concurrently until, together, they have read the records the group had not committed at start (or
// --count, or for --duration).
func benchConsumeGroup(cmd *cobra.Command, a *app, bf *benchFlags, group string, members int) error {
	out, err := parseOutput(bf.output, formatTable, formatJSON)
	if err != nil {
		return &usageError{err}
	}
	ctx := cmd.Context()
	brokers, adm, parts, err := openTopic(ctx, a, bf.topic)
	if err != nil {
		return err
	}
	defer adm.Close()
	target := bf.count
	if target == 0 {
		committed := map[int32]int64{}
		offs, err := adm.FetchOffsets(ctx, group)
		if err != nil {
			return err
		}
		for _, o := range offs {
			if o.Topic == bf.topic {
				committed[o.Partition] = o.Offset
			}
		}
		d, err := adm.DescribeTopic(ctx, bf.topic)
		if err != nil {
			return err
		}
		for _, p := range d.Partitions {
			from := p.LogStartOffset
			if c, ok := committed[p.Partition]; ok && c > from {
				from = c
			}
			target += max(0, p.HighWatermark-from)
		}
		if target == 0 {
			return fmt.Errorf("group %q has nothing left to read in topic %q: run 'runnel bench produce --topic %s' first, or use a new --group", group, bf.topic, bf.topic)
		}
	}
	stopProf, err := profile.StartCPU(bf.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProf()
	var n, bytes atomic.Int64
	var prog *progress
	if !bf.quiet {
		prog = startProgress(cmd.ErrOrStderr(), fmt.Sprintf("bench consume %s, group %s, %d members", bf.topic, group, members), nil, &n, &bytes)
	}
	h := &histogram{}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if bf.duration > 0 {
		var cancelTimeout context.CancelFunc
		pctx, cancelTimeout = context.WithTimeout(pctx, bf.duration)
		defer cancelTimeout()
	}
	start := time.Now()
	var firstAt, lastAt atomic.Int64 // ns after start: the first record, the one that reached the target
	errs := make([]error, members)
	var wg sync.WaitGroup
	for i := range members {
		gc, err := client.NewGroupConsumer(brokers, group, client.WithAutoOffsetReset(client.OffsetEarliest()),
			client.WithClientID(fmt.Sprintf("runnel-bench-%d", i)))
		if err != nil {
			return fmt.Errorf("group consumer: %w", err)
		}
		if err := gc.Subscribe(bf.topic); err != nil {
			gc.Close()
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// PollFunc, as for one consumer: the records are looked at, not kept.
			var b int64 // bytes of the current call's records
			count := func(r *client.Record) { b += int64(len(r.Key) + len(r.Value)) }
			for {
				t0 := time.Now()
				b = 0
				got, err := gc.PollFunc(pctx, count)
				if err != nil {
					if pctx.Err() == nil {
						errs[i] = err
						cancel()
					}
					break
				}
				h.Record(time.Since(t0))
				firstAt.CompareAndSwap(0, int64(time.Since(start)))
				bytes.Add(b)
				if total := n.Add(int64(got)); total >= target && total-int64(got) < target {
					lastAt.Store(int64(time.Since(start)))
					cancel() // together the members have read everything: stop them all
				}
			}
			if err := gc.Close(); err != nil && errs[i] == nil {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	// The clock stops at the last record, not after the members' Close.
	elapsed := time.Duration(lastAt.Load())
	if elapsed == 0 {
		elapsed = time.Since(start) // stopped by --duration
	}
	if prog != nil {
		prog.Stop()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("consume %s in group %q: %w", bf.topic, group, err)
	}
	if ctx.Err() != nil {
		return &exitError{code: 130, err: errors.New("interrupted")}
	}
	res := benchResult{Mode: "consume", Topic: bf.topic, Partitions: len(parts), Latency: "poll", Group: group, Members: members,
		FirstRecordMs: float64(firstAt.Load()) / 1e6}
	res.fill(n.Load(), bytes.Load(), elapsed, h)
	return res.print(cmd.OutOrStdout(), out)
}

// endTxn commits the producer's transaction (timing it) and, when again, begins the next one. A
// commit that fails is recorded as the run's error, and the transaction aborted so the run goes on (its
// records were counted when acknowledged, though an abort hides them from read_committed readers); a
// fenced producer ends its part of the run.
func (st *produceStats) endTxn(ctx context.Context, p *client.Producer, again bool) error {
	t0 := time.Now()
	err := p.CommitTransaction(ctx)
	if err == nil {
		st.commitLat.Record(time.Since(t0))
		st.commits.Add(1)
	} else {
		if errors.Is(err, client.ErrProducerFenced) || ctx.Err() != nil {
			return fmt.Errorf("commit transaction: %w", err)
		}
		st.fail(fmt.Errorf("commit transaction: %w", err))
		if aerr := p.AbortTransaction(ctx); aerr != nil {
			return fmt.Errorf("abort after a failed commit (%v): %w", err, aerr)
		}
		st.aborts.Add(1)
	}
	if again {
		return p.BeginTransaction()
	}
	return nil
}
