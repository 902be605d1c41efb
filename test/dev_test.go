package test

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// devServer starts `kpush dev` on fresh loopback ports with a fresh data dir and returns it,
// the router's address, and a git environment whose key kpush accepts (s.key, of the admin
// "alice"). extra are more `kpush dev` flags.
func devServer(t *testing.T, extra ...string) (s *server, httpAddr string, env []string) {
	t.Helper()
	requireTools(t, "lifecycle", "launcher", "registry", "bwrap", "busybox")
	dir := t.TempDir()
	key := sshKey(t, dir, "alice")
	sshAddr, httpAddr := freeAddr(t), freeAddr(t)
	s = start(t, sshAddr, append([]string{"dev",
		"--data", filepath.Join(dir, "data"),
		"--ssh-addr", sshAddr,
		"--http-addr", httpAddr,
		"--authorized-keys", key + ".pub"}, extra...)...)
	s.key = key
	return s, httpAddr, gitEnv(key)
}

func (s *server) remote(app string) string { return "ssh://git@" + s.sshAddr + "/" + app }

// TestDevPushDeploys is the main job end to end in dev mode: git push over SSH → CNB build
// → registry → local runtime → HTTP, for a Go app and a Procfile app; then a commit that
// fails to build is rejected with nothing moved; then the app is cloned back.
func TestDevPushDeploys(t *testing.T) {
	s, httpAddr, env := devServer(t)

	t.Run("go app", func(t *testing.T) {
		dir := workTree(t, env, "goweb")
		first := git(t, env, dir, "rev-parse", "HEAD")
		git(t, env, dir, "remote", "add", "knative", s.remote("goweb"))
		out, code := push(t, env, dir, "knative", "main")
		if code != 0 {
			t.Fatalf("git push exited %d:\n%s", code, out)
		}
		mustContain(t, out,
			"remote: -----> Building goweb from main ("+first[:7]+"), pushed by alice, release v1",
			"remote: -----> Deploying ",
			"remote: -----> Released goweb",
		)
		buildpackLines := 0
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "remote:        ") {
				buildpackLines++
			}
			if strings.ContainsRune(l, '\x1b') {
				t.Errorf("escape sequence in output line %q", l)
			}
		}
		if buildpackLines < 3 {
			t.Errorf("want the buildpacks' own lines as remote: lines, got %d:\n%s", buildpackLines, out)
		}
		t.Logf("git push:\n%s", out)
		url := printedURL(t, out)
		if !strings.HasPrefix(url, "http://goweb.localhost:") {
			t.Errorf("URL = %q, want http://goweb.localhost:PORT/", url)
		}
		code, body := get(t, httpAddr, url)
		if code != http.StatusOK || body != "hello from goweb v1\n" {
			t.Fatalf("GET %s = %d %q", url, code, body)
		}

		// A commit that does not compile: rejected, the branch and the release stay.
		commitFile(t, env, dir, "main.go", "package main\n\nfunc main() { undefined() }\n", "broken")
		out, code = push(t, env, dir, "knative", "main")
		if code == 0 {
			t.Fatalf("push of a broken commit exited 0:\n%s", out)
		}
		mustContain(t, out, "remote:  !     ", "pre-receive hook declined", "undefined")
		if got := strings.Fields(git(t, env, dir, "ls-remote", "knative", "refs/heads/main"))[0]; got != first {
			t.Errorf("server's main = %s after a failed build, want %s", got, first)
		}
		if code, body := get(t, httpAddr, url); code != http.StatusOK || body != "hello from goweb v1\n" {
			t.Errorf("after the failed push GET = %d %q, want the previous release", code, body)
		}

		// git clone gives the deployed commit back.
		clone := filepath.Join(t.TempDir(), "clone")
		git(t, env, "", "clone", "-q", s.remote("goweb"), clone)
		if got := git(t, env, clone, "rev-parse", "HEAD"); got != first {
			t.Errorf("cloned HEAD = %s, want the deployed %s", got, first)
		}
	})

	t.Run("procfile app", func(t *testing.T) {
		dir := workTree(t, env, "static")
		git(t, env, dir, "remote", "add", "knative", s.remote("static"))
		out, code := push(t, env, dir, "knative", "main")
		if code != 0 {
			t.Fatalf("git push exited %d:\n%s", code, out)
		}
		url := printedURL(t, out)
		code, body := get(t, httpAddr, url)
		if code != http.StatusOK || body != "hello from a Procfile app\n" {
			t.Fatalf("GET %s = %d %q", url, code, body)
		}
	})
}
