package receiver

import (
	"context"
	"io"
	"testing"

	"kpush.dev/kpush/deployer"
)

func TestEnvNames(t *testing.T) {
	for _, tc := range []struct {
		name        string
		config, env bool // valid as run-time config, as build env
	}{
		{"FOO", true, true}, {"_x9", true, true}, {"PORT", false, true}, {"K_SERVICE", false, true},
		{"9A", false, false}, {"A-B", false, false}, {"", false, false}, {"A=B", false, false},
	} {
		if got := ValidEnvName(tc.name) == nil; got != tc.config {
			t.Errorf("ValidEnvName(%q) ok = %v, want %v", tc.name, got, tc.config)
		}
		if got := ValidBuildEnvName(tc.name) == nil; got != tc.env {
			t.Errorf("ValidBuildEnvName(%q) ok = %v, want %v", tc.name, got, tc.env)
		}
	}
}

// TestConfigChangeOutlivesDisconnect: a config change or rollback whose SSH client goes away
// while the deploy runs still completes and is recorded as succeeded (not "context
// canceled"); releases:info offers `git fetch` only for release refs that exist.
func TestConfigChangeOutlivesDisconnect(t *testing.T) {
	bare, c1 := repo(t, map[string]string{"Procfile": "web: x\n"})
	store, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var started, gone chan struct{} // set per case: the deploy waits for the disconnect
	p := &Pipeline{Store: store, Repos: dirRepos{"demo": bare},
		Deployer: deployerFunc(func(ctx context.Context, r deployer.Release, _ io.Writer) (string, error) {
			close(started)
			<-gone
			if err := context.Cause(ctx); err != nil {
				return "", err
			}
			return "http://demo.example.com", nil
		})}
	if err := store.CreateApp(&App{Name: "demo", Owner: "alice", Current: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.NewRelease("demo", &Release{Kind: KindPush, Commit: c1, Image: "img@sha256:1", Status: StatusSucceeded}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		run  func(ctx context.Context) (*Release, error)
	}{
		{"config:set", func(ctx context.Context) (*Release, error) {
			return p.ChangeConfig(ctx, "demo", "alice", map[string]string{"A": "2"}, nil, io.Discard)
		}},
		{"rollback", func(ctx context.Context) (*Release, error) {
			return p.Rollback(ctx, "demo", "alice", 1, true, io.Discard)
		}},
	} {
		started, gone = make(chan struct{}), make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		type result struct {
			rel *Release
			err error
		}
		done := make(chan result, 1)
		go func() {
			rel, err := tc.run(ctx)
			done <- result{rel, err}
		}()
		<-started
		cancel()
		close(gone)
		r := <-done
		if r.err != nil {
			t.Fatalf("%s after a disconnect: %v", tc.name, r.err)
		}
		got, err := store.Release("demo", r.rel.Version)
		if err != nil || got.Status != StatusSucceeded {
			t.Errorf("%s: release %+v, %v; want succeeded", tc.name, got, err)
		}
		if !p.HasReleaseRef("demo", r.rel.Version) {
			t.Errorf("%s: v%d has no release ref, want its source kept", tc.name, r.rel.Version)
		}
	}
	if p.HasReleaseRef("demo", 1) || p.HasReleaseRef("demo", 99) {
		t.Error("HasReleaseRef is true for a release whose ref was never created")
	}
}
