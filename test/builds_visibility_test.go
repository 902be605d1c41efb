package test

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// TestDevBuildStatesAndHiddenValues, end to end against `kpush dev`:
//   - a build-env value unset after a build stays hidden from readers in that build's log;
//   - a push to refs/kpush/* is not reported as stored;
//   - a running build shows "building"; when a newer push queues behind it, it is cancelled
//     at once ("superseded by v3 (…)"), its pusher is told and exits non-zero, it shows
//     "cancelled", and the queued push, told when the holder's lease expires and how to
//     unlock, deploys without the gate ever opening;
//   - apps:unlock names the build it frees, and that build's pusher is told who ran it;
//   - the registry refuses to show the app's images without kpush's login;
//   - apps:destroy deletes the app's images from the registry and says so.
func TestDevBuildStatesAndHiddenValues(t *testing.T) {
	g := newGate(t)
	probe, _ := filepath.Abs(filepath.Join("testdata", "buildpacks", "probe"))
	gateBP, _ := filepath.Abs(filepath.Join("testdata", "buildpacks", "gate"))
	s, _, env := devServer(t, "--buildpack", gateBP, "--buildpack", probe)
	_, port, _ := strings.Cut(s.sshAddr, ":")

	// A reader.
	ritaKey := addUser(t, s, "rita")

	// 1. A build-env secret, used by build #1, then unset.
	const btoken = "btoken-day-two-secret"
	kpushOK(t, s, "apps:create", "static")
	kpushOK(t, s, "apps:grant", "static", "rita", "read")
	kpushOK(t, s, "build-env:set", "static", "KPUSH_PROBE="+btoken)
	work := workTree(t, env, "static")
	git(t, env, work, "remote", "add", "knative", s.remote("static"))
	out, code := push(t, env, work, "knative", "main")
	if code != 0 {
		t.Fatalf("first push exited %d:\n%s", code, out)
	}
	mustContain(t, out, "probe: KPUSH_PROBE="+btoken)
	kpushOK(t, s, "build-env:unset", "static", "KPUSH_PROBE")
	r := sshCmd(t, s, ritaKey, "", "builds:output", "static", "1")
	if r.code != 0 || !strings.Contains(r.stdout, "probe: KPUSH_PROBE=[hidden]") || strings.Contains(r.stdout, btoken) {
		t.Errorf("reader's builds:output after the unset: exit %d, want the value hidden:\n%s%s", r.code, r.stdout, r.stderr)
	}

	// 2. kpush's own refs are not reported as stored.
	out, _ = push(t, env, work, "knative", "HEAD:refs/kpush/mine")
	if strings.Contains(out, "Stored refs/kpush/mine") {
		t.Errorf("a push to refs/kpush/mine was reported as stored:\n%s", out)
	}

	// 3. A running build (A, held at the gate) is cancelled when a newer push (B) queues.
	other := filepath.Join(t.TempDir(), "other")
	git(t, env, "", "clone", "-q", s.remote("static"), other)
	page(t, env, work, "A", g)
	b := page(t, env, other, "B", nil)
	resA := pushBg(env, work, "A", "knative", "main")
	g.waitStarted(t, "A")
	mustContain(t, kpushOK(t, s, "builds", "static"), "building")
	mustContain(t, kpushOK(t, s, "releases", "static"), "building")
	resB := pushBg(env, other, "B", "origin", "main")
	var ra, rb pushResult
	select {
	case ra = <-resA:
	case <-time.After(2 * time.Minute):
		t.Fatal("push A did not end within 2m of B queueing behind it (the gate was never opened)")
	}
	rb = <-resB
	checkHonest(t, ra)
	checkHonest(t, rb)
	if ra.code == 0 || !strings.Contains(ra.out, "v2 not deployed: superseded by v3 ("+b[:7]+" by alice); its build was cancelled") {
		t.Errorf("push A: exit %d, want cancelled as superseded by v3:\n%s", ra.code, ra.out)
	}
	mustContain(t, rb.out, "v3 queued behind build #2 by alice", "expires in", "unless renewed; if it is stuck, an admin can run: ssh -p "+port+" git@127.0.0.1 apps:unlock static",
		"v2 would not be deployed after this newer push: its build is cancelled", "Released static v3")
	builds := kpushOK(t, s, "builds", "static")
	if !strings.Contains(builds, "#2") || !strings.Contains(builds, "cancelled") {
		t.Errorf("builds after the supersede lacks #2 cancelled:\n%s", builds)
	}
	var rels []release
	kpushJSON(t, s, &rels, "releases", "static", "--json")
	if len(rels) < 3 || rels[1].Version != 2 || rels[1].Status != "cancelled" || !strings.Contains(rels[1].Reason, "superseded by v3") {
		t.Errorf("v2 after the supersede = %+v; want cancelled, superseded by v3", rels)
	}

	// 4. apps:unlock cancels the holder and its pusher learns who ran it.
	git(t, env, other, "pull", "-q", "origin", "main")
	page(t, env, other, "C", g)
	resC := pushBg(env, other, "C", "origin", "main")
	g.waitStarted(t, "C")
	u := kpushOK(t, s, "apps:unlock", "static")
	mustContain(t, u, "Unlocked static: its lease was held by build #4 by alice", "cancelled")
	select {
	case rc := <-resC:
		if rc.code == 0 || !strings.Contains(rc.out, "cancelled: alice ran apps:unlock static") {
			t.Errorf("push C after apps:unlock: exit %d, want cancelled by alice's apps:unlock:\n%s", rc.code, rc.out)
		}
		if strings.Contains(rc.out, "may run elsewhere") {
			t.Errorf("push C was told its build may run elsewhere:\n%s", rc.out)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("push C did not end within 2m of apps:unlock")
	}

	// 5. apps:destroy deletes the images.
	kpushJSON(t, s, &rels, "releases", "static", "--json")
	var images []string
	for _, r := range rels {
		if r.Image != "" {
			images = append(images, r.Image)
		}
	}
	if len(images) == 0 {
		t.Fatal("no release has an image")
	}
	login := remote.WithAuth(devRegistryLogin(t, s))
	for _, img := range images {
		ref, err := name.NewDigest(img)
		if err != nil {
			t.Fatal(err)
		}
		var te *transport.Error
		if _, err := remote.Head(ref); !errors.As(err, &te) || te.StatusCode != http.StatusUnauthorized {
			t.Errorf("anonymous HEAD of %s: %v, want 401", img, err)
		}
		if _, err := remote.Head(ref, login); err != nil {
			t.Errorf("HEAD of %s with kpush's login: %v", img, err)
		}
	}
	d := kpushOK(t, s, "apps:destroy", "static", "--confirm", "static")
	mustContain(t, d, "image manifests of static from the registry", "Destroyed static")
	for _, img := range images {
		ref, err := name.NewDigest(img)
		if err != nil {
			t.Fatal(err)
		}
		// The destroy has the registry collect its garbage, which stops it for a moment.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			_, err = remote.Head(ref, login)
			if !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(deadline) {
				break
			}
		}
		var te *transport.Error
		if !errors.As(err, &te) || te.StatusCode != http.StatusNotFound {
			t.Errorf("image %s after apps:destroy: %v, want 404", img, err)
		}
	}
}

// devRegistryLogin is the login `kpush dev` s made for its registry
// (<data>/registry/credentials.json).
func devRegistryLogin(t *testing.T, s *server) authn.Authenticator {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDirOf(s), "registry", "credentials.json"))
	if err != nil {
		t.Fatal(err)
	}
	var l struct{ Username, Password string }
	if err := json.Unmarshal(b, &l); err != nil || l.Username == "" || l.Password == "" {
		t.Fatalf("registry credentials file of %s holds no login (%v)", dataDirOf(s), err) // never print it
	}
	return &authn.Basic{Username: l.Username, Password: l.Password}
}

// TestDevSecondSignal: the first SIGINT starts a graceful stop that lets a running build
// finish and says how to stop at once; a second SIGINT stops kpush at once.
func TestDevSecondSignal(t *testing.T) {
	g := newGate(t)
	s, _, env := devServer(t, "--buildpack", filepath.Join("testdata", "buildpacks", "gate"), "--shutdown-grace", "2m")
	work := workTree(t, env, "static")
	git(t, env, work, "remote", "add", "knative", s.remote("static"))
	page(t, env, work, "A", g)
	res := pushBg(env, work, "A", "knative", "main")
	g.waitStarted(t, "A")
	syscall.Kill(s.cmd.Process.Pid, syscall.SIGINT)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if strings.Contains(readFile(t, s.logPath), "press Ctrl-C again to stop now") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no shutdown line saying how to stop at once within 10s:\n%s", readFile(t, s.logPath))
		}
	}
	mustContain(t, readFile(t, s.logPath), "stopping; builds may finish for 2m0s")
	select {
	case <-s.exited:
		t.Fatal("kpush exited on the first SIGINT although a build was running")
	case <-time.After(time.Second):
	}
	sent := time.Now()
	syscall.Kill(s.cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-s.exited:
		if took := time.Since(sent); took > 15*time.Second {
			t.Errorf("kpush took %s to exit after the second SIGINT", took)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("kpush still running 30s after the second SIGINT (grace 2m)")
	}
	s.stopped = true
	<-res
}
