package gitserver

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

// treeEntry is one raw entry of a hand-made tree object: mode as git writes it ("100644",
// "120000", "40000"), any name, the object it points at.
type treeEntry struct{ mode, name, oid string }

// writeTree writes a tree object with exactly these entries, in this order, bypassing every
// check git makes on trees it builds itself (hash-object --literally).
func (g *gitClient) writeTree(dir string, entries ...treeEntry) string {
	g.t.Helper()
	var b bytes.Buffer
	for _, e := range entries {
		raw, err := hex.DecodeString(e.oid)
		if err != nil {
			g.t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %s\x00", e.mode, e.name)
		b.Write(raw)
	}
	return g.hashObject(dir, &b, "-t", "tree", "--literally")
}

func (g *gitClient) writeBlob(dir, content string) string {
	g.t.Helper()
	return g.hashObject(dir, strings.NewReader(content))
}

func (g *gitClient) hashObject(dir string, stdin interface{ Read([]byte) (int, error) }, args ...string) string {
	g.t.Helper()
	cmd := g.cmd(dir, append([]string{"hash-object", "-w", "--stdin"}, args...)...)
	cmd.Stdin = stdin
	out, err := cmd.Output()
	if err != nil {
		g.t.Fatalf("git hash-object %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// objectsOf lists a bare repository's objects directory: every path with its size.
func objectsOf(t *testing.T, gitDir string) []string {
	t.Helper()
	var out []string
	root := filepath.Join(gitDir, "objects")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, fmt.Sprintf("%s %d", strings.TrimPrefix(p, root), fi.Size()))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPushOfUnsafeTreeRefusedByFsck pushes, over SSH to the real server, commits whose trees
// git's fsck flags (each could make an extracted tree reach outside its directory): the push
// fails with git's own message and kpush's line, the handler is never called, no ref moves
// and not one object is kept. A repository whose config predates the checks is covered by
// receive-pack's command line. (An empty name is not here: git's own pack-objects refuses to
// send such a tree, "fatal: empty filename in tree entry".)
func TestPushOfUnsafeTreeRefusedByFsck(t *testing.T) {
	rec := &recorder{}
	ts := startServer(t, rec)
	g := ts.git(t, ts.aliceKey)
	work := g.newRepo()
	g.must(work, "push", "-q", ts.scpURL("demo"), "main")
	good := g.must(work, "rev-parse", "HEAD")
	dir, _ := ts.RepoDir("demo")
	for key, want := range map[string]string{
		"receive.fsckObjects": "true", "receive.fsck.duplicateEntries": "error", "receive.fsck.hasDotdot": "error",
		"receive.fsck.hasDotgit": "error", "receive.fsck.fullPathname": "error", "receive.fsck.gitmodulesSymlink": "error",
	} {
		if got := serverGit(t, dir, "config", "--get", key); got != want {
			t.Errorf("repository config %s = %q, want %q", key, got, want)
		}
	}

	blob := g.writeBlob(work, "pwned\n")
	link := g.writeBlob(work, "/tmp/outside")
	sub := g.writeTree(work, treeEntry{"100644", "x", blob})
	for _, tc := range []struct {
		name    string
		entries []treeEntry
		msgID   string
		oldRepo bool // the repository's config has no fsck settings
	}{
		{"symlink and a directory under the same name", []treeEntry{{"120000", "a", link}, {"40000", "a", sub}}, "duplicateEntries", false},
		{"same, repository made before the checks", []treeEntry{{"120000", "a", link}, {"40000", "a", sub}}, "duplicateEntries", true},
		{"entry named ..", []treeEntry{{"40000", "..", sub}}, "hasDotdot", false},
		{"entry named .", []treeEntry{{"40000", ".", sub}}, "hasDot", false},
		{"entry named .git", []treeEntry{{"40000", ".git", sub}}, "hasDotgit", false},
		{"entry named .GIT", []treeEntry{{"40000", ".GIT", sub}}, "hasDotgit", false},
		{"entry with a slash in its name", []treeEntry{{"100644", "../../x", blob}}, "fullPathname", false},
		{"unsorted tree", []treeEntry{{"100644", "b", blob}, {"100644", "a", blob}}, "treeNotSorted", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.oldRepo {
				for _, kv := range fsckConfig {
					serverGit(t, dir, "config", "--unset-all", kv[0])
				}
			}
			tree := g.writeTree(work, tc.entries...)
			commit := g.must(work, "commit-tree", "-p", good, "-m", tc.name, tree)
			objects, calls := objectsOf(t, dir), rec.count()
			_, stderr, err := g.run(work, "push", ts.scpURL("demo"), commit+":refs/heads/main")
			t.Logf("git push:\n%s", stderr)
			if err == nil {
				t.Fatalf("push succeeded, want a refusal")
			}
			for _, want := range []string{
				"remote: error: object " + tree + ": " + tc.msgID + ": ",
				"! [remote rejected] " + commit + " -> main (unpacker error)",
				"kpush: push refused: object " + tree[:12] + " fails git's object checks (" + tc.msgID + ": ",
				"Nothing of this push was stored.",
			} {
				if !strings.Contains(stderr, want) {
					t.Errorf("output lacks %q", want)
				}
			}
			if rec.count() != calls {
				t.Error("the pre-receive handler was called for a refused pack")
			}
			if got := serverGit(t, dir, "for-each-ref", "--format=%(refname) %(objectname)"); got != "refs/heads/main "+good {
				t.Errorf("refs after the refused push: %q, want only main at %s", got, good)
			}
			if after := objectsOf(t, dir); !reflect.DeepEqual(after, objects) {
				t.Errorf("objects changed:\nbefore %q\nafter  %q", objects, after)
			}
		})
	}
}

// TestHookInstalledReadOnly: the pre-receive hook and its directory are 0555 and owned by the
// server's uid; a restart puts back a changed hook and a loosened directory mode, removes any
// other hook someone planted there, and replaces a pre-receive that is a directory or a
// symlink (never writing through it).
func TestHookInstalledReadOnly(t *testing.T) {
	data := t.TempDir()
	keys := filepath.Join(t.TempDir(), "authorized_keys")
	os.WriteFile(keys, nil, 0o600)
	if _, err := New(&recorder{}, WithDataDir(data), WithAuthorizedKeys(keys)); err != nil {
		t.Fatal(err)
	}
	hooks := filepath.Join(data, "hooks")
	want, err := os.ReadFile(filepath.Join(hooks, "pre-receive"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(want), "#!/bin/sh\n") || !strings.Contains(string(want), "'hook' 'pre-receive' \"$@\"") {
		t.Fatalf("pre-receive = %q, want the script that execs the hook command", want)
	}
	checkReadOnly := func(t *testing.T) {
		t.Helper()
		for p, mode := range map[string]fs.FileMode{hooks: fs.ModeDir | 0o555, filepath.Join(hooks, "pre-receive"): 0o555} {
			fi, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			if st := fi.Sys().(*syscall.Stat_t); fi.Mode() != mode || int(st.Uid) != os.Geteuid() {
				t.Errorf("%s: mode %v uid %d, want %v uid %d", p, fi.Mode(), st.Uid, mode, os.Geteuid())
			}
		}
		ents, _ := os.ReadDir(hooks)
		if len(ents) != 1 {
			t.Errorf("hooks dir holds %d entries, want only pre-receive", len(ents))
		}
		if got, _ := os.ReadFile(filepath.Join(hooks, "pre-receive")); !bytes.Equal(got, want) {
			t.Errorf("pre-receive is %q, want %q", got, want)
		}
	}
	checkReadOnly(t)

	// Tampered with: loosened modes, another script, a planted post-receive.
	os.Chmod(hooks, 0o777)
	os.Chmod(filepath.Join(hooks, "pre-receive"), 0o777)
	os.WriteFile(filepath.Join(hooks, "pre-receive"), []byte("#!/bin/sh\necho pwned\n"), 0o777)
	os.WriteFile(filepath.Join(hooks, "post-receive"), []byte("#!/bin/sh\necho pwned\n"), 0o755)
	os.Mkdir(filepath.Join(hooks, "update"), 0o755)
	os.WriteFile(filepath.Join(hooks, hookTmpPrefix+"left-by-a-crash"), nil, 0o600)
	if _, err := New(&recorder{}, WithDataDir(data), WithAuthorizedKeys(keys)); err != nil {
		t.Fatal(err)
	}
	checkReadOnly(t)

	// pre-receive made a directory, or a symlink to a script elsewhere.
	os.Chmod(hooks, 0o755)
	os.Remove(filepath.Join(hooks, "pre-receive"))
	os.MkdirAll(filepath.Join(hooks, "pre-receive", "x"), 0o755)
	if _, err := New(&recorder{}, WithDataDir(data), WithAuthorizedKeys(keys)); err != nil {
		t.Fatal(err)
	}
	checkReadOnly(t)
	os.Chmod(hooks, 0o755)
	os.Remove(filepath.Join(hooks, "pre-receive"))
	elsewhere := filepath.Join(t.TempDir(), "evil")
	os.WriteFile(elsewhere, []byte("#!/bin/sh\necho pwned\n"), 0o755)
	os.Symlink(elsewhere, filepath.Join(hooks, "pre-receive"))
	if _, err := New(&recorder{}, WithDataDir(data), WithAuthorizedKeys(keys)); err != nil {
		t.Fatal(err)
	}
	checkReadOnly(t)
	if b, _ := os.ReadFile(elsewhere); string(b) != "#!/bin/sh\necho pwned\n" {
		t.Errorf("the symlink's target was written: %q", b)
	}
}

// TestNewRefusesUnsafeHooksDir: a hooks directory that is a symbolic link, or is owned by
// another uid, stops New with an error that says what is wrong, and nothing is written
// through the link.
func TestNewRefusesUnsafeHooksDir(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, hooks string)
		want  string
	}{
		{"symlink to another directory", func(t *testing.T, hooks string) {
			target := filepath.Join(filepath.Dir(hooks), "elsewhere")
			os.Mkdir(target, 0o755)
			if err := os.Symlink(target, hooks); err != nil {
				t.Fatal(err)
			}
		}, "is a symbolic link"},
		{"dangling symlink", func(t *testing.T, hooks string) {
			if err := os.Symlink("/nonexistent-kpush-hooks", hooks); err != nil {
				t.Fatal(err)
			}
		}, "is a symbolic link"},
		{"owned by another uid", func(t *testing.T, hooks string) {
			if os.Geteuid() != 0 {
				t.Skip("chown to another uid needs root (kpush's tests run as root)")
			}
			os.Mkdir(hooks, 0o755)
			if err := os.Chown(hooks, 12345, 12345); err != nil {
				t.Fatal(err)
			}
		}, "is owned by uid 12345, not by kpush's uid"},
		{"a file", func(t *testing.T, hooks string) { os.WriteFile(hooks, nil, 0o644) }, "is not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := t.TempDir()
			hooks := filepath.Join(data, "hooks")
			tc.setup(t, hooks)
			keys := filepath.Join(t.TempDir(), "authorized_keys")
			os.WriteFile(keys, nil, 0o600)
			_, err := New(&recorder{}, WithDataDir(data), WithAuthorizedKeys(keys))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), hooks) {
				t.Fatalf("New = %v, want an error naming %s with %q", err, hooks, tc.want)
			}
			t.Logf("New: %v", err)
			if _, err := os.Lstat(filepath.Join(data, "elsewhere", "pre-receive")); err == nil {
				t.Error("pre-receive was written through the symbolic link")
			}
		})
	}
}

// TestFsckWatchFindsTheRefusal: git's fsck line is found when it arrives in pieces, inside
// side-band packets, on either stream; everything passes through unchanged; nothing else
// (a ref advertisement, a hook's output that merely mentions fsck) is taken for it.
func TestFsckWatchFindsTheRefusal(t *testing.T) {
	const oid = "f1e22ace074b99c5654b081e20a242afa94438cb"
	line := "0062\x02error: object " + oid + ": duplicateEntries: contains duplicate file entries        \n"
	for _, tc := range []struct {
		name   string
		writes []string
		stderr bool
		want   string
	}{
		{"side-band, in pieces", []string{"0000", line[:20], line[20:50], line[50:]}, false, "(duplicateEntries: contains duplicate file entries): a tree entry"},
		{"stderr, whole", []string{"error: object " + oid + ": hasDotgit: contains '.git'\n"}, true, "(hasDotgit: contains '.git'): a tree entry"},
		{"other check, no path clause", []string{"error: object " + oid + ": badDate: invalid author/committer line - bad date\n"}, true, "(badDate: invalid author/committer line - bad date). Nothing"},
		{"ref advertisement and hook output", []string{"003f" + oid + " refs/heads/main\x00report-status\n", "remote: fsck error: object x\n"}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			wo, we := newFsckWatch(&out, &errOut, make(chan struct{}))
			w := wo
			if tc.stderr {
				w = we
			}
			for _, p := range tc.writes {
				w.Write([]byte(p))
			}
			if got := out.String() + errOut.String(); got != strings.Join(tc.writes, "") {
				t.Errorf("passed through %q, want %q", got, strings.Join(tc.writes, ""))
			}
			got := wo.refusal()
			if tc.want == "" && got != "" || tc.want != "" && (!strings.Contains(got, tc.want) || !strings.HasPrefix(got, "kpush: push refused: object "+oid[:12]+" ")) {
				t.Errorf("refusal = %q, want one with %q", got, tc.want)
			}
		})
	}
	t.Run("after the hook ran", func(t *testing.T) {
		hookRan := make(chan struct{})
		var out bytes.Buffer
		w, _ := newFsckWatch(&out, io.Discard, hookRan)
		close(hookRan)
		w.Write([]byte(line))
		if got := w.refusal(); got != "" || out.String() != line {
			t.Errorf("refusal = %q, passed %q; want none and the line passed through", got, out.String())
		}
	})
}
