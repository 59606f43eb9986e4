// Package netmap rewrites the addresses a node dials to reach other nodes: "to reach X, dial Y
// instead". It exists for fault injection: the e2e harness (docs/testing.md) starts every node with a
// table that sends its raft, gossip (serf/memberlist, UDP and TCP) and inter-broker gRPC traffic for
// each peer to a proxy of that ordered pair of nodes, which can then drop, blackhole or delay it, the
// way Jepsen cuts links between database nodes with iptables.
//
// A node reads its table from the hidden --dial-rewrite flag of runnel server (or the RUNNEL_DIAL_REWRITE
// variable): "FROM=TO,FROM=TO", each side a host:port exactly as the node would dial it (no name
// resolution happens here: a name is rewritten only when it is dialed by that name). An empty or nil
// Table rewrites nothing, and the dial paths stay what they were.
//
// Where the table applies: raft's stream layer (platform/quorum), memberlist's transport
// (platform/membership, through Transport), and gRPC clients of other nodes (DialOptions: the
// controller's forwarding and heartbeats, a follower's replica fetches, the transaction coordinator).
// Client traffic (SDK, CLI) never goes through it.
package netmap

import (
	"context"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
)

// EnvVar is the environment variable runnel server takes the table from when --dial-rewrite is not
// given (same syntax as Parse).
const EnvVar = "RUNNEL_DIAL_REWRITE"

// Table maps dial targets to the addresses dialed instead. The zero value and nil are empty tables. A
// Table is immutable once built and safe for concurrent use.
type Table struct {
	m map[string]string
}

// Parse reads "FROM=TO,FROM=TO,...": each FROM and TO a host:port (port required, host non-empty),
// each FROM at most once; spaces around entries are ignored. An empty string gives an empty table.
// Errors name the bad entry.
func Parse(s string) (*Table, error) {
	t := &Table{m: map[string]string{}}
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		from, to, ok := strings.Cut(e, "=")
		if !ok {
			return nil, fmt.Errorf("dial rewrite %q: want FROM=TO", e)
		}
		from, to = strings.TrimSpace(from), strings.TrimSpace(to)
		for _, a := range []string{from, to} {
			host, port, err := net.SplitHostPort(a)
			if err != nil {
				return nil, fmt.Errorf("dial rewrite %q: %w", e, err)
			}
			if host == "" || port == "" {
				return nil, fmt.Errorf("dial rewrite %q: %q needs a host and a port", e, a)
			}
		}
		if _, dup := t.m[from]; dup {
			return nil, fmt.Errorf("dial rewrite: %s is rewritten twice", from)
		}
		t.m[from] = to
	}
	return t, nil
}

// FromEnv parses EnvVar (an unset variable gives an empty table).
func FromEnv() (*Table, error) {
	t, err := Parse(os.Getenv(EnvVar))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvVar, err)
	}
	return t, nil
}

// Empty reports whether the table rewrites nothing (true for nil).
func (t *Table) Empty() bool { return t == nil || len(t.m) == 0 }

// Len is the number of entries.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return len(t.m)
}

// Rewrite returns the address to dial for addr: its entry's target, or addr itself.
func (t *Table) Rewrite(addr string) string {
	if t == nil {
		return addr
	}
	if to, ok := t.m[addr]; ok {
		return to
	}
	return addr
}

// String returns the table in Parse's syntax, entries sorted, so it round-trips.
func (t *Table) String() string {
	if t.Empty() {
		return ""
	}
	out := make([]string, 0, len(t.m))
	for from, to := range t.m {
		out = append(out, from+"="+to)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// DialTimeout is net.DialTimeout to the rewritten address.
func (t *Table) DialTimeout(network, addr string, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout(network, t.Rewrite(addr), timeout)
}

// DialContext dials TCP to the rewritten addr; it is the gRPC context dialer of DialOptions.
func (t *Table) DialContext(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", t.Rewrite(addr))
}

// DialOptions returns the gRPC dial options that make a client connection dial the rewritten address
// of each resolved target address (grpc.WithContextDialer): nil for an empty table, so gRPC keeps its
// own dialer. Append them after the caller's other options.
func (t *Table) DialOptions() []grpc.DialOption {
	if t.Empty() {
		return nil
	}
	return []grpc.DialOption{grpc.WithContextDialer(t.DialContext)}
}
