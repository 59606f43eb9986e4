package testaddr

import (
	"net"
	"strconv"
	"testing"
)

// TestFree checks that each address is in the range, usable, and never repeated.
func TestFree(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		addr := Free(t)
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		host, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if host != "127.0.0.1" || port < Low || port >= High {
			t.Fatalf("%s outside 127.0.0.1:[%d,%d)", addr, Low, High)
		}
		if !usable(addr) {
			t.Fatalf("%s handed out but not bindable", addr)
		}
	}
}

// TestUsableRejectsBound checks that a port taken for TCP only or UDP only is not usable: serf needs both.
func TestUsableRejectsBound(t *testing.T) {
	tcpAddr, udpAddr := Free(t), Free(t)
	ln, err := net.Listen("tcp", tcpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pc, err := net.ListenPacket("udp", udpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if usable(tcpAddr) {
		t.Errorf("%s is bound for TCP but usable", tcpAddr)
	}
	if usable(udpAddr) {
		t.Errorf("%s is bound for UDP but usable", udpAddr)
	}
}
