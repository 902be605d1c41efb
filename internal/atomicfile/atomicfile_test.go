package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// WriteFile replaces the file with exactly the mode asked for, whatever the umask and the old
// file's mode, and leaves no temporary file behind.
func TestWriteFileReplacesWithTheModeAskedFor(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		data string
		perm os.FileMode
	}{{"new", 0o644}, {"newer", 0o600}, {"", 0o444}} {
		if err := WriteFile(p, []byte(tc.data), tc.perm); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		fi, serr := os.Stat(p)
		if err != nil || serr != nil || string(got) != tc.data || fi.Mode().Perm() != tc.perm {
			t.Errorf("after WriteFile(%q, %v): %q %v, %v %v", tc.data, tc.perm, got, err, fi.Mode().Perm(), serr)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %v, want only state.json", entries)
	}
	if err := WriteFile(filepath.Join(dir, "missing", "x"), nil, 0o600); err == nil {
		t.Error("WriteFile into a missing directory succeeded")
	}
}

// WriteFileIn writes inside the root and refuses a name that leaves it.
func TestWriteFileInStaysInTheRoot(t *testing.T) {
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if err := WriteFileIn(root, "hook", []byte("#!/bin/sh\n"), 0o555); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "hook"))
	if err != nil || fi.Mode().Perm() != 0o555 {
		t.Errorf("hook: %v %v, want mode 0555", fi, err)
	}
	if err := WriteFileIn(root, "../escape", nil, 0o600); err == nil {
		t.Error("WriteFileIn(../escape) succeeded")
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escape")); err == nil {
		t.Error("a file was written outside the root")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), TempPrefix("hook")) {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

// Create writes a new file and leaves one that exists alone.
func TestCreateKeepsAnExistingFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key")
	if err := Create(p, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Create(p, []byte("second"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Errorf("Create over an existing file = %v, want fs.ErrExist", err)
	}
	got, _ := os.ReadFile(p)
	fi, err := os.Stat(p)
	if string(got) != "first" || err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key = %q, %v %v; want the first content, mode 0600", got, fi, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %v, want only key", entries)
	}
}
