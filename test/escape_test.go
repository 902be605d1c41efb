package test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

// TestDevPushOfTreeReachingOutsideIsRefused pushes, with the real git client over SSH to a
// real `kpush dev`, commits made with git plumbing whose trees would make a naive extraction
// write outside the build directory: a symlink and then a directory of the same name (so
// `git archive` emits "a -> target" and then "a/x"), aimed at a directory outside the data
// dir, at the data dir, at its hooks, and through "..". Every push is refused at the door by
// git's fsck with kpush's line saying why, and nothing changed: not the data dir (every path,
// type, mode, owner, size and content hash, the repository's objects included, since a
// refused pack keeps none), not a sentinel directory outside. Then a commit with symlinks
// out of the tree that fsck rightly accepts (single entries, links are legal) builds and
// deploys, and still nothing was written through them.
func TestDevPushOfTreeReachingOutsideIsRefused(t *testing.T) {
	s, httpAddr, env := devServer(t)
	data := dataDirOf(s)
	sentinel := filepath.Join(t.TempDir(), "sentinel")
	for p, body := range map[string]string{"victim": "original\n", "sub/keep": "keep\n"} {
		os.MkdirAll(filepath.Join(sentinel, filepath.Dir(p)), 0o755)
		if err := os.WriteFile(filepath.Join(sentinel, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	kpushOK(t, s, "apps:create", "escape") // the repository and the app's state exist before the snapshot

	work := filepath.Join(t.TempDir(), "work")
	git(t, env, "", "init", "-q", "--initial-branch=main", work)
	blob := func(content string) string { return hashObject(t, env, work, []byte(content)) }
	tree := func(entries ...[3]string) string { return rawTree(t, env, work, entries...) }
	hook := blob("#!/bin/sh\necho pwned > /tmp/kpush-pwned\n")
	x := tree([3]string{"100644", "x", blob("pwned\n")})

	cases := []struct {
		name  string
		tree  string
		msgID string
	}{
		{"symlink to a directory outside, then an entry under it",
			tree([3]string{"120000", "a", blob(sentinel)}, [3]string{"40000", "a", x}), "duplicateEntries"},
		{"symlink to the data dir, then state/access.json under it",
			tree([3]string{"120000", "a", blob(data)},
				[3]string{"40000", "a", tree([3]string{"40000", "state", tree([3]string{"100644", "access.json", blob(`{"users":{"mallory":{"admin":true}}}`)})})}),
			"duplicateEntries"},
		{"symlink to the data dir's hooks, then a pre-receive under it",
			tree([3]string{"120000", "h", blob(filepath.Join(data, "hooks"))}, [3]string{"40000", "h", tree([3]string{"100755", "pre-receive", hook})}),
			"duplicateEntries"},
		{"relative symlink ../../.., then an entry under it",
			tree([3]string{"120000", "up", blob("../../../../../../../../..")}, [3]string{"40000", "up", x}), "duplicateEntries"},
		{"tree entries named ..",
			tree([3]string{"40000", "..", tree([3]string{"40000", "..", tree([3]string{"40000", "..", x})})}), "hasDotdot"},
		{"an entry whose name climbs out", tree([3]string{"100644", "../../../../x", blob("pwned\n")}), "fullPathname"},
		{"a .git directory with hooks", tree([3]string{"40000", ".git", tree([3]string{"40000", "hooks", tree([3]string{"100755", "pre-receive", hook})})}),
			"hasDotgit"},
	}
	// Proof that the trees are what they claim: git archive (what kpush runs to build) emits
	// the symlink and then entries under it.
	if out, err := exec.Command("sh", "-c", "git -C "+work+" archive --format=tar "+cases[0].tree+" | tar tvf -").CombinedOutput(); err != nil ||
		!strings.Contains(string(out), "a -> "+sentinel) || !strings.Contains(string(out), "a/x") {
		t.Fatalf("git archive of the first tree: %v\n%s", err, out)
	}

	beforeData, beforeOutside := snapshot(t, data), snapshot(t, sentinel)
	for _, want := range []string{"hooks/pre-receive -r-xr-xr-x ", "repos/escape.git/HEAD ", "state/"} {
		if !strings.Contains(strings.Join(beforeData, "\n"), want) {
			t.Fatalf("the data dir snapshot lacks %q: it would compare nothing:\n%s", want, strings.Join(beforeData, "\n"))
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			commit := git(t, env, work, "commit-tree", "-m", tc.name, tc.tree)
			out, code := push(t, env, work, s.remote("escape"), commit+":refs/heads/main")
			t.Logf("git push:\n%s", out)
			if code == 0 {
				t.Fatalf("push succeeded, want a refusal")
			}
			mustContain(t, out,
				"remote: error: object "+tc.tree+": "+tc.msgID+": ",
				"! [remote rejected] "+commit+" -> main (unpacker error)",
				"kpush: push refused: object "+tc.tree[:12]+" fails git's object checks ("+tc.msgID+": ",
				"could write outside the build directory. Nothing of this push was stored.",
			)
			if refs := git(t, env, work, "ls-remote", s.remote("escape")); refs != "" {
				t.Errorf("the server has refs after a refused push: %q", refs)
			}
		})
	}
	// Nothing excluded: a refused pack leaves no object, no ref, no log line in the data dir.
	if after := snapshot(t, data); !reflect.DeepEqual(after, beforeData) {
		t.Errorf("the data dir changed:\n%s", diffLines(beforeData, after))
	}
	if after := snapshot(t, sentinel); !reflect.DeepEqual(after, beforeOutside) {
		t.Errorf("the sentinel directory outside changed:\n%s", diffLines(beforeOutside, after))
	}
	if _, err := os.Lstat("/tmp/kpush-pwned"); err == nil {
		t.Errorf("/tmp/kpush-pwned exists: a planted hook ran")
	}

	t.Run("symlinks out of the tree alone build without writing through them", func(t *testing.T) {
		app := workTree(t, env, "static")
		for name, target := range map[string]string{"up": "../../../../../../../..", "sentinel": sentinel, "hooks": filepath.Join(data, "hooks")} {
			if err := os.Symlink(target, filepath.Join(app, name)); err != nil {
				t.Fatal(err)
			}
		}
		git(t, env, app, "add", "-A")
		git(t, env, app, "commit", "-q", "-m", "symlinks out")
		hooks := snapshot(t, filepath.Join(data, "hooks"))
		out, code := push(t, env, app, s.remote("links"), "main")
		if code != 0 {
			t.Fatalf("push exited %d:\n%s", code, out)
		}
		t.Logf("git push:\n%s", out)
		if code, body := get(t, httpAddr, printedURL(t, out)); code != 200 || body != "hello from a Procfile app\n" {
			t.Errorf("GET = %d %q", code, body)
		}
		if after := snapshot(t, filepath.Join(data, "hooks")); !reflect.DeepEqual(after, hooks) {
			t.Errorf("the hooks changed:\n%s", diffLines(hooks, after))
		}
		if after := snapshot(t, sentinel); !reflect.DeepEqual(after, beforeOutside) {
			t.Errorf("the sentinel directory outside changed:\n%s", diffLines(beforeOutside, after))
		}
	})
}

// hashObject writes content as a blob (or, with args, another type) into the repository at
// dir and returns its name.
func hashObject(t *testing.T, env []string, dir string, content []byte, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"hash-object", "-w", "--stdin"}, args...)...)
	cmd.Dir, cmd.Env, cmd.Stdin = dir, env, bytes.NewReader(content)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git hash-object: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// rawTree writes a tree object with exactly these {mode, name, object} entries in this order,
// past every check git makes on trees it builds (hash-object --literally).
func rawTree(t *testing.T, env []string, dir string, entries ...[3]string) string {
	t.Helper()
	var b bytes.Buffer
	for _, e := range entries {
		oid, err := hex.DecodeString(e[2])
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %s\x00", e[0], e[1])
		b.Write(oid)
	}
	return hashObject(t, env, dir, b.Bytes(), "-t", "tree", "--literally")
}

// snapshot lists everything under dir: relative path, type and permission bits, owner, and
// for a file its size and content hash, for a symlink its target (directories' sizes and all
// times are left out: they change with no content changing, e.g. when git makes and removes
// its quarantine directory).
func snapshot(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		st := fi.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %v %d:%d", rel, fi.Mode(), st.Uid, st.Gid)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			line += " -> " + l
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %d sha256:%x", fi.Size(), sha256.Sum256(b))
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// diffLines shows the lines only in a (-) and only in b (+).
func diffLines(a, b []string) string {
	in := func(s []string) map[string]bool {
		m := map[string]bool{}
		for _, l := range s {
			m[l] = true
		}
		return m
	}
	ina, inb := in(a), in(b)
	var d strings.Builder
	for _, l := range a {
		if !inb[l] {
			d.WriteString("- " + l + "\n")
		}
	}
	for _, l := range b {
		if !ina[l] {
			d.WriteString("+ " + l + "\n")
		}
	}
	return d.String()
}
