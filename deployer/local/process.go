package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"kpush.dev/kpush/internal/sandbox"
	"kpush.dev/kpush/internal/term"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// appPort is the $PORT apps listen on inside their sandbox (Knative's default). Each app has
// its own network namespace, so every app can have the same one.
const appPort = 8080

// proc is one app process: its sandbox (bubblewrap's PID leads the process group).
type proc struct {
	app  string
	port int
	pid  int
	id   identity
	sb   *sandbox.Sandbox
	done chan struct{} // closed when the process has exited and been reaped
	err  error         // exit error; read after done

	tail *tailBuffer

	stopOnce sync.Once
	stopping chan struct{} // closed when we asked it to stop
}

// spawnSpec is what startProc needs.
type spawnSpec struct {
	app    string
	img    *pulled
	ids    sandbox.IDRange   // the app's host ids (the rootfs is owned within them)
	etcDir string            // resolv.conf and hosts for the app's /etc (its sandbox's network)
	env    map[string]string // from the Release
	logw   io.Writer         // app.log
	log    *slog.Logger
}

// buildEnv merges the image config Env, the release env and PORT (in that order of
// precedence, later wins), adding PATH and HOME when neither sets them. Sorted by first
// appearance for a stable result.
func buildEnv(imageEnv []string, relEnv map[string]string, port int, home string) []string {
	var keys []string
	vals := map[string]string{}
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			keys = append(keys, k)
		}
		vals[k] = v
	}
	for _, kv := range imageEnv {
		k, v, _ := strings.Cut(kv, "=")
		if k != "" {
			set(k, v)
		}
	}
	relKeys := make([]string, 0, len(relEnv))
	for k := range relEnv {
		relKeys = append(relKeys, k)
	}
	slices.Sort(relKeys)
	for _, k := range relKeys {
		if k != "" && !strings.ContainsAny(k, "=\x00") {
			set(k, relEnv[k])
		}
	}
	set("PORT", strconv.Itoa(port))
	if _, ok := vals["PATH"]; !ok {
		set("PATH", defaultPath)
	}
	if _, ok := vals["HOME"]; !ok {
		if home == "" {
			home = "/"
		}
		set("HOME", home)
	}
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+vals[k])
	}
	return out
}

// startProc starts the app's process in its sandbox (internal/sandbox): the image's rootfs
// as "/", with /etc/resolv.conf (slirp4netns's resolver) and /etc/hosts bound over the
// image's as container runtimes do, a private /tmp, its own user (the image user, on the app's unprivileged host ids),
// network (outbound only, no host loopback; kpush reaches $PORT from inside), PID, IPC and
// UTS namespaces, the seccomp filter, no capabilities. It returns once the process is
// started; use waitReady.
func startProc(ctx context.Context, s spawnSpec) (*proc, error) {
	cfg := s.img.config
	argv := append(append([]string{}, cfg.Entrypoint...), cfg.Cmd...)
	if len(argv) == 0 {
		return nil, errors.New("the image has no Entrypoint or Cmd to run")
	}
	id, err := resolveUser(cfg.User, s.img.rootfs)
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating pipe: %w", err)
	}
	mounts := []sandbox.Mount{{Dest: "/tmp"}}
	for _, f := range etcFiles {
		if fi, err := os.Lstat(filepath.Join(s.img.rootfs, f)); err == nil && fi.Mode().IsRegular() {
			mounts = append(mounts, sandbox.Mount{Source: filepath.Join(s.etcDir, filepath.Base(f)), Dest: "/" + f})
		}
	}
	sb, err := sandbox.Start(ctx, sandbox.Spec{
		Argv:     argv,
		Env:      buildEnv(cfg.Env, s.env, appPort, id.home),
		Dir:      orRoot(cfg.WorkingDir),
		Hostname: s.app,
		Root:     s.img.rootfs,
		Mounts:   mounts,
		HostIDs:  s.ids, UID: id.uid, GID: id.gid,
		Network: sandbox.NetOutbound,
		// Its own session: no controlling terminal (kpush's, under `make dev`) to read from,
		// write to or take the foreground of.
		NewSession: true,
		Stdout:     outW, Stderr: outW,
	})
	outW.Close()
	if err != nil {
		outR.Close()
		return nil, fmt.Errorf("starting the sandbox: %w", err)
	}
	p := &proc{
		app: s.app, port: appPort, pid: sb.Pid(), id: id, sb: sb,
		done: make(chan struct{}), stopping: make(chan struct{}),
		tail: newTailBuffer(30),
	}
	s.log.Info("app process started", "app", s.app, "pid", p.pid, "port", appPort,
		"uid", id.uid, "gid", id.gid, "host_uid", s.ids.Host(id.uid), "image", s.img.digest.String())

	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(outR)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			p.tail.add(line)
			if s.logw != nil {
				fmt.Fprintf(s.logw, "%s [pid %d] %s\n", time.Now().UTC().Format(time.RFC3339), p.pid, line)
			}
			s.log.Debug("app output", "app", s.app, "pid", p.pid, "line", line)
		}
		outR.Close()
	}()
	go func() {
		err := sb.Wait()
		<-copied
		p.err = err
		close(p.done)
	}()
	return p, nil
}

func orRoot(dir string) string {
	if dir == "" {
		return "/"
	}
	return dir
}

// dial connects to address inside the app's sandbox.
func (p *proc) dial(ctx context.Context, network, address string) (net.Conn, error) {
	return p.sb.DialContext(ctx, network, address)
}

// addr is where the app listens, inside its sandbox.
func (p *proc) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// waitReady waits until the process accepts TCP connections on 127.0.0.1:port. It fails when
// the process exits first, timeout passes, or ctx ends.
func (p *proc) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		dctx, dcancel := context.WithTimeout(ctx, time.Second)
		c, err := p.dial(dctx, "tcp", p.addr())
		dcancel()
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("the process exited before listening on $PORT (%d): %v", p.port, p.exitDesc())
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("the process did not listen on $PORT (%d) within %s", p.port, timeout)
			}
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (p *proc) exitDesc() string {
	if p.err == nil {
		return "exit status 0"
	}
	return p.err.Error()
}

// running reports whether the process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace, and waits for the exit.
func (p *proc) stop(grace time.Duration) {
	p.stopOnce.Do(func() { close(p.stopping) })
	if !p.running() {
		return
	}
	_ = p.sb.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = p.sb.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *proc) stopRequested() bool {
	select {
	case <-p.stopping:
		return true
	default:
		return false
	}
}

// tailBuffer keeps the last n lines of output.
type tailBuffer struct {
	mu    sync.Mutex
	n     int
	lines []string
}

func newTailBuffer(n int) *tailBuffer { return &tailBuffer{n: n} }

func (t *tailBuffer) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(line) > 500 {
		line = line[:500] + "…"
	}
	t.lines = append(t.lines, term.Sanitize(line)) // it reaches the pusher's terminal
	if len(t.lines) > t.n {
		t.lines = t.lines[len(t.lines)-t.n:]
	}
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 0 {
		return "  (no output)\n"
	}
	var b strings.Builder
	for _, l := range t.lines {
		b.WriteString("  ")
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}
