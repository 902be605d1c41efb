package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// entry is one hand-built tar header (and body, for regular files).
type entry struct {
	name, link string
	typ        byte
	mode       int64
	body       string
	uid, gid   int
	mtime      time.Time
	pax        map[string]string
}

// SENTINEL in a name or link target becomes the absolute path of the sentinel directory
// beside the extraction directory.
const sentinelMark = "SENTINEL"

func tarOf(t *testing.T, sentinel string, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{
			Name: strings.ReplaceAll(e.name, sentinelMark, sentinel), Linkname: strings.ReplaceAll(e.link, sentinelMark, sentinel),
			Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: e.mtime, PAXRecords: e.pax, Format: tar.FormatPAX,
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ == tar.TypeXGlobalHeader {
			h = &tar.Header{Typeflag: e.typ, PAXRecords: e.pax, Format: tar.FormatPAX}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("writing header %+v: %v", h, err)
		}
		if e.typ == tar.TypeReg {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layout makes <base>/root (the extraction directory, empty) and beside it what an escape
// would hit: <base>/sentinel with a file, a subdirectory and a file in it, and
// <base>/outside-file.
func layout(t *testing.T) (base, root, sentinel string) {
	t.Helper()
	base = t.TempDir()
	root, sentinel = filepath.Join(base, "root"), filepath.Join(base, "sentinel")
	for _, d := range []string{root, sentinel, filepath.Join(sentinel, "sub")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, body := range map[string]string{
		filepath.Join(sentinel, "victim"):     "original\n",
		filepath.Join(sentinel, "sub", "old"): "old\n",
		filepath.Join(base, "outside-file"):   "secret\n",
	} {
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	for _, p := range []string{sentinel, filepath.Join(sentinel, "sub"), filepath.Join(sentinel, "victim")} {
		os.Chtimes(p, old, old)
	}
	return base, root, sentinel
}

// outside lists everything under base but root: path, type and mode, owner, size, mtime,
// link target or a hash of the content. Any create, write, chmod, chown, chtimes or
// remove outside root changes it.
func outside(t *testing.T, base, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return filepath.SkipDir
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %v %d:%d %d %d nlink=%d", p, fi.Mode(), st.Uid, st.Gid, fi.Size(), fi.ModTime().UnixNano(), st.Nlink)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			line += " -> " + l
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" sha256:%x", sha256.Sum256(b))
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

type hostileCase struct {
	name    string
	entries []entry
	opts    Options
	wantErr error  // errors.Is target; nil with errHas "" means success
	errHas  string // substring of the error
	// escapes: without the protections (naiveExtract) this archive changes something
	// outside root: proof that the case tests something.
	escapes bool
	check   func(t *testing.T, root, sentinel string) // what must be inside root afterwards
}

func hostileCases() []hostileCase {
	return []hostileCase{
		{name: "dotdot name", entries: []entry{{name: "../sentinel/evil", typ: tar.TypeReg, body: "x"}},
			wantErr: ErrUnsafe, errHas: `".." component`, escapes: true},
		{name: "dotdot in the middle of a name", entries: []entry{{name: "a/../../sentinel/evil", typ: tar.TypeReg, body: "x"}},
			wantErr: ErrUnsafe, escapes: true},
		{name: "dotdot that stays inside is refused too", entries: []entry{{name: "a/../b", typ: tar.TypeReg, body: "x"}},
			wantErr: ErrUnsafe, check: absent("b", "a")},
		{name: "dotdot hard link name", entries: []entry{{name: "../sentinel/evil", typ: tar.TypeLink, link: "x"}},
			wantErr: ErrUnsafe},
		{name: "absolute name refused", entries: []entry{{name: "SENTINEL/evil", typ: tar.TypeReg, body: "x"}},
			wantErr: ErrUnsafe, errHas: "absolute name"},
		{name: "absolute name inside with AbsoluteNames", entries: []entry{{name: "/etc/evil", typ: tar.TypeReg, body: "x"}},
			opts: Options{AbsoluteNames: true}, check: fileIs("etc/evil", "x")},
		{name: "absolute symlink to a directory outside, then a file under it",
			entries: []entry{{name: "l", typ: tar.TypeSymlink, link: "SENTINEL"}, {name: "l/evil", typ: tar.TypeReg, body: "x"}},
			wantErr: ErrUnsafe, errHas: `written through the symbolic link "l"`, escapes: true, check: linkIs("l", "SENTINEL")},
		{name: "relative symlink out, then a file under it",
			entries: []entry{{name: "l", typ: tar.TypeSymlink, link: "../sentinel"}, {name: "l/victim", typ: tar.TypeReg, body: "pwned"}},
			wantErr: ErrUnsafe, escapes: true, check: linkIs("l", "../sentinel")},
		{name: "deep symlink ../../.., then a file under it",
			entries: []entry{{name: "a/b/l", typ: tar.TypeSymlink, link: "../../../sentinel"}, {name: "a/b/l/evil", typ: tar.TypeReg, body: "x"}},
			wantErr: ErrUnsafe, escapes: true, check: linkIs("a/b/l", "../../../sentinel")},
		{name: "symlink out, then a directory under it",
			entries: []entry{{name: "l", typ: tar.TypeSymlink, link: "SENTINEL"}, {name: "l/newdir/", typ: tar.TypeDir, mode: 0o755}},
			wantErr: ErrUnsafe, escapes: true},
		{name: "symlink out, then a symlink under it",
			entries: []entry{{name: "l", typ: tar.TypeSymlink, link: "SENTINEL"}, {name: "l/evil", typ: tar.TypeSymlink, link: "/"}},
			wantErr: ErrUnsafe, escapes: true},
		{name: "chain of symlinks out, then a file under it",
			entries: []entry{{name: "l2", typ: tar.TypeSymlink, link: "SENTINEL"}, {name: "l1", typ: tar.TypeSymlink, link: "l2"},
				{name: "l1/evil", typ: tar.TypeReg, body: "x"}},
			wantErr: ErrUnsafe, escapes: true},
		{name: "symlink to a directory inside is not written through either",
			entries: []entry{{name: "real/", typ: tar.TypeDir, mode: 0o755}, {name: "l", typ: tar.TypeSymlink, link: "real"},
				{name: "l/x", typ: tar.TypeReg, body: "x"}},
			wantErr: ErrUnsafe, check: absent("real/x")},
		{name: "file replaces a symlink to a file outside",
			entries: []entry{{name: "l", typ: tar.TypeSymlink, link: "SENTINEL/victim"}, {name: "l", typ: tar.TypeReg, mode: 0o755, body: "pwned"}},
			escapes: true, check: fileIs("l", "pwned")},
		{name: "directory replaces a symlink to a directory outside",
			entries: []entry{{name: "l", typ: tar.TypeSymlink, link: "SENTINEL"}, {name: "l/", typ: tar.TypeDir, mode: 0o777, uid: 4321, gid: 4321,
				mtime: time.Unix(1e9, 0)}},
			opts: Options{KeepModes: true, Owner: SameOwner}, escapes: true, check: isDir("l", 0o777)},
		{name: "symlink replaces a symlink", entries: []entry{{name: "l", typ: tar.TypeSymlink, link: "SENTINEL"}, {name: "l", typ: tar.TypeSymlink, link: "elsewhere"}},
			check: linkIs("l", "elsewhere")},
		{name: "file where a directory is", entries: []entry{{name: "d/", typ: tar.TypeDir}, {name: "d", typ: tar.TypeReg, body: "x"}},
			errHas: "a directory is in the way"},
		{name: "file under a file", entries: []entry{{name: "f", typ: tar.TypeReg, body: "x"}, {name: "f/g", typ: tar.TypeReg, body: "x"}},
			errHas: `"f" is not a directory`},
		{name: "hard link to an absolute path outside", entries: []entry{{name: "h", typ: tar.TypeLink, link: "SENTINEL/victim"}, {name: "h", typ: tar.TypeReg, body: "pwned"}},
			wantErr: ErrUnsafe, check: absent("h")},
		{name: "hard link to an absolute path with AbsoluteNames stays inside",
			entries: []entry{{name: "h", typ: tar.TypeLink, link: "SENTINEL/victim"}}, opts: Options{AbsoluteNames: true},
			errHas: "no such file", check: absent("h")},
		{name: "hard link out by dotdot", entries: []entry{{name: "h", typ: tar.TypeLink, link: "../outside-file"}, {name: "h", typ: tar.TypeReg, body: "pwned"}},
			wantErr: ErrUnsafe, escapes: true, check: absent("h")},
		{name: "hard link through a symlink out", entries: []entry{
			{name: "l", typ: tar.TypeSymlink, link: "SENTINEL"}, {name: "h", typ: tar.TypeLink, link: "l/victim"}, {name: "h", typ: tar.TypeReg, body: "pwned"}},
			wantErr: ErrUnsafe, errHas: `reached through the symbolic link "l"`, escapes: true, check: absent("h")},
		{name: "hard link through a symlink inside", entries: []entry{
			{name: "real/f", typ: tar.TypeReg, body: "f"}, {name: "l", typ: tar.TypeSymlink, link: "real"}, {name: "h", typ: tar.TypeLink, link: "l/f"}},
			wantErr: ErrUnsafe, check: absent("h")},
		{name: "hard link to a directory", entries: []entry{{name: "d/", typ: tar.TypeDir}, {name: "h", typ: tar.TypeLink, link: "d"}},
			errHas: "not a regular file"},
		{name: "hard link to itself", entries: []entry{{name: "h", typ: tar.TypeLink, link: "h"}}, wantErr: ErrUnsafe},
		{name: "hard link inside, then a file over the link", entries: []entry{
			{name: "f", typ: tar.TypeReg, body: "first"}, {name: "h", typ: tar.TypeLink, link: "./f"}, {name: "h", typ: tar.TypeReg, body: "second"}},
			check: func(t *testing.T, root, s string) {
				fileIs("f", "first")(t, root, s)
				fileIs("h", "second")(t, root, s)
			}},
		{name: "hard link to a symlink out links the symlink", entries: []entry{
			{name: "l", typ: tar.TypeSymlink, link: "SENTINEL/victim"}, {name: "h", typ: tar.TypeLink, link: "l"}},
			check: func(t *testing.T, root, s string) {
				linkIs("h", "SENTINEL/victim")(t, root, s)
				sameFile("l", "h")(t, root, s)
			}},
		{name: "devices and FIFOs are skipped", entries: []entry{
			{name: "dev/null", typ: tar.TypeChar, mode: 0o666}, {name: "dev/sda", typ: tar.TypeBlock, mode: 0o660},
			{name: "fifo", typ: tar.TypeFifo, mode: 0o644}, {name: "ok", typ: tar.TypeReg, body: "ok"}},
			opts: Options{KeepModes: true, Owner: SameOwner}, check: func(t *testing.T, root, s string) {
				absent("dev/null", "dev/sda", "fifo", "dev")(t, root, s)
				fileIs("ok", "ok")(t, root, s)
			}},
		{name: "pax global header is skipped", entries: []entry{
			{name: "pax_global_header", typ: tar.TypeXGlobalHeader, pax: map[string]string{"comment": "0123456789abcdef"}},
			{name: "f", typ: tar.TypeReg, body: "f"}},
			check: func(t *testing.T, root, s string) {
				fileIs("f", "f")(t, root, s)
				absent("pax_global_header")(t, root, s)
			}},
		{name: "unknown entry type", entries: []entry{{name: "x", typ: 'Z'}}, errHas: "unsupported type"},
		{name: "the directory itself as a file", entries: []entry{{name: ".", typ: tar.TypeReg, body: ""}}, wantErr: ErrUnsafe},
		{name: "the directory itself as a directory keeps its mode", entries: []entry{{name: "./", typ: tar.TypeDir, mode: 0o700}},
			opts: Options{KeepModes: true}, check: isDir(".", 0o755)},
		{name: "symlink with an empty target", entries: []entry{{name: "l", typ: tar.TypeSymlink}}, errHas: "empty"},
		{name: "more entries than MaxEntries", entries: []entry{{name: "a", typ: tar.TypeReg}, {name: "b", typ: tar.TypeReg}, {name: "c", typ: tar.TypeReg}},
			opts: Options{MaxEntries: 2}, wantErr: ErrLimit, errHas: "more than 2 entries", check: absent("c")},
		{name: "more bytes than MaxBytes", entries: []entry{{name: "a", typ: tar.TypeReg, body: "123456"}, {name: "b", typ: tar.TypeReg, body: "123456"}},
			opts: Options{MaxBytes: 10}, wantErr: ErrLimit, errHas: "more than 10 bytes", check: absent("b")},
		{name: "deeper than MaxDepth", entries: []entry{{name: "a/b/c/d", typ: tar.TypeReg}},
			opts: Options{MaxDepth: 3}, wantErr: ErrLimit, errHas: "4 levels deep, more than 3", check: absent("a")},
		{name: "deeper than the default depth", entries: []entry{{name: strings.Repeat("d/", DefaultMaxDepth) + "f", typ: tar.TypeReg}},
			wantErr: ErrLimit, check: absent("d")},
		{name: "hard link target deeper than MaxDepth", entries: []entry{{name: "h", typ: tar.TypeLink, link: "a/b/c/d"}},
			opts: Options{MaxDepth: 3}, wantErr: ErrLimit},
		{name: "name longer than PATH_MAX", entries: []entry{{name: strings.Repeat("n", 5000), typ: tar.TypeReg}}, wantErr: ErrLimit},
	}
}

// TestExtractHostileArchives extracts each hand-built archive into an empty directory and
// asserts the outcome (error or success, and what is inside) and that nothing beside the
// directory (a sentinel directory, a file) changed in any way.
func TestExtractHostileArchives(t *testing.T) {
	for _, tc := range hostileCases() {
		t.Run(tc.name, func(t *testing.T) {
			base, root, sentinel := layout(t)
			before := outside(t, base, root)
			err := Extract(context.Background(), bytes.NewReader(tarOf(t, sentinel, tc.entries)), root, tc.opts)
			switch {
			case tc.wantErr == nil && tc.errHas == "" && err != nil:
				t.Errorf("Extract: %v, want success", err)
			case (tc.wantErr != nil || tc.errHas != "") && err == nil:
				t.Errorf("Extract succeeded, want an error")
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Errorf("Extract: %v, want errors.Is %v", err, tc.wantErr)
			case tc.errHas != "" && !strings.Contains(fmt.Sprint(err), tc.errHas):
				t.Errorf("Extract: %v, want an error containing %q", err, tc.errHas)
			}
			if err != nil {
				t.Logf("error: %v", err)
				if strings.Contains(err.Error(), base) && !tc.opts.AbsoluteNames && !strings.Contains(fmt.Sprint(tc.entries), sentinelMark) {
					t.Errorf("error %q names a host path", err)
				}
			}
			if after := outside(t, base, root); !reflect.DeepEqual(before, after) {
				t.Errorf("something outside the extraction directory changed:\nbefore %q\nafter  %q", before, after)
			}
			if tc.check != nil {
				tc.check(t, root, sentinel)
			}
		})
	}
}

// TestHostileArchivesEscapeANaiveExtractor proves the cases marked escapes test something:
// an extractor without the protections (joining names to the directory and following links,
// as kpush's receiver did) changes what is beside the directory for each of them.
func TestHostileArchivesEscapeANaiveExtractor(t *testing.T) {
	for _, tc := range hostileCases() {
		if !tc.escapes {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			base, root, sentinel := layout(t)
			before := outside(t, base, root)
			naiveExtract(tar.NewReader(bytes.NewReader(tarOf(t, sentinel, tc.entries))), root)
			if after := outside(t, base, root); reflect.DeepEqual(before, after) {
				t.Errorf("a naive extractor changed nothing outside: the case does not test an escape")
			}
		})
	}
}

// naiveExtract is what an extractor does without os.Root or any check.
func naiveExtract(tr *tar.Reader, dir string) {
	for {
		h, err := tr.Next()
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return
		}
		p := filepath.Join(dir, h.Name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		switch h.Typeflag {
		case tar.TypeDir:
			os.MkdirAll(p, 0o755)
			os.Chmod(p, h.FileInfo().Mode().Perm())
			os.Chown(p, h.Uid, h.Gid)
		case tar.TypeReg:
			if f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644); err == nil {
				io.Copy(f, tr)
				f.Close()
			}
		case tar.TypeSymlink:
			os.Symlink(h.Linkname, p)
		case tar.TypeLink:
			os.Link(filepath.Join(dir, h.Linkname), p)
		}
	}
}

// TestExtractSourceTreeNormalizes: with zero Options, modes become 0644/0755 (directories
// 0755) whatever the archive says, the archive's owners and times are ignored, and the umask
// does not narrow anything.
func TestExtractSourceTreeNormalizes(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	root := t.TempDir()
	mtime := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	entries := []entry{
		{name: "src/", typ: tar.TypeDir, mode: 0o700, uid: 1234, gid: 1234, mtime: mtime},
		{name: "src/main.go", typ: tar.TypeReg, mode: 0o600, body: "package main\n", uid: 1234, gid: 1234, mtime: mtime},
		{name: "bin/run", typ: tar.TypeReg, mode: 0o4775, body: "#!/bin/sh\n", uid: 1234, mtime: mtime},
		{name: "link", typ: tar.TypeSymlink, link: "src/main.go", uid: 1234},
	}
	if err := Extract(context.Background(), bytes.NewReader(tarOf(t, "", entries)), root, Options{}); err != nil {
		t.Fatal(err)
	}
	me := uint32(os.Geteuid())
	for p, want := range map[string]fs.FileMode{
		"src": fs.ModeDir | 0o755, "src/main.go": 0o644, "bin": fs.ModeDir | 0o755, "bin/run": 0o755, "link": fs.ModeSymlink | 0o777,
	} {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != want || st.Uid != me {
			t.Errorf("%s: mode %v owner %d, want %v owned by %d", p, fi.Mode(), st.Uid, want, me)
		}
		if fi.Mode()&fs.ModeSymlink == 0 && fi.ModTime().Equal(mtime) {
			t.Errorf("%s kept the archive's mtime %v", p, mtime)
		}
	}
}

// TestExtractImageKeepsMetadata: KeepModes with SameOwner keeps setuid/setgid/sticky bits,
// owners, modification times (directories' too, set last), and a read-only directory still
// gets its contents.
func TestExtractImageKeepsMetadata(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	t1, t2 := time.Date(2020, 5, 6, 7, 8, 9, 0, time.UTC), time.Date(2019, 1, 2, 3, 4, 5, 0, time.UTC)
	entries := []entry{
		{name: "usr/", typ: tar.TypeDir, mode: 0o755, mtime: t1},
		{name: "usr/bin/tool", typ: tar.TypeReg, mode: 0o4755, body: "#!", uid: 1234, gid: 5678, mtime: t2},
		{name: "usr/bin/sg", typ: tar.TypeReg, mode: 0o2711, body: "#!", uid: 0, gid: 50, mtime: t2},
		{name: "usr/bin/alias", typ: tar.TypeSymlink, link: "/usr/bin/tool", uid: 7, gid: 8},
		{name: "usr/bin/hard", typ: tar.TypeLink, link: "usr/bin/tool"},
		{name: "tmp/", typ: tar.TypeDir, mode: 0o1777, mtime: t1},
		{name: "ro/", typ: tar.TypeDir, mode: 0o555, uid: 1000, gid: 1000, mtime: t1},
		{name: "ro/f", typ: tar.TypeReg, mode: 0o444, body: "r", mtime: t2},
	}
	if err := Extract(context.Background(), bytes.NewReader(tarOf(t, "", entries)), root, Options{KeepModes: true, Owner: SameOwner}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		p        string
		mode     fs.FileMode
		uid, gid uint32
		mtime    time.Time
	}{
		{"usr", fs.ModeDir | 0o755, 0, 0, t1},
		{"usr/bin", fs.ModeDir | 0o755, 0, 0, time.Time{}}, // not in the archive: made, root-owned
		{"usr/bin/tool", 0o755 | fs.ModeSetuid, 1234, 5678, t2},
		{"usr/bin/sg", 0o711 | fs.ModeSetgid, 0, 50, t2},
		{"usr/bin/alias", 0o777 | fs.ModeSymlink, 7, 8, time.Time{}},
		{"tmp", fs.ModeDir | fs.ModeSticky | 0o777, 0, 0, t1},
		{"ro", fs.ModeDir | 0o555, 1000, 1000, t1},
		{"ro/f", 0o444, 0, 0, t2},
	} {
		fi, err := os.Lstat(filepath.Join(root, w.p))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != w.mode || st.Uid != w.uid || st.Gid != w.gid || (!w.mtime.IsZero() && !fi.ModTime().Equal(w.mtime)) {
			t.Errorf("%s: %v %d:%d %v, want %v %d:%d %v", w.p, fi.Mode(), st.Uid, st.Gid, fi.ModTime(), w.mode, w.uid, w.gid, w.mtime)
		}
	}
	sameFile("usr/bin/tool", "usr/bin/hard")(t, root, "")
}

// TestExtractOwnerMapping: Owner shifts every id (files, links, directories from the archive)
// and gives directories the archive does not list Owner(0, 0); a constant Owner gives a whole
// source tree to one user.
func TestExtractOwnerMapping(t *testing.T) {
	needRoot(t)
	const base = 100000
	shift := func(uid, gid int) (int, int) { return uid + base, gid + base }
	root := t.TempDir()
	entries := []entry{
		{name: "home/cnb/", typ: tar.TypeDir, mode: 0o755, uid: 1000, gid: 1000},
		{name: "home/cnb/f", typ: tar.TypeReg, body: "x", uid: 1000, gid: 1001},
		{name: "home/cnb/l", typ: tar.TypeSymlink, link: "f", uid: 1000, gid: 1000},
		{name: "etc/passwd", typ: tar.TypeReg, body: "root:x:0:0::/root:/bin/sh\n"},
	}
	if err := Extract(context.Background(), bytes.NewReader(tarOf(t, "", entries)), root, Options{KeepModes: true, Owner: shift}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string][2]uint32{
		"home": {base, base}, "home/cnb": {base + 1000, base + 1000}, "home/cnb/f": {base + 1000, base + 1001},
		"home/cnb/l": {base + 1000, base + 1000}, "etc": {base, base}, "etc/passwd": {base, base},
	} {
		if got := owner(t, filepath.Join(root, p)); got != want {
			t.Errorf("%s owned by %v, want %v", p, got, want)
		}
	}

	src := t.TempDir()
	fixed := func(int, int) (int, int) { return 4242, 4343 }
	if err := Extract(context.Background(), bytes.NewReader(tarOf(t, "", entries)), src, Options{Owner: fixed}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"home", "home/cnb", "home/cnb/f", "home/cnb/l", "etc", "etc/passwd"} {
		if got := owner(t, filepath.Join(src, p)); got != [2]uint32{4242, 4343} {
			t.Errorf("source tree: %s owned by %v, want 4242:4343", p, got)
		}
	}
}

// TestExtractStopsWhenCancelled: a done context stops the extraction before the next entry.
func TestExtractStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	root := t.TempDir()
	err := Extract(ctx, bytes.NewReader(tarOf(t, "", []entry{{name: "f", typ: tar.TypeReg, body: "x"}})), root, Options{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Extract = %v, want context.Canceled", err)
	}
	absent("f")(t, root, "")
}

// TestExtractTruncatedArchive: a stream cut inside a file's content is an error.
func TestExtractTruncatedArchive(t *testing.T) {
	b := tarOf(t, "", []entry{{name: "f", typ: tar.TypeReg, body: strings.Repeat("x", 2000)}})
	if err := Extract(context.Background(), bytes.NewReader(b[:1024]), t.TempDir(), Options{}); err == nil {
		t.Error("Extract of a truncated archive succeeded")
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("chown to other ids needs root (kpush's tests run as root)")
	}
}

func owner(t *testing.T, p string) [2]uint32 {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return [2]uint32{st.Uid, st.Gid}
}

func absent(names ...string) func(t *testing.T, root, sentinel string) {
	return func(t *testing.T, root, _ string) {
		t.Helper()
		for _, n := range names {
			if _, err := os.Lstat(filepath.Join(root, n)); err == nil {
				t.Errorf("%s exists in the extraction directory", n)
			}
		}
	}
}

func fileIs(name, body string) func(t *testing.T, root, sentinel string) {
	return func(t *testing.T, root, _ string) {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(root, name))
		if err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("%s: %v, want a regular file", name, err)
		}
		if b, _ := os.ReadFile(filepath.Join(root, name)); string(b) != body {
			t.Errorf("%s holds %q, want %q", name, b, body)
		}
	}
}

func linkIs(name, target string) func(t *testing.T, root, sentinel string) {
	return func(t *testing.T, root, sentinel string) {
		t.Helper()
		want := strings.ReplaceAll(target, sentinelMark, sentinel)
		if got, err := os.Readlink(filepath.Join(root, name)); err != nil || got != want {
			t.Errorf("%s: link to %q (%v), want a symbolic link to %q kept verbatim", name, got, err, want)
		}
	}
}

func isDir(name string, perm fs.FileMode) func(t *testing.T, root, sentinel string) {
	return func(t *testing.T, root, _ string) {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(root, name))
		if err != nil || fi.Mode() != fs.ModeDir|perm {
			t.Errorf("%s: %v %v, want a directory %v", name, fi.Mode(), err, perm)
		}
	}
}

func sameFile(a, b string) func(t *testing.T, root, sentinel string) {
	return func(t *testing.T, root, _ string) {
		t.Helper()
		fa, err1 := os.Lstat(filepath.Join(root, a))
		fb, err2 := os.Lstat(filepath.Join(root, b))
		if err1 != nil || err2 != nil || !os.SameFile(fa, fb) {
			t.Errorf("%s and %s are not one inode (%v, %v)", a, b, err1, err2)
		}
	}
}
