package receiver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/gitserver"
)

// dirRepos maps app names to existing bare repositories. It stands in for gitserver.Server's
// repository store, which needs a running SSH server; test/ runs the real one.
type dirRepos map[string]string

func (r dirRepos) RepoDir(app string) (string, bool) { d, ok := r[app]; return d, ok }
func (r dirRepos) CreateRepo(context.Context, string) (string, error) {
	return "", errors.New("dirRepos: create not supported")
}
func (r dirRepos) DeleteRepo(app string) error { delete(r, app); return nil }

// TestReleaseSemantics drives pushes, config changes, a rebuild and a rollback through one
// app. The builder and deployer are func adapters: they record what they were asked to build
// and deploy, and inject a deploy failure (test/ runs the real ones end to end).
func TestReleaseSemantics(t *testing.T) {
	bare, c1 := repo(t, map[string]string{"Procfile": "web: sleep 1\n"})
	run(t, bare, "git", "update-ref", "refs/heads/main", c1)
	ctx := context.Background()
	store, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var (
		builds    []buildpack.Request
		deploys   []deployer.Release
		deployErr error
	)
	digest := func(n int) string {
		return fmt.Sprintf("127.0.0.1:5000/kpush/demo@sha256:%064d", n)
	}
	p := &Pipeline{
		Store:    store,
		Repos:    dirRepos{"demo": bare},
		Registry: "127.0.0.1:5000/kpush",
		Builder: builderFunc(func(_ context.Context, r buildpack.Request, out io.Writer) (buildpack.Result, error) {
			builds = append(builds, r)
			fmt.Fprintf(out, "building #%d\n", len(builds))
			return buildpack.Result{Image: digest(len(builds))}, nil
		}),
		Deployer: deployerFunc(func(_ context.Context, r deployer.Release, _ io.Writer) (string, error) {
			if deployErr != nil {
				return "", deployErr
			}
			deploys = append(deploys, r)
			return "http://demo.example.com", nil
		}),
	}
	if err := store.CreateApp(&App{Name: "demo", Owner: "alice"}); err != nil {
		t.Fatal(err)
	}

	// Config before any release is only stored.
	rel, err := p.ChangeConfig(ctx, "demo", "alice", map[string]string{"A": "1"}, nil, io.Discard)
	if err != nil || rel != nil {
		t.Fatalf("config:set before a release = %+v, %v; want no release", rel, err)
	}

	// v1: a push builds with the build env and deploys with the config.
	var out bytes.Buffer
	push := &gitserver.Push{ID: "p1", App: "demo", Dir: bare, User: "alice",
		Updates: []gitserver.RefUpdate{{Old: c1, New: c1, Name: "refs/heads/main"}}}
	if err := p.PreReceive(ctx, push, &out); err != nil {
		t.Fatalf("push: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "-----> Released demo v1") {
		t.Errorf("push output lacks the release number:\n%s", out.String())
	}
	logged, _ := os.ReadFile(store.BuildLog("demo", 1))
	if !strings.Contains(string(logged), "building #1") || !strings.Contains(string(logged), "Released demo v1") {
		t.Errorf("build log 1 lacks the output the pusher saw:\n%s", logged)
	}

	// v2: config:set deploys v1's image with the new env, no build.
	if _, err := p.ChangeConfig(ctx, "demo", "bob", map[string]string{"B": "2"}, nil, io.Discard); err != nil {
		t.Fatal(err)
	}
	// build env is stored for the next build only.
	if _, err := p.ChangeBuildEnv(ctx, "demo", map[string]string{"BP_X": "y"}, nil); err != nil {
		t.Fatal(err)
	}
	// v3: rebuild of the deploy branch head, with the build env.
	if _, err := p.Rebuild(ctx, "demo", "carol", "", io.Discard); err != nil {
		t.Fatal(err)
	}
	// v4: a config change whose deploy fails: recorded, config and current release unchanged.
	deployErr = errors.New("not ready")
	if _, err := p.ChangeConfig(ctx, "demo", "bob", nil, []string{"A"}, io.Discard); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Errorf("config:unset with a failing deploy: %v", err)
	}
	deployErr = nil
	// v5: rollback to v1: v1's image and v1's config.
	if _, err := p.Rollback(ctx, "demo", "alice", 1, true, io.Discard); err != nil {
		t.Fatal(err)
	}

	type want struct {
		kind, status, desc string
		image              string
		env                map[string]string
		configVersion      int
		build              int
	}
	wants := []want{
		{KindPush, StatusSucceeded, "Deploy " + c1[:7], digest(1), map[string]string{"A": "1"}, 1, 1},
		{KindConfig, StatusSucceeded, "Set B config vars", digest(1), map[string]string{"A": "1", "B": "2"}, 2, 0},
		{KindRebuild, StatusSucceeded, "Rebuild " + c1[:7], digest(2), map[string]string{"A": "1", "B": "2"}, 2, 2},
		{KindConfig, StatusFailed, "Remove A config vars", digest(2), map[string]string{"B": "2"}, 3, 0},
		{KindRollback, StatusSucceeded, "Rollback to v1", digest(1), map[string]string{"A": "1"}, 4, 0},
	}
	rels, err := p.Releases("demo")
	if err != nil {
		t.Fatal(err)
	}
	if len(rels) != len(wants) {
		t.Fatalf("%d releases, want %d: %+v", len(rels), len(wants), rels)
	}
	for i, w := range wants {
		r := rels[len(rels)-1-i]
		got := want{r.Kind, r.Status, r.Description, r.Image, r.Env, r.ConfigVersion, r.Build}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("v%d = %+v\nwant %+v", i+1, got, w)
		}
		if r.Commit != c1 {
			t.Errorf("v%d commit = %s, want %s", i+1, r.Commit, c1)
		}
		if ref := strings.TrimSpace(run(t, bare, "git", "rev-parse", r.Ref())); ref != c1 {
			t.Errorf("%s = %s, want %s", r.Ref(), ref, c1)
		}
	}
	if rels[1].Reason == "" || !strings.Contains(rels[1].Reason, "not ready") {
		t.Errorf("failed v4 reason = %q", rels[1].Reason)
	}

	// What the builder and deployer were given.
	if len(builds) != 2 || builds[0].Env != nil || !reflect.DeepEqual(builds[1].Env, map[string]string{"BP_X": "y"}) {
		t.Errorf("build envs = %v, %v; want none, then BP_X=y", builds[0].Env, builds[1].Env)
	}
	var gotDeploys []string
	for _, d := range deploys {
		gotDeploys = append(gotDeploys, fmt.Sprintf("v%d %s %v", d.Version, d.Image[len(d.Image)-1:], d.Env))
	}
	wantDeploys := []string{"v1 1 map[A:1]", "v2 1 map[A:1 B:2]", "v3 2 map[A:1 B:2]", "v5 1 map[A:1]"}
	if !reflect.DeepEqual(gotDeploys, wantDeploys) {
		t.Errorf("deploys = %q, want %q", gotDeploys, wantDeploys)
	}
	info, err := p.Info("demo")
	if err != nil {
		t.Fatal(err)
	}
	if info.Current != 5 || info.Config.Version != 4 || !reflect.DeepEqual(info.Config.Env, map[string]string{"A": "1"}) || info.Status != "deployed" {
		t.Errorf("after rollback: current v%d, config %+v, status %q; want v5, config v4 {A:1}, deployed", info.Current, info.Config, info.Status)
	}

	// Failed builds have no image to roll back to; missing releases are named.
	builderErr := errors.New("compile error")
	p.Builder = builderFunc(func(context.Context, buildpack.Request, io.Writer) (buildpack.Result, error) {
		return buildpack.Result{}, builderErr
	})
	if _, err := p.Rebuild(ctx, "demo", "alice", c1, io.Discard); err == nil {
		t.Fatal("rebuild with a failing builder succeeded")
	}
	for _, tc := range []struct {
		n    int
		want string
	}{{6, "no image to roll back to"}, {99, "has no release v99"}} {
		if _, err := p.Rollback(ctx, "demo", "alice", tc.n, true, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("rollback v%d: %v, want %q", tc.n, err, tc.want)
		}
	}
	if bs, _ := p.Builds("demo"); len(bs) != 3 || bs[0].Status != StatusFailed || bs[0].Release != 6 {
		t.Errorf("builds = %+v", bs)
	}
}
