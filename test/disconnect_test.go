package test

import (
	"bytes"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Builds outlive a pusher who disconnects, unless the push asked for
// cancel-on-disconnect. The gate buildpack holds the build while the test kills the git
// client, so the disconnect happens mid-build, not by luck of timing.

// startPush starts `git push args...` in dir in its own process group (git and its ssh), so
// that killClient can take both down as a closed laptop lid would.
func startPush(t *testing.T, env []string, dir string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("git", append([]string{"push"}, args...)...)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	return cmd
}

func killClient(cmd *exec.Cmd) {
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	cmd.Wait()
}

// waitRelease polls `releases APP --json` until release v is no longer pending and returns it.
func waitRelease(t *testing.T, s *server, app string, v int) release {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		var rels []release
		kpushJSON(t, s, &rels, "releases", app, "--json")
		for _, r := range rels {
			if r.Version == v && r.Status != "pending" {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("v%d of %s still pending (or missing) after 3m: %+v", v, app, rels)
		}
	}
}

// waitBranch polls the server's main until it is want, and fails after a while.
func waitBranch(t *testing.T, env []string, work, remote, want string) {
	t.Helper()
	got := ""
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if got = strings.Fields(git(t, env, work, "ls-remote", remote, "refs/heads/main") + " -")[0]; got == want {
			return
		}
	}
	t.Errorf("server's main = %s, want %s", got, want)
}

type buildJSON struct {
	Number  int    `json:"number"`
	Release int    `json:"release"`
	Commit  string `json:"commit"`
	Status  string `json:"status"`
}

// TestDevDisconnect: a pusher killed mid-build leaves a build that completes, is recorded as
// succeeded, serves the new commit and moves the branch to it; with
// `git push -o cancel-on-disconnect` the same disconnect cancels the build, the release is
// recorded as cancelled, the branch stays and the previous release keeps serving.
func TestDevDisconnect(t *testing.T) {
	g := newGate(t)
	s, httpAddr, env := devServer(t, "--buildpack", filepath.Join("testdata", "buildpacks", "gate"))
	work := workTree(t, env, "static")
	git(t, env, work, "remote", "add", "knative", s.remote("static"))
	out, code := push(t, env, work, "knative", "main")
	if code != 0 {
		t.Fatalf("first push exited %d:\n%s", code, out)
	}
	url := printedURL(t, out)

	// 1. The build goes on without its pusher.
	a := page(t, env, work, "A", g)
	cmd := startPush(t, env, work, "knative", "main")
	g.waitStarted(t, "A")
	killClient(cmd)
	g.open("A")
	if r := waitRelease(t, s, "static", 2); r.Status != "succeeded" || r.Commit != a {
		t.Errorf("v2 after the pusher was killed = %+v; want %s succeeded", r, a)
	}
	var builds []buildJSON
	kpushJSON(t, s, &builds, "builds", "static", "--json")
	if len(builds) == 0 || builds[0].Release != 2 || builds[0].Status != "succeeded" || builds[0].Commit != a {
		t.Errorf("builds = %+v; want the newest, of v2 (%s), succeeded", builds, a)
	}
	wantGet(t, httpAddr, url, "page A\n")
	waitBranch(t, env, work, "knative", a)
	if log := kpushOK(t, s, "builds:output", "static"); !strings.Contains(log, "gate: open") || !strings.Contains(log, "Released static v2") {
		t.Errorf("builds:output of the disconnected build lacks its end:\n%s", log)
	}

	// 2. cancel-on-disconnect: the build stops with its pusher and nothing moves.
	page(t, env, work, "B", g)
	cmd = startPush(t, env, work, "-o", "cancel-on-disconnect", "knative", "main")
	g.waitStarted(t, "B")
	killClient(cmd)
	r := waitRelease(t, s, "static", 3)
	if r.Status != "cancelled" || !strings.Contains(r.Reason, "cancelled: the pusher disconnected") {
		t.Errorf("v3 after a cancel-on-disconnect pusher was killed = %+v; want cancelled", r)
	}
	kpushJSON(t, s, &builds, "builds", "static", "--json")
	if len(builds) == 0 || builds[0].Release != 3 || builds[0].Status != "cancelled" {
		t.Errorf("builds = %+v; want the newest, of v3, cancelled", builds)
	}
	var info appJSON
	kpushJSON(t, s, &info, "apps:info", "static", "--json")
	if info.Current != 2 {
		t.Errorf("current release v%d, want v2 still", info.Current)
	}
	wantGet(t, httpAddr, url, "page A\n")
	waitBranch(t, env, work, "knative", a)
	if code, _ := get(t, httpAddr, url); code != http.StatusOK {
		t.Errorf("GET %s = %d after the cancelled push", url, code)
	}
}
