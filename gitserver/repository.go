package gitserver

import (
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

	"kpush.dev/kpush/internal/archive"
	"kpush.dev/kpush/internal/atomicfile"
	"kpush.dev/kpush/internal/tools"
)

// Repository is an app's bare repository as kpush reads and writes it beside git's own
// receive-pack and upload-pack: its refs (small reads through go-git), the tree of a commit
// (`git archive`), and the refs that keep releases' sources (`git update-ref`). Every git it
// runs is the server's (tools.Path) with the server's clean environment (Env).
//
// A Repository from Push.Repository sees the pushed objects still in git's quarantine; one
// from OpenRepository sees only what is in the repository.
type Repository struct {
	dir string
	git string
	// quarantine is the push's GIT_OBJECT_DIRECTORY, GIT_ALTERNATE_OBJECT_DIRECTORIES and
	// GIT_QUARANTINE_PATH, nil outside a push.
	quarantine []string
}

// OpenRepository returns the bare repository at dir.
func OpenRepository(dir string) (*Repository, error) {
	git, err := tools.Path("git")
	if err != nil {
		return nil, err
	}
	return &Repository{dir: dir, git: git}, nil
}

// Repository returns the pushed-to repository, seeing the objects of the push while they are
// still in git's quarantine.
func (p *Push) Repository() (*Repository, error) {
	r, err := OpenRepository(p.Dir)
	if err != nil {
		return nil, err
	}
	r.quarantine = p.GitEnv
	return r, nil
}

// Dir is the repository's absolute path.
func (r *Repository) Dir() string { return r.dir }

// Env is the environment of the git processes kpush starts outside a push: its own, minus
// the variables that would point git at another repository, object store or push
// (git rev-parse --local-env-vars, the quarantine, push options, kpush's hook variables).
func Env() []string { return gitEnv(nil) }

// Head returns the full name of the branch HEAD points at, e.g. "refs/heads/main": the
// app's deploy branch (the server points HEAD at the first branch pushed).
func (r *Repository) Head() (string, error) {
	repo, err := git.PlainOpen(r.dir)
	if err != nil {
		return "", fmt.Errorf("opening repository %s: %w", r.dir, err)
	}
	head, err := repo.Storer.Reference(plumbing.HEAD)
	if err != nil {
		return "", fmt.Errorf("reading HEAD of %s: %w", r.dir, err)
	}
	if head.Type() != plumbing.SymbolicReference {
		return "", fmt.Errorf("HEAD of %s is detached at %s", r.dir, head.Hash())
	}
	return head.Target().String(), nil
}

// Ref returns the object name ref points at, or ZeroID when the ref does not exist.
func (r *Repository) Ref(name string) (string, error) {
	repo, err := git.PlainOpen(r.dir)
	if err != nil {
		return "", fmt.Errorf("opening repository %s: %w", r.dir, err)
	}
	ref, err := repo.Storer.Reference(plumbing.ReferenceName(name))
	if errors.Is(err, plumbing.ErrReferenceNotFound) {
		return ZeroID, nil
	}
	if err != nil {
		return "", fmt.Errorf("reading %s of %s: %w", name, r.dir, err)
	}
	return ref.Hash().String(), nil
}

// Resolve returns the 40-hex commit rev (a commit, branch, tag or ref) names.
func (r *Repository) Resolve(ctx context.Context, rev string) (string, error) {
	out, err := r.output(ctx, "rev-parse", "--verify", "--quiet", "--end-of-options", rev+"^{commit}")
	if err != nil {
		return "", fmt.Errorf("%q is not a commit of the app's repository", rev)
	}
	return strings.TrimSpace(string(out)), nil
}

// Archive writes the tree of commit rev into the existing directory dst. `git archive` sees
// the push's quarantine, and its tar stream is extracted with internal/archive as a source
// tree: regular files (mode 0755 or 0644 as git records them), directories and symlinks (kept
// as links, never written through). An entry that would reach outside dst (a hand-made tree
// git's fsck let through) fails with archive.ErrUnsafe and nothing outside dst is touched.
func (r *Repository) Archive(ctx context.Context, rev, dst string) error {
	cmd := r.command(ctx, "archive", "--format=tar", "--end-of-options", rev)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting git archive: %w", err)
	}
	xerr := archive.Extract(ctx, stdout, dst, archive.Options{MaxBytes: archive.SourceMaxBytes})
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

// UpdateRef moves ref from old (ZeroID: the ref must not exist yet) to new, with msg in the
// reflog; git refuses when ref is elsewhere. It runs outside the quarantine: git refuses ref
// updates inside one.
func (r *Repository) UpdateRef(ctx context.Context, ref, new, old, msg string) error {
	_, err := r.outputClean(ctx, "update-ref", "-m", msg, "--end-of-options", ref, new, old)
	return err
}

// Keep makes commit reachable for good as ref (kpush keeps releases' sources at
// refs/kpush/releases/vN). During a push the commit is still in git's quarantine, which git
// drops when the push is rejected, so the quarantine's packs (receive.unpackLimit=1 makes
// every push one complete pack) are hard-linked (copied across file systems) into the
// repository's objects/pack first: .pack, then .rev, then .idx, the file that makes git use
// the pack. git receive-pack later migrates the same packs, finding them present. A ref
// already at commit is fine (state restored from a backup older than the repository); one at
// another commit is refused.
func (r *Repository) Keep(ctx context.Context, ref, commit, msg string) error {
	for _, kv := range r.quarantine {
		if q, ok := strings.CutPrefix(kv, "GIT_QUARANTINE_PATH="); ok && q != "" {
			if err := linkPacks(filepath.Join(q, "pack"), filepath.Join(r.dir, "objects", "pack")); err != nil {
				return fmt.Errorf("keeping the pushed objects: %w", err)
			}
		}
	}
	if cur, err := r.Ref(ref); err == nil && cur == commit {
		return nil
	}
	return r.UpdateRef(ctx, ref, commit, ZeroID, msg)
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

// command is git on the repository, seeing the push's quarantine if there is one.
func (r *Repository) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, r.git, append([]string{"--git-dir=" + r.dir}, args...)...)
	cmd.Env = append(Env(), r.quarantine...)
	return cmd
}

// output runs git on the repository (seeing the quarantine) and returns its stdout; the error
// carries its stderr.
func (r *Repository) output(ctx context.Context, args ...string) ([]byte, error) {
	return run(r.command(ctx, args...), args)
}

// outputClean is output without the quarantine, for ref updates.
func (r *Repository) outputClean(ctx context.Context, args ...string) ([]byte, error) {
	cmd := r.command(ctx, args...)
	cmd.Env = Env()
	return run(cmd, args)
}

func run(cmd *exec.Cmd, args []string) ([]byte, error) {
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
