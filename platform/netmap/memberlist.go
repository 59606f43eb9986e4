package netmap

import (
	"net"
	"time"

	"github.com/hashicorp/memberlist"
)

// Transport wraps memberlist's transport (normally *memberlist.NetTransport) so that every packet it
// sends and every stream it opens goes to the rewritten address: WriteTo, WriteToAddress, DialTimeout
// and DialAddressTimeout rewrite their target, everything else (listening, received packets and
// streams, the advertised address) is inner's. Packets keep their source (this node's own socket), so
// the receiver sees them coming from wherever the proxy sends them from; memberlist answers pings at
// the address carried in the ping (SourceAddr), which is rewritten again on the way back.
type Transport struct {
	inner memberlist.NodeAwareTransport
	t     *Table
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// WrapTransport returns inner with t's rewrites applied to its outgoing traffic.
func (t *Table) WrapTransport(inner memberlist.NodeAwareTransport) *Transport {
	return &Transport{inner: inner, t: t}
}

// FinalAdvertiseAddr implements memberlist.Transport (inner's).
func (w *Transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return w.inner.FinalAdvertiseAddr(ip, port)
}

// WriteTo implements memberlist.Transport: sends b to addr's rewrite.
func (w *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return w.inner.WriteTo(b, w.t.Rewrite(addr))
}

// WriteToAddress implements memberlist.NodeAwareTransport: sends b to addr.Addr's rewrite.
func (w *Transport) WriteToAddress(b []byte, addr memberlist.Address) (time.Time, error) {
	addr.Addr = w.t.Rewrite(addr.Addr)
	return w.inner.WriteToAddress(b, addr)
}

// PacketCh implements memberlist.Transport (inner's).
func (w *Transport) PacketCh() <-chan *memberlist.Packet { return w.inner.PacketCh() }

// DialTimeout implements memberlist.Transport: dials addr's rewrite.
func (w *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return w.inner.DialTimeout(w.t.Rewrite(addr), timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport: dials addr.Addr's rewrite.
func (w *Transport) DialAddressTimeout(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	addr.Addr = w.t.Rewrite(addr.Addr)
	return w.inner.DialAddressTimeout(addr, timeout)
}

// StreamCh implements memberlist.Transport (inner's).
func (w *Transport) StreamCh() <-chan net.Conn { return w.inner.StreamCh() }

// Shutdown implements memberlist.Transport: shuts inner down.
func (w *Transport) Shutdown() error { return w.inner.Shutdown() }
