package gitserver

import (
	"context"
	"io"
)

// ZeroID is the object name git uses for "no object" in ref updates: Old is ZeroID when a
// ref is created, New is ZeroID when it is deleted (githooks(5), pre-receive).
const ZeroID = "0000000000000000000000000000000000000000"

// RefUpdate is one line of pre-receive's standard input: "<old-oid> <new-oid> <ref-name>".
type RefUpdate struct {
	Old, New string // 40-hex object names; ZeroID for create/delete
	Name     string // full ref name, e.g. "refs/heads/main"
}

// Push is one `git push` as seen by the pre-receive hook, before any ref has moved.
type Push struct {
	ID      string      // unique per push; every log line about the push carries it as push_id
	App     string      // app name: a DNS-1035 label, the repo's name without ".git"
	Dir     string      // absolute path of the bare repository
	User    string      // who pushed: the authenticated SSH user's name
	Updates []RefUpdate // in the order git sent them
	Options []string    // `git push -o` values (receive.advertisePushOptions)
	// GitEnv holds the environment ("K=V") under which git subprocesses see the pushed objects
	// while they are still in git's quarantine: GIT_OBJECT_DIRECTORY,
	// GIT_ALTERNATE_OBJECT_DIRECTORIES and GIT_QUARANTINE_PATH (git-receive-pack(1),
	// "QUARANTINE ENVIRONMENT"). Append it to a git command's env to read New objects.
	GitEnv []string
	// Done is closed once git receive-pack has exited: the ref updates the handler accepted
	// have then been applied or refused. Hold a per-app lock until Done to serialise pushes
	// through to their ref updates, not just through pre-receive. Nil outside gitserver.
	Done <-chan struct{}
}

// Handler decides a push before its refs move. Everything written to out reaches the pusher
// live as "remote: " lines. A non-nil error rejects every ref of the push; the handler is
// expected to have told the pusher why on out already.
type Handler interface {
	PreReceive(ctx context.Context, p *Push, out io.Writer) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, p *Push, out io.Writer) error

// PreReceive calls f(ctx, p, out).
func (f HandlerFunc) PreReceive(ctx context.Context, p *Push, out io.Writer) error {
	return f(ctx, p, out)
}
