// Package archive is the one tar extractor of kpush: a pushed commit's tree for a build, the
// build Pod's source, an image's flattened filesystem all go through Extract, which cannot
// create or change anything outside the directory it extracts into, whatever the entries say.
//
// How (every rule holds for every caller):
//
//   - Every path goes through an [os.Root] opened on the directory, so no operation can leave
//     it, by "..", an absolute name or a symbolic link, even one the archive planted.
//   - On top of that, an entry is never written through a symbolic link, not even one that
//     points inside: each parent of an entry must be a real directory (missing ones are made,
//     mode 0755, owner Owner(0, 0)), else the extraction fails with ErrUnsafe. Symbolic links
//     are created with their target verbatim (it means something only where the tree is used,
//     e.g. inside the app's sandbox) and are never followed by Extract.
//   - An entry that names an existing non-directory replaces it: the old link or file is
//     removed first and the new one created with O_EXCL, so an entry "a" after a symbolic link
//     "a" replaces the link and never writes, chmods or chowns what the link points at. An
//     entry whose place holds a directory fails ("a directory is in the way"), except a
//     directory entry, which keeps it.
//   - Names: a ".." component or a NUL byte anywhere is ErrUnsafe; an absolute name is ErrUnsafe
//     unless Options.AbsoluteNames, which reads "/x" as "x"; "./x" is "x"; the entry "." (the
//     directory itself) is skipped, so dir keeps its own mode, owner and times.
//   - Hard links: the target must name an entry already extracted (a regular file or a
//     symbolic link, linked itself, not followed) inside dir, under the same name rules, whose
//     parents are real directories, never reached through a symbolic link.
//   - Character and block devices and FIFOs are skipped (counted, not created): kpush's
//     sandboxes get their own /dev. PAX global headers (git archive's commit id) are skipped.
//     Any other entry type fails the extraction.
//   - Limits (Options.MaxEntries, MaxBytes, MaxDepth, with defaults) bound what one archive
//     can make; exceeding one fails with ErrLimit.
//
// What Extract does not do: whiteouts (.wh. files) are an image layer concept, and
// go-containerregistry's mutate.Extract has already flattened the layers when kpush extracts
// an image; a ".wh.x" entry is extracted as a file like any other. On failure, what was
// extracted so far stays in dir: callers extract into a fresh directory and remove it.
package archive

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"
)

var (
	// ErrUnsafe is wrapped by the error of an entry Extract refuses because it would reach
	// outside the directory or through a symbolic link.
	ErrUnsafe = errors.New("unsafe archive entry")
	// ErrLimit is wrapped by the error of an archive beyond one of Options' limits.
	ErrLimit = errors.New("archive exceeds extraction limits")
)

// The limits an Options field left zero gets.
const (
	DefaultMaxEntries = 1 << 20  // entries of any type, headers included
	DefaultMaxBytes   = 16 << 30 // bytes of regular file content, 16 GiB
	DefaultMaxDepth   = 256      // components of an entry's name

	// SourceMaxBytes bounds a pushed source tree: a small push can hold a huge tree (one
	// blob named many times), and the build directory is on the data dir's disk.
	SourceMaxBytes = 2 << 30
	// ImageMaxBytes bounds an app image's flattened filesystem.
	ImageMaxBytes = 8 << 30
)

// Options says how Extract turns entries into files. The zero value is right for a git source
// tree: regular files 0644, or 0755 when the entry has any execute bit, directories 0755, no
// times and no ownership from the archive (everything owned by the extracting process).
type Options struct {
	// KeepModes keeps each entry's permission bits including setuid, setgid and sticky, and its
	// modification time, as an image's filesystem needs. Directories get theirs after the
	// whole archive is extracted, so a read-only directory does not stop its own entries.
	KeepModes bool

	// Owner maps an entry's uid and gid in the archive to the host uid and gid its file is
	// given (chown, or lchown for a symbolic link); directories Extract makes for parents the
	// archive does not list are given Owner(0, 0). Nil leaves everything owned by the
	// extracting process. SameOwner keeps the archive's ids; a function adding a base shifts
	// an image into an unprivileged host range; one returning constants gives a whole source
	// tree to one user. Giving files away needs root (CAP_CHOWN); a failed chown fails the
	// extraction.
	Owner func(uid, gid int) (int, int)

	// AbsoluteNames reads an absolute entry name as relative to the directory ("/etc/passwd"
	// is <dir>/etc/passwd), as some image tools write layers. False refuses such entries
	// (ErrUnsafe): git never writes one.
	AbsoluteNames bool

	// Limits; zero means the Default* value.
	MaxEntries int   // headers read, of any type
	MaxBytes   int64 // total size of regular files
	MaxDepth   int   // path components of a name, "a/b/c" is 3
}

// SameOwner is an Options.Owner that keeps the ids the archive records.
func SameOwner(uid, gid int) (int, int) { return uid, gid }

// Extract reads the tar stream r and creates its entries in the existing directory dir, by the
// rules of the package doc and o. It stops at the first refused entry, limit or error, and
// when ctx is done (checked between entries).
func Extract(ctx context.Context, r io.Reader, dir string, o Options) error {
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxDepth <= 0 {
		o.MaxDepth = DefaultMaxDepth
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("opening extraction directory: %w", err)
	}
	defer root.Close()
	x := &extractor{root: root, o: o, dirs: map[string]bool{}}
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		// With GODEBUG tarinsecurepath=0 the reader flags names like "../x" but still returns
		// the header; x.name decides about those.
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return fmt.Errorf("reading archive: %w", err)
		}
		if n >= o.MaxEntries {
			return fmt.Errorf("%w: more than %d entries", ErrLimit, o.MaxEntries)
		}
		if err := x.entry(h, tr); err != nil {
			return err
		}
	}
	return x.finish()
}

type extractor struct {
	root  *os.Root
	o     Options
	bytes int64
	// dirs holds the names known to be real directories (made or checked by this
	// extraction). A directory is never removed or replaced by Extract, so once in, always
	// true.
	dirs  map[string]bool
	later []dirMeta // directories whose mode and time are set at the end (KeepModes)
}

type dirMeta struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
}

func (x *extractor) entry(h *tar.Header, r io.Reader) error {
	switch h.Typeflag {
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink, tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
	default:
		return fmt.Errorf("archive entry %q has unsupported type %q", h.Name, h.Typeflag)
	}
	name, err := x.name(h.Name)
	if err != nil {
		return err
	}
	if name == "." {
		if h.Typeflag == tar.TypeDir {
			return nil // the directory itself: the caller's
		}
		return fmt.Errorf("%w: entry %q of type %q names the extraction directory itself", ErrUnsafe, h.Name, h.Typeflag)
	}
	switch h.Typeflag {
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return nil // skipped: the sandbox has its own /dev
	}
	if err := x.parents(name, h.Name); err != nil {
		return err
	}
	switch h.Typeflag {
	case tar.TypeDir:
		return x.dir(name, h)
	case tar.TypeReg:
		return x.file(name, h, r)
	case tar.TypeSymlink:
		return x.symlink(name, h)
	default: // tar.TypeLink
		return x.link(name, h)
	}
}

// name turns an entry name into a clean relative path, "." for the directory itself.
func (x *extractor) name(raw string) (string, error) {
	n := raw
	if len(n) > maxName {
		return "", fmt.Errorf("%w: entry name %q is longer than %d bytes", ErrLimit, short(raw), maxName)
	}
	if strings.ContainsRune(n, 0) {
		return "", fmt.Errorf("%w: entry name %q has a NUL byte", ErrUnsafe, raw)
	}
	if strings.HasPrefix(n, "/") {
		if !x.o.AbsoluteNames {
			return "", fmt.Errorf("%w: entry %q has an absolute name", ErrUnsafe, raw)
		}
		n = strings.TrimLeft(n, "/")
	}
	for _, c := range strings.Split(n, "/") {
		if c == ".." {
			return "", fmt.Errorf("%w: entry %q has a \"..\" component", ErrUnsafe, raw)
		}
	}
	n = path.Clean(n) // only "." and empty components are left to clean
	if d := strings.Count(n, "/") + 1; d > x.o.MaxDepth {
		return "", fmt.Errorf("%w: entry %q is %d levels deep, more than %d", ErrLimit, short(raw), d, x.o.MaxDepth)
	}
	return n, nil
}

// parents makes sure every parent of name is a real directory, making missing ones.
func (x *extractor) parents(name, raw string) error {
	for i := range len(name) {
		if name[i] != '/' {
			continue
		}
		p := name[:i]
		if x.dirs[p] {
			continue
		}
		fi, err := x.root.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := x.root.Mkdir(p, 0o755); err != nil {
				return fmt.Errorf("archive entry %q: %w", raw, err)
			}
			if err := x.chown(p, 0, 0); err != nil {
				return fmt.Errorf("archive entry %q: %w", raw, err)
			}
			if err := x.root.Chmod(p, 0o755); err != nil { // the umask may have narrowed it
				return fmt.Errorf("archive entry %q: %w", raw, err)
			}
		case err != nil:
			return fmt.Errorf("archive entry %q: %w", raw, err)
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("%w: entry %q would be written through the symbolic link %q", ErrUnsafe, raw, p)
		case !fi.IsDir():
			return fmt.Errorf("archive entry %q: %q is not a directory", raw, p)
		}
		x.dirs[p] = true
	}
	return nil
}

func (x *extractor) dir(name string, h *tar.Header) error {
	if !x.dirs[name] {
		fi, err := x.root.Lstat(name)
		if err == nil && !fi.IsDir() {
			// A link or file of that name (an earlier entry): replaced, never followed.
			if err := x.root.Remove(name); err != nil {
				return fmt.Errorf("archive entry %q: %w", h.Name, err)
			}
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("archive entry %q: %w", h.Name, err)
		}
		if err := x.root.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("archive entry %q: %w", h.Name, err)
		}
		x.dirs[name] = true
	}
	if err := x.chown(name, h.Uid, h.Gid); err != nil {
		return fmt.Errorf("archive entry %q: %w", h.Name, err)
	}
	if x.o.KeepModes {
		x.later = append(x.later, dirMeta{name, keptMode(h), h.ModTime})
		return nil
	}
	if err := x.root.Chmod(name, 0o755); err != nil {
		return fmt.Errorf("archive entry %q: %w", h.Name, err)
	}
	return nil
}

func (x *extractor) file(name string, h *tar.Header, r io.Reader) error {
	if h.Size > x.o.MaxBytes-x.bytes {
		return fmt.Errorf("%w: more than %d bytes of files (at entry %q)", ErrLimit, x.o.MaxBytes, h.Name)
	}
	x.bytes += h.Size
	if err := x.clear(name, h.Name); err != nil {
		return err
	}
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("archive entry %q: %w", h.Name, err)
	}
	_, err = io.CopyN(f, r, h.Size)
	if err == nil && x.o.Owner != nil {
		err = f.Chown(x.o.Owner(h.Uid, h.Gid))
	}
	if err == nil { // after chown, which clears setuid and setgid
		mode := fs.FileMode(0o644)
		if x.o.KeepModes {
			mode = keptMode(h)
		} else if h.Mode&0o111 != 0 {
			mode = 0o755
		}
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && x.o.KeepModes {
		err = x.root.Chtimes(name, h.ModTime, h.ModTime)
	}
	if err != nil {
		return fmt.Errorf("archive entry %q: %w", h.Name, err)
	}
	return nil
}

func (x *extractor) symlink(name string, h *tar.Header) error {
	if h.Linkname == "" || strings.ContainsRune(h.Linkname, 0) {
		return fmt.Errorf("archive entry %q: symbolic link target %q is empty or has a NUL byte", h.Name, h.Linkname)
	}
	if err := x.clear(name, h.Name); err != nil {
		return err
	}
	if err := x.root.Symlink(h.Linkname, name); err != nil {
		return fmt.Errorf("archive entry %q: %w", h.Name, err)
	}
	if err := x.chown(name, h.Uid, h.Gid); err != nil {
		return fmt.Errorf("archive entry %q: %w", h.Name, err)
	}
	return nil
}

func (x *extractor) link(name string, h *tar.Header) error {
	target, err := x.name(h.Linkname)
	if err != nil {
		return fmt.Errorf("hard link %q: target: %w", h.Name, err)
	}
	if target == "." || target == name {
		return fmt.Errorf("%w: hard link %q to %q", ErrUnsafe, h.Name, h.Linkname)
	}
	for i := range len(target) {
		if target[i] != '/' || x.dirs[target[:i]] {
			continue
		}
		p := target[:i]
		fi, err := x.root.Lstat(p)
		switch {
		case err != nil:
			return fmt.Errorf("hard link %q: target %q: %w", h.Name, h.Linkname, err)
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("%w: hard link %q: target %q is reached through the symbolic link %q", ErrUnsafe, h.Name, h.Linkname, p)
		case !fi.IsDir():
			return fmt.Errorf("hard link %q: target %q: %q is not a directory", h.Name, h.Linkname, p)
		}
		x.dirs[p] = true
	}
	fi, err := x.root.Lstat(target)
	if err != nil {
		return fmt.Errorf("hard link %q: target %q: %w", h.Name, h.Linkname, err)
	}
	if !fi.Mode().IsRegular() && fi.Mode()&fs.ModeSymlink == 0 {
		return fmt.Errorf("hard link %q: target %q is not a regular file or symbolic link", h.Name, h.Linkname)
	}
	if err := x.clear(name, h.Name); err != nil {
		return err
	}
	// The link shares its target's inode, so its mode, owner and time too.
	if err := x.root.Link(target, name); err != nil {
		return fmt.Errorf("archive entry %q: %w", h.Name, err)
	}
	return nil
}

// clear removes what an earlier entry left at name, unless it is a directory.
func (x *extractor) clear(name, raw string) error {
	if x.dirs[name] {
		return fmt.Errorf("archive entry %q: a directory is in the way", raw)
	}
	fi, err := x.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("archive entry %q: %w", raw, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("archive entry %q: a directory is in the way", raw)
	}
	if err := x.root.Remove(name); err != nil {
		return fmt.Errorf("archive entry %q: %w", raw, err)
	}
	return nil
}

// chown gives name (never followed) the owner Options.Owner maps uid and gid to, if any.
func (x *extractor) chown(name string, uid, gid int) error {
	if x.o.Owner == nil {
		return nil
	}
	u, g := x.o.Owner(uid, gid)
	return x.root.Lchown(name, u, g)
}

// finish gives directories their kept mode and time once their contents stopped changing
// them: in reverse order, so children (listed after their parents) come before a parent that
// may become unsearchable, and the last of duplicate entries wins.
func (x *extractor) finish() error {
	done := map[string]bool{}
	for i := len(x.later) - 1; i >= 0; i-- {
		d := x.later[i]
		if done[d.name] {
			continue
		}
		done[d.name] = true
		if err := x.root.Chmod(d.name, d.mode); err != nil {
			return fmt.Errorf("archive entry %q: %w", d.name, err)
		}
		if err := x.root.Chtimes(d.name, d.mtime, d.mtime); err != nil {
			return fmt.Errorf("archive entry %q: %w", d.name, err)
		}
	}
	return nil
}

// maxName is the longest entry name Extract takes: Linux's PATH_MAX.
const maxName = 4096

// short is s cut to 100 bytes for an error message.
func short(s string) string {
	if len(s) <= 100 {
		return s
	}
	return s[:100] + "…"
}

// keptMode is the entry's permission bits with setuid, setgid and sticky.
func keptMode(h *tar.Header) fs.FileMode {
	m := h.FileInfo().Mode()
	return m.Perm() | m&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)
}
