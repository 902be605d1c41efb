package baseimage

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"kpush.dev/kpush/internal/tools"
)

func TestCanonicalPath(t *testing.T) {
	for in, want := range map[string]string{
		"./":                               "",
		"./usr/bin/git":                    "usr/bin/git",
		"./bin/sh":                         "usr/bin/sh",
		"./lib64/ld-linux-x86-64.so.2":     "usr/lib64/ld-linux-x86-64.so.2",
		"./lib/x86_64-linux-gnu/libc.so.6": "usr/lib/x86_64-linux-gnu/libc.so.6",
		"./sbin":                           "usr/sbin",
		"./libexec/x":                      "libexec/x", // not one of the merged directories
		"./etc/../bin/dash":                "usr/bin/dash",
		"/etc/ssl":                         "etc/ssl",
	} {
		if got := CanonicalPath(in); got != want {
			t.Errorf("CanonicalPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDropped(t *testing.T) {
	for p, want := range map[string]bool{
		"usr/share/man":                   true,
		"usr/share/man/man1/git.1.gz":     true,
		"usr/share/locale/de/LC_MESSAGES": true,
		"usr/share/doc/git/README.md":     true,
		"usr/share/doc/git/contrib/x":     true,
		"usr/share/doc/git/copyright":     false,
		"usr/share/doc/git":               false,
		"usr/share/doc":                   false,
		"usr/share/mandir":                false,
		"usr/bin/git":                     false,
		"usr/share/git-core/templates":    false,
	} {
		if got := Dropped(p); got != want {
			t.Errorf("Dropped(%q) = %v, want %v", p, got, want)
		}
	}
}

// TestMakeImage runs tools/image.sh (what `make image` runs) against an in-process registry,
// pulls the kpush image it pushed, extracts it and runs, inside it under bubblewrap with the
// image as /: `kpush serve --help`, and a real `git push` whose receiving side is the image's
// git receive-pack with a pre-receive hook run by the image's /bin/sh.
func TestMakeImage(t *testing.T) {
	bwrap, err := tools.Path("bwrap")
	if err != nil {
		t.Fatalf("finding bwrap (run make tools): %v", err)
	}
	hostGit, err := exec.LookPath("git")
	if err != nil {
		t.Fatalf("git is needed on the host for the push test: %v", err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	reg := strings.TrimPrefix(srv.URL, "http://")

	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "tools", "image.sh"))
	cmd.Env = append(os.Environ(), "IMAGE_REGISTRY="+reg)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("tools/image.sh: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	ref, err := name.NewDigest(lines[len(lines)-1])
	if err != nil {
		t.Fatalf("tools/image.sh's last line is not an image by digest: %v\nstdout:\n%s", err, stdout.String())
	}
	if want := reg + "/kpush"; ref.Context().String() != want {
		t.Errorf("image %s, want it in %s", ref, want)
	}
	img, err := remote.Image(ref, remote.WithContext(ctx))
	if err != nil {
		t.Fatalf("pulling %s: %v", ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || len(cf.Config.Entrypoint) != 1 {
		t.Errorf("image config: user %q entrypoint %q; want 65532:65532 and ko's single entrypoint", cf.Config.User, cf.Config.Entrypoint)
	}
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if err := extract(img, rootfs); err != nil {
		t.Fatalf("extracting %s: %v", ref, err)
	}

	// run execs argv inside the image as root, with work bound at the same path.
	work := t.TempDir()
	sandbox := []string{bwrap, "--bind", rootfs, "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
		"--bind", work, work, "--unshare-pid", "--die-with-parent", "--clearenv",
		"--setenv", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "--setenv", "HOME", "/tmp", "--"}
	run := func(argv ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, sandbox[0], append(sandbox[1:], argv...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("in the image, %s: %v\n%s", strings.Join(argv, " "), err, out)
		}
		return string(out)
	}

	help := run(append(cf.Config.Entrypoint, "serve", "--help")...)
	for _, want := range []string{"--registry", "KPUSH_REGISTRY", "--authorized-keys", "--ssh-addr"} {
		if !strings.Contains(help, want) {
			t.Errorf("kpush serve --help in the image lacks %q:\n%s", want, help)
		}
	}

	// A push into a repository of the image's git, through its receive-pack and a hook run by
	// its /bin/sh (gitserver's pre-receive hook is a #!/bin/sh script).
	repo := filepath.Join(work, "app.git")
	run("git", "init", "-q", "--bare", repo)
	hooks := filepath.Join(work, "hooks")
	if err := os.MkdirAll(hooks, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hooks, "pre-receive"), []byte("#!/bin/sh\nread old new ref\necho \"hook ran in the image: $ref\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	run("git", "-C", repo, "config", "core.hooksPath", hooks)
	src := filepath.Join(t.TempDir(), "src")
	host := func(args ...string) string {
		t.Helper()
		c := exec.CommandContext(ctx, hostGit, args...)
		c.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	host("init", "-q", "-b", "main", src)
	if err := os.WriteFile(filepath.Join(src, "Procfile"), []byte("web: ./run\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	host("-C", src, "add", ".")
	host("-C", src, "commit", "-q", "-m", "first")
	receivePack := shellQuote(append(sandbox, "git", "receive-pack"))
	out := host("-C", src, "push", "--receive-pack="+receivePack, repo, "main")
	if !strings.Contains(out, "hook ran in the image: refs/heads/main") {
		t.Errorf("git push through the image's receive-pack: the hook did not run:\n%s", out)
	}
	if got, want := strings.TrimSpace(run("git", "-C", repo, "rev-parse", "main")), strings.TrimSpace(host("-C", src, "rev-parse", "main")); got != want {
		t.Errorf("pushed main is %s in the image's repository, want %s", got, want)
	}
}

func shellQuote(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// extract writes the flattened file system of img (mutate.Extract) into dir.
func extract(img v1.Image, dir string) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, os.FileMode(h.Mode).Perm()); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode).Perm())
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		case tar.TypeLink:
			if err := os.Link(filepath.Join(dir, filepath.Clean("/"+h.Linkname)), p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: unsupported tar entry type %c", h.Name, h.Typeflag)
		}
	}
}
