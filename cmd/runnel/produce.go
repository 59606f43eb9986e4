package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/runnel-io/runnel/client"
	"github.com/spf13/cobra"
)

// producerFlags are the producer settings shared by produce, bench produce and demo.
type producerFlags struct {
	acks        string
	compression string
	linger      time.Duration
	batchBytes  int
}

func (f *producerFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.acks, "acks", "all", "when a record counts as written: all (in every in-sync replica, and fsynced on the leader unless it runs --no-fsync), 1 (leader wrote it), 0 (no answer)")
	fs.StringVar(&f.compression, "compression", "none", "batch compression: none, gzip, snappy, lz4 or zstd")
	sdk := client.DefaultProducer()
	fs.DurationVar(&f.linger, "linger", sdk.Linger, "how long a batch waits for more records before it is sent (the SDK's default: "+sdk.Linger.String()+"; 0: natural batching, a batch that is not full waits while a request to its broker is in flight)")
	fs.IntVar(&f.batchBytes, "batch-bytes", sdk.BatchBytes, "largest batch per partition in bytes (the SDK's default: "+humanize.IBytes(uint64(sdk.BatchBytes))+")")
}

// effectiveBatchBytes is the batch size the producers will use: --batch-bytes when given, else the SDK's.
func (f *producerFlags) effectiveBatchBytes(cmd *cobra.Command) int {
	if cmd.Flags().Changed("batch-bytes") {
		return f.batchBytes
	}
	return client.DefaultProducer().BatchBytes
}

// options turns the flags into SDK options; only flags the user set override the SDK's defaults.
func (f *producerFlags) options(cmd *cobra.Command) ([]client.ProducerOption, error) {
	acks, err := parseAcks(f.acks)
	if err != nil {
		return nil, &usageError{err}
	}
	comp, err := parseCompression(f.compression)
	if err != nil {
		return nil, &usageError{err}
	}
	opts := []client.ProducerOption{client.WithAcks(acks), client.WithCompression(comp), client.WithClientID("runnel-cli")}
	if cmd.Flags().Changed("linger") {
		if f.linger < 0 {
			return nil, &usageError{errors.New("--linger cannot be negative")}
		}
		opts = append(opts, client.WithLinger(f.linger))
	}
	if cmd.Flags().Changed("batch-bytes") {
		if f.batchBytes <= 0 {
			return nil, &usageError{errors.New("--batch-bytes must be positive")}
		}
		opts = append(opts, client.WithBatchBytes(f.batchBytes))
	}
	return opts, nil
}

func newProduceCmd(a *app) *cobra.Command {
	var (
		pf        producerFlags
		file      string
		keyField  string
		key       string
		partition int32
		headers   []string
		quiet     bool
		output    string
	)
	cmd := &cobra.Command{
		Use:   "produce TOPIC",
		Short: "Write records to a topic, one per line of stdin or a file",
		Long: `Write records to a topic: one record per line of stdin, or of --file (plain, .zst or .gz).
Empty lines are skipped. The line is the record's value; the key comes from --key (the same for all)
or --key-field (a top-level field of each line's JSON object), else records have no key and are
spread over partitions. Records with the same key go to the same partition (Kafka's murmur2
partitioner), so they are read back in the order they were written.

With --file, progress is shown on stderr about once a second. A summary (records, bytes, time, rate)
ends the run, on stderr, or on stdout as one JSON object with -o json; if any record failed, the first
error is shown and the exit status is 1.

On Ctrl-C (or SIGTERM) it stops reading at once, says on stderr (unless -q) how many records it has
read but not yet delivered, and waits for their answers up to the delivery timeout (2 minutes); the
exit status is then 130, or 1 if a record failed. A second Ctrl-C or SIGTERM ends it without
waiting, killed by that signal (a shell shows 130 or 143).`,
		Example: `  echo '{"id":1,"msg":"hi"}' | runnel produce events --key-field id
  runnel produce flights --file ../shared/data/flights-3m.ndjson.zst --key-field origin --compression lz4`,
		Args: args(1, 1, "one TOPIC"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			topic := argv[0]
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			if key != "" && keyField != "" {
				return &usageError{errors.New("--key and --key-field exclude each other")}
			}
			if partition < -1 {
				return &usageError{errors.New("--partition must be a partition number, or -1 to let the partitioner choose")}
			}
			hs, err := parseHeaders(headers)
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
			ctx := cmd.Context()
			parts, err := topicPartitions(ctx, a, brokers, topic)
			if err != nil {
				return err
			}
			if partition >= int32(len(parts)) {
				return &usageError{fmt.Errorf("--partition %d: topic %q has partitions 0 to %d", partition, topic, len(parts)-1)}
			}
			in, err := openInput(file, cmd.InOrStdin())
			if err != nil {
				return err
			}
			defer in.Close()
			p, err := client.NewProducer(brokers, opts...)
			if err != nil {
				return fmt.Errorf("producer: %w", err)
			}
			lp := lineProducer{topic: topic, keyField: keyField, partition: partition, headers: hs,
				deliveryTimeout: client.DefaultProducer().DeliveryTimeout}
			if !quiet {
				lp.notice = cmd.ErrOrStderr()
			}
			if key != "" {
				lp.key = []byte(key)
			}
			var st produceStats
			var prog *progress
			if file != "" && file != "-" && !quiet {
				prog = startProgress(cmd.ErrOrStderr(), topic, in, &st.acked, &st.ackedBytes)
			}
			start := time.Now()
			err = lp.run(ctx, p, in, &st)
			if ferr := p.Close(); ferr != nil && err == nil && st.failed.Load() == 0 {
				err = fmt.Errorf("closing the producer: %w", ferr)
			}
			elapsed := time.Since(start)
			if prog != nil {
				prog.Stop()
			}
			switch {
			case out == formatJSON:
				if jerr := printJSONLine(cmd.OutOrStdout(), st.summaryView(topic, elapsed)); jerr != nil && err == nil {
					err = jerr
				}
			case !quiet:
				st.summary(cmd.ErrOrStderr(), topic, elapsed)
			}
			return st.result(ctx, err)
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&file, "file", "f", "", "read records from this file instead of stdin (.zst and .gz are decompressed)")
	fs.StringVar(&keyField, "key-field", "", "take each record's key from this top-level field of the line's JSON object")
	fs.StringVarP(&key, "key", "k", "", "give every record this key")
	fs.Int32VarP(&partition, "partition", "p", -1, "write every record to this partition (-1: chosen by key, or sticky for keyless records)")
	fs.StringArrayVarP(&headers, "header", "H", nil, "add a header key=value to every record (repeatable)")
	fs.BoolVarP(&quiet, "quiet", "q", false, "print neither progress nor the summary")
	pf.register(cmd)
	addBrokersFlag(fs, a)
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	return cmd
}

// lineProducer turns lines into records and hands them to a Producer.
type lineProducer struct {
	topic     string
	keyField  string
	key       []byte
	partition int32
	headers   []client.Header
	// onRecord, if set, sees each record (line number n) before it is sent.
	onRecord func(r *client.Record, n int64)
	// notice, if set, is told on an interrupt how many records are still being delivered, so that a
	// user who sees the command keep running knows why and how to end it.
	notice io.Writer
	// deliveryTimeout bounds that wait (the producer's WithDeliveryTimeout); it is named in the notice.
	deliveryTimeout time.Duration
	// onInputEnd, if set, runs when the input ended before any interrupt, as the last flush starts.
	onInputEnd func()
}

// tellPending writes the notice, if any, of an interrupt that leaves records being delivered. It runs
// once nothing more is produced, so the count of records without an answer only falls.
func (lp *lineProducer) tellPending(st *produceStats) {
	if n := st.read.Load() - st.acked.Load() - st.failed.Load(); n > 0 && lp.notice != nil {
		fmt.Fprintf(lp.notice, "interrupted: stopped reading input; delivering the %s records already read (up to the delivery timeout, %s); interrupt again to quit without waiting\n",
			comma(n), lp.deliveryTimeout)
	}
}

// produceStats counts a produce run; the promise updates it from the SDK's goroutines.
type produceStats struct {
	// Transactional bench runs: commits and aborts made, and CommitTransaction latencies.
	commits, aborts atomic.Int64
	commitLat       *histogram

	read       atomic.Int64 // records attempted (lines read)
	acked      atomic.Int64
	ackedBytes atomic.Int64 // bytes of keys and values acknowledged
	failed     atomic.Int64
	mu         sync.Mutex
	firstErr   error
}

func (st *produceStats) fail(err error) {
	st.failed.Add(1)
	st.mu.Lock()
	if st.firstErr == nil {
		st.firstErr = err
	}
	st.mu.Unlock()
}

func (st *produceStats) promise(r *client.Record, err error) {
	if err != nil {
		st.fail(fmt.Errorf("record for partition %d: %w", r.Partition, err))
		return
	}
	st.acked.Add(1)
	st.ackedBytes.Add(int64(len(r.Key) + len(r.Value)))
}

// run reads every line of in and produces it, then waits for every answer (Flush). It returns an error
// for input or flush failures; failed records are counted in st.
//
// When ctx ends (Ctrl-C), run stops producing at once, even while a read from a terminal blocks: the
// reading goroutine is left behind (the process is about to exit), and no record goes out after the
// stop. It tells lp.notice how many records it is still delivering, also when ctx ends during the
// last flush of an input that had ended.
func (lp *lineProducer) run(ctx context.Context, p *client.Producer, in *input, st *produceStats) error {
	var (
		sl      slab
		mu      sync.Mutex // held while a line is produced; stopped is set under it
		stopped bool
	)
	done := make(chan error, 1)
	go func() {
		done <- in.lines(func(line []byte, n int64) bool {
			mu.Lock()
			defer mu.Unlock()
			if stopped || ctx.Err() != nil {
				return false
			}
			lp.produceLine(ctx, p, line, n, &sl, st)
			return true
		})
	}()
	var err error
	interrupted := false
	select {
	case err = <-done:
	case <-ctx.Done():
		interrupted = true
		mu.Lock()
		stopped = true
		mu.Unlock()
		lp.tellPending(st)
	}
	// Records already handed over are delivered even after an interrupt: the SDK's delivery timeout
	// bounds the wait, and a second Ctrl-C ends the process. An interrupt while the last records of a
	// finished input are delivered is told the same, since the command then seems to hang as well.
	flushed := make(chan error, 1)
	go func() { flushed <- p.Flush(context.Background()) }()
	var ferr error
	if interrupted {
		ferr = <-flushed
	} else {
		if lp.onInputEnd != nil {
			lp.onInputEnd()
		}
		select {
		case ferr = <-flushed:
		case <-ctx.Done():
			lp.tellPending(st)
			ferr = <-flushed
		}
	}
	if ferr != nil && err == nil && st.failed.Load() == 0 {
		err = fmt.Errorf("flush: %w", ferr)
	}
	return err
}

// produceLine turns line number n into a record and hands it to p.
func (lp *lineProducer) produceLine(ctx context.Context, p *client.Producer, line []byte, n int64, sl *slab, st *produceStats) {
	st.read.Add(1)
	r := &client.Record{Topic: lp.topic, Partition: lp.partition, Key: lp.key, Value: sl.copy(line), Headers: lp.headers}
	if lp.keyField != "" {
		k, err := jsonField(r.Value, lp.keyField)
		if err != nil {
			st.fail(fmt.Errorf("line %d: --key-field %s: %w", n, lp.keyField, err))
			return
		}
		r.Key = k
	}
	if lp.onRecord != nil {
		lp.onRecord(r, n)
	}
	p.Produce(ctx, r, st.promise)
}

// summary prints the closing line of a produce run.
func (st *produceStats) summary(w io.Writer, topic string, elapsed time.Duration) {
	n, b := st.acked.Load(), st.ackedBytes.Load()
	fmt.Fprintf(w, "produced %s records (%s) to %s in %s: %s records/s, %.1f MB/s",
		comma(n), mb(b), topic, elapsed.Round(time.Millisecond), comma(int64(rate(n, elapsed))), rate(b, elapsed)/1e6)
	if f := st.failed.Load(); f > 0 {
		fmt.Fprintf(w, "; %s failed", comma(f))
	}
	fmt.Fprintln(w)
}

// produceSummary is the closing summary of a produce run in -o json: records and bytes (keys and
// values) acknowledged, wall seconds, rates, and the failures with the first one's message.
type produceSummary struct {
	Topic         string  `json:"topic"`
	Records       int64   `json:"records"`
	Bytes         int64   `json:"bytes"`
	Seconds       float64 `json:"seconds"`
	RecordsPerSec float64 `json:"records_per_sec"`
	MBPerSec      float64 `json:"mb_per_sec"`
	Failed        int64   `json:"failed"`
	FirstError    string  `json:"first_error,omitempty"`
}

// summaryView is summary's content for -o json.
func (st *produceStats) summaryView(topic string, elapsed time.Duration) produceSummary {
	n, b := st.acked.Load(), st.ackedBytes.Load()
	v := produceSummary{Topic: topic, Records: n, Bytes: b, Seconds: elapsed.Seconds(),
		RecordsPerSec: rate(n, elapsed), MBPerSec: rate(b, elapsed) / 1e6, Failed: st.failed.Load()}
	if err := st.first(); err != nil {
		v.FirstError = err.Error()
	}
	return v
}

// first returns the first failure, or nil.
func (st *produceStats) first() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.firstErr
}

// result is the run's outcome as the command's error: nil when every record was written.
func (st *produceStats) result(ctx context.Context, err error) error {
	if err != nil {
		return err
	}
	if f := st.failed.Load(); f > 0 {
		return fmt.Errorf("%s of %s records failed; the first: %w", comma(f), comma(st.read.Load()), st.first())
	}
	if ctx.Err() != nil {
		return &exitError{code: 130, err: errors.New("interrupted: stopped reading input; records read so far were delivered")}
	}
	return nil
}
