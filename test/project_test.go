package test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDevProjectDescriptor pushes an app configured by a project.toml (testdata/apps/described)
// to `kpush dev`: its build env reaches a buildpack, build-env:set overrides it, its excluded
// file is absent from the running app, its buildpack group replaces the builder's order, and
// a group naming a buildpack the builder lacks or a malformed project.toml is rejected with
// the reason, nothing moved.
func TestDevProjectDescriptor(t *testing.T) {
	probe, err := filepath.Abs(filepath.Join("testdata", "buildpacks", "probe"))
	if err != nil {
		t.Fatal(err)
	}
	s, httpAddr, env := devServer(t, "--buildpack", probe)
	dir := workTree(t, env, "described")
	git(t, env, dir, "remote", "add", "knative", s.remote("described"))

	// v1: project.toml's build env, exclude and group.
	out, code := push(t, env, dir, "knative", "main")
	if code != 0 {
		t.Fatalf("git push exited %d:\n%s", code, out)
	}
	mustContain(t, out,
		"remote: -----> project.toml: 2 build env vars",
		"remote: -----> project.toml: buildpack group kpush-test/probe, kpush/procfile",
		"remote: -----> project.toml: exclude left out 2 files", // public/secret.txt, NOTES.md
		"remote:        probe: KPUSH_PROBE=from-project-toml",
		"remote: -----> Released described v1",
	)
	url := printedURL(t, out)
	wantGet(t, httpAddr, url, "hello from a described app\n")
	wantGet(t, httpAddr, url+"visible.txt", "public, served\n")
	if code, body := get(t, httpAddr, url+"secret.txt"); code != http.StatusNotFound {
		t.Errorf("GET secret.txt (excluded by project.toml) = %d %q, want 404", code, body)
	}

	// v2: the app's build-env:set value wins over project.toml's.
	kpushOK(t, s, "build-env:set", "described", "KPUSH_PROBE=from-build-env")
	commitFile(t, env, dir, "public/index.html", "hello from v2\n", "v2")
	out, code = push(t, env, dir, "knative", "main")
	if code != 0 {
		t.Fatalf("push v2 exited %d:\n%s", code, out)
	}
	mustContain(t, out,
		"remote: -----> project.toml: 2 build env vars (build-env:set wins for KPUSH_PROBE)",
		"remote:        probe: KPUSH_PROBE=from-build-env",
		"remote: -----> Released described v2",
	)
	wantGet(t, httpAddr, url, "hello from v2\n")

	// v3: a group without the probe: the builder's order (which runs the probe in front of
	// every group) is replaced, so the probe does not run.
	project := readFile(t, filepath.Join(dir, "project.toml"))
	noProbe := strings.Replace(project, "[[io.buildpacks.group]]\nid = \"kpush-test/probe\"\n\n", "", 1)
	if noProbe == project {
		t.Fatal("testdata project.toml lacks the probe's group entry")
	}
	commitFile(t, env, dir, "project.toml", noProbe, "v3: no probe")
	out, code = push(t, env, dir, "knative", "main")
	if code != 0 {
		t.Fatalf("push v3 exited %d:\n%s", code, out)
	}
	mustContain(t, out, "remote: -----> project.toml: buildpack group kpush/procfile", "remote: -----> Released described v3")
	if strings.Contains(out, "probe: KPUSH_PROBE") {
		t.Errorf("the probe ran although the group leaves it out:\n%s", out)
	}
	deployed := git(t, env, dir, "rev-parse", "HEAD")

	// Refused: a group naming a buildpack the builder lacks, and a malformed project.toml.
	for _, tc := range []struct {
		name, project string
		want          []string
	}{
		{"unknown buildpack", strings.Replace(noProbe, `id = "kpush/procfile"`, `id = "heroku/nodejs"`, 1), []string{
			"remote:  !     project.toml: the builder has no buildpack heroku/nodejs",
			"remote:  !     available buildpacks: kpush/go@",
			"kpush/procfile@", "kpush-test/probe@0.1.0",
		}},
		{"malformed", strings.Replace(noProbe, "[io.buildpacks]", "[io.buildpacks", 1), []string{
			"remote:  !     project.toml is not valid: ",
			"remote:  !     line 8: [io.buildpacks",
			"remote:  !     fix line 8 of project.toml",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			git(t, env, dir, "reset", "-q", "--hard", deployed)
			commitFile(t, env, dir, "project.toml", tc.project, tc.name)
			out, code := push(t, env, dir, "knative", "main")
			if code == 0 {
				t.Fatalf("push exited 0:\n%s", out)
			}
			mustContain(t, out, append(tc.want, "pre-receive hook declined")...)
			if strings.Contains(out, "Deploying") {
				t.Errorf("a refused project.toml was deployed:\n%s", out)
			}
			if got := strings.Fields(git(t, env, dir, "ls-remote", "knative", "refs/heads/main"))[0]; got != deployed {
				t.Errorf("server's main = %s after a refused push, want %s", got, deployed)
			}
		})
	}
	wantGet(t, httpAddr, url, "hello from v2\n")
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
