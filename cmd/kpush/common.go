package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"kpush.dev/kpush/gitserver"
	"kpush.dev/kpush/gitserver/access"
	"kpush.dev/kpush/receiver"
	"kpush.dev/kpush/receiver/commands"
	"kpush.dev/kpush/receiver/lease"
)

// gitConfig is what both modes share: where git pushes arrive and who may push.
type gitConfig struct {
	DataDir        string
	SSHAddr        string
	AuthorizedKeys []string
	// LeaseTTL is how long an app's build lease outlives its holder's last renewal: how long
	// a crashed server blocks the app's pushes at most.
	LeaseTTL time.Duration
}

func (c *gitConfig) flags(fs *pflag.FlagSet, defData, defSSH string) {
	fs.StringVar(&c.DataDir, "data", envOr("DATA", defData), "data dir: repositories, host key, build caches, state (env KPUSH_DATA)")
	fs.StringVar(&c.SSHAddr, "ssh-addr", envOr("SSH_ADDR", defSSH), "address the SSH git server listens on (env KPUSH_SSH_ADDR)")
	var keys []string
	if v := os.Getenv("KPUSH_AUTHORIZED_KEYS"); v != "" {
		keys = filepath.SplitList(v)
	}
	fs.StringArrayVar(&c.AuthorizedKeys, "authorized-keys", keys, "OpenSSH public keys file allowed to push; repeatable (env KPUSH_AUTHORIZED_KEYS, ':'-separated)")
	ttl := lease.DefaultTTL
	if v := os.Getenv("KPUSH_LEASE_TTL"); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			ttl = d
		}
	}
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", ttl, "how long an app's build lease outlives a server that stopped renewing it (crashed): the longest a dead server blocks pushes (env KPUSH_LEASE_TTL)")
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
// letting running pushes finish for up to grace. It opens the app state (<data>/state/apps)
// and the access store (<data>/state/access.json), registers the authorized keys as server
// admins, and serves the SSH commands (receiver/commands) beside git.
func serveGit(ctx context.Context, c gitConfig, p *receiver.Pipeline, log *slog.Logger, grace time.Duration) error {
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
	defer store.Close()
	p.Store, p.Access = store, acc
	cmds := &commands.Handler{Apps: p, Access: acc, SSH: sshHint(c.SSHAddr)}
	srv, err := gitserver.New(p,
		gitserver.WithDataDir(c.DataDir),
		gitserver.WithAccess(acc),
		gitserver.WithCommandHandler(cmds),
		gitserver.WithLogger(log),
	)
	if err != nil {
		return err
	}
	p.Repos = srv
	l, err := net.Listen("tcp", c.SSHAddr)
	if err != nil {
		return fmt.Errorf("listening for SSH: %w", err)
	}
	log.Info("git over SSH", "addr", l.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down", "grace", grace)
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	return nil
}

// sshHint is how people reach the server at addr, for messages: "ssh -p 2222 git@127.0.0.1".
func sshHint(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "ssh git@HOST"
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "HOST"
	}
	if port == "22" {
		return "ssh git@" + host
	}
	return "ssh -p " + port + " git@" + host
}

func portOf(addr string) (int, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}
