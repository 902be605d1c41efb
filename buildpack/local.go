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
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"kpush.dev/kpush/internal/sandbox"
	"kpush.dev/kpush/internal/tools"
)

// PlatformAPI is the CNB Platform API version Local speaks to the lifecycle.
const PlatformAPI = "0.14"

// lifecyclePhases are the names the lifecycle binary answers to (it dispatches on argv[0]).
var lifecyclePhases = []string{"creator", "detector", "analyzer", "restorer", "builder", "exporter", "rebaser", "extender"}

// goEnvPassThrough are the host's `go env` settings handed to buildpacks (as platform env
// files) when Local.GoEnv is nil, so module downloads use the same proxy as the host.
var goEnvPassThrough = []string{"GOPROXY", "GONOPROXY", "GOPRIVATE", "GOSUMDB", "GONOSUMDB", "GOINSECURE"}

// appName is a DNS-1035 label: what Request.App must be (it names a cache directory).
var appName = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

// envName is what a build-time environment variable may be called.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

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
		runErr := box.run(ctx, ph)
		stdout.Flush()
		stderr.Flush()
		if sink.werr != nil {
			log.Warn("writing build output", "err", sink.werr)
		}
		log.Debug("lifecycle phase finished", "phase", ph.name, "duration", time.Since(pt), "err", runErr)
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
	digest, err := readReportDigest(filepath.Join(build, "layers", "report.toml"))
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
	if !appName.MatchString(req.App) {
		return fmt.Errorf("app name %q is not a DNS-1035 label (lower-case letters, digits, '-')", req.App)
	}
	if fi, err := os.Stat(req.SourceDir); err != nil || !fi.IsDir() {
		return fmt.Errorf("source directory %q is not a directory", req.SourceDir)
	}
	for k := range req.Env {
		if !envName.MatchString(k) {
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

// lockApp serialises builds of one app: in this process with a channel (so ctx can cancel
// the wait), across processes with flock on <DataDir>/cache/<app>.lock.
func (l *Local) lockApp(ctx context.Context, app string, out io.Writer) (func(), error) {
	l.mu.Lock()
	if l.appLocks == nil {
		l.appLocks = map[string]chan struct{}{}
	}
	ch, ok := l.appLocks[app]
	if !ok {
		ch = make(chan struct{}, 1)
		l.appLocks[app] = ch
	}
	l.mu.Unlock()
	told := false
	tell := func() {
		if !told {
			fmt.Fprintf(out, "-----> Waiting for another build of %s to finish\n", app)
			told = true
		}
	}
	select {
	case ch <- struct{}{}:
	default:
		tell()
		select {
		case ch <- struct{}{}:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for another build of %s: %w", app, ctx.Err())
		}
	}
	release := func() { <-ch }
	dir := filepath.Join(l.DataDir, "cache")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		release()
		return nil, fmt.Errorf("creating cache directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, app+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		release()
		return nil, fmt.Errorf("opening build lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			release()
			return nil, fmt.Errorf("locking build cache: %w", err)
		}
		tell()
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			f.Close()
			release()
			return nil, fmt.Errorf("waiting for another build of %s: %w", app, ctx.Err())
		}
	}
	return func() { f.Close(); release() }, nil
}

// tryLockApp takes app's build lock (lockApp) if nobody holds it, in this process or another.
func (l *Local) tryLockApp(app string) (unlock func(), ok bool) {
	l.mu.Lock()
	if l.appLocks == nil {
		l.appLocks = map[string]chan struct{}{}
	}
	ch, found := l.appLocks[app]
	if !found {
		ch = make(chan struct{}, 1)
		l.appLocks[app] = ch
	}
	l.mu.Unlock()
	select {
	case ch <- struct{}{}:
	default:
		return nil, false
	}
	f, err := os.OpenFile(filepath.Join(l.DataDir, "cache", app+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		<-ch
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		<-ch
		return nil, false
	}
	return func() { f.Close(); <-ch }, true
}

// buildDirName is a per-build directory's name: "<app>-<tag>" (newTag).
var buildDirName = regexp.MustCompile(`^(.+)-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$`)

// buildDirApp returns the app of a per-build directory name.
func buildDirApp(name string) (string, bool) {
	m := buildDirName.FindStringSubmatch(name)
	if m == nil || !appName.MatchString(m[1]) {
		return "", false
	}
	return m[1], true
}

// ForgetApp removes what Local keeps of app: its build cache (<DataDir>/cache/<app>) and any
// per-build directory a crashed build left. It waits (up to a minute) for a running build of
// app. It implements receiver.AppForgetter, for apps:destroy.
func (l *Local) ForgetApp(app string) error {
	if !appName.MatchString(app) {
		return fmt.Errorf("app name %q is not a DNS-1035 label", app)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	unlock, err := l.lockApp(ctx, app, io.Discard)
	if err != nil {
		return err
	}
	defer unlock() // the lock file stays: another process may be waiting on it
	if err := os.RemoveAll(filepath.Join(l.DataDir, "cache", app)); err != nil {
		return fmt.Errorf("removing the build cache of %s: %w", app, err)
	}
	ents, _ := os.ReadDir(filepath.Join(l.DataDir, "builds"))
	for _, e := range ents {
		if a, ok := buildDirApp(e.Name()); ok && a == app {
			if err := os.RemoveAll(filepath.Join(l.DataDir, "builds", e.Name())); err != nil {
				return fmt.Errorf("removing a build directory of %s: %w", app, err)
			}
		}
	}
	return nil
}

// RemoveLeftovers removes per-build directories (<DataDir>/builds/<app>-<tag>) that a killed
// process left behind: those last modified before before (the process start) whose app no
// build holds the build lock of, here or in another process sharing DataDir (a running build
// holds it for as long as its directory exists). It returns the paths removed.
func (l *Local) RemoveLeftovers(before time.Time) ([]string, error) {
	dir := filepath.Join(l.DataDir, "builds")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing build directories: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(l.DataDir, "cache"), 0o755); err != nil {
		return nil, fmt.Errorf("creating cache directory: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		app, ok := buildDirApp(e.Name())
		if !ok {
			continue
		}
		info, err := e.Info()
		if err != nil || !info.ModTime().Before(before) {
			continue
		}
		unlock, ok := l.tryLockApp(app)
		if !ok {
			continue // a build of app is running
		}
		p := filepath.Join(dir, e.Name())
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", p, err))
		} else {
			removed = append(removed, p)
		}
		unlock()
	}
	return removed, errors.Join(errs...)
}

// prepare creates the per-build directory tree (see Local) with order as the builder's
// order.toml, and the app's cache directory, and chowns the source to the CNB user.
func (l *Local) prepare(build, cacheDir, source, runImage string, order []Group, env map[string]string, ids sandbox.IDRange) error {
	for _, d := range []string{"cnb/lifecycle", "layers", "platform/env", "home", cacheDir} {
		p := d
		if !filepath.IsAbs(p) {
			p = filepath.Join(build, d)
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	cnb := filepath.Join(build, "cnb")
	// Mount points for the lifecycle and launcher binaries (bound read-only by bwrap).
	for _, f := range []string{"lifecycle", "launcher"} {
		if err := os.WriteFile(filepath.Join(cnb, "lifecycle", f), nil, 0o755); err != nil {
			return err
		}
	}
	for _, p := range lifecyclePhases {
		if err := os.Symlink("lifecycle", filepath.Join(cnb, "lifecycle", p)); err != nil {
			return err
		}
	}
	bps := append(BuiltinBuildpacks(), l.ExtraBuildpacks...)
	if err := writeBuilder(cnb, bps, order, runImage); err != nil {
		return err
	}
	for k, v := range env {
		if err := os.WriteFile(filepath.Join(build, "platform", "env", k), []byte(v), 0o644); err != nil {
			return err
		}
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\n%s:x:%d:%d:CNB user:/home/%s:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		CNBUser, CNBUserID, CNBGroupID, CNBUser)
	group := fmt.Sprintf("root:x:0:\n%s:x:%d:\nnogroup:x:65534:\n", CNBUser, CNBGroupID)
	if err := os.WriteFile(filepath.Join(build, "passwd"), []byte(passwd), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(build, "group"), []byte(group), 0o644); err != nil {
		return err
	}
	if err := writeEtc(build); err != nil {
		return err
	}
	uid, gid := int(ids.Host(CNBUserID)), int(ids.Host(CNBGroupID))
	for _, d := range []string{"home", "layers"} {
		if err := os.Lchown(filepath.Join(build, d), uid, gid); err != nil {
			return err
		}
	}
	// The cache keeps its owner between builds; a cache from before the app had its own
	// host ids (or restored from elsewhere) is handed over once.
	if fi, err := os.Stat(cacheDir); err != nil {
		return err
	} else if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != uid || int(st.Gid) != gid {
		if err := chownTree(cacheDir, uid, gid); err != nil {
			return err
		}
	}
	return chownTree(source, uid, gid)
}

// chownTree gives every file under dir (dir included, symlinks themselves) to uid:gid.
func chownTree(dir string, uid, gid int) error {
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// writeEtc writes the build sandbox's /etc files into the build directory: hosts, and
// resolv.conf twice: resolv.conf.outbound (slirp4netns's resolver, for the phases that run
// buildpacks) and resolv.conf.host (the host's resolvers, for the lifecycle's registry
// phases on the host's network). The host's own /etc stays out of every phase.
func writeEtc(build string) error {
	hostResolv, err := os.ReadFile("/etc/resolv.conf")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for name, data := range map[string]string{
		"hosts":                "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
		"resolv.conf.outbound": "nameserver " + sandbox.SlirpDNS + "\n",
		"resolv.conf.host":     string(hostResolv),
	} {
		if err := os.WriteFile(filepath.Join(build, name), []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// buildSandbox is what every lifecycle phase of one build mounts and runs as.
type buildSandbox struct {
	build     string // per-build directory (cnb/, layers/, platform/, home/, passwd, group, hosts, resolv.conf.*)
	source    string // → /workspace
	cache     string // → /cache
	goRoot    string // → GoRootPath
	lifecycle string // → /cnb/lifecycle/lifecycle
	launcher  string // → /cnb/lifecycle/launcher
	ids       sandbox.IDRange
	auth      string // CNB_REGISTRY_AUTH, for the phases that talk to the registry; "" = none
	stdout    io.Writer
	stderr    io.Writer
}

// phase is one lifecycle phase run in a sandbox of its own.
type phase struct {
	name   string   // the lifecycle binary (/cnb/lifecycle/<name>)
	header string   // the line the creator prints before it, e.g. "===> DETECTING"
	args   []string // its flags and arguments
	// registry: the phase talks to the registry (analyze, restore, export). It alone gets the
	// credentials and the host's network, and never runs buildpack code.
	registry bool
	// buildpacks: the phase runs buildpack code (detect, build): no credentials, its own
	// network (build: outbound only, no host loopback; detect: none), the CNB user's $HOME.
	network   sandbox.Network
	workspace bool // /workspace writable (build)
	platform  bool // /platform mounted (detect, build)
	home      bool // /home/cnb mounted (detect, build)
	cache     bool // /cache mounted (restore, export)
	cacheRW   bool // read-write
	goRoot    bool // the Go toolchain at GoRootPath (detect, build)
}

// phases are the lifecycle's five phases as kpack runs them (Platform API 0.14): analyze,
// detect, restore, build, export, each in its own sandbox, so that the registry credentials
// reach only analyze, restore and export, which run no buildpack code. previous (if not "")
// is -previous-image, the image whose layers the export may reuse.
func phases(image, previous string, insecure []string) []phase {
	const (
		analyzed = "-analyzed=/layers/analyzed.toml"
		group    = "-group=/layers/group.toml"
		plan     = "-plan=/layers/plan.toml"
	)
	reg := func(a []string) []string {
		for _, r := range insecure {
			a = append(a, "-insecure-registry="+r)
		}
		return a
	}
	analyze := []string{"-layers=/layers", analyzed, "-run=/cnb/run.toml"}
	if previous != "" {
		analyze = append(analyze, "-previous-image="+previous)
	}
	return []phase{
		{name: "analyzer", header: "===> ANALYZING", registry: true, network: sandbox.NetHost,
			args: append(reg(analyze), image)},
		{name: "detector", header: "===> DETECTING", network: sandbox.NetNone, platform: true, home: true, goRoot: true,
			args: []string{"-app=/workspace", "-layers=/layers", "-platform=/platform",
				"-buildpacks=/cnb/buildpacks", "-order=/cnb/order.toml", analyzed, group, plan}},
		{name: "restorer", header: "===> RESTORING", registry: true, network: sandbox.NetHost, cache: true, cacheRW: true, // it stages in the cache
			args: reg([]string{"-layers=/layers", "-cache-dir=/cache", analyzed, group})},
		{name: "builder", header: "===> BUILDING", network: sandbox.NetOutbound, workspace: true, platform: true, home: true, goRoot: true,
			args: []string{"-app=/workspace", "-layers=/layers", "-platform=/platform",
				"-buildpacks=/cnb/buildpacks", analyzed, group, plan}},
		{name: "exporter", header: "===> EXPORTING", registry: true, network: sandbox.NetHost, cache: true, cacheRW: true,
			args: append(reg([]string{"-app=/workspace", "-layers=/layers", "-cache-dir=/cache",
				"-launcher=/cnb/lifecycle/launcher", "-report=/layers/report.toml", "-run=/cnb/run.toml",
				analyzed, group, "-parallel"}), image)},
	}
}

// spec is ph's sandbox: the host's /usr (programs and libraries) and a generated /etc,
// read-only; the builder at /cnb; /layers; and only the rest ph needs (see phase).
func (b *buildSandbox) spec(ph phase) sandbox.Spec {
	m := sandbox.HostSystemMounts()
	resolv := "resolv.conf.outbound"
	if ph.network == sandbox.NetHost {
		resolv = "resolv.conf.host"
	}
	m = append(m,
		sandbox.Mount{Source: filepath.Join(b.build, "passwd"), Dest: "/etc/passwd"},
		sandbox.Mount{Source: filepath.Join(b.build, "group"), Dest: "/etc/group"},
		sandbox.Mount{Source: filepath.Join(b.build, "hosts"), Dest: "/etc/hosts"},
		sandbox.Mount{Source: filepath.Join(b.build, resolv), Dest: "/etc/resolv.conf"},
	)
	if _, err := os.Stat(hostCABundle); err == nil {
		m = append(m, sandbox.Mount{Source: hostCABundle, Dest: hostCABundle})
	}
	m = append(m,
		sandbox.Mount{Dest: "/tmp", Size: 1 << 30}, // compilers' scratch space
		sandbox.Mount{Source: filepath.Join(b.build, "cnb"), Dest: "/cnb"},
		sandbox.Mount{Source: b.lifecycle, Dest: "/cnb/lifecycle/lifecycle"},
		sandbox.Mount{Source: b.launcher, Dest: "/cnb/lifecycle/launcher"},
		sandbox.Mount{Source: filepath.Join(b.build, "layers"), Dest: "/layers", Writable: true},
	)
	if ph.name != "analyzer" && ph.name != "restorer" {
		m = append(m, sandbox.Mount{Source: b.source, Dest: "/workspace", Writable: ph.workspace})
	}
	if ph.platform {
		m = append(m, sandbox.Mount{Source: filepath.Join(b.build, "platform"), Dest: "/platform"})
	}
	if ph.home {
		m = append(m, sandbox.Mount{Source: filepath.Join(b.build, "home"), Dest: "/home/" + CNBUser, Writable: true})
	}
	if ph.cache {
		m = append(m, sandbox.Mount{Source: b.cache, Dest: "/cache", Writable: ph.cacheRW})
	}
	if ph.goRoot {
		m = append(m, sandbox.Mount{Source: b.goRoot, Dest: GoRootPath})
	}
	env := []string{
		"PATH=" + GoRootPath + "/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/home/" + CNBUser,
		"CNB_PLATFORM_API=" + PlatformAPI,
		"CNB_USER_ID=" + strconv.Itoa(CNBUserID),
		"CNB_GROUP_ID=" + strconv.Itoa(CNBGroupID),
		"CNB_NO_COLOR=true",
		"TERM=dumb",
		"LANG=C.UTF-8",
	}
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	if ph.registry && b.auth != "" {
		env = append(env, "CNB_REGISTRY_AUTH="+b.auth)
	}
	dir := "/workspace"
	if ph.name == "analyzer" || ph.name == "restorer" {
		dir = "/layers"
	}
	return sandbox.Spec{
		Argv:     append([]string{"/cnb/lifecycle/" + ph.name, "-log-level=info", "-no-color"}, ph.args...),
		Env:      env,
		Dir:      dir,
		Hostname: "kpush-build",
		Mounts:   m,
		HostIDs:  b.ids, UID: CNBUserID, GID: CNBGroupID,
		Network:    ph.network,
		NewSession: true,
		// The registry phases read files buildpack code wrote (/layers): with no /proc, no
		// symlink there can lead them to their own environment and its credentials.
		NoProc: ph.registry,
		Stdout: b.stdout, Stderr: b.stderr,
	}
}

// hostCABundle is the host's CA bundle (Debian's path, which Go and OpenSSL read), given to
// build sandboxes so buildpacks can verify the package registries they download from.
const hostCABundle = "/etc/ssl/certs/ca-certificates.crt"

func (b *buildSandbox) run(ctx context.Context, ph phase) error {
	return sandbox.Run(ctx, b.spec(ph))
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

// readReportDigest returns the image digest ("sha256:<hex>") from the lifecycle's report.toml.
func readReportDigest(path string) (string, error) {
	var report struct {
		Image struct {
			Tags   []string `toml:"tags"`
			Digest string   `toml:"digest"`
		} `toml:"image"`
	}
	if _, err := toml.DecodeFile(path, &report); err != nil {
		return "", fmt.Errorf("reading report.toml: %w", err)
	}
	d := report.Image.Digest
	if !strings.HasPrefix(d, "sha256:") || len(d) != len("sha256:")+64 {
		return "", fmt.Errorf("report.toml: image digest %q is not a sha256 digest", d)
	}
	return d, nil
}
