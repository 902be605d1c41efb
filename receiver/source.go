package receiver

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"

	"kpush.dev/kpush/gitserver"
)

// deployBranch returns the full name of the branch HEAD points at in the bare repository
// dir, e.g. "refs/heads/main". gitserver points HEAD at the first branch pushed.
func deployBranch(dir string) (string, error) {
	repo, err := git.PlainOpen(dir)
	if err != nil {
		return "", fmt.Errorf("opening repository %s: %w", dir, err)
	}
	head, err := repo.Storer.Reference(plumbing.HEAD)
	if err != nil {
		return "", fmt.Errorf("reading HEAD of %s: %w", dir, err)
	}
	if head.Type() != plumbing.SymbolicReference {
		return "", fmt.Errorf("HEAD of %s is detached at %s", dir, head.Hash())
	}
	return head.Target().String(), nil
}

// refValue returns the object name ref points at in the bare repository dir, or
// gitserver.ZeroID when the ref does not exist.
func refValue(dir, ref string) (string, error) {
	repo, err := git.PlainOpen(dir)
	if err != nil {
		return "", fmt.Errorf("opening repository %s: %w", dir, err)
	}
	r, err := repo.Storer.Reference(plumbing.ReferenceName(ref))
	if errors.Is(err, plumbing.ErrReferenceNotFound) {
		return gitserver.ZeroID, nil
	}
	if err != nil {
		return "", fmt.Errorf("reading %s of %s: %w", ref, dir, err)
	}
	return r.Hash().String(), nil
}

// archive writes the tree of commit rev into the existing directory dst. It runs
// `git archive` with gitEnv so it sees objects still in git's quarantine, and extracts the
// tar stream itself: regular files (mode 0755 or 0644 as git records them), directories and
// symlinks; an entry that would land outside dst is an error.
func archive(ctx context.Context, gitDir string, gitEnv []string, rev, dst string) error {
	cmd := exec.CommandContext(ctx, "git", "archive", "--format=tar", rev)
	cmd.Dir = gitDir
	cmd.Env = append(append(os.Environ(), "GIT_DIR="+gitDir), gitEnv...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting git archive: %w", err)
	}
	xerr := untar(stdout, dst)
	io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %w: %s", rev, err, strings.TrimSpace(stderr.String()))
	}
	return xerr
}

func untar(r io.Reader, dst string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading archive: %w", err)
		}
		name := filepath.Clean(h.Name)
		if !filepath.IsLocal(name) {
			if h.Typeflag == tar.TypeXGlobalHeader || name == "." {
				continue
			}
			return fmt.Errorf("archive entry %q escapes the build directory", h.Name)
		}
		path := filepath.Join(dst, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o755|0o644)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("writing %s: %w", name, err)
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, path); err != nil {
				return err
			}
		}
	}
}
