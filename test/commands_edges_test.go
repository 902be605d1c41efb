package test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDevCommandEdges: `ssh -t` works, a bare
// ssh is pointed at help, help for an unknown command fails, apps:create prints the real
// remote, an app's crash output quoting a config value is hidden from readers, a first deploy
// does not claim a previous release keeps serving, apps:destroy takes the build cache along,
// and a killed server's build directories are gone after its restart.
func TestDevCommandEdges(t *testing.T) {
	g := newGate(t)
	s, _, env := devServer(t, "--buildpack", filepath.Join("testdata", "buildpacks", "gate"))
	data := dataDirOf(s)
	_, port, _ := net.SplitHostPort(s.sshAddr)

	t.Run("ssh -tt help", func(t *testing.T) {
		r := sshRun(t, s, s.key, "", []string{"-tt"}, "help")
		if r.code != 0 || !strings.Contains(r.stdout, "apps:create") || !strings.Contains(r.stdout, "\r\n") ||
			strings.Contains(r.stderr, "PTY allocation request failed") {
			t.Errorf("ssh -tt help: %+v; want exit 0 with the command list in CRLF lines", r)
		}
	})
	for _, tc := range []struct {
		name   string
		flags  []string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"bare ssh", []string{"-T"}, nil, 1, "", "interactive shells are not supported; run: ssh -p " + port + " git@127.0.0.1 help\n"},
		{"help nosuch", nil, []string{"help", "nosuch"}, 1, "", `unknown command "nosuch"`},
		{"create", nil, []string{"apps:create", "crash"}, 0, "git remote add knative ssh://git@" + s.sshAddr + "/crash\n", ""},
		{"config without vars", nil, []string{"config", "crash"}, 0, "crash has no config vars\n", ""},
		{"destroy with another name", nil, []string{"apps:destroy", "crash", "--confirm", "crush"}, 1, "", "does not match the app name crash"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := sshRun(t, s, s.key, "", tc.flags, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stdout, tc.stdout) || !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("%v: %+v; want exit %d, stdout with %q, stderr with %q", tc.args, r, tc.code, tc.stdout, tc.stderr)
			}
		})
	}

	// An app that prints a config value as it crashes, on its first deploy.
	const secret = "s3cr3t-value-42"
	kpushOK(t, s, "config:set", "crash", "TOKEN="+secret)
	work := workTree(t, env, "static")
	commitFile(t, env, work, "Procfile", "web: echo TOKEN=$TOKEN; exit 1\n", "crash")
	git(t, env, work, "remote", "add", "knative", s.remote("crash"))
	out, code := push(t, env, work, "knative", "main")
	if code == 0 || !strings.Contains(out, "TOKEN="+secret) {
		t.Fatalf("push of a crashing app: exit %d, want a failure quoting its output:\n%s", code, out)
	}
	if strings.Contains(out, "previous release keeps serving") {
		t.Errorf("the first deploy of crash claims a previous release:\n%s", out)
	}
	bobKey := addUser(t, s, "bob")
	kpushOK(t, s, "apps:grant", "crash", "bob", "read")
	for _, args := range [][]string{{"builds:output", "crash"}, {"releases:info", "crash", "v1"}, {"releases", "crash", "--json"}} {
		r := sshCmd(t, s, bobKey, "", args...)
		if r.code != 0 || strings.Contains(r.stdout, secret) || !strings.Contains(r.stdout, "TOKEN=[hidden]") {
			t.Errorf("reader bob: %v = %+v; want TOKEN=[hidden], never the value", args, r)
		}
		if admin := kpushOK(t, s, args...); !strings.Contains(admin, "TOKEN="+secret) {
			t.Errorf("admin: %v lacks the value:\n%s", args, admin)
		}
	}

	// apps:destroy takes the build cache along.
	cache := filepath.Join(data, "cache", "crash")
	if _, err := os.Stat(cache); err != nil {
		t.Fatalf("no build cache of crash after its build: %v", err)
	}
	kpushOK(t, s, "apps:destroy", "crash", "--confirm", "crash")
	if _, err := os.Stat(cache); !os.IsNotExist(err) {
		t.Errorf("%s after apps:destroy: %v; want it gone", cache, err)
	}

	// A server killed mid-build leaves its build directories; the next start removes them.
	work = workTree(t, env, "static")
	git(t, env, work, "remote", "add", "knative", s.remote("static"))
	page(t, env, work, "A", g)
	res := pushBg(env, work, "A", "knative", "main")
	g.waitStarted(t, "A")
	left := func() []string {
		a, _ := filepath.Glob(filepath.Join(data, "builds", "*"))
		b, _ := filepath.Glob(filepath.Join(data, "tmp", "kpush-src-*"))
		return append(a, b...)
	}
	if l := left(); len(l) != 2 {
		t.Fatalf("build directories during the build: %q; want one in builds/ and one in tmp/", l)
	}
	s.killHard(t)
	<-res
	if l := left(); len(l) != 2 {
		t.Fatalf("build directories after the kill: %q; want the two left behind", l)
	}
	s2 := start(t, s.sshAddr, s.args...)
	s2.key = s.key
	if l := left(); len(l) != 0 {
		t.Errorf("build directories after the restart: %q; want none", l)
	}
}
