package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// FuzzExtract checks Extract's promise on any archive: it never panics and, whether it
// succeeds or refuses, nothing outside the extraction directory is created, changed, linked
// to or removed. The extraction directory's sibling, a sentinel directory with a file, a
// subdirectory and a symbolic link, is compared before and after (every name, type, mode,
// owner, link count, time and content), and so is the directory both are in.
//
// script describes the archive, one entry a line: a type flag byte ('0' file, '5' directory,
// '2' symbolic link, '1' hard link, '3', '4', '6' devices and FIFO, 'g' PAX global header),
// the name, then optionally a tab and the link target (the content for a file). SENTINEL in
// a name or target is the sentinel directory's absolute path. Flag bits pick Options:
// KeepModes, AbsoluteNames, SameOwner, tiny limits; and 16 reads script as a raw tar stream
// instead, for what the tar reader itself makes of hostile headers.
func FuzzExtract(f *testing.F) {
	for _, c := range []struct {
		script string
		flags  byte
	}{
		{"5a\n0a/b\thello\n2a/l\tb\n1a/h\ta/b\n", 0},
		{"0../escape\tx\n", 0},
		{"0SENTINEL/canary\tpwned\n", 0},
		{"0SENTINEL/canary\tpwned\n", 2},
		{"2l\tSENTINEL\n0l/canary\tpwned\n", 0},
		{"2l\tSENTINEL\n5l\n0l/new\tx\n", 1},
		{"2l\t../sentinel\n0l/canary\tpwned\n", 0},
		{"2l\tSENTINEL\n0l/new\tpwned\n", 0},
		{"2l\t../sentinel\n5l/new\n", 0},
		{"2l\tSENTINEL/canary\n0l\tpwned\n", 0},
		{"1h\tSENTINEL/canary\n", 2},
		{"2l\tSENTINEL\n1h\tl/canary\n", 0},
		{"5d\n2d/x\t/\n1h\td/x\n", 5},
		{"0a\x00b\tnul\n", 0},
		{"3dev\n6fifo\ngpax\n0.\tdot\n5.\n", 7},
		{"5a\n5a/b\n5a/b/c\n5a/b/c/d\n0a/b/c/d/e\t0123456789abcdef\n", 8},
		{"0ünï/cödé\t✓\n", 0},
	} {
		f.Add([]byte(c.script), c.flags)
	}
	f.Fuzz(func(t *testing.T, script []byte, flags byte) {
		base := t.TempDir()
		dir, sentinel := filepath.Join(base, "root"), filepath.Join(base, "sentinel")
		for _, d := range []string{dir, sentinel, filepath.Join(sentinel, "sub")} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(sentinel, "canary"), []byte("canary"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("canary", filepath.Join(sentinel, "link")); err != nil {
			t.Fatal(err)
		}
		before := snapshot(t, base, dir)

		var o Options
		o.KeepModes = flags&1 != 0
		o.AbsoluteNames = flags&2 != 0
		if flags&4 != 0 {
			o.Owner = SameOwner
		}
		if flags&8 != 0 {
			o.MaxEntries, o.MaxBytes, o.MaxDepth = 4, 10, 3
		}
		data := script
		if flags&16 == 0 {
			data = scriptTar(script, sentinel)
		}
		err := Extract(context.Background(), bytes.NewReader(data), dir, o)
		if after := snapshot(t, base, dir); !maps.Equal(after, before) {
			t.Fatalf("Extract (err %v) changed what is outside its directory:%s", err, diff(before, after))
		}
		if errors.Is(err, ErrUnsafe) && errors.Is(err, ErrLimit) {
			t.Fatalf("Extract error is both unsafe and over a limit: %v", err)
		}
	})
}

// scriptTar makes the tar stream FuzzExtract's script describes; entries the tar writer
// refuses end it.
func scriptTar(script []byte, sentinel string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, line := range strings.Split(string(script), "\n") {
		if line == "" {
			continue
		}
		name, arg, _ := strings.Cut(line[1:], "\t")
		name = strings.ReplaceAll(name, "SENTINEL", sentinel)
		arg = strings.ReplaceAll(arg, "SENTINEL", sentinel)
		h := &tar.Header{Typeflag: line[0], Name: name, Mode: 0o755, Format: tar.FormatPAX}
		switch h.Typeflag {
		case tar.TypeReg:
			h.Size = int64(len(arg))
		case tar.TypeSymlink, tar.TypeLink:
			h.Linkname = arg
		case tar.TypeXGlobalHeader:
			h = &tar.Header{Typeflag: h.Typeflag, PAXRecords: map[string]string{"comment": name}, Format: tar.FormatPAX}
		}
		if tw.WriteHeader(h) != nil {
			break
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(arg))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// snapshot describes everything under base but the extraction directory dir (which is
// listed as itself only): per path its type, mode, owner, link count, time and content.
func snapshot(t *testing.T, base, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%v uid=%d gid=%d links=%d mtime=%d", fi.Mode(), st.Uid, st.Gid, st.Nlink, st.Mtim.Nano())
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" sha256=%x", sha256.Sum256(b))
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		if p == dir {
			desc = "extraction directory" // its own mode and time are Extract's to keep, its contents to make
		}
		m[p] = desc
		if p == dir {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// diff lists the paths whose description changed between two snapshots.
func diff(before, after map[string]string) string {
	var b strings.Builder
	for _, p := range slices.Sorted(maps.Keys(before)) {
		if a, ok := after[p]; !ok {
			fmt.Fprintf(&b, "\n  removed %s (%s)", p, before[p])
		} else if a != before[p] {
			fmt.Fprintf(&b, "\n  changed %s: %s, now %s", p, before[p], a)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(after)) {
		if _, ok := before[p]; !ok {
			fmt.Fprintf(&b, "\n  created %s (%s)", p, after[p])
		}
	}
	return b.String()
}
