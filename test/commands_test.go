package test

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"kpush.dev/kpush/receiver"
)

// appJSON is apps --json / apps:info --json.
type appJSON struct {
	Name         string            `json:"name"`
	Owner        string            `json:"owner"`
	DeployBranch string            `json:"deploy_branch"`
	Current      int               `json:"current_release"`
	URL          string            `json:"url"`
	Status       string            `json:"status"`
	Config       receiver.Config   `json:"config"`
	Release      *receiver.Release `json:"release"`
}

// setGreeting rewrites goweb's greeting to "hello from goweb <v>" and commits it.
func setGreeting(t *testing.T, env []string, dir, v string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	src := strings.Replace(string(b), `"hello from goweb v1"`, `"hello from goweb `+v+`"`, 1)
	return commitFile(t, env, dir, "main.go", src, "greeting "+v)
}

func wantGet(t *testing.T, httpAddr, url, want string) {
	t.Helper()
	if code, body := get(t, httpAddr, url); code != http.StatusOK || body != want {
		t.Errorf("GET %s = %d %q, want 200 %q", url, code, body, want)
	}
}

func releasesOf(t *testing.T, s *server, app string) []receiver.Release {
	t.Helper()
	var rels []receiver.Release
	kpushJSON(t, s, &rels, "releases", app, "--json")
	return rels
}

// TestDevCommands runs every app command over the system OpenSSH client against `kpush dev`:
// build env reaching a buildpack but not the app, config:set answered by the app, rollback to
// v1's image and config, rebuild, build logs replayed and followed, the source of a failed
// release and of a force-pushed-over commit fetched back, everything surviving a restart, and
// apps:destroy.
func TestDevCommands(t *testing.T) {
	probe, err := filepath.Abs(filepath.Join("testdata", "buildpacks", "probe"))
	if err != nil {
		t.Fatal(err)
	}
	s, httpAddr, env := devServer(t, "--buildpack", probe)
	url := "http://goweb.localhost:" + httpAddr[strings.LastIndex(httpAddr, ":")+1:] + "/"

	// help, unknown commands and bad arguments.
	help := kpushOK(t, s, "help")
	for _, c := range []string{"apps:create", "apps:info", "apps:destroy", "releases:info", "rollback", "rebuild",
		"config:set", "config:unset", "build-env:set", "build-env:unset", "builds:output", "keys:add", "apps:grant"} {
		if !strings.Contains(help, c) {
			t.Errorf("help lacks %s:\n%s", c, help)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"apps:info"}, "missing APP"},
		{[]string{"releases:info", "goweb", "v1", "extra"}, `unexpected argument "extra"`},
		{[]string{"apps", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"apps:info", "Bad_Name"}, "invalid app name"},
		{[]string{"apps:info", "nosuchapp"}, "app nosuchapp does not exist"},
	} {
		r := sshCmd(t, s, s.key, "", tc.args...)
		if r.code != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 and %q", tc.args, r.code, r.stderr, tc.want)
		}
		if strings.Contains(tc.want, "unknown") && !strings.Contains(r.stderr, "help") {
			t.Errorf("%v: stderr lacks a hint to run help: %q", tc.args, r.stderr)
		}
	}

	// An app made ahead of its first push, with config and build env.
	kpushOK(t, s, "apps:create", "goweb")
	if r := sshCmd(t, s, s.key, "", "apps:create", "goweb"); r.code != 1 || !strings.Contains(r.stderr, "already exists") {
		t.Errorf("second apps:create: %+v", r)
	}
	var apps []appJSON
	kpushJSON(t, s, &apps, "apps", "--json")
	if len(apps) != 1 || apps[0].Name != "goweb" || apps[0].Owner != "alice" || apps[0].Current != 0 {
		t.Errorf("apps --json = %+v", apps)
	}
	kpushOK(t, s, "build-env:set", "goweb", "KPUSH_PROBE=build-only")
	var benv map[string]string
	kpushJSON(t, s, &benv, "build-env", "goweb", "--json")
	if benv["KPUSH_PROBE"] != "build-only" {
		t.Errorf("build-env --json = %v", benv)
	}
	if out := kpushOK(t, s, "config:set", "goweb", "COLOR=red"); !strings.Contains(out, "no release yet") {
		t.Errorf("config:set before any release: %q", out)
	}
	for _, bad := range []string{"PORT=1", "K_SERVICE=x", "1X=y", "NOEQUALS"} {
		if r := sshCmd(t, s, s.key, "", "config:set", "goweb", bad); r.code != 1 || r.stderr == "" {
			t.Errorf("config:set %s: exit %d, stderr %q; want a refusal", bad, r.code, r.stderr)
		}
	}

	// v1, v2, v3: three pushes with different greetings; v3 is force-pushed over v2.
	dir := workTree(t, env, "goweb")
	git(t, env, dir, "remote", "add", "knative", s.remote("goweb"))
	c1 := git(t, env, dir, "rev-parse", "HEAD")
	out, code := push(t, env, dir, "knative", "main")
	if code != 0 {
		t.Fatalf("push v1 exited %d:\n%s", code, out)
	}
	mustContain(t, out, "remote:        probe: KPUSH_PROBE=build-only", "remote: -----> Released goweb v1")
	wantGet(t, httpAddr, url, "hello from goweb v1\n")
	wantGet(t, httpAddr, url+"env/COLOR", "red")
	wantGet(t, httpAddr, url+"env/KPUSH_PROBE", "") // build env is absent at run time

	c2 := setGreeting(t, env, dir, "v2")
	if out, code := push(t, env, dir, "knative", "main"); code != 0 {
		t.Fatalf("push v2 exited %d:\n%s", code, out)
	}
	wantGet(t, httpAddr, url, "hello from goweb v2\n")
	git(t, env, dir, "reset", "-q", "--hard", c1)
	c3 := setGreeting(t, env, dir, "v3")
	if out, code := push(t, env, dir, "knative", "+main"); code != 0 {
		t.Fatalf("force push v3 exited %d:\n%s", code, out)
	}
	wantGet(t, httpAddr, url, "hello from goweb v3\n")

	// v4: rollback to v1 serves v1's image with v1's config.
	rollOut := kpushOK(t, s, "rollback", "goweb", "v1")
	mustContain(t, rollOut, "Rollback to v1", "Released goweb v4")
	wantGet(t, httpAddr, url, "hello from goweb v1\n")
	rels := releasesOf(t, s, "goweb")
	if len(rels) != 4 || rels[0].Version != 4 || rels[0].Kind != receiver.KindRollback || rels[0].Image != rels[3].Image ||
		rels[0].Env["COLOR"] != "red" || rels[0].Status != receiver.StatusSucceeded {
		t.Fatalf("releases after rollback = %+v", rels)
	}
	// v5: config:set deploys the same image with the new value; the app answers with it.
	mustContain(t, kpushOK(t, s, "config:set", "goweb", "COLOR=blue", "SIZE=xl"), "Set COLOR, SIZE config vars", "Released goweb v5")
	wantGet(t, httpAddr, url+"env/COLOR", "blue")
	wantGet(t, httpAddr, url, "hello from goweb v1\n")
	// v6: rollback to v3 brings back v3's image and v3's config (COLOR=red, no SIZE).
	kpushOK(t, s, "rollback", "goweb", "v3")
	wantGet(t, httpAddr, url, "hello from goweb v3\n")
	wantGet(t, httpAddr, url+"env/COLOR", "red")
	wantGet(t, httpAddr, url+"env/SIZE", "")
	var cfg receiver.Config
	kpushJSON(t, s, &cfg, "config", "goweb", "--json")
	if cfg.Env["COLOR"] != "red" || cfg.Env["SIZE"] != "" {
		t.Errorf("config after rollback to v3 = %+v, want v3's", cfg)
	}
	// v7: config:unset.
	kpushOK(t, s, "config:unset", "goweb", "COLOR")
	wantGet(t, httpAddr, url+"env/COLOR", "")
	if out := kpushOK(t, s, "config", "goweb"); strings.Contains(out, "COLOR") {
		t.Errorf("config after unset: %q", out)
	}
	rels = releasesOf(t, s, "goweb")
	for i, want := range []struct {
		kind, desc  string
		sameImageAs int // 1-based release whose image it runs
	}{
		{receiver.KindPush, "Deploy " + c1[:7], 1}, {receiver.KindPush, "Deploy " + c2[:7], 2}, {receiver.KindPush, "Deploy " + c3[:7], 3},
		{receiver.KindRollback, "Rollback to v1", 1}, {receiver.KindConfig, "Set COLOR, SIZE config vars", 1},
		{receiver.KindRollback, "Rollback to v3", 3}, {receiver.KindConfig, "Remove COLOR config vars", 3},
	} {
		r := rels[len(rels)-1-i]
		if r.Version != i+1 || r.Kind != want.kind || r.Description != want.desc || r.Image != rels[len(rels)-want.sameImageAs].Image || r.User != "alice" {
			t.Errorf("v%d = %+v, want %+v", i+1, r, want)
		}
	}
	if rels[len(rels)-1].Image == rels[len(rels)-2].Image {
		t.Errorf("v1 and v2 have the same image %s", rels[len(rels)-1].Image)
	}
	var rel receiver.Release
	kpushJSON(t, s, &rel, "releases:info", "goweb", "v2", "--json")
	if rel.Version != 2 || rel.Commit != c2 || rel.Build != 2 || rel.Status != receiver.StatusSucceeded {
		t.Errorf("releases:info v2 = %+v", rel)
	}
	mustContain(t, kpushOK(t, s, "releases", "goweb"), "v7", "Rollback to v3", "current")
	mustContain(t, kpushOK(t, s, "releases:info", "goweb", "v4"), "Rollback to v1", "refs/kpush/releases/v4")

	// The force-pushed-over v2 comes back by its release ref.
	git(t, env, dir, "fetch", "-q", "knative", "refs/kpush/releases/v2")
	if got := git(t, env, dir, "rev-parse", "FETCH_HEAD"); got != c2 {
		t.Errorf("refs/kpush/releases/v2 = %s, want the force-pushed-over %s", got, c2)
	}
	// Pushes cannot touch release refs.
	if out, code := push(t, env, dir, "knative", "+main:refs/kpush/releases/v2"); code == 0 {
		t.Errorf("a push moved refs/kpush/releases/v2:\n%s", out)
	}

	// v8: a failed build is a release too, and its source comes back by ref.
	broken := commitFile(t, env, dir, "main.go", "package main\n\nfunc main() { undefined() }\n", "broken")
	out, code = push(t, env, dir, "knative", "main")
	if code == 0 {
		t.Fatalf("push of a broken commit exited 0:\n%s", out)
	}
	mustContain(t, out, "release v8 failed", "refs/kpush/releases/v8")
	rels = releasesOf(t, s, "goweb")
	if rels[0].Version != 8 || rels[0].Status != receiver.StatusFailed || rels[0].Reason == "" || rels[0].Image != "" || rels[0].Commit != broken {
		t.Errorf("failed release = %+v", rels[0])
	}
	clone := filepath.Join(t.TempDir(), "fetch")
	git(t, env, "", "init", "-q", clone)
	git(t, env, clone, "fetch", "-q", s.remote("goweb"), "refs/kpush/releases/v8")
	if got := git(t, env, clone, "rev-parse", "FETCH_HEAD"); got != broken {
		t.Errorf("refs/kpush/releases/v8 = %s, want the failed commit %s", got, broken)
	}
	if src := git(t, env, clone, "show", "FETCH_HEAD:main.go"); !strings.Contains(src, "undefined()") {
		t.Errorf("fetched source of v8: %q", src)
	}
	wantGet(t, httpAddr, url, "hello from goweb v3\n") // v7 keeps serving

	var info appJSON
	kpushJSON(t, s, &info, "apps:info", "goweb", "--json")
	if info.Current != 7 || info.DeployBranch != "main" || info.URL != url || info.Status != "last release failed" || info.Release == nil || info.Release.Version != 7 {
		t.Errorf("apps:info --json = %+v", info)
	}
	mustContain(t, kpushOK(t, s, "apps:info", "goweb"), "Deploy branch:", "main", url)

	// Builds: one per push; replayed, and followed while a rebuild runs (v9).
	var builds []receiver.Build
	kpushJSON(t, s, &builds, "builds", "goweb", "--json")
	if len(builds) != 4 || builds[0].Number != 4 || builds[0].Release != 8 || builds[0].Status != receiver.StatusFailed || builds[3].Commit != c1 {
		t.Errorf("builds --json = %+v", builds)
	}
	mustContain(t, kpushOK(t, s, "builds:output", "goweb", "1"), "probe: KPUSH_PROBE=build-only", "Released goweb v1")
	mustContain(t, kpushOK(t, s, "builds:output", "goweb"), "undefined")
	mustContain(t, kpushOK(t, s, "builds", "goweb"), "#4", "failed")

	rebuild := exec.Command("ssh", "-p", s.sshAddr[strings.LastIndex(s.sshAddr, ":")+1:], "-i", s.key, "-o", "IdentitiesOnly=yes",
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "git@127.0.0.1", "rebuild", "goweb")
	var rebuildOut strings.Builder
	rebuild.Stdout, rebuild.Stderr = &rebuildOut, &rebuildOut
	if err := rebuild.Start(); err != nil {
		t.Fatal(err)
	}
	var running int
	for deadline := time.Now().Add(time.Minute); running == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		kpushJSON(t, s, &builds, "builds", "goweb", "--json")
		if builds[0].Number == 5 {
			running = 5
		}
	}
	if running == 0 {
		t.Fatal("the rebuild's build did not appear within 1m")
	}
	followed := kpushOK(t, s, "builds:output", "goweb", strconv.Itoa(running), "-f")
	if err := rebuild.Wait(); err != nil {
		t.Fatalf("rebuild: %v\n%s", err, rebuildOut.String())
	}
	mustContain(t, rebuildOut.String(), "Rebuilding goweb", "Released goweb v9")
	mustContain(t, followed, "probe: KPUSH_PROBE=build-only", "Released goweb v9")
	rels = releasesOf(t, s, "goweb")
	if rels[0].Kind != receiver.KindRebuild || rels[0].Commit != c3 || rels[0].Status != receiver.StatusSucceeded {
		t.Errorf("rebuild release = %+v, want v9 of the deploy branch head %s", rels[0], c3)
	}
	kpushOK(t, s, "build-env:unset", "goweb", "KPUSH_PROBE")
	kpushJSON(t, s, &benv, "build-env", "goweb", "--json")
	if len(benv) != 0 {
		t.Errorf("build-env after unset = %v", benv)
	}

	// Roles: a user with no grant sees nothing and may not change config; read lets them look.
	bobKey := addUser(t, s, "bob")
	if r := sshCmd(t, s, bobKey, "", "apps", "--json"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("apps as bob without grants: %+v", r)
	}
	if r := sshCmd(t, s, bobKey, "", "releases", "goweb"); r.code != 1 || !strings.Contains(r.stderr, "bob") || !strings.Contains(r.stderr, "read") {
		t.Errorf("releases as bob without grants: %+v", r)
	}
	kpushOK(t, s, "apps:grant", "goweb", "bob", "read")
	if r := sshCmd(t, s, bobKey, "", "releases", "goweb", "--json"); r.code != 0 || strings.Contains(r.stdout, `"blue"`) || !strings.Contains(r.stdout, "hidden") {
		t.Errorf("releases as reader bob (config values hidden): %+v", r)
	}
	for _, args := range [][]string{{"config:set", "goweb", "X=1"}, {"rollback", "goweb", "v1"}, {"apps:destroy", "goweb", "--confirm", "goweb"}} {
		if r := sshCmd(t, s, bobKey, "", args...); r.code != 1 || !strings.Contains(r.stderr, "user bob does not have the") {
			t.Errorf("%v as reader bob: %+v", args, r)
		}
	}

	// Releases, config, builds and logs survive a restart; the app comes back serving.
	before := kpushOK(t, s, "releases", "goweb", "--json")
	s = s.restart(t)
	if after := kpushOK(t, s, "releases", "goweb", "--json"); after != before {
		t.Errorf("releases changed across a restart:\nbefore %s\nafter %s", before, after)
	}
	kpushJSON(t, s, &cfg, "config", "goweb", "--json")
	if cfg.Env["COLOR"] != "" || cfg.Version == 0 {
		t.Errorf("config after restart = %+v", cfg)
	}
	mustContain(t, kpushOK(t, s, "builds:output", "goweb", "1"), "probe: KPUSH_PROBE=build-only")
	var deadline = time.Now().Add(time.Minute)
	for {
		if code, body := get(t, httpAddr, url); code == http.StatusOK && body == "hello from goweb v3\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the app did not come back after a restart")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if r := sshCmd(t, s, bobKey, "", "apps:info", "goweb"); r.code != 0 {
		t.Errorf("bob's read grant after restart: %+v", r)
	}

	// apps:destroy wants --confirm APP; then the app, its repository and its route are gone.
	if r := sshCmd(t, s, s.key, "", "apps:destroy", "goweb"); r.code != 1 || !strings.Contains(r.stderr, "--confirm goweb") {
		t.Errorf("apps:destroy without --confirm: %+v", r)
	}
	mustContain(t, kpushOK(t, s, "apps:destroy", "goweb", "--confirm", "goweb"), "Destroyed goweb")
	kpushJSON(t, s, &apps, "apps", "--json")
	if len(apps) != 0 {
		t.Errorf("apps after destroy = %+v", apps)
	}
	if code, _ := get(t, httpAddr, url); code != http.StatusNotFound {
		t.Errorf("GET after destroy = %d, want 404", code)
	}
	if out, err := gitResult(env, dir, "ls-remote", "knative"); err == nil {
		t.Errorf("ls-remote after destroy succeeded:\n%s", out)
	}
}
