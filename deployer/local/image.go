package local

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// pulled is an image ready to run: its config and its extracted filesystem.
type pulled struct {
	digest v1.Hash
	config v1.Config
	rootfs string // absolute directory holding the image's flattened filesystem
}

// pull resolves ref (which must be "<repository>@sha256:<hex>") and extracts the image into
// <appDir>/images/<hex>/rootfs, reusing an earlier extraction. The image config is cached beside
// the rootfs as config.json, so a restart needs no registry when the rootfs is present.
func pull(ctx context.Context, ref, appDir string) (*pulled, error) {
	d, err := name.NewDigest(ref)
	if err != nil {
		return nil, fmt.Errorf("parsing image reference %q (want <repository>@sha256:<hex>): %w", ref, err)
	}
	h, err := v1.NewHash(d.DigestStr())
	if err != nil {
		return nil, fmt.Errorf("parsing digest of %q: %w", ref, err)
	}
	imgDir := filepath.Join(appDir, "images", h.Hex)
	rootfs := filepath.Join(imgDir, "rootfs")
	cfgPath := filepath.Join(imgDir, "config.json")
	if b, err := os.ReadFile(cfgPath); err == nil {
		if fi, err := os.Stat(rootfs); err == nil && fi.IsDir() {
			cf, err := v1.ParseConfigFile(strings.NewReader(string(b)))
			if err == nil {
				return &pulled{digest: h, config: cf.Config, rootfs: rootfs}, nil
			}
		}
	}

	img, err := remote.Image(d, remote.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("pulling image %s: %w", ref, err)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading config of image %s: %w", ref, err)
	}
	cf, err := v1.ParseConfigFile(strings.NewReader(string(raw)))
	if err != nil {
		return nil, fmt.Errorf("parsing config of image %s: %w", ref, err)
	}
	if err := os.MkdirAll(imgDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating image directory: %w", err)
	}
	if _, err := os.Stat(rootfs); err != nil {
		tmp, err := os.MkdirTemp(imgDir, "rootfs.tmp-")
		if err != nil {
			return nil, fmt.Errorf("creating extraction directory: %w", err)
		}
		rc := mutate.Extract(img)
		err = extractTar(ctx, rc, tmp)
		rc.Close()
		if err == nil {
			err = ensureMountPoints(tmp, cf.Config.WorkingDir)
		}
		if err == nil {
			err = os.Chmod(tmp, 0o755) // MkdirTemp made it 0700; "/" of the sandbox must be searchable.
		}
		if err == nil {
			err = os.Rename(tmp, rootfs)
		}
		if err != nil {
			os.RemoveAll(tmp)
			return nil, fmt.Errorf("extracting image %s: %w", ref, err)
		}
	}
	if err := writeFileAtomic(cfgPath, raw, 0o644); err != nil {
		return nil, fmt.Errorf("saving config of image %s: %w", ref, err)
	}
	return &pulled{digest: h, config: cf.Config, rootfs: rootfs}, nil
}

// extractTar unpacks the tar stream r into the existing directory dir, keeping modes (with
// setuid/setgid/sticky bits), ownership, modification times, symlinks and hard links. Every
// path is resolved through an os.Root, so no entry (by "..", an absolute name, or a symlink
// planted by an earlier entry) can create or change anything outside dir. Device nodes and
// FIFOs are skipped: the sandbox gets its own /dev.
func extractTar(ctx context.Context, r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	type dirTime struct {
		name string
		hdr  *tar.Header
	}
	var dirs []dirTime
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading tar: %w", err)
		}
		name, ok := cleanTarPath(hdr.Name)
		if !ok {
			return fmt.Errorf("tar entry %q: path escapes the image root", hdr.Name)
		}
		if name == "." {
			continue // the root itself
		}
		if parent := path.Dir(name); parent != "." {
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return fmt.Errorf("tar entry %q: creating parent: %w", hdr.Name, err)
			}
		}
		mode := hdr.FileInfo().Mode()
		switch hdr.Typeflag {
		case tar.TypeDir:
			if fi, err := root.Lstat(name); err == nil && !fi.IsDir() {
				if err := root.Remove(name); err != nil {
					return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
				}
			}
			if err := root.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
			}
			dirs = append(dirs, dirTime{name, hdr})
		case tar.TypeReg, tar.TypeRegA:
			if err := removeNonDir(root, name); err != nil {
				return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
			}
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("tar entry %q: writing: %w", hdr.Name, err)
			}
		case tar.TypeSymlink:
			if err := removeNonDir(root, name); err != nil {
				return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
			}
			// The target is interpreted inside the sandbox, where the rootfs is "/", so it
			// is kept verbatim; later entries cannot write through it (os.Root).
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
			}
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return fmt.Errorf("tar entry %q: chown: %w", hdr.Name, err)
			}
			continue
		case tar.TypeLink:
			target, ok := cleanTarPath(hdr.Linkname)
			if !ok || target == "." {
				return fmt.Errorf("tar entry %q: hard link target %q escapes the image root", hdr.Name, hdr.Linkname)
			}
			if err := removeNonDir(root, name); err != nil {
				return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
			}
			if err := root.Link(target, name); err != nil {
				return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
			}
			continue // shares the inode (and so mode and owner) with its target
		default: // char/block devices, FIFOs, and anything unknown
			continue
		}
		if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("tar entry %q: chown: %w", hdr.Name, err)
		}
		// chmod after chown: chown clears setuid/setgid bits.
		if err := root.Chmod(name, mode.Perm()|mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
			return fmt.Errorf("tar entry %q: chmod: %w", hdr.Name, err)
		}
		if hdr.Typeflag != tar.TypeDir {
			if err := root.Chtimes(name, hdr.ModTime, hdr.ModTime); err != nil {
				return fmt.Errorf("tar entry %q: chtimes: %w", hdr.Name, err)
			}
		}
	}
	// Directory times last, after their contents stopped changing them.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := root.Chtimes(dirs[i].name, dirs[i].hdr.ModTime, dirs[i].hdr.ModTime); err != nil {
			return fmt.Errorf("tar entry %q: chtimes: %w", dirs[i].hdr.Name, err)
		}
	}
	return nil
}

// cleanTarPath turns a tar entry name into a clean relative path ("." for the root), or
// reports false when it would leave the root.
func cleanTarPath(n string) (string, bool) {
	n = strings.TrimLeft(n, "/")
	c := path.Clean(n)
	if c == ".." || strings.HasPrefix(c, "../") || strings.ContainsRune(c, 0) {
		return "", false
	}
	if c == "" {
		c = "."
	}
	return c, true
}

// removeNonDir removes name if it exists and is not a directory, so a later entry replaces an
// earlier one the way a layer would.
func removeNonDir(root *os.Root, name string) error {
	fi, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("a directory is in the way")
	}
	return root.Remove(name)
}

// writeFileAtomic writes data to a temporary file beside path and renames it into place.
func writeFileAtomic(p string, data []byte, perm fs.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), p)
}

// ensureMountPoints creates the directories the sandbox mounts over (/proc, /dev, /tmp) and the
// working directory when the image lacks them: bubblewrap running as a non-root image user
// cannot create them in a root-owned rootfs.
func ensureMountPoints(rootfs, workDir string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	dirs := []string{"proc", "dev", "tmp"}
	if w, ok := cleanTarPath(workDir); ok && w != "." {
		dirs = append(dirs, w)
	}
	for _, d := range dirs {
		if _, err := root.Stat(d); err == nil {
			continue
		}
		if err := root.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("creating /%s in the rootfs: %w", d, err)
		}
	}
	return nil
}
