package controller

import (
	"context"
	"sort"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/platform/membership"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Register adds the Controller (brokers' own) and Cluster (operators') services to s.
func (c *Controller) Register(s *grpc.Server) {
	srv := &server{c: c}
	runnelv1.RegisterControllerServer(s, srv)
	runnelv1.RegisterClusterServer(s, srv)
}

// server adapts the Controller to the generated service interfaces (its own Propose takes a command).
type server struct {
	runnelv1.UnimplementedControllerServer
	runnelv1.UnimplementedClusterServer
	c *Controller
}

func isForwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(forwardedKey)) > 0
}

// Propose implements runnelv1.ControllerServer: commit on the leader, or forward there once.
func (s *server) Propose(ctx context.Context, req *runnelv1.ProposeRequest) (*runnelv1.ProposeResponse, error) {
	if _, err := meta.DecodeCommand(req.Command); err != nil {
		return nil, rerr.ToStatus(rerr.New(runnelv1.ErrorCode_INVALID_REQUEST, "%v", err))
	}
	resp, err := s.c.propose(ctx, req.Command, isForwarded(ctx))
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	return resp, nil
}

// BrokerHeartbeat implements runnelv1.ControllerServer: handled on the leader, forwarded there once.
func (s *server) BrokerHeartbeat(ctx context.Context, req *runnelv1.BrokerHeartbeatRequest) (*runnelv1.BrokerHeartbeatResponse, error) {
	var resp *runnelv1.BrokerHeartbeatResponse
	var err error
	if s.c.q.IsLeader() || isForwarded(ctx) {
		resp, err = s.c.handleHeartbeat(ctx, req)
	} else {
		resp, err = s.c.heartbeat(ctx, req)
	}
	if err != nil {
		return nil, rerr.ToStatus(err)
	}
	return resp, nil
}

// Status implements runnelv1.ClusterServer.
func (s *server) Status(context.Context, *runnelv1.ClusterStatusRequest) (*runnelv1.ClusterStatusResponse, error) {
	return s.c.Status(), nil
}

// Status describes the cluster as this node sees it.
func (c *Controller) Status() *runnelv1.ClusterStatusResponse {
	img := c.fsm.Image()
	qs := c.q.Status()
	resp := &runnelv1.ClusterStatusResponse{ClusterId: img.ClusterID, NodeId: c.cfg.Self.ID, ControllerId: qs.LeaderID,
		RaftTerm: qs.Term, RaftCommitIndex: qs.CommitIndex, RaftAppliedIndex: qs.AppliedIndex, MetadataOffset: img.Offset}
	nodes := map[int32]*runnelv1.ClusterNode{}
	node := func(id int32) *runnelv1.ClusterNode {
		n := nodes[id]
		if n == nil {
			n = &runnelv1.ClusterNode{NodeId: id, Role: membership.RoleBroker, Membership: "unknown"}
			nodes[id] = n
		}
		return n
	}
	for _, b := range img.BrokerList() {
		n := node(b.ID)
		n.GrpcAddr, n.RaftAddr, n.HttpAddr, n.Rack = b.GRPCAddr, b.RaftAddr, b.HTTPAddr, b.Rack
		n.Registered, n.Fenced, n.BrokerEpoch = true, b.Fenced, b.Epoch
		if b.Controller {
			n.Role = membership.RoleController
		}
	}
	for _, srv := range qs.Servers {
		n := node(srv.ID)
		n.InRaftConfiguration, n.RaftVoter = true, srv.Voter
		if srv.Voter {
			n.Role = membership.RoleController
		}
		if n.RaftAddr == "" {
			n.RaftAddr = srv.Addr
		}
	}
	if c.memb != nil {
		for _, m := range c.memb.Members() {
			n := node(m.Tags.NodeID)
			n.Membership, n.SerfAddr = m.Status.String(), m.Addr
			if n.GrpcAddr == "" {
				n.GrpcAddr, n.RaftAddr, n.HttpAddr, n.Rack = m.Tags.GRPCAddr, m.Tags.RaftAddr, m.Tags.HTTPAddr, m.Tags.Rack
			}
			if m.Tags.Role == membership.RoleController {
				n.Role = membership.RoleController
			}
		}
	} else if n := nodes[c.cfg.Self.ID]; n != nil {
		n.Membership = "alive" // a node without gossip knows only itself
	}
	for _, t := range img.TopicList() {
		resp.Topics++
		for i, p := range t.Assignment {
			resp.Partitions++
			ps := &runnelv1.PartitionStatus{Topic: t.Name, Partition: int32(i), LeaderId: p.Leader, LeaderEpoch: p.LeaderEpoch,
				Replicas: p.Replicas, Isr: p.ISR}
			if p.Leader == meta.NoLeader {
				resp.OfflinePartitions = append(resp.OfflinePartitions, ps)
			} else {
				node(p.Leader).Leaders++
			}
			if len(p.ISR) < len(p.Replicas) {
				resp.UnderReplicatedPartitions = append(resp.UnderReplicatedPartitions, ps)
			}
		}
	}
	for _, n := range nodes {
		resp.Nodes = append(resp.Nodes, n)
	}
	sort.Slice(resp.Nodes, func(i, j int) bool { return resp.Nodes[i].NodeId < resp.Nodes[j].NodeId })
	return resp
}

// heartbeat sends req to the leader: directly when this node leads, else over gRPC.
func (c *Controller) heartbeat(ctx context.Context, req *runnelv1.BrokerHeartbeatRequest) (*runnelv1.BrokerHeartbeatResponse, error) {
	if c.q.IsLeader() {
		return c.handleHeartbeat(ctx, req)
	}
	var resp *runnelv1.BrokerHeartbeatResponse
	err := c.callLeader(ctx, func(ctx context.Context, cl runnelv1.ControllerClient) error {
		var err error
		resp, err = cl.BrokerHeartbeat(ctx, req)
		return err
	})
	return resp, err
}

// handleHeartbeat is the leader's side of a heartbeat: note the time, unfence a broker that caught up,
// fence one that asks to stop, and make sure a non-voter is in the raft configuration so it receives
// the metadata log.
func (c *Controller) handleHeartbeat(ctx context.Context, req *runnelv1.BrokerHeartbeatRequest) (*runnelv1.BrokerHeartbeatResponse, error) {
	if !c.q.IsLeader() {
		return nil, c.notController()
	}
	img := c.fsm.Image()
	b, ok := img.Broker(req.NodeId)
	if !ok {
		return nil, rerr.New(runnelv1.ErrorCode_BROKER_ID_NOT_REGISTERED, "broker %d is not registered", req.NodeId)
	}
	if b.Epoch != req.BrokerEpoch {
		return nil, rerr.New(runnelv1.ErrorCode_STALE_BROKER_EPOCH, "broker %d has epoch %d, the heartbeat %d", b.ID, b.Epoch, req.BrokerEpoch)
	}
	c.hbMu.Lock()
	c.lastSeen[b.ID] = time.Now()
	c.hbMu.Unlock()
	c.ensureRaftMember(ctx, b)
	if req.WantShutdown {
		if !b.Fenced {
			if _, err := c.proposeAsLeader(ctx, meta.Command{Type: meta.CmdFenceBroker, BrokerID: b.ID, BrokerEpoch: b.Epoch, Reason: "controlled shutdown"}); err != nil {
				return nil, err
			}
			c.log.Info("broker fenced", "broker", b.ID, "reason", "controlled shutdown")
		}
		return &runnelv1.BrokerHeartbeatResponse{Fenced: true, ShutdownOk: true}, nil
	}
	if b.Fenced && req.MetadataOffset >= b.Epoch {
		img, err := c.proposeAsLeader(ctx, meta.Command{Type: meta.CmdUnfenceBroker, BrokerID: b.ID, BrokerEpoch: b.Epoch})
		if err != nil {
			return nil, err
		}
		c.log.Info("broker unfenced", "broker", b.ID, "epoch", b.Epoch)
		nb, _ := img.Broker(b.ID)
		return &runnelv1.BrokerHeartbeatResponse{Fenced: nb == nil || nb.Fenced}, nil
	}
	return &runnelv1.BrokerHeartbeatResponse{Fenced: b.Fenced}, nil
}

// ensureRaftMember adds a broker that is not a voter to the raft configuration as a non-voter.
func (c *Controller) ensureRaftMember(ctx context.Context, b *meta.Broker) {
	if b.Controller || b.RaftAddr == "" {
		return
	}
	for _, s := range c.q.Status().Servers {
		if s.ID == b.ID && s.Addr == b.RaftAddr {
			return
		}
	}
	if err := c.q.AddNonvoter(ctx, b.ID, b.RaftAddr); err != nil {
		c.log.Warn("adding a broker to the metadata quorum as a non-voter failed", "broker", b.ID, "raft", b.RaftAddr, "err", err)
		return
	}
	c.log.Info("broker added to the metadata quorum as a non-voter", "broker", b.ID, "raft", b.RaftAddr)
}
