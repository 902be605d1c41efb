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
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/gitserver"
	"kpush.dev/kpush/gitserver/access"
)

// Builder builds a source tree into an image. buildpack.Local implements it.
type Builder interface {
	Build(ctx context.Context, req buildpack.Request, out io.Writer) (buildpack.Result, error)
}

// Repos is the git server's repository store; *gitserver.Server implements it.
type Repos interface {
	// RepoDir returns the bare repository of app and whether it exists.
	RepoDir(app string) (dir string, ok bool)
	// CreateRepo creates app's empty bare repository (configured like a pushed one) and
	// returns its path.
	CreateRepo(ctx context.Context, app string) (dir string, err error)
	// DeleteRepo removes app's repository; a missing one is not an error.
	DeleteRepo(app string) error
}

// Authorizer is the part of the access store (gitserver/access.Store) the pipeline needs:
// making an app's creator its admin, and forgetting an app's grants when it is destroyed.
type Authorizer interface {
	SetGrant(app, user string, role access.Role) error
	RemoveApp(app string) error
}

// Pipeline is the gitserver.Handler that builds and deploys pushes to an app's deploy branch,
// and the app operations behind the SSH commands (config, rollback, rebuild, …). Every deploy
// attempt is a release vN recorded in Store; every operation of an app holds the app's lock,
// so pushes and commands of one app run one at a time.
//
// The deploy branch is the branch HEAD points at: the first branch ever pushed to the app.
// Pushes to other branches and tags are stored without a build.
type Pipeline struct {
	Builder  Builder
	Deployer deployer.Deployer
	// Store keeps apps, releases and builds. Required.
	Store *Store
	// Repos finds, creates and deletes repositories (apps:create, apps:destroy, rebuild).
	// Nil: those operations fail.
	Repos Repos
	// Access records the creator of an app as its admin and forgets grants of destroyed apps.
	// Nil: no grants are recorded.
	Access Authorizer
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

// PreReceive builds and deploys the push's update of the deploy branch, if it has one, as a
// new release. Everything it prints reaches the pusher as "remote:" lines. A non-nil error
// rejects the whole push; the reason has already been printed to out. The pushed commit is
// kept at refs/kpush/releases/vN whether or not the release succeeds.
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

	a, err := p.ensureApp(push.App, push.User, strings.TrimPrefix(branch, "refs/heads/"), false)
	if err != nil {
		log.Error("recording app", "err", err)
		return failf(out, push, "cannot record the app's state; the server log has details")
	}
	rel := &Release{
		Kind: KindPush, Description: "Deploy " + short(deploy.New), Commit: deploy.New,
		ConfigVersion: a.Config.Version, Env: cloneEnv(a.Config.Env), User: push.User, Status: StatusPending,
	}
	if _, err := p.Store.NewRelease(a.Name, rel); err != nil {
		log.Error("recording release", "err", err)
		return failf(out, push, "cannot record the release; the server log has details")
	}
	log = log.With("release", rel.Version, "commit", deploy.New)
	if err := p.keepSource(ctx, push.Dir, push.GitEnv, rel); err != nil {
		log.Error("keeping the release's source", "err", err)
		p.fail(log, a.Name, rel, nil, nil, "cannot keep the pushed source")
		return failf(out, push, "cannot keep the pushed source of v%d; the server log has details", rel.Version)
	}
	fmt.Fprintf(out, "-----> Building %s from %s (%s), pushed by %s, release v%d\n",
		push.App, strings.TrimPrefix(branch, "refs/heads/"), short(deploy.New), push.User, rel.Version)
	if err := p.buildAndDeploy(ctx, log, a, rel, push.Dir, push.GitEnv, out); err != nil {
		return failf(out, push, "%s\n !     release v%d failed; its source stays fetchable: git fetch <remote> %s",
			err.Error(), rel.Version, rel.Ref())
	}
	return nil
}

// ensureApp returns app's record, creating it on the app's first push or apps:create, with
// user as its owner. grant also makes user the app's admin: apps:create does; on a push the
// git server already granted it to whoever created the repository (and a repository older
// than its record must not make a mere deployer admin).
func (p *Pipeline) ensureApp(app, user, branch string, grant bool) (*App, error) {
	a, err := p.Store.App(app)
	if errors.Is(err, ErrNoApp) {
		a = &App{Name: app, Created: time.Now().UTC(), Owner: user, DeployBranch: branch}
		if err := p.Store.CreateApp(a); errors.Is(err, fs.ErrExist) {
			return p.Store.App(app)
		} else if err != nil {
			return nil, err
		}
		if grant && p.Access != nil {
			if err := p.Access.SetGrant(app, user, access.RoleAdmin); err != nil {
				return nil, fmt.Errorf("granting admin on %s to its creator %s: %w", app, user, err)
			}
		}
		return a, nil
	}
	if err != nil {
		return nil, err
	}
	if a.DeployBranch == "" && branch != "" {
		a.DeployBranch = branch
		if err := p.Store.PutApp(a); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// buildAndDeploy builds rel.Commit of the repository gitDir (gitEnv: the push's quarantine,
// nil outside a push) with the app's build env, then deploys it as release rel. Everything
// written to out from here on also goes to the build log. The returned error is phrased for
// people; the release and build records say how it ended.
func (p *Pipeline) buildAndDeploy(ctx context.Context, log *slog.Logger, a *App, rel *Release, gitDir string, gitEnv []string, out io.Writer) error {
	start := time.Now()
	b := &Build{Commit: rel.Commit, Release: rel.Version, User: rel.User, Status: StatusPending}
	if _, err := p.Store.NewBuild(a.Name, b); err != nil {
		log.Error("recording build", "err", err)
		p.fail(log, a.Name, rel, nil, nil, "cannot record the build")
		return errors.New("cannot record the build; the server log has details")
	}
	rel.Build = b.Number
	if err := p.Store.PutRelease(a.Name, rel); err != nil {
		log.Error("recording release", "err", err)
	}
	log = log.With("build", b.Number)
	var logw io.Writer // the build log alone, for the failure reason the pusher gets from failf
	logf, err := os.OpenFile(p.Store.BuildLog(a.Name, b.Number), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		log.Error("opening build log", "err", err)
	} else {
		defer logf.Close()
		out, logw = &tee{out: out, log: logf}, logf
	}
	fmt.Fprintf(out, "-----> Build #%d of %s (%s) for v%d\n", b.Number, a.Name, short(rel.Commit), rel.Version)

	src, err := os.MkdirTemp(p.WorkDir, "kpush-src-"+a.Name+"-")
	if err != nil {
		log.Error("creating build context dir", "err", err)
		return p.fail(log, a.Name, rel, b, logw, "cannot prepare the build")
	}
	defer os.RemoveAll(src)
	if err := archive(ctx, gitDir, gitEnv, rel.Commit, src); err != nil {
		log.Error("extracting source tree", "err", err)
		return p.fail(log, a.Name, rel, b, logw, fmt.Sprintf("cannot read commit %s", short(rel.Commit)))
	}
	res, err := p.Builder.Build(ctx, buildpack.Request{
		App:       a.Name,
		SourceDir: src,
		Image:     p.Registry + "/" + a.Name,
		Env:       cloneEnv(a.BuildEnv),
	}, indent(out))
	if err != nil {
		log.Error("build failed", "err", err, "duration", time.Since(start))
		return p.fail(log, a.Name, rel, b, logw, buildMessage(err))
	}
	log.Info("build finished", "image", res.Image, "duration", time.Since(start))
	b.Status, b.Finished = StatusSucceeded, time.Now().UTC()
	if err := p.Store.PutBuild(a.Name, b); err != nil {
		log.Error("recording build", "err", err)
	}
	rel.Image = res.Image
	return p.deploy(ctx, log, a, rel, start, out, logw)
}

// deploy puts rel (stored, pending, with Image and Env) into service and records how it
// ended. On success rel becomes the app's current release and its config the app's config.
// logw, if not nil, is the build log alone (out already reaches it): the failure reason goes
// there. Everything is written before the release is recorded as decided, so that
// builds:output -f, which stops then, sees it all.
func (p *Pipeline) deploy(ctx context.Context, log *slog.Logger, a *App, rel *Release, start time.Time, out, logw io.Writer) error {
	fmt.Fprintf(out, "-----> Deploying %s\n", rel.Image)
	url, err := p.Deployer.Deploy(ctx, deployer.Release{
		App: a.Name, Image: rel.Image, Commit: rel.Commit, Pusher: rel.User, Env: cloneEnv(rel.Env), Version: rel.Version,
	}, indent(out))
	if err != nil {
		log.Error("deploy failed", "err", err)
		return p.fail(log, a.Name, rel, nil, logw, fmt.Sprintf("deploy failed: %v\n       the previous release keeps serving", err))
	}
	log.Info("released", "url", url, "duration", time.Since(start))
	fmt.Fprintf(out, "-----> Released %s v%d (%s) in %s\n", a.Name, rel.Version, short(rel.Commit), time.Since(start).Round(100*time.Millisecond))
	fmt.Fprintf(out, "       %s\n", url)
	rel.Status = StatusSucceeded
	if err := p.Store.PutRelease(a.Name, rel); err != nil {
		log.Error("recording release", "err", err)
	}
	a.Current, a.URL = rel.Version, url
	a.Config = Config{Version: rel.ConfigVersion, Env: cloneEnv(rel.Env)}
	if err := p.Store.PutApp(a); err != nil {
		log.Error("recording app", "err", err)
	}
	return nil
}

// fail records rel (and b, if not nil) as failed with reason and returns reason as an error.
// The reason is first written to logw (the build log), if not nil.
func (p *Pipeline) fail(log *slog.Logger, app string, rel *Release, b *Build, logw io.Writer, reason string) error {
	if logw != nil {
		fmt.Fprintf(logw, " !     %s\n", reason)
	}
	rel.Status, rel.Reason = StatusFailed, strings.ReplaceAll(reason, "\n !     ", "; ")
	if err := p.Store.PutRelease(app, rel); err != nil {
		log.Error("recording failed release", "err", err)
	}
	if b != nil {
		b.Status, b.Finished = StatusFailed, time.Now().UTC()
		if err := p.Store.PutBuild(app, b); err != nil {
			log.Error("recording failed build", "err", err)
		}
	}
	return errors.New(reason)
}

// tee writes to the pusher and to the build log; a failing log never stops the pusher's
// output, and a pusher who went away never stops the log.
type tee struct {
	out, log io.Writer
	logErr   bool
}

func (t *tee) Write(b []byte) (int, error) {
	if !t.logErr {
		if _, err := t.log.Write(b); err != nil {
			t.logErr = true
		}
	}
	n, err := t.out.Write(b)
	if err != nil {
		return len(b), nil // the build goes on for the log; the pusher's writer is gone
	}
	return n, nil
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
