package receiver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"time"

	"kpush.dev/kpush/gitserver"
)

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
		return nil, userErrorf("app %s has no release v%d; list them with: %s releases %s", app, n, p.sshHint(), app)
	}
	if err != nil {
		return nil, p.internal(app, "reading the release", err)
	}
	return r, nil
}

// HasReleaseRef reports whether release n of app has its source kept at its release ref
// (refs/kpush/releases/vN) in the app's repository.
func (p *Pipeline) HasReleaseRef(app string, n int) bool {
	repo, ok := p.repository(app)
	if !ok {
		return false
	}
	v, err := repo.Ref(ReleaseRef(n))
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
	if repo, ok := p.repository(a.Name); ok && rel.Commit != "" {
		if err := keepSource(ctx, repo, rel); err != nil {
			log.Warn("keeping the release's source", "err", err)
		}
	}
	fmt.Fprintf(out, "-----> %s: v%d of %s\n", rel.Description, rel.Version, a.Name)
	if err := p.deployRelease(ctx, log, a.Name, rel, time.Now(), out, nil, plan); err != nil {
		return rel, &Error{Msg: fmt.Sprintf("v%d failed: %v", rel.Version, err)}
	}
	return rel, nil
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
