package buildpack

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"kpush.dev/kpush/internal/names"
	"kpush.dev/kpush/internal/sandbox"
	"kpush.dev/kpush/internal/tools"
)

// PlatformAPI is the CNB Platform API version Local speaks to the lifecycle.
const PlatformAPI = "0.14"

// goEnvPassThrough are the host's `go env` settings handed to buildpacks (as platform env
// files) when Local.GoEnv is nil, so module downloads use the same proxy as the host.
var goEnvPassThrough = []string{"GOPROXY", "GONOPROXY", "GOPRIVATE", "GOSUMDB", "GONOSUMDB", "GOINSECURE"}

// Local builds on this machine: it runs the CNB lifecycle's five phases (Platform API 0.14)
// the way kpack's build Pods do — analyze, detect, restore, build, export — each in a
// sandbox of its own (internal/sandbox: user, mount, PID, IPC, UTS and network namespaces,
// seccomp, no capabilities) as the CNB user on the app's own unprivileged host ids, and
// publishes to a registry. The registry credentials and the host's network go only to
// analyze, restore and export, which run no buildpack code; detect runs with no network,
// build with outbound network that cannot reach the host's loopback services. The zero value
// is not usable: set DataDir. Safe for concurrent use; builds of the same app wait for each
// other (they share a cache), also across processes.
//
// Sandbox layout (canonical CNB paths, so cache layers restore to the paths they were built at):
//
//	/usr (and /bin /lib* /sbin, or their symlinks)  host's, read-only
//	/etc/passwd, /etc/group   generated: root + cnb (1000:1000)
//	/etc/hosts, resolv.conf   generated (no other host /etc file but the CA bundle)
//	/tmp                      tmpfs, 1777
//	/home/cnb                 per-build, owned by the CNB user ($HOME; detect and build only)
//	/workspace                Request.SourceDir, chowned to the CNB user (writable in build)
//	/layers                   per-build, <DataDir>/builds/<app>-<tag>/layers
//	/platform                 per-build, read-only: env/NAME files (detect and build)
//	/cnb                      per-build, read-only: lifecycle/{lifecycle,launcher,creator,...},
//	                          buildpacks/<id>/<version>/, order.toml, run.toml
//	/cache                    <DataDir>/cache/<app>, kept between builds (restore and export)
//	/opt/kpush/go             GoRoot, read-only (detect and build)
type Local struct {
	// DataDir holds per-app caches (<DataDir>/cache/<app>) and per-build scratch directories
	// (<DataDir>/builds, removed after each build). Required.
	DataDir string
	// RunImage is the run image by digest. Empty: EnsureRunImage into
	// DefaultRunImageRepository(Request.Image) on first use (per repository).
	RunImage string
	// GoRoot is the Go toolchain mounted at GoRootPath. Empty: `go env GOROOT` of the host.
	GoRoot string
	// GoEnv are build-time variables for every build (as platform env files), overridden by
	// Request.Env. Nil: the host's `go env` values of GOPROXY, GONOPROXY, GOPRIVATE, GOSUMDB,
	// GONOSUMDB and GOINSECURE.
	GoEnv map[string]string
	// RegistryUsername and RegistryPassword, if set, authenticate to the registries of
	// Request.Image and RunImage (basic auth, handed as CNB_REGISTRY_AUTH to the analyze,
	// restore and export phases only; never printed, never in a phase that runs buildpacks).
	RegistryUsername, RegistryPassword string
	// InsecureRegistries are registries reached over plain HTTP besides the loopback and
	// private addresses the lifecycle already treats so (creator -insecure-registry).
	InsecureRegistries []string
	// ExtraBuildpacks are added to the builder beside kpush's own (BuiltinBuildpacks). Each FS
	// is rooted at a buildpack's directory: buildpack.toml ([buildpack] id, version), bin/detect,
	// bin/build. Files under bin/ are made executable.
	ExtraBuildpacks []fs.FS
	// Order is the builder's order.toml. Nil: DefaultOrder(). It may name built-in and extra
	// buildpacks.
	Order []Group
	// Log gets internal detail (phase timings, exit codes). Nil: discarded.
	Log *slog.Logger

	mu        sync.Mutex
	appLocks  map[string]chan struct{}
	runImages map[string]string // repository → digest ref, from EnsureRunImage
	goRoot    string
	goEnv     map[string]string
}

// Build builds req.SourceDir with the lifecycle's creator and publishes the image to
// req.Image under a fresh tag "<UTC yyyymmdd-hhmmss>-<6 hex>". It streams the lifecycle's
// and buildpacks' output to out line by line as it happens, with terminal escapes removed.
// It takes ownership of req.SourceDir (chowns it to the CNB user, 1000:1000).
// req.PreviousImage is the creator's -previous-image (see Request).
//
// The result names the image by the digest in the lifecycle's report.toml. Errors: an *Error
// (errors.Is with ErrDetect, ErrBuild, ErrExport, ErrLifecycle) when the lifecycle fails, a
// plain error for a bad request or a missing tool ("run make tools"), or ctx.Err() wrapped
// when ctx ends (the sandbox is killed).
func (l *Local) Build(ctx context.Context, req Request, out io.Writer) (Result, error) {
	log := l.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("app", req.App)
	if err := validateRequest(req); err != nil {
		return Result{}, err
	}
	if l.DataDir == "" {
		return Result{}, errors.New("buildpack.Local: DataDir is empty")
	}
	repo, previous, noPrevious, err := outputRepository(req, log)
	if err != nil {
		return Result{}, err
	}
	bin := map[string]string{}
	for _, t := range []string{"lifecycle", "launcher"} {
		if bin[t], err = tools.Path(t); err != nil {
			return Result{}, err
		}
	}
	ids, err := l.ids().Get("build/" + req.App)
	if err != nil {
		return Result{}, err
	}
	goRoot, goEnv, err := l.goSettings(ctx)
	if err != nil {
		return Result{}, err
	}
	runImage, err := l.runImage(ctx, req.Image)
	if err != nil {
		return Result{}, err
	}

	unlock, err := l.lockApp(ctx, req.App, out)
	if err != nil {
		return Result{}, err
	}
	defer unlock()

	tag := newTag(time.Now())
	build := filepath.Join(l.DataDir, "builds", req.App+"-"+tag)
	defer func() {
		if err := os.RemoveAll(build); err != nil {
			log.Warn("removing build directory", "dir", build, "err", err)
		}
	}()
	env := map[string]string{}
	for k, v := range goEnv {
		env[k] = v
	}
	for k, v := range req.Env {
		env[k] = v
	}
	cacheDir := filepath.Join(l.DataDir, "cache", req.App)
	order := l.Order
	if order == nil {
		order = DefaultOrder()
	}
	if len(req.Group) > 0 {
		order = []Group{req.Group}
	}
	if err := l.prepare(build, cacheDir, req.SourceDir, runImage, order, env, ids); err != nil {
		return Result{}, fmt.Errorf("preparing build directory: %w", err)
	}

	image := repo.Tag(tag).String()
	sink := &lineSink{out: out, freshImage: image, noPrevious: noPrevious}
	stdout, stderr := &lineWriter{sink: sink}, &lineWriter{sink: sink}
	box := buildSandbox{
		build: build, source: req.SourceDir, cache: cacheDir, goRoot: goRoot,
		lifecycle: bin["lifecycle"], launcher: bin["launcher"], ids: ids,
		auth:   registryAuth(l.RegistryUsername, l.RegistryPassword, req.Image, runImage),
		stdout: stdout, stderr: stderr,
	}

	t0 := time.Now()
	log.Info("build started", "image", image, "run_image", runImage, "previous_image", previous, "host_uid", ids.Host(CNBUserID))
	for _, ph := range phases(image, previous, l.InsecureRegistries) {
		pt := time.Now()
		fmt.Fprintln(stdout, ph.header)
		if ph.name == "restorer" {
			if err := giveRestorer(build, ids); err != nil {
				return Result{}, &Error{Kind: ErrLifecycle, Msg: "preparing the restore phase failed", ExitCode: 0, Err: err}
			}
		}
		runErr := box.run(ctx, ph)
		stdout.Flush()
		stderr.Flush()
		if sink.werr != nil {
			log.Warn("writing build output", "err", sink.werr)
		}
		log.Debug("lifecycle phase finished", "phase", ph.name, "duration", time.Since(pt), "err", runErr)
		if runErr == nil && ph.name == "restorer" {
			if err := takeRestored(build); err != nil {
				log.Warn("restore phase tampered with analyzed.toml", "err", err)
				return Result{}, &Error{Kind: ErrBuild, Msg: "the build changed which images the export uses; a buildpack of this app tried to base it on another image, and kpush refused",
					Hint: "check the buildpacks this app runs (project.toml, --buildpack)", ExitCode: 0, Err: err}
			}
		}
		if runErr == nil && (ph.name == "analyzer" || ph.name == "restorer") {
			if err := publishAnalyzed(build); err != nil {
				return Result{}, &Error{Kind: ErrLifecycle, Msg: "the lifecycle's " + ph.name + " left no readable analyzed.toml", ExitCode: 0, Err: err}
			}
		}
		if runErr == nil {
			continue
		}
		if ctx.Err() != nil {
			return Result{}, fmt.Errorf("building %s: %w", req.App, ctx.Err())
		}
		code := -1
		var ee *exec.ExitError
		if errors.As(runErr, &ee) {
			code = ee.ExitCode()
		}
		e := lifecycleError(code, sink.lastError(), req.Image, runErr)
		log.Warn("build failed", "phase", ph.name, "exit_code", code, "kind", e.Kind, "detail", e.Detail, "duration", time.Since(t0))
		return Result{}, e
	}
	digest, err := readReportDigest(build)
	if err != nil {
		return Result{}, &Error{Kind: ErrLifecycle, Msg: "the build finished but reported no image digest", ExitCode: 0, Err: err}
	}
	res := Result{Image: repo.Digest(digest).String()}
	log.Info("build finished", "image", res.Image, "duration", time.Since(t0))
	return res, nil
}

// Buildpacks returns the buildpacks the builder holds, kpush's own then ExtraBuildpacks, each
// with its ID and version: the IDs a Request.Group may name. Error: an extra buildpack
// without a readable buildpack.toml.
func (l *Local) Buildpacks() ([]GroupEntry, error) {
	var out []GroupEntry
	for _, bp := range append(BuiltinBuildpacks(), l.ExtraBuildpacks...) {
		d, err := readDescriptor(bp)
		if err != nil {
			return nil, err
		}
		out = append(out, GroupEntry{ID: d.Buildpack.ID, Version: d.Buildpack.Version})
	}
	return out, nil
}

func validateRequest(req Request) error {
	if !names.IsApp(req.App) {
		return fmt.Errorf("app name %q is not a DNS-1035 label (lower-case letters, digits, '-')", req.App)
	}
	if fi, err := os.Stat(req.SourceDir); err != nil || !fi.IsDir() {
		return fmt.Errorf("source directory %q is not a directory", req.SourceDir)
	}
	for k := range req.Env {
		if !names.IsEnv(k) {
			return fmt.Errorf("build environment variable name %q is invalid (letters, digits, '_')", k)
		}
	}
	return nil
}

// newTag returns "<yyyymmdd-hhmmss UTC>-<6 hex>", unique per build.
func newTag(now time.Time) string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return now.UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b[:])
}

// goSettings resolves GoRoot and GoEnv once.
func (l *Local) goSettings(ctx context.Context) (string, map[string]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.goRoot != "" {
		return l.goRoot, l.goEnv, nil
	}
	root, env := l.GoRoot, l.GoEnv
	if root == "" || env == nil {
		goBin, err := exec.LookPath("go")
		if err != nil {
			return "", nil, errors.New("the Go toolchain is not installed: install Go (https://go.dev/dl) or set the builder's GOROOT")
		}
		keys := append([]string{"GOROOT"}, goEnvPassThrough...)
		outb, err := exec.CommandContext(ctx, goBin, append([]string{"env", "-json"}, keys...)...).Output()
		if err != nil {
			return "", nil, fmt.Errorf("running go env: %w", err)
		}
		var host map[string]string
		if err := json.Unmarshal(outb, &host); err != nil {
			return "", nil, fmt.Errorf("parsing go env: %w", err)
		}
		if root == "" {
			root = host["GOROOT"]
		}
		if env == nil {
			env = map[string]string{}
			for _, k := range goEnvPassThrough {
				if host[k] != "" {
					env[k] = host[k]
				}
			}
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "bin", "go")); err != nil || fi.IsDir() {
		return "", nil, fmt.Errorf("GOROOT %q has no bin/go: set the builder's GOROOT to a Go installation", root)
	}
	l.goRoot, l.goEnv = root, env
	return root, env, nil
}

// runImage returns l.RunImage, or ensures the default one for the image's registry.
func (l *Local) runImage(ctx context.Context, image string) (string, error) {
	if l.RunImage != "" {
		return l.RunImage, nil
	}
	repo, err := DefaultRunImageRepository(image)
	if err != nil {
		return "", err
	}
	l.mu.Lock()
	ref, ok := l.runImages[repo]
	l.mu.Unlock()
	if ok {
		return ref, nil
	}
	var opts []RunImageOption
	if l.RegistryUsername != "" {
		opts = append(opts, WithRemoteOptions(remote.WithAuth(&authn.Basic{Username: l.RegistryUsername, Password: l.RegistryPassword})))
	}
	ref, err = EnsureRunImage(ctx, repo, opts...)
	if err != nil {
		return "", &Error{Kind: ErrExport, Msg: fmt.Sprintf("publishing the run image to %s failed", repo),
			Hint: "check that the registry is running and reachable, and its credentials", ExitCode: -1, Err: err}
	}
	l.mu.Lock()
	if l.runImages == nil {
		l.runImages = map[string]string{}
	}
	l.runImages[repo] = ref
	l.mu.Unlock()
	return ref, nil
}

// ids returns the host id ranges of the data dir's build sandboxes.
func (l *Local) ids() *sandbox.Ranges {
	dir, err := filepath.Abs(l.DataDir)
	if err != nil {
		dir = l.DataDir // Get refuses a relative owner
	}
	return sandbox.NewRanges(dir)
}

// registryAuth returns CNB_REGISTRY_AUTH's JSON ({"host": "Basic <base64 user:pass>"}) for
// the registries of refs, or "" without a username.
func registryAuth(user, pass string, refs ...string) string {
	if user == "" {
		return ""
	}
	m := map[string]string{}
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	for _, r := range refs {
		if h := registryOf(r); h != "" {
			m[h] = basic
		}
	}
	b, _ := json.Marshal(m) // map[string]string always marshals; keys come out sorted
	return string(b)
}

// readReportDigest returns the image digest ("sha256:<hex>") from the report.toml the exporter
// wrote in the build's control directory (readControlFile: no symlink followed, bounded).
func readReportDigest(build string) (string, error) {
	b, err := readControlFile(build, "report.toml")
	if err != nil {
		return "", fmt.Errorf("reading report.toml: %w", err)
	}
	var report struct {
		Image struct {
			Tags   []string `toml:"tags"`
			Digest string   `toml:"digest"`
		} `toml:"image"`
	}
	if _, err := toml.Decode(string(b), &report); err != nil {
		return "", fmt.Errorf("reading report.toml: %w", err)
	}
	d := report.Image.Digest
	if !strings.HasPrefix(d, "sha256:") || len(d) != len("sha256:")+64 {
		return "", fmt.Errorf("report.toml: image digest %q is not a sha256 digest", d)
	}
	return d, nil
}
