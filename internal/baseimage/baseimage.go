// Package baseimage builds the base image of kpush's container image from Debian packages,
// without Docker, a daemon or root: the .deb files come from the host's apt sources
// (`apt-get download`, cached and checked against apt's SHA256), their file trees are read
// with `dpkg-deb --fsys-tarfile` and merged into one layer, and go-containerregistry turns the
// layer into an OCI image (linux/<the packages' architecture>) that ko builds kpush onto.
//
// The image holds what `kpush serve` execs: git (receive-pack, upload-pack, pack-objects and
// archive are built into /usr/bin/git; it links libc, zlib and libpcre2-8), /bin/sh (dash, for
// the pre-receive hook script gitserver writes), the CA bundle at
// /etc/ssl/certs/ca-certificates.crt (registry TLS), and /etc/passwd with root and nonroot
// (65532), the user the image runs as. Maintainer scripts do not run: the few files they
// would make (passwd, the CA bundle) are written here instead, and the directories the
// packages ship in /bin, /sbin and /lib* are moved under /usr with symlinks in their place
// (Debian's merged /usr layout, which the ELF interpreter path /lib64/ld-linux-x86-64.so.2
// relies on). Documentation other than copyright files, man pages and translations are
// left out.
//
// The same .deb files give the same layer and the same image digest: entries are sorted,
// owners cleared to numeric ids, and the files kpush adds and the image config are dated
// at the Unix epoch.
package baseimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DefaultPackages are the Debian packages of kpush's base image (see the package doc).
// libgcc-s1 is libc6's one dependency; git's other dependencies (perl, libcurl, libexpat,
// git-man) serve commands kpush never runs and are left out on purpose.
var DefaultPackages = []string{"ca-certificates", "dash", "git", "libc6", "libgcc-s1", "libpcre2-8-0", "zlib1g"}

// NonrootUID is the uid and gid the image runs as (the "nonroot" user of /etc/passwd); the
// Helm chart's securityContext uses the same number.
const NonrootUID = 65532

// Options say which packages to use and where to keep them.
type Options struct {
	// Packages are Debian package names, resolved to the versions apt would install.
	// Empty means DefaultPackages.
	Packages []string
	// CacheDir keeps the downloaded .deb files between runs. Empty means
	// $XDG_CACHE_HOME/kpush/debs (os.UserCacheDir).
	CacheDir string
	// Stderr receives apt-get's progress; nil discards it.
	Stderr io.Writer
}

// Deb is one downloaded package file.
type Deb struct {
	Package string // e.g. "git"
	Version string // Debian version, e.g. "1:2.39.5-0+deb12u3"
	Arch    string // Debian architecture, e.g. "amd64" or "all"
	Path    string // the .deb file in the cache directory
}

// Build downloads the packages (Download) and returns the base image made of them (Image).
func Build(ctx context.Context, o Options) (v1.Image, []Deb, error) {
	debs, err := Download(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	img, err := Image(ctx, debs)
	if err != nil {
		return nil, nil, err
	}
	return img, debs, nil
}

// Download resolves o.Packages with `apt-get download --print-uris` (no dependency
// resolution: the list is the closure), downloads the .deb files not yet in the cache
// directory with `apt-get download`, and checks each file's SHA256 against apt's index. When
// apt does not know a package it runs `apt-get update` once and tries again. The result is
// sorted by package name.
func Download(ctx context.Context, o Options) ([]Deb, error) {
	pkgs := o.Packages
	if len(pkgs) == 0 {
		pkgs = DefaultPackages
	}
	stderr := o.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	dir := o.CacheDir
	if dir == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			return nil, fmt.Errorf("finding the cache directory for .deb files (set XDG_CACHE_HOME): %w", err)
		}
		dir = filepath.Join(c, "kpush", "debs")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the .deb cache %s: %w", dir, err)
	}
	uris, err := printURIs(ctx, pkgs, stderr)
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return nil, err
		}
		fmt.Fprintf(stderr, "baseimage: apt-get does not know every package (%v); running apt-get update\n", err)
		up := exec.CommandContext(ctx, "apt-get", "update", "-qq")
		up.Stdout, up.Stderr = stderr, stderr
		if uerr := up.Run(); uerr != nil {
			return nil, fmt.Errorf("resolving Debian packages %s: %w; apt-get update failed too: %v (run apt-get update as root)", strings.Join(pkgs, " "), err, uerr)
		}
		if uris, err = printURIs(ctx, pkgs, stderr); err != nil {
			return nil, fmt.Errorf("resolving Debian packages %s: %w", strings.Join(pkgs, " "), err)
		}
	}
	var debs []Deb
	for _, u := range uris {
		p := filepath.Join(dir, u.file)
		if sumFile(p) != u.sha256 {
			cmd := exec.CommandContext(ctx, "apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", u.pkg+"="+u.version)
			cmd.Dir, cmd.Stdout, cmd.Stderr = dir, stderr, stderr
			if err := cmd.Run(); err != nil {
				return nil, fmt.Errorf("downloading Debian package %s=%s: %w", u.pkg, u.version, err)
			}
			if got := sumFile(p); got != u.sha256 {
				return nil, fmt.Errorf("downloading Debian package %s: %s has SHA256 %s, apt's index says %s", u.pkg, p, got, u.sha256)
			}
		}
		debs = append(debs, Deb{Package: u.pkg, Version: u.version, Arch: u.arch, Path: p})
	}
	sort.Slice(debs, func(i, j int) bool { return debs[i].Package < debs[j].Package })
	return debs, nil
}

type aptURI struct{ pkg, version, arch, file, sha256 string }

// printURIs parses `apt-get download --print-uris` lines: 'URI' FILE SIZE SHA256:HEX, where
// FILE is PACKAGE_VERSION_ARCH.deb with ':' escaped as %3a.
func printURIs(ctx context.Context, pkgs []string, stderr io.Writer) ([]aptURI, error) {
	// apt-get leaves out packages whose file is already in its working directory: ask in an
	// empty one.
	empty, err := os.MkdirTemp("", "kpush-apt-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(empty)
	cmd := exec.CommandContext(ctx, "apt-get", "download", "--print-uris", "-q")
	cmd.Args = append(cmd.Args, pkgs...)
	cmd.Dir, cmd.Stderr = empty, stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	var uris []aptURI
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[3], "SHA256:") {
			continue
		}
		name := strings.TrimSuffix(f[1], ".deb")
		parts := strings.Split(name, "_")
		if len(parts) != 3 {
			return nil, fmt.Errorf("apt-get download --print-uris: unexpected file name %q", f[1])
		}
		uris = append(uris, aptURI{
			pkg: parts[0], version: strings.ReplaceAll(parts[1], "%3a", ":"), arch: parts[2],
			file: f[1], sha256: strings.TrimPrefix(f[3], "SHA256:"),
		})
	}
	if len(uris) != len(pkgs) {
		return nil, fmt.Errorf("apt-get download --print-uris gave %d packages for %d names (%s): a name matched nothing or something else", len(uris), len(pkgs), strings.Join(pkgs, " "))
	}
	return uris, nil
}

func sumFile(p string) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}

// goArch maps Debian architecture names to GOARCH (and variant) names.
var goArch = map[string][2]string{
	"amd64": {"amd64", ""}, "arm64": {"arm64", "v8"}, "armhf": {"arm", "v7"}, "i386": {"386", ""},
	"ppc64el": {"ppc64le", ""}, "riscv64": {"riscv64", ""}, "s390x": {"s390x", ""},
}

// Image merges the packages' file trees into one layer (Layer) and returns an image with it:
// linux on the packages' architecture, user 65532:65532, PATH and HOME set, the packages and
// versions in the label dev.kpush.debian-packages, created at the Unix epoch.
func Image(ctx context.Context, debs []Deb) (v1.Image, error) {
	arch := ""
	var names []string
	for _, d := range debs {
		if d.Arch != "all" {
			if arch != "" && d.Arch != arch {
				return nil, fmt.Errorf("packages for two architectures: %s and %s (%s)", arch, d.Arch, d.Package)
			}
			arch = d.Arch
		}
		names = append(names, d.Package+"="+d.Version)
	}
	ga, ok := goArch[arch]
	if !ok {
		return nil, fmt.Errorf("debian architecture %q: no Go/OCI equivalent known", arch)
	}
	layer, err := Layer(ctx, debs)
	if err != nil {
		return nil, err
	}
	epoch := v1.Time{Time: time.Unix(0, 0).UTC()}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   epoch,
			CreatedBy: "kpush internal/baseimage: " + strings.Join(names, " "),
			Comment:   "Debian packages merged into one layer, no maintainer scripts",
		},
	})
	if err != nil {
		return nil, fmt.Errorf("adding the Debian layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = "linux", ga[0], ga[1]
	cf.Created = epoch
	uid := strconv.Itoa(NonrootUID)
	cf.Config.User = uid + ":" + uid
	cf.Config.WorkingDir = "/home/nonroot"
	cf.Config.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/home/nonroot",
		"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
	}
	cf.Config.Labels = map[string]string{
		"dev.kpush.debian-packages":              strings.Join(names, " "),
		"org.opencontainers.image.title":         "kpush-base",
		"org.opencontainers.image.documentation": "git, dash and the CA bundle from Debian packages; made by kpush's internal/baseimage",
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("setting the image config: %w", err)
	}
	return img, nil
}

// mergedUsr are the top-level directories Debian's merged-/usr layout turns into symlinks
// to usr/<same name>.
var mergedUsr = map[string]bool{"bin": true, "sbin": true, "lib": true, "lib32": true, "lib64": true, "libx32": true}

// entry is one file of the layer being built.
type entry struct {
	hdr  *tar.Header
	data []byte
}

// Layer reads each .deb's file tree (`dpkg-deb --fsys-tarfile`) and merges them into one
// uncompressed-then-gzipped tar layer: paths under /bin, /sbin and /lib* moved under /usr
// (with the top-level symlinks added), documentation dropped except copyright files, a later
// package's file replacing an earlier one's, and kpush's own files added (/etc/passwd,
// /etc/group, /etc/nsswitch.conf, the CA bundle, /tmp, /root, /home/nonroot,
// /var/lib/kpush).
func Layer(ctx context.Context, debs []Deb) (v1.Layer, error) {
	files := map[string]*entry{}
	for _, d := range debs {
		if err := readDeb(ctx, d.Path, files); err != nil {
			return nil, fmt.Errorf("reading Debian package %s: %w", d.Package, err)
		}
	}
	addOwnFiles(files)
	var buf bytes.Buffer
	if err := writeTar(&buf, files); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("making the layer: %w", err)
	}
	return layer, nil
}

func readDeb(ctx context.Context, p string, files map[string]*entry) error {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", p)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("running dpkg-deb (install the dpkg package): %w", err)
	}
	tr := tar.NewReader(out)
	var rerr error
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			rerr = err
			break
		}
		name := CanonicalPath(h.Name)
		if name == "" || Dropped(name) {
			continue
		}
		if h.Typeflag == tar.TypeLink {
			// A hard link becomes a copy of its target, so that the sorted layer never
			// names a link before the file it points to.
			t, ok := files[CanonicalPath(h.Linkname)]
			if !ok || t.hdr.Typeflag != tar.TypeReg {
				rerr = fmt.Errorf("hard link %s to %s, which is not a file read before it", h.Name, h.Linkname)
				break
			}
			h.Typeflag, h.Linkname, h.Size = tar.TypeReg, "", t.hdr.Size
			files[name] = &entry{hdr: normalize(h, name), data: t.data}
			continue
		}
		if h.Typeflag == tar.TypeDir {
			if _, ok := files[name]; ok {
				continue // the first package to ship a directory decides its mode
			}
		}
		var data []byte
		if h.Typeflag == tar.TypeReg {
			if data, err = io.ReadAll(tr); err != nil {
				rerr = err
				break
			}
		}
		files[name] = &entry{hdr: normalize(h, name), data: data}
	}
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", p, err, strings.TrimSpace(stderr.String()))
	}
	return rerr
}

// normalize renames h to name and clears what would make the layer depend on more than the
// packages' contents: owner names, access and change times, extra PAX records.
func normalize(h *tar.Header, name string) *tar.Header {
	h.Name = name
	h.Uname, h.Gname = "", ""
	h.Format = tar.FormatPAX
	h.AccessTime, h.ChangeTime = time.Time{}, time.Time{}
	h.PAXRecords = nil
	return h
}

// CanonicalPath turns a path from a package's tar ("./usr/bin/git", "./bin/sh") into the
// layer path under merged /usr without a leading "./" or "/" ("usr/bin/git", "usr/bin/sh").
// The root directory is "".
func CanonicalPath(p string) string {
	p = strings.TrimPrefix(path.Clean("/"+p), "/")
	if p == "" {
		return ""
	}
	top, _, _ := strings.Cut(p, "/")
	if mergedUsr[top] {
		p = "usr/" + p
	}
	return p
}

// Dropped says whether a layer path is left out of the image: man and info pages,
// translations, lintian overrides, and documentation except copyright files.
func Dropped(p string) bool {
	for _, d := range []string{"usr/share/man/", "usr/share/info/", "usr/share/locale/", "usr/share/lintian/"} {
		if strings.HasPrefix(p+"/", d) {
			return true
		}
	}
	if rest, ok := strings.CutPrefix(p, "usr/share/doc/"); ok {
		pkg, file, sub := strings.Cut(rest, "/")
		return pkg != "" && sub && file != "copyright"
	}
	return false
}

func addOwnFiles(files map[string]*entry) {
	epoch := time.Unix(0, 0).UTC()
	dir := func(name string, mode int64, uid int) {
		files[name] = &entry{hdr: &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, Uid: uid, Gid: uid, ModTime: epoch, Format: tar.FormatPAX}}
	}
	file := func(name string, mode int64, data []byte) {
		files[name] = &entry{hdr: &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}, data: data}
	}
	for top := range mergedUsr {
		if _, ok := files["usr/"+top]; ok {
			files[top] = &entry{hdr: &tar.Header{Typeflag: tar.TypeSymlink, Name: top, Linkname: "usr/" + top, Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX}}
		}
	}
	dir("tmp", 0o1777, 0)
	dir("root", 0o700, 0)
	dir("home", 0o755, 0)
	dir("home/nonroot", 0o755, NonrootUID)
	dir("var/lib/kpush", 0o700, NonrootUID)
	u := strconv.Itoa(NonrootUID)
	file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnonroot:x:"+u+":"+u+":nonroot:/home/nonroot:/bin/sh\n"))
	file("etc/group", 0o644, []byte("root:x:0:\nnonroot:x:"+u+":\n"))
	file("etc/nsswitch.conf", 0o644, []byte("passwd: files\ngroup: files\nhosts: files dns\n"))

	// What update-ca-certificates would write: every certificate the package ships, sorted.
	var certs []string
	for name, e := range files {
		if strings.HasPrefix(name, "usr/share/ca-certificates/") && strings.HasSuffix(name, ".crt") && e.hdr.Typeflag == tar.TypeReg {
			certs = append(certs, name)
		}
	}
	if len(certs) > 0 {
		sort.Strings(certs)
		var bundle bytes.Buffer
		for _, c := range certs {
			bundle.Write(files[c].data)
			if n := len(files[c].data); n > 0 && files[c].data[n-1] != '\n' {
				bundle.WriteByte('\n')
			}
		}
		file("etc/ssl/certs/ca-certificates.crt", 0o644, bundle.Bytes())
	}
	// Every entry's parent directories exist, so that extracting the layer anywhere works.
	for name := range files {
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if _, ok := files[d]; !ok {
				dir(d, 0o755, 0)
			}
		}
	}
}

func writeTar(w io.Writer, files map[string]*entry) error {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, n := range names {
		e := files[n]
		h := *e.hdr
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(&h); err != nil {
			return fmt.Errorf("writing %s to the layer: %w", n, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return fmt.Errorf("writing %s to the layer: %w", n, err)
		}
	}
	return tw.Close()
}
