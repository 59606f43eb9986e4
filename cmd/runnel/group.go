package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runnel-io/runnel/client"
	"github.com/spf13/cobra"
)

func newGroupCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "group",
		Short: "List, describe, reset and delete consumer groups",
		Long: `Inspect and manage consumer groups (as kafka-consumer-groups does). Members of a group share the
partitions of the topics they subscribe to; the group's committed offsets say where each partition
resumes. Join a group with 'runnel consume TOPIC --group GROUP'.`,
		Args: groupArgs,
		RunE: groupRun,
	}
	addBrokersFlag(cmd.PersistentFlags(), a)
	cmd.AddCommand(newGroupListCmd(a), newGroupDescribeCmd(a), newGroupResetCmd(a), newGroupDeleteCmd(a))
	return cmd
}

// groupSummaryView is one row of `group list -o json`.
type groupSummaryView struct {
	Group       string `json:"group"`
	State       string `json:"state"`
	Members     int32  `json:"members"`
	Coordinator int32  `json:"coordinator"`
}

func newGroupListCmd(a *app) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List consumer groups with their state and member count",
		Args:    args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				gs, err := adm.ListGroups(cmd.Context())
				if err != nil {
					return err
				}
				views := make([]groupSummaryView, 0, len(gs))
				for _, g := range gs {
					views = append(views, groupSummaryView{Group: g.GroupID, State: g.State, Members: g.Members, Coordinator: g.CoordinatorID})
				}
				return printList(cmd.OutOrStdout(), out, views, "GROUP\tSTATE\tMEMBERS\tCOORDINATOR", func(v groupSummaryView) string {
					return fmt.Sprintf("%s\t%s\t%d\t%d", v.Group, v.State, v.Members, v.Coordinator)
				})
			})
		},
	}
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	return cmd
}

// partitionRef is a topic-partition in JSON output.
type partitionRef struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
}

func partitionRefs(ps []client.TopicPartition) []partitionRef {
	out := make([]partitionRef, 0, len(ps))
	for _, k := range ps {
		out = append(out, partitionRef{k.Topic, k.Partition})
	}
	return out
}

// memberView is one member in `group describe -o json`.
type memberView struct {
	MemberID         string         `json:"member_id"`
	InstanceID       string         `json:"instance_id,omitempty"`
	ClientID         string         `json:"client_id"`
	ClientHost       string         `json:"client_host"`
	MemberEpoch      int32          `json:"member_epoch"`
	SubscribedTopics []string       `json:"subscribed_topics"`
	SubscribedRegex  string         `json:"subscribed_regex,omitempty"`
	Assignment       []partitionRef `json:"assignment"`
	TargetAssignment []partitionRef `json:"target_assignment"`
}

// groupPartitionView is one partition in `group describe -o json`. Committed and lag are null when the
// group has no committed offset for the partition.
type groupPartitionView struct {
	Topic          string `json:"topic"`
	Partition      int32  `json:"partition"`
	Committed      *int64 `json:"committed"`
	LogStartOffset int64  `json:"log_start_offset"`
	LogEndOffset   int64  `json:"log_end_offset"`
	Lag            *int64 `json:"lag"`
	MemberID       string `json:"member_id,omitempty"`
	InstanceID     string `json:"instance_id,omitempty"`
}

// groupView is `group describe -o json`.
type groupView struct {
	Group           string               `json:"group"`
	State           string               `json:"state"`
	GroupEpoch      int32                `json:"group_epoch"`
	AssignmentEpoch int32                `json:"assignment_epoch"`
	Assignor        string               `json:"assignor"`
	Coordinator     int32                `json:"coordinator"`
	Members         []memberView         `json:"members"`
	Partitions      []groupPartitionView `json:"partitions"`
	TotalLag        int64                `json:"total_lag"`
}

func newGroupDescribeCmd(a *app) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "describe GROUP",
		Short: "Show a group's state, members and their partitions, and per partition the committed offset, log end offset and lag",
		Long: `Show a consumer group: its state (empty, assigning, reconciling, stable), epochs and assignor; each
member with its instance id (static members), client, epoch and partitions; and for every partition of
the topics the group reads: the committed offset, the log end offset (high watermark) and the lag
between them ("-" where the group has committed nothing), and the member that owns it.

A member epoch of -2 marks a static member that left for now: its partitions stay reserved for it
until its session timeout.`,
		Example: `  runnel group describe billing
  runnel group describe billing -o json | jq '.partitions[] | select(.lag > 1000)'`,
		Args: args(1, 1, "one GROUP"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				v, err := describeGroup(cmd.Context(), adm, argv[0])
				if err != nil {
					return err
				}
				if out == formatJSON {
					return printJSON(cmd.OutOrStdout(), v)
				}
				return printGroupView(cmd.OutOrStdout(), v)
			})
		},
	}
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	return cmd
}

// describeGroup gathers a group's description and its partitions' offsets and lag.
func describeGroup(ctx context.Context, adm *client.Admin, group string) (*groupView, error) {
	d, err := adm.DescribeGroup(ctx, group)
	if err != nil {
		return nil, err
	}
	lag, err := adm.GroupLag(ctx, group)
	if err != nil {
		return nil, err
	}
	v := &groupView{Group: d.GroupID, State: d.State, GroupEpoch: d.GroupEpoch, AssignmentEpoch: d.AssignmentEpoch,
		Assignor: d.Assignor, Coordinator: d.CoordinatorID, Members: []memberView{}, Partitions: []groupPartitionView{}}
	for _, m := range d.Members {
		v.Members = append(v.Members, memberView{MemberID: m.MemberID, InstanceID: m.InstanceID, ClientID: m.ClientID,
			ClientHost: m.ClientHost, MemberEpoch: m.MemberEpoch, SubscribedTopics: nonNilStrings(m.SubscribedTopics),
			SubscribedRegex: m.SubscribedRegex, Assignment: partitionRefs(m.Assignment), TargetAssignment: partitionRefs(m.TargetAssignment)})
	}
	for _, l := range lag {
		p := groupPartitionView{Topic: l.Topic, Partition: l.Partition, LogStartOffset: l.LogStartOffset, LogEndOffset: l.LogEndOffset,
			MemberID: l.MemberID, InstanceID: l.InstanceID}
		if l.Committed >= 0 {
			c, lg := l.Committed, l.Lag
			p.Committed, p.Lag = &c, &lg
			v.TotalLag += lg
		}
		v.Partitions = append(v.Partitions, p)
	}
	return v, nil
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// printGroupView prints a group description as a header and two tables: members, then partitions.
func printGroupView(w io.Writer, v *groupView) error {
	tw := newTable(w)
	fmt.Fprintf(tw, "GROUP\t%s\n", v.Group)
	fmt.Fprintf(tw, "STATE\t%s\n", v.State)
	fmt.Fprintf(tw, "EPOCH\t%d (assignment %d)\n", v.GroupEpoch, v.AssignmentEpoch)
	if v.Assignor != "" {
		fmt.Fprintf(tw, "ASSIGNOR\t%s\n", v.Assignor)
	}
	fmt.Fprintf(tw, "COORDINATOR\t%d\n", v.Coordinator)
	totalLag := "- (nothing committed)"
	for _, p := range v.Partitions {
		if p.Committed != nil {
			totalLag = comma(v.TotalLag)
			break
		}
	}
	fmt.Fprintf(tw, "TOTAL LAG\t%s\n", totalLag)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if len(v.Members) == 0 {
		fmt.Fprintln(w, "(no members)")
	}
	tw = newTable(w)
	if len(v.Members) > 0 {
		fmt.Fprintln(tw, "MEMBER\tINSTANCE\tCLIENT\tHOST\tEPOCH\tSUBSCRIPTION\tPARTITIONS")
	}
	for _, m := range v.Members {
		sub := strings.Join(m.SubscribedTopics, ",")
		if m.SubscribedRegex != "" {
			sub = "/" + m.SubscribedRegex + "/"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", m.MemberID, dash(m.InstanceID), dash(m.ClientID), dash(m.ClientHost),
			m.MemberEpoch, dash(sub), dash(formatPartitions(m.Assignment)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "TOPIC\tPARTITION\tCOMMITTED\tLOG-END\tLAG\tMEMBER")
	for _, p := range v.Partitions {
		committed, lag := "-", "-"
		if p.Committed != nil {
			committed, lag = strconv.FormatInt(*p.Committed, 10), strconv.FormatInt(*p.Lag, 10)
		}
		member := dash(p.MemberID)
		if p.InstanceID != "" {
			member += " (" + p.InstanceID + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\n", p.Topic, p.Partition, committed, p.LogEndOffset, lag, member)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// formatPartitions renders partitions compactly: "orders:0,1,2 payments:3".
func formatPartitions(ps []partitionRef) string {
	var b strings.Builder
	for i, p := range ps {
		switch {
		case i == 0:
			fmt.Fprintf(&b, "%s:%d", p.Topic, p.Partition)
		case ps[i-1].Topic == p.Topic:
			fmt.Fprintf(&b, ",%d", p.Partition)
		default:
			fmt.Fprintf(&b, " %s:%d", p.Topic, p.Partition)
		}
	}
	return b.String()
}

// resetPlanView is `group reset-offsets -o json`.
type resetPlanView struct {
	Group    string          `json:"group"`
	Spec     string          `json:"spec"`
	Executed bool            `json:"executed"`
	Plan     []resetRowsView `json:"plan"`
}

// resetRowsView is one partition of a reset plan; current is null when the group has no commit.
type resetRowsView struct {
	Topic          string `json:"topic"`
	Partition      int32  `json:"partition"`
	Current        *int64 `json:"current"`
	Target         int64  `json:"target"`
	LogStartOffset int64  `json:"log_start_offset"`
	LogEndOffset   int64  `json:"log_end_offset"`
}

func newGroupResetCmd(a *app) *cobra.Command {
	var (
		topics               []string
		toEarliest, toLatest bool
		toDatetime           string
		toOffset, shiftBy    int64
		execute              bool
		output               string
	)
	cmd := &cobra.Command{
		Use:   "reset-offsets GROUP --topic TOPIC[:P,P...] (--to-earliest | --to-latest | --to-datetime T | --to-offset N | --shift-by N)",
		Short: "Move a group's committed offsets (shows the plan; applies it with --execute)",
		Long: `Compute new committed offsets for a group's partitions and print the plan: per partition the current
committed offset, the target, and the partition's log start and end offsets. Nothing changes unless
--execute is given (as kafka-consumer-groups --reset-offsets --dry-run / --execute).

Offsets can be reset only while the group has no members: stop its consumers first. With --execute
a group with members is refused (NON_EMPTY_GROUP); without it the plan is shown with a warning.

Exactly one target:
  --to-earliest       the log start offset: re-read everything retained
  --to-latest         the log end offset (high watermark): skip everything written so far
  --to-datetime T     the first record with a timestamp at or after T (RFC 3339, or a YYYY-MM-DD date
                      at midnight UTC); the log end when no record is that recent
  --to-offset N       offset N, moved into [log start, log end] where a partition does not hold it
  --shift-by N        the committed offset plus N (negative: back), kept within [log start, log end];
                      partitions without a committed offset cannot be shifted

--topic names the partitions: TOPIC for all of its partitions, TOPIC:0,2 for some; repeat it for
more topics. A group that does not exist yet may be given offsets: it starts there when it first joins.`,
		Example: `  runnel group reset-offsets billing --topic orders --to-earliest
  runnel group reset-offsets billing --topic orders:0,1 --shift-by -1000 --execute
  runnel group reset-offsets billing --topic orders --to-datetime 2026-11-29T09:00:00Z --execute -o json`,
		Args: args(1, 1, "one GROUP"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			group := argv[0]
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			toOffsetSet, shiftedBySet := cmd.Flags().Changed("to-offset"), cmd.Flags().Changed("shift-by")
			var specs []client.ResetSpec
			if toEarliest {
				specs = append(specs, client.ResetToEarliest())
			}
			if toLatest {
				specs = append(specs, client.ResetToLatest())
			}
			if toDatetime != "" {
				t, err := parseDatetime(toDatetime)
				if err != nil {
					return &usageError{fmt.Errorf("--to-datetime: %w", err)}
				}
				specs = append(specs, client.ResetToDatetime(t))
			}
			if toOffsetSet {
				if toOffset < 0 {
					return &usageError{errors.New("--to-offset cannot be negative")}
				}
				specs = append(specs, client.ResetToOffset(toOffset))
			}
			if shiftedBySet {
				specs = append(specs, client.ResetShiftBy(shiftBy))
			}
			if len(specs) != 1 {
				return &usageError{errors.New("give exactly one of --to-earliest, --to-latest, --to-datetime, --to-offset, --shift-by")}
			}
			if len(topics) == 0 {
				return &usageError{errors.New("--topic is required (TOPIC or TOPIC:0,1,...)")}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				ctx := cmd.Context()
				parts, err := resetPartitions(ctx, adm, topics)
				if err != nil {
					return err
				}
				if !execute {
					// Say now what --execute would meet.
					if d, err := adm.DescribeGroup(ctx, group); err == nil && len(d.Members) > 0 {
						fmt.Fprintf(cmd.ErrOrStderr(), "runnel: group %q has %d member(s) (state %s): --execute would be refused until they stop\n",
							group, len(d.Members), d.State)
					}
				}
				plan, err := adm.ResetOffsets(ctx, group, parts, specs[0], execute)
				if err != nil {
					return err
				}
				v := resetPlanView{Group: group, Spec: specs[0].String(), Executed: execute, Plan: make([]resetRowsView, 0, len(plan))}
				for _, r := range plan {
					row := resetRowsView{Topic: r.Topic, Partition: r.Partition, Target: r.Target, LogStartOffset: r.LogStartOffset, LogEndOffset: r.LogEndOffset}
					if r.Current >= 0 {
						c := r.Current
						row.Current = &c
					}
					v.Plan = append(v.Plan, row)
				}
				w := cmd.OutOrStdout()
				if out == formatJSON {
					if err := printJSON(w, v); err != nil {
						return err
					}
				} else {
					tw := newTable(w)
					fmt.Fprintln(tw, "TOPIC\tPARTITION\tCURRENT\tTARGET\tLOG-START\tLOG-END")
					for _, r := range v.Plan {
						cur := "-"
						if r.Current != nil {
							cur = strconv.FormatInt(*r.Current, 10)
						}
						fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\n", r.Topic, r.Partition, cur, r.Target, r.LogStartOffset, r.LogEndOffset)
					}
					if err := tw.Flush(); err != nil {
						return err
					}
				}
				if execute {
					fmt.Fprintf(cmd.ErrOrStderr(), "runnel: committed the new offsets of %d partitions for group %q\n", len(plan), group)
				} else {
					fmt.Fprintln(cmd.ErrOrStderr(), "runnel: dry run, nothing changed; add --execute to commit these offsets")
				}
				return nil
			})
		},
	}
	fs := cmd.Flags()
	fs.StringArrayVarP(&topics, "topic", "t", nil, "partitions to reset: TOPIC (all partitions) or TOPIC:0,1 (repeatable)")
	fs.BoolVar(&toEarliest, "to-earliest", false, "reset to the log start offset")
	fs.BoolVar(&toLatest, "to-latest", false, "reset to the log end offset (high watermark)")
	fs.StringVar(&toDatetime, "to-datetime", "", "reset to the first record at or after this RFC 3339 time or YYYY-MM-DD date")
	fs.Int64Var(&toOffset, "to-offset", 0, "reset to this offset (moved into each partition's range)")
	fs.Int64Var(&shiftBy, "shift-by", 0, "move the committed offsets by N (negative: back)")
	fs.BoolVar(&execute, "execute", false, "commit the new offsets (without it, only the plan is shown)")
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	return cmd
}

// parseDatetime reads an RFC 3339 time or a YYYY-MM-DD date (midnight UTC).
func parseDatetime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q: want an RFC 3339 time such as 2001-01-31T14:00:00Z, or a date such as 2001-01-31", s)
}

// resetPartitions expands --topic values (TOPIC or TOPIC:0,1) into partitions, checking they exist.
func resetPartitions(ctx context.Context, adm *client.Admin, specs []string) ([]client.TopicPartition, error) {
	var out []client.TopicPartition
	for _, spec := range specs {
		topic, list, hasList := strings.Cut(spec, ":")
		if topic == "" {
			return nil, &usageError{fmt.Errorf("--topic %q: no topic name", spec)}
		}
		all, err := topicPartitionsWith(ctx, adm, topic)
		if err != nil {
			return nil, err
		}
		if !hasList {
			for _, p := range all {
				out = append(out, client.TopicPartition{Topic: topic, Partition: p})
			}
			continue
		}
		for _, f := range strings.Split(list, ",") {
			n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 32)
			if err != nil {
				return nil, &usageError{fmt.Errorf("--topic %q: %q is not a partition number", spec, f)}
			}
			if !slices.Contains(all, int32(n)) {
				return nil, &usageError{fmt.Errorf("--topic %q: topic %q has partitions 0 to %d", spec, topic, len(all)-1)}
			}
			out = append(out, client.TopicPartition{Topic: topic, Partition: int32(n)})
		}
	}
	return out, nil
}

// groupResult is the outcome for one group of delete.
type groupResult struct {
	Group string `json:"group"`
	Error string `json:"error,omitempty"`
}

func newGroupDeleteCmd(a *app) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "delete GROUP...",
		Short: "Delete consumer groups without members, and their committed offsets",
		Long: `Delete consumer groups and their committed offsets. A group with members (including a static member
whose partitions are reserved for it) is refused with NON_EMPTY_GROUP: stop its consumers first.`,
		Args: args(1, -1, "at least one GROUP"),
		RunE: func(cmd *cobra.Command, names []string) error {
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				var results []groupResult
				var errs []error
				for _, name := range names {
					r := groupResult{Group: name}
					if err := adm.DeleteGroup(cmd.Context(), name); err != nil {
						r.Error = describeError(err, a.brokers)
						errs = append(errs, err)
					}
					results = append(results, r)
				}
				w := cmd.OutOrStdout()
				if out == formatJSON {
					if err := printJSON(w, results); err != nil {
						return err
					}
				} else {
					tw := newTable(w)
					fmt.Fprintln(tw, "GROUP\tSTATUS")
					for _, r := range results {
						status := "deleted"
						if r.Error != "" {
							status = r.Error
						}
						fmt.Fprintf(tw, "%s\t%s\n", r.Group, status)
					}
					tw.Flush()
				}
				if err := errors.Join(errs...); err != nil {
					return &exitError{code: 1, err: fmt.Errorf("%d of %d groups not deleted: %w", len(errs), len(results), err)}
				}
				return nil
			})
		},
	}
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	return cmd
}
