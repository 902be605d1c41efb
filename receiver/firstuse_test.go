package receiver

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"kpush.dev/kpush/deployer"
)

// forgettingBuilder is a Builder that keeps per-app state and scratch directories, recording
// what the pipeline asks it to forget or clean (buildpack.Local does it for real; its own
// tests check the directories).
type forgettingBuilder struct {
	builderFunc
	forgot  []string
	cleaned []time.Time
}

func (b *forgettingBuilder) ForgetApp(app string) error { b.forgot = append(b.forgot, app); return nil }
func (b *forgettingBuilder) RemoveLeftovers(before time.Time) ([]string, error) {
	b.cleaned = append(b.cleaned, before)
	return nil, nil
}

// TestDestroyForgetsBuildCache: apps:destroy asks the builder to forget the app, so that the
// next app of that name does not start with the destroyed one's cache.
func TestDestroyForgetsBuildCache(t *testing.T) {
	store, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := &forgettingBuilder{}
	p := &Pipeline{Store: store, Builder: b}
	if err := store.CreateApp(&App{Name: "demo", Owner: "alice"}); err != nil {
		t.Fatal(err)
	}
	if err := p.Destroy(context.Background(), "demo", io.Discard); err != nil {
		t.Fatal(err)
	}
	if len(b.forgot) != 1 || b.forgot[0] != "demo" {
		t.Errorf("builder asked to forget %q, want [demo]", b.forgot)
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

// TestRemoveLeftovers: build contexts a killed process left (older than this process) are
// removed; those of apps with a build running in a live process, and newer ones, stay; the
// builder is asked to clean its own.
func TestRemoveLeftovers(t *testing.T) {
	store, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	b := &forgettingBuilder{}
	p := &Pipeline{Store: store, Builder: b, WorkDir: work}
	for _, app := range []string{"dead", "live", "my-app"} {
		if err := store.CreateApp(&App{Name: app}); err != nil {
			t.Fatal(err)
		}
	}
	// live has a pending build of this (live) process; dead's pending build is another's.
	if _, err := store.NewBuild("live", &Build{Status: StatusPending}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.NewBuild("dead", &Build{Status: StatusPending, Owner: "gone_1_x"}); err != nil {
		t.Fatal(err)
	}
	old := processStart.Add(-time.Hour)
	mk := func(name string, mtime time.Time) string {
		d := filepath.Join(work, name)
		if err := os.MkdirAll(filepath.Join(d, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(d, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, tc := range []struct {
		name  string
		mtime time.Time
		kept  bool
	}{
		{"kpush-src-dead-123", old, false},
		{"kpush-src-my-app-456", old, false},
		{"kpush-src-live-789", old, true},                         // its build runs
		{"kpush-src-dead-999", time.Now().Add(time.Minute), true}, // newer than this process
		{"other-dir", old, true},                                  // not kpush's
	} {
		mk(tc.name, tc.mtime)
		defer func() {
			_, err := os.Stat(filepath.Join(work, tc.name))
			if kept := err == nil; kept != tc.kept {
				t.Errorf("%s kept = %v, want %v", tc.name, kept, tc.kept)
			}
		}()
	}
	p.RemoveLeftovers()
	if len(b.cleaned) != 1 || !b.cleaned[0].Equal(processStart) {
		t.Errorf("builder cleaned %v, want once with the process start", b.cleaned)
	}
}

var _ Builder = (*forgettingBuilder)(nil)
