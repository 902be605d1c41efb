package receiver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"

	"kpush.dev/kpush/internal/term"
)

// What a pushed tree holds that git archive does not deliver: Git LFS objects (the tree has
// their pointer files) and submodules (the tree has an empty directory where each gitlink
// is). kpush looks at the extracted tree, the exact bytes the build would see.

const (
	// lfsMaxPointer bounds a Git LFS pointer file: "Pointer files must be less than 1024
	// bytes in size" (https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md). Nothing
	// larger is read.
	lfsMaxPointer = 1024
	// treeListMax is how many LFS files or submodules a message names before "and N more".
	treeListMax = 10
)

// lfsVersions are the first lines a pointer can have: the spec's, and the one pointers made
// by git-lfs's pre-release had, which git-lfs still reads.
var lfsVersions = []string{
	"version https://git-lfs.github.com/spec/v1",
	"version https://hawser.github.com/spec/v1",
}

// treeReport is what scanTree found in an extracted source tree.
type treeReport struct {
	// LFSPointers are the slash-separated paths of Git LFS pointer files, in tree order.
	LFSPointers []string
	// LFSPatterns are the patterns the root .gitattributes sends through filter=lfs.
	LFSPatterns []string
	// Submodules are the gitlinks: git archive writes each as an empty directory; URL is
	// the one .gitmodules gives for its path, "" when it gives none.
	Submodules []submodule
}

type submodule struct{ Path, URL string }

// checkTree scans the source tree extracted into dir before it is built. It prints the
// submodules the build will not have to out, and returns an error for people when the tree
// holds Git LFS pointers. A tree it cannot scan is built as it is: the scan only explains
// what the build would get.
func (p *Pipeline) checkTree(log *slog.Logger, dir string, out io.Writer) error {
	r, err := scanTree(dir)
	if err != nil {
		log.Warn("scanning the source tree for LFS pointers and submodules", "err", err)
		return nil
	}
	r.printSubmodules(out)
	if len(r.LFSPointers) > 0 {
		return errors.New(r.lfsMessage())
	}
	return nil
}

// scanTree walks the tree extracted into dir (through an os.Root, without following
// symlinks) for Git LFS pointer files and submodules. It opens only regular files smaller
// than lfsMaxPointer, and the root .gitattributes and .gitmodules, reading at most
// lfsMaxPointer bytes of each file and 64 KiB of those two.
//
// Pointer content decides, not .gitattributes: a pointer is what breaks the build (the app
// gets 130 bytes of text where its image or model should be), whatever attributes say, while
// filter=lfs patterns alone are harmless — they may match nothing, or files committed
// directly. The patterns only shape the hint (git lfs migrate export --include).
func scanTree(dir string) (*treeReport, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	r := &treeReport{}
	var dirs []string           // every directory below the root, in walk order
	filled := map[string]bool{} // directories with at least one entry
	err = fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name == "." {
			return nil
		}
		filled[path.Dir(name)] = true
		switch {
		case d.IsDir():
			dirs = append(dirs, name)
		case d.Type().IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if fi.Size() >= lfsMaxPointer {
				return nil
			}
			b, err := readAtMost(root, name, lfsMaxPointer)
			if err != nil {
				return err
			}
			if isLFSPointer(b) {
				r.LFSPointers = append(r.LFSPointers, name)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if b, err := readAtMost(root, ".gitattributes", 64<<10); err == nil {
		r.LFSPatterns = lfsPatterns(b)
	}
	urls := map[string]string{}
	if b, err := readAtMost(root, ".gitmodules", 64<<10); err == nil {
		for _, s := range parseGitmodules(b) {
			urls[s.Path] = s.URL
		}
	}
	for _, d := range dirs {
		if !filled[d] {
			r.Submodules = append(r.Submodules, submodule{Path: d, URL: urls[d]})
		}
	}
	return r, nil
}

// readAtMost reads up to n bytes of the regular file name in root. A symlink is refused
// (os.Root would follow it inside the root, but .gitattributes through a link is not git's).
func readAtMost(root *os.Root, name string, n int64) ([]byte, error) {
	fi, err := root.Lstat(name)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", name)
	}
	f, err := root.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}

// isLFSPointer reports whether b is a Git LFS pointer file as the spec defines it: less than
// 1024 bytes of "key value\n" lines, the first the version, with an "oid sha256:<64 hex>"
// and a "size <decimal>" line. A file that merely starts with the version line (a document
// about LFS, a big file) is not one.
func isLFSPointer(b []byte) bool {
	if len(b) >= lfsMaxPointer || !bytes.HasSuffix(b, []byte("\n")) {
		return false
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	ok := false
	for _, v := range lfsVersions {
		ok = ok || lines[0] == v
	}
	if !ok {
		return false
	}
	var oid, size bool
	for _, l := range lines[1:] {
		k, v, found := strings.Cut(l, " ")
		if !found || k == "" || v == "" || strings.ContainsAny(k, " \t\r") {
			return false
		}
		switch k {
		case "oid":
			h, ok := strings.CutPrefix(v, "sha256:")
			oid = ok && len(h) == 64 && strings.Trim(h, "0123456789abcdef") == ""
			if !oid {
				return false
			}
		case "size":
			_, err := strconv.ParseUint(v, 10, 63)
			size = err == nil
			if !size {
				return false
			}
		}
	}
	return oid && size
}

// lfsPatterns returns the patterns of a .gitattributes file whose attributes include
// filter=lfs (gitattributes(5)); comments and macro definitions are skipped.
func lfsPatterns(b []byte) []string {
	var pats []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || strings.HasPrefix(f[0], "#") || strings.HasPrefix(f[0], "[attr]") {
			continue
		}
		for _, a := range f[1:] {
			if a == "filter=lfs" {
				pats = append(pats, f[0])
				break
			}
		}
	}
	return pats
}

// parseGitmodules returns the submodules of a .gitmodules file (git-config syntax,
// gitmodules(5)) that have a path, with their URLs: `[submodule "name"]` sections, keys
// case-insensitive, values optionally quoted, "#" and ";" comments.
func parseGitmodules(b []byte) []submodule {
	var (
		subs   []submodule
		order  []string
		byName = map[string]*submodule{}
		cur    *submodule
	)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || l[0] == '#' || l[0] == ';':
			continue
		case l[0] == '[':
			cur = nil
			sec, ok := strings.CutSuffix(l, "]")
			if !ok {
				continue
			}
			kind, name, _ := strings.Cut(strings.TrimPrefix(sec, "["), " ")
			name = strings.TrimSpace(name)
			if !strings.EqualFold(kind, "submodule") || len(name) < 2 || name[0] != '"' || name[len(name)-1] != '"' {
				continue
			}
			name = name[1 : len(name)-1]
			if byName[name] == nil {
				byName[name] = &submodule{}
				order = append(order, name)
			}
			cur = byName[name]
		case cur != nil:
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				continue
			}
			v = gitConfigValue(v)
			switch strings.ToLower(strings.TrimSpace(k)) {
			case "path":
				cur.Path = path.Clean(strings.TrimSuffix(v, "/"))
			case "url":
				cur.URL = v
			}
		}
	}
	for _, n := range order {
		if s := byName[n]; s.Path != "" && s.Path != "." {
			subs = append(subs, *s)
		}
	}
	return subs
}

// gitConfigValue is a git-config value as written after "=": trimmed, an unquoted trailing
// comment dropped, double quotes removed.
func gitConfigValue(v string) string {
	var b strings.Builder
	quoted := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '"':
			quoted = !quoted
		case c == '\\' && i+1 < len(v):
			i++
			switch v[i] {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			default:
				b.WriteByte(v[i])
			}
		case (c == '#' || c == ';') && !quoted:
			return strings.TrimSpace(b.String())
		default:
			b.WriteByte(c)
		}
	}
	return strings.TrimSpace(b.String())
}

// lfsMessage is the refusal of a tree with LFS pointers, for people: which files, why, and
// the command that puts their content in the commits.
func (r *treeReport) lfsMessage() string {
	var b strings.Builder
	n := len(r.LFSPointers)
	fmt.Fprintf(&b, "not built: %d %s Git LFS %s, not the %s content: kpush does not store Git LFS objects yet",
		n, pick(n, "file is a", "files are"), pick(n, "pointer", "pointers"), pick(n, "file's", "files'"))
	for _, p := range r.LFSPointers[:min(n, treeListMax)] {
		b.WriteString("\n !       " + term.Sanitize(p))
	}
	if n > treeListMax {
		fmt.Fprintf(&b, "\n !       and %d more", n-treeListMax)
	}
	include := r.LFSPatterns
	if len(include) == 0 {
		include = r.LFSPointers[:min(n, treeListMax)]
	}
	fmt.Fprintf(&b, "\n !     commit the files themselves instead (this rewrites history; then git push --force):"+
		"\n !       git lfs migrate export --everything --include=\"%s\"", term.Sanitize(strings.Join(include, ",")))
	return b.String()
}

// printSubmodules tells the pusher which submodules the build goes on without.
func (r *treeReport) printSubmodules(out io.Writer) {
	n := len(r.Submodules)
	if n == 0 {
		return
	}
	fmt.Fprintf(out, "-----> %d %s not fetched: kpush builds the pushed tree alone; commit what the build needs\n",
		n, pick(n, "submodule", "submodules"))
	for _, s := range r.Submodules[:min(n, treeListMax)] {
		u := "no URL in .gitmodules"
		if s.URL != "" {
			u = redactURL(s.URL)
		}
		fmt.Fprintf(out, "       %s (%s)\n", term.Sanitize(s.Path), term.Sanitize(u))
	}
	if n > treeListMax {
		fmt.Fprintf(out, "       and %d more\n", n-treeListMax)
	}
}

// redactURL drops the user information of a URL: .gitmodules URLs sometimes carry a token
// ("https://TOKEN@host/…"), which would land in build logs. scp-like "git@host:path"
// addresses are kept, their user is no secret.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil || u.Scheme == "" {
		return s
	}
	u.User = nil
	return u.String()
}

func pick(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
