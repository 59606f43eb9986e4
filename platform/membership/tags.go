package membership

import (
	"fmt"
	"strconv"
)

// Role of a node, carried in its tags.
const (
	RoleController = "controller" // a Raft voter of the controller quorum (it is a broker too)
	RoleBroker     = "broker"     // a broker that follows the metadata log as a non-voter
)

// Tags are what a node tells the others about itself through serf tags. Serf limits the encoded tag
// set to 512 bytes, so the keys on the wire are short and empty values are left out.
type Tags struct {
	// NodeID is the node's broker id (tag "id").
	NodeID int32
	// Role is RoleController or RoleBroker (tag "role").
	Role string
	// GRPCAddr is the host:port of the node's gRPC API (tag "grpc").
	GRPCAddr string
	// RaftAddr is the host:port of the node's raft transport (tag "raft").
	RaftAddr string
	// HTTPAddr is the host:port of /metrics, /healthz etc; may be empty (tag "http").
	HTTPAddr string
	// Rack is the node's rack; may be empty (tag "rack").
	Rack string
	// ClusterID is the cluster's id; empty until the node knows it (tag "cid").
	ClusterID string
}

// Tag keys on the wire.
const (
	tagID      = "id"
	tagRole    = "role"
	tagGRPC    = "grpc"
	tagRaft    = "raft"
	tagHTTP    = "http"
	tagRack    = "rack"
	tagCluster = "cid"
)

func (t Tags) validate() error {
	if t.Role != RoleController && t.Role != RoleBroker {
		return fmt.Errorf("role %q: want %q or %q", t.Role, RoleController, RoleBroker)
	}
	return nil
}

// encode returns the serf tags of t.
func (t Tags) encode() map[string]string {
	m := map[string]string{
		tagID:   strconv.FormatInt(int64(t.NodeID), 10),
		tagRole: t.Role,
	}
	for k, v := range map[string]string{
		tagGRPC: t.GRPCAddr, tagRaft: t.RaftAddr, tagHTTP: t.HTTPAddr, tagRack: t.Rack, tagCluster: t.ClusterID,
	} {
		if v != "" {
			m[k] = v
		}
	}
	return m
}

// decodeTags reads the tags of a member named name. It fails for a member that is not a Runnel node
// (no id tag, or a name that does not match it).
func decodeTags(name string, m map[string]string) (Tags, error) {
	id, err := strconv.ParseInt(m[tagID], 10, 32)
	if err != nil {
		return Tags{}, fmt.Errorf("member %s: tag %s=%q is not a node id", name, tagID, m[tagID])
	}
	if want := nodeName(int32(id)); name != want {
		return Tags{}, fmt.Errorf("member %s: tag %s=%d wants the name %s", name, tagID, id, want)
	}
	return Tags{
		NodeID:    int32(id),
		Role:      m[tagRole],
		GRPCAddr:  m[tagGRPC],
		RaftAddr:  m[tagRaft],
		HTTPAddr:  m[tagHTTP],
		Rack:      m[tagRack],
		ClusterID: m[tagCluster],
	}, nil
}

// nodeName is the serf name of node id.
func nodeName(id int32) string { return "node-" + strconv.FormatInt(int64(id), 10) }
