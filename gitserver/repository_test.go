package gitserver

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func openRepo(t *testing.T, dir string) *Repository {
	t.Helper()
	r, err := OpenRepository(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// localGit runs git in dir ("": the current directory) and returns its trimmed output.
func localGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func shell(t *testing.T, dir, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// pushedRepo is a bare repository holding one commit of files, reachable from no ref (as a
// push's objects are before its refs move), and that commit.
func pushedRepo(t *testing.T, files map[string]string) (bare, commit string) {
	t.Helper()
	dir := t.TempDir()
	bare, work := filepath.Join(dir, "app.git"), filepath.Join(dir, "work")
	localGit(t, "", "init", "-q", "--bare", bare)
	localGit(t, "", "init", "-q", "-b", "main", work)
	for name, body := range files {
		p := filepath.Join(work, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	localGit(t, work, "add", "-A")
	localGit(t, work, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "c")
	localGit(t, work, "push", "-q", bare, "HEAD:refs/kpush-test/tmp")
	localGit(t, bare, "update-ref", "-d", "refs/kpush-test/tmp")
	return bare, localGit(t, work, "rev-parse", "HEAD")
}

func TestArchiveWritesTheCommitsTree(t *testing.T) {
	bare, commit := pushedRepo(t, map[string]string{"go.mod": "module x\n", "cmd/x/main.go": "package main\n"})
	dst := t.TempDir()
	if err := openRepo(t, bare).Archive(context.Background(), commit, dst); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"go.mod": "module x\n", "cmd/x/main.go": "package main\n"} {
		got, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, rev := range []string{strings.Repeat("1", 40), "--output=/tmp/x"} {
		if err := openRepo(t, bare).Archive(context.Background(), rev, t.TempDir()); err == nil {
			t.Errorf("archive of %q succeeded", rev)
		}
	}
}

// TestRefsAndResolve reads HEAD's branch, refs (missing: ZeroID), resolves revisions, and
// moves a ref only from the value it is at.
func TestRefsAndResolve(t *testing.T) {
	bare, commit := pushedRepo(t, map[string]string{"f": "x"})
	repo := openRepo(t, bare)
	ctx := context.Background()
	localGit(t, bare, "symbolic-ref", "HEAD", "refs/heads/main")
	if head, err := repo.Head(); err != nil || head != "refs/heads/main" {
		t.Errorf("Head = %q, %v; want refs/heads/main", head, err)
	}
	if v, err := repo.Ref("refs/heads/main"); err != nil || v != ZeroID {
		t.Errorf("Ref of a missing branch = %q, %v; want ZeroID", v, err)
	}
	if err := repo.UpdateRef(ctx, "refs/heads/main", commit, ZeroID, "test"); err != nil {
		t.Fatal(err)
	}
	if v, err := repo.Ref("refs/heads/main"); err != nil || v != commit {
		t.Errorf("Ref = %q, %v; want %s", v, err, commit)
	}
	if err := repo.UpdateRef(ctx, "refs/heads/main", commit, ZeroID, "test"); err == nil {
		t.Error("UpdateRef from ZeroID of an existing ref succeeded")
	}
	for _, rev := range []string{"main", "refs/heads/main", commit, commit[:7]} {
		if got, err := repo.Resolve(ctx, rev); err != nil || got != commit {
			t.Errorf("Resolve(%q) = %q, %v; want %s", rev, got, err, commit)
		}
	}
	for _, rev := range []string{"nope", "--all", "-h", strings.Repeat("2", 40)} {
		if got, err := repo.Resolve(ctx, rev); err == nil {
			t.Errorf("Resolve(%q) = %q, want an error", rev, got)
		}
	}
}

// TestArchiveOfHostileTreeWritesNothingOutside is the second line behind git's fsck (which
// refuses these trees on push, see gitserver and test/): commits written straight into a
// repository whose `git archive` output has a symlink and then a directory of the same name
// with entries under it, or the same the other way round, or entries named "..". The
// directory replaces the link (its entries land inside the build directory), a link cannot
// replace a directory, git archive itself refuses "..", and the sentinel directory beside the
// build directory keeps exactly what it had.
func TestArchiveOfHostileTreeWritesNothingOutside(t *testing.T) {
	base := t.TempDir()
	bare, sentinel := filepath.Join(base, "app.git"), filepath.Join(base, "sentinel")
	localGit(t, "", "init", "-q", "--bare", bare)
	if err := os.MkdirAll(sentinel, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sentinel, "victim"), []byte("original\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	obj := func(content []byte, args ...string) string {
		cmd := exec.Command("git", append([]string{"--git-dir=" + bare, "hash-object", "-w", "--stdin"}, args...)...)
		cmd.Stdin = bytes.NewReader(content)
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	tree := func(entries ...[3]string) string {
		var b bytes.Buffer
		for _, e := range entries {
			oid, _ := hex.DecodeString(e[2])
			fmt.Fprintf(&b, "%s %s\x00", e[0], e[1])
			b.Write(oid)
		}
		return obj(b.Bytes(), "-t", "tree", "--literally")
	}
	pwned := tree([3]string{"100644", "victim", obj([]byte("pwned\n"))})
	for _, tc := range []struct {
		name   string
		tree   string
		errHas string // "": success
	}{
		{"absolute symlink, then a directory of that name", tree([3]string{"120000", "a", obj([]byte(sentinel))}, [3]string{"40000", "a", pwned}), ""},
		{"relative symlink, then a directory of that name", tree([3]string{"120000", "a", obj([]byte("../sentinel"))}, [3]string{"40000", "a", pwned}), ""},
		{"directory, then a symlink of that name", tree([3]string{"40000", "a", pwned}, [3]string{"120000", "a", obj([]byte(sentinel))}), "a directory is in the way"},
		{"entries named ..", tree([3]string{"40000", "..", tree([3]string{"40000", "sentinel", pwned})}), "invalid path '../sentinel/victim'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			commit := localGit(t, "", "--git-dir="+bare, "-c", "user.name=t", "-c", "user.email=t@example.com",
				"commit-tree", "-m", "x", tc.tree)
			dst := filepath.Join(base, "build-"+commit[:7])
			if err := os.Mkdir(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			err := openRepo(t, bare).Archive(context.Background(), commit, dst)
			switch {
			case tc.errHas == "" && err != nil:
				t.Errorf("archive: %v, want success", err)
			case tc.errHas != "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)):
				t.Errorf("archive = %v, want an error with %q", err, tc.errHas)
			case tc.errHas == "":
				if fi, err := os.Lstat(filepath.Join(dst, "a")); err != nil || !fi.IsDir() {
					t.Errorf("a in the build directory: %v, want the directory that replaced the link", err)
				}
				if b, _ := os.ReadFile(filepath.Join(dst, "a", "victim")); string(b) != "pwned\n" {
					t.Errorf("a/victim in the build directory = %q, want the pushed content", b)
				}
			}
			t.Logf("archive: %v", err)
			ents, _ := os.ReadDir(sentinel)
			if b, _ := os.ReadFile(filepath.Join(sentinel, "victim")); string(b) != "original\n" || len(ents) != 1 {
				t.Errorf("the sentinel changed: victim %q, %d entries", b, len(ents))
			}
			ents, _ = os.ReadDir(base)
			for _, e := range ents {
				if n := e.Name(); n != "app.git" && n != "sentinel" && !strings.HasPrefix(n, "build-") {
					t.Errorf("%s appeared beside the build directory", n)
				}
			}
		})
	}
}

// TestKeepFromQuarantineSurvivesItsRemoval keeps a commit that exists only in a quarantine
// directory, as
// in a pre-receive hook, and finds it at its release ref after the quarantine is gone.
func TestKeepFromQuarantineSurvivesItsRemoval(t *testing.T) {
	dir := t.TempDir()
	bare := filepath.Join(dir, "app.git")
	work := filepath.Join(dir, "work")
	localGit(t, "", "init", "-q", "--bare", bare)
	localGit(t, "", "init", "-q", work)
	if err := os.WriteFile(filepath.Join(work, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	localGit(t, work, "add", "-A")
	localGit(t, work, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "c")
	commit := localGit(t, work, "rev-parse", "HEAD")
	q := filepath.Join(bare, "objects", "incoming-test")
	if err := os.MkdirAll(filepath.Join(q, "pack"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := fmt.Sprintf("git rev-list --objects HEAD | git pack-objects -q %s/pack/pack", q)
	shell(t, work, cmd)

	env := []string{"GIT_QUARANTINE_PATH=" + q, "GIT_OBJECT_DIRECTORY=" + q, "GIT_ALTERNATE_OBJECT_DIRECTORIES=" + filepath.Join(bare, "objects")}
	push := &Push{Dir: bare, GitEnv: env}
	repo, err := push.Repository()
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Keep(context.Background(), "refs/kpush/releases/v7", commit, "kpush release v7"); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(q); err != nil { // git drops a rejected push's quarantine
		t.Fatal(err)
	}
	if got := localGit(t, bare, "rev-parse", "refs/kpush/releases/v7"); got != commit {
		t.Errorf("refs/kpush/releases/v7 = %s, want %s", got, commit)
	}
	localGit(t, bare, "cat-file", "-e", commit+"^{tree}")
	localGit(t, bare, "fsck", "--no-dangling")
	// The ref is immutable: keeping another commit under v7 fails.
	if err := openRepo(t, bare).Keep(context.Background(), "refs/kpush/releases/v7", strings.Repeat("1", 40), "kpush release v7"); err == nil {
		t.Error("moving refs/kpush/releases/v7 succeeded")
	}
}
