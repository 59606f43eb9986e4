package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client"
	"github.com/spf13/cobra"
)

func newClusterCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{Use: "cluster", Short: "Look at the cluster: nodes, controller quorum, partition health"}
	addBrokersFlag(cmd.PersistentFlags(), a)
	cmd.AddCommand(newClusterStatusCmd(a), newClusterDecommissionCmd(a))
	return cmd
}

// clusterView is `runnel cluster status -o json`.
type clusterView struct {
	ClusterID       string            `json:"cluster_id"`
	AnsweredBy      int32             `json:"answered_by"`
	ControllerID    int32             `json:"controller_id"`
	RaftTerm        uint64            `json:"raft_term"`
	RaftCommitIndex uint64            `json:"raft_commit_index"`
	RaftApplied     uint64            `json:"raft_applied_index"`
	MetadataOffset  uint64            `json:"metadata_offset"`
	Topics          int32             `json:"topics"`
	Partitions      int32             `json:"partitions"`
	Nodes           []nodeView        `json:"nodes"`
	Fenced          []int32           `json:"fenced_brokers"`
	Offline         []partitionHealth `json:"offline_partitions"`
	UnderReplicated []partitionHealth `json:"under_replicated_partitions"`
}

type nodeView struct {
	NodeID      int32  `json:"node_id"`
	Role        string `json:"role"`
	Controller  bool   `json:"controller_leader"`
	RaftVoter   bool   `json:"raft_voter"`
	InRaft      bool   `json:"in_raft_configuration"`
	Membership  string `json:"membership"`
	Registered  bool   `json:"registered"`
	Fenced      bool   `json:"fenced"`
	BrokerEpoch uint64 `json:"broker_epoch"`
	Leaders     int32  `json:"leaders"`
	GRPCAddr    string `json:"grpc_addr"`
	RaftAddr    string `json:"raft_addr"`
	SerfAddr    string `json:"serf_addr"`
	HTTPAddr    string `json:"http_addr"`
	Rack        string `json:"rack,omitempty"`
}

type partitionHealth struct {
	Topic       string  `json:"topic"`
	Partition   int32   `json:"partition"`
	LeaderID    int32   `json:"leader_id"`
	LeaderEpoch int32   `json:"leader_epoch"`
	Replicas    []int32 `json:"replicas"`
	ISR         []int32 `json:"isr"`
}

func toClusterView(s *runnelv1.ClusterStatusResponse) clusterView {
	v := clusterView{ClusterID: s.ClusterId, AnsweredBy: s.NodeId, ControllerID: s.ControllerId, RaftTerm: s.RaftTerm,
		RaftCommitIndex: s.RaftCommitIndex, RaftApplied: s.RaftAppliedIndex, MetadataOffset: s.MetadataOffset,
		Topics: s.Topics, Partitions: s.Partitions, Nodes: []nodeView{}, Fenced: []int32{}, Offline: []partitionHealth{},
		UnderReplicated: []partitionHealth{}}
	for _, n := range s.Nodes {
		v.Nodes = append(v.Nodes, nodeView{NodeID: n.NodeId, Role: n.Role, Controller: n.NodeId == s.ControllerId,
			RaftVoter: n.RaftVoter, InRaft: n.InRaftConfiguration, Membership: n.Membership, Registered: n.Registered,
			Fenced: n.Fenced, BrokerEpoch: n.BrokerEpoch, Leaders: n.Leaders, GRPCAddr: n.GrpcAddr, RaftAddr: n.RaftAddr,
			SerfAddr: n.SerfAddr, HTTPAddr: n.HttpAddr, Rack: n.Rack})
		if n.Registered && n.Fenced {
			v.Fenced = append(v.Fenced, n.NodeId)
		}
	}
	conv := func(ps []*runnelv1.PartitionStatus) []partitionHealth {
		out := []partitionHealth{}
		for _, p := range ps {
			out = append(out, partitionHealth{Topic: p.Topic, Partition: p.Partition, LeaderID: p.LeaderId, LeaderEpoch: p.LeaderEpoch,
				Replicas: p.Replicas, ISR: p.Isr})
		}
		return out
	}
	v.Offline, v.UnderReplicated = conv(s.OfflinePartitions), conv(s.UnderReplicatedPartitions)
	return v
}

func newClusterStatusCmd(a *app) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the nodes, the controller quorum and partitions without a leader or with a short ISR",
		Long: `Show the cluster as the node that answers sees it: every node with its role (controller: a raft
voter; broker: a non-voter), its gossip state (alive, failed, left), whether the controller has it
registered and fenced, and how many partitions it leads; the controller leader with the raft term
and the answering node's commit and applied indexes; then the partitions that have no leader
(offline) and those whose ISR is shorter than their replica list (under-replicated).`,
		Args: args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, err := parseOutput(output, formatTable, formatJSON)
			if err != nil {
				return &usageError{err}
			}
			return withAdmin(a, func(adm *client.Admin) error {
				s, err := adm.ClusterStatus(cmd.Context())
				if err != nil {
					return fmt.Errorf("cluster status: %w", err)
				}
				v := toClusterView(s)
				if out == formatJSON {
					return printJSON(cmd.OutOrStdout(), v)
				}
				return printClusterView(cmd.OutOrStdout(), v)
			})
		},
	}
	addOutputFlag(cmd, &output, formatTable, formatJSON)
	return cmd
}

func printClusterView(w io.Writer, v clusterView) error {
	tw := newTable(w)
	leader := "none (election in progress or no majority)"
	if v.ControllerID >= 0 {
		leader = fmt.Sprint(v.ControllerID)
	}
	fmt.Fprintf(tw, "CLUSTER ID\t%s\nCONTROLLER LEADER\t%s\nRAFT TERM\t%d\nCOMMIT INDEX\t%d (applied %d, on node %d)\nTOPICS\t%d (%d partitions)\n",
		v.ClusterID, leader, v.RaftTerm, v.RaftCommitIndex, v.RaftApplied, v.AnsweredBy, v.Topics, v.Partitions)
	tw.Flush()
	fmt.Fprintln(w, "\nNODES")
	tw = newTable(w)
	fmt.Fprintln(tw, "NODE\tROLE\tGOSSIP\tBROKER\tLEADS\tGRPC\tRAFT\tSERF\tRACK")
	for _, n := range v.Nodes {
		role := n.Role
		if n.Controller {
			role += " (leader)"
		} else if n.InRaft && !n.RaftVoter {
			role += " (non-voter)"
		}
		state := "unregistered"
		if n.Registered {
			state = "alive"
			if n.Fenced {
				state = "fenced"
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", n.NodeID, role, n.Membership, state, n.Leaders, n.GRPCAddr,
			n.RaftAddr, dash(n.SerfAddr), dash(n.Rack))
	}
	tw.Flush()
	for _, sec := range []struct {
		title string
		ps    []partitionHealth
	}{{"OFFLINE PARTITIONS (no leader)", v.Offline}, {"UNDER-REPLICATED PARTITIONS (ISR shorter than replicas)", v.UnderReplicated}} {
		fmt.Fprintf(w, "\n%s: %d\n", sec.title, len(sec.ps))
		if len(sec.ps) == 0 {
			continue
		}
		tw = newTable(w)
		fmt.Fprintln(tw, "TOPIC\tPARTITION\tLEADER\tEPOCH\tREPLICAS\tISR")
		for _, p := range sec.ps {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\n", p.Topic, p.Partition, p.LeaderID, p.LeaderEpoch, joinInt32(p.Replicas), joinInt32(p.ISR))
		}
		tw.Flush()
	}
	return nil
}

func newClusterDecommissionCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "decommission NODE",
		Short: "Move every partition replica off a broker, before it is removed",
		Long: `Start a reassignment (see topic reassign) of every partition that has a replica on NODE: NODE is
replaced by the unfenced broker not already in the partition's replica list that holds the fewest
replicas. The data is copied before the old replica is dropped. When runnel cluster status shows NODE
leading nothing and topic describe lists it nowhere, stop it cleanly. Internal topics are moved too.`,
		Example: `  runnel cluster decommission 4`,
		Args:    args(1, 1, "one NODE id"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			n, err := strconv.ParseInt(argv[0], 10, 32)
			if err != nil {
				return &usageError{fmt.Errorf("NODE %q: not a broker id", argv[0])}
			}
			node := int32(n)
			return withAdmin(a, func(adm *client.Admin) error {
				md, err := adm.Metadata(cmd.Context())
				if err != nil {
					return err
				}
				load := map[int32]int{}
				for _, b := range md.Brokers {
					if b.NodeId != node {
						load[b.NodeId] = 0
					}
				}
				for _, t := range md.Topics {
					for _, p := range t.Partitions {
						for _, r := range p.Replicas {
							if _, ok := load[r]; ok {
								load[r]++
							}
						}
					}
				}
				tw := newTable(cmd.OutOrStdout())
				fmt.Fprintln(tw, "TOPIC\tPARTITION\tFROM\tTO")
				moved := 0
				for _, t := range md.Topics {
					for _, p := range t.Partitions {
						i := slices.Index(p.Replicas, node)
						if i < 0 {
							continue
						}
						best, bestLoad := int32(-1), 0
						for id, l := range load {
							if !slices.Contains(p.Replicas, id) && (best < 0 || l < bestLoad || l == bestLoad && id < best) {
								best, bestLoad = id, l
							}
						}
						if best < 0 {
							return fmt.Errorf("%s-%d: no broker left to take the replica on node %d (replicas %v)", t.Name, p.Partition, node, p.Replicas)
						}
						to := slices.Clone(p.Replicas)
						to[i] = best
						if err := adm.ReassignPartition(cmd.Context(), t.Name, p.Partition, to); err != nil {
							return fmt.Errorf("reassign %s-%d: %w", t.Name, p.Partition, err)
						}
						load[best]++
						moved++
						fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", t.Name, p.Partition, joinInt32(p.Replicas), joinInt32(to))
					}
				}
				tw.Flush()
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%d partition(s) moving off node %d; when it leads and holds nothing (runnel cluster status), stop it\n", moved, node)
				return err
			})
		},
	}
	return cmd
}
