package test

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// opsGet GETs path from the operations endpoints at addr.
func opsGet(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

// TestDevOps runs `kpush dev` with its operations endpoints: after a push, /metrics counts it,
// its build (with a duration sample) and its deploy; /readyz is 200; the banner names the SSH
// host key's fingerprint as ssh-keygen computes it. Then SIGTERM arrives while a build runs
// (held by the gate buildpack): /readyz turns 503 at once, the build finishes within
// --shutdown-grace, the push exits 0 and kpush exits.
func TestDevOps(t *testing.T) {
	opsAddr := freeAddr(t)
	s, _, env := devServer(t, "--ops-addr", opsAddr, "--shutdown-grace", "3m",
		"--buildpack", filepath.Join("testdata", "buildpacks", "gate"))

	if code, body := opsGet(t, opsAddr, "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz: %d\n%s", code, body)
	}
	work := workTree(t, env, "static")
	git(t, env, work, "remote", "add", "knative", s.remote("static"))
	if out, code := push(t, env, work, "knative", "main"); code != 0 {
		t.Fatalf("git push exited %d:\n%s", code, out)
	}
	code, metrics := opsGet(t, opsAddr, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d\n%s", code, metrics)
	}
	for _, want := range []string{
		`kpush_pushes_total{result="accepted"} 1`,
		`kpush_pushes_total{result="rejected"} 0`,
		`kpush_builds_total{result="succeeded"} 1`,
		`kpush_build_duration_seconds_count{result="succeeded"} 1`,
		`kpush_deploys_total{result="succeeded"} 1`,
		`kpush_deploy_duration_seconds_count{result="succeeded"} 1`,
		`kpush_failures_total{stage="build"} 0`,
		`kpush_queue_length 0`,
		`kpush_builds_running 0`,
	} {
		if !hasLine(metrics, want) {
			t.Errorf("/metrics lacks the line %s", want)
		}
	}
	if sum := regexp.MustCompile(`(?m)^kpush_build_duration_seconds_sum\{result="succeeded"\} (\S+)$`).FindStringSubmatch(metrics); sum == nil || sum[1] == "0" {
		t.Errorf("/metrics has no build duration sample: %v", sum)
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", metrics)
	}

	// The host key fingerprint in the banner is the key's, as ssh-keygen computes it.
	fp, err := exec.Command("ssh-keygen", "-lf", filepath.Join(dataDirOf(s), "ssh_host_ed25519_key")).Output()
	if err != nil {
		t.Fatalf("ssh-keygen -lf: %v", err)
	}
	log, _ := os.ReadFile(s.logPath)
	if f := strings.Fields(string(fp)); len(f) < 2 || !strings.Contains(string(log), "kpush dev: SSH host key "+f[1]+" ") {
		t.Errorf("the banner does not name the host key %q:\n%s", fp, log)
	}

	// SIGTERM while a build runs.
	g := newGate(t)
	page(t, env, work, "slow", g)
	pushed := pushBg(env, work, "slow", "knative", "main")
	g.waitStarted(t, "slow")
	if err := syscall.Kill(s.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, body := opsGet(t, opsAddr, "/readyz")
		if code == http.StatusServiceUnavailable {
			if !strings.Contains(body, "kpush is shutting down") {
				t.Errorf("/readyz while draining does not say so:\n%s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d 10 s after SIGTERM:\n%s", code, body)
		}
	}
	select {
	case <-s.exited:
		t.Fatal("kpush exited while a build was running, within its shutdown grace")
	case <-time.After(time.Second):
	}
	g.open("slow")
	var r pushResult
	select {
	case r = <-pushed:
	case <-time.After(3 * time.Minute):
		t.Fatal("the push did not end within 3m of opening the gate")
	}
	if r.code != 0 || !releasedRE.MatchString(r.out) {
		t.Errorf("the push running at SIGTERM exited %d; want 0 and released:\n%s", r.code, r.out)
	}
	select {
	case <-s.exited:
		s.stopped = true
	case <-time.After(30 * time.Second):
		t.Fatal("kpush did not exit within 30 s of its last build ending")
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("kpush exited %d after SIGTERM, want 0", code)
	}
}

// hasLine reports whether text has the line l.
func hasLine(text, l string) bool {
	for _, got := range strings.Split(text, "\n") {
		if got == l {
			return true
		}
	}
	return false
}
