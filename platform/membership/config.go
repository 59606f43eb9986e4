package membership

import (
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/runnel-io/runnel/platform/netmap"
)

// Config of a node's membership. Start from DefaultConfig, change fields, then Validate (Start does).
// Zero durations and counts, and an empty BindAddr, take DefaultConfig's values, so a Config built from
// scratch works too.
type Config struct {
	// NodeID is the broker id, unique in the cluster; the serf name is "node-<id>".
	NodeID int32
	// BindAddr is the host:port to listen on, UDP and TCP on the same port (default 127.0.0.1:7946; port 0
	// picks a free port, see Membership.LocalAddr). A host name is resolved once at Start.
	BindAddr string
	// AdvertiseAddr is the host:port the others should use to reach this node; empty means the bound
	// address (with host 0.0.0.0 or ::, memberlist picks a private IP of the machine). Port 0 here, or
	// in BindAddr, advertises the bound port.
	AdvertiseAddr string
	// Tags are what this node publishes about itself; Tags.NodeID is overwritten with NodeID. Tags.Role
	// must be RoleController or RoleBroker.
	Tags Tags
	// EncryptKey encrypts and authenticates all gossip with AES-GCM: 16, 24 or 32 bytes (see ParseKey).
	// nil means plain gossip. Every member must use the same key.
	EncryptKey []byte
	// Join holds gossip addresses (host:port) of existing members. Empty starts a new cluster. The node's
	// own address may be listed (a shared list in a compose file): it is skipped.
	Join []string
	// Logger receives serf's and memberlist's logs (debug, and warn for their warnings and errors) and
	// this package's own (member events at info). nil means slog.Default().
	Logger *slog.Logger

	// ProbeInterval is how often a node probes a random peer (default 500ms).
	ProbeInterval time.Duration
	// ProbeTimeout is how long a probe waits for the direct ack before asking others to probe
	// indirectly; about the 99th percentile round trip time (default 250ms, for a LAN).
	ProbeTimeout time.Duration
	// GossipInterval is how often queued broadcasts are gossiped to a few random peers (default 200ms).
	GossipInterval time.Duration
	// SuspicionMult sets the suspicion timeout: a suspect node that does not refute within
	// SuspicionMult × ProbeInterval × max(1, log10(members)) is declared failed (default 4: 2 s for
	// clusters of up to 10 nodes). With the defaults a crashed node is seen failed in 2.5-4 s (measured
	// on 3 to 6 nodes on one machine).
	SuspicionMult int
	// SuspicionMaxTimeoutMult caps how much longer than the suspicion timeout a suspect may wait for
	// other members to confirm their own suspicion (Lifeguard: the wait shrinks as confirmations
	// arrive, which guards against false positives from one slow prober). When fewer members remain
	// than confirmations are expected, the full cap applies (default 2: at most 4 s with the defaults).
	SuspicionMaxTimeoutMult int
	// TCPTimeout bounds a TCP exchange with a peer: a join's dial and state exchange, and TCP pings
	// (default 5s). It also bounds how long Close waits for a join attempt in flight (plus at most 1 s
	// for the node id check that follows a join).
	TCPTimeout time.Duration
	// PushPullInterval is how often a node syncs its full member list with a random peer, which heals
	// lost gossip (default 30s).
	PushPullInterval time.Duration
	// JoinRetryInterval is the pause between background join attempts while none of Join could be
	// reached (default 1s).
	JoinRetryInterval time.Duration
	// LeavePropagateDelay is how long Leave keeps the node answering probes after it broadcast its
	// leave, so the news reaches everyone before the node goes quiet (default 1s).
	LeavePropagateDelay time.Duration
	// ReconnectInterval is how often serf tries to reconnect to failed members, which heals a network
	// partition (default 10s).
	ReconnectInterval time.Duration
	// ReconnectTimeout is how long a failed member is kept (status failed, reconnects tried) before it
	// is reaped: removed from Members with an EventReap (default 72h).
	ReconnectTimeout time.Duration
	// TombstoneTimeout is how long a member that left is kept (status left) before it is reaped
	// (default 24h).
	TombstoneTimeout time.Duration
	// ReapInterval is how often failed and left members are checked against the two timeouts above
	// (default 15s).
	ReapInterval time.Duration
	// Rewrite, when not empty, sends every gossip packet and stream this node opens to the rewritten
	// address of its target (netmap: the e2e harness's per-link fault proxies). nil: gossip goes where
	// it is addressed.
	Rewrite *netmap.Table
}

// DefaultConfig returns LAN timings (a crashed node is seen failed in 2.5-4 s) for node 1 with role
// broker, bound to 127.0.0.1:7946 as `runnel dev` does, starting a new cluster.
func DefaultConfig() Config {
	return Config{
		NodeID:                  1,
		BindAddr:                "127.0.0.1:7946",
		Tags:                    Tags{NodeID: 1, Role: RoleBroker},
		ProbeInterval:           500 * time.Millisecond,
		ProbeTimeout:            250 * time.Millisecond,
		GossipInterval:          200 * time.Millisecond,
		SuspicionMult:           4,
		SuspicionMaxTimeoutMult: 2,
		TCPTimeout:              5 * time.Second,
		PushPullInterval:        30 * time.Second,
		JoinRetryInterval:       time.Second,
		LeavePropagateDelay:     time.Second,
		ReconnectInterval:       10 * time.Second,
		ReconnectTimeout:        72 * time.Hour,
		TombstoneTimeout:        24 * time.Hour,
		ReapInterval:            15 * time.Second,
	}
}

// withDefaults returns c with every zero duration and count replaced by DefaultConfig's value.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.BindAddr == "" {
		c.BindAddr = d.BindAddr
	}
	durations := []struct{ v, def *time.Duration }{
		{&c.ProbeInterval, &d.ProbeInterval},
		{&c.ProbeTimeout, &d.ProbeTimeout},
		{&c.GossipInterval, &d.GossipInterval},
		{&c.TCPTimeout, &d.TCPTimeout},
		{&c.PushPullInterval, &d.PushPullInterval},
		{&c.JoinRetryInterval, &d.JoinRetryInterval},
		{&c.LeavePropagateDelay, &d.LeavePropagateDelay},
		{&c.ReconnectInterval, &d.ReconnectInterval},
		{&c.ReconnectTimeout, &d.ReconnectTimeout},
		{&c.TombstoneTimeout, &d.TombstoneTimeout},
		{&c.ReapInterval, &d.ReapInterval},
	}
	for _, f := range durations {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	if c.SuspicionMult == 0 {
		c.SuspicionMult = d.SuspicionMult
	}
	if c.SuspicionMaxTimeoutMult == 0 {
		c.SuspicionMaxTimeoutMult = d.SuspicionMaxTimeoutMult
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Tags.NodeID = c.NodeID
	return c
}

// Validate reports the first invalid field. Zero durations are valid (they take the defaults).
func (c Config) Validate() error {
	if c.NodeID < 0 {
		return fmt.Errorf("node id %d: must be 0 or more", c.NodeID)
	}
	if c.BindAddr != "" {
		if _, _, err := net.SplitHostPort(c.BindAddr); err != nil {
			return fmt.Errorf("bind address %q: want host:port: %w", c.BindAddr, err)
		}
	}
	if c.AdvertiseAddr != "" {
		if _, _, err := net.SplitHostPort(c.AdvertiseAddr); err != nil {
			return fmt.Errorf("advertise address %q: want host:port: %w", c.AdvertiseAddr, err)
		}
	}
	if err := c.Tags.validate(); err != nil {
		return err
	}
	if c.EncryptKey != nil {
		if err := checkKeyLen(len(c.EncryptKey)); err != nil {
			return err
		}
	}
	for _, j := range c.Join {
		if strings.TrimSpace(j) == "" {
			return errors.New("join address is empty")
		}
	}
	durations := []struct {
		name string
		v    time.Duration
	}{
		{"probe interval", c.ProbeInterval},
		{"probe timeout", c.ProbeTimeout},
		{"gossip interval", c.GossipInterval},
		{"tcp timeout", c.TCPTimeout},
		{"push/pull interval", c.PushPullInterval},
		{"join retry interval", c.JoinRetryInterval},
		{"leave propagate delay", c.LeavePropagateDelay},
		{"reconnect interval", c.ReconnectInterval},
		{"reconnect timeout", c.ReconnectTimeout},
		{"tombstone timeout", c.TombstoneTimeout},
		{"reap interval", c.ReapInterval},
	}
	for _, d := range durations {
		if d.v < 0 {
			return fmt.Errorf("%s %v: must not be negative", d.name, d.v)
		}
	}
	if c.SuspicionMult < 0 {
		return fmt.Errorf("suspicion multiplier %d: must not be negative", c.SuspicionMult)
	}
	if c.SuspicionMaxTimeoutMult < 0 {
		return fmt.Errorf("suspicion max timeout multiplier %d: must not be negative", c.SuspicionMaxTimeoutMult)
	}
	return nil
}

// ParseKey decodes a gossip key given as standard base64 (what `serf keygen` or `consul keygen` print,
// e.g. from `head -c 32 /dev/urandom | base64`) and checks that it is 16, 24 or 32 bytes (AES-128,
// AES-192 or AES-256). Surrounding white space is ignored.
func ParseKey(s string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("gossip key: not base64: %w", err)
	}
	if err := checkKeyLen(len(key)); err != nil {
		return nil, err
	}
	return key, nil
}

func checkKeyLen(n int) error {
	switch n {
	case 16, 24, 32:
		return nil
	}
	return fmt.Errorf("gossip key is %d bytes: want 16, 24 or 32", n)
}
