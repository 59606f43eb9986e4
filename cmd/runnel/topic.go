package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	"github.com/runnel-io/runnel/client"
	"github.com/spf13/cobra"
)

func newTopicCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "topic",
		Short: "Create, list, describe, alter and delete topics",
		Args:  groupArgs,
		RunE:  groupRun,
	}
	addBrokersFlag(cmd.PersistentFlags(), a)
	cmd.AddCommand(newTopicCreateCmd(a), newTopicListCmd(a), newTopicDescribeCmd(a), newTopicAlterCmd(a), newTopicDeleteCmd(a), newTopicElectLeadersCmd(a), newTopicReassignCmd(a))
	return cmd
}

// addOutputFlag registers -o/--output with the given formats, the first being the default.
func addOutputFlag(cmd *cobra.Command, p *string, formats ...string) {
	cmd.Flags().StringVarP(p, "output", "o", formats[0], "output format: "+strings.Join(formats, " or "))
}

// withAdmin opens an Admin client, runs fn and closes it.
func withAdmin(a *app, fn func(*client.Admin) error) error {
	brokers, err := a.brokerList()
	if err != nil {
		return err
	}
	adm, err := a.newAdmin(brokers)
	if err != nil {
		return err
	}
	defer adm.Close()
	return fn(adm)
}

// topicResult is the outcome for one topic of create or delete.
type topicResult struct {
	Name    string `json:"name"`
	TopicID string `json:"topic_id,omitempty"`
	Error   string `json:"error,omitempty"`
}

// printTopicResults prints create/delete outcomes and returns an error if any topic failed.
func printTopicResults(w io.Writer, output, verb string, results []topicResult, errs []error) error {
	if output == formatJSON {
		if err := printJSON(w, results); err != nil {
			return err
		}
	} else {
		tw := newTable(w)
		fmt.Fprintln(tw, "TOPIC\tID\tSTATUS")
		for _, r := range results {
			status := verb
			if r.Error != "" {
				status = r.Error
			}
			id := r.TopicID
			if id == "" {
				id = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Name, id, status)
		}
		tw.Flush()
	}
	if err := errors.Join(errs...); err != nil {
		return &exitError{code: 1, err: fmt.Errorf("%d of %d topics failed: %w", len(errs), len(results), err)}
	}
	return nil
}

func newTopicCreateCmd(a *app) *cobra.Command {
	var (
		partitions, rf int32
		configs        []string
		output         string
	)
	cmd := &cobra.Command{
		Use:   "create TOPIC...",
		Short: "Create topics",
		Long: `Create one or more topics. Names follow Kafka's rules: up to 249 characters of
[a-zA-Z0-9._-], not "." or "..". Topic configs (-c) are listed in docs/configuration.md.`,
		Example: `  runnel topic create flights -p 12
  runnel topic create events -p 3 -c retention.ms=3600000 -c max.message.bytes=2097152`,
		Args: args(1, -1, "at least one TOPIC"),
		RunE: func(cmd *cobra.Command, names []string) error {
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			cfg, err := parseKVs("config", configs)
			if err != nil {
				return &usageError{err}
			}
			// As kafka-topics.sh: a count must be at least 1, -1 asks for the broker's default (the
			// API takes 0 as "default" too, so 0 would silently create the default count).
			if partitions == 0 || partitions < -1 {
				return &usageError{fmt.Errorf("--partitions %d: a topic needs at least 1 partition (-1: the broker's default)", partitions)}
			}
			if rf == 0 || rf < -1 {
				return &usageError{fmt.Errorf("--replication-factor %d: at least 1 copy (-1: the broker's default)", rf)}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				var results []topicResult
				var errs []error
				for _, name := range names {
					id, err := adm.CreateTopic(cmd.Context(), name, partitions, rf, cfg)
					r := topicResult{Name: name, TopicID: id}
					if err != nil {
						r.Error = err.Error()
						errs = append(errs, fmt.Errorf("create topic %q: %w", name, err))
					}
					results = append(results, r)
				}
				return printTopicResults(cmd.OutOrStdout(), out, "created", results, errs)
			})
		},
	}
	fs := cmd.Flags()
	fs.Int32VarP(&partitions, "partitions", "p", -1, "number of partitions (-1: the broker's default)")
	fs.Int32VarP(&rf, "replication-factor", "r", -1, "copies of each partition (-1: the broker's default)")
	fs.StringArrayVarP(&configs, "config", "c", nil, "topic config key=value (repeatable)")
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	return cmd
}

func newTopicDeleteCmd(a *app) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "delete TOPIC...",
		Short: "Delete topics and all their records",
		Args:  args(1, -1, "at least one TOPIC"),
		RunE: func(cmd *cobra.Command, names []string) error {
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				var results []topicResult
				var errs []error
				for _, name := range names {
					r := topicResult{Name: name}
					if err := adm.DeleteTopic(cmd.Context(), name); err != nil {
						r.Error = err.Error()
						errs = append(errs, fmt.Errorf("delete topic %q: %w", name, err))
					}
					results = append(results, r)
				}
				return printTopicResults(cmd.OutOrStdout(), out, "deleted", results, errs)
			})
		},
	}
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	return cmd
}

// topicSummaryView is one row of `topic list -o json`.
type topicSummaryView struct {
	Name              string `json:"name"`
	TopicID           string `json:"topic_id"`
	Partitions        int32  `json:"partitions"`
	ReplicationFactor int32  `json:"replication_factor"`
	Internal          bool   `json:"internal"`
}

func newTopicListCmd(a *app) *cobra.Command {
	var (
		internal bool
		output   string
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List topics",
		Args:    args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				ts, err := adm.ListTopics(cmd.Context(), internal)
				if err != nil {
					return fmt.Errorf("list topics: %w", err)
				}
				views := make([]topicSummaryView, 0, len(ts))
				for _, t := range ts {
					views = append(views, topicSummaryView{Name: t.Name, TopicID: t.TopicID, Partitions: t.Partitions,
						ReplicationFactor: t.ReplicationFactor, Internal: t.Internal})
				}
				sort.Slice(views, func(i, j int) bool { return views[i].Name < views[j].Name })
				w := cmd.OutOrStdout()
				if out == formatJSON {
					return printJSON(w, views)
				}
				tw := newTable(w)
				fmt.Fprintln(tw, "NAME\tPARTITIONS\tREPLICAS\tID")
				for _, v := range views {
					name := v.Name
					if v.Internal {
						name += " (internal)"
					}
					fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", name, v.Partitions, v.ReplicationFactor, v.TopicID)
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVarP(&internal, "internal", "i", false, "include internal topics")
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	return cmd
}

// configView is one topic config in JSON output.
type configView struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	IsDefault bool   `json:"is_default"`
}

// partitionView is one partition in `topic describe -o json`.
type partitionView struct {
	Partition      int32   `json:"partition"`
	LeaderID       int32   `json:"leader_id"`
	LeaderEpoch    int32   `json:"leader_epoch"`
	Replicas       []int32 `json:"replicas"`
	ISR            []int32 `json:"isr"`
	LogStartOffset int64   `json:"log_start_offset"`
	HighWatermark  int64   `json:"high_watermark"`
	LogEndOffset   int64   `json:"log_end_offset"`
	SizeBytes      int64   `json:"size_bytes"`
	// ReassigningTo is the target of a running reassignment.
	ReassigningTo []int32 `json:"reassigning_to,omitempty"`
	// Stats is set with --stats when the broker keeps rates.
	Stats *statsView `json:"stats,omitempty"`
}

// statsView is one partition's produce rates in `topic describe --stats -o json`.
type statsView struct {
	LastMinute         rateView `json:"last_minute"`
	LastFiveMinutes    rateView `json:"last_five_minutes"`
	BytesInPerMinute   []int64  `json:"bytes_in_per_minute"`
	RecordsInPerMinute []int64  `json:"records_in_per_minute"`
	BytesInTotal       int64    `json:"bytes_in_total"`
	RecordsInTotal     int64    `json:"records_in_total"`
	WindowMs           int64    `json:"window_ms"`
}

// rateView is a partition's rate over one window, with its share of the topic's records per second
// in that window (0 to 1; 0 when the topic got no records): the number that shows a hot partition.
type rateView struct {
	BytesPerSec   float64 `json:"bytes_in_per_sec"`
	RecordsPerSec float64 `json:"records_in_per_sec"`
	RecordsShare  float64 `json:"records_share"`
}

// topicView is `topic describe -o json` for one topic.
type topicView struct {
	Name              string          `json:"name"`
	TopicID           string          `json:"topic_id"`
	ReplicationFactor int32           `json:"replication_factor"`
	Internal          bool            `json:"internal"`
	Configs           []configView    `json:"configs"`
	Partitions        []partitionView `json:"partitions"`
}

func configViews(cs []client.ConfigEntry) []configView {
	vs := make([]configView, 0, len(cs))
	for _, c := range cs {
		vs = append(vs, configView{Name: c.Name, Value: c.Value, IsDefault: c.IsDefault})
	}
	sort.Slice(vs, func(i, j int) bool { return vs[i].Name < vs[j].Name })
	return vs
}

func toTopicView(d *client.TopicDescription) topicView {
	v := topicView{Name: d.Name, TopicID: d.TopicID, ReplicationFactor: d.ReplicationFactor, Internal: d.Internal,
		Configs: configViews(d.Configs), Partitions: make([]partitionView, 0, len(d.Partitions))}
	for _, p := range d.Partitions {
		v.Partitions = append(v.Partitions, partitionView{Partition: p.Partition, LeaderID: p.LeaderID,
			LeaderEpoch: p.LeaderEpoch, Replicas: nonNil(p.Replicas), ISR: nonNil(p.ISR), LogStartOffset: p.LogStartOffset,
			HighWatermark: p.HighWatermark, LogEndOffset: p.LogEndOffset, SizeBytes: p.SizeBytes, ReassigningTo: p.ReassigningTo})
	}
	sort.Slice(v.Partitions, func(i, j int) bool { return v.Partitions[i].Partition < v.Partitions[j].Partition })
	addStats(&v, d)
	return v
}

// addStats fills the partitions' stats views from d, with each partition's share of the topic's
// records per second, which needs the whole topic.
func addStats(v *topicView, d *client.TopicDescription) {
	var sum1, sum5 float64
	for _, p := range d.Partitions {
		if p.Stats != nil {
			sum1 += p.Stats.LastMinute.RecordsPerSec
			sum5 += p.Stats.LastFiveMinutes.RecordsPerSec
		}
	}
	share := func(x, sum float64) float64 {
		if sum <= 0 {
			return 0
		}
		return x / sum
	}
	stats := map[int32]*client.PartitionStats{}
	for _, p := range d.Partitions {
		stats[p.Partition] = p.Stats
	}
	for i := range v.Partitions {
		s := stats[v.Partitions[i].Partition]
		if s == nil {
			continue
		}
		v.Partitions[i].Stats = &statsView{
			LastMinute:       rateView{s.LastMinute.BytesPerSec, s.LastMinute.RecordsPerSec, share(s.LastMinute.RecordsPerSec, sum1)},
			LastFiveMinutes:  rateView{s.LastFiveMinutes.BytesPerSec, s.LastFiveMinutes.RecordsPerSec, share(s.LastFiveMinutes.RecordsPerSec, sum5)},
			BytesInPerMinute: s.BytesInPerMinute, RecordsInPerMinute: s.RecordsInPerMinute,
			BytesInTotal: s.BytesInTotal, RecordsInTotal: s.RecordsInTotal, WindowMs: s.Window.Milliseconds()}
	}
}

func nonNil(s []int32) []int32 {
	if s == nil {
		return []int32{}
	}
	return s
}

// printConfigs prints configs as a KEY VALUE SOURCE table.
func printConfigs(w io.Writer, cs []configView) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "KEY\tVALUE\tSOURCE")
	for _, c := range cs {
		src := "topic"
		if c.IsDefault {
			src = "default"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, c.Value, src)
	}
	return tw.Flush()
}

func joinInt32(s []int32) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = fmt.Sprint(v)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// printTopicView prints a description as three sections: summary, configs, partitions.
func printTopicView(w io.Writer, v topicView) error {
	tw := newTable(w)
	fmt.Fprintf(tw, "NAME\t%s\nID\t%s\nPARTITIONS\t%d\nREPLICATION FACTOR\t%d\n", v.Name, v.TopicID, len(v.Partitions), v.ReplicationFactor)
	if v.Internal {
		fmt.Fprintln(tw, "INTERNAL\ttrue")
	}
	tw.Flush()
	fmt.Fprintln(w, "\nCONFIGS")
	printConfigs(w, v.Configs)
	fmt.Fprintln(w, "\nPARTITIONS")
	tw = newTable(w)
	fmt.Fprintln(tw, "PARTITION\tLEADER\tEPOCH\tREPLICAS\tISR\tLOG-START\tHIGH-WATERMARK\tLOG-END\tSIZE")
	var records, size int64
	for _, p := range v.Partitions {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%d\t%d\t%d\t%s\n", p.Partition, p.LeaderID, p.LeaderEpoch,
			joinInt32(p.Replicas), joinInt32(p.ISR), p.LogStartOffset, p.HighWatermark, p.LogEndOffset, bytesIEC(p.SizeBytes))
		if p.HighWatermark >= 0 && p.LogStartOffset >= 0 { // -1: offline, no leader to ask
			records += p.HighWatermark - p.LogStartOffset
		}
		size += p.SizeBytes
	}
	tw.Flush()
	for _, p := range v.Partitions {
		if len(p.ReassigningTo) > 0 {
			fmt.Fprintf(w, "partition %d is being reassigned: replicas %s -> %s (done when all of them are in the ISR)\n",
				p.Partition, joinInt32(p.Replicas), joinInt32(p.ReassigningTo))
		}
	}
	_, err := fmt.Fprintf(w, "\n%s offsets retained (high watermark minus log start, summed; fewer records where compaction left gaps), %s stored\n", comma(records), bytesIEC(size))
	return err
}

// printStats prints the partitions' produce rates and shares of the topic's records per second, and
// marks partitions that take at least twice their even share ("hot").
func printStats(w io.Writer, v topicView) error {
	fmt.Fprintln(w, "\nPRODUCE RATES (on each partition's leader; share: of the topic's records/s)")
	n, kept := len(v.Partitions), 0
	for _, p := range v.Partitions {
		if p.Stats != nil {
			kept++
		}
	}
	if kept == 0 {
		_, err := fmt.Fprintln(w, "not kept by the broker (its telemetry is disabled)")
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "PARTITION\tBYTES/S 1M\tRECORDS/S 1M\tSHARE 1M\tBYTES/S 5M\tRECORDS/S 5M\tSHARE 5M\t")
	var window int64
	for _, p := range v.Partitions {
		s := p.Stats
		if s == nil {
			fmt.Fprintf(tw, "%d\t-\t-\t-\t-\t-\t-\t\n", p.Partition)
			continue
		}
		window = max(window, s.WindowMs)
		hot := ""
		if n > 1 && s.LastFiveMinutes.RecordsShare >= 2/float64(n) {
			hot = "hot"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Partition,
			perSec(s.LastMinute.BytesPerSec), perSec(s.LastMinute.RecordsPerSec), percent(s.LastMinute.RecordsShare),
			perSec(s.LastFiveMinutes.BytesPerSec), perSec(s.LastFiveMinutes.RecordsPerSec), percent(s.LastFiveMinutes.RecordsShare), hot)
	}
	tw.Flush()
	if window < (5 * time.Minute).Milliseconds() {
		_, err := fmt.Fprintf(w, "the broker started %v ago: the 5-minute rates cover that time only\n", max(time.Duration(window)*time.Millisecond, time.Second).Round(time.Second))
		return err
	}
	return nil
}

// perSec formats a per-second rate with two decimals below 100 and none above, so small test rates and
// large production ones both read well.
func perSec(x float64) string {
	if x >= 100 {
		return comma(int64(x + 0.5))
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}

func percent(x float64) string { return strconv.FormatFloat(100*x, 'f', 1, 64) + "%" }

func newTopicDescribeCmd(a *app) *cobra.Command {
	var (
		output string
		stats  bool
	)
	cmd := &cobra.Command{
		Use:   "describe TOPIC...",
		Short: "Show a topic's configs and partitions with their offsets",
		Long: `Show a topic's configs and partitions with their offsets.

--stats adds each partition's produce rates (bytes and records per second over the last minute and the
last five minutes, as counted by its leader since it started) and its share of the topic's records per
second, so a hot partition stands out: see docs/hot-keys.md for what to do about one.`,
		Example: `  runnel topic describe flights --stats`,
		Args:    args(1, -1, "at least one TOPIC"),
		RunE: func(cmd *cobra.Command, names []string) error {
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				var views []topicView
				for _, name := range names {
					describe := adm.DescribeTopic
					if stats {
						describe = adm.DescribeTopicWithStats
					}
					d, err := describe(cmd.Context(), name)
					if err != nil {
						return fmt.Errorf("describe topic %q: %w", name, err)
					}
					views = append(views, toTopicView(d))
				}
				w := cmd.OutOrStdout()
				if out == formatJSON {
					if len(views) == 1 {
						return printJSON(w, views[0])
					}
					return printJSON(w, views)
				}
				for i, v := range views {
					if i > 0 {
						fmt.Fprintln(w)
					}
					if err := printTopicView(w, v); err != nil {
						return err
					}
					if stats {
						if err := printStats(w, v); err != nil {
							return err
						}
					}
				}
				return nil
			})
		},
	}
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	cmd.Flags().BoolVar(&stats, "stats", false, "add each partition's produce rates and share of the topic's records/s")
	return cmd
}

func newTopicAlterCmd(a *app) *cobra.Command {
	var (
		set, del []string
		output   string
	)
	cmd := &cobra.Command{
		Use:   "alter TOPIC",
		Short: "Set or delete topic configs",
		Long: `Set topic configs (--set key=value) or delete them (--delete key), which returns them to the
broker's default. Prints the topic's configs afterwards.`,
		Example: `  runnel topic alter flights --set retention.ms=86400000 --delete max.message.bytes`,
		Args:    args(1, 1, "one TOPIC"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			if len(set) == 0 && len(del) == 0 {
				return &usageError{errors.New("nothing to change: give --set key=value or --delete key")}
			}
			setMap, err := parseKVs("set", set)
			if err != nil {
				return &usageError{err}
			}
			for _, k := range del {
				if _, both := setMap[k]; both {
					return &usageError{fmt.Errorf("%q is both set and deleted", k)}
				}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				cs, err := adm.AlterTopicConfig(cmd.Context(), argv[0], setMap, del)
				if err != nil {
					return fmt.Errorf("alter topic %q: %w", argv[0], err)
				}
				if out == formatJSON {
					return printJSON(cmd.OutOrStdout(), configViews(cs))
				}
				return printConfigs(cmd.OutOrStdout(), configViews(cs))
			})
		},
	}
	cmd.Flags().StringArrayVar(&set, "set", nil, "set config key=value (repeatable)")
	cmd.Flags().StringArrayVar(&del, "delete", nil, "delete config key, back to the default (repeatable)")
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	return cmd
}

// errNoPartitions is returned when a topic reports no partitions.
var errNoPartitions = errors.New("topic has no partitions")

// topicPartitions returns the partition numbers of topic, in order. An unknown topic gets a hint to
// create it.
func topicPartitions(ctx context.Context, a *app, brokers []string, topic string) ([]int32, error) {
	adm, err := a.newAdmin(brokers)
	if err != nil {
		return nil, err
	}
	defer adm.Close()
	return topicPartitionsWith(ctx, adm, topic)
}

// openTopic resolves the broker list, opens an Admin client (the caller closes it) and returns the
// topic's partition numbers: what every verb that reads a whole topic starts with.
func openTopic(ctx context.Context, a *app, topic string) ([]string, *client.Admin, []int32, error) {
	brokers, err := a.brokerList()
	if err != nil {
		return nil, nil, nil, err
	}
	adm, err := a.newAdmin(brokers)
	if err != nil {
		return nil, nil, nil, err
	}
	parts, err := topicPartitionsWith(ctx, adm, topic)
	if err != nil {
		adm.Close()
		return nil, nil, nil, err
	}
	return brokers, adm, parts, nil
}

func topicPartitionsWith(ctx context.Context, adm *client.Admin, topic string) ([]int32, error) {
	md, err := adm.Metadata(ctx, topic)
	if err == nil {
		for _, t := range md.GetTopics() {
			if t.GetName() != topic {
				continue
			}
			if err = rerr.FromInfo(t.GetError()); err != nil {
				break
			}
			var ps []int32
			for _, p := range t.GetPartitions() {
				ps = append(ps, p.GetPartition())
			}
			if len(ps) == 0 {
				return nil, fmt.Errorf("topic %q: %w", topic, errNoPartitions)
			}
			sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
			return ps, nil
		}
		if err == nil {
			err = rerr.New(rerr.ErrUnknownTopicOrPartition.Code, "topic %q does not exist", topic)
		}
	}
	if errors.Is(err, rerr.ErrUnknownTopicOrPartition) {
		return nil, fmt.Errorf("topic %q: %w (create it with: runnel topic create %s)", topic, err, shellQuote(topic))
	}
	return nil, fmt.Errorf("metadata of topic %q: %w", topic, err)
}

func newTopicElectLeadersCmd(a *app) *cobra.Command {
	var (
		partitions []int32
		output     string
	)
	cmd := &cobra.Command{
		Use:   "elect-leaders [TOPIC]",
		Short: "Move partition leadership back to the preferred replicas",
		Long: `Move the leadership of partitions back to their preferred replica (the first of their replica list,
see topic describe) where that replica is alive and in the ISR: after a failover the leadership stays
where it moved, so one broker may lead more than its share. Without TOPIC every topic is elected;
--partition limits it to some partitions of TOPIC. Prints the partitions whose leader changed.
The controller also does this by itself every 30 seconds (Kafka's auto.leader.rebalance.enable).`,
		Example: `  runnel topic elect-leaders
  runnel topic elect-leaders orders --partition 0 --partition 3`,
		Args: args(0, 1, "at most one TOPIC"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			topic := ""
			if len(argv) == 1 {
				topic = argv[0]
			}
			if topic == "" && len(partitions) > 0 {
				return &usageError{errors.New("--partition needs a TOPIC")}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				moved, err := adm.ElectLeaders(cmd.Context(), topic, partitions...)
				if err != nil {
					return fmt.Errorf("elect leaders: %w", err)
				}
				type view struct {
					Topic       string `json:"topic"`
					Partition   int32  `json:"partition"`
					LeaderID    int32  `json:"leader_id"`
					LeaderEpoch int32  `json:"leader_epoch"`
				}
				views := []view{}
				for _, m := range moved {
					views = append(views, view{m.Topic, m.Partition, m.LeaderID, m.LeaderEpoch})
				}
				w := cmd.OutOrStdout()
				if out == formatJSON {
					return printJSON(w, views)
				}
				if len(views) == 0 {
					_, err := fmt.Fprintln(w, "no leader moved: every partition is led by its preferred replica, or that replica is down or out of sync")
					return err
				}
				tw := newTable(w)
				fmt.Fprintln(tw, "TOPIC\tPARTITION\tNEW LEADER\tLEADER EPOCH")
				for _, v := range views {
					fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", v.Topic, v.Partition, v.LeaderID, v.LeaderEpoch)
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().Int32SliceVar(&partitions, "partition", nil, "partition of TOPIC to elect (repeatable; default all)")
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	return cmd
}

func newTopicReassignCmd(a *app) *cobra.Command {
	var (
		partition int32
		replicas  []int32
	)
	cmd := &cobra.Command{
		Use:   "reassign TOPIC --partition N --replicas ID,ID,...",
		Short: "Move a partition to other brokers",
		Long: `Move a partition to a new replica list, the preferred leader first (Kafka's partition reassignment,
KIP-455). The new replicas copy the log from the leader as followers; once every one of them is in
the ISR the old replicas are dropped (their data deleted) and, if the leader is not in the new list,
the leadership moves to the first new replica in sync. The command returns once the move has
started: topic describe shows REASSIGNING-TO while it runs. runnel cluster decommission moves every
partition off a broker.`,
		Example: `  runnel topic reassign orders --partition 0 --replicas 2,3,4`,
		Args:    args(1, 1, "one TOPIC"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if !cmd.Flags().Changed("partition") || len(replicas) == 0 {
				return &usageError{errors.New("--partition and --replicas are required")}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				if err := adm.ReassignPartition(cmd.Context(), argv[0], partition, replicas); err != nil {
					return fmt.Errorf("reassign %s-%d: %w", argv[0], partition, err)
				}
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "reassignment of %s-%d to %s started; follow it with: runnel topic describe %s\n",
					argv[0], partition, joinInt32(replicas), argv[0])
				return err
			})
		},
	}
	cmd.Flags().Int32Var(&partition, "partition", 0, "the partition to move")
	cmd.Flags().Int32SliceVar(&replicas, "replicas", nil, "the new replica list, preferred leader first (comma-separated broker ids)")
	return cmd
}

// shellQuote returns s as one shell word: as it is when it holds only characters a shell leaves
// alone, else in single quotes (a quote inside closed, escaped and reopened).
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-/:=,@+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
