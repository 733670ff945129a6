// SPDX-License-Identifier: Apache-2.0

package topo

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Server answers on a backend: a TCP connection gets "NAME PEER" as its
// first line, then every line echoed back prefixed by the name; a UDP
// datagram is answered with "NAME PEER payload". PEER is the address:port
// the server saw the packets come from, which tells the client whether the
// load balancer rewrote its source (SNAT) or not (DSR).
type Server struct {
	Name     string
	tcp      []net.Listener
	udp      []net.PacketConn
	Accepted atomic.Int64
	Datagram atomic.Int64
	wg       sync.WaitGroup
}

// Serve starts servers on h for each address (TCP and UDP on each).
func (h *Host) Serve(addrs ...netip.AddrPort) *Server {
	t := h.top.T
	t.Helper()
	s := &Server{Name: h.Name}
	err := h.NS.Do(func() error {
		for _, a := range addrs {
			l, err := net.Listen("tcp", a.String())
			if err != nil {
				return err
			}
			s.tcp = append(s.tcp, l)
			pc, err := net.ListenPacket("udp", a.String())
			if err != nil {
				return err
			}
			s.udp = append(s.udp, pc)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: listen: %v", h.Name, err)
	}
	for _, l := range s.tcp {
		s.wg.Add(1)
		go s.acceptLoop(l)
	}
	for _, pc := range s.udp {
		s.wg.Add(1)
		go s.udpLoop(pc)
	}
	t.Cleanup(s.Close)
	return s
}

func (s *Server) acceptLoop(l net.Listener) {
	defer s.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		s.Accepted.Add(1)
		go func() {
			defer c.Close()
			if _, err := fmt.Fprintf(c, "%s %s\n", s.Name, c.RemoteAddr()); err != nil {
				return
			}
			r := bufio.NewReader(c)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if _, err := fmt.Fprintf(c, "%s %s", s.Name, line); err != nil {
					return
				}
			}
		}()
	}
}

func (s *Server) udpLoop(pc net.PacketConn) {
	defer s.wg.Done()
	buf := make([]byte, 2048)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		s.Datagram.Add(1)
		_, _ = pc.WriteTo([]byte(s.Name+" "+from.String()+" "+string(buf[:n])), from)
	}
}

// Close stops the server.
func (s *Server) Close() {
	for _, l := range s.tcp {
		l.Close()
	}
	for _, pc := range s.udp {
		pc.Close()
	}
	s.wg.Wait()
}

// Conn is a client TCP connection to a VIP.
type Conn struct {
	net.Conn
	r *bufio.Reader
	// Backend is the name the server announced.
	Backend string
	// Peer is the client address the server saw.
	Peer netip.AddrPort
}

// DialTCP connects from h (optionally from a fixed local port; 0 = any) to
// dst and reads the serving backend's name and the peer address it saw.
func (h *Host) DialTCP(localPort uint16, dst netip.AddrPort) (*Conn, error) {
	return h.DialTCPTimeout(localPort, dst, 3*time.Second)
}

// DialTCPTimeout is DialTCP with timeout for the connection and for the
// greeting each.
func (h *Host) DialTCPTimeout(localPort uint16, dst netip.AddrPort, timeout time.Duration) (*Conn, error) {
	var c net.Conn
	err := h.NS.Do(func() error {
		d := net.Dialer{Timeout: timeout}
		if localPort != 0 {
			src := h.Addr4
			if dst.Addr().Is6() {
				src = h.Addr6
			}
			d.LocalAddr = &net.TCPAddr{IP: net.IP(src.AsSlice()), Port: int(localPort)}
			d.Control = func(_, _ string, rc syscall.RawConn) error {
				var serr error
				err := rc.Control(func(fd uintptr) {
					serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
				})
				return errors.Join(err, serr)
			}
		}
		var err error
		c, err = d.Dial("tcp", dst.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	conn := &Conn{Conn: c, r: bufio.NewReader(c)}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	line, err := conn.r.ReadString('\n')
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("read backend name: %w", err)
	}
	name, peer, _ := strings.Cut(strings.TrimSpace(line), " ")
	conn.Backend = name
	if conn.Peer, err = netip.ParseAddrPort(peer); err != nil {
		c.Close()
		return nil, fmt.Errorf("greeting %q from %s: bad peer address: %w", line, name, err)
	}
	return conn, nil
}

// Echo sends a line and checks the echo comes back from the same backend.
func (c *Conn) Echo(msg string) error {
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(c, "%s\n", msg); err != nil {
		return err
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return err
	}
	want := c.Backend + " " + msg + "\n"
	if line != want {
		return fmt.Errorf("echo %q, want %q", line, want)
	}
	return nil
}

// ReadLine reads the next line the server sent, with its newline.
func (c *Conn) ReadLine() (string, error) { return c.r.ReadString('\n') }

// Abort closes the connection with a RST (SO_LINGER 0), leaving no
// TIME_WAIT on the client, so the same 4-tuple can be used again at once.
func (c *Conn) Abort() {
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// UDPFlow is a client UDP socket bound to one local port: one 5-tuple.
type UDPFlow struct {
	pc  net.PacketConn
	dst netip.AddrPort
}

// DialUDP opens a UDP flow from h's localPort (0 = any) to dst.
func (h *Host) DialUDP(localPort uint16, dst netip.AddrPort) (*UDPFlow, error) {
	var pc net.PacketConn
	src := h.Addr4
	if dst.Addr().Is6() {
		src = h.Addr6
	}
	// No SO_REUSEADDR: UDP has no TIME_WAIT to get past, and with it
	// Linux may give an ephemeral bind a port another such socket
	// already holds, so two flows would share one 5-tuple and one would
	// read the other's answers.
	err := h.NS.Do(func() error {
		var err error
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(src, localPort).String())
		return err
	})
	if err != nil {
		return nil, err
	}
	return &UDPFlow{pc: pc, dst: dst}, nil
}

// Ask sends msg and returns the name of the backend that answered.
func (u *UDPFlow) Ask(msg string) (string, error) {
	name, _, err := u.AskPeer(msg)
	return name, err
}

// AskPeer sends msg and returns the name of the backend that answered and
// the client address that backend saw.
func (u *UDPFlow) AskPeer(msg string) (string, netip.AddrPort, error) {
	buf := make([]byte, 2048)
	for attempt := 0; attempt < 3; attempt++ {
		if _, err := u.pc.WriteTo([]byte(msg), net.UDPAddrFromAddrPort(u.dst)); err != nil {
			return "", netip.AddrPort{}, err
		}
		_ = u.pc.SetReadDeadline(time.Now().Add(time.Second))
		n, src, err := u.pc.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return "", netip.AddrPort{}, err
		}
		// The socket is not connected, so the kernel would hand over an
		// answer from any source; a client of the VIP accepts only
		// VIP:port, which is what every mode must restore.
		if got := src.(*net.UDPAddr).AddrPort(); netip.AddrPortFrom(got.Addr().Unmap(), got.Port()) != u.dst {
			return "", netip.AddrPort{}, fmt.Errorf("answer to %q came from %s, not from %s", msg, got, u.dst)
		}
		name, rest, _ := strings.Cut(string(buf[:n]), " ")
		peer, echo, _ := strings.Cut(rest, " ")
		if echo != msg {
			return "", netip.AddrPort{}, fmt.Errorf("answer %q does not echo %q", buf[:n], msg)
		}
		from, err := netip.ParseAddrPort(peer)
		if err != nil {
			return "", netip.AddrPort{}, fmt.Errorf("answer %q from %s: bad peer address: %w", buf[:n], name, err)
		}
		return name, from, nil
	}
	return "", netip.AddrPort{}, fmt.Errorf("no answer to %q after 3 tries", msg)
}

// LocalPort is the flow's source port.
func (u *UDPFlow) LocalPort() uint16 {
	return uint16(u.pc.LocalAddr().(*net.UDPAddr).Port)
}

// Close closes the socket.
func (u *UDPFlow) Close() { u.pc.Close() }
