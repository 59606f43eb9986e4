// Package testaddr hands out 127.0.0.1 addresses for tests that must know a node's address before the
// node binds it: raft voters and serf joins name their peers up front, and a node run as a process
// cannot report a port the kernel chose.
package testaddr

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

// Ports are drawn from [Low, High): below Linux's default ephemeral range (32768-60999,
// net.ipv4.ip_local_port_range), so an outgoing connection's source port, which the kernel takes from
// that range, cannot claim the port between the check here and the node's bind. A port the kernel hands
// out for "127.0.0.1:0" has no such protection: with three nodes dialling each other while they start,
// one such port was taken before the last node bound it. On a host whose ip_local_port_range reaches
// below High that protection is gone, and only the check in Free remains.
const (
	Low  = 20000
	High = 32000
)

// handedOut holds every address returned in this process, so two callers never get the same one.
var handedOut sync.Map

// Free returns "127.0.0.1:port" with a port in [Low, High) that is free for TCP and UDP now (serf
// listens on both) and was not returned before in this process. Another process may still bind it
// first; the check only makes that unlikely. It fails t when no port is found in 1,000 tries.
func Free(t testing.TB) string {
	t.Helper()
	for range 1000 {
		addr := fmt.Sprintf("127.0.0.1:%d", Low+rand.IntN(High-Low))
		if _, taken := handedOut.LoadOrStore(addr, true); taken {
			continue
		}
		if usable(addr) {
			return addr
		}
	}
	t.Fatal("testaddr: no free port in 1,000 tries")
	return ""
}

// usable reports whether addr can be bound for TCP and for UDP now.
func usable(addr string) bool {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	ln.Close()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	pc.Close()
	return true
}
