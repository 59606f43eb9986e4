package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/runnel-io/runnel/client"
	"github.com/spf13/cobra"
)

func newConsumeCmd(a *app) *cobra.Command {
	var (
		from       string
		partitions []int32
		max        int64
		toEnd      bool
		output     string
		group      string
		instanceID string
		isolation  string
	)
	cmd := &cobra.Command{
		Use:   "consume TOPIC",
		Short: "Read records from a topic and print them",
		Long: `Read records from every partition of a topic (or those given with --partition) and print them.

--from says where to start in each partition: earliest (the default: everything retained), latest
(only records written from now on), an offset (the same in each partition; a partition that does not
hold it starts at its nearest offset), or an RFC 3339 time or YYYY-MM-DD date (the first record at or
after it).

Without --max-messages or --end it follows the topic until Ctrl-C. Output formats (-o):
  raw    the value, one line per record (the default; what 'runnel produce' reads back in)
  json   one JSON object per line: topic, partition, offset, timestamp (RFC 3339, UTC), key, value,
         headers. Keys and values are strings when valid UTF-8, else base64 with
         "key_encoding"/"value_encoding": "base64"; a missing key or value is null.
  table  columns PARTITION, OFFSET, TIMESTAMP, KEY, VALUE
Records of one partition come in offset order; partitions are interleaved.

With --group GROUP the command joins the consumer group GROUP instead of reading every partition: the
group's members share the topic's partitions, each partition resumes at the group's committed offset,
and the offsets of the records printed are committed as it goes (every 5s, when partitions move to
another member, and on exit), so the next member of the group continues after them. --from then says
where partitions without a committed offset start (earliest, latest or a time; default earliest), and
--end exits once the partitions this member owns are read up to the high watermark they had at start.
--instance-id makes the member static: restarted within its session timeout with the same id, it gets
its partitions back without a rebalance. See 'runnel group describe GROUP' for the group's progress.

--isolation read_committed reads only what transactions committed: each partition is read up to its
last stable offset (the start of the oldest transaction still open), and records of aborted
transactions are skipped. The default, read_uncommitted, prints every record up to the high watermark,
including those of open and aborted transactions (as Kafka's consumers). Transaction markers are never
printed. With --end, a partition whose transaction is still open is waited for.`,
		Example: `  runnel consume flights --max-messages 10 -o json
  runnel consume flights -p 0 -p 3 --from 2026-11-29T09:00:00Z -o table
  runnel consume flights --end > flights.ndjson
  runnel consume flights --group delays -o json      # run it in several terminals to share the work`,
		Args: args(1, 1, "one TOPIC"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			topic := argv[0]
			fs, err := parseFrom(from)
			if err != nil {
				return &usageError{err}
			}
			format, err := parseOutput(output, formatRaw, formatJSON, formatTable)
			if err != nil {
				return &usageError{err}
			}
			if max < 0 {
				return &usageError{errors.New("--max-messages cannot be negative")}
			}
			iso, err := client.ParseIsolationLevel(isolation)
			if err != nil {
				return &usageError{fmt.Errorf("--isolation: %w", err)}
			}
			brokers, err := a.brokerList()
			if err != nil {
				return err
			}
			if group != "" {
				if len(partitions) > 0 {
					return &usageError{errors.New("--partition cannot be used with --group: the group assigns the partitions")}
				}
				if fs.kind == fromOffset {
					return &usageError{errors.New("--from OFFSET cannot be used with --group: set the group's offsets with 'runnel group reset-offsets'")}
				}
				return consumeGroup(cmd, a, brokers, topic, group, instanceID, fs, max, toEnd, format, iso)
			}
			if instanceID != "" {
				return &usageError{errors.New("--instance-id needs --group")}
			}
			ctx := cmd.Context()
			adm, err := a.newAdmin(brokers)
			if err != nil {
				return err
			}
			defer adm.Close()
			all, err := topicPartitionsWith(ctx, adm, topic)
			if err != nil {
				return err
			}
			parts := all
			if len(partitions) > 0 {
				parts = nil
				for _, p := range partitions {
					if !slices.Contains(all, p) {
						return &usageError{fmt.Errorf("--partition %d: topic %q has partitions 0 to %d", p, topic, len(all)-1)}
					}
					if !slices.Contains(parts, p) {
						parts = append(parts, p)
					}
				}
			}
			var ends map[int32]int64
			if toEnd {
				if ends, err = latestOffsets(ctx, adm, topic, parts); err != nil {
					return err
				}
			}
			c, err := client.NewConsumer(brokers, client.WithIsolationLevel(iso))
			if err != nil {
				return fmt.Errorf("consumer: %w", err)
			}
			defer c.Close()
			for _, p := range parts {
				start := fs.clientOffset()
				if fs.kind == fromOffset {
					// One offset for every partition: where a partition does not hold it, start at the
					// nearest offset it does hold (as rpk does), rather than failing the whole read.
					off, err := clampOffset(ctx, adm, topic, p, fs.offset, cmd.ErrOrStderr())
					if err != nil {
						return err
					}
					start = client.OffsetAt(off)
				}
				if err := c.Assign(topic, p, start); err != nil {
					return fmt.Errorf("assign %s/%d from %s: %w", topic, p, fs, err)
				}
			}
			rw := newRecordWriter(cmd.OutOrStdout(), format)
			defer rw.flush()
			var n int64
			for {
				if ends != nil && reachedEnds(c, topic, ends) {
					return nil
				}
				pctx, cancel := ctx, context.CancelFunc(func() {})
				if ends != nil {
					// Poll returns only records: a position that moves over aborted records and
					// transaction markers alone reaches the end without one.
					pctx, cancel = context.WithTimeout(ctx, endPoll)
				}
				recs, err := c.Poll(pctx)
				cancel()
				if err != nil {
					if ctx.Err() != nil {
						return nil // Ctrl-C ends a follow
					}
					if ends != nil && errors.Is(err, context.DeadlineExceeded) {
						continue
					}
					return fmt.Errorf("consume %s: %w", topic, err)
				}
				for _, r := range recs {
					if err := rw.write(r); err != nil {
						return err
					}
					if n++; max > 0 && n >= max {
						return rw.flush()
					}
				}
				if err := rw.flush(); err != nil {
					return err
				}
			}
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&from, "from", "earliest", "where to start: earliest, latest, an offset, an RFC 3339 time or a YYYY-MM-DD date")
	fs.Int32SliceVarP(&partitions, "partition", "p", nil, "read only these partitions (repeatable or comma-separated; default all)")
	fs.Int64VarP(&max, "max-messages", "n", 0, "exit after this many records (0: no limit)")
	fs.BoolVarP(&toEnd, "end", "e", false, "exit once every partition is read up to the high watermark it had at start")
	fs.StringVarP(&group, "group", "g", "", "join this consumer group: share the partitions with its other members, resume at its committed offsets and commit as records are printed")
	fs.StringVar(&instanceID, "instance-id", "", "with --group: a static member id (group.instance.id), so a restart keeps its partitions")
	fs.StringVar(&isolation, "isolation", "read_uncommitted", "read_committed (only records of committed transactions, up to the last stable offset) or read_uncommitted (everything)")
	addOutputFlag(cmd, &output, formatRaw, formatJSON, formatTable)
	addBrokersFlag(fs, a)
	return cmd
}

// clampOffset returns offset moved into the partition's [log start offset, high watermark] range, and
// says so on w when it had to move it.
func clampOffset(ctx context.Context, adm *client.Admin, topic string, p int32, offset int64, w io.Writer) (int64, error) {
	start, _, err := adm.ListOffsets(ctx, topic, p, client.OffsetEarliest())
	if err != nil {
		return 0, fmt.Errorf("earliest offset of %s/%d: %w", topic, p, err)
	}
	end, _, err := adm.ListOffsets(ctx, topic, p, client.OffsetLatest())
	if err != nil {
		return 0, fmt.Errorf("latest offset of %s/%d: %w", topic, p, err)
	}
	clamped := min(max(offset, start), end)
	switch {
	case clamped == offset:
	case start == end:
		fmt.Fprintf(w, "runnel: partition %d holds no records yet; starting it at its next offset, %d\n", p, end)
	default:
		fmt.Fprintf(w, "runnel: partition %d holds offsets %d to %d; starting it at %d\n", p, start, end-1, clamped)
	}
	return clamped, nil
}

// latestOffsets returns the high watermark of each partition.
func latestOffsets(ctx context.Context, adm *client.Admin, topic string, parts []int32) (map[int32]int64, error) {
	ends := make(map[int32]int64, len(parts))
	for _, p := range parts {
		off, _, err := adm.ListOffsets(ctx, topic, p, client.OffsetLatest())
		if err != nil {
			return nil, fmt.Errorf("latest offset of %s/%d: %w", topic, p, err)
		}
		ends[p] = off
	}
	return ends, nil
}

// reachedEnds reports whether the consumer's position in each partition is at or past its end.
func reachedEnds(c *client.Consumer, topic string, ends map[int32]int64) bool {
	for p, end := range ends {
		if c.Position(topic, p) < end {
			return false
		}
	}
	return true
}

// endPoll is how long a Poll waits in `consume --end` before the ends are checked again: a member whose
// partitions are all read has nothing to wait for, and a position can reach the end over aborted
// records and transaction markers, which Poll does not return.
const endPoll = 200 * time.Millisecond

// consumeGroup is `consume --group`: a group member printing records. A record counts as processed
// once it is printed; auto-commit and the commit on exit store the offsets after the printed records,
// and records fetched but not printed (past --max-messages) are given back with Seek, so the next
// member of the group starts at the first record not printed.
func consumeGroup(cmd *cobra.Command, a *app, brokers []string, topic, group, instanceID string, fs fromSpec, max int64, toEnd bool, format string, iso client.IsolationLevel) error {
	ctx := cmd.Context()
	adm, err := a.newAdmin(brokers)
	if err != nil {
		return err
	}
	defer adm.Close()
	all, err := topicPartitionsWith(ctx, adm, topic)
	if err != nil {
		return err
	}
	var ends map[int32]int64
	if toEnd {
		if ends, err = latestOffsets(ctx, adm, topic, all); err != nil {
			return err
		}
	}
	opts := []client.GroupOption{client.WithAutoOffsetReset(fs.clientOffset()), client.WithClientID("runnel-cli"), client.WithIsolationLevel(iso)}
	if instanceID != "" {
		opts = append(opts, client.WithInstanceID(instanceID))
	}
	gc, err := client.NewGroupConsumer(brokers, group, opts...)
	if err != nil {
		return fmt.Errorf("group consumer: %w", err)
	}
	closed := false
	defer func() {
		if !closed {
			gc.Close()
		}
	}()
	if err := gc.Subscribe(topic); err != nil {
		return fmt.Errorf("subscribe to %s: %w", topic, err)
	}
	rw := newRecordWriter(cmd.OutOrStdout(), format)
	var n int64
loop:
	for {
		if toEnd && ownedAtEnd(gc, topic, ends) {
			break
		}
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if toEnd {
			pctx, cancel = context.WithTimeout(ctx, endPoll)
		}
		recs, err := gc.Poll(pctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				break // Ctrl-C ends a follow; what was printed is committed below
			}
			if toEnd && errors.Is(err, context.DeadlineExceeded) {
				continue
			}
			rw.flush()
			return fmt.Errorf("consume %s in group %q: %w", topic, group, err)
		}
		for i, r := range recs {
			if err := rw.write(r); err != nil {
				return err
			}
			if n++; max > 0 && n >= max {
				giveBack(gc, recs[i+1:])
				break loop
			}
		}
		if err := rw.flush(); err != nil {
			return err
		}
	}
	if err := rw.flush(); err != nil {
		return err
	}
	closed = true
	if err := gc.Close(); err != nil {
		return fmt.Errorf("leave group %q: %w", group, err)
	}
	return nil
}

// giveBack seeks each partition of recs back to its first record there, so the commit on Close stores
// the offsets of the records actually printed.
func giveBack(gc *client.GroupConsumer, recs []*client.Record) {
	seen := map[int32]bool{}
	for _, r := range recs {
		if !seen[r.Partition] {
			seen[r.Partition] = true
			gc.Seek(r.Topic, r.Partition, r.Offset)
		}
	}
}

// ownedAtEnd reports whether the member owns partitions and has read each up to its end.
func ownedAtEnd(gc *client.GroupConsumer, topic string, ends map[int32]int64) bool {
	owned := gc.Assignment()
	if len(owned) == 0 {
		return false
	}
	for _, k := range owned {
		if k.Topic == topic && gc.Position(k.Topic, k.Partition) < ends[k.Partition] {
			return false
		}
	}
	return true
}
