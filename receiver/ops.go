package receiver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/gitserver"
)

// The app operations behind the SSH commands. Rebuilds queue for the app's build lease like
// pushes; config changes and rollbacks take only the release lock (see coord.go), so they
// never wait for a build and land beside it. Their errors are sentences for people; internal
// detail goes to the log.

// Error is an operation's failure phrased for people.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

func userErrorf(format string, args ...any) error { return &Error{Msg: fmt.Sprintf(format, args...)} }

// internal logs err and returns an error for people that points at the log.
func (p *Pipeline) internal(app, what string, err error) error {
	p.logger().Error(what, "app", app, "err", err)
	return userErrorf("%s for app %s failed; the server log has details", what, app)
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidEnvName checks a run-time config name: a POSIX environment variable name (letters,
// digits, '_', not starting with a digit), and not PORT or K_*, which the runtimes set
// (Knative's container contract; kpush dev sets PORT too).
func ValidEnvName(name string) error {
	if err := ValidBuildEnvName(name); err != nil {
		return err
	}
	if name == "PORT" || strings.HasPrefix(name, "K_") {
		return userErrorf("%s is set by the runtime (PORT and K_* belong to Knative) and cannot be configured", name)
	}
	return nil
}

// ValidBuildEnvName checks a build-time env name: a POSIX environment variable name.
func ValidBuildEnvName(name string) error {
	if !envNameRE.MatchString(name) {
		return userErrorf("invalid variable name %q: names are letters, digits and '_', not starting with a digit", name)
	}
	return nil
}

// AppInfo is what apps:info shows.
type AppInfo struct {
	*App
	Release *Release `json:"release,omitempty"` // the current release
	Latest  *Release `json:"latest,omitempty"`  // the newest release, when it is not the current one
	Status  string   `json:"status"`            // "deployed", "not deployed", "queued", "building", "deploying", "last release failed", "last release cancelled"
}

// App returns app's record, or an error for people when it does not exist.
func (p *Pipeline) App(app string) (*App, error) {
	if err := gitserver.ValidAppName(app); err != nil {
		return nil, &Error{Msg: err.Error()}
	}
	a, err := p.Store.App(app)
	if errors.Is(err, ErrNoApp) {
		return nil, userErrorf("app %s does not exist; create it with apps:create %s or a git push", app, app)
	}
	if err != nil {
		return nil, p.internal(app, "reading the app", err)
	}
	return a, nil
}

// Apps lists every app, sorted by name.
func (p *Pipeline) Apps() ([]*App, error) {
	apps, err := p.Store.Apps()
	if err != nil {
		return nil, p.internal("", "listing apps", err)
	}
	return apps, nil
}

// Create makes an empty app: its repository and its record, with user as its admin.
func (p *Pipeline) Create(ctx context.Context, app, user string) (*App, error) {
	if err := gitserver.ValidAppName(app); err != nil {
		return nil, &Error{Msg: err.Error()}
	}
	unlock, err := p.Store.LockRelease(ctx, app, "apps:create by "+user, nil)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := p.Store.App(app); err == nil {
		return nil, userErrorf("app %s already exists", app)
	}
	if p.Repos != nil {
		if _, ok := p.Repos.RepoDir(app); ok {
			return nil, userErrorf("app %s already exists (it has a repository)", app)
		}
		if _, err := p.Repos.CreateRepo(ctx, app); err != nil {
			return nil, p.internal(app, "creating the repository", err)
		}
	}
	a, err := p.ensureApp(app, user, "", true)
	if err != nil {
		return nil, p.internal(app, "recording the app", err)
	}
	return a, nil
}

// Info returns app's record with its current and newest releases.
func (p *Pipeline) Info(app string) (*AppInfo, error) {
	a, err := p.App(app)
	if err != nil {
		return nil, err
	}
	rels, err := p.Store.Releases(app)
	if err != nil {
		return nil, p.internal(app, "reading releases", err)
	}
	info := &AppInfo{App: a, Status: "not deployed"}
	for _, r := range rels {
		if r.Version == a.Current {
			info.Release = r
		}
	}
	if a.Current > 0 {
		info.Status = "deployed"
	}
	if len(rels) > 0 && rels[0].Version != a.Current {
		info.Latest = rels[0]
		switch rels[0].Status {
		case StatusPending:
			info.Status = rels[0].Phase() // queued, building, deploying
		case StatusFailed:
			info.Status = "last release failed"
		case StatusCancelled:
			info.Status = "last release cancelled"
		}
	}
	return info, nil
}

// AppForgetter is implemented by Builders that keep state per app (buildpack.Local's build
// cache): ForgetApp removes it. Found by type assertion.
type AppForgetter interface {
	ForgetApp(app string) error
}

// Destroy removes app for good: the running release (when the Deployer implements
// deployer.Destroyer), the repository with every release's source, the build cache (when the
// Builder implements AppForgetter), the grants, the state and the app's images in the
// registry (deleteImages). What it removed is told to out.
func (p *Pipeline) Destroy(ctx context.Context, app string, out io.Writer) error {
	if _, err := p.App(app); err != nil {
		return err
	}
	// The build lease and the release lock: no build or deploy of the app runs meanwhile.
	l, err := p.leases().Acquire(ctx, app, "apps:destroy", nil)
	if err != nil {
		return userErrorf("gave up waiting for the running build of %s: %v", app, err)
	}
	defer l.Release(context.WithoutCancel(ctx))
	unlock, err := p.Store.LockRelease(ctx, app, "apps:destroy", nil)
	if err != nil {
		return err
	}
	defer unlock()
	if d, ok := p.Deployer.(deployer.Destroyer); ok {
		if err := d.Destroy(ctx, app); err != nil {
			return p.internal(app, "stopping the app", err)
		}
	}
	images := p.releaseImages(app) // read before the state goes
	if err := p.Store.RemoveApp(app); err != nil {
		return p.internal(app, "removing the app's state", err)
	}
	if p.Repos != nil {
		if err := p.Repos.DeleteRepo(app); err != nil {
			return p.internal(app, "removing the repository", err)
		}
	}
	// The build cache, so that the next app of this name starts cold rather than with
	// layers (and whatever they hold) of the destroyed one.
	if f, ok := p.Builder.(AppForgetter); ok {
		if err := f.ForgetApp(app); err != nil {
			return p.internal(app, "removing the app's build cache", err)
		}
	}
	if p.Access != nil {
		if err := p.Access.RemoveApp(app); err != nil {
			return p.internal(app, "removing the app's grants", err)
		}
	}
	if p.Registry != "" {
		repo := p.Registry + "/" + app
		n, err := p.deleteImages(ctx, repo, images)
		switch {
		case err != nil:
			fmt.Fprintf(out, "Could not delete the images of %s from the registry (%s); the server log has details\n", app, repo)
		case n == 0:
			fmt.Fprintf(out, "No images of %s left in the registry (%s)\n", app, repo)
		default:
			fmt.Fprintf(out, "Deleted %d image manifests of %s from the registry (%s); the registry frees their layers at its next garbage collection\n", n, app, repo)
		}
	}
	p.logger().Info("app destroyed", "app", app)
	return nil
}

// releaseImages returns the digests of app's release images (they may have no tag left).
func (p *Pipeline) releaseImages(app string) []string {
	rels, _ := p.Store.Releases(app)
	var out []string
	for _, r := range rels {
		if _, d, ok := strings.Cut(r.Image, "@"); ok && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// deleteImages deletes from the registry repository repo ("127.0.0.1:5000/kpush/demo") the
// manifests of every tag (OCI distribution spec: GET /v2/<name>/tags/list, then DELETE
// /v2/<name>/manifests/<digest>) and of the given digests, and returns how many it deleted. A
// repository or manifest that is gone already (404), and a registry that does not allow
// deletes (405 UNSUPPORTED), are logged and skipped. Authentication: RegistryOptions, else
// the default keychain (~/.docker/config.json).
func (p *Pipeline) deleteImages(ctx context.Context, repo string, digests []string) (int, error) {
	log := p.logger().With("repository", repo)
	r, err := name.NewRepository(repo)
	if err != nil {
		log.Error("parsing the app's image repository", "err", err)
		return 0, err
	}
	opts := append([]remote.Option{remote.WithContext(ctx)}, p.RegistryOptions...)
	if len(p.RegistryOptions) == 0 {
		opts = append(opts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	}
	skip := func(err error) bool {
		var te *transport.Error
		if errors.As(err, &te) && (te.StatusCode == http.StatusNotFound || te.StatusCode == http.StatusMethodNotAllowed) {
			log.Info("registry: nothing to delete or deletes not supported; skipping", "err", err)
			return true
		}
		return false
	}
	tags, err := remote.List(r, opts...)
	if err != nil && !skip(err) {
		log.Error("listing the app's image tags", "err", err)
		return 0, err
	}
	for _, t := range tags {
		d, err := remote.Head(r.Tag(t), opts...)
		if err != nil {
			if !skip(err) {
				log.Warn("reading an image tag", "tag", t, "err", err)
			}
			continue
		}
		if ds := d.Digest.String(); !slices.Contains(digests, ds) {
			digests = append(digests, ds)
		}
	}
	n := 0
	var firstErr error
	for _, d := range digests {
		err := remote.Delete(r.Digest(d), opts...)
		switch {
		case err == nil:
			n++
			log.Info("deleted an image manifest", "digest", d)
		case skip(err):
		default:
			log.Warn("deleting an image manifest", "digest", d, "err", err)
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	return n, firstErr
}

// Releases lists app's releases, newest first.
func (p *Pipeline) Releases(app string) ([]*Release, error) {
	if _, err := p.App(app); err != nil {
		return nil, err
	}
	rels, err := p.Store.Releases(app)
	if err != nil {
		return nil, p.internal(app, "reading releases", err)
	}
	return rels, nil
}

// ParseVersion parses "v3" or "3".
func ParseVersion(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimPrefix(s, "v"))
	if err != nil || n < 1 {
		return 0, userErrorf("%q is not a release: want vN, e.g. v3", s)
	}
	return n, nil
}

// ReleaseInfo returns release n of app.
func (p *Pipeline) ReleaseInfo(app string, n int) (*Release, error) {
	if _, err := p.App(app); err != nil {
		return nil, err
	}
	r, err := p.Store.Release(app, n)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, userErrorf("app %s has no release v%d; list them with: releases %s", app, n, app)
	}
	if err != nil {
		return nil, p.internal(app, "reading the release", err)
	}
	return r, nil
}

// Rollback deploys release n's image with release n's config as a new release (no build);
// on success the app's config becomes n's, under a new config version. Unless
// allowConfigChange (the caller is an admin of app), a rollback whose config differs from the
// app's current config is refused with an error for people naming the admin role, before
// anything is recorded and again when the release is planned.
func (p *Pipeline) Rollback(ctx context.Context, app, user string, n int, allowConfigChange bool, out io.Writer) (*Release, error) {
	target, err := p.ReleaseInfo(app, n)
	if err != nil {
		return nil, err
	}
	if target.Image == "" {
		return nil, userErrorf("v%d of %s has no image to roll back to (%s: %s)", n, app, target.Status, target.Reason)
	}
	a, err := p.App(app)
	if err != nil {
		return nil, err
	}
	configChange := func(a *App) error {
		if allowConfigChange || maps.Equal(cloneEnv(target.Env), cloneEnv(a.Config.Env)) {
			return nil
		}
		return userErrorf("rollback to v%d would change the config of %s: %s differ between v%d and the current config; "+
			"changing config needs the admin role on %s. Ask an admin of %s to run:\n  %s rollback %s v%d",
			n, app, strings.Join(envDiff(target.Env, a.Config.Env), ", "), n, app, app, p.sshHint(), app, n)
	}
	if err := configChange(a); err != nil {
		return nil, err
	}
	rel := &Release{
		Kind: KindRollback, Description: fmt.Sprintf("Rollback to v%d", n), Commit: target.Commit, Image: target.Image,
		ConfigVersion: a.Config.Version, Env: cloneEnv(target.Env), User: user, Status: StatusPending,
	}
	return p.release(ctx, a, rel, out, func(a *App, _ *Release) error {
		if err := configChange(a); err != nil {
			return err
		}
		rel.ConfigVersion = p.nextConfigVersion(a)
		return nil
	})
}

// envDiff returns the sorted names whose values differ between a and b (set in one only, or
// set to different values).
func envDiff(a, b map[string]string) []string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			out = append(out, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// detach returns a context for a config change or rollback that outlives ctx (the SSH
// session: a client that disconnects must not leave a half-done deploy recorded as failed),
// bounded by BuildTimeout (default one hour).
func (p *Pipeline) detach(ctx context.Context) (context.Context, context.CancelFunc) {
	timeout := p.BuildTimeout
	if timeout <= 0 {
		timeout = time.Hour
	}
	return context.WithTimeoutCause(context.WithoutCancel(ctx), timeout, fmt.Errorf("the deploy took longer than %s", timeout))
}

// HasReleaseRef reports whether release n of app has its source kept at its release ref
// (refs/kpush/releases/vN) in the app's repository.
func (p *Pipeline) HasReleaseRef(app string, n int) bool {
	dir, ok := p.repoDir(app)
	if !ok {
		return false
	}
	v, err := refValue(dir, ReleaseRef(n))
	return err == nil && v != gitserver.ZeroID
}

// nextConfigVersion numbers a new config of a: one more than any config version the app or
// its releases (failed ones included) have used, so a version always names one env.
func (p *Pipeline) nextConfigVersion(a *App) int {
	n := a.Config.Version
	if rels, err := p.Store.Releases(a.Name); err == nil {
		for _, r := range rels {
			n = max(n, r.ConfigVersion)
		}
	}
	return n + 1
}

// release stores rel (pending, with its image) as the next release, keeps its source ref and
// deploys it under the app's release lock, after plan has completed it from the app's state
// then (deployRelease). It does not wait for a running build.
func (p *Pipeline) release(ctx context.Context, a *App, rel *Release, out io.Writer, plan releasePlan) (*Release, error) {
	ctx, cancel := p.detach(ctx)
	defer cancel()
	if _, err := p.Store.NewRelease(a.Name, rel); err != nil {
		return nil, p.internal(a.Name, "recording the release", err)
	}
	log := p.logger().With("app", a.Name, "user", rel.User, "release", rel.Version, "kind", rel.Kind)
	if dir, ok := p.repoDir(a.Name); ok && rel.Commit != "" {
		if err := p.keepSource(ctx, dir, nil, rel); err != nil {
			log.Warn("keeping the release's source", "err", err)
		}
	}
	fmt.Fprintf(out, "-----> %s: v%d of %s\n", rel.Description, rel.Version, a.Name)
	if err := p.deployRelease(ctx, log, a.Name, rel, time.Now(), out, nil, plan); err != nil {
		return rel, &Error{Msg: fmt.Sprintf("v%d failed: %v", rel.Version, err)}
	}
	return rel, nil
}

func (p *Pipeline) repoDir(app string) (string, bool) {
	if p.Repos == nil {
		return "", false
	}
	return p.Repos.RepoDir(app)
}

// ChangeConfig sets and unsets run-time config vars of app. The new config version is
// deployed with the current release's image as a new release (no build); it becomes the
// app's config only when that deploy succeeds. An app with no release yet just stores it.
// It returns the new release, or nil when nothing was deployed.
func (p *Pipeline) ChangeConfig(ctx context.Context, app, user string, set map[string]string, unset []string, out io.Writer) (*Release, error) {
	for k := range set {
		if err := ValidEnvName(k); err != nil {
			return nil, err
		}
	}
	for _, k := range unset {
		if err := ValidEnvName(k); err != nil {
			return nil, err
		}
	}
	a, err := p.App(app)
	if err != nil {
		return nil, err
	}
	change := func(cur map[string]string) map[string]string {
		env := maps.Clone(cur)
		if env == nil {
			env = map[string]string{}
		}
		maps.Copy(env, set)
		for _, k := range unset {
			delete(env, k)
		}
		return cloneEnv(env)
	}
	env := change(a.Config.Env)
	if maps.Equal(env, cloneEnv(a.Config.Env)) {
		fmt.Fprintf(out, "-----> Config of %s unchanged (v%d); nothing to release\n", app, a.Config.Version)
		return nil, nil
	}
	var desc string
	switch {
	case len(set) > 0 && len(unset) == 0:
		desc = "Set " + strings.Join(slices.Sorted(maps.Keys(set)), ", ") + " config vars"
	case len(unset) > 0 && len(set) == 0:
		desc = "Remove " + strings.Join(unset, ", ") + " config vars"
	default:
		desc = "Update config vars"
	}
	if a.Current == 0 {
		// No release to deploy yet: store the config for the first deploy, under the release
		// lock so that a first deploy running now either uses it or is followed by it.
		dctx, cancel := p.detach(ctx)
		defer cancel()
		unlock, err := p.Store.LockRelease(dctx, app, "config change by "+user, nil)
		if err != nil {
			return nil, err
		}
		a, err = p.Store.UpdateApp(app, func(a *App) error {
			if a.Current == 0 {
				a.Config = Config{Version: a.Config.Version + 1, Env: change(a.Config.Env)}
			}
			return nil
		})
		unlock()
		if err != nil {
			return nil, p.internal(app, "storing config", err)
		}
		if a.Current == 0 {
			fmt.Fprintf(out, "-----> %s of %s (config v%d); no release yet, the first deploy uses it\n", desc, app, a.Config.Version)
			return nil, nil
		}
	}
	cur, err := p.Store.Release(app, a.Current)
	if err != nil {
		return nil, p.internal(app, "reading the current release", err)
	}
	rel := &Release{
		Kind: KindConfig, Description: desc, Commit: cur.Commit, Image: cur.Image,
		ConfigVersion: a.Config.Version, Env: env, User: user, Status: StatusPending,
	}
	// Planned again under the release lock on what serves then: the current image (a push
	// that landed meanwhile is kept) and the current config with this change applied.
	return p.release(ctx, a, rel, out, func(a *App, cur *Release) error {
		if cur == nil {
			return userErrorf("app %s has no current release to change the config of", app)
		}
		rel.Commit, rel.Image = cur.Commit, cur.Image
		rel.Env, rel.ConfigVersion = change(a.Config.Env), p.nextConfigVersion(a)
		return nil
	})
}

// ChangeBuildEnv sets and unsets build-time env vars of app, for its next builds. No release.
func (p *Pipeline) ChangeBuildEnv(ctx context.Context, app string, set map[string]string, unset []string) (*App, error) {
	for k := range set {
		if err := ValidBuildEnvName(k); err != nil {
			return nil, err
		}
	}
	if _, err := p.App(app); err != nil {
		return nil, err
	}
	a, err := p.Store.UpdateApp(app, func(a *App) error {
		env := maps.Clone(a.BuildEnv)
		if env == nil {
			env = map[string]string{}
		}
		maps.Copy(env, set)
		for _, k := range unset {
			delete(env, k)
		}
		a.BuildEnv = cloneEnv(env)
		return nil
	})
	if err != nil {
		return nil, p.internal(app, "storing build env", err)
	}
	return a, nil
}

// Rebuild builds rev (a commit, branch, tag or vN; default: the deploy branch's head) from
// the app's repository and deploys it as a new release, without a push.
func (p *Pipeline) Rebuild(ctx context.Context, app, user, rev string, out io.Writer) (*Release, error) {
	a, err := p.App(app)
	if err != nil {
		return nil, err
	}
	dir, ok := p.repoDir(app)
	if !ok {
		return nil, userErrorf("app %s has no repository to build from; git push to it first", app)
	}
	if rev == "" {
		if a.DeployBranch == "" {
			return nil, userErrorf("nothing was pushed to app %s yet; git push to it first", app)
		}
		rev = "refs/heads/" + a.DeployBranch
	} else if n, err := ParseVersion(rev); err == nil && strings.HasPrefix(rev, "v") {
		rev = ReleaseRef(n)
	}
	commit, err := resolveCommit(ctx, dir, rev)
	if err != nil {
		return nil, &Error{Msg: err.Error()}
	}
	rel := &Release{
		Kind: KindRebuild, Description: "Rebuild " + short(commit), Commit: commit,
		ConfigVersion: a.Config.Version, Env: cloneEnv(a.Config.Env), User: user, Status: StatusPending,
	}
	if _, err := p.Store.NewRelease(app, rel); err != nil {
		return nil, p.internal(app, "recording the release", err)
	}
	log := p.logger().With("app", app, "user", user, "release", rel.Version, "kind", rel.Kind, "commit", commit)
	if err := p.keepSource(ctx, dir, nil, rel); err != nil {
		log.Warn("keeping the release's source", "err", err)
	}
	l, err := p.holdBuild(ctx, log, app, rel, out)
	if err != nil {
		p.fail(log, app, rel, nil, nil, err.Error())
		return rel, &Error{Msg: fmt.Sprintf("v%d %v", rel.Version, err)}
	}
	defer l.Release(context.WithoutCancel(ctx))
	if a, err = p.App(app); err != nil { // the build env as it is now
		return rel, p.fail(log, app, rel, nil, nil, err.Error())
	}
	fmt.Fprintf(out, "-----> Rebuilding %s at %s (%s), release v%d\n", app, rev, short(commit), rel.Version)
	if err := p.buildAndDeploy(ctx, log, a, rel, l, false, dir, nil, out); err != nil {
		return rel, &Error{Msg: fmt.Sprintf("v%d failed: %v", rel.Version, err)}
	}
	return rel, nil
}

// Builds lists app's builds, newest first.
func (p *Pipeline) Builds(app string) ([]*Build, error) {
	if _, err := p.App(app); err != nil {
		return nil, err
	}
	bs, err := p.Store.Builds(app)
	if err != nil {
		return nil, p.internal(app, "reading builds", err)
	}
	return bs, nil
}

// followPoll is how often BuildOutput looks for more output of a running build.
const followPoll = 200 * time.Millisecond

// BuildOutput writes build n's log to w (n = 0: the newest build). With follow, it keeps
// writing what a running build adds until its release is decided (the log ends with the
// deploy's output) or ctx ends.
func (p *Pipeline) BuildOutput(ctx context.Context, app string, n int, follow bool, w io.Writer) error {
	bs, err := p.Builds(app)
	if err != nil {
		return err
	}
	if len(bs) == 0 {
		return userErrorf("app %s has no builds yet", app)
	}
	if n == 0 {
		n = bs[0].Number
	}
	if _, err := p.Store.Build(app, n); err != nil {
		return userErrorf("app %s has no build #%d; list them with: builds %s", app, n, app)
	}
	f, err := os.Open(p.Store.BuildLog(app, n))
	if err != nil {
		return p.internal(app, "reading the build log", err)
	}
	defer f.Close()
	for {
		// Read the status before draining, so output written before the build ended is
		// never missed.
		b, err := p.Store.Build(app, n)
		if err != nil {
			return p.internal(app, "reading the build", err)
		}
		if _, err := io.Copy(w, f); err != nil {
			return nil // the reader went away
		}
		if !follow || !p.logOpen(app, b) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(followPoll):
		}
	}
}

// logOpen reports whether build b's log may still grow: the build or its release is pending.
func (p *Pipeline) logOpen(app string, b *Build) bool {
	if b.Status == StatusPending {
		return true
	}
	r, err := p.Store.Release(app, b.Release)
	return err == nil && r.Status == StatusPending
}

// processStart is when this process started, as far as leftovers go: what a build of this
// process creates is newer.
var processStart = time.Now()

// leftoverRemover is implemented by Builders that keep per-build scratch directories
// (buildpack.Local): RemoveLeftovers removes those a killed process left, older than before.
type leftoverRemover interface {
	RemoveLeftovers(before time.Time) ([]string, error)
}

// RemoveLeftovers removes what builds of a killed kpush left behind: build contexts in
// WorkDir ("kpush-src-<app>-*") and the Builder's scratch directories (when it implements
// RemoveLeftovers). Only entries older than this process's start are candidates, and a build
// context is kept while its app has a pending build run by a live process (Store.OwnerAlive).
// Build contexts are looked for only in an explicit WorkDir: os.TempDir() may be shared with
// kpush processes of other data dirs, whose builds this Store cannot see. Call it once at
// start; it is safe beside running builds of other processes sharing the data dir. Problems
// are logged.
func (p *Pipeline) RemoveLeftovers() {
	log := p.logger()
	if r, ok := p.Builder.(leftoverRemover); ok {
		removed, err := r.RemoveLeftovers(processStart)
		for _, path := range removed {
			log.Info("removed a leftover build directory", "path", path)
		}
		if err != nil {
			log.Warn("removing leftover build directories", "err", err)
		}
	}
	work := p.WorkDir
	if work == "" {
		return
	}
	live := map[string]bool{} // apps with a pending build of a live process
	if apps, err := p.Store.Apps(); err == nil {
		for _, a := range apps {
			bs, _ := p.Store.Builds(a.Name)
			for _, b := range bs {
				if b.Status == StatusPending && p.Store.OwnerAlive(b.Owner) {
					live[a.Name] = true
				}
			}
		}
	} else {
		log.Warn("listing apps for leftover build contexts", "err", err)
		return
	}
	ents, _ := os.ReadDir(work)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "kpush-src-")
		i := strings.LastIndexByte(rest, '-')
		if !ok || i < 0 || live[rest[:i]] {
			continue
		}
		info, err := e.Info()
		if err != nil || !info.ModTime().Before(processStart) {
			continue
		}
		path := filepath.Join(work, e.Name())
		if err := os.RemoveAll(path); err != nil {
			log.Warn("removing a leftover build context", "path", path, "err", err)
			continue
		}
		log.Info("removed a leftover build context", "path", path)
	}
}
