package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/runnel-io/runnel/client"
	"github.com/spf13/cobra"
)

func newTxnCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "txn",
		Aliases: []string{"transaction", "transactions"},
		Short:   "List, describe and abort transactions",
		Long: `Inspect and manage transactions (as kafka-transactions does). A transactional producer
(WithTransactionalID in the Go SDK) writes to several partitions, and commits consumed offsets, as one
atomic unit; its transaction coordinator keeps each transactional id's producer id, epoch, state and
the partitions of its open transaction. Consumers that read committed ('runnel consume --isolation
read_committed') never see the records of aborted transactions, nor of open ones.

'runnel txn abort' ends a transaction that its producer left open (a "hanging" transaction, which
holds back read_committed consumers of its partitions until its timeout): it is aborted and its
producer fenced.`,
		Args: groupArgs,
		RunE: groupRun,
	}
	addBrokersFlag(cmd.PersistentFlags(), a)
	cmd.AddCommand(newTxnListCmd(a), newTxnDescribeCmd(a), newTxnAbortCmd(a))
	return cmd
}

// txnSummaryView is one row of `txn list -o json`.
type txnSummaryView struct {
	TransactionalID string `json:"transactional_id"`
	ProducerID      int64  `json:"producer_id"`
	State           string `json:"state"`
	Coordinator     int32  `json:"coordinator"`
}

func newTxnListCmd(a *app) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List transactional ids with their producer id, state and coordinator",
		Long: `List every transactional id the cluster knows: each broker is asked for those it coordinates,
and the answers are merged. States are Kafka's: Empty (no transaction open), Ongoing, PrepareCommit and
PrepareAbort (decided, markers being written), CompleteCommit, CompleteAbort, Dead (expired).`,
		Args: args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				ts, err := adm.ListTransactions(cmd.Context())
				if err != nil {
					return err
				}
				views := make([]txnSummaryView, 0, len(ts))
				for _, t := range ts {
					views = append(views, txnSummaryView{TransactionalID: t.TransactionalID, ProducerID: t.ProducerID, State: t.State, Coordinator: t.CoordinatorID})
				}
				return printList(cmd.OutOrStdout(), out, views, "TRANSACTIONAL-ID\tPRODUCER-ID\tSTATE\tCOORDINATOR", func(v txnSummaryView) string {
					return fmt.Sprintf("%s\t%d\t%s\t%d", v.TransactionalID, v.ProducerID, v.State, v.Coordinator)
				})
			})
		},
	}
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	return cmd
}

// txnView is `txn describe -o json`. Start and age are null when no transaction is ongoing.
type txnView struct {
	TransactionalID string         `json:"transactional_id"`
	State           string         `json:"state"`
	ProducerID      int64          `json:"producer_id"`
	ProducerEpoch   int16          `json:"producer_epoch"`
	TimeoutMs       int64          `json:"timeout_ms"`
	Start           *time.Time     `json:"start"`
	AgeMs           *int64         `json:"age_ms"`
	Partitions      []partitionRef `json:"partitions"`
	Groups          []string       `json:"groups"`
	Coordinator     int32          `json:"coordinator"`
}

func newTxnDescribeCmd(a *app) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "describe ID",
		Short: "Show a transactional id's state, producer id and epoch, timeout, and its open transaction's partitions, groups and age",
		Long: `Show a transactional id as its coordinator holds it: the state, producer id and epoch, the
transaction timeout, and for the transaction in progress the partitions and consumer groups in it and
how long it has been open (a transaction older than its timeout is aborted by the coordinator).`,
		Example: `  runnel txn describe payments-writer
  runnel txn describe payments-writer -o json | jq .partitions`,
		Args: args(1, 1, "one transactional ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				d, err := adm.DescribeTransaction(cmd.Context(), argv[0])
				if err != nil {
					return err
				}
				v := txnViewOf(d, time.Now())
				if out == formatJSON {
					return printJSON(cmd.OutOrStdout(), v)
				}
				return printTxnView(cmd.OutOrStdout(), v)
			})
		},
	}
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	return cmd
}

func txnViewOf(d *client.TransactionDescription, now time.Time) txnView {
	v := txnView{TransactionalID: d.TransactionalID, State: d.State, ProducerID: d.ProducerID, ProducerEpoch: d.ProducerEpoch,
		TimeoutMs: d.Timeout.Milliseconds(), Partitions: partitionRefs(d.Partitions), Groups: nonNilStrings(d.Groups), Coordinator: d.CoordinatorID}
	if !d.StartTime.IsZero() {
		start := d.StartTime.UTC()
		age := now.Sub(d.StartTime).Milliseconds()
		v.Start, v.AgeMs = &start, &age
	}
	return v
}

func printTxnView(w io.Writer, v txnView) error {
	tw := newTable(w)
	fmt.Fprintf(tw, "TRANSACTIONAL-ID\t%s\n", v.TransactionalID)
	fmt.Fprintf(tw, "STATE\t%s\n", v.State)
	fmt.Fprintf(tw, "PRODUCER\tid %d, epoch %d\n", v.ProducerID, v.ProducerEpoch)
	fmt.Fprintf(tw, "TIMEOUT\t%v\n", time.Duration(v.TimeoutMs)*time.Millisecond)
	age := "- (no transaction open)"
	if v.AgeMs != nil {
		age = fmt.Sprintf("%v (since %s)", (time.Duration(*v.AgeMs) * time.Millisecond).Round(time.Millisecond), v.Start.Format(time.RFC3339))
	}
	fmt.Fprintf(tw, "AGE\t%s\n", age)
	fmt.Fprintf(tw, "PARTITIONS\t%s\n", dash(formatPartitions(v.Partitions)))
	fmt.Fprintf(tw, "GROUPS\t%s\n", dash(strings.Join(v.Groups, ",")))
	fmt.Fprintf(tw, "COORDINATOR\t%d\n", v.Coordinator)
	return tw.Flush()
}

// txnAbortView is `txn abort -o json`.
type txnAbortView struct {
	TransactionalID string `json:"transactional_id"`
	ProducerID      int64  `json:"producer_id"`
	ProducerEpoch   int16  `json:"producer_epoch"`
}

func newTxnAbortCmd(a *app) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "abort ID",
		Short: "Abort a transactional id's open transaction and fence its producer",
		Long: `Abort the transaction a transactional id has open: ABORT markers go to its partitions (so
read_committed consumers move past it and never see its records, and its offset commits are dropped),
and the producer epoch is bumped, so the producer that opened it is fenced: its later writes and
commits fail. Use it for a transaction its producer abandoned; a live producer must then start again
(InitTransactions).`,
		Example: `  runnel txn abort payments-writer`,
		Args:    args(1, 1, "one transactional ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				pid, epoch, err := adm.AbortTransaction(cmd.Context(), argv[0])
				if err != nil {
					return err
				}
				v := txnAbortView{TransactionalID: argv[0], ProducerID: pid, ProducerEpoch: epoch}
				if out == formatJSON {
					return printJSON(cmd.OutOrStdout(), v)
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "aborted the transaction of %q; producer %d is now at epoch %d (its previous epoch is fenced)\n",
					v.TransactionalID, v.ProducerID, v.ProducerEpoch)
				return err
			})
		},
	}
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	return cmd
}
