package quorum

import (
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/runnel-io/runnel/platform/netmap"
)

// TestStreamLayerDialRewrite: raft's dial of a member goes to the address Config.Rewrite names for it
// (the e2e fault proxies' hook); addresses without an entry are dialed as they are.
func TestStreamLayerDialRewrite(t *testing.T) {
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	own, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ghostLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ghost := ghostLn.Addr().String()
	ghostLn.Close()
	tb, err := netmap.Parse(ghost + "=" + target.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := newStreamLayer(own, own.Addr().String(), tb)
	defer s.Close()
	for _, addr := range []string{ghost, target.Addr().String()} {
		c, err := s.Dial(raft.ServerAddress(addr), time.Second)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		target.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
		a, err := target.Accept()
		if err != nil {
			t.Fatalf("dial %s: nothing at %s: %v", addr, target.Addr(), err)
		}
		a.Close()
		c.Close()
	}
}
