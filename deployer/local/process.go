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
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// proc is one app process: bubblewrap (its PID is the process group) and the sandbox under it.
type proc struct {
	app  string
	port int
	pid  int
	id   identity
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and been reaped
	err  error         // exit error; read after done

	tail *tailBuffer

	stopOnce sync.Once
	stopping chan struct{} // closed when we asked it to stop
}

// spawnSpec is what startProc needs.
type spawnSpec struct {
	bwrap  string
	app    string
	img    *pulled
	env    map[string]string // from the Release
	port   int
	logw   io.Writer // app.log
	log    *slog.Logger
	asRoot bool // forced root inside the sandbox (rootfs not searchable by the image user)
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

// bwrapArgs returns bubblewrap's options (passed through --args, so env values never show in
// ps) and the command line. See bwrap(1).
func bwrapArgs(cfg v1.Config, env []string, id identity, unprivileged bool) (opts, argv []string, err error) {
	argv = append(append([]string{}, cfg.Entrypoint...), cfg.Cmd...)
	if len(argv) == 0 {
		return nil, nil, errors.New("the image has no Entrypoint or Cmd to run")
	}
	wd := cfg.WorkingDir
	if wd == "" {
		wd = "/"
	}
	opts = []string{
		"--bind", "ROOTFS", "/", // replaced by the caller
		"--proc", "/proc",
		"--dev", "/dev",
		"--perms", "1777", "--tmpfs", "/tmp",
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "app",
		"--die-with-parent",
		"--clearenv",
		"--chdir", wd,
	}
	if !unprivileged {
		// Root inside the sandbox keeps no capability (bwrap sets no_new_privs too): it owns
		// its own image copy and nothing else it can see.
		opts = append(opts, "--cap-drop", "ALL")
	}
	if unprivileged {
		// bwrap runs as the image user and maps it to itself in a new user namespace.
		opts = append(opts, "--unshare-user",
			"--uid", strconv.FormatUint(uint64(id.uid), 10),
			"--gid", strconv.FormatUint(uint64(id.gid), 10))
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		opts = append(opts, "--setenv", k, v)
	}
	return opts, argv, nil
}

// startProc starts the app's process. It returns once the process is started; use waitReady.
func startProc(s spawnSpec) (*proc, error) {
	id, err := resolveUser(s.img.config.User, s.img.rootfs)
	if err != nil {
		return nil, err
	}
	unprivileged := id.uid != 0 && !s.asRoot
	if unprivileged && (!searchableBy(s.img.rootfs, id.uid, id.gid) || !searchableBy(filepath.Dir(s.bwrap), id.uid, id.gid)) {
		// bwrap must run as the image user to keep that uid's file ownership intact, and
		// then it can only bind what that user can reach.
		s.log.Warn("image user cannot reach the rootfs or bwrap; running as root without capabilities inside the sandbox (keep the data dir and tools where that user can reach them to run as it)",
			"app", s.app, "uid", id.uid, "rootfs", s.img.rootfs, "bwrap", s.bwrap)
		unprivileged = false
		id = identity{home: "/root"}
	}
	env := buildEnv(s.img.config.Env, s.env, s.port, id.home)
	opts, argv, err := bwrapArgs(s.img.config, env, id, unprivileged)
	if err != nil {
		return nil, err
	}
	opts[1] = s.img.rootfs

	var argBuf strings.Builder
	for _, a := range opts {
		if strings.ContainsRune(a, 0) {
			return nil, fmt.Errorf("environment or config value contains a NUL byte")
		}
		argBuf.WriteString(a)
		argBuf.WriteByte(0)
	}
	argsR, argsW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating pipe: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		argsR.Close()
		argsW.Close()
		return nil, fmt.Errorf("creating pipe: %w", err)
	}

	cmd := exec.Command(s.bwrap, append([]string{"--args", "3", "--"}, argv...)...)
	cmd.Env = []string{"PATH=" + defaultPath} // bwrap itself gets nothing from the app's env
	cmd.Dir = "/"
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = outW, outW
	cmd.ExtraFiles = []*os.File{argsR}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:   true,            // one process group to signal
		Pdeathsig: syscall.SIGKILL, // if kpush dies, so does the sandbox
	}
	if unprivileged {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: []uint32{}}
	}
	if err := cmd.Start(); err != nil {
		argsR.Close()
		argsW.Close()
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("starting bwrap: %w", err)
	}
	argsR.Close()
	outW.Close()
	go func() {
		io.WriteString(argsW, argBuf.String())
		argsW.Close()
	}()

	p := &proc{
		app: s.app, port: s.port, pid: cmd.Process.Pid, id: id, cmd: cmd,
		done: make(chan struct{}), stopping: make(chan struct{}),
		tail: newTailBuffer(30),
	}
	s.log.Info("app process started", "app", s.app, "pid", p.pid, "port", s.port,
		"uid", id.uid, "gid", id.gid, "sandbox_user_ns", unprivileged, "image", s.img.digest.String())

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
		err := cmd.Wait()
		<-copied
		p.err = err
		close(p.done)
	}()
	return p, nil
}

// waitReady waits until the process accepts TCP connections on 127.0.0.1:port. It fails when
// the process exits first, timeout passes, or ctx ends.
func (p *proc) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		d := net.Dialer{Timeout: time.Second}
		if c, err := d.DialContext(ctx, "tcp", addr); err == nil {
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
	// Negative PID: the process group we created with Setpgid; its leader is our child.
	_ = syscall.Kill(-p.pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
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
	t.lines = append(t.lines, line)
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

// freePort asks the kernel for a free loopback TCP port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
