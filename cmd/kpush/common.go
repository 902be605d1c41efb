package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	gossh "golang.org/x/crypto/ssh"

	"kpush.dev/kpush/gitserver"
	"kpush.dev/kpush/gitserver/access"
	"kpush.dev/kpush/internal/sandbox"
	"kpush.dev/kpush/receiver"
	"kpush.dev/kpush/receiver/commands"
	"kpush.dev/kpush/state/lease"
)

// gitConfig is what both modes share: where git pushes arrive and who may push.
type gitConfig struct {
	DataDir        string
	SSHAddr        string
	AuthorizedKeys []string
	// LeaseTTL is how long an app's build lease outlives its holder's last renewal: how long
	// a crashed server blocks the app's pushes at most.
	LeaseTTL time.Duration
	// PublicAddr is the host:port people reach the SSH server at, for messages ("" = the
	// listener's address).
	PublicAddr string
	// Grace is how long shutdown lets running pushes and builds finish.
	Grace time.Duration
	// SSH connection limits (gitserver.WithHandshakeTimeout, WithIdleTimeout,
	// WithUnauthenticatedLimits).
	HandshakeTimeout, IdleTimeout               time.Duration
	MaxUnauthenticated, MaxUnauthenticatedPerIP int
}

// flags registers the shared flags; defGrace is the default of --shutdown-grace.
func (c *gitConfig) flags(fs *pflag.FlagSet, defData, defSSH string, defGrace time.Duration) {
	fs.StringVar(&c.DataDir, "data", defData, "data dir: repositories, host key, build caches, state (env KPUSH_DATA)")
	fs.StringVar(&c.SSHAddr, "ssh-addr", defSSH, "address the SSH git server listens on (env KPUSH_SSH_ADDR)")
	fs.StringVar(&c.PublicAddr, "public-addr", "", "HOST:PORT people reach the SSH server at (e.g. a load balancer), used in messages such as \"key not registered\" (default: the listener's address; env KPUSH_PUBLIC_ADDR)")
	fs.DurationVar(&c.Grace, "shutdown-grace", defGrace, "on SIGTERM, how long running pushes and builds may finish before kpush exits anyway (env KPUSH_SHUTDOWN_GRACE)")
	fs.StringArrayVar(&c.AuthorizedKeys, "authorized-keys", nil, "OpenSSH public keys file allowed to push; repeatable (env KPUSH_AUTHORIZED_KEYS, ':'-separated)")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", lease.DefaultTTL, "how long an app's build lease outlives a server that stopped renewing it (crashed): the longest a dead server blocks pushes (env KPUSH_LEASE_TTL)")
	fs.DurationVar(&c.HandshakeTimeout, "ssh-handshake-timeout", gitserver.DefaultHandshakeTimeout, "an SSH connection not authenticated this long after it opened is closed (env KPUSH_SSH_HANDSHAKE_TIMEOUT)")
	fs.DurationVar(&c.IdleTimeout, "ssh-idle-timeout", gitserver.DefaultIdleTimeout, "an SSH connection with no session data either way this long is closed; a push whose build runs is never idle; 0: never (env KPUSH_SSH_IDLE_TIMEOUT)")
	fs.IntVar(&c.MaxUnauthenticated, "ssh-max-unauthenticated", gitserver.DefaultMaxUnauthenticated, "most SSH connections not authenticated yet at once; more are closed at once (env KPUSH_SSH_MAX_UNAUTHENTICATED)")
	fs.IntVar(&c.MaxUnauthenticatedPerIP, "ssh-max-unauthenticated-per-ip", gitserver.DefaultMaxUnauthenticatedPerIP, "most SSH connections not authenticated yet from one IP address (env KPUSH_SSH_MAX_UNAUTHENTICATED_PER_IP)")
	bindEnv(fs, map[string]string{"data": "KPUSH_DATA", "ssh-addr": "KPUSH_SSH_ADDR", "public-addr": "KPUSH_PUBLIC_ADDR",
		"shutdown-grace": "KPUSH_SHUTDOWN_GRACE", "authorized-keys": "KPUSH_AUTHORIZED_KEYS", "lease-ttl": "KPUSH_LEASE_TTL",
		"ssh-handshake-timeout": "KPUSH_SSH_HANDSHAKE_TIMEOUT", "ssh-idle-timeout": "KPUSH_SSH_IDLE_TIMEOUT",
		"ssh-max-unauthenticated": "KPUSH_SSH_MAX_UNAUTHENTICATED", "ssh-max-unauthenticated-per-ip": "KPUSH_SSH_MAX_UNAUTHENTICATED_PER_IP"})
}

// validate joins every problem, each saying how to fix it.
func (c *gitConfig) validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data is empty: give kpush a directory for its state"))
	}
	if _, _, err := net.SplitHostPort(c.SSHAddr); err != nil {
		errs = append(errs, fmt.Errorf("--ssh-addr %q: want HOST:PORT, e.g. 127.0.0.1:2222", c.SSHAddr))
	}
	if c.LeaseTTL < time.Second {
		errs = append(errs, fmt.Errorf("--lease-ttl %s: want at least 1s, e.g. 30s", c.LeaseTTL))
	}
	if c.Grace < 0 {
		errs = append(errs, fmt.Errorf("--shutdown-grace %s: want 0 or more, e.g. 2m", c.Grace))
	}
	if c.HandshakeTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--ssh-handshake-timeout %s: want more than 0, e.g. 30s", c.HandshakeTimeout))
	}
	if c.IdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("--ssh-idle-timeout %s: want 0 (never) or more, e.g. 10m", c.IdleTimeout))
	}
	if c.MaxUnauthenticated <= 0 || c.MaxUnauthenticatedPerIP <= 0 {
		errs = append(errs, fmt.Errorf("--ssh-max-unauthenticated %d, --ssh-max-unauthenticated-per-ip %d: want more than 0, e.g. 64 and 8",
			c.MaxUnauthenticated, c.MaxUnauthenticatedPerIP))
	}
	if c.PublicAddr != "" {
		if _, _, err := net.SplitHostPort(c.PublicAddr); err != nil {
			errs = append(errs, fmt.Errorf("--public-addr %q: want HOST:PORT, e.g. git.example.com:22", c.PublicAddr))
		}
	}
	if len(c.AuthorizedKeys) == 0 {
		errs = append(errs, errors.New("no authorized keys: pass --authorized-keys FILE (an OpenSSH .pub or authorized_keys file)"))
	}
	for _, f := range c.AuthorizedKeys {
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("--authorized-keys %s: %w", f, err))
		}
	}
	return errors.Join(errs...)
}

// serveGit runs the SSH git server with the pipeline until ctx ends, then shuts it down,
// letting running pushes and builds (p.Inflight) finish for up to c.Grace. It opens the app
// state (<data>/state/apps) and the access store (<data>/state/access.json), registers the
// authorized keys as server admins — refusing to start when no server admin is left with a
// usable key — and serves the SSH commands (receiver/commands) beside git. Once listening,
// it logs the SSH host key's fingerprint and calls listening, if not nil, with it
// ("SHA256:…", as ssh-keygen -lf prints it).
func serveGit(ctx context.Context, c gitConfig, p *receiver.Pipeline, log *slog.Logger, listening func(hostKey string)) error {
	store, err := receiver.OpenStore(c.DataDir)
	if err != nil {
		return fmt.Errorf("opening app state: %w", err)
	}
	acc, err := access.Open(c.DataDir, access.WithLogger(log))
	if err != nil {
		return err
	}
	if err := acc.Bootstrap(c.AuthorizedKeys...); err != nil {
		return fmt.Errorf("registering the admins of --authorized-keys: %w", err)
	}
	if err := checkAdmins(acc, c.AuthorizedKeys); err != nil {
		return err
	}
	defer store.Close()
	p.Store, p.Access = store, acc
	p.RemoveLeftovers() // build dirs a killed kpush left in <data>/builds and <data>/tmp
	// One hint for every message that says how to reach the server (gitserver.Hint).
	hint := gitserver.NewHint(c.PublicAddr, c.SSHAddr)
	cmds := &commands.Handler{Apps: p, Access: acc, SSH: hint.Command()}
	opts := []gitserver.Option{
		gitserver.WithDataDir(c.DataDir),
		gitserver.WithAccess(acc),
		gitserver.WithCommandHandler(cmds),
		gitserver.WithLogger(log),
		gitserver.WithHandshakeTimeout(c.HandshakeTimeout),
		gitserver.WithIdleTimeout(c.IdleTimeout),
		gitserver.WithUnauthenticatedLimits(c.MaxUnauthenticated, c.MaxUnauthenticatedPerIP),
	}
	if c.PublicAddr != "" {
		opts = append(opts, gitserver.WithPublicAddr(c.PublicAddr))
	}
	srv, err := gitserver.New(p, opts...)
	if err != nil {
		return err
	}
	hostKey, err := hostKeyFingerprint(filepath.Join(c.DataDir, gitserver.HostKeyFile))
	if err != nil {
		return err
	}
	p.Repos = srv
	// Deploy branches a killed kpush did not move to the release it deployed.
	p.RecoverBranches()
	if p.Addr == "" { // for hints in messages: remote URLs, "ssh -p PORT git@HOST apps:unlock APP"
		p.Addr = hint.Addr()
	}
	l, err := net.Listen("tcp", c.SSHAddr)
	if err != nil {
		return fmt.Errorf("listening for SSH: %w", err)
	}
	log.Info("git over SSH", "addr", l.Addr().String(), "host_key", hostKey)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	if listening != nil {
		listening(hostKey)
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.Grace)
	defer cancel()
	// The first SIGINT/SIGTERM ended ctx; a second one stops at once.
	again := make(chan os.Signal, 1)
	signal.Notify(again, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(again)
	go func() {
		select {
		case sig := <-again:
			log.Warn("second signal: stopping now; running builds are abandoned", "signal", sig.String())
			cancel()
		case <-sctx.Done():
		}
	}()
	log.Info(fmt.Sprintf("stopping; builds may finish for %s; press Ctrl-C again to stop now", c.Grace),
		"grace", c.Grace, "running", p.Inflight.Running())
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("SSH connections still open at the shutdown deadline; closing them", "err", err)
		srv.Close()
	}
	// Builds outlive their pushers (receiver.Pipeline.BuildTimeout): wait for them too.
	if err := p.Inflight.Wait(sctx); err != nil {
		log.Warn("builds still running at the shutdown deadline are abandoned; their releases stay pending until the next start marks them failed", "err", err)
	}
	log.Info("stopped")
	return nil
}

// hostKeyFingerprint returns the SHA256 fingerprint ("SHA256:…", as ssh-keygen -lf prints
// it) of the SSH host private key at path.
func hostKeyFingerprint(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the SSH host key: %w", err)
	}
	signer, err := gossh.ParsePrivateKey(data)
	if err != nil {
		return "", fmt.Errorf("parsing the SSH host key %s: %w", path, err)
	}
	return gossh.FingerprintSHA256(signer.PublicKey()), nil
}

// checkAdmins returns an error for people when no server admin has a key after bootstrap:
// nobody could push or manage users. It names every key of files that the key policy
// (access.CheckKey) refused, and why.
func checkAdmins(acc *access.Store, files []string) error {
	for _, u := range acc.Users() {
		if keys, err := acc.Keys(u.Name); u.Admin && err == nil && len(keys) > 0 {
			return nil
		}
	}
	var refused []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			refused = append(refused, fmt.Sprintf("%s: %v", f, err))
			continue
		}
		for rest := data; len(bytes.TrimSpace(rest)) > 0; {
			pub, comment, _, next, err := gossh.ParseAuthorizedKey(rest)
			if err != nil {
				break // no key left
			}
			rest = next
			if err := access.CheckKey(pub); err != nil {
				what := gossh.FingerprintSHA256(pub)
				if comment != "" {
					what += " (" + comment + ")"
				}
				refused = append(refused, fmt.Sprintf("%s: %s: %v", f, what, err))
			}
		}
	}
	why := "--authorized-keys holds no public key"
	if len(refused) > 0 {
		why = "every key of --authorized-keys was refused:\n  " + strings.Join(refused, "\n  ")
	}
	return fmt.Errorf("no server admin has a usable SSH key, so nobody could push or manage kpush: %s\n"+
		"fix: make a key with `ssh-keygen -t ed25519` and pass its .pub with --authorized-keys", why)
}

func portOf(addr string) (int, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

// checkSandbox refuses to go on where this host cannot sandbox builds and apps with every
// protection (internal/sandbox.Check says what is missing and how to enable it): kpush never
// runs them with less.
func checkSandbox(ctx context.Context, dataDir string, log *slog.Logger) error {
	dir, err := filepath.Abs(dataDir)
	if err != nil {
		return err
	}
	ids, err := sandbox.NewRanges(dir).Get("kpush/check")
	if err != nil {
		return err
	}
	if err := sandbox.Check(ctx, ids); err != nil {
		return fmt.Errorf("this host cannot sandbox builds and apps: %w", err)
	}
	log.Info("sandbox check passed: builds and apps run in user, mount, PID, IPC, UTS and network namespaces with seccomp, on unprivileged host ids")
	return nil
}
