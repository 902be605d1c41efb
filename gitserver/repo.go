package gitserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// HiddenRefPrefix is the ref namespace kpush keeps for itself (e.g.
// refs/kpush/releases/v3, the source of a release). Every repository hides it from pushes
// (receive.hideRefs, git-config(1)): git refuses to create, update or delete refs under it,
// while git fetch still gets them.
const HiddenRefPrefix = "refs/kpush"

// fsckConfig turns on git's own object checks for every push (receive.fsckObjects,
// git-config(1)): receive-pack refuses the whole pack, keeping no object and moving no ref,
// when an object fails them. The message ids set to error here (git-fsck(1) "FSCK MESSAGES")
// are the tree entries that could make an extracted tree reach outside its directory: a name
// twice in one tree (a symlink "a" and then a directory "a" whose entries `git archive` emits
// as a/x: written through the link by a naive extractor), empty, "/"-holding, ".", ".." and
// ".git" names (hasDotgit also catches ".GIT", "git~1" and the HFS/NTFS variants), trees git
// cannot parse or that are not sorted; and the .gitmodules checks, which git makes errors
// anyway, set explicitly so the list says all of it. Everything else keeps git's default
// severity. Every repository has them in its config, and receive-pack gets them on its command
// line too (session.go), so repositories made before them are covered.
var fsckConfig = [][2]string{
	{"receive.fsckObjects", "true"},
	{"receive.fsck.duplicateEntries", "error"},
	{"receive.fsck.emptyName", "error"},
	{"receive.fsck.fullPathname", "error"},
	{"receive.fsck.hasDot", "error"},
	{"receive.fsck.hasDotdot", "error"},
	{"receive.fsck.hasDotgit", "error"},
	{"receive.fsck.badTree", "error"},
	{"receive.fsck.badTreeSha1", "error"},
	{"receive.fsck.treeNotSorted", "error"},
	{"receive.fsck.gitmodulesBlob", "error"},
	{"receive.fsck.gitmodulesLarge", "error"},
	{"receive.fsck.gitmodulesMissing", "error"},
	{"receive.fsck.gitmodulesName", "error"},
	{"receive.fsck.gitmodulesPath", "error"},
	{"receive.fsck.gitmodulesSymlink", "error"},
	{"receive.fsck.gitmodulesUpdate", "error"},
	{"receive.fsck.gitmodulesUrl", "error"},
}

// ErrAppExists is returned (wrapped) by CreateRepo when the app's repository already exists.
var ErrAppExists = errors.New("app already exists")

// repoDir is where app's bare repository lives. app must have passed ValidAppName.
func (s *Server) repoDir(app string) string {
	return filepath.Join(s.reposDir, app+".git")
}

// RepoDir returns the absolute path of app's bare repository (<data>/repos/<app>.git) and
// whether it exists. For a name that fails ValidAppName it returns "", false.
func (s *Server) RepoDir(app string) (dir string, exists bool) {
	if ValidAppName(app) != nil {
		return "", false
	}
	dir = s.repoDir(app)
	_, err := os.Stat(filepath.Join(dir, "HEAD"))
	return dir, err == nil
}

// CreateRepo creates app's bare repository exactly as a first push does and returns its path.
// It fails with an error wrapping ErrAppExists when the repository exists already (also when
// a push created it a moment before), so two creators cannot both believe they made it; the
// caller grants roles to the creator. The name must pass ValidAppName.
func (s *Server) CreateRepo(ctx context.Context, app string) (string, error) {
	if err := ValidAppName(app); err != nil {
		return "", err
	}
	dir, created, lock, err := s.createRepo(ctx, app, s.log.With("app", app))
	lock.Close() // the caller records the app under its own lock (AppRecorder)
	if err != nil {
		return "", err
	}
	if !created {
		return dir, fmt.Errorf("creating app %s: %w", app, ErrAppExists)
	}
	return dir, nil
}

// DeleteRepo removes app's repository with everything in it (releases' source refs too). It
// is first renamed out of the way, so a fetch sees it whole or not at all. A missing
// repository is not an error. Callers make sure no push to app is running.
func (s *Server) DeleteRepo(app string) error {
	if err := ValidAppName(app); err != nil {
		return err
	}
	dir := s.repoDir(app)
	trash, err := os.MkdirTemp(s.reposDir, ".deleted-"+app+"-")
	if err != nil {
		return fmt.Errorf("deleting the repository of %s: %w", app, err)
	}
	if err := os.Rename(dir, filepath.Join(trash, "repo.git")); err != nil && !errors.Is(err, os.ErrNotExist) {
		os.Remove(trash)
		return fmt.Errorf("deleting the repository of %s: %w", app, err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("deleting the repository of %s: %w", app, err)
	}
	s.log.Info("repository deleted", "app", app, "dir", dir)
	return nil
}

// ensureRepo returns app's repository, creating it when missing (createRepo).
func (s *Server) ensureRepo(ctx context.Context, app string, log *slog.Logger) (string, error) {
	dir, _, lock, err := s.createRepo(ctx, app, log)
	lock.Close()
	return dir, err
}

// createRepo returns app's repository, creating it when missing: `git init --bare` into a
// temporary directory beside it, configured, then renamed into place, so a repository is
// either absent or complete and two simultaneous first pushes end up in the same one.
// created is true for the one call that put the repository in place; that call gets the
// repository already held (holdRepo's shared lock, taken before the rename), so that no
// dropAbandoned removes it before its creator has pushed. The caller closes lock (nil when
// not created).
func (s *Server) createRepo(ctx context.Context, app string, log *slog.Logger) (dir string, created bool, lock *repoLock, err error) {
	dir = s.repoDir(app)
	if _, err := os.Stat(dir); err == nil {
		return dir, false, nil, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", false, nil, fmt.Errorf("checking repository %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(s.reposDir, ".new-"+app+"-")
	if err != nil {
		return "", false, nil, fmt.Errorf("creating repository for %s: %w", app, err)
	}
	defer os.RemoveAll(tmp) // after a successful rename there is nothing left to remove
	if err := s.runLocalGit(ctx, "", "init", "--quiet", "--bare", "--initial-branch=main", "--template=", tmp); err != nil {
		return "", false, nil, fmt.Errorf("creating repository for %s: %w", app, err)
	}
	for _, kv := range append([][2]string{
		{"receive.advertisePushOptions", "true"}, // push options reach the hook
		{"receive.shallowUpdate", "true"},        // pushes from --depth 1 clones (CI)
		{"uploadpack.allowFilter", "true"},       // partial clones
		{"receive.unpackLimit", "1"},             // keep pushed packs as packs
		{"receive.maxInputSize", strconv.FormatInt(s.maxPushSize, 10)},
		{"core.hooksPath", s.hooksDir},
		{"core.logAllRefUpdates", "always"},   // a bare repository keeps no reflog otherwise
		{"receive.hideRefs", HiddenRefPrefix}, // pushes cannot touch kpush's own refs
	}, fsckConfig...) {
		if err := s.runLocalGit(ctx, tmp, "config", kv[0], kv[1]); err != nil {
			return "", false, nil, fmt.Errorf("configuring repository for %s: %w", app, err)
		}
	}
	lock, err = lockDir(tmp, syscall.LOCK_SH) // the lock is the inode's: it moves with the rename
	if err != nil {
		return "", false, nil, fmt.Errorf("creating repository for %s: %w", app, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		lock.Close()
		if _, serr := os.Stat(filepath.Join(dir, "HEAD")); serr == nil {
			return dir, false, nil, nil // a simultaneous first push created it first
		}
		return "", false, nil, fmt.Errorf("creating repository for %s: %w", app, err)
	}
	log.Info("repository created", "dir", dir)
	return dir, true, lock, nil
}

// repoLock is an flock(2) of a repository's directory. Every push holds it shared from before
// git receive-pack starts until after it has exited; dropAbandoned holds it exclusively, so
// it never removes a repository a push (of any kpush process sharing the data dir) is using.
type repoLock struct{ f *os.File }

// lockDir opens dir and flocks it with how (syscall.LOCK_SH or LOCK_EX, possibly with
// LOCK_NB).
func lockDir(dir string, how int) (*repoLock, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return &repoLock{f}, nil
}

// Close gives the lock up; a nil lock is none.
func (l *repoLock) Close() {
	if l != nil {
		l.f.Close()
	}
}

// errRepoGone is holdRepo's answer when the repository was removed (dropAbandoned) between
// finding it and locking it.
var errRepoGone = errors.New("the repository was removed meanwhile")

// holdRepo takes the shared lock of the repository at dir for a push, and checks it is still
// the repository at dir: else errRepoGone, and the caller looks again.
func holdRepo(dir string) (*repoLock, error) {
	l, err := lockDir(dir, syscall.LOCK_SH)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errRepoGone
	}
	if err != nil {
		return nil, err
	}
	if !l.isAt(dir) {
		l.Close()
		return nil, errRepoGone
	}
	return l, nil
}

// isAt reports whether the locked directory is (still) the one at dir.
func (l *repoLock) isAt(dir string) bool {
	held, err := l.f.Stat()
	if err != nil {
		return false
	}
	now, err := os.Stat(dir)
	return err == nil && os.SameFile(held, now)
}

// AppRecorder is implemented by a Handler that keeps a record of every app
// (receiver.Pipeline does): an app's repository without a ref is only removed while the app
// has no record (dropAbandoned), and the record cannot be made meanwhile (apps:create makes
// the repository a moment before the record).
type AppRecorder interface {
	// UnlessRecorded calls drop unless app has a record, while none can be made, and reports
	// whether it called it.
	UnlessRecorded(ctx context.Context, app string, drop func() error) (bool, error)
}

// dropAbandoned removes app's repository at dir, and every grant on app, when the repository
// holds no ref, no push holds it (holdRepo) and the app was never created (AppRecorder): what
// a first push leaves that ends before it created the app (the client disconnected, or sent
// no ref update), or a server that stopped in the middle of one. Otherwise the name would stay
// taken by an app that does not exist, administered by whoever tried. It reports whether it
// removed them. The grants go first: a grant left behind would apply to the next creator's app.
func (s *Server) dropAbandoned(ctx context.Context, app, dir string, log *slog.Logger) (bool, error) {
	// A push holds the lock shared for as long as it runs. So, for the moment between fork and
	// exec, does any child process this process starts meanwhile (the descriptor is close-on-exec,
	// the lock its open file's): a refusal that lasts is a push, one that passes was a child.
	var l *repoLock
	var err error
	for try := 0; ; try++ {
		l, err = lockDir(dir, syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) || try == 10 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.EWOULDBLOCK) {
		return false, nil // gone already, or a push holds it: that push looks again when it ends
	}
	if err != nil {
		return false, fmt.Errorf("locking the repository of %s: %w", app, err)
	}
	defer l.Close()
	if !l.isAt(dir) {
		return false, nil
	}
	refs, err := s.outputLocalGit(ctx, dir, "for-each-ref", "--count=1", "--format=%(refname)")
	if err != nil || len(bytes.TrimSpace(refs)) > 0 {
		return false, err
	}
	drop := func() error {
		if s.access != nil {
			if err := s.access.RemoveApp(app); err != nil {
				return fmt.Errorf("removing the grants on %s: %w", app, err)
			}
		}
		return s.DeleteRepo(app)
	}
	dropped := true
	if r, ok := s.handler.(AppRecorder); ok {
		dropped, err = r.UnlessRecorded(ctx, app, drop)
	} else {
		err = drop()
	}
	if err != nil {
		return false, err
	}
	if dropped {
		log.Info("removed the empty repository and the grants of an app no push created")
	}
	return dropped, nil
}

// setHeadIfEmpty points HEAD of the repository at dir to the first branch in updates when
// the repository has no refs yet, so that a clone checks out the branch the app was first
// pushed from. It runs outside git's quarantine (git refuses ref updates inside it). It
// returns the branch HEAD was set to, or "".
func (s *Server) setHeadIfEmpty(ctx context.Context, dir string, updates []RefUpdate) (string, error) {
	branch := deployBranchOf(updates)
	if branch == "" {
		return "", nil
	}
	out, err := s.outputLocalGit(ctx, dir, "for-each-ref", "--count=1", "--format=%(refname)", "refs/heads/")
	if err != nil {
		return "", err
	}
	if len(bytes.TrimSpace(out)) > 0 {
		return "", nil
	}
	if err := s.runLocalGit(ctx, dir, "symbolic-ref", "HEAD", branch); err != nil {
		return "", err
	}
	return branch, nil
}

// deployBranchOf picks the branch HEAD should point at when a push creates the first
// branches of a repository: main, else master, else the first branch created — so that
// `git push --all` of a repository with a main branch deploys main, not whichever branch
// sorts first. It returns "" when the push creates no branch.
func deployBranchOf(updates []RefUpdate) string {
	var first string
	for _, pref := range []string{"refs/heads/main", "refs/heads/master", ""} {
		for _, u := range updates {
			if !strings.HasPrefix(u.Name, "refs/heads/") || u.New == ZeroID {
				continue
			}
			if first == "" {
				first = u.Name
			}
			if u.Name == pref {
				return pref
			}
		}
	}
	return first
}

func (s *Server) runLocalGit(ctx context.Context, gitDir string, args ...string) error {
	_, err := s.outputLocalGit(ctx, gitDir, args...)
	return err
}

// outputLocalGit runs git on the bare repository gitDir (none if "") and returns its stdout;
// the error carries its stderr.
func (s *Server) outputLocalGit(ctx context.Context, gitDir string, args ...string) ([]byte, error) {
	if gitDir != "" {
		args = append([]string{"--git-dir=" + gitDir}, args...)
	}
	cmd := exec.CommandContext(ctx, s.git, args...)
	cmd.Env = Env()
	return run(cmd, args)
}
