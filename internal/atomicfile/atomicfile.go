// Package atomicfile writes files whole: a reader, another process or a crash sees the old
// content or the new, never part of either. It is the one place kpush does this, on top of
// github.com/google/renameio/v2: a temporary file in the target's own directory, created with
// the caller's mode (neither the umask's nor the old file's), written, fsynced and renamed
// over the target, then the directory fsynced so that the rename survives a crash too.
package atomicfile

import (
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
)

// WriteFile replaces path with data, mode perm (exactly: the umask does not apply). path's
// directory must exist.
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	return Copy(path, bytes.NewReader(data), perm)
}

// Copy replaces path with what r reads until EOF, streamed (never whole in memory), as
// WriteFile does.
func Copy(path string, r io.Reader, perm fs.FileMode) error {
	dir := filepath.Dir(path)
	if err := write(path, r, perm, renameio.WithTempDir(dir)); err != nil {
		return err
	}
	syncDir(os.Open(dir))
	return nil
}

// WriteFileIn replaces name inside root with data, mode perm, never leaving root (neither the
// temporary file nor the rename follow a symbolic link out of it).
func WriteFileIn(root *os.Root, name string, data []byte, perm fs.FileMode) error {
	if err := write(name, bytes.NewReader(data), perm, renameio.WithRoot(root)); err != nil {
		return err
	}
	syncDir(root.Open(filepath.Dir(name)))
	return nil
}

// Create writes data to path, mode perm, only if path does not exist yet, else it returns an
// error wrapping fs.ErrExist and leaves path as it is: of several processes creating the same
// file at once, exactly one succeeds and the others find its content whole. The file is
// written and fsynced under a temporary name and hard-linked to path.
func Create(path string, data []byte, perm fs.FileMode) error {
	dir := filepath.Dir(path)
	f, err := renameio.NewPendingFile(path, renameio.WithTempDir(dir), renameio.WithPermissions(perm), renameio.WithStaticPermissions(perm))
	if err != nil {
		return err
	}
	defer f.Cleanup() //nolint:errcheck // removes the temporary name, not path
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := os.Link(f.Name(), path); err != nil {
		return err
	}
	syncDir(os.Open(dir))
	return nil
}

// TempPrefix is how the name of a temporary file made for target starts (the rest is
// digits); one a crash left behind can be told by it.
func TempPrefix(target string) string { return "." + filepath.Base(target) }

func write(path string, r io.Reader, perm fs.FileMode, where renameio.Option) error {
	f, err := renameio.NewPendingFile(path, where, renameio.WithPermissions(perm), renameio.WithStaticPermissions(perm))
	if err != nil {
		return err
	}
	defer f.Cleanup() //nolint:errcheck // a no-op once renamed
	if _, err := io.Copy(f, r); err != nil {
		return err
	}
	return f.CloseAtomicallyReplace() // fsyncs, closes, renames
}

// syncDir fsyncs a directory so that a rename in it is durable, best effort: the rename is
// done either way (a directory that cannot be opened for reading, or a file system without
// directory fsync, is no error).
func syncDir(d *os.File, err error) {
	if err != nil {
		return
	}
	d.Sync()
	d.Close()
}
