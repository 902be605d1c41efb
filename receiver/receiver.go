// Package receiver turns one accepted `git push` into a running release: it decides which
// ref update deploys, builds that exact commit with Cloud Native Buildpacks, deploys the
// image by digest and prints the URL — all inside the pre-receive hook, so that the branch
// moves only when build and deploy succeeded (githooks(5), pre-receive).
package receiver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/gitserver"
)

// Builder builds a source tree into an image. buildpack.Local implements it.
type Builder interface {
	Build(ctx context.Context, req buildpack.Request, out io.Writer) (buildpack.Result, error)
}

// Pipeline is the gitserver.Handler that builds and deploys pushes to an app's deploy branch.
// The deploy branch is the branch HEAD points at: the first branch ever pushed to the app.
// Pushes to other branches and tags are stored without a build.
type Pipeline struct {
	Builder  Builder
	Deployer deployer.Deployer
	// Registry is the repository prefix images are published under: an app's images go to
	// "<Registry>/<app>", e.g. "127.0.0.1:5000/kpush" → "127.0.0.1:5000/kpush/demo".
	Registry string
	// WorkDir holds the build contexts (one fresh directory per build, removed afterwards).
	// Empty means os.TempDir().
	WorkDir string
	Log     *slog.Logger

	mu    sync.Mutex
	locks map[string]chan struct{} // per app, capacity 1
}

var _ gitserver.Handler = (*Pipeline)(nil)

// PreReceive builds and deploys the push's update of the deploy branch, if it has one.
// Everything it prints reaches the pusher as "remote:" lines. A non-nil error rejects the
// whole push; the reason has already been printed to out.
func (p *Pipeline) PreReceive(ctx context.Context, push *gitserver.Push, out io.Writer) error {
	log := p.logger().With("push_id", push.ID, "app", push.App, "user", push.User)
	branch, err := deployBranch(push.Dir)
	if err != nil {
		log.Error("reading deploy branch", "err", err)
		return failf(out, push, "cannot read the app's repository")
	}

	var deploy *gitserver.RefUpdate
	for i, u := range push.Updates {
		switch {
		case u.Name == branch:
			deploy = &push.Updates[i]
		case u.New == gitserver.ZeroID:
			fmt.Fprintf(out, "-----> Deleted %s\n", u.Name)
		default:
			fmt.Fprintf(out, "-----> Stored %s at %s; deploys come from %s, not building\n",
				u.Name, short(u.New), strings.TrimPrefix(branch, "refs/heads/"))
		}
	}
	if deploy == nil {
		return nil
	}
	if deploy.New == gitserver.ZeroID {
		return failf(out, push, "refusing to delete the deploy branch %s of app %s\n"+
			"       to remove the app, ask an admin to destroy it", strings.TrimPrefix(branch, "refs/heads/"), push.App)
	}

	// The lock is held until git has applied (or refused) this push's ref updates, so the
	// next push of the app builds on the ref this one leaves.
	unlock, err := p.lock(ctx, push.App)
	if err != nil {
		return failf(out, push, "gave up waiting for the app's previous push: %v", err)
	}
	defer func() {
		if push.Done == nil {
			unlock()
			return
		}
		go func() { <-push.Done; unlock() }()
	}()
	// Another push may have moved the branch while this one waited for the lock; building
	// now would deploy a commit whose ref update git is about to refuse.
	if cur, err := refValue(push.Dir, branch); err != nil {
		log.Error("reading deploy branch", "err", err)
		return failf(out, push, "cannot read the app's repository")
	} else if cur != deploy.Old {
		return failf(out, push, "%s moved to %s while this push waited for another one\n"+
			"       run: git pull --rebase && git push", strings.TrimPrefix(branch, "refs/heads/"), short(cur))
	}

	start := time.Now()
	log = log.With("commit", deploy.New)
	fmt.Fprintf(out, "-----> Building %s from %s (%s), pushed by %s\n",
		push.App, strings.TrimPrefix(branch, "refs/heads/"), short(deploy.New), push.User)

	src, err := os.MkdirTemp(p.WorkDir, "kpush-src-"+push.App+"-")
	if err != nil {
		log.Error("creating build context dir", "err", err)
		return failf(out, push, "cannot prepare the build")
	}
	defer os.RemoveAll(src)
	if err := archive(ctx, push.Dir, push.GitEnv, deploy.New, src); err != nil {
		log.Error("extracting source tree", "err", err)
		return failf(out, push, "cannot read the pushed commit %s", short(deploy.New))
	}

	res, err := p.Builder.Build(ctx, buildpack.Request{
		App:       push.App,
		SourceDir: src,
		Image:     p.Registry + "/" + push.App,
	}, indent(out))
	if err != nil {
		log.Error("build failed", "err", err, "duration", time.Since(start))
		return failf(out, push, "%s", buildMessage(err))
	}
	log.Info("build finished", "image", res.Image, "duration", time.Since(start))

	fmt.Fprintf(out, "-----> Deploying %s\n", res.Image)
	url, err := p.Deployer.Deploy(ctx, deployer.Release{
		App:    push.App,
		Image:  res.Image,
		Commit: deploy.New,
		Pusher: push.User,
	}, indent(out))
	if err != nil {
		log.Error("deploy failed", "err", err)
		return failf(out, push, "deploy failed: %v\n       the previous release keeps serving", err)
	}
	log.Info("released", "url", url, "duration", time.Since(start))
	fmt.Fprintf(out, "-----> Released %s (%s) in %s\n", push.App, short(deploy.New), time.Since(start).Round(100*time.Millisecond))
	fmt.Fprintf(out, "       %s\n", url)
	return nil
}

// lock serialises pushes per app within this process. It gives up when ctx ends.
func (p *Pipeline) lock(ctx context.Context, app string) (unlock func(), err error) {
	p.mu.Lock()
	if p.locks == nil {
		p.locks = map[string]chan struct{}{}
	}
	l, ok := p.locks[app]
	if !ok {
		l = make(chan struct{}, 1)
		p.locks[app] = l
	}
	p.mu.Unlock()
	select {
	case l <- struct{}{}:
		return func() { <-l }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (p *Pipeline) logger() *slog.Logger {
	if p.Log != nil {
		return p.Log
	}
	return slog.New(slog.DiscardHandler)
}

// errRejected is returned after the reason was printed to the pusher.
var errRejected = errors.New("push rejected")

// failf prints a rejection for people, with the push ID to quote to an admin, and returns
// errRejected.
func failf(out io.Writer, push *gitserver.Push, format string, args ...any) error {
	fmt.Fprintf(out, " !     "+format+"\n", args...)
	fmt.Fprintf(out, " !     push %s rejected; nothing was deployed and the branch did not move\n", push.ID)
	return errRejected
}

// buildMessage phrases a build error for the pusher.
func buildMessage(err error) string {
	var be *buildpack.Error
	if errors.As(err, &be) && be.Hint != "" {
		return be.Msg + "\n !     hint: " + be.Hint
	}
	if errors.Is(err, context.Canceled) {
		return "build cancelled: the connection closed"
	}
	return err.Error()
}

func short(oid string) string {
	if len(oid) > 7 {
		return oid[:7]
	}
	return oid
}
