package local

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"kpush.dev/kpush/internal/sandbox"
)

func TestExtractTarRefusesEscapes(t *testing.T) {
	tests := []struct {
		name    string
		entries []tarEntry
	}{
		{"dotdot", []tarEntry{{name: "../evil", typ: tar.TypeReg, mode: 0o644, body: "x"}}},
		{"nested dotdot", []tarEntry{{name: "a/../../evil", typ: tar.TypeReg, mode: 0o644, body: "x"}}},
		{"through absolute symlink", []tarEntry{
			{name: "link", typ: tar.TypeSymlink, link: "OUTSIDE"},
			{name: "link/evil", typ: tar.TypeReg, mode: 0o644, body: "x"}}},
		{"through relative symlink", []tarEntry{
			{name: "link", typ: tar.TypeSymlink, link: "../.."},
			{name: "link/evil", typ: tar.TypeReg, mode: 0o644, body: "x"}}},
		{"hardlink out", []tarEntry{{name: "h", typ: tar.TypeLink, link: "../outside-file"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			if err := os.MkdirAll(outside, 0o755); err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(base, "outside-file"), []byte("secret"), 0o644)
			dst := filepath.Join(base, "root")
			os.Mkdir(dst, 0o755)
			for i := range tt.entries {
				tt.entries[i].link = strings.ReplaceAll(tt.entries[i].link, "OUTSIDE", outside)
			}
			err := extractTar(context.Background(), bytes.NewReader(buildTar(t, tt.entries)), dst, testIDs)
			if err == nil {
				t.Errorf("extraction succeeded")
			}
			for _, p := range []string{filepath.Join(base, "evil"), filepath.Join(outside, "evil"), filepath.Join(dst, "h")} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s was created", p)
				}
			}
		})
	}
}

// testIDs is a host id range like the one an app gets.
var testIDs = sandbox.IDRange{Base: sandbox.FirstHostID}

func TestExtractTarKeepsMetadata(t *testing.T) {
	dst := t.TempDir()
	entries := []tarEntry{
		{name: "./usr/", typ: tar.TypeDir, mode: 0o755},
		{name: "usr/bin/tool", typ: tar.TypeReg, mode: 0o4755, body: "#!", uid: 1234, gid: 5678},
		{name: "usr/bin/alias", typ: tar.TypeSymlink, link: "/usr/bin/tool", uid: 7, gid: 8},
		{name: "usr/bin/hard", typ: tar.TypeLink, link: "usr/bin/tool"},
		{name: "/workspace/", typ: tar.TypeDir, mode: 0o1770, uid: 1000, gid: 1000},
		{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		{name: "usr/bin/tool2", typ: tar.TypeReg, mode: 0o600, body: "old"},
		{name: "usr/bin/tool2", typ: tar.TypeReg, mode: 0o640, body: "new"},
	}
	if err := extractTar(context.Background(), bytes.NewReader(buildTar(t, entries)), dst, testIDs); err != nil {
		t.Fatal(err)
	}
	b := testIDs.Base // every owner is shifted into the app's host ids
	check := func(p string, mode os.FileMode, uid, gid uint32) {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(dst, p))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != mode || st.Uid != uid || st.Gid != gid {
			t.Errorf("%s: mode %v uid %d gid %d, want %v %d %d", p, fi.Mode(), st.Uid, st.Gid, mode, uid, gid)
		}
	}
	check("usr/bin/tool", 0o755|os.ModeSetuid, b+1234, b+5678)
	check("usr/bin/alias", 0o777|os.ModeSymlink, b+7, b+8)
	check("workspace", 0o770|os.ModeDir|os.ModeSticky, b+1000, b+1000)
	check("usr/bin/tool2", 0o640, b, b)
	if l, _ := os.Readlink(filepath.Join(dst, "usr/bin/alias")); l != "/usr/bin/tool" {
		t.Errorf("symlink target %q", l)
	}
	fa, _ := os.Stat(filepath.Join(dst, "usr/bin/tool"))
	fb, _ := os.Stat(filepath.Join(dst, "usr/bin/hard"))
	if !os.SameFile(fa, fb) {
		t.Errorf("hard link is not the same file")
	}
	if _, err := os.Lstat(filepath.Join(dst, "dev/null")); err == nil {
		t.Errorf("device node was created")
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "usr/bin/tool2")); string(b) != "new" {
		t.Errorf("later entry did not replace earlier: %q", b)
	}
}

func TestResolveUser(t *testing.T) {
	rootfs := t.TempDir()
	os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755)
	os.WriteFile(filepath.Join(rootfs, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\ncnb:x:1000:1001::/home/cnb:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(rootfs, "etc/group"), []byte("cnb:x:1001:\nstaff:x:50:\n"), 0o644)
	tests := []struct {
		user    string
		want    identity
		wantErr bool
	}{
		{"", identity{0, 0, "/root"}, false},
		{"1000", identity{1000, 1001, "/home/cnb"}, false},
		{"1000:1000", identity{1000, 1000, "/home/cnb"}, false},
		{"4242", identity{4242, 0, ""}, false},
		{"cnb", identity{1000, 1001, "/home/cnb"}, false},
		{"cnb:staff", identity{1000, 50, "/home/cnb"}, false},
		{"nobody", identity{}, true},
		{"cnb:nogroup", identity{}, true},
	}
	for _, tt := range tests {
		got, err := resolveUser(tt.user, rootfs)
		if (err != nil) != tt.wantErr || (!tt.wantErr && got != tt.want) {
			t.Errorf("resolveUser(%q) = %+v, %v; want %+v, err %v", tt.user, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestBuildEnv(t *testing.T) {
	tests := []struct {
		name  string
		image []string
		rel   map[string]string
		want  []string
	}{
		{"defaults", nil, nil, []string{"PORT=8080", "PATH=" + defaultPath, "HOME=/home/x"}},
		{"release overrides image, PORT is ours",
			[]string{"PATH=/cnb/bin", "A=img", "PORT=1"},
			map[string]string{"A": "rel", "B": "b=c", "PORT": "2"},
			[]string{"PATH=/cnb/bin", "A=rel", "PORT=8080", "B=b=c", "HOME=/home/x"}},
		{"bad keys dropped", nil, map[string]string{"": "x", "A=B": "y"}, []string{"PORT=8080", "PATH=" + defaultPath, "HOME=/home/x"}},
	}
	for _, tt := range tests {
		if got := buildEnv(tt.image, tt.rel, 8080, "/home/x"); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: buildEnv = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// An app can turn its image's /etc/passwd into a FIFO; reading the image user must not wait
// on it (kpush would hang at the next start).
func TestResolveUserDoesNotBlockOnAFIFO(t *testing.T) {
	rootfs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(rootfs, "etc", "passwd"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := resolveUser("cnb", rootfs); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a user was found in a FIFO")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("resolveUser blocked on a FIFO at /etc/passwd")
	}
}
