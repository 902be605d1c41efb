package receiver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"

	"kpush.dev/kpush/gitserver"
	intarchive "kpush.dev/kpush/internal/archive"
	"kpush.dev/kpush/internal/atomicfile"
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
// tar stream with internal/archive as a source tree: regular files (mode 0755 or 0644 as git
// records them), directories and symlinks (kept as links, never written through). An entry
// that would reach outside dst (a hand-made tree git's fsck let through) fails with
// archive.ErrUnsafe and nothing outside dst is touched.
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
	xerr := intarchive.Extract(ctx, stdout, dst, intarchive.Options{MaxBytes: intarchive.SourceMaxBytes})
	if xerr != nil {
		// A refused or oversized tree: stop git rather than read the rest (a small push can
		// describe an endless one).
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return xerr
	}
	io.Copy(io.Discard, stdout) // the tar stream's trailing padding
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %w: %s", rev, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// keepSource makes rel's commit reachable for good in the bare repository dir, as
// rel.Ref() (refs/kpush/releases/v<N>). During a push the commit is still in git's
// quarantine, which git drops when the push is rejected, so the quarantine's packs
// (gitEnv's GIT_QUARANTINE_PATH/pack; receive.unpackLimit=1 makes every push one complete
// pack) are hard-linked (copied across file systems) into dir/objects/pack first: .pack, then
// .rev, then .idx, the file that makes git use the pack. The ref is created with
// `git update-ref` from this process, whose environment has no quarantine: git refuses ref
// updates inside one. git receive-pack later migrates the same packs, finding them present.
func (p *Pipeline) keepSource(ctx context.Context, dir string, gitEnv []string, rel *Release) error {
	for _, kv := range gitEnv {
		if q, ok := strings.CutPrefix(kv, "GIT_QUARANTINE_PATH="); ok && q != "" {
			if err := linkPacks(filepath.Join(q, "pack"), filepath.Join(dir, "objects", "pack")); err != nil {
				return fmt.Errorf("keeping the pushed objects: %w", err)
			}
		}
	}
	// A ref already at the commit (state restored from a backup older than the repository)
	// is fine; update-ref refuses one at another commit.
	if cur, err := refValue(dir, rel.Ref()); err == nil && cur == rel.Commit {
		return nil
	}
	cmd := exec.CommandContext(ctx, "git", "--git-dir="+dir, "update-ref", "-m", "kpush release v"+strconv.Itoa(rel.Version),
		rel.Ref(), rel.Commit, "")
	cmd.Env = cleanGitEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("creating %s: %w: %s", rel.Ref(), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// linkPacks links (or copies) every pack of src into dst, skipping .keep files and packs dst
// already has.
func linkPacks(src, dst string) error {
	packs, err := filepath.Glob(filepath.Join(src, "pack-*.pack"))
	if err != nil {
		return err
	}
	for _, pack := range packs {
		base := strings.TrimSuffix(pack, ".pack")
		for _, ext := range []string{".pack", ".rev", ".idx"} {
			from, to := base+ext, filepath.Join(dst, filepath.Base(base)+ext)
			if _, err := os.Stat(from); errors.Is(err, os.ErrNotExist) && ext == ".rev" {
				continue
			}
			if _, err := os.Stat(to); err == nil {
				continue
			}
			if err := os.Link(from, to); err != nil {
				if err := copyFile(from, to); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	return atomicfile.Copy(to, in, 0o444)
}

// cleanGitEnv is this process's environment without the variables that would point git at
// another repository or object store.
func cleanGitEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "GIT_DIR", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_QUARANTINE_PATH",
			"GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR", "GIT_NAMESPACE":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// resolveCommit returns the 40-hex commit rev names in the bare repository dir.
func resolveCommit(ctx context.Context, dir, rev string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", "--git-dir="+dir, "rev-parse", "--verify", "--quiet", "--end-of-options", rev+"^{commit}")
	cmd.Env = cleanGitEnv()
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%q is not a commit of the app's repository", rev)
	}
	return strings.TrimSpace(string(out)), nil
}
