package gitserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"kpush.dev/kpush/internal/tools"
)

// ErrServerClosed is returned by Serve and ListenAndServe after Shutdown.
var ErrServerClosed = errors.New("gitserver: server closed")

// DefaultMaxPushSize is the default WithMaxPushSize: 1 GiB.
const DefaultMaxPushSize int64 = 1 << 30

// Server accepts git pushes and fetches over SSH. Repositories are bare git repositories in
// <data dir>/repos/<app>.git, created on an app's first push; the real git binary serves
// them (git receive-pack, git upload-pack). Before a push moves any ref, the server calls
// Handler.PreReceive from git's pre-receive hook.
//
// Create it with New, then call Serve or ListenAndServe; Shutdown stops it.
type Server struct {
	handler     Handler
	auth        Authenticator // nil with access
	access      Access
	commands    CommandHandler
	publicAddr  string
	log         *slog.Logger
	git         string // absolute path of the git binary
	dataDir     string // absolute
	reposDir    string // <data>/repos
	hooksDir    string // <data>/hooks, core.hooksPath of every repository
	hookArgv    []string
	maxPushSize int64

	handshakeTimeout   time.Duration
	idleTimeout        time.Duration // 0: none
	maxAuthTries       int
	keepaliveInterval  time.Duration // 0: no keepalives
	keepaliveMaxMissed int
	gate               *gate

	ssh *ssh.Server

	hookOnce sync.Once
	hookErr  error
	hookURL  string // http://127.0.0.1:port of hookSrv
	hookSrv  *http.Server

	mu     sync.Mutex
	addr   net.Addr
	closed bool
	pushes map[string]*pushState // by push ID, while git receive-pack runs
}

// Option configures a Server in New.
type Option func(*config) error

type config struct {
	dataDir     string
	keyFiles    []string
	auth        Authenticator
	access      Access
	commands    CommandHandler
	publicAddr  string
	log         *slog.Logger
	hookArgv    []string
	maxPushSize int64

	handshakeTimeout        time.Duration
	idleTimeout             time.Duration
	maxAuthTries            int
	maxUnauthenticated      int
	maxUnauthenticatedPerIP int
	keepaliveInterval       time.Duration
	keepaliveMaxMissed      int
}

// WithDataDir sets the directory the server keeps its state in (required): bare repositories
// in <dir>/repos/<app>.git, the host key in <dir>/ssh_host_ed25519_key, the shared hooks in
// <dir>/hooks. It is created (mode 0700) if missing.
func WithDataDir(dir string) Option {
	return func(c *config) error {
		if dir == "" {
			return errors.New("WithDataDir: empty directory")
		}
		c.dataDir = dir
		return nil
	}
}

// WithAuthorizedKeys lets in the public keys listed in files in OpenSSH authorized_keys format
// (see AuthorizedKeysFiles). The files are re-read on every login. It excludes
// WithAuthenticator.
func WithAuthorizedKeys(files ...string) Option {
	return func(c *config) error {
		if len(files) == 0 {
			return errors.New("WithAuthorizedKeys: no files given")
		}
		c.keyFiles = append(c.keyFiles, files...)
		return nil
	}
}

// WithAuthenticator decides which keys may log in and who they are. It excludes
// WithAuthorizedKeys.
func WithAuthenticator(a Authenticator) Option {
	return func(c *config) error {
		if a == nil {
			return errors.New("WithAuthenticator: nil Authenticator")
		}
		c.auth = a
		return nil
	}
}

// WithAccess makes a the judge of who is who and who may do what, instead of
// WithAuthorizedKeys or WithAuthenticator (it excludes both). Every client whose public key
// signature verifies gets in (RSA only with rsa-sha2-256/512 signatures); then, before
// anything else, a key a does not know is answered with "key SHA256:… is not registered; ask
// an admin to run: ssh -p PORT git@HOST keys:add NAME --user USER < key.pub" and exit status
// 1. git upload-pack needs access.RoleRead on the app, git receive-pack access.RoleDeploy;
// a push to an app that does not exist yet creates it, and its pusher gets access.RoleAdmin.
// A refusal prints the *access.DeniedError text (user, app, role) and exits 1.
func WithAccess(a Access) Option {
	return func(c *config) error {
		if a == nil {
			return errors.New("WithAccess: nil Access")
		}
		c.access = a
		return nil
	}
}

// WithCommandHandler gives SSH exec requests that are not git services
// (`ssh git@host apps:info demo`) to h, with the command line split like a POSIX shell would.
// Without it such commands are refused. Interactive shells are refused either way.
func WithCommandHandler(h CommandHandler) Option {
	return func(c *config) error {
		if h == nil {
			return errors.New("WithCommandHandler: nil CommandHandler")
		}
		c.commands = h
		return nil
	}
}

// WithPublicAddr sets the "host:port" clients reach the server at (e.g. behind a load
// balancer), used in messages that tell people which ssh command to run. Default: the local
// address of the client's connection.
func WithPublicAddr(hostPort string) Option {
	return func(c *config) error {
		if _, _, err := net.SplitHostPort(hostPort); err != nil {
			return fmt.Errorf("WithPublicAddr: want host:port: %w", err)
		}
		c.publicAddr = hostPort
		return nil
	}
}

// WithLogger sets where the server logs (default: nowhere). Lines about a push carry
// push_id, app, user and remote_addr.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		c.log = l
		return nil
	}
}

// WithHookCommand sets the command (argv, argv[0] an absolute path) that the repositories'
// pre-receive hook execs; it must call RunHook with hook name "pre-receive". The default is
// this executable followed by "hook", "pre-receive" (`kpush hook pre-receive`).
func WithHookCommand(argv ...string) Option {
	return func(c *config) error {
		if len(argv) == 0 || !filepath.IsAbs(argv[0]) {
			return fmt.Errorf("WithHookCommand: want an absolute program path and its arguments, got %q", argv)
		}
		c.hookArgv = argv
		return nil
	}
}

// WithMaxPushSize limits the size of one push's pack in bytes (git's receive.maxInputSize);
// git refuses larger pushes. Default DefaultMaxPushSize (1 GiB).
func WithMaxPushSize(bytes int64) Option {
	return func(c *config) error {
		if bytes <= 0 {
			return fmt.Errorf("WithMaxPushSize: %d is not a positive number of bytes", bytes)
		}
		c.maxPushSize = bytes
		return nil
	}
}

// WithHandshakeTimeout sets how long a TCP connection may take from its first byte to a
// completed SSH authentication before it is closed. Default DefaultHandshakeTimeout (30s).
func WithHandshakeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("WithHandshakeTimeout: %s is not a positive duration", d)
		}
		c.handshakeTimeout = d
		return nil
	}
}

// WithIdleTimeout closes an authenticated connection when no session data went either way for
// d; 0 never does. SSH keepalives are not session data. Pushes are not idle while their build
// runs (git sends keepalive packets in the session's data). Default DefaultIdleTimeout (10m).
func WithIdleTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("WithIdleTimeout: %s is negative (0 turns the idle timeout off)", d)
		}
		c.idleTimeout = d
		return nil
	}
}

// WithMaxAuthTries sets how many failed authentication attempts a connection gets before it is
// closed (every public key a client offers and the server refuses is one). Default
// DefaultMaxAuthTries (6, as OpenSSH's sshd).
func WithMaxAuthTries(n int) Option {
	return func(c *config) error {
		if err := validLimit("WithMaxAuthTries", "attempts", n); err != nil {
			return err
		}
		c.maxAuthTries = n
		return nil
	}
}

// WithUnauthenticatedLimits caps the connections that have not authenticated yet: total in
// all, perIP from one source IP address. A connection over either limit is closed at once and
// logged (Warn, with remote_addr and the limit, at most one line per limit every 10 s).
// Default DefaultMaxUnauthenticated (256) and DefaultMaxUnauthenticatedPerIP (64).
func WithUnauthenticatedLimits(total, perIP int) Option {
	return func(c *config) error {
		if err := validLimit("WithUnauthenticatedLimits", "total", total); err != nil {
			return err
		}
		if err := validLimit("WithUnauthenticatedLimits", "per IP", perIP); err != nil {
			return err
		}
		c.maxUnauthenticated, c.maxUnauthenticatedPerIP = total, perIP
		return nil
	}
}

// WithKeepalive makes the server send a keepalive@openssh.com request every interval on an
// authenticated connection and close it when maxMissed intervals passed without an answer (a
// client gone without a word, e.g. behind a dropped network path); interval 0 sends none.
// Default DefaultKeepaliveInterval (15s) and DefaultKeepaliveMaxMissed (3).
func WithKeepalive(interval time.Duration, maxMissed int) Option {
	return func(c *config) error {
		if interval < 0 {
			return fmt.Errorf("WithKeepalive: interval %s is negative (0 sends no keepalives)", interval)
		}
		if err := validLimit("WithKeepalive", "unanswered intervals", maxMissed); err != nil {
			return err
		}
		c.keepaliveInterval, c.keepaliveMaxMissed = interval, maxMissed
		return nil
	}
}

// New returns a Server that gives pushes to h. It needs WithDataDir and one of
// WithAccess, WithAuthorizedKeys or WithAuthenticator. It creates the data directory, the host key (on
// first start; the same key is used on every later start) and the pre-receive hook, and finds
// the git binary (internal/tools: $KPUSH_TOOLS, .tools/bin, $PATH).
func New(h Handler, opts ...Option) (*Server, error) {
	if h == nil {
		return nil, errors.New("gitserver.New: nil Handler")
	}
	c := config{maxPushSize: DefaultMaxPushSize,
		handshakeTimeout: DefaultHandshakeTimeout, idleTimeout: DefaultIdleTimeout, maxAuthTries: DefaultMaxAuthTries,
		maxUnauthenticated: DefaultMaxUnauthenticated, maxUnauthenticatedPerIP: DefaultMaxUnauthenticatedPerIP,
		keepaliveInterval: DefaultKeepaliveInterval, keepaliveMaxMissed: DefaultKeepaliveMaxMissed}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if c.dataDir == "" {
		return nil, errors.New("gitserver.New: no data directory: pass WithDataDir")
	}
	switch {
	case c.access != nil && (c.auth != nil || c.keyFiles != nil):
		return nil, errors.New("gitserver.New: WithAccess excludes WithAuthorizedKeys and WithAuthenticator: pass one")
	case c.access != nil:
	case c.auth != nil && c.keyFiles != nil:
		return nil, errors.New("gitserver.New: WithAuthorizedKeys and WithAuthenticator exclude each other: pass one")
	case c.keyFiles != nil:
		c.auth = AuthorizedKeysFiles(c.keyFiles)
	case c.auth == nil:
		return nil, errors.New("gitserver.New: nobody could log in: pass WithAccess, WithAuthorizedKeys or WithAuthenticator")
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.hookArgv == nil {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("finding this executable for the pre-receive hook: %w (pass WithHookCommand)", err)
		}
		c.hookArgv = []string{exe, "hook", "pre-receive"}
	}
	git, err := tools.Path("git")
	if err != nil {
		return nil, fmt.Errorf("finding git: %w", err)
	}
	dataDir, err := filepath.Abs(c.dataDir)
	if err != nil {
		return nil, fmt.Errorf("resolving data directory: %w", err)
	}
	s := &Server{
		handler:     h,
		auth:        c.auth,
		access:      c.access,
		commands:    c.commands,
		publicAddr:  c.publicAddr,
		log:         c.log,
		git:         git,
		dataDir:     dataDir,
		reposDir:    filepath.Join(dataDir, "repos"),
		hooksDir:    filepath.Join(dataDir, "hooks"),
		hookArgv:    c.hookArgv,
		maxPushSize: c.maxPushSize,
		pushes:      map[string]*pushState{},

		handshakeTimeout:   c.handshakeTimeout,
		idleTimeout:        c.idleTimeout,
		maxAuthTries:       c.maxAuthTries,
		keepaliveInterval:  c.keepaliveInterval,
		keepaliveMaxMissed: c.keepaliveMaxMissed,
		gate:               newGate(c.maxUnauthenticated, c.maxUnauthenticatedPerIP),
	}
	for _, d := range []string{dataDir, s.reposDir} { // hooksDir: installHook
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating data directory: %w", err)
		}
	}
	signer, err := loadOrCreateHostKey(filepath.Join(dataDir, HostKeyFile))
	if err != nil {
		return nil, err
	}
	if err := installHook(s.hooksDir, s.hookArgv, s.log); err != nil {
		return nil, err
	}
	s.ssh = &ssh.Server{
		Version:     "kpush",
		Handler:     s.handleSession,
		HostSigners: []ssh.Signer{signer},
		PublicKeyHandler: func(ctx ssh.Context, key ssh.PublicKey) bool {
			return s.authenticate(ctx, key)
		},
		// Every connection passes the gate of unauthenticated connections and gets the
		// handshake deadline (admit); authentication lets it out of both.
		ConnCallback: s.admit,
		ServerConfigCallback: func(ctx ssh.Context) *gossh.ServerConfig {
			cfg := &gossh.ServerConfig{PublicKeyAuthAlgorithms: pubKeyAuthAlgorithms, MaxAuthTries: s.maxAuthTries}
			if c, ok := ctx.Value(ctxKeyConn{}).(*guardedConn); ok {
				cfg.AuthLogCallback = func(_ gossh.ConnMetadata, _ string, err error) {
					if registered, _ := ctx.Value(ctxKeyRegistered{}).(bool); err == nil && registered {
						c.authenticated(ctx)
					}
				}
			}
			return cfg
		},
		// PTY requests are granted and otherwise ignored: `ssh -t git@host COMMAND` must not
		// lose the command's output. No terminal is allocated; a command's output gets "\r\n"
		// line ends instead (handleSession). git clients never ask for one.
		PtyCallback: func(ssh.Context, ssh.Pty) bool { return true },
		// nil Local/ReversePortForwardingCallback: gliderlabs refuses forwarding; the handlers
		// below also give the refusal a reason and a log line.
		ChannelHandlers: map[string]ssh.ChannelHandler{
			"session": func(srv *ssh.Server, conn *gossh.ServerConn, ch gossh.NewChannel, ctx ssh.Context) {
				if c, ok := ctx.Value(ctxKeyConn{}).(*guardedConn); ok {
					ch = activeNewChannel{ch, c} // its data keeps the connection from being idle
				}
				s.sessionChannel(srv, conn, ch, ctx)
			},
			"default": s.rejectChannel,
		},
		RequestHandlers: map[string]ssh.RequestHandler{
			"default": s.rejectGlobalRequest,
		},
		SubsystemHandlers: map[string]ssh.SubsystemHandler{
			"default": s.refuseSubsystem,
		},
		ConnectionFailedCallback: func(conn net.Conn, err error) {
			s.log.Debug("ssh handshake failed", "remote_addr", conn.RemoteAddr().String(), "err", err)
		},
	}
	return s, nil
}

// ctxKeyUser holds the user name Authenticate returned for the key the client logged in with.
type ctxKeyUser struct{}

// ctxKeyRegistered holds whether the last key the client offered (the one it logs in with) is
// registered: only then does the connection leave the unauthenticated-connection gate.
type ctxKeyRegistered struct{}

func userFrom(ctx ssh.Context) string {
	u, _ := ctx.Value(ctxKeyUser{}).(string)
	return u
}

func (s *Server) authenticate(ctx ssh.Context, key ssh.PublicKey) bool {
	if s.access != nil {
		// Any key whose signature verifies gets in, so that the session can tell the owner of an
		// unregistered key how to register it (identify). x/crypto checks the signature after
		// this returns true. Only a registered key takes the connection out of the
		// unauthenticated-connection limits and handshake deadline: an unregistered one is told
		// how to register and cut at the deadline, whatever it does meanwhile.
		_, err := s.access.UserByKey(key)
		ctx.SetValue(ctxKeyRegistered{}, err == nil)
		return true
	}
	ctx.SetValue(ctxKeyRegistered{}, true)
	user, err := s.auth.Authenticate(ctx, key)
	if err != nil {
		s.log.Info("refused public key", "remote_addr", ctx.RemoteAddr().String(),
			"fingerprint", gossh.FingerprintSHA256(key), "err", err)
		return false
	}
	// x/crypto/ssh (since v0.31) makes the last key accepted here the one the client
	// authenticates with, so the last value set is the logged-in user.
	ctx.SetValue(ctxKeyUser{}, user)
	return true
}

// ListenAndServe listens on the TCP address addr ("127.0.0.1:2222") and calls Serve.
func (s *Server) ListenAndServe(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening for ssh: %w", err)
	}
	return s.Serve(l)
}

// Serve accepts SSH connections on l until Shutdown, then returns ErrServerClosed. It closes l.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.addr = l.Addr()
	}
	s.mu.Unlock()
	if closed {
		l.Close()
		return ErrServerClosed
	}
	if err := s.startHookServer(); err != nil {
		l.Close()
		return err
	}
	s.log.Info("serving git over ssh", "addr", l.Addr().String(), "data_dir", s.dataDir)
	err := s.ssh.Serve(quickAck(l))
	if errors.Is(err, ssh.ErrServerClosed) {
		return ErrServerClosed
	}
	return err
}

// Addr returns the address of the listener Serve was last called with, or nil.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Shutdown stops accepting connections, waits for open ones (and the pushes in them) to end,
// then stops the hook endpoint. Idle SSH connections count as open: if ctx ends first it
// returns ctx.Err() with connections still open; call Close then.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	err := s.ssh.Shutdown(ctx)
	// No Serve can start the hook server after closed was set, so hookSrv is stable.
	s.hookOnce.Do(func() { s.hookErr = ErrServerClosed })
	if s.hookSrv != nil {
		if herr := s.hookSrv.Shutdown(ctx); err == nil {
			err = herr
		}
	}
	return err
}

// Close closes the listeners and every connection at once, ending the pushes in them (their
// git processes are killed), then stops the hook endpoint. Serve returns ErrServerClosed.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	err := s.ssh.Close()
	s.gate.closeAll()
	s.hookOnce.Do(func() { s.hookErr = ErrServerClosed })
	if s.hookSrv != nil {
		if herr := s.hookSrv.Close(); err == nil {
			err = herr
		}
	}
	return err
}

// startHookServer starts, once, the loopback HTTP endpoint the pre-receive hook calls.
func (s *Server) startHookServer() error {
	s.hookOnce.Do(func() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			s.hookErr = fmt.Errorf("listening for git hooks on 127.0.0.1: %w", err)
			return
		}
		mux := http.NewServeMux()
		mux.HandleFunc("POST "+hookPath, s.serveHook)
		s.hookSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second}
		s.hookURL = "http://" + l.Addr().String()
		go func() {
			if err := s.hookSrv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("hook endpoint stopped", "err", err)
			}
		}()
	})
	return s.hookErr
}
