package receiver

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

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
