package buildpack

import (
	"archive/tar"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"kpush.dev/kpush/internal/tools"
)

func TestEnsureRunImage(t *testing.T) {
	requireTools(t, "busybox")
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	repo := strings.TrimPrefix(srv.URL, "http://") + "/kpush/kpush.run"
	ctx := context.Background()

	ref, err := EnsureRunImage(ctx, repo)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ref, repo+"@sha256:") {
		t.Fatalf("ref = %q, want %s@sha256:…", ref, repo)
	}
	again, err := EnsureRunImage(ctx, repo)
	if err != nil || again != ref {
		t.Fatalf("second EnsureRunImage = %q, %v; want %q (idempotent)", again, err, ref)
	}
	r, err := name.NewRepository(repo)
	if err != nil {
		t.Fatal(err)
	}
	tags, err := remote.List(r)
	if err != nil || len(tags) != 1 || !strings.HasPrefix(tags[0], "busybox-") {
		t.Errorf("tags = %v, %v; want one busybox-<hex> tag", tags, err)
	}

	d, err := name.NewDigest(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(d)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform = %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	if cf.Config.User != "1000:1000" {
		t.Errorf("user = %q, want 1000:1000", cf.Config.User)
	}
	if strings.Join(cf.Config.Env, ",") != "PATH="+RunImagePath {
		t.Errorf("env = %v, want PATH=%s", cf.Config.Env, RunImagePath)
	}
	if v := cf.Config.Labels["io.buildpacks.base.distro.version"]; v == "" || v == "unknown" {
		t.Errorf("distro version label = %q", v)
	}

	files := map[string]*tar.Header{}
	contents := map[string]string{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := strings.TrimSuffix(strings.TrimPrefix(h.Name, "/"), "/")
		files[p] = h
		if strings.HasPrefix(p, "etc/") {
			b, _ := io.ReadAll(tr)
			contents[p] = string(b)
		}
	}
	bb, _ := tools.Path("busybox")
	want, _ := os.ReadFile(bb)
	if h := files["bin/busybox"]; h == nil || h.Size != int64(len(want)) || h.Mode&0o755 != 0o755 {
		t.Errorf("bin/busybox = %+v, want an executable of %d bytes", h, len(want))
	}
	for _, a := range []string{"sh", "ls", "cat", "env", "httpd", "nc", "sleep", "wget"} {
		if h := files["bin/"+a]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "busybox" {
			t.Errorf("bin/%s = %+v, want a symlink to busybox", a, h)
		}
	}
	for _, c := range []struct {
		path string
		mode int64
		uid  int
	}{{"tmp", 0o1777, 0}, {"workspace", 0o755, 1000}, {"home/cnb", 0o755, 1000}} {
		h := files[c.path]
		if h == nil || h.Typeflag != tar.TypeDir || h.Mode&0o7777 != c.mode || h.Uid != c.uid {
			t.Errorf("%s = %+v, want dir mode %o uid %d", c.path, h, c.mode, c.uid)
		}
	}
	if !strings.Contains(contents["etc/passwd"], "cnb:x:1000:1000:") || !strings.Contains(contents["etc/passwd"], "root:x:0:0:") {
		t.Errorf("etc/passwd = %q", contents["etc/passwd"])
	}
	if !strings.Contains(contents["etc/group"], "cnb:x:1000:") || !strings.Contains(contents["etc/group"], "root:x:0:") {
		t.Errorf("etc/group = %q", contents["etc/group"])
	}
}

// TestRunImageShellWorks runs the image's busybox sh the way the launcher does for a Procfile
// process, in a bubblewrap sandbox with the image's filesystem as root.
func TestRunImageShellWorks(t *testing.T) {
	requireTools(t, "busybox", "bwrap")
	img, err := NewRunImage()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			b, _ := io.ReadAll(tr)
			if err := os.WriteFile(p, b, os.FileMode(h.Mode)); err != nil {
				t.Fatal(err)
			}
		}
	}
	bwrap, _ := tools.Path("bwrap")
	out, err := exec.Command(bwrap, "--bind", root, "/", "--proc", "/proc", "--dev", "/dev", "--unshare-pid",
		"--uid", "1000", "--gid", "1000", "--unshare-user",
		"/bin/sh", "-c", "echo $((6*7)) $(whoami)").CombinedOutput()
	if err != nil {
		t.Fatalf("sh in run image: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "42 cnb" {
		t.Errorf("sh printed %q, want \"42 cnb\"", got)
	}
}
