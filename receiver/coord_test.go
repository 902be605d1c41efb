package receiver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/gitserver"
)

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a push and the reads of
// the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// children makes one commit per name on top of base in the bare repository, each with a
// file "which" holding the name, without moving any ref, and returns them.
func children(t *testing.T, bare, base string, names ...string) map[string]string {
	t.Helper()
	work := filepath.Join(t.TempDir(), "work")
	run(t, "", "git", "clone", "-q", bare, work)
	out := map[string]string{}
	for _, n := range names {
		run(t, work, "git", "checkout", "-q", "--detach", base)
		if err := os.WriteFile(filepath.Join(work, "which"), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
		run(t, work, "git", "add", "which")
		run(t, work, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", n)
		out[n] = strings.TrimSpace(run(t, work, "git", "rev-parse", "HEAD"))
		run(t, work, "git", "push", "-q", bare, "HEAD:refs/kpush-test/"+n)
		run(t, bare, "git", "update-ref", "-d", "refs/kpush-test/"+n)
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestQueueSupersedeAndConfigDuringBuild runs the coordination of one app in one process
// with func adapters for builder and deployer (the real ones run in test/): push A builds
// slowly; B queues behind it ("queued behind build #…"); C replaces B in the queue (B is told
// "superseded by v…"); A, which would never be deployed after B, is cancelled the moment B
// queues; config:set completes while A still builds; A is not deployed; C deploys with the config set meanwhile, planned on the config
// release. builds:cancel stops a build.
func TestQueueSupersedeAndConfigDuringBuild(t *testing.T) {
	bare, c0 := repo(t, map[string]string{"Procfile": "web: sleep 1\n"})
	run(t, bare, "git", "update-ref", "refs/heads/main", c0)
	c := children(t, bare, c0, "A", "B", "C", "D")
	store, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		deploys  []string
		bases    []int
		building = map[string]chan struct{}{} // closed when a build of that commit started
		gate     = make(chan struct{})        // A's build waits for it
	)
	for n := range c {
		building[n] = make(chan struct{})
	}
	p := &Pipeline{
		Store:    store,
		Registry: "127.0.0.1:5000/kpush",
		Builder: builderFunc(func(ctx context.Context, r buildpack.Request, _ io.Writer) (buildpack.Result, error) {
			b, _ := os.ReadFile(filepath.Join(r.SourceDir, "which"))
			which := string(b)
			if which == "" {
				which = "c0"
			} else {
				close(building[which])
			}
			if which == "A" {
				// A build step slow to stop: the lease stays held after the cancel, so B
				// waits in the queue and C can replace it there.
				<-gate
			}
			if which == "D" {
				select {
				case <-gate:
				case <-ctx.Done():
					return buildpack.Result{}, ctx.Err()
				}
			}
			return buildpack.Result{Image: "127.0.0.1:5000/kpush/demo@sha256:" + fmt.Sprintf("%064x", which)}, nil
		}),
		Deployer: baseDeployerFunc(func(_ context.Context, base, r deployer.Release, _ io.Writer) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			deploys = append(deploys, fmt.Sprintf("v%d %s %v", r.Version, strings.TrimLeft(r.Image[len(r.Image)-4:], "0"), r.Env))
			bases = append(bases, base.Version)
			return "http://demo.example.com", nil
		}),
	}
	ctx := context.Background()
	pushOf := func(id, commit string) *gitserver.Push {
		return &gitserver.Push{ID: id, App: "demo", Dir: bare, User: "alice",
			Updates: []gitserver.RefUpdate{{Old: c0, New: commit, Name: "refs/heads/main"}}}
	}
	pushAsync := func(id, commit string) (chan error, *syncBuffer) {
		out := &syncBuffer{}
		done := make(chan error, 1)
		go func() { done <- p.PreReceive(ctx, pushOf(id, commit), out) }()
		return done, out
	}

	// v1: c0 is deployed.
	if err := p.PreReceive(ctx, pushOf("p0", c0), io.Discard); err != nil {
		t.Fatal(err)
	}
	doneA, outA := pushAsync("pA", c["A"]) // v2
	<-building["A"]
	doneB, outB := pushAsync("pB", c["B"]) // v3
	waitFor(t, "B to queue", func() bool {
		return strings.Contains(outB.String(), "v3 queued behind build #2 by alice, "+c["A"][:7]+", running")
	})
	doneC, outC := pushAsync("pC", c["C"]) // v4
	waitFor(t, "C to be received", func() bool { return strings.Contains(outC.String(), "release v4") })
	select {
	case err := <-doneB:
		if err == nil || !strings.Contains(outB.String(), "v3 superseded by v4 ("+c["C"][:7]+" by alice)") {
			t.Errorf("B: %v\n%s", err, outB.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("B still waits after C replaced it in the queue")
	}

	// config:set while A builds: it does not wait for the build.
	cfgDone := make(chan error, 1)
	go func() {
		_, err := p.ChangeConfig(ctx, "demo", "bob", map[string]string{"GREETING": "hola"}, nil, io.Discard)
		cfgDone <- err
	}()
	select {
	case err := <-cfgDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("config:set waited for the running build")
	}

	close(gate)
	if err := <-doneA; err == nil || !strings.Contains(outA.String(), "v2 not deployed: superseded by v3 ("+c["B"][:7]+" by alice); its build was cancelled when v3 queued behind it") {
		t.Errorf("A: %v\n%s", err, outA.String())
	}
	if err := <-doneC; err != nil {
		t.Errorf("C: %v\n%s", err, outC.String())
	}
	mu.Lock()
	// Images end in the hex of the commit's name: 0x6330 = "c0", 0x43 = "C".
	want := []string{"v1 6330 map[]", "v5 6330 map[GREETING:hola]", "v4 43 map[GREETING:hola]"}
	if fmt.Sprint(deploys) != fmt.Sprint(want) || fmt.Sprint(bases) != fmt.Sprint([]int{0, 1, 5}) {
		t.Errorf("deploys = %q with bases %v; want %q with bases [0 1 5] (A's image never deployed)", deploys, bases, want)
	}
	mu.Unlock()
	a, _ := store.App("demo")
	if a.Current != 4 || a.Config.Env["GREETING"] != "hola" {
		t.Errorf("app = current v%d, config %v; want v4 with GREETING", a.Current, a.Config)
	}
	for v, status := range map[int]string{2: StatusCancelled, 3: StatusFailed, 4: StatusSucceeded, 5: StatusSucceeded} {
		if r, err := store.Release("demo", v); err != nil || r.Status != status {
			t.Errorf("v%d = %+v, %v; want %s", v, r, err, status)
		}
	}

	// builds:cancel stops a running build; its push is rejected with the reason.
	gate = make(chan struct{})
	doneD, outD := pushAsync("pD", c["D"]) // v6
	<-building["D"]
	if _, err := p.CancelBuild(ctx, "demo", "carol"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-doneD:
		if err == nil || !strings.Contains(outD.String(), "build cancelled by carol (builds:cancel)") {
			t.Errorf("D: %v\n%s", err, outD.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("builds:cancel did not stop the build")
	}
	if _, err := p.CancelBuild(ctx, "demo", "carol"); err == nil || !strings.Contains(err.Error(), "no build of demo is running") {
		t.Errorf("builds:cancel with nothing running: %v", err)
	}
}

type baseDeployerFunc func(ctx context.Context, base, r deployer.Release, out io.Writer) (string, error)

func (f baseDeployerFunc) Deploy(ctx context.Context, r deployer.Release, out io.Writer) (string, error) {
	return f(ctx, deployer.Release{}, r, out)
}

func (f baseDeployerFunc) DeployFrom(ctx context.Context, base, r deployer.Release, out io.Writer) (string, error) {
	return f(ctx, base, r, out)
}

// TestQueuedPushSupersededByNewerLeaseHolder: a push waiting for the build lease is
// superseded, not left waiting, when a newer push takes the lease first (the newer one left
// the queue as it took it, so the queue alone no longer says so).
func TestQueuedPushSupersededByNewerLeaseHolder(t *testing.T) {
	store, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := &Pipeline{Store: store}
	ctx := context.Background()
	if err := store.CreateApp(&App{Name: "demo"}); err != nil {
		t.Fatal(err)
	}
	newer := &Release{Kind: KindPush, Commit: strings.Repeat("9", 40), User: "carol"}
	if _, err := store.NewRelease("demo", newer); err != nil {
		t.Fatal(err)
	}
	l, err := p.leases().Acquire(ctx, "demo", leaseNote(&Release{Version: newer.Version + 1, User: "carol", Commit: newer.Commit}), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	// newer.Version+1 holds the lease; an older release waits for it.
	older := &Release{Version: newer.Version, Commit: strings.Repeat("8", 40), User: "bob"}
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		_, err := p.holdBuild(ctx, slog.New(slog.DiscardHandler), "demo", older, out)
		done <- err
	}()
	select {
	case err := <-done:
		var se *supersededError
		if !errors.As(err, &se) || se.Version != newer.Version+1 {
			t.Fatalf("holdBuild = %v, want superseded by v%d", err, newer.Version+1)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the older push still waits behind the newer lease holder:\n%s", out.String())
	}
	if strings.Contains(out.String(), "queued behind") {
		t.Errorf("told to wait behind a push that supersedes it:\n%s", out.String())
	}
}

// TestDeployFromTriesFailedBasesOnFieldConflict: when the Deployer refuses the planned base
// with an error matching deployer.ErrFieldConflict (errors.Is, however wrapped), deployFrom
// tries the failed release kpush itself deployed after it as the base; any other error, even
// one with a field conflict's words, is returned at once.
func TestDeployFromTriesFailedBasesOnFieldConflict(t *testing.T) {
	img := func(c string) string { return "127.0.0.1:5000/kpush/demo@sha256:" + strings.Repeat(c, 64) }
	for _, tc := range []struct {
		name      string
		conflict  error // DeployFrom's error for base v1
		wantBases []int
		wantErr   bool
	}{
		{"wrapped sentinel", fmt.Errorf("writing Knative Service default/demo: %w", deployer.ErrFieldConflict), []int{1, 2}, false},
		{"same words, no sentinel", errors.New("image of Knative Service default/demo was changed by someone else"), []int{1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, err := OpenStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if err := store.CreateApp(&App{Name: "demo"}); err != nil {
				t.Fatal(err)
			}
			cur := &Release{Kind: KindPush, Image: img("a"), Status: StatusSucceeded, DeployAttempted: true}
			failed := &Release{Kind: KindPush, Image: img("b"), Status: StatusFailed, DeployAttempted: true}
			rel := &Release{Kind: KindPush, Image: img("c"), Status: StatusPending}
			for _, r := range []*Release{cur, failed, rel} {
				if _, err := store.NewRelease("demo", r); err != nil {
					t.Fatal(err)
				}
			}
			var bases []int
			p := &Pipeline{Store: store, Deployer: baseDeployerFunc(func(_ context.Context, base, r deployer.Release, _ io.Writer) (string, error) {
				bases = append(bases, base.Version)
				if base.Version == cur.Version {
					return "", tc.conflict
				}
				return "http://demo.example.com", nil
			})}
			url, err := p.deployFrom(context.Background(), slog.New(slog.DiscardHandler), "demo", cur, rel, io.Discard)
			if fmt.Sprint(bases) != fmt.Sprint(tc.wantBases) {
				t.Errorf("bases tried = %v, want %v", bases, tc.wantBases)
			}
			if tc.wantErr && (err != tc.conflict || url != "") || !tc.wantErr && (err != nil || url != "http://demo.example.com") {
				t.Errorf("deployFrom = %q, %v; want the error %t", url, err, tc.wantErr)
			}
		})
	}
}
