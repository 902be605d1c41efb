package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gofrs/flock"
	"github.com/google/go-containerregistry/pkg/authn"
	"golang.org/x/crypto/bcrypt"

	"kpush.dev/kpush/internal/atomicfile"
	"kpush.dev/kpush/internal/tools"
)

// RegistryConfig configures StartRegistry.
type RegistryConfig struct {
	// DataDir is kpush's data dir; the registry keeps everything in <DataDir>/registry:
	// config.yml, data/ (filesystem storage), registry.log, port, lock, credentials.json
	// (kpush's login, mode 0600) and htpasswd. Required.
	DataDir string
	// Port to listen on at 127.0.0.1. Zero: the port persisted in <DataDir>/registry/port,
	// or a free one picked now and persisted, so image references stay valid across restarts.
	Port int
	// StartTimeout bounds the wait for GET /v2/ to answer. Zero means 30 s.
	StartTimeout time.Duration
	// StopGrace is the time between SIGTERM and SIGKILL in Close. Zero means 10 s.
	StopGrace time.Duration
	// Log receives internal detail (nil: discarded).
	Log *slog.Logger
}

// Registry is a running distribution (v3) registry process: dev mode's persistent OCI
// registry, serving the OCI distribution API over plain HTTP on 127.0.0.1 with filesystem
// storage and deletes enabled. Every request must authenticate (HTTP basic, distribution's
// htpasswd) with the one login kpush generated for it, which Credentials and Keychain return.
// Start it with StartRegistry; stop it with Close.
type Registry struct {
	cfg        RegistryConfig
	addr       string
	user, pass string
	bin        string // the registry binary
	dir        string // <DataDir>/registry
	confPath   string
	logPath    string
	lock       *flock.Flock
	log        *slog.Logger

	mu   sync.Mutex
	proc *registryProc // the running process; a garbage collection replaces it (gc.go)

	done     chan struct{} // closed when the registry stopped for good: Close, or a process that died
	exitErr  error         // read after done
	doneOnce sync.Once
	closing  chan struct{}
	once     sync.Once

	gate gcGate // builds and deploys against garbage collection (gc.go)
}

// registryProc is one run of `registry serve`.
type registryProc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process exited
	err    error         // read after exited
	paused bool          // stopped for a garbage collection, under Registry.mu: its exit is expected
}

// StartRegistry writes the registry's config and htpasswd, starts `registry serve`
// (tools.Path("registry")) and waits until GET http://<addr>/v2/ answers 200 to kpush's
// login. The login is made once, at random, and kept in <DataDir>/registry/credentials.json
// (0600) across restarts. It fails when another kpush holds the same
// data dir (flock on <DataDir>/registry/lock), when the port is taken, or when the process
// exits before answering; the error then quotes its last log lines.
func StartRegistry(ctx context.Context, cfg RegistryConfig) (*Registry, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("registry: DataDir is empty")
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	bin, err := tools.Path("registry")
	if err != nil {
		return nil, fmt.Errorf("finding the registry binary: %w", err)
	}
	dir, err := filepath.Abs(filepath.Join(cfg.DataDir, "registry"))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, fmt.Errorf("creating registry directory: %w", err)
	}

	lock := flock.New(filepath.Join(dir, "lock"), flock.SetPermissions(0o644))
	if locked, err := lock.TryLock(); err != nil {
		return nil, fmt.Errorf("locking registry data dir %s: %w", dir, err)
	} else if !locked {
		return nil, fmt.Errorf("registry data dir %s is in use by another kpush (stop it first)", dir)
	}
	ok := false
	defer func() {
		if !ok {
			lock.Unlock()
		}
	}()

	port, err := registryPort(dir, cfg.Port)
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	user, pass, err := registryLogin(dir, cfg.Log)
	if err != nil {
		return nil, err
	}
	htpasswd := filepath.Join(dir, "htpasswd")
	if err := writeHtpasswd(htpasswd, user, pass); err != nil {
		return nil, err
	}
	conf := registryConfigYAML(filepath.Join(dir, "data"), addr, randomHex(16), htpasswd)
	confPath := filepath.Join(dir, "config.yml")
	if err := atomicfile.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return nil, fmt.Errorf("writing registry config: %w", err)
	}
	r := &Registry{
		cfg: cfg, addr: addr, user: user, pass: pass, bin: bin, dir: dir, confPath: confPath,
		logPath: filepath.Join(dir, "registry.log"), lock: lock, log: cfg.Log,
		done: make(chan struct{}), closing: make(chan struct{}),
	}
	r.gate.changed = make(chan struct{})
	// Nothing else writes to the storage now (kpush holds the lock and the registry is not
	// running yet): the moment to free what apps:destroy left while kpush last ran, or what
	// a build killed with kpush uploaded.
	if _, err := r.garbageCollect(ctx); err != nil {
		cfg.Log.Warn("registry garbage collection failed; the registry starts anyway", "err", err, "log", r.logPath)
	}
	logStart, err := r.startProcess()
	if err != nil {
		return nil, err
	}
	if err := r.waitReady(ctx); err != nil {
		r.Close()
		return nil, fmt.Errorf("starting registry on %s: %w\nlast log lines:\n%s(full log: %s)",
			addr, err, lastLines(r.logPath, logStart, 15), r.logPath)
	}
	ok = true
	return r, nil
}

// startProcess starts `registry serve` as r.proc, its output appended to r.logPath, and
// returns the log's size before it started. A process that exits without being paused or
// closed ends the registry (Done, Err).
func (r *Registry) startProcess() (logStart int64, err error) {
	// 0600: it lists every app's image digests, which pull those images.
	logf, err := os.OpenFile(r.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("opening registry log: %w", err)
	}
	defer logf.Close() // the child has its own copy
	// One made before may be wider.
	if err := logf.Chmod(0o600); err != nil {
		return 0, fmt.Errorf("opening registry log: %w", err)
	}
	logStart, _ = logf.Seek(0, 2)

	cmd := exec.Command(r.bin, "serve", r.confPath)
	cmd.Dir = r.dir
	cmd.Env = registryEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting registry: %w", err)
	}
	p := &registryProc{cmd: cmd, exited: make(chan struct{})}
	r.mu.Lock()
	r.proc = p
	r.mu.Unlock()
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
		r.mu.Lock()
		paused := p.paused
		r.mu.Unlock()
		if paused {
			return
		}
		r.stopped(p.err)
		select {
		case <-r.closing:
		default:
			r.log.Error("registry process exited unexpectedly", "pid", cmd.Process.Pid, "err", p.err,
				"log", r.logPath)
		}
	}()
	r.log.Info("registry started", "pid", cmd.Process.Pid, "addr", r.addr, "dir", r.dir, "user", r.user)
	return logStart, nil
}

// stopped ends the registry for good with err (Done, Err).
func (r *Registry) stopped(err error) {
	r.doneOnce.Do(func() {
		r.exitErr = err
		close(r.done)
	})
}

// registryEnv is the environment of every registry command.
func registryEnv() []string {
	return []string{
		"PATH=" + defaultPath,
		"OTEL_TRACES_EXPORTER=none", // distribution v3 would otherwise export traces via OTLP
		"OTEL_SDK_DISABLED=true",
	}
}

// registryPort returns want if set, else the port persisted in dir/port, else a free port,
// which it persists.
func registryPort(dir string, want int) (int, error) {
	pf := filepath.Join(dir, "port")
	if want > 0 {
		if want > 65535 {
			return 0, fmt.Errorf("registry port %d out of range", want)
		}
		return want, atomicfile.WriteFile(pf, []byte(strconv.Itoa(want)+"\n"), 0o644)
	}
	if b, err := os.ReadFile(pf); err == nil {
		p, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || p <= 0 || p > 65535 {
			return 0, fmt.Errorf("registry port file %s is corrupt (%q): delete it to pick a new port", pf, b)
		}
		return p, nil
	}
	p, err := freePort()
	if err != nil {
		return 0, fmt.Errorf("finding a free port for the registry: %w", err)
	}
	if err := atomicfile.WriteFile(pf, []byte(strconv.Itoa(p)+"\n"), 0o644); err != nil {
		return 0, fmt.Errorf("saving registry port: %w", err)
	}
	return p, nil
}

// registryLoginFile holds kpush's login to its registry, in <DataDir>/registry.
const registryLoginFile = "credentials.json"

type registryLoginJSON struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// registryLogin returns the login kept in dir/credentials.json, or makes a random one and
// keeps it there (mode 0600). A corrupt file is replaced: only this process (it holds the
// lock) hands the login out, so nothing else can hold an older one.
func registryLogin(dir string, log *slog.Logger) (user, pass string, err error) {
	p := filepath.Join(dir, registryLoginFile)
	b, err := os.ReadFile(p)
	switch {
	case err == nil:
		var l registryLoginJSON
		if json.Unmarshal(b, &l) == nil && validLogin(l.Username, l.Password) {
			if fi, err := os.Stat(p); err == nil && fi.Mode().Perm() != 0o600 {
				if err := os.Chmod(p, 0o600); err != nil {
					return "", "", fmt.Errorf("restricting registry credentials %s to mode 0600: %w", p, err)
				}
			}
			return l.Username, l.Password, nil
		}
		log.Warn("registry credentials file is corrupt; making a new login", "file", p)
	case !errors.Is(err, os.ErrNotExist):
		return "", "", fmt.Errorf("reading registry credentials: %w", err)
	}
	l := registryLoginJSON{Username: "kpush-" + randomHex(4), Password: randomHex(32)}
	b, _ = json.Marshal(l) // two strings always marshal
	if err := atomicfile.WriteFile(p, append(b, '\n'), 0o600); err != nil {
		return "", "", fmt.Errorf("saving registry credentials: %w", err)
	}
	return l.Username, l.Password, nil
}

// validLogin reports whether user and pass can be an htpasswd line and a basic-auth header:
// a non-empty user without ':' or line breaks, and a password bcrypt accepts (≤ 72 bytes).
func validLogin(user, pass string) bool {
	return user != "" && !strings.ContainsAny(user, ":\r\n") && pass != "" && len(pass) <= 72
}

// writeHtpasswd writes distribution's htpasswd file (mode 0600) with the one login user:pass.
// The registry checks the bcrypt hash on every request, so the hash uses bcrypt's minimum cost:
// the password is 256 random bits, which no cost factor would make easier to guess.
func writeHtpasswd(p, user, pass string) error {
	h, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
	if err != nil {
		return fmt.Errorf("hashing the registry password: %w", err)
	}
	if err := atomicfile.WriteFile(p, []byte(user+":"+string(h)+"\n"), 0o600); err != nil {
		return fmt.Errorf("writing registry htpasswd: %w", err)
	}
	return nil
}

// registryConfigYAML renders distribution's configuration
// (https://distribution.github.io/distribution/about/configuration/).
func registryConfigYAML(dataDir, addr, secret, htpasswd string) string {
	q := strconv.Quote
	return "version: 0.1\n" +
		"log:\n  level: info\n  formatter: text\n  fields:\n    service: registry\n" +
		"storage:\n  filesystem:\n    rootdirectory: " + q(dataDir) + "\n" +
		"  delete:\n    enabled: true\n" +
		"  cache:\n    blobdescriptor: inmemory\n" +
		"auth:\n  htpasswd:\n    realm: \"kpush dev registry\"\n    path: " + q(htpasswd) + "\n" +
		"http:\n  addr: " + q(addr) + "\n  secret: " + q(secret) + "\n" +
		"  headers:\n    X-Content-Type-Options: [nosniff]\n"
}

// waitReady waits until the running process answers GET /v2/ with 200 to kpush's login.
func (r *Registry) waitReady(ctx context.Context) error {
	r.mu.Lock()
	p := r.proc
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.StartTimeout)
	defer cancel()
	c := &http.Client{Timeout: 2 * time.Second}
	last := "no answer"
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.addr+"/v2/", nil)
		req.SetBasicAuth(r.user, r.pass)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			last = resp.Status
			if resp.StatusCode == http.StatusOK {
				// Make sure it is our process answering, not another on the same port.
				select {
				case <-p.exited:
				default:
					return nil
				}
			}
		}
		select {
		case <-p.exited:
			return fmt.Errorf("the registry process exited: %v", p.err)
		case <-ctx.Done():
			return fmt.Errorf("GET /v2/ with kpush's login did not answer 200 within %s (last: %s)", r.cfg.StartTimeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Credentials returns kpush's login to the registry (HTTP basic auth). Hand it only to what
// must read or write images: never log it, never give it to a build phase or an app.
func (r *Registry) Credentials() (user, pass string) { return r.user, r.pass }

// Keychain returns a keychain that logs in to this registry (Addr) with Credentials and to any
// other registry anonymously, so the login never leaves for another host.
func (r *Registry) Keychain() authn.Keychain {
	return registryKeychain{host: r.addr, auth: &authn.Basic{Username: r.user, Password: r.pass}}
}

type registryKeychain struct {
	host string
	auth authn.Authenticator
}

func (k registryKeychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	if res.RegistryStr() == k.host {
		return k.auth, nil
	}
	return authn.Anonymous, nil
}

// Addr returns "127.0.0.1:<port>", the registry host for image references.
func (r *Registry) Addr() string { return r.addr }

// PID returns the PID of the registry process running now (a garbage collection restarts it).
func (r *Registry) PID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc.cmd.Process.Pid
}

// Done is closed when the registry has stopped for good: after Close, or when its process
// exited on its own (not when a garbage collection stops and restarts it).
func (r *Registry) Done() <-chan struct{} { return r.done }

// Err returns nil while the process runs or after Close stopped it, and why it exited when it
// died on its own.
func (r *Registry) Err() error {
	select {
	case <-r.done:
	default:
		return nil
	}
	select {
	case <-r.closing:
		return nil
	default:
	}
	return fmt.Errorf("registry process exited: %v (see %s)", r.exitErr, r.logPath)
}

// Close stops the registry: it waits for a garbage collection that runs, then sends SIGTERM
// to the process, SIGKILL after RegistryConfig.StopGrace, and releases the data dir lock. It
// returns Err() from before the stop.
func (r *Registry) Close() error {
	err := r.Err()
	r.once.Do(func() {
		r.mu.Lock()
		r.gate.closed = true
		r.gate.broadcast()
		for r.gate.running {
			ch := r.gate.changed
			r.mu.Unlock()
			<-ch
			r.mu.Lock()
		}
		r.mu.Unlock()
		close(r.closing)
		r.mu.Lock()
		p := r.proc
		r.mu.Unlock()
		r.stopProcess(p)
		r.stopped(nil)
		r.lock.Unlock()
		r.log.Info("registry stopped", "pid", p.cmd.Process.Pid)
	})
	return err
}

// stopProcess stops p: SIGTERM, then SIGKILL after RegistryConfig.StopGrace.
func (r *Registry) stopProcess(p *registryProc) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(r.cfg.StopGrace):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// lastLines returns the last n lines of the file at p written after offset, indented.
func lastLines(p string, offset int64, n int) string {
	b, err := os.ReadFile(p)
	if err != nil || int64(len(b)) < offset {
		return "  (no log)\n"
	}
	b = bytes.TrimRight(b[offset:], "\n")
	if len(b) == 0 {
		return "  (no output)\n"
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ") + "\n"
}

// freePort asks the kernel for a free loopback TCP port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
