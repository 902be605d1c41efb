package buildpack

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"kpush.dev/kpush/internal/tools"
)

// The CNB user of kpush's build environment and run image.
const (
	CNBUserID  = 1000
	CNBGroupID = 1000
	CNBUser    = "cnb"
)

// RunImagePath is the PATH of the run image's config.
const RunImagePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// RunImageApplets are the busybox applets the run image links into /bin.
var RunImageApplets = []string{
	"ash", "awk", "basename", "cat", "chmod", "cp", "cut", "date", "dirname", "echo", "env",
	"false", "find", "grep", "gunzip", "gzip", "head", "hostname", "httpd", "id", "kill", "ln",
	"ls", "mkdir", "mv", "nc", "nslookup", "printf", "ps", "pwd", "readlink", "rm", "sed", "sh",
	"sleep", "sort", "tail", "tar", "test", "top", "touch", "tr", "true", "uname", "vi", "wc",
	"wget", "whoami", "xargs",
}

// RunImageOption configures NewRunImage and EnsureRunImage.
type RunImageOption func(*runImageOptions)

type runImageOptions struct {
	busybox string
	remote  []remote.Option
}

// WithBusybox takes the static busybox binary from path instead of tools.Path("busybox").
func WithBusybox(path string) RunImageOption {
	return func(o *runImageOptions) { o.busybox = path }
}

// WithRemoteOptions passes options (auth, transport) to go-containerregistry's remote package.
func WithRemoteOptions(opts ...remote.Option) RunImageOption {
	return func(o *runImageOptions) { o.remote = append(o.remote, opts...) }
}

// NewRunImage builds kpush's run image in memory: one layer with /bin/busybox, symlinks
// /bin/<applet> for RunImageApplets and /usr/bin/env, /etc/passwd and /etc/group with root and
// the CNB user (1000:1000 "cnb", home /home/cnb), /tmp (1777), /workspace and /home/cnb owned by
// the CNB user. Config: os linux, architecture runtime.GOARCH, User "1000:1000", Env PATH,
// WorkingDir /workspace, labels io.buildpacks.base.distro.name=busybox and .version. OCI media types; every timestamp is the Unix epoch, so the same
// busybox binary always gives the same digest.
func NewRunImage(opts ...RunImageOption) (v1.Image, error) {
	o := runImageOptions{}
	for _, opt := range opts {
		opt(&o)
	}
	if o.busybox == "" {
		p, err := tools.Path("busybox")
		if err != nil {
			return nil, err
		}
		o.busybox = p
	}
	bb, err := os.ReadFile(o.busybox)
	if err != nil {
		return nil, fmt.Errorf("reading busybox: %w", err)
	}
	layerTar, err := runImageLayer(bb)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("creating run image layer: %w", err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{CreatedBy: "kpush run image: busybox", Created: v1.Time{Time: time.Unix(0, 0).UTC()}},
	})
	if err != nil {
		return nil, fmt.Errorf("assembling run image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = runtime.GOARCH
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config.User = fmt.Sprintf("%d:%d", CNBUserID, CNBGroupID)
	cf.Config.Env = []string{"PATH=" + RunImagePath}
	cf.Config.WorkingDir = "/workspace"
	// Target data for the lifecycle (Platform API 0.12+); without it, it reads the build
	// environment's /etc/os-release and says so on every build.
	cf.Config.Labels = map[string]string{
		"io.buildpacks.base.distro.name":    "busybox",
		"io.buildpacks.base.distro.version": busyboxVersion(bb),
	}
	return mutate.ConfigFile(img, cf)
}

// EnsureRunImage makes sure kpush's run image (NewRunImage) is in the repository repo, e.g.
// "127.0.0.1:5000/kpush/kpush.run", and returns it by digest: "<repo>@sha256:<hex>". It pushes
// only when the registry lacks that digest, tagging it "busybox-<first 12 hex digits>".
// Errors: a bad repo name, a missing busybox ("run make tools"), or a registry error.
func EnsureRunImage(ctx context.Context, repo string, opts ...RunImageOption) (string, error) {
	o := runImageOptions{}
	for _, opt := range opts {
		opt(&o)
	}
	r, err := name.NewRepository(repo)
	if err != nil {
		return "", fmt.Errorf("parsing run image repository %q: %w", repo, err)
	}
	img, err := NewRunImage(opts...)
	if err != nil {
		return "", err
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	ref := r.Digest(d.String())
	ropts := append([]remote.Option{remote.WithContext(ctx)}, o.remote...)
	if _, err := remote.Head(ref, ropts...); err == nil {
		return ref.String(), nil
	} else if !isNotFound(err) {
		return "", fmt.Errorf("checking run image %s: %w", ref, err)
	}
	tag := r.Tag("busybox-" + d.Hex[:12])
	if err := remote.Write(tag, img, ropts...); err != nil {
		return "", fmt.Errorf("pushing run image %s: %w", tag, err)
	}
	return ref.String(), nil
}

// DefaultRunImageRepository is where Local puts the run image when its RunImage is empty:
// "kpush.run" beside the app repository image ("127.0.0.1:5000/kpush/demo" →
// "127.0.0.1:5000/kpush/kpush.run"). App names are DNS-1035 labels, so none can be "kpush.run".
func DefaultRunImageRepository(image string) (string, error) {
	r, err := name.NewRepository(image)
	if err != nil {
		return "", fmt.Errorf("parsing image repository %q: %w", image, err)
	}
	p := path.Dir(r.RepositoryStr())
	if p == "." {
		return r.RegistryStr() + "/kpush.run", nil
	}
	return r.RegistryStr() + "/" + p + "/kpush.run", nil
}

// busyboxVersion finds "BusyBox v1.35.0" in the binary; "unknown" if absent.
func busyboxVersion(bin []byte) string {
	if m := busyboxVersionRE.FindSubmatch(bin); m != nil {
		return string(m[1])
	}
	return "unknown"
}

var busyboxVersionRE = regexp.MustCompile(`BusyBox v([0-9]+(?:\.[0-9]+)*)`)

func isNotFound(err error) bool {
	var te *transport.Error
	return errors.As(err, &te) && te.StatusCode == http.StatusNotFound
}

// runImageLayer returns the run image's single layer as an uncompressed tar.
func runImageLayer(busybox []byte) ([]byte, error) {
	epoch := time.Unix(0, 0).UTC()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string, mode int64, uid int) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: uid, Gid: uid, ModTime: epoch, Format: tar.FormatPAX})
	}
	file := func(name string, mode int64, body []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	link := func(name, target string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX})
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\n%s:x:%d:%d:CNB user:/home/%s:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		CNBUser, CNBUserID, CNBGroupID, CNBUser)
	group := fmt.Sprintf("root:x:0:\n%s:x:%d:\nnogroup:x:65534:\n", CNBUser, CNBGroupID)
	steps := []func() error{
		func() error { return dir("bin", 0o755, 0) },
		func() error { return file("bin/busybox", 0o755, busybox) },
		func() error {
			for _, a := range RunImageApplets {
				if err := link("bin/"+a, "busybox"); err != nil {
					return err
				}
			}
			return nil
		},
		func() error { return dir("etc", 0o755, 0) },
		func() error { return file("etc/group", 0o644, []byte(group)) },
		func() error { return file("etc/passwd", 0o644, []byte(passwd)) },
		func() error { return dir("home", 0o755, 0) },
		func() error { return dir("home/"+CNBUser, 0o755, CNBUserID) },
		func() error { return dir("root", 0o700, 0) },
		func() error { return dir("tmp", 0o1777, 0) },
		func() error { return dir("usr", 0o755, 0) },
		func() error { return dir("usr/bin", 0o755, 0) },
		func() error { return link("usr/bin/env", "/bin/busybox") },
		func() error { return dir("workspace", 0o755, CNBUserID) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, fmt.Errorf("writing run image layer: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// registryOf returns the registry host of an image reference or repository, or "".
func registryOf(ref string) string {
	if r, err := name.ParseReference(ref); err == nil {
		return r.Context().RegistryStr()
	}
	if r, err := name.NewRepository(ref); err == nil {
		return r.RegistryStr()
	}
	return strings.SplitN(ref, "/", 2)[0]
}
