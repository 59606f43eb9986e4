package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-io/runnel/internal/testaddr"
	"github.com/runnel-io/runnel/platform/netmap"
)

// The fault network: every node of a faultCluster reaches every other node through proxies the test
// controls, one per ordered pair of nodes (i→j) and protocol, all on 127.0.0.1. Node i is started with
// a dial-rewrite table (netmap, RUNNEL_DIAL_REWRITE) that replaces node j's raft, gRPC and serf
// addresses with the i→j proxies':
//
//   - raft, gRPC (controller forwarding and heartbeats, replica fetches once the broker takes the
//     rewrite's dial options) and serf's TCP streams: a TCP proxy per pair and protocol;
//   - serf's UDP packets: a UDP relay on the same port as the pair's serf TCP proxy (memberlist uses one
//     address for both). It is NAT-like: one upstream socket per client address, so whatever node j
//     answers to that socket comes back to the client (memberlist itself answers pings at the address
//     carried in the ping, through the j→i relay).
//
// Faults, in the terms of one direction of a link (i→j: what i sends to j):
//   - block(i, j) drops i→j. For UDP exactly that direction is dropped. A TCP connection cannot lose
//     one direction and stay a stream, so a TCP connection of the pair (i→j or j→i) whose either
//     direction is blocked is blackholed as a whole: it stays open and nothing is forwarded either way
//     (connections accepted while blocked are held without dialing the target), as a cut cable looks
//     to TCP until timeouts fire. On heal those connections are closed, never resumed, since bytes
//     were dropped in the middle of their streams; the nodes redial.
//   - isolate(i) blocks both directions between i and every other node; partition(a, b) between the two
//     sets; heal() lifts every block and latency.
//   - latency(i, j, d) delays every chunk (TCP) or packet (UDP) from i to j by d, in order for TCP.
//
// Process faults are the cluster's: kill -9 (kill), SIGSTOP/SIGCONT (pause, resume) and restart.

// link is one direction between two nodes: what from sends to to.
type link struct{ from, to int32 }

// netFaults is the proxies and the fault state they obey.
type netFaults struct {
	mu      sync.Mutex
	blocked map[link]bool
	latency map[link]time.Duration
	conns   map[*proxyConn]struct{} // open TCP proxy connections
	closers []io.Closer             // listeners and relays
	closed  bool
	wg      sync.WaitGroup // proxy goroutines

	// bytes counts what each protocol forwarded ("raft", "grpc", "serf-tcp", "serf-udp").
	bytes sync.Map // string -> *atomic.Int64
}

func newNetFaults() *netFaults {
	return &netFaults{blocked: map[link]bool{}, latency: map[link]time.Duration{}, conns: map[*proxyConn]struct{}{}}
}

func (nf *netFaults) count(proto string, n int) {
	v, _ := nf.bytes.LoadOrStore(proto, new(atomic.Int64))
	v.(*atomic.Int64).Add(int64(n))
}

// forwarded returns the bytes forwarded so far for proto.
func (nf *netFaults) forwarded(proto string) int64 {
	v, ok := nf.bytes.Load(proto)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

// block drops what from sends to to (see the comment at the top for TCP).
func (nf *netFaults) block(from, to int32) {
	nf.mu.Lock()
	nf.blocked[link{from, to}] = true
	nf.mu.Unlock()
}

// setLatency delays what from sends to to by d (0 removes the delay).
func (nf *netFaults) setLatency(from, to int32, d time.Duration) {
	nf.mu.Lock()
	if d <= 0 {
		delete(nf.latency, link{from, to})
	} else {
		nf.latency[link{from, to}] = d
	}
	nf.mu.Unlock()
}

// heal lifts every block and latency and closes the TCP connections that lost data while blocked.
func (nf *netFaults) heal() {
	nf.mu.Lock()
	clear(nf.blocked)
	clear(nf.latency)
	var dead []*proxyConn
	for pc := range nf.conns {
		if pc.tainted {
			dead = append(dead, pc)
		}
	}
	nf.mu.Unlock()
	for _, pc := range dead {
		pc.close()
	}
}

// describe lists the blocked links, for logs and reports.
func (nf *netFaults) describe() string {
	nf.mu.Lock()
	defer nf.mu.Unlock()
	var out []string
	for l := range nf.blocked {
		out = append(out, fmt.Sprintf("%d->%d", l.from, l.to))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// close stops every proxy and waits for their goroutines.
func (nf *netFaults) close() {
	nf.mu.Lock()
	nf.closed = true
	closers := nf.closers
	var conns []*proxyConn
	for pc := range nf.conns {
		conns = append(conns, pc)
	}
	nf.mu.Unlock()
	for _, c := range closers {
		c.Close()
	}
	for _, pc := range conns {
		pc.close()
	}
	nf.wg.Wait()
}

func (nf *netFaults) addCloser(c io.Closer) {
	nf.mu.Lock()
	nf.closers = append(nf.closers, c)
	nf.mu.Unlock()
}

// tcpProxy forwards connections accepted at its listener (traffic of link l) to target.
type tcpProxy struct {
	nf     *netFaults
	l      link
	proto  string
	ln     net.Listener
	target string
}

// proxyConn is one proxied TCP connection: client is the dialing node's side, up the target's.
type proxyConn struct {
	nf          *netFaults
	l           link // direction client -> up
	client, up  net.Conn
	tainted     bool // under nf.mu: data was dropped, so the stream can never be forwarded again
	once        sync.Once
	closedAlive chan struct{}
}

func (pc *proxyConn) close() {
	pc.once.Do(func() {
		close(pc.closedAlive)
		pc.client.Close()
		if pc.up != nil {
			pc.up.Close()
		}
		pc.nf.mu.Lock()
		delete(pc.nf.conns, pc)
		pc.nf.mu.Unlock()
	})
}

// startTCPProxy listens at addr and forwards to target, as link l.
func (nf *netFaults) startTCPProxy(addr, target string, l link, proto string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("proxy %s %d->%d at %s: %w", proto, l.from, l.to, addr, err)
	}
	p := &tcpProxy{nf: nf, l: l, proto: proto, ln: ln, target: target}
	nf.addCloser(ln)
	nf.wg.Add(1)
	go p.serve()
	return nil
}

func (p *tcpProxy) serve() {
	defer p.nf.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.nf.wg.Add(1)
		go p.handle(c)
	}
}

// cut reports whether either direction of l is blocked (mu held).
func (nf *netFaults) cut(l link) bool {
	return nf.blocked[l] || nf.blocked[link{l.to, l.from}]
}

func (p *tcpProxy) handle(client net.Conn) {
	defer p.nf.wg.Done()
	pc := &proxyConn{nf: p.nf, l: p.l, client: client, closedAlive: make(chan struct{})}
	p.nf.mu.Lock()
	if p.nf.closed {
		p.nf.mu.Unlock()
		client.Close()
		return
	}
	p.nf.conns[pc] = struct{}{}
	held := p.nf.cut(p.l)
	if held {
		pc.tainted = true
	}
	p.nf.mu.Unlock()
	if held {
		// Accepted during a block: the SYN would not have arrived. Hold the connection, read and drop
		// what comes, until heal closes it.
		io.Copy(io.Discard, client)
		pc.close()
		return
	}
	up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		pc.close()
		return
	}
	pc.up = up
	select {
	case <-pc.closedAlive: // closed while dialing
		up.Close()
		return
	default:
	}
	p.nf.wg.Add(2)
	go p.nf.pump(pc, client, up, p.l, p.proto)
	go p.nf.pump(pc, up, client, link{p.l.to, p.l.from}, p.proto)
}

// pump copies src to dst as direction l: each chunk is dropped (and the connection tainted for good)
// while the connection is cut, else delayed by l's latency and written in order.
func (nf *netFaults) pump(pc *proxyConn, src, dst net.Conn, l link, proto string) {
	defer nf.wg.Done()
	defer pc.close()
	type chunk struct {
		b   []byte
		due time.Time
	}
	q := make(chan chunk, 64)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(c.b); err != nil {
				pc.close()
				for range q { // drain so the reader never blocks
				}
				return
			}
			nf.count(proto, len(c.b))
		}
	}()
	defer func() { <-writerDone }()
	defer close(q)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			nf.mu.Lock()
			if nf.cut(pc.l) || pc.tainted {
				pc.tainted = true
				nf.mu.Unlock()
				continue
			}
			d := nf.latency[l]
			nf.mu.Unlock()
			q <- chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(d)}
		}
		if err != nil {
			return
		}
	}
}

// udpRelay forwards the datagrams arriving at its socket (link l) to target, each client address
// through its own upstream socket whose answers go back to that client (direction l reversed).
type udpRelay struct {
	nf     *netFaults
	l      link
	pc     net.PacketConn
	target *net.UDPAddr
	mu     sync.Mutex
	ups    map[string]*net.UDPConn
	closed bool
}

// startUDPRelay listens at addr (UDP) and relays to target as link l.
func (nf *netFaults) startUDPRelay(addr, target string, l link) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("relay serf-udp %d->%d at %s: %w", l.from, l.to, addr, err)
	}
	ta, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		pc.Close()
		return err
	}
	r := &udpRelay{nf: nf, l: l, pc: pc, target: ta, ups: map[string]*net.UDPConn{}}
	nf.addCloser(r)
	nf.wg.Add(1)
	go r.serve()
	return nil
}

// Close implements io.Closer: closes the socket and every upstream socket.
func (r *udpRelay) Close() error {
	r.mu.Lock()
	r.closed = true
	ups := r.ups
	r.ups = map[string]*net.UDPConn{}
	r.mu.Unlock()
	for _, u := range ups {
		u.Close()
	}
	return r.pc.Close()
}

func (r *udpRelay) serve() {
	defer r.nf.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, from, err := r.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		up, err := r.upstream(from)
		if err != nil {
			continue
		}
		b := append([]byte(nil), buf[:n]...)
		r.nf.sendPacket(r.l, "serf-udp", b, func() { up.Write(b) })
	}
}

// upstream returns the socket that relays client's datagrams, creating it and its answer pump.
func (r *udpRelay) upstream(client net.Addr) (*net.UDPConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, net.ErrClosed
	}
	if u, ok := r.ups[client.String()]; ok {
		return u, nil
	}
	u, err := net.DialUDP("udp", nil, r.target)
	if err != nil {
		return nil, err
	}
	r.ups[client.String()] = u
	r.nf.wg.Add(1)
	go func() {
		defer r.nf.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, err := u.Read(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue // ECONNREFUSED while the target is down
			}
			b := append([]byte(nil), buf[:n]...)
			r.nf.sendPacket(link{r.l.to, r.l.from}, "serf-udp", b, func() { r.pc.WriteTo(b, client) })
		}
	}()
	return u, nil
}

// sendPacket sends a datagram of direction l unless l is blocked, after l's latency.
func (nf *netFaults) sendPacket(l link, proto string, b []byte, send func()) {
	nf.mu.Lock()
	if nf.blocked[l] || nf.closed {
		nf.mu.Unlock()
		return
	}
	d := nf.latency[l]
	nf.mu.Unlock()
	nf.count(proto, len(b))
	if d == 0 {
		send()
		return
	}
	time.AfterFunc(d, send)
}

// faultCluster is a cluster whose inter-node links go through a netFaults.
type faultCluster struct {
	*cluster
	net     *netFaults
	rewrite map[int32]string // node id -> its RUNNEL_DIAL_REWRITE
	ids     []int32
	diskMu  sync.Mutex
	disks   map[int32]bool // nodes whose data dir is a tmpfs of its own (mountDisk, diskfault_test.go)
}

// newFaultCluster prepares n nodes (the first `voters` of them controller voters) and the proxies of
// every ordered pair; nothing runs yet. extra flags go to every node.
func newFaultCluster(t *testing.T, n, voters int, extra ...string) *faultCluster {
	t.Helper()
	nf := newNetFaults()
	t.Cleanup(nf.close) // registered before the cluster's: runs after the nodes are stopped
	c := newCluster(t, n, voters)
	fc := &faultCluster{cluster: c, net: nf, rewrite: map[int32]string{}}
	for i := int32(1); i <= int32(n); i++ {
		fc.ids = append(fc.ids, i)
		c.nodes[i].extraArgs = append(c.nodes[i].extraArgs, extra...)
	}
	for _, i := range fc.ids {
		var rw []string
		for _, j := range fc.ids {
			if i == j {
				continue
			}
			dst, l := c.nodes[j], link{i, j}
			raftP, grpcP, serfP := testaddr.Free(t), testaddr.Free(t), testaddr.Free(t)
			for _, err := range []error{
				nf.startTCPProxy(raftP, dst.raft, l, "raft"),
				nf.startTCPProxy(grpcP, dst.grpc, l, "grpc"),
				nf.startTCPProxy(serfP, dst.serf, l, "serf-tcp"),
				nf.startUDPRelay(serfP, dst.serf, l),
			} {
				if err != nil {
					t.Fatal(err)
				}
			}
			rw = append(rw, dst.raft+"="+raftP, dst.grpc+"="+grpcP, dst.serf+"="+serfP)
		}
		fc.rewrite[i] = strings.Join(rw, ",")
		if _, err := netmap.Parse(fc.rewrite[i]); err != nil {
			t.Fatal(err)
		}
	}
	return fc
}

// startFaultCluster is newFaultCluster with every node started and ready.
func startFaultCluster(t *testing.T, n, voters int, extra ...string) *faultCluster {
	t.Helper()
	fc := newFaultCluster(t, n, voters, extra...)
	for _, id := range fc.ids {
		fc.start(id)
	}
	fc.waitReady(60*time.Second, fc.ids...)
	return fc
}

// start starts (or restarts) node id with its rewrite table.
func (fc *faultCluster) start(id int32) {
	fc.cluster.start(id, netmap.EnvVar+"="+fc.rewrite[id])
}

// block drops what from sends to to.
func (fc *faultCluster) block(from, to int32) { fc.net.block(from, to) }

// isolate cuts node id off from every other node, both ways.
func (fc *faultCluster) isolate(id int32) {
	for _, j := range fc.ids {
		if j != id {
			fc.net.block(id, j)
			fc.net.block(j, id)
		}
	}
}

// partition cuts every link between a node of a and a node of b, both ways.
func (fc *faultCluster) partition(a, b []int32) {
	for _, i := range a {
		for _, j := range b {
			fc.net.block(i, j)
			fc.net.block(j, i)
		}
	}
}

// heal lifts every network fault.
func (fc *faultCluster) heal() { fc.net.heal() }

// latency delays what from sends to to by d.
func (fc *faultCluster) latency(from, to int32, d time.Duration) { fc.net.setLatency(from, to, d) }

// pause stops node id's process (SIGSTOP); resume continues it (SIGCONT).
func (fc *faultCluster) pause(id int32)  { fc.signal(id, syscall.SIGSTOP) }
func (fc *faultCluster) resume(id int32) { fc.signal(id, syscall.SIGCONT) }

// restart starts a killed node again, with its data dir, ports and rewrite table.
func (fc *faultCluster) restart(id int32) {
	if fc.running(id) {
		fc.t.Fatalf("restart of node %d, which runs", id)
	}
	fc.start(id)
}
