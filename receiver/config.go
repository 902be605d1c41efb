package receiver

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"kpush.dev/kpush/internal/names"
)

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
	if !names.IsEnv(name) {
		return userErrorf("invalid variable name %q: names are letters, digits and '_', not starting with a digit", name)
	}
	return nil
}

// MaxConfigSize bounds an app's config vars, names and values together (as Heroku does):
// they become the environment of every app process, which Linux caps (128 KiB for one
// "NAME=value", a quarter of the stack limit for all with the arguments), and a field of the
// Knative Service, which etcd keeps under 1.5 MiB with the rest of the object.
const MaxConfigSize = 64 << 10

func envSize(env map[string]string) int {
	n := 0
	for k, v := range env {
		n += len(k) + len(v)
	}
	return n
}

// validEnvValue refuses a value no environment can hold: one with a NUL byte.
func validEnvValue(name, value string) error {
	if strings.IndexByte(value, 0) >= 0 {
		return userErrorf("the value of %s contains a NUL byte, which no environment variable can hold; nothing was changed", name)
	}
	return nil
}

// ChangeConfig sets and unsets run-time config vars of app. The new config version is
// deployed with the current release's image as a new release (no build); it becomes the
// app's config only when that deploy succeeds. An app with no release yet just stores it.
// It returns the new release, or nil when nothing was deployed.
func (p *Pipeline) ChangeConfig(ctx context.Context, app, user string, set map[string]string, unset []string, out io.Writer) (*Release, error) {
	for k, v := range set {
		if err := ValidEnvName(k); err != nil {
			return nil, err
		}
		if err := validEnvValue(k, v); err != nil {
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
	if n := envSize(env); n > MaxConfigSize {
		return nil, userErrorf("the config vars of %s would take %d bytes of names and values, over the limit of %d (64 KiB); nothing was changed: "+
			"keep large data elsewhere (a file in the app, a database) and its location in a config var", app, n, MaxConfigSize)
	}
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
	for k, v := range set {
		if err := ValidBuildEnvName(k); err != nil {
			return nil, err
		}
		if err := validEnvValue(k, v); err != nil {
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
