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
// Exit codes: 0 after SIGTERM/SIGINT, 2 when fenced by a newer copier with the same transactional id,
// 1 on any other fatal error.
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
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("transactional_id", *txnID)
	if *in == "" || *out == "" || *txnID == "" {
		fmt.Fprintln(os.Stderr, "copier: -in, -out and -transactional-id are required")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := run(ctx, log, strings.Split(*brokers, ","), *group, *in, *out, *txnID, *txnMax, *work)
	switch {
	case errors.Is(err, client.ErrProducerFenced):
		log.Warn("fenced by a newer copier", "err", err)
		os.Exit(2)
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
				if errors.Is(err, client.ErrProducerFenced) || ctx.Err() != nil {
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
func copyOnce(ctx context.Context, cons *client.GroupConsumer, prod *client.Producer, recs []*client.Record, out string, work time.Duration) error {
	next := map[client.TopicPartition]client.OffsetAndMetadata{}
	for _, r := range recs {
		next[client.TopicPartition{Topic: r.Topic, Partition: r.Partition}] = client.OffsetAndMetadata{Offset: r.Offset + 1}
	}
	err := prod.BeginTransaction()
	if err == nil {
		tctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		for _, r := range recs {
			prod.Produce(tctx, &client.Record{Topic: out, Partition: r.Partition, Key: r.Key,
				Value: fmt.Appendf(nil, "%d/%d/%s", r.Partition, r.Offset, transform(r.Value))}, nil)
		}
		select { // the processing a real stream function does between its reads and its commit
		case <-time.After(work):
		case <-tctx.Done():
		}
		if err = prod.SendOffsetsToTransaction(tctx, next, cons.GroupMetadata()); err == nil {
			err = prod.CommitTransaction(tctx)
		}
	}
	if err == nil {
		return nil
	}
	if errors.Is(err, client.ErrProducerFenced) {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if aerr := prod.AbortTransaction(actx); aerr != nil {
		return errors.Join(err, fmt.Errorf("abort: %w", aerr))
	}
	return err
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
