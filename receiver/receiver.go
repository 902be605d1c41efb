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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/gitserver"
	"kpush.dev/kpush/gitserver/access"
	intarchive "kpush.dev/kpush/internal/archive"
	"kpush.dev/kpush/internal/ops"
	"kpush.dev/kpush/internal/term"
	"kpush.dev/kpush/state/lease"
)

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
// attempt is a release vN recorded in Store. Pushes and rebuilds of an app build one at a
// time under the app's lease (Leases), with at most one more queued; config changes and
// rollbacks never wait for a build, only for a release being deployed (see coord.go).
//
// The deploy branch is the branch HEAD points at: the first branch ever pushed to the app.
// Pushes to other branches and tags are stored without a build.
type Pipeline struct {
	Builder  Builder
	Deployer deployer.Deployer
	// Store keeps apps, releases, builds and the queue (a *Store from OpenStore). Required.
	Store AppState
	// Leases hands out the per-app build lease (lease.NewKube for several replicas,
	// lease.NewFile for processes sharing a data dir). Nil: lease.NewLocal, this process only.
	Leases lease.Locker
	// Repos finds, creates and deletes repositories (apps:create, apps:destroy, rebuild).
	// Nil: those operations fail.
	Repos Repos
	// Access records the creator of an app as its admin and forgets grants of destroyed apps.
	// Nil: no grants are recorded.
	Access Authorizer
	// Registry is the repository prefix images are published under: an app's images go to
	// "<Registry>/<app>", e.g. "127.0.0.1:5000/kpush" → "127.0.0.1:5000/kpush/demo".
	Registry string
	// RegistryOptions authenticate to Registry when apps:destroy deletes an app's images
	// (e.g. remote.WithAuth). Nil: the default keychain (~/.docker/config.json).
	RegistryOptions []remote.Option
	// RegistryGC, when kpush runs the registry itself (dev mode), is held by every build and
	// deploy and collects the garbage apps:destroy leaves. Nil: the registry's own business.
	RegistryGC RegistryCollector
	// WorkDir holds the build contexts (one fresh directory per build, removed afterwards).
	// Empty means os.TempDir().
	WorkDir string
	// BuildTimeout bounds one build and deploy, which outlive a pusher who disconnects
	// (unless the push asked for cancel-on-disconnect). 0: one hour.
	BuildTimeout time.Duration
	Log          *slog.Logger
	// Metrics records pushes, builds, deploys, failures and the queue length. Nil records
	// nothing.
	Metrics *ops.Metrics
	// Inflight counts the builds, deploys and release operations running, so that shutdown
	// can let them finish (ops.Tracker.Wait). Nil counts nothing.
	Inflight *ops.Tracker

	// Addr is the "host:port" people reach the SSH server at (--public-addr, else the SSH
	// listener's), for hints in messages: remote URLs, "ssh -p PORT git@HOST …". Empty:
	// HOST stands in.
	Addr string

	leaseOnce sync.Once
}

// RemoteURL is the git remote of app on the server people reach at addr (host:port):
// "ssh://git@127.0.0.1:2222/demo"; HOST stands in for an unknown or unspecified host
// (gitserver.Hint).
func RemoteURL(addr, app string) string { return gitserver.NewHint(addr, "").RemoteURL(app) }

var _ gitserver.Handler = (*Pipeline)(nil)

// checkPushOptions refuses push options kpush does not know: a misspelt one would otherwise
// be ignored without a word, and the push would not do what its pusher asked.
func checkPushOptions(opts []string) error {
	for _, o := range opts {
		if o != OptionCancelOnDisconnect {
			return userErrorf("unknown push option %.40q (of %d given): kpush knows only %q; push again without -o %.40q",
				o, len(opts), OptionCancelOnDisconnect, o)
		}
	}
	return nil
}

// OptionCancelOnDisconnect is the push option (`git push -o cancel-on-disconnect`) that
// cancels the build when the pusher disconnects; by default it goes on and its result is
// recorded (builds:output replays its log).
const OptionCancelOnDisconnect = "cancel-on-disconnect"

// PreReceive builds and deploys the push's update of the deploy branch, if it has one, as a
// new release. Everything it prints reaches the pusher as "remote:" lines. A non-nil error
// rejects the whole push; the reason has already been printed to out. The pushed commit is
// kept at refs/kpush/releases/vN whether or not the release succeeds.
//
// The release number is given on arrival. When the app's build lease is taken the push
// waits in the queue, replacing (superseding) any push waiting there; when its build ends
// and a newer push, rebuild or rollback exists, it is not deployed ("superseded by vN").
func (p *Pipeline) PreReceive(ctx context.Context, push *gitserver.Push, out io.Writer) error {
	// Buildpacks' and apps' output, failure reasons, names: nothing reaches the pusher's
	// terminal as a control sequence.
	tw := term.NewWriter(out)
	defer tw.Flush()
	out = tw
	log := p.logger().With("push_id", push.ID, "app", push.App, "user", push.User)
	result := ops.PushRejected
	defer func() { p.Metrics.PushFinished(result) }()
	repo, err := push.Repository()
	var branch string
	if err == nil {
		branch, err = repo.Head()
	}
	if err != nil {
		log.Error("reading deploy branch", "err", err)
		p.Metrics.Failure(ops.StageInternal)
		return failf(out, push, "cannot read the app's repository")
	}

	if err := checkPushOptions(push.Options); err != nil {
		log.Info("push refused", "reason", err)
		return failf(out, push, "%v", err)
	}
	var deploy *gitserver.RefUpdate
	for i, u := range push.Updates {
		switch {
		case u.Name == branch:
			deploy = &push.Updates[i]
		case strings.HasPrefix(u.Name, gitserver.HiddenRefPrefix+"/"):
			// kpush's own refs: git refuses the update right after (the repository denies
			// them), so it is not reported as stored.
		case u.New == gitserver.ZeroID:
			fmt.Fprintf(out, "-----> Deleted %s\n", term.Sanitize(u.Name))
		default:
			fmt.Fprintf(out, "-----> Stored %s at %s; deploys come from %s, not building\n",
				term.Sanitize(u.Name), short(u.New), term.Sanitize(strings.TrimPrefix(branch, "refs/heads/")))
		}
	}
	if deploy == nil {
		result = ops.PushStored
		return nil
	}
	branchName := strings.TrimPrefix(branch, "refs/heads/")
	if deploy.New == gitserver.ZeroID {
		return failf(out, push, "refusing to delete the deploy branch %s of app %s\n"+
			"       to remove the app, ask an admin to destroy it", branchName, push.App)
	}
	a, err := p.ensureApp(push.App, push.User, branchName, false)
	if err != nil {
		log.Error("recording app", "err", err)
		p.Metrics.Failure(ops.StageInternal)
		return failf(out, push, "cannot record the app's state; the server log has details")
	}
	rel := &Release{
		Kind: KindPush, Description: "Deploy " + short(deploy.New), Commit: deploy.New, PushID: push.ID,
		ConfigVersion: a.Config.Version, Env: cloneEnv(a.Config.Env), User: push.User, Status: StatusPending,
	}
	if _, err := p.Store.NewRelease(a.Name, rel); err != nil {
		log.Error("recording release", "err", err)
		p.Metrics.Failure(ops.StageInternal)
		return failf(out, push, "cannot record the release; the server log has details")
	}
	log = log.With("release", rel.Version, "commit", deploy.New)
	if err := keepSource(ctx, repo, rel); err != nil {
		log.Error("keeping the release's source", "err", err)
		p.Metrics.Failure(ops.StageSource)
		p.fail(log, a.Name, rel, nil, nil, "cannot keep the pushed source")
		return failf(out, push, "cannot keep the pushed source of v%d; the server log has details", rel.Version)
	}
	fmt.Fprintf(out, "-----> Received %s (%s) for %s, pushed by %s, release v%d\n",
		branchName, short(deploy.New), push.App, push.User, rel.Version)
	// A push made on a stale base is refused at once (git would refuse its ref update), but
	// only now: like every push, its commit is kept at its release ref.
	if err := p.checkBase(repo, branch, deploy.Old); err != nil {
		p.fail(log, a.Name, rel, nil, nil, "not built: the branch had moved since the push was made")
		return failf(out, push, "%v", err)
	}

	l, err := p.holdBuild(ctx, log, a.Name, rel, out)
	if err != nil {
		reason := err.Error()
		if ctx.Err() != nil {
			reason = "cancelled: the pusher disconnected while v" + fmt.Sprint(rel.Version) + " was queued"
		}
		log.Info("not building", "reason", reason)
		if _, ok := errors.AsType[*supersededError](err); ok {
			result = ops.PushSuperseded
		}
		p.fail(log, a.Name, rel, nil, nil, reason)
		return failf(out, push, "v%d %s", rel.Version, reason)
	}
	// The lease is held until git has applied (or refused) this push's ref updates, so the
	// next push of the app builds on the ref this one leaves.
	deployed := false
	defer func() {
		finish := func() {
			if deployed && push.Done != nil {
				p.moveBranch(log, repo, branch, deploy.Old, deploy.New)
			}
			if err := l.Release(context.Background()); err != nil {
				log.Warn("releasing the app's lease", "err", err)
			}
		}
		if push.Done == nil {
			finish()
			return
		}
		go func() { <-push.Done; finish() }()
	}()
	// Another push may have moved the branch while this one waited; building now would
	// deploy a commit whose ref update git is about to refuse.
	if err := p.checkBase(repo, branch, deploy.Old); err != nil {
		result = ops.PushSuperseded
		p.fail(log, a.Name, rel, nil, nil, "the branch moved while v"+fmt.Sprint(rel.Version)+" was queued")
		return failf(out, push, "%v", err)
	}
	if newer, err := p.newerImageRelease(a.Name, rel.Version); err == nil && newer != nil {
		se := &supersededError{Version: newer.Version, Commit: newer.Commit, User: newer.User}
		result = ops.PushSuperseded
		p.fail(log, a.Name, rel, nil, nil, se.Error())
		return failf(out, push, "v%d %v", rel.Version, se)
	}

	fmt.Fprintf(out, "-----> Building %s from %s (%s), pushed by %s, release v%d\n",
		push.App, branchName, short(deploy.New), push.User, rel.Version)
	cancelOnDisconnect := slices.Contains(push.Options, OptionCancelOnDisconnect)
	if err := p.buildAndDeploy(ctx, log, a, rel, l, cancelOnDisconnect, repo, out); err != nil {
		if _, ok := errors.AsType[*supersededError](err); ok {
			result = ops.PushSuperseded
		}
		return failf(out, push, "%s\n !     release v%d failed; its source stays fetchable: git fetch %s %s",
			err.Error(), rel.Version, RemoteURL(p.Addr, push.App), rel.Ref())
	}
	deployed = true
	result = ops.PushAccepted
	return nil
}

// checkBase fails, for people, when branch of the bare repository dir is not at old (the
// value the push was made on).
func (p *Pipeline) checkBase(repo *gitserver.Repository, branch, old string) error {
	cur, err := repo.Ref(branch)
	if err != nil {
		p.logger().Error("reading deploy branch", "dir", repo.Dir(), "err", err)
		return errors.New("cannot read the app's repository")
	}
	if cur != old {
		return fmt.Errorf("%s moved to %s while this push waited (it was made on %s)\n"+
			"       run: git pull --rebase && git push", strings.TrimPrefix(branch, "refs/heads/"), short(cur), short(old))
	}
	return nil
}

// moveBranch makes sure branch is at new after git receive-pack has exited: when the pusher
// disconnected after the build was decided, git was killed before it could move the ref, and
// the branch is moved here from old, so that ref, image and traffic still move together.
func (p *Pipeline) moveBranch(log *slog.Logger, repo *gitserver.Repository, branch, old, new string) {
	cur, err := repo.Ref(branch)
	switch {
	case err != nil:
		log.Error("reading deploy branch after the push", "err", err)
	case cur == new:
	case cur == old:
		if err := repo.UpdateRef(context.Background(), branch, new, old, "kpush: deployed after the pusher disconnected"); err != nil {
			log.Error("moving the deploy branch to the deployed commit", "err", err)
			return
		}
		log.Info("moved the deploy branch to the deployed commit: the pusher had disconnected", "ref", branch, "commit", new)
	default:
		log.Warn("deploy branch is at another commit than the one deployed", "ref", branch, "at", cur, "deployed", new)
	}
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
				// No app without an admin (the creator was removed meanwhile, say).
				if rerr := p.Store.RemoveApp(app); rerr != nil {
					err = errors.Join(err, rerr)
				}
				return nil, fmt.Errorf("granting admin on %s to its creator %s: %w", app, user, err)
			}
		}
		return a, nil
	}
	if err != nil {
		return nil, err
	}
	if a.DeployBranch == "" && branch != "" {
		return p.Store.UpdateApp(app, func(a *App) error {
			if a.DeployBranch == "" {
				a.DeployBranch = branch
			}
			return nil
		})
	}
	return a, nil
}

// buildAndDeploy builds rel.Commit of repo (seeing the push's quarantine during a push) with
// the app's build env, then deploys it as release rel with the app's config as it is then. l is the app's build lease, held by the caller. The build
// outlives ctx (the pusher going away) unless cancelOnDisconnect; losing l or builds:cancel
// stops it. Everything written to out from here on also goes to the build log. The returned
// error is phrased for people; the release and build records say how it ended.
func (p *Pipeline) buildAndDeploy(ctx context.Context, log *slog.Logger, a *App, rel *Release, l *lease.Lease, cancelOnDisconnect bool, repo *gitserver.Repository, out io.Writer) error {
	end := p.Inflight.Begin()
	defer end()
	start := time.Now()
	bctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	timeout := p.BuildTimeout
	if timeout <= 0 {
		timeout = time.Hour
	}
	bctx, tcancel := context.WithTimeoutCause(bctx, timeout, fmt.Errorf("the build and deploy took longer than %s", timeout))
	defer tcancel()
	watched := make(chan struct{})
	defer close(watched)
	var building atomic.Bool // until the deploy starts: a newer queued push cancels the build
	building.Store(true)
	go p.watchBuild(a.Name, rel, l, ctx, cancelOnDisconnect, building.Load, cancel, watched)

	b := &Build{Commit: rel.Commit, Release: rel.Version, User: rel.User, Status: StatusPending, Env: cloneEnv(a.BuildEnv)}
	if _, err := p.Store.NewBuild(a.Name, b); err != nil {
		log.Error("recording build", "err", err)
		p.Metrics.Failure(ops.StageInternal)
		return p.fail(log, a.Name, rel, nil, nil, "cannot record the build")
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
	releaseRegistry, err := p.preflight(bctx, log, a.Name)
	if err != nil {
		p.Metrics.Failure(ops.StageBuild)
		return p.fail(log, a.Name, rel, b, logw, err.Error())
	}
	defer releaseRegistry()
	prog := newProgress(out, "building", progressQuiet) // a line at least every 15 s of silence
	defer prog.Stop()
	out = prog

	src, err := os.MkdirTemp(p.WorkDir, "kpush-src-"+a.Name+"-")
	if err != nil {
		log.Error("creating build context dir", "err", err)
		p.Metrics.Failure(ops.StageInternal)
		return p.fail(log, a.Name, rel, b, logw, "cannot prepare the build")
	}
	defer os.RemoveAll(src)
	if err := repo.Archive(bctx, rel.Commit, src); err != nil {
		log.Error("extracting source tree", "err", err)
		p.Metrics.Failure(ops.StageSource)
		reason := fmt.Sprintf("cannot read commit %s", short(rel.Commit))
		if errors.Is(err, intarchive.ErrUnsafe) || errors.Is(err, intarchive.ErrLimit) {
			// About the pusher's own tree, naming only its entries: safe and useful to show.
			reason = fmt.Sprintf("commit %s was not extracted: %v", short(rel.Commit), err)
		}
		return p.fail(log, a.Name, rel, b, logw, reason)
	}
	if err := p.checkTree(log, src, out); err != nil { // LFS pointers are refused, submodules listed
		p.Metrics.Failure(ops.StageSource)
		return p.fail(log, a.Name, rel, b, logw, err.Error())
	}
	proj, err := p.project(log, src, a.BuildEnv, out)
	if err != nil {
		p.Metrics.Failure(ops.StageBuild)
		return p.fail(log, a.Name, rel, b, logw, err.Error())
	}
	bstart := time.Now()
	p.Metrics.BuildStarted()
	res, err := p.Builder.Build(bctx, buildpack.Request{
		App:       a.Name,
		SourceDir: src,
		Image:     p.Registry + "/" + a.Name,
		Env:       proj.Env,
		Group:     proj.Group,
		// The serving release's image: the lifecycle reuses its unchanged layers.
		PreviousImage: p.currentImage(a),
	}, indent(out))
	p.Metrics.BuildEnded()
	if err == nil && bctx.Err() != nil {
		err = context.Cause(bctx)
	}
	bres := ops.ResultOf(bctx, err)
	p.Metrics.BuildFinished(bres, time.Since(bstart))
	if err != nil {
		if bres == ops.ResultFailed {
			p.Metrics.Failure(ops.StageBuild)
		}
		cause := context.Cause(bctx)
		if bctx.Err() != nil && isCancelled(cause) {
			log.Info("build cancelled", "reason", cause, "duration", time.Since(start))
			err := p.failAs(log, a.Name, rel, b, logw, StatusCancelled, buildMessage(bctx, err))
			if se, ok := errors.AsType[*supersededError](cause); ok {
				return &supersededFailure{err, se}
			}
			return err
		}
		log.Error("build failed", "err", err, "duration", time.Since(start))
		return p.fail(log, a.Name, rel, b, logw, buildMessage(bctx, err))
	}
	log.Info("build finished", "image", res.Image, "duration", time.Since(start))
	b.Status, b.Finished = StatusSucceeded, time.Now().UTC()
	if err := p.Store.PutBuild(a.Name, b); err != nil {
		log.Error("recording build", "err", err)
	}
	rel.Image = res.Image
	building.Store(false)
	prog.Phase("deploying")
	return p.deployRelease(bctx, log, a.Name, rel, start, out, logw, func(a *App, _ *Release) error {
		// The image is this build's; the config is the app's as it is now, so that a
		// config change made during the build is kept.
		rel.ConfigVersion, rel.Env = a.Config.Version, cloneEnv(a.Config.Env)
		return nil
	})
}

// fail records rel (and b, if not nil) as failed with reason and returns reason as an error.
// The reason is first written to logw (the build log), if not nil.
func (p *Pipeline) fail(log *slog.Logger, app string, rel *Release, b *Build, logw io.Writer, reason string) error {
	return p.failAs(log, app, rel, b, logw, StatusFailed, reason)
}

// failAs is fail with the status to record: StatusFailed or StatusCancelled.
func (p *Pipeline) failAs(log *slog.Logger, app string, rel *Release, b *Build, logw io.Writer, status, reason string) error {
	if logw != nil {
		fmt.Fprintf(logw, " !     %s\n", reason)
	}
	rel.Status, rel.Reason = status, strings.ReplaceAll(reason, "\n !     ", "; ")
	if err := p.Store.PutRelease(app, rel); err != nil {
		log.Error("recording failed release", "err", err)
	}
	if b != nil {
		b.Status, b.Finished = status, time.Now().UTC()
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

// buildMessage phrases a build error for the pusher; ctx is the build's, whose cause says
// why a cancelled build stopped.
func buildMessage(ctx context.Context, err error) string {
	if ctx.Err() != nil {
		c := context.Cause(ctx)
		if _, ok := errors.AsType[*supersededError](c); ok {
			return c.Error() // "v2 not deployed: superseded by v3 (…); its build was cancelled …"
		}
		return "build " + c.Error()
	}
	var be *buildpack.Error
	if errors.As(err, &be) && be.Hint != "" {
		return be.Msg + "\n !     hint: " + be.Hint
	}
	return err.Error()
}

func short(oid string) string {
	if len(oid) > 7 {
		return oid[:7]
	}
	return oid
}

// currentImage returns the image of the release app a serves now, or "" when it serves none.
func (p *Pipeline) currentImage(a *App) string {
	if a.Current == 0 {
		return ""
	}
	r, err := p.Store.Release(a.Name, a.Current)
	if err != nil {
		return ""
	}
	return r.Image
}
