package test

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kpush.dev/kpush/receiver"
)

// lfsPointer is a Git LFS pointer file as git-lfs writes it (its spec, docs/spec.md); the
// test needs no git-lfs: the pointer is what a commit of an LFS repository holds.
func lfsPointer(oid string, size int) string {
	return "version https://git-lfs.github.com/spec/v1\noid sha256:" + strings.Repeat(oid, 64/len(oid)) + "\nsize " + strings.Repeat("7", size) + "\n"
}

// TestPushTreeContentsGitDoesNotCarry pushes what a git tree names but does not hold: Git
// LFS pointer files, whose push is refused before the build with nothing deployed, and a
// submodule, which the push lists as not fetched while the app deploys.
func TestPushTreeContentsGitDoesNotCarry(t *testing.T) {
	s, httpAddr, env := devServer(t)
	_, port, _ := net.SplitHostPort(httpAddr)

	t.Run("LFS pointers refuse the push, nothing deployed", func(t *testing.T) {
		dir := workTree(t, env, "static")
		files := map[string]string{
			".gitattributes":          "*.png filter=lfs diff=lfs merge=lfs -text\n",
			"public/logo.png":         lfsPointer("a1", 5),
			"public/img/banner.png":   lfsPointer("b2", 6),
			"public/not-a-pointer.md": "version https://git-lfs.github.com/spec/v1\nis how a pointer file starts.\n",
		}
		for name, body := range files {
			p := filepath.Join(dir, name)
			os.MkdirAll(filepath.Dir(p), 0o755)
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		git(t, env, dir, "add", "-A")
		git(t, env, dir, "commit", "-q", "-m", "lfs")
		git(t, env, dir, "remote", "add", "knative", s.remote("lfsapp"))
		out, code := push(t, env, dir, "knative", "main")
		if code == 0 {
			t.Fatalf("push of LFS pointers exited 0:\n%s", out)
		}
		mustContain(t, out,
			"remote:  !     not built: 2 files are Git LFS pointers, not the files' content: kpush does not store Git LFS objects yet",
			"remote:  !       public/img/banner.png",
			"remote:  !       public/logo.png",
			`remote:  !       git lfs migrate export --everything --include="*.png"`,
			"nothing was deployed and the branch did not move",
			"pre-receive hook declined",
		)
		t.Logf("git push:\n%s", out)
		if strings.Contains(out, "not-a-pointer.md") || strings.Contains(out, "===> DETECTING") || strings.Contains(out, "Deploying") {
			t.Errorf("a file that is no pointer was named, or the build ran:\n%s", out)
		}
		if got, err := gitResult(env, dir, "ls-remote", "knative", "refs/heads/main"); err != nil || strings.TrimSpace(got) != "" {
			t.Errorf("the server has main after a refused push: %q %v", got, err)
		}
		for _, r := range releasesOf(t, s, "lfsapp") {
			if r.Status != receiver.StatusFailed || r.Image != "" {
				t.Errorf("release %+v, want failed without an image", r)
			}
		}
		if code, _ := get(t, httpAddr, "http://lfsapp.localhost:"+port+"/"); code != http.StatusNotFound {
			t.Errorf("GET lfsapp = %d, want 404: nothing serves", code)
		}
	})

	t.Run("a submodule is listed as not fetched, the app deploys", func(t *testing.T) {
		dir := workTree(t, env, "static")
		sub := git(t, env, dir, "rev-parse", "HEAD")
		git(t, env, dir, "update-index", "--add", "--cacheinfo", "160000,"+sub+",vendor/theme")
		if err := os.WriteFile(filepath.Join(dir, ".gitmodules"), []byte("[submodule \"theme\"]\n\tpath = vendor/theme\n"+
			"\turl = https://deploy:t0ken@example.com/theme.git\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		git(t, env, dir, "add", ".gitmodules")
		git(t, env, dir, "commit", "-q", "-m", "submodule")
		git(t, env, dir, "remote", "add", "knative", s.remote("subapp"))
		out, code := push(t, env, dir, "knative", "main")
		if code != 0 {
			t.Fatalf("git push exited %d:\n%s", code, out)
		}
		mustContain(t, out,
			"remote: -----> 1 submodule not fetched: kpush builds the pushed tree alone; commit what the build needs",
			"remote:        vendor/theme (https://example.com/theme.git)",
			"remote: -----> Released subapp v1",
		)
		t.Logf("git push:\n%s", out)
		if strings.Contains(out, "t0ken") {
			t.Errorf("the submodule URL's credentials were printed:\n%s", out)
		}
		url := printedURL(t, out)
		if code, body := get(t, httpAddr, url); code != http.StatusOK || body != "hello from a Procfile app\n" {
			t.Errorf("GET %s = %d %q", url, code, body)
		}
	})
}
