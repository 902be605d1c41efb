// Package local is kpush dev's stand-in for Knative: it runs released OCI images as sandboxed
// processes on this machine, without a container engine, behind a Host-routing HTTP Router,
// and manages dev mode's persistent OCI registry (distribution's registry binary).
//
// An image is pulled by digest and its flattened filesystem extracted once into
// <data>/apps/<app>/images/<digest-hex>/rootfs. Each release runs under bubblewrap with that
// rootfs as "/", a fresh /proc, /dev and /tmp, its own PID namespace, the host's network, and
// PORT set to a free loopback port; it runs as the image's user (a user namespace mapping that
// uid to itself) when the rootfs is reachable by that user, otherwise as root in the sandbox.
package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/internal/atomicfile"
	"kpush.dev/kpush/internal/names"
	"kpush.dev/kpush/internal/sandbox"
)

// Defaults for Config's zero fields.
const (
	DefaultStartTimeout = 60 * time.Second
	DefaultStopGrace    = 10 * time.Second
)

// Config configures a Runtime.
type Config struct {
	// DataDir holds apps/<app>/{current.json,app.log,images/}. Required.
	DataDir string
	// RouterPort is the port the Router is served on; it only shapes the URLs returned
	// (URL). Required.
	RouterPort int
	// StartTimeout bounds how long a new process may take to accept TCP connections on
	// $PORT. Zero means DefaultStartTimeout.
	StartTimeout time.Duration
	// StopGrace is how long a stopped process gets between SIGTERM and SIGKILL. Zero means
	// DefaultStopGrace.
	StopGrace time.Duration
	// Keychain logs in to the registry images are pulled from, e.g. (*Registry).Keychain.
	// Nil: anonymous.
	Keychain authn.Keychain
	// Log receives internal detail (nil: discarded).
	Log *slog.Logger
}

// Runtime runs releases as sandboxed local processes. It implements deployer.Deployer.
// Make one with New; serve Router() on Config.RouterPort; call Restore at startup and Close at
// shutdown. Safe for concurrent use; deploys of one app are serialised.
type Runtime struct {
	cfg    Config
	ids    *sandbox.Ranges
	log    *slog.Logger
	router *Router

	mu     sync.Mutex
	apps   map[string]*appState
	closed bool
}

type appState struct {
	deployMu sync.Mutex // serialises Deploy/Restore of this app

	// guarded by Runtime.mu
	cur     *proc
	current *Current
	logf    *os.File
}

// Current is a deployed release as persisted in <data>/apps/<app>/current.json.
type Current struct {
	Image      string            `json:"image"` // "<repository>@sha256:<hex>"
	Env        map[string]string `json:"env,omitempty"`
	Commit     string            `json:"commit,omitempty"`
	Pusher     string            `json:"pusher,omitempty"`
	DeployedAt time.Time         `json:"deployed_at"`
}

// AppStatus describes one app for `kpush apps:info`.
type AppStatus struct {
	Name       string
	Image      string
	Commit     string
	Pusher     string
	DeployedAt time.Time
	URL        string
	Running    bool
	PID        int // bubblewrap's PID (the process group); 0 when not running
	Port       int // the app's $PORT, on 127.0.0.1 inside its sandbox; 0 when not running
	UID, GID   uint32
	LogFile    string
}

var _ deployer.Deployer = (*Runtime)(nil)

// ErrClosed is returned by Deploy and Restore after Close.
var ErrClosed = errors.New("local runtime is shut down")

// New checks cfg, finds bwrap (internal/tools) and returns a Runtime with no running apps.
func New(cfg Config) (*Runtime, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("local runtime: DataDir is empty")
	}
	if cfg.RouterPort <= 0 || cfg.RouterPort > 65535 {
		return nil, fmt.Errorf("local runtime: RouterPort %d out of range", cfg.RouterPort)
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = DefaultStopGrace
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	dd, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("resolving data dir: %w", err)
	}
	cfg.DataDir = dd
	if err := os.MkdirAll(filepath.Join(dd, "apps"), 0o755); err != nil {
		return nil, fmt.Errorf("creating apps directory: %w", err)
	}
	etc := filepath.Join(dd, "sandbox", "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return nil, fmt.Errorf("creating sandbox directory: %w", err)
	}
	for name, data := range map[string]string{
		"resolv.conf": "nameserver " + sandbox.SlirpDNS + "\n",
		"hosts":       "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
	} {
		if err := atomicfile.WriteFile(filepath.Join(etc, name), []byte(data), 0o644); err != nil {
			return nil, fmt.Errorf("writing the apps' %s: %w", name, err)
		}
	}
	return &Runtime{
		cfg: cfg, log: cfg.Log,
		ids:    sandbox.NewRanges(dd),
		router: NewRouter(cfg.Log),
		apps:   map[string]*appState{},
	}, nil
}

// Router returns the http.Handler that routes <app>.localhost to the apps' processes.
func (rt *Runtime) Router() *Router { return rt.router }

// URL returns the URL app is served at.
func (rt *Runtime) URL(app string) string { return URL(app, rt.cfg.RouterPort) }

func (rt *Runtime) appDir(app string) string { return filepath.Join(rt.cfg.DataDir, "apps", app) }

func (rt *Runtime) state(app string) (*appState, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		return nil, ErrClosed
	}
	st := rt.apps[app]
	if st == nil {
		st = &appState{}
		rt.apps[app] = st
	}
	return st, nil
}

// Deploy pulls r.Image, starts it sandboxed with PORT set, waits until it accepts TCP
// connections (Config.StartTimeout), switches the Router to it, stops the previous process
// (SIGTERM, SIGKILL after Config.StopGrace) and records the release in current.json. It
// returns URL(r.App). Progress lines for people go to out. On any error the previous release
// keeps serving; an error from the app itself contains the last lines of its output.
func (rt *Runtime) Deploy(ctx context.Context, r deployer.Release, out io.Writer) (string, error) {
	if out == nil {
		out = io.Discard
	}
	if !names.IsApp(r.App) {
		return "", fmt.Errorf("app name %q is not a DNS-1035 label (lower-case letters, digits, '-')", r.App)
	}
	st, err := rt.state(r.App)
	if err != nil {
		return "", err
	}
	st.deployMu.Lock()
	defer st.deployMu.Unlock()
	cur := &Current{Image: r.Image, Env: r.Env, Commit: r.Commit, Pusher: r.Pusher, DeployedAt: time.Now().UTC()}
	if err := rt.launch(ctx, r.App, st, cur, out); err != nil {
		return "", err
	}
	if err := rt.saveCurrent(r.App, cur); err != nil {
		// The new release serves already; only the restart record is missing.
		rt.log.Error("saving current release", "app", r.App, "err", err)
		return "", fmt.Errorf("app %s is running but saving %s failed (it would not come back after a restart): %w",
			r.App, filepath.Join(rt.appDir(r.App), "current.json"), err)
	}
	url := rt.URL(r.App)
	fmt.Fprintf(out, "-----> %s is live at %s\n", r.App, url)
	return url, nil
}

// launch starts cur for app and, when it answers, makes it the app's current process.
func (rt *Runtime) launch(ctx context.Context, app string, st *appState, cur *Current, out io.Writer) error {
	dir := rt.appDir(app)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating app directory: %w", err)
	}
	fmt.Fprintf(out, "-----> Pulling %s\n", cur.Image)
	ids, err := rt.ids.Get("app/" + app)
	if err != nil {
		return err
	}
	img, err := pull(ctx, cur.Image, dir, rt.cfg.Keychain, ids)
	if err != nil {
		return err
	}
	logf, err := rt.logFile(app, st)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "-----> Starting %s\n", app)
	p, err := startProc(context.WithoutCancel(ctx), spawnSpec{
		app: app, img: img, ids: ids, etcDir: filepath.Join(rt.cfg.DataDir, "sandbox", "etc"),
		env: cur.Env, logw: logf, log: rt.log,
	})
	if err != nil {
		return fmt.Errorf("starting app %s: %w", app, err)
	}
	if err := p.waitReady(ctx, rt.cfg.StartTimeout); err != nil {
		p.stop(rt.cfg.StopGrace)
		rt.mu.Lock()
		running := st.current
		rt.mu.Unlock()
		if running == nil || running.Image != cur.Image {
			rt.pruneImages(dir, runningHex(running)) // a failed release keeps no extraction
		}
		rt.log.Warn("new release failed to start", "app", app, "pid", p.pid, "image", cur.Image, "err", err)
		if ctx.Err() != nil { // stopped by the caller, not the app's fault
			return fmt.Errorf("starting app %s: stopped before it was ready: %w", app, context.Cause(ctx))
		}
		return fmt.Errorf("app %s failed to start: %w\nlast output:\n%s(full log: %s; fix the start command and push again)",
			app, err, p.tail.String(), filepath.Join(dir, "app.log"))
	}

	rt.mu.Lock()
	if rt.closed {
		rt.mu.Unlock()
		p.stop(rt.cfg.StopGrace)
		return ErrClosed
	}
	prev := st.cur
	st.cur = p
	st.current = cur
	rt.router.Set(app, p.addr(), p.dial)
	rt.mu.Unlock()
	go rt.watch(app, st, p)

	if prev != nil {
		fmt.Fprintf(out, "-----> Stopping the previous release (pid %d)\n", prev.pid)
		prev.stop(rt.cfg.StopGrace)
		rt.log.Info("previous release stopped", "app", app, "pid", prev.pid)
	}
	rt.pruneImages(dir, img.digest.Hex) // only the running release's extraction is kept
	return nil
}

// runningHex is the image digest hex of cur, or "" for none.
func runningHex(cur *Current) string {
	if cur == nil {
		return ""
	}
	if _, hex, ok := strings.Cut(cur.Image, "@sha256:"); ok {
		return hex
	}
	return ""
}

// prunedPrefix starts the name of an extraction pruneImages is removing.
const prunedPrefix = ".pruned-"

// pruneImages removes the app's extracted images (<appDir>/images/<hex>) but keep's: a
// rollback extracts its image again from the registry.
func (rt *Runtime) pruneImages(appDir, keep string) {
	ents, err := os.ReadDir(filepath.Join(appDir, "images"))
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.Name() == keep {
			continue
		}
		// Renamed out of the way first: pull takes an images/<hex> that has its config and
		// rootfs for a whole extraction, and a kpush killed half-way through RemoveAll would
		// leave one without its files. A name with the prefix is a removal a kill interrupted.
		dir := filepath.Join(appDir, "images", e.Name())
		if !strings.HasPrefix(e.Name(), prunedPrefix) {
			gone := filepath.Join(appDir, "images", prunedPrefix+e.Name())
			if err := os.Rename(dir, gone); err != nil {
				rt.log.Warn("removing an old image extraction", "dir", dir, "err", err)
				continue
			}
			dir = gone
		}
		if err := os.RemoveAll(dir); err != nil {
			rt.log.Warn("removing an old image extraction", "dir", dir, "err", err)
		}
	}
}

// watch marks the app down in the router when its current process exits on its own.
func (rt *Runtime) watch(app string, st *appState, p *proc) {
	<-p.done
	if p.stopRequested() {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if st.cur == p {
		rt.router.Down(app)
		rt.log.Error("app exited", "app", app, "pid", p.pid, "err", p.exitDesc(), "last_output", p.tail.String())
	}
}

func (rt *Runtime) logFile(app string, st *appState) (*os.File, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if st.logf != nil {
		return st.logf, nil
	}
	f, err := os.OpenFile(filepath.Join(rt.appDir(app), "app.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("opening app log: %w", err)
	}
	st.logf = f
	return f, nil
}

func (rt *Runtime) saveCurrent(app string, cur *Current) error {
	b, err := json.MarshalIndent(cur, "", "  ")
	if err != nil {
		return err
	}
	// 0600: Env may hold secrets.
	return atomicfile.WriteFile(filepath.Join(rt.appDir(app), "current.json"), append(b, '\n'), 0o600)
}

func (rt *Runtime) loadCurrent(app string) (*Current, error) {
	b, err := os.ReadFile(filepath.Join(rt.appDir(app), "current.json"))
	if err != nil {
		return nil, err
	}
	var c Current
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", filepath.Join(rt.appDir(app), "current.json"), err)
	}
	return &c, nil
}

// Restore starts the current release (current.json) of every app in the data dir, one after
// the other. An app that fails stays known to the Router (503) and its error is joined into
// the result; the others still start.
func (rt *Runtime) Restore(ctx context.Context) error {
	ents, err := os.ReadDir(filepath.Join(rt.cfg.DataDir, "apps"))
	if err != nil {
		return fmt.Errorf("listing apps: %w", err)
	}
	var errs []error
	for _, e := range ents {
		app := e.Name()
		if !e.IsDir() || !names.IsApp(app) {
			continue
		}
		cur, err := rt.loadCurrent(app)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		st, err := rt.state(app)
		if err != nil {
			return err
		}
		st.deployMu.Lock()
		rt.mu.Lock()
		running := st.cur != nil && st.cur.running()
		if !running {
			st.current = cur
			rt.router.Down(app) // known; 503 until it answers
		}
		rt.mu.Unlock()
		if !running {
			err = rt.launch(ctx, app, st, cur, io.Discard)
		}
		st.deployMu.Unlock()
		if err != nil {
			rt.log.Error("restoring app", "app", app, "image", cur.Image, "err", err)
			errs = append(errs, fmt.Errorf("restoring app %s: %w", app, err))
			continue
		}
		rt.log.Info("app restored", "app", app, "image", cur.Image)
	}
	return errors.Join(errs...)
}

// Apps lists every app the Runtime knows (running, or with a current.json), sorted by name.
func (rt *Runtime) Apps() []AppStatus {
	known := map[string]bool{}
	if ents, err := os.ReadDir(filepath.Join(rt.cfg.DataDir, "apps")); err == nil {
		for _, e := range ents {
			if e.IsDir() && names.IsApp(e.Name()) {
				if _, err := os.Stat(filepath.Join(rt.appDir(e.Name()), "current.json")); err == nil {
					known[e.Name()] = true
				}
			}
		}
	}
	rt.mu.Lock()
	for n := range rt.apps {
		known[n] = true
	}
	rt.mu.Unlock()

	var out []AppStatus
	for n := range known {
		s := AppStatus{Name: n, URL: rt.URL(n), LogFile: filepath.Join(rt.appDir(n), "app.log")}
		rt.mu.Lock()
		st := rt.apps[n]
		var cur *Current
		if st != nil {
			cur = st.current
			if p := st.cur; p != nil && p.running() {
				s.Running, s.PID, s.Port, s.UID, s.GID = true, p.pid, p.port, p.id.uid, p.id.gid
			}
		}
		rt.mu.Unlock()
		if cur == nil {
			cur, _ = rt.loadCurrent(n)
		}
		if cur == nil && !s.Running {
			continue
		}
		if cur != nil {
			s.Image, s.Commit, s.Pusher, s.DeployedAt = cur.Image, cur.Commit, cur.Pusher, cur.DeployedAt
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Close stops every app process (SIGTERM, SIGKILL after Config.StopGrace) and waits for them.
// Later Deploy and Restore calls fail with ErrClosed. current.json files stay for Restore.
func (rt *Runtime) Close() error {
	rt.mu.Lock()
	rt.closed = true
	var procs []*proc
	var files []*os.File
	for app, st := range rt.apps {
		if st.cur != nil {
			procs = append(procs, st.cur)
			rt.router.Down(app)
		}
		if st.logf != nil {
			files = append(files, st.logf)
		}
	}
	rt.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() { p.stop(rt.cfg.StopGrace) })
	}
	wg.Wait()
	for _, f := range files {
		f.Close()
	}
	rt.log.Info("local runtime closed", "stopped", strconv.Itoa(len(procs)))
	return nil
}

var _ deployer.Destroyer = (*Runtime)(nil)

// Destroy takes app out of service for good: its process is stopped (SIGTERM, SIGKILL after
// Config.StopGrace), the Router forgets it (404), and <data>/apps/<app> (current.json, the
// app log, the extracted images) is removed, so Restore will not start it again. Destroying
// an unknown app is not an error.
func (rt *Runtime) Destroy(ctx context.Context, app string) error {
	if !names.IsApp(app) {
		return fmt.Errorf("app name %q is not a DNS-1035 label (lower-case letters, digits, '-')", app)
	}
	st, err := rt.state(app)
	if err != nil {
		return err
	}
	st.deployMu.Lock()
	defer st.deployMu.Unlock()
	rt.mu.Lock()
	p, logf := st.cur, st.logf
	st.cur, st.current, st.logf = nil, nil, nil
	rt.router.Remove(app)
	delete(rt.apps, app)
	rt.mu.Unlock()
	if p != nil {
		p.stop(rt.cfg.StopGrace)
	}
	if logf != nil {
		logf.Close()
	}
	if err := os.RemoveAll(rt.appDir(app)); err != nil {
		return fmt.Errorf("removing %s: %w", rt.appDir(app), err)
	}
	if err := rt.ids.Release("app/" + app); err != nil {
		return err
	}
	rt.log.Info("app destroyed", "app", app)
	return nil
}
