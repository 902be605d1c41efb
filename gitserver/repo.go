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
)

// repoDir is where app's bare repository lives. app must have passed ValidAppName.
func (s *Server) repoDir(app string) string {
	return filepath.Join(s.reposDir, app+".git")
}

// ensureRepo returns app's repository, creating it when missing: `git init --bare` into a
// temporary directory beside it, configured, then renamed into place, so a repository is
// either absent or complete and two simultaneous first pushes end up in the same one.
func (s *Server) ensureRepo(ctx context.Context, app string, log *slog.Logger) (string, error) {
	dir := s.repoDir(app)
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("checking repository %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(s.reposDir, ".new-"+app+"-")
	if err != nil {
		return "", fmt.Errorf("creating repository for %s: %w", app, err)
	}
	defer os.RemoveAll(tmp) // after a successful rename there is nothing left to remove
	if err := s.runLocalGit(ctx, "", "init", "--quiet", "--bare", "--initial-branch=main", "--template=", tmp); err != nil {
		return "", fmt.Errorf("creating repository for %s: %w", app, err)
	}
	for _, kv := range [][2]string{
		{"receive.advertisePushOptions", "true"}, // push options reach the hook
		{"receive.shallowUpdate", "true"},        // pushes from --depth 1 clones (CI)
		{"uploadpack.allowFilter", "true"},       // partial clones
		{"receive.unpackLimit", "1"},             // keep pushed packs as packs
		{"receive.maxInputSize", strconv.FormatInt(s.maxPushSize, 10)},
		{"core.hooksPath", s.hooksDir},
		{"core.logAllRefUpdates", "always"}, // a bare repository keeps no reflog otherwise
	} {
		if err := s.runLocalGit(ctx, tmp, "config", kv[0], kv[1]); err != nil {
			return "", fmt.Errorf("configuring repository for %s: %w", app, err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "HEAD")); serr == nil {
			return dir, nil // a simultaneous first push created it first
		}
		return "", fmt.Errorf("creating repository for %s: %w", app, err)
	}
	log.Info("repository created", "dir", dir)
	return dir, nil
}

// setHeadIfEmpty points HEAD of the repository at dir to the first branch in updates when
// the repository has no refs yet, so that a clone checks out the branch the app was first
// pushed from. It runs outside git's quarantine (git refuses ref updates inside it). It
// returns the branch HEAD was set to, or "".
func (s *Server) setHeadIfEmpty(ctx context.Context, dir string, updates []RefUpdate) (string, error) {
	var branch string
	for _, u := range updates {
		if strings.HasPrefix(u.Name, "refs/heads/") && u.New != ZeroID {
			branch = u.Name
			break
		}
	}
	if branch == "" {
		return "", nil
	}
	out, err := s.outputLocalGit(ctx, dir, "for-each-ref", "--count=1", "--format=%(refname)")
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
	cmd.Env = gitEnv(nil)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("running git %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}
