package receiver

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
	run(t, "", "git", "init", "-q", "--bare", bare)
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
			commit := strings.TrimSpace(run(t, "", "git", "--git-dir="+bare, "-c", "user.name=t", "-c", "user.email=t@example.com",
				"commit-tree", "-m", "x", tc.tree))
			dst := filepath.Join(base, "build-"+commit[:7])
			if err := os.Mkdir(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			err := archive(context.Background(), bare, nil, commit, dst)
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
