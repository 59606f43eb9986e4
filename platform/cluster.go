package platform

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/broker/plog"
	"github.com/runnel-io/runnel/platform/controller"
	"github.com/runnel-io/runnel/platform/membership"
	"github.com/runnel-io/runnel/platform/quorum"
)

// ErrWrongDataDir is returned by Start when the data dir belongs to another node or another cluster
// (its meta.properties says so, as Kafka's does): starting would mix two clusters' data.
var ErrWrongDataDir = errors.New("data dir belongs to another node or cluster")

// propertiesFile records which node and cluster a data dir belongs to.
const propertiesFile = "meta.properties"

// properties are the contents of meta.properties; NodeID -1 and ClusterID "" when not written yet.
type properties struct {
	NodeID    int32
	ClusterID string
}

func loadProperties(dir string) (properties, error) {
	p := properties{NodeID: -1}
	f, err := os.Open(filepath.Join(dir, propertiesFile))
	if errors.Is(err, os.ErrNotExist) {
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("read %s: %w", propertiesFile, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		switch {
		case !ok || strings.HasPrefix(k, "#"):
		case k == "node.id":
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil {
				return p, fmt.Errorf("%s: node.id %q: %w", propertiesFile, v, err)
			}
			p.NodeID = int32(n)
		case k == "cluster.id":
			p.ClusterID = v
		}
	}
	return p, sc.Err()
}

func saveProperties(dir string, p properties) error {
	data := fmt.Sprintf("# written by runnel: the node and cluster this data dir belongs to\nnode.id=%d\ncluster.id=%s\n", p.NodeID, p.ClusterID)
	tmp := filepath.Join(dir, propertiesFile+".tmp")
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", propertiesFile, err)
	}
	return os.Rename(tmp, filepath.Join(dir, propertiesFile))
}

// bindRaft returns the raft address to advertise. A node that is the whole quorum may bind port 0: it
// binds first, so the voter list names the real address (raft keeps the listener).
func (n *Node) bindRaft() (string, error) {
	voters, err := n.cfg.voters()
	if err != nil {
		return "", err
	}
	if len(voters) == 1 && voters[0].ID == n.cfg.NodeID {
		if n.raftLn, err = net.Listen("tcp", n.cfg.RaftAddr); err != nil {
			return "", fmt.Errorf("listen on %s for raft (pick a free address with --raft-addr): %w", n.cfg.RaftAddr, err)
		}
		return n.raftLn.Addr().String(), nil
	}
	return n.cfg.RaftAddr, nil
}

// legacyDataDir reports whether store holds the topic metadata of the single-node version before the
// cluster ("m/cluster-id"), whose topic numbers a new cluster would reuse.
func legacyDataDir(store *plog.Store) bool {
	found := false
	store.DB().View(func(txn *badger.Txn) error {
		_, err := txn.Get([]byte("m/cluster-id"))
		found = err == nil
		return nil
	})
	return found
}

// startQuorum starts this node's raft member of the controller quorum in DataDir/raft.
func (n *Node) startQuorum(raftAddr string) error {
	voters, err := n.cfg.voters()
	if err != nil {
		return err
	}
	qc := quorum.DefaultConfig()
	qc.NodeID = n.cfg.NodeID
	qc.Dir = filepath.Join(n.cfg.DataDir, "raft")
	qc.BindAddr = n.cfg.RaftAddr
	qc.Logger = n.log
	n.fsm = meta.NewFSM(n.log)
	qc.StateMachine = n.fsm
	if n.raftLn != nil {
		voters = []quorum.Voter{{ID: n.cfg.NodeID, Addr: raftAddr}}
		qc.BindAddr = raftAddr
		qc.Listener = n.raftLn
	}
	qc.Voters = voters
	qc.Rewrite = n.cfg.dialRewrite()
	if n.quorum, err = quorum.Start(qc); err != nil {
		return fmt.Errorf("start the controller quorum member: %w", err)
	}
	return nil
}

// startMembership joins serf with this node's tags, and refuses a cluster whose members already carry
// another cluster id than the data dir's.
func (n *Node) startMembership(grpcAddr, raftAddr string, props properties) error {
	mc := membership.DefaultConfig()
	mc.NodeID = n.cfg.NodeID
	mc.BindAddr = n.cfg.SerfAddr
	mc.Join = n.cfg.Join
	mc.Logger = n.log
	mc.Rewrite = n.cfg.dialRewrite()
	role := membership.RoleBroker
	if n.cfg.isVoter() {
		role = membership.RoleController
	}
	mc.Tags = membership.Tags{NodeID: n.cfg.NodeID, Role: role, GRPCAddr: grpcAddr, RaftAddr: raftAddr,
		HTTPAddr: n.HTTPAddr(), Rack: n.cfg.Rack, ClusterID: props.ClusterID}
	if n.cfg.GossipKey != "" {
		key, err := membership.ParseKey(n.cfg.GossipKey)
		if err != nil {
			return fmt.Errorf("gossip key: %w", err)
		}
		mc.EncryptKey = key
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var err error
	if n.memb, err = membership.Start(ctx, mc); err != nil {
		return fmt.Errorf("join the cluster: %w", err)
	}
	if props.ClusterID != "" {
		for _, m := range n.memb.Members() {
			if m.Tags.ClusterID != "" && m.Tags.ClusterID != props.ClusterID {
				return fmt.Errorf("data dir %s belongs to cluster %s, but node %d is in cluster %s: %w",
					n.cfg.DataDir, props.ClusterID, m.Tags.NodeID, m.Tags.ClusterID, ErrWrongDataDir)
			}
		}
	}
	return nil
}

// watchClusterID waits until the metadata names the cluster, then checks it against the data dir's
// meta.properties (a node started with another cluster's data dir stops: Fatal reports it) or writes
// it there, and publishes it in the serf tags.
func (n *Node) watchClusterID(props properties) {
	defer n.wg.Done()
	for {
		ch := n.fsm.Changed()
		if id := n.fsm.Image().ClusterID; id != "" {
			if props.ClusterID != "" && props.ClusterID != id {
				n.fail(fmt.Errorf("data dir %s belongs to cluster %s, but this cluster is %s: %w", n.cfg.DataDir, props.ClusterID, id, ErrWrongDataDir))
				return
			}
			if props.ClusterID == "" || props.NodeID != n.cfg.NodeID {
				if err := saveProperties(n.cfg.DataDir, properties{NodeID: n.cfg.NodeID, ClusterID: id}); err != nil {
					n.fail(err)
					return
				}
			}
			if n.memb != nil {
				t := n.memb.LocalMember().Tags
				t.ClusterID = id
				if err := n.memb.SetTags(t); err != nil {
					n.log.Warn("publishing the cluster id in the gossip tags failed", "err", err)
				}
			}
			return
		}
		select {
		case <-ch:
		case <-n.stopping:
			return
		}
	}
}

// fail reports a fatal error on Fatal (the first one only).
func (n *Node) fail(err error) {
	n.log.Error("node cannot go on", "err", err)
	select {
	case n.fatal <- err:
	default:
	}
}

// Fatal returns a channel that receives an error when the node found it must not go on (a data dir
// of another cluster); the caller should Close it and exit.
func (n *Node) Fatal() <-chan error { return n.fatal }

// WaitReady waits until the node is registered and unfenced (its /readyz answers ready), or ctx ends.
func (n *Node) WaitReady(ctx context.Context) error {
	for {
		ch := n.fsm.Changed()
		if n.broker != nil && n.broker.Ready() {
			return nil
		}
		select {
		case <-ch:
		case err := <-n.fatal:
			n.fail(err)
			return err
		case <-ctx.Done():
			return fmt.Errorf("node %d not ready (registered and unfenced by the controller): %w", n.cfg.NodeID, ctx.Err())
		}
	}
}

// waitGroupsLoaded waits until the group coordinator serves every __consumer_offsets partition this
// node leads (a single node creates the topic as soon as it is unfenced).
func (n *Node) waitGroupsLoaded(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !n.groups.Loaded() {
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// SerfAddr returns the bound gossip address, or "" when gossip is off.
func (n *Node) SerfAddr() string {
	if n.memb == nil {
		return ""
	}
	return n.memb.LocalAddr()
}

// RaftAddr returns the controller quorum's raft address of this node ("" before Start).
func (n *Node) RaftAddr() string {
	if n.quorum == nil {
		return ""
	}
	return n.quorum.Addr()
}

// Controller returns the node's controller shell (nil before Start), for tests and the CLI's status.
func (n *Node) Controller() *controller.Controller { return n.ctl }
