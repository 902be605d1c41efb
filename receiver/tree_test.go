package receiver

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	intarchive "kpush.dev/kpush/internal/archive"
)

const testOID = "4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393"

func pointer(size string) string {
	return "version https://git-lfs.github.com/spec/v1\noid sha256:" + testOID + "\nsize " + size + "\n"
}

func TestIsLFSPointerFollowsTheSpec(t *testing.T) {
	big := pointer("12345") + strings.Repeat("x", lfsMaxPointer)
	for _, tc := range []struct {
		name string
		body string
		want bool
	}{
		{"pointer", pointer("12345"), true},
		{"pointer with an extension line", "version https://git-lfs.github.com/spec/v1\next-0-foo sha256:" + testOID + "\noid sha256:" + testOID + "\nsize 3\n", true},
		{"pre-release version line", "version https://hawser.github.com/spec/v1\noid sha256:" + testOID + "\nsize 3\n", true},
		{"empty file", "", false},
		{"version line alone", "version https://git-lfs.github.com/spec/v1\n", false},
		{"no size", "version https://git-lfs.github.com/spec/v1\noid sha256:" + testOID + "\n", false},
		{"no oid", "version https://git-lfs.github.com/spec/v1\nsize 3\n", false},
		{"short oid", "version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 3\n", false},
		{"uppercase oid", "version https://git-lfs.github.com/spec/v1\noid sha256:" + strings.ToUpper(testOID) + "\nsize 3\n", false},
		{"size not a number", pointer("12k"), false},
		{"no final newline", strings.TrimSuffix(pointer("3"), "\n"), false},
		{"CRLF lines", strings.ReplaceAll(pointer("3"), "\n", "\r\n"), false},
		{"another version", strings.Replace(pointer("3"), "spec/v1", "spec/v2", 1), false},
		{"version not first", "oid sha256:" + testOID + "\nversion https://git-lfs.github.com/spec/v1\nsize 3\n", false},
		{"a document quoting the spec", "version https://git-lfs.github.com/spec/v1\nis the first line of a pointer file.\n", false},
		{"big file starting with a pointer", big, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := isLFSPointer([]byte(tc.body)); got != tc.want {
				t.Errorf("isLFSPointer(%q) = %v, want %v", tc.body, got, tc.want)
			}
		})
	}
}

func TestParseGitmodulesReadsPathsAndURLs(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []submodule
	}{
		{"one", "[submodule \"lib\"]\n\tpath = lib\n\turl = https://example.com/lib.git\n",
			[]submodule{{"lib", "https://example.com/lib.git"}}},
		{"two, keys in any case, quotes and comments",
			"# modules\n[submodule \"a\"]\n\tPath = \"vendor/a\" ; the first\n\tURL = git@example.com:a.git\n[submodule \"b\"]\nurl=../b.git\npath=b/\n",
			[]submodule{{"vendor/a", "git@example.com:a.git"}, {"b", "../b.git"}}},
		{"no path is left out", "[submodule \"x\"]\n\turl = https://example.com/x.git\n", nil},
		{"other sections are ignored", "[core]\n\tpath = nope\n[submodule \"y\"]\n\tpath = y\n", []submodule{{"y", ""}}},
		{"a section repeated adds to it", "[submodule \"z\"]\npath = z\n[submodule \"z\"]\nurl = u\n", []submodule{{"z", "u"}}},
		{"garbage", "path = a\n[submodule\nurl\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseGitmodules([]byte(tc.body)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("parseGitmodules = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLFSPatternsAreTheFilterLFSOnes(t *testing.T) {
	got := lfsPatterns([]byte("# lfs\n*.psd filter=lfs diff=lfs merge=lfs -text\n*.txt text\n[attr]lfs filter=lfs\nmodels/** filter=lfs\n"))
	if want := []string{"*.psd", "models/**"}; !reflect.DeepEqual(got, want) {
		t.Errorf("lfsPatterns = %q, want %q", got, want)
	}
}

// TestScanTreeFindsPointersByContent covers what decides: pointer content, not .gitattributes.
func TestScanTreeFindsPointersByContent(t *testing.T) {
	for _, tc := range []struct {
		name     string
		files    map[string]string
		pointers []string
		patterns []string
	}{
		{"pointers and attributes", map[string]string{
			".gitattributes": "*.bin filter=lfs diff=lfs merge=lfs -text\n",
			"a.bin":          pointer("10"),
			"deep/b.bin":     pointer("20"),
			"main.go":        "package main\n",
		}, []string{"a.bin", "deep/b.bin"}, []string{"*.bin"}},
		{".gitattributes alone builds", map[string]string{
			".gitattributes": "*.bin filter=lfs diff=lfs merge=lfs -text\n",
			"a.bin":          "real content\n",
		}, nil, []string{"*.bin"}},
		{"a pointer without attributes is still a pointer", map[string]string{"a.bin": pointer("1")}, []string{"a.bin"}, nil},
		{"a big file starting like a pointer is content", map[string]string{"a.bin": pointer("1") + strings.Repeat("x", 4096)}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, body := range tc.files {
				p := filepath.Join(dir, name)
				os.MkdirAll(filepath.Dir(p), 0o755)
				if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			r, err := scanTree(dir)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(r.LFSPointers, tc.pointers) || !reflect.DeepEqual(r.LFSPatterns, tc.patterns) {
				t.Errorf("pointers %q patterns %q, want %q %q", r.LFSPointers, r.LFSPatterns, tc.pointers, tc.patterns)
			}
		})
	}
}

func TestScanTreeDoesNotFollowSymlinks(t *testing.T) {
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "p"), []byte(pointer("1")), 0o644)
	os.WriteFile(filepath.Join(outside, "gm"), []byte("[submodule \"s\"]\npath = s\nurl = https://x\n"), 0o644)
	dir := t.TempDir()
	os.Symlink(filepath.Join(outside, "p"), filepath.Join(dir, "a.bin"))
	os.Symlink(filepath.Join(outside, "gm"), filepath.Join(dir, ".gitmodules"))
	os.Symlink(outside, filepath.Join(dir, "d"))
	r, err := scanTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.LFSPointers) != 0 || len(r.Submodules) != 0 {
		t.Errorf("followed a symlink: %+v", r)
	}
}

// TestScanTreeListsGitlinksGitArchiveLeavesEmpty extracts a real commit with a gitlink the
// way a build does (git archive, internal/archive): git archive writes a submodule as an
// empty directory, which scanTree lists with its .gitmodules URL, credentials dropped.
func TestScanTreeListsGitlinksGitArchiveLeavesEmpty(t *testing.T) {
	work := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, b)
		}
		return strings.TrimSpace(string(b))
	}
	run("init", "-q")
	os.WriteFile(filepath.Join(work, "main.go"), []byte("package main\n"), 0o644)
	run("add", "main.go")
	run("commit", "-q", "-m", "one")
	sha := run("rev-parse", "HEAD")
	run("update-index", "--add", "--cacheinfo", "160000,"+sha+",lib/dep")
	run("update-index", "--add", "--cacheinfo", "160000,"+sha+",orphan")
	os.WriteFile(filepath.Join(work, ".gitmodules"), []byte("[submodule \"dep\"]\n\tpath = lib/dep\n\turl = https://user:s3cret@example.com/dep.git\n"+
		"[submodule \"gone\"]\n\tpath = gone\n\turl = https://example.com/gone.git\n"), 0o644)
	run("add", ".gitmodules")
	run("commit", "-q", "-m", "two")

	dst := t.TempDir()
	cmd := exec.Command("git", "archive", "--format=tar", "HEAD")
	cmd.Dir, cmd.Env = work, os.Environ()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := intarchive.Extract(context.Background(), stdout, dst, intarchive.Options{MaxBytes: intarchive.SourceMaxBytes}); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	r, err := scanTree(dst)
	if err != nil {
		t.Fatal(err)
	}
	want := []submodule{{"lib/dep", "https://user:s3cret@example.com/dep.git"}, {"orphan", ""}}
	if !reflect.DeepEqual(r.Submodules, want) {
		t.Fatalf("submodules %q, want %q", r.Submodules, want)
	}
	var out strings.Builder
	r.printSubmodules(&out)
	wantOut := "-----> 2 submodules not fetched: kpush builds the pushed tree alone; commit what the build needs\n" +
		"       lib/dep (https://example.com/dep.git)\n" +
		"       orphan (no URL in .gitmodules)\n"
	if out.String() != wantOut {
		t.Errorf("printed\n%s\nwant\n%s", out.String(), wantOut)
	}
}

func TestLFSMessageNamesFilesUpToALimit(t *testing.T) {
	var many []string
	for i := range treeListMax + 3 {
		many = append(many, "assets/f"+string(rune('a'+i))+".bin")
	}
	for _, tc := range []struct {
		name string
		r    treeReport
		want []string
		not  []string
	}{
		{"one, no attributes", treeReport{LFSPointers: []string{"model.bin"}},
			[]string{"1 file is a Git LFS pointer", "kpush does not store Git LFS objects yet", "\n !       model.bin",
				`git lfs migrate export --everything --include="model.bin"`}, []string{"more"}},
		{"many, patterns from .gitattributes", treeReport{LFSPointers: many, LFSPatterns: []string{"*.bin", "*.psd"}},
			[]string{"13 files are Git LFS pointers", "\n !       assets/fj.bin", "\n !       and 3 more", `--include="*.bin,*.psd"`},
			[]string{"assets/fk.bin"}},
		{"control characters are escaped", treeReport{LFSPointers: []string{"a\x1b[31m.bin"}},
			[]string{`a\x1b[31m.bin`}, []string{"\x1b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := tc.r.lfsMessage()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message lacks %q:\n%s", w, msg)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(msg, w) {
					t.Errorf("message has %q:\n%s", w, msg)
				}
			}
		})
	}
}
