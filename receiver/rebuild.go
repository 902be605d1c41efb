package receiver

import (
	"context"
	"fmt"
	"io"
	"strings"
)

// Rebuild builds rev (a commit, branch, tag or vN; default: the deploy branch's head) from
// the app's repository and deploys it as a new release, without a push.
func (p *Pipeline) Rebuild(ctx context.Context, app, user, rev string, out io.Writer) (*Release, error) {
	a, err := p.App(app)
	if err != nil {
		return nil, err
	}
	repo, ok := p.repository(app)
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
	commit, err := repo.Resolve(ctx, rev)
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
	if err := keepSource(ctx, repo, rel); err != nil {
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
	if err := p.buildAndDeploy(ctx, log, a, rel, l, false, repo, out); err != nil {
		return rel, &Error{Msg: fmt.Sprintf("v%d failed: %v", rel.Version, err)}
	}
	return rel, nil
}
