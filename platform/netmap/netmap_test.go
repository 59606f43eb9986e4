package netmap

import (
	"context"
	"io"
	"log"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestParse(t *testing.T) {
	tb, err := Parse(" 127.0.0.1:7072=127.0.0.1:21001 ,h:1=h2:2,,[::1]:5=127.0.0.1:6")
	if err != nil {
		t.Fatal(err)
	}
	if tb.Len() != 3 || tb.Empty() {
		t.Fatalf("Len %d Empty %t, want 3 entries", tb.Len(), tb.Empty())
	}
	for from, want := range map[string]string{"127.0.0.1:7072": "127.0.0.1:21001", "h:1": "h2:2", "[::1]:5": "127.0.0.1:6",
		"127.0.0.1:7073": "127.0.0.1:7073", "h2:2": "h2:2"} {
		if got := tb.Rewrite(from); got != want {
			t.Errorf("Rewrite(%s) = %s, want %s", from, got, want)
		}
	}
	back, err := Parse(tb.String())
	if err != nil || back.String() != tb.String() {
		t.Fatalf("round trip of %q: %q, %v", tb.String(), back.String(), err)
	}
	for _, bad := range []string{"127.0.0.1:1", "a=b", "127.0.0.1:1=", ":1=h:2", "h:=h:2", "h:1=h:2,h:1=h:3"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q): no error", bad)
		}
	}
	for _, s := range []string{"", " , "} {
		e, err := Parse(s)
		if err != nil || !e.Empty() || e.String() != "" || e.DialOptions() != nil {
			t.Errorf("Parse(%q) = %v, %v; want an empty table without dial options", s, e, err)
		}
	}
	var nilTable *Table
	if nilTable.Rewrite("x:1") != "x:1" || !nilTable.Empty() || nilTable.Len() != 0 || nilTable.DialOptions() != nil {
		t.Error("a nil table must rewrite nothing")
	}
}

func TestFromEnv(t *testing.T) {
	t.Setenv(EnvVar, "127.0.0.1:1=127.0.0.1:2")
	tb, err := FromEnv()
	if err != nil || tb.Rewrite("127.0.0.1:1") != "127.0.0.1:2" {
		t.Fatalf("FromEnv: %v, %v", tb, err)
	}
	t.Setenv(EnvVar, "nonsense")
	if _, err := FromEnv(); err == nil || !strings.Contains(err.Error(), EnvVar) {
		t.Fatalf("FromEnv of a bad value: %v", err)
	}
}

// ghost returns an address nothing listens on (TCP), reserved by a listener just closed.
func ghost(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestDialOptions: a gRPC client of a ghost address reaches the real server through the rewrite.
func TestDialOptions(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(ln)
	defer srv.Stop()
	g := ghost(t)
	tb, err := Parse(g + "=" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(g, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, tb.DialOptions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check through the rewrite: %v, %v", resp, err)
	}
}

// TestTransportRewrites: every sending method of the memberlist wrapper goes to the rewritten address,
// over a real NetTransport: packets to a UDP socket, streams to a TCP listener.
func TestTransportRewrites(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	gUDP, gTCP := ghost(t), ghost(t)
	tb, err := Parse(gUDP + "=" + pc.LocalAddr().String() + "," + gTCP + "=" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, BindPort: 0,
		Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	w := tb.WrapTransport(nt)
	defer w.Shutdown()

	recv := func(want string) {
		t.Helper()
		pc.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 64)
		n, _, err := pc.ReadFrom(buf)
		if err != nil || string(buf[:n]) != want {
			t.Fatalf("packet at the rewritten address: %q, %v; want %q", buf[:n], err, want)
		}
	}
	if _, err := w.WriteTo([]byte("one"), gUDP); err != nil {
		t.Fatal(err)
	}
	recv("one")
	if _, err := w.WriteToAddress([]byte("two"), memberlist.Address{Addr: gUDP, Name: "node-2"}); err != nil {
		t.Fatal(err)
	}
	recv("two")

	accepted := make(chan string, 2)
	go func() {
		for range 2 {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b := make([]byte, 16)
			n, _ := io.ReadAtLeast(c, b, 1)
			accepted <- string(b[:n])
			c.Close()
		}
	}()
	for _, dial := range []func() (net.Conn, error){
		func() (net.Conn, error) { return w.DialTimeout(gTCP, time.Second) },
		func() (net.Conn, error) {
			return w.DialAddressTimeout(memberlist.Address{Addr: gTCP, Name: "node-2"}, time.Second)
		},
	} {
		c, err := dial()
		if err != nil {
			t.Fatalf("dial through the rewrite: %v", err)
		}
		c.Write([]byte("hi"))
		select {
		case got := <-accepted:
			if got != "hi" {
				t.Fatalf("stream carried %q", got)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no stream at the rewritten address")
		}
		c.Close()
	}
	// Addresses without an entry are left alone.
	if _, err := w.WriteTo([]byte("three"), pc.LocalAddr().String()); err != nil {
		t.Fatal(err)
	}
	recv("three")
	if _, _, err := w.FinalAdvertiseAddr("127.0.0.1", 7946); err != nil {
		t.Fatal(err)
	}
}

// TestMemberlistJoinThroughRewrite: a memberlist whose join address is a ghost joins the real member the
// table names, and both see each other alive.
func TestMemberlistJoinThroughRewrite(t *testing.T) {
	conf := func(name string) *memberlist.Config {
		c := memberlist.DefaultLocalConfig()
		c.Name, c.BindAddr, c.BindPort, c.AdvertisePort = name, "127.0.0.1", 0, 0
		c.Logger = log.New(io.Discard, "", 0)
		return c
	}
	a, err := memberlist.Create(conf("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown()
	g := ghost(t)
	tb, err := Parse(g + "=" + a.LocalNode().Address())
	if err != nil {
		t.Fatal(err)
	}
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, BindPort: 0,
		Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	cb := conf("b")
	cb.BindPort = nt.GetAutoBindPort()
	cb.AdvertisePort = cb.BindPort
	cb.Transport = tb.WrapTransport(nt)
	b, err := memberlist.Create(cb)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	if n, err := b.Join([]string{g}); err != nil || n != 1 {
		t.Fatalf("join the ghost address: %d, %v", n, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.NumMembers() != 2 || b.NumMembers() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("members: a sees %d, b sees %d; want 2", a.NumMembers(), b.NumMembers())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
