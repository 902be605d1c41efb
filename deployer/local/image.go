package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"kpush.dev/kpush/internal/archive"
	"kpush.dev/kpush/internal/atomicfile"
	"kpush.dev/kpush/internal/sandbox"
)

// pulled is an image ready to run: its config and its extracted filesystem.
type pulled struct {
	digest v1.Hash
	config v1.Config
	rootfs string // absolute directory holding the image's flattened filesystem
}

// pull resolves ref (which must be "<repository>@sha256:<hex>") and extracts the image into
// <appDir>/images/<hex>/rootfs, reusing an earlier extraction. The image config is cached beside
// the rootfs as config.json, so a restart needs no registry when the rootfs is present. kc
// logs in to the registry (nil: anonymous). Files are owned by the image's ids shifted into
// ids, the app's host range (the rootfs directory is named for it, so an extraction for
// other ids is never reused).
func pull(ctx context.Context, ref, appDir string, kc authn.Keychain, ids sandbox.IDRange) (*pulled, error) {
	d, err := name.NewDigest(ref)
	if err != nil {
		return nil, fmt.Errorf("parsing image reference %q (want <repository>@sha256:<hex>): %w", ref, err)
	}
	h, err := v1.NewHash(d.DigestStr())
	if err != nil {
		return nil, fmt.Errorf("parsing digest of %q: %w", ref, err)
	}
	imgDir := filepath.Join(appDir, "images", h.Hex)
	rootfs := filepath.Join(imgDir, fmt.Sprintf("rootfs-%d", ids.Base))
	cfgPath := filepath.Join(imgDir, "config.json")
	if b, err := os.ReadFile(cfgPath); err == nil {
		if fi, err := os.Stat(rootfs); err == nil && fi.IsDir() {
			cf, err := v1.ParseConfigFile(strings.NewReader(string(b)))
			if err == nil {
				if err := ensureMountPoints(rootfs, cf.Config.WorkingDir); err != nil {
					return nil, fmt.Errorf("preparing image %s: %w", ref, err)
				}
				return &pulled{digest: h, config: cf.Config, rootfs: rootfs}, nil
			}
		}
	}

	opts := []remote.Option{remote.WithContext(ctx)}
	if kc != nil {
		opts = append(opts, remote.WithAuthFromKeychain(kc))
	}
	img, err := remote.Image(d, opts...)
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
		// An extraction from before apps had host ids of their own is never used again.
		_ = os.RemoveAll(filepath.Join(imgDir, "rootfs"))
		tmp, err := os.MkdirTemp(imgDir, "rootfs.tmp-")
		if err != nil {
			return nil, fmt.Errorf("creating extraction directory: %w", err)
		}
		rc := mutate.Extract(img)
		err = extractTar(ctx, rc, tmp, ids)
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
	if err := atomicfile.WriteFile(cfgPath, raw, 0o644); err != nil {
		return nil, fmt.Errorf("saving config of image %s: %w", ref, err)
	}
	return &pulled{digest: h, config: cf.Config, rootfs: rootfs}, nil
}

// extractTar unpacks the flattened image tar stream r into the existing directory dir with
// internal/archive, keeping modes (with setuid/setgid/sticky bits), ownership, modification
// times, symlinks (never written through) and hard links; absolute names are read relative to
// dir. No entry can create or change anything outside dir. Device nodes and FIFOs are skipped:
// the sandbox gets its own /dev.
func extractTar(ctx context.Context, r io.Reader, dir string, ids sandbox.IDRange) error {
	owner := func(uid, gid int) (int, int) {
		if uid < 0 || uid >= sandbox.RangeSize {
			uid = 65534 // outside the sandbox's ids: nobody
		}
		if gid < 0 || gid >= sandbox.RangeSize {
			gid = 65534
		}
		return int(ids.Host(uint32(uid))), int(ids.Host(uint32(gid)))
	}
	return archive.Extract(ctx, r, dir, archive.Options{KeepModes: true, Owner: owner, AbsoluteNames: true, MaxBytes: archive.ImageMaxBytes})
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

// ensureMountPoints creates the directories the sandbox mounts over (/proc, /dev, /tmp) and the
// working directory when the image lacks them: bubblewrap running as a non-root image user
// cannot create them in a root-owned rootfs.
func ensureMountPoints(rootfs, workDir string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	dirs := []string{"proc", "dev", "tmp", "etc"}
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
	// The files the runtime binds over, as container runtimes do (startProc): only where the
	// image has none; an image's own symlink or directory there is left alone.
	for _, f := range etcFiles {
		if _, err := root.Lstat(f); err == nil || !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := root.WriteFile(f, nil, 0o644); err != nil {
			return fmt.Errorf("creating /%s in the rootfs: %w", f, err)
		}
	}
	return nil
}

// etcFiles are the files of an app's /etc the runtime provides (its sandbox's network).
var etcFiles = []string{"etc/resolv.conf", "etc/hosts"}
