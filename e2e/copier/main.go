// Command copier is the e2e tests' consume-transform-produce process (KIP-98, KIP-447): a member of a
// consumer group reading one topic read_committed, writing one transformed record per input record to
// another topic's partition of the same number, and committing the input offsets in the same
// transaction. The e2e tests kill it with SIGKILL and start it again; a restarted copier with the same
// transactional id fences its previous incarnation, and the group hands its partitions on from their
// committed offsets, so every input record is in the output exactly once for read_committed readers.
//
// An output record's value is "IN_PARTITION/IN_OFFSET/TRANSFORMED", where TRANSFORMED is the input
// value's "origin" field upper-cased (the flight records' airport code) or, for other values, their
// length, so the checker can tell which input each output stands for.
//
// With -txn-header (off by default) the copier also makes its transactions checkable (the fault
// workload of e2e/txnwork_test.go): every output record carries the headers "txn" (the transaction's
// name "TRANSACTIONAL_ID/INCARNATION/SEQ", unique across restarts) and "txn-n" (how many records the
// transaction wrote), and the copier prints each transaction's begin and outcome on stdout, one line
// each: "txn begin NAME N", "txn commit NAME N" (CommitTransaction succeeded), "txn abort NAME N ERR"
// (AbortTransaction succeeded), "txn unknown NAME N ERR" (the abort failed or the producer was fenced:
// the coordinator decides). A kill -9 leaves a begin without an outcome.
//
// Exit codes: 0 after SIGTERM/SIGINT, 2 when fenced by a newer copier with the same transactional id,
// 3 when a transaction's outcome is unknown (neither its commit nor its abort went through) or the
// coordinator aborted it past its timeout (restart it: it resumes from the group's committed
// offsets), 1 on any other fatal error.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/runnel-io/runnel/client"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:7070", "comma-separated broker addresses")
	group := flag.String("group", "copier", "consumer group")
	in := flag.String("in", "", "input topic")
	out := flag.String("out", "", "output topic (at least as many partitions as the input)")
	txnID := flag.String("transactional-id", "", "transactional id (one per copier slot, stable across restarts)")
	txnMax := flag.Int("txn-records", 200, "records per transaction at most")
	work := flag.Duration("work", 100*time.Millisecond, "simulated processing time per transaction, spent inside it")
	header := flag.Bool("txn-header", false, "tag output records with the headers txn (name) and txn-n (records), and print each transaction's begin and outcome on stdout")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("transactional_id", *txnID)
	if *in == "" || *out == "" || *txnID == "" {
		fmt.Fprintln(os.Stderr, "copier: -in, -out and -transactional-id are required")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *header {
		tagger = &txnTagger{prefix: fmt.Sprintf("%s/%x", *txnID, time.Now().UnixNano())}
	}
	err := run(ctx, log, strings.Split(*brokers, ","), *group, *in, *out, *txnID, *txnMax, *work)
	switch {
	case errors.Is(err, client.ErrProducerFenced) && errors.Is(err, client.ErrTransactionAborted):
		// Not a newer copier: the coordinator aborted a transaction that outlived its timeout and
		// bumped the epoch. A new incarnation resumes from the committed offsets.
		log.Warn("transaction aborted by the coordinator's timeout; restart", "err", err)
		os.Exit(3)
	case errors.Is(err, client.ErrProducerFenced):
		log.Warn("fenced by a newer copier", "err", err)
		os.Exit(2)
	case errors.Is(err, errOutcomeUnknown):
		log.Warn("a transaction's outcome is unknown; restart to resume from the committed offsets", "err", err)
		os.Exit(3)
	case err != nil && ctx.Err() == nil:
		log.Error("copier failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger, brokers []string, group, in, out, txnID string, txnMax int, work time.Duration) error {
	cons, err := client.NewGroupConsumer(brokers, group, client.WithAutoCommit(false),
		client.WithAutoOffsetReset(client.OffsetEarliest()), client.WithIsolationLevel(client.ReadCommitted),
		client.WithSessionTimeout(6*time.Second))
	if err != nil {
		return err
	}
	defer cons.Close()
	if err := cons.Subscribe(in); err != nil {
		return err
	}
	prod, err := client.NewProducer(brokers, client.WithTransactionalID(txnID), client.WithLinger(5*time.Millisecond),
		client.WithTransactionTimeout(20*time.Second))
	if err != nil {
		return err
	}
	defer prod.Close()
	if err := prod.InitTransactions(ctx); err != nil {
		return fmt.Errorf("init transactions: %w", err)
	}
	log.Info("copier started")
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		recs, err := cons.Poll(pctx)
		cancel()
		if err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("poll: %w", err)
		}
		// One transaction per txnMax records. After an abort the rest of the answer is dropped too and
		// every partition goes back to its first record not committed, to be read again.
		for queue := recs; len(queue) > 0; {
			n := min(len(queue), txnMax)
			if err := copyOnce(ctx, cons, prod, queue[:n], out, work); err != nil {
				if errors.Is(err, client.ErrProducerFenced) || errors.Is(err, errOutcomeUnknown) || ctx.Err() != nil {
					return err
				}
				log.Info("transaction aborted; its input is read again", "records", n, "err", err)
				seekFirst(cons, queue)
				break
			}
			queue = queue[n:]
		}
	}
	return nil
}

// seekFirst moves the consumer back to the first of recs of each partition.
func seekFirst(cons *client.GroupConsumer, recs []*client.Record) {
	first := map[client.TopicPartition]int64{}
	for _, r := range recs {
		k := client.TopicPartition{Topic: r.Topic, Partition: r.Partition}
		if _, ok := first[k]; !ok {
			first[k] = r.Offset
		}
	}
	for k, off := range first {
		cons.Seek(k.Topic, k.Partition, off)
	}
}

// copyOnce copies recs in one transaction with their offsets, spending work inside it. On failure it
// aborts (the caller moves the consumer back).
// errOutcomeUnknown: a transaction neither committed nor aborted as far as the copier knows. Going on
// could copy its input twice (if it committed) or skip it; the copier exits instead, and its
// restart reads the group's committed offsets, which say what the transaction did.
var errOutcomeUnknown = errors.New("transaction outcome unknown")

func copyOnce(ctx context.Context, cons *client.GroupConsumer, prod *client.Producer, recs []*client.Record, out string, work time.Duration) error {
	next := map[client.TopicPartition]client.OffsetAndMetadata{}
	for _, r := range recs {
		next[client.TopicPartition{Topic: r.Topic, Partition: r.Partition}] = client.OffsetAndMetadata{Offset: r.Offset + 1}
	}
	err := prod.BeginTransaction()
	var headers []client.Header
	if err == nil {
		headers = tagger.begin(len(recs))
		tctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		for _, r := range recs {
			prod.Produce(tctx, &client.Record{Topic: out, Partition: r.Partition, Key: r.Key, Headers: headers,
				Value: fmt.Appendf(nil, "%d/%d/%s", r.Partition, r.Offset, transform(r.Value))}, nil)
		}
		select { // the processing a real stream function does between its reads and its commit
		case <-time.After(work):
		case <-tctx.Done():
		}
		if err = prod.SendOffsetsToTransaction(tctx, next, cons.GroupMetadata()); err == nil {
			err = prod.CommitTransaction(tctx)
			// A commit that ran out of time may have been decided: ask again (a repeated commit of a
			// committed transaction succeeds) rather than abort, which the coordinator refuses for a
			// committed transaction.
			for i := 0; i < 3 && err != nil && ctx.Err() == nil && !errors.Is(err, client.ErrTransactionFailed) && !errors.Is(err, client.ErrProducerFenced); i++ {
				rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
				err = prod.CommitTransaction(rctx)
				rcancel()
			}
		}
	}
	if err == nil {
		tagger.outcome(headers, "commit", nil)
		return nil
	}
	if errors.Is(err, client.ErrProducerFenced) {
		tagger.outcome(headers, "unknown", err)
		return err
	}
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if aerr := prod.AbortTransaction(actx); aerr != nil {
		tagger.outcome(headers, "unknown", errors.Join(err, aerr))
		return errors.Join(errOutcomeUnknown, err, fmt.Errorf("abort: %w", aerr))
	}
	tagger.outcome(headers, "abort", err)
	return err
}

// tagger is the -txn-header tagging, nil without the flag.
var tagger *txnTagger

// txnTagger names the copier's transactions "PREFIX/SEQ" (PREFIX: the transactional id and the
// process's start time in hex nanoseconds, so names stay unique across restarts) and reports them on
// stdout. Only the copy loop's goroutine uses it.
type txnTagger struct {
	prefix string
	seq    int
}

// begin names the next transaction of n records and returns its headers (nil on a nil tagger).
func (t *txnTagger) begin(n int) []client.Header {
	if t == nil {
		return nil
	}
	t.seq++
	name := fmt.Sprintf("%s/%d", t.prefix, t.seq)
	fmt.Printf("txn begin %s %d\n", name, n)
	return []client.Header{{Key: "txn", Value: []byte(name)}, {Key: "txn-n", Value: []byte(fmt.Sprint(n))}}
}

// outcome prints what became of the transaction of headers: commit, abort or unknown.
func (t *txnTagger) outcome(headers []client.Header, what string, err error) {
	if t == nil || len(headers) < 2 {
		return
	}
	line := fmt.Sprintf("txn %s %s %s", what, headers[0].Value, headers[1].Value)
	if err != nil {
		line += " " + strings.ReplaceAll(err.Error(), "\n", " ")
	}
	fmt.Println(line)
}

// transform is the copier's work on a value: the flight record's origin airport upper-cased.
func transform(v []byte) string {
	var f struct {
		Origin string `json:"origin"`
	}
	if json.Unmarshal(v, &f) == nil && f.Origin != "" {
		return strings.ToUpper(f.Origin)
	}
	return fmt.Sprint(len(v))
}
