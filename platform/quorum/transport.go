package quorum

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/runnel-io/runnel/platform/netmap"
)

// streamLayer is raft's TCP stream layer (as raft.NewTCPTransport builds it) plus bookkeeping of its
// connections. raft's NetworkTransport.Close closes only the listener: a goroutine serving a connection
// a live peer opened stays blocked in a read until that peer writes again. Close here closes every
// connection too and waits until the handlers of accepted connections have returned, so closing a
// Quorum stops everything it started.
type streamLayer struct {
	ln        net.Listener
	advertise net.Addr
	rewrite   *netmap.Table // where to dial instead (fault proxies); nil: the address itself

	mu       sync.Mutex
	closed   bool
	conns    map[*trackedConn]struct{}
	handlers sync.WaitGroup // accepted connections not yet closed by their handler
}

var _ raft.StreamLayer = (*streamLayer)(nil)

func newStreamLayer(ln net.Listener, advertise string, rewrite *netmap.Table) *streamLayer {
	return &streamLayer{ln: ln, advertise: advertiseAddr(advertise), rewrite: rewrite, conns: make(map[*trackedConn]struct{})}
}

// Accept implements net.Listener.
func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	return s.track(c, true)
}

// Dial implements raft.StreamLayer: it dials address, or its rewrite in Config.Rewrite.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := s.rewrite.DialTimeout("tcp", string(address), timeout)
	if err != nil {
		return nil, err
	}
	return s.track(c, false)
}

func (s *streamLayer) track(c net.Conn, accepted bool) (net.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: c, s: s, accepted: accepted}
	s.conns[tc] = struct{}{}
	if accepted {
		s.handlers.Add(1)
	}
	return tc, nil
}

func (s *streamLayer) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close implements net.Listener: it closes the listener and every connection. It is idempotent.
func (s *streamLayer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	conns := make([]*trackedConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	err := s.ln.Close()
	for _, c := range conns {
		_ = c.Conn.Close() // the owner's Close still untracks it
	}
	return err
}

// waitHandlers waits until raft's handler of every accepted connection has closed it (they do when
// their read fails, which Close makes happen), at most timeout.
func (s *streamLayer) waitHandlers(timeout time.Duration) bool {
	done := make(chan struct{})
	go func() {
		s.handlers.Wait()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// Addr implements net.Listener: the advertised address.
func (s *streamLayer) Addr() net.Addr { return s.advertise }

// trackedConn is a connection of a streamLayer.
type trackedConn struct {
	net.Conn
	s        *streamLayer
	accepted bool
	once     sync.Once
}

// Read reports io.EOF instead of "use of closed network connection" once the stream layer is closed,
// so raft's handlers end quietly instead of logging an error for each connection at shutdown.
func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && c.s.isClosed() {
		err = io.EOF
	}
	return n, err
}

// Close closes the connection and forgets it.
func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
		if c.accepted {
			c.s.handlers.Done()
		}
	})
	return err
}

// advertiseAddr is a net.Addr that prints exactly the configured host:port (raft takes its own
// address from Addr().String(); a resolved *net.TCPAddr would turn a host name into an IP).
type advertiseAddr string

func (a advertiseAddr) Network() string { return "tcp" }
func (a advertiseAddr) String() string  { return string(a) }
