package gitserver

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
)

// Defaults of the connection limits (WithHandshakeTimeout, WithIdleTimeout, WithMaxAuthTries,
// WithUnauthenticatedLimits, WithKeepalive).
const (
	DefaultHandshakeTimeout = 30 * time.Second
	DefaultIdleTimeout      = 10 * time.Minute
	DefaultMaxAuthTries     = 6
	// A CI farm behind one NAT starts dozens of pushes at once from one address; the
	// handshake deadline bounds what a connection that never authenticates costs.
	DefaultMaxUnauthenticated      = 256
	DefaultMaxUnauthenticatedPerIP = 64
	DefaultKeepaliveInterval       = 15 * time.Second
	DefaultKeepaliveMaxMissed      = 3
)

// refusedLogEvery is how often at most a refusal by the unauthenticated-connection limits is
// logged, per limit: a flood of connections must not become a flood of log lines.
const refusedLogEvery = 10 * time.Second

// Limit names in the log line of a refused connection.
const (
	limitTotal = "total"
	limitPerIP = "per_ip"
)

// gate counts the connections that have not authenticated yet, in total and per source IP,
// and admits a new one only under both limits. Every TCP connection passes it before the SSH
// version exchange: until a client has proved who it is, it may hold only a bounded share of
// the server, and for a bounded time (guardedConn).
type gate struct {
	maxTotal, maxPerIP int

	mu    sync.Mutex
	conns map[*guardedConn]struct{}
	perIP map[string]int
	// One sparse log per limit, so that a flood against one still shows the other.
	logTotal, logPerIP sparseLog
}

func newGate(maxTotal, maxPerIP int) *gate {
	return &gate{maxTotal: maxTotal, maxPerIP: maxPerIP, conns: map[*guardedConn]struct{}{}, perIP: map[string]int{},
		logTotal: sparseLog{every: refusedLogEvery}, logPerIP: sparseLog{every: refusedLogEvery}}
}

// enter admits c, or returns the name of the limit it is over (limitTotal, limitPerIP) and
// that limit's value.
func (g *gate) enter(c *guardedConn) (limit string, max int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case len(g.conns) >= g.maxTotal:
		return limitTotal, g.maxTotal
	case g.perIP[c.ip] >= g.maxPerIP:
		return limitPerIP, g.maxPerIP
	}
	g.conns[c] = struct{}{}
	g.perIP[c.ip]++
	return "", 0
}

// leave gives up c's place; it may be called more than once.
func (g *gate) leave(c *guardedConn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.conns[c]; !ok {
		return
	}
	delete(g.conns, c)
	if g.perIP[c.ip]--; g.perIP[c.ip] <= 0 {
		delete(g.perIP, c.ip)
	}
}

// waiting is how many connections have not authenticated yet.
func (g *gate) waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.conns)
}

// closeAll closes every connection that has not authenticated yet: gliderlabs' Close only
// knows the ones past the handshake.
func (g *gate) closeAll() {
	g.mu.Lock()
	conns := make([]*guardedConn, 0, len(g.conns))
	for c := range g.conns {
		conns = append(conns, c)
	}
	g.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// sparseLog lets one line through per interval and counts the ones it held back meanwhile.
type sparseLog struct {
	every time.Duration

	mu   sync.Mutex
	next time.Time // before it, lines are held back
	held int
}

// allow reports whether a line may be logged at now, and if so how many were held back since
// the last one.
func (l *sparseLog) allow(now time.Time) (ok bool, held int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.held++
		return false, 0
	}
	held, l.held = l.held, 0
	l.next = now.Add(l.every)
	return true, held
}

// ctxKeyConn holds a connection's *guardedConn in its ssh.Context.
type ctxKeyConn struct{}

// guardedConn is one TCP connection of the server. Until the client authenticates it holds a
// place in the gate and must authenticate within the handshake timeout; after, it is watched
// for idleness and for a client that stopped answering (watch).
type guardedConn struct {
	net.Conn
	s        *Server
	ip       string
	deadline atomic.Pointer[time.Timer] // closes the connection unless authentication stops it first

	closeOnce sync.Once
	done      chan struct{} // closed by Close
	active    atomic.Int64  // time.Now().UnixNano() of the last session data either way
}

// admit is the ssh.Server's ConnCallback: it lets nc in under the unauthenticated-connection
// limits, or closes it at once (nil) with a Warn line, logged sparsely.
func (s *Server) admit(ctx ssh.Context, nc net.Conn) net.Conn {
	c := &guardedConn{Conn: nc, s: s, ip: remoteIP(nc.RemoteAddr()), done: make(chan struct{})}
	if limit, max := s.gate.enter(c); limit != "" {
		l := &s.gate.logTotal
		if limit == limitPerIP {
			l = &s.gate.logPerIP
		}
		if ok, held := l.allow(time.Now()); ok {
			s.log.Warn("refused ssh connection: too many unauthenticated connections", "remote_addr", nc.RemoteAddr().String(),
				"limit", limit, "max", max, "refused_unlogged", held)
		}
		return nil
	}
	c.deadline.Store(time.AfterFunc(s.handshakeTimeout, func() {
		s.log.Debug("closing ssh connection: no authentication within the handshake timeout",
			"remote_addr", nc.RemoteAddr().String(), "timeout", s.handshakeTimeout)
		c.Close()
	}))
	ctx.SetValue(ctxKeyConn{}, c)
	return c
}

func remoteIP(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// Close closes the connection and gives up its place in the gate.
func (c *guardedConn) Close() error {
	c.closeOnce.Do(func() {
		if t := c.deadline.Load(); t != nil { // nil: Server.Close came first, in admit
			t.Stop()
		}
		c.s.gate.leave(c)
		close(c.done)
	})
	return c.Conn.Close()
}

// authenticated is called when the client has authenticated (x/crypto's AuthLogCallback
// without error, just before it tells the client): the connection leaves the gate and its
// handshake deadline, and is watched from now on.
func (c *guardedConn) authenticated(ctx ssh.Context) {
	if !c.deadline.Load().Stop() {
		return // the deadline has passed: the connection is being closed
	}
	c.s.gate.leave(c)
	c.touch()
	go c.watch(ctx)
}

// touch notes session data going either way.
func (c *guardedConn) touch() { c.active.Store(time.Now().UnixNano()) }

// watch closes the authenticated connection when no session data went either way for the
// idle timeout, or when the client left keepalive@openssh.com requests (sent each keepalive
// interval, one at a time) unanswered for that many intervals, like OpenSSH's
// ClientAliveInterval and ClientAliveCountMax. Keepalives are not session data: a client
// answering them is not busy. A push is never idle while its build runs: git receive-pack
// sends a keepalive packet in the session's data every receive.keepAlive seconds (default 5)
// while the pre-receive hook is quiet, and git upload-pack does likewise.
func (c *guardedConn) watch(ctx ssh.Context) {
	s := c.s
	log := s.log.With("remote_addr", c.RemoteAddr().String(), "user", userFrom(ctx))
	var tick <-chan time.Time
	if s.keepaliveInterval > 0 {
		t := time.NewTicker(s.keepaliveInterval)
		defer t.Stop()
		tick = t.C
	}
	var idle <-chan time.Time
	var idleTimer *time.Timer
	if s.idleTimeout > 0 {
		idleTimer = time.NewTimer(s.idleTimeout)
		defer idleTimer.Stop()
		idle = idleTimer.C
	}
	var answer chan error // the outstanding keepalive's, nil when none is
	missed := 0
	for {
		select {
		case <-c.done:
			return
		case <-idle:
			if left := s.idleTimeout - time.Since(time.Unix(0, c.active.Load())); left > 0 {
				idleTimer.Reset(left)
				continue
			}
			log.Info("closing idle ssh connection", "idle_timeout", s.idleTimeout)
			c.Close()
			return
		case err := <-answer:
			answer = nil
			if err != nil {
				return // the connection is gone
			}
			missed = 0
		case <-tick:
			if answer != nil {
				if missed++; missed >= s.keepaliveMaxMissed {
					log.Info("closing ssh connection: the client stopped answering keepalives",
						"unanswered_for", time.Duration(missed)*s.keepaliveInterval)
					c.Close()
					return
				}
				continue
			}
			conn, _ := ctx.Value(ssh.ContextKeyConn).(gossh.Conn)
			if conn == nil {
				continue // gliderlabs has not stored it yet: the handshake is just finishing
			}
			answer = make(chan error, 1)
			go func(answer chan<- error) {
				// Any answer will do: OpenSSH clients refuse the request, which is an answer.
				_, _, err := conn.SendRequest("keepalive@openssh.com", true, nil)
				answer <- err
			}(answer)
		}
	}
}

// activeNewChannel is a session channel whose data, read or written, touches its connection.
type activeNewChannel struct {
	gossh.NewChannel
	c *guardedConn
}

func (n activeNewChannel) Accept() (gossh.Channel, <-chan *gossh.Request, error) {
	ch, reqs, err := n.NewChannel.Accept()
	if err != nil {
		return ch, reqs, err
	}
	// Opening a channel is not activity: only data is (else empty channels, one every few
	// seconds, would hold a connection forever).
	return activeChannel{ch, n.c}, reqs, nil
}

type activeChannel struct {
	gossh.Channel
	c *guardedConn
}

func (a activeChannel) Read(p []byte) (int, error)  { return touching(a.c, a.Channel.Read, p) }
func (a activeChannel) Write(p []byte) (int, error) { return touching(a.c, a.Channel.Write, p) }
func (a activeChannel) Stderr() io.ReadWriter       { return activeStream{a.Channel.Stderr(), a.c} }

type activeStream struct {
	rw io.ReadWriter
	c  *guardedConn
}

func (a activeStream) Read(p []byte) (int, error)  { return touching(a.c, a.rw.Read, p) }
func (a activeStream) Write(p []byte) (int, error) { return touching(a.c, a.rw.Write, p) }

// touching calls f(p) and touches c when data moved.
func touching(c *guardedConn, f func([]byte) (int, error), p []byte) (int, error) {
	n, err := f(p)
	if n > 0 {
		c.touch()
	}
	return n, err
}

// validLimit checks a count option.
func validLimit(opt, what string, n int) error {
	if n <= 0 {
		return fmt.Errorf("%s: %s %d is not a positive number", opt, what, n)
	}
	return nil
}
