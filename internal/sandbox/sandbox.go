// Package sandbox runs untrusted code — buildpacks at build time, apps at run time — under
// bubblewrap, the way rootless Podman runs a container: as an unprivileged host uid that maps
// to no privileged one, in its own user, mount, PID, IPC, UTS and network namespaces, with a
// seccomp filter modelled on the container runtimes' default profile, no capabilities and
// no_new_privs, seeing only the files it is given.
//
// kpush itself runs as root. A sandbox is started in three steps:
//
//  1. kpush starts its own executable again as the launcher (argv[0] launcherName) in a
//     private mount namespace, handing it the plan (host paths to stage, host ids) on a pipe.
//  2. The launcher, still root but only in its own mount namespace, clones each path as a
//     detached mount (open_tree), mounts a tmpfs over stageDir and moves each onto
//     stageDir/<n>, so the sandbox user can reach them even where their host path is not
//     searchable by it (the default data dir is under /root). It caps the uid's processes
//     (RLIMIT_NPROC), marks every descriptor it was not given close-on-exec, drops to the
//     sandbox's host uid and gid (HostIDs.Base + UID/GID, no supplementary groups) and
//     executes bubblewrap.
//  3. bubblewrap, now unprivileged, creates the namespaces (--unshare-user maps UID to the
//     host uid and nothing else; --disable-userns forbids nested user namespaces), binds the
//     staged paths to their places, loads the seccomp filter and runs the command.
//
// Networking: NetNone gives the sandbox a network namespace with only loopback; NetOutbound
// adds slirp4netns (a user-mode TCP/IP stack, as rootless Podman uses) for outbound traffic
// with --disable-host-loopback, so the host's 127.0.0.1 services stay out of reach; NetHost
// shares the host's (only for the lifecycle's own analyze, restore and export phases, which
// talk to the registry). kpush reaches a server inside a sandbox with Sandbox.DialContext,
// which connects from inside its network namespace.
package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"kpush.dev/kpush/internal/tools"
)

// Network is what a sandbox's network namespace reaches.
type Network int

const (
	// NetNone is a network namespace of its own with only a loopback interface.
	NetNone Network = iota
	// NetOutbound is NetNone plus slirp4netns: outbound TCP and UDP to what the host reaches,
	// except the host's loopback addresses; DNS through slirp's forwarder at 10.0.2.3.
	NetOutbound
	// NetHost is the host's network namespace (trusted lifecycle phases only).
	NetHost
)

func (n Network) String() string {
	switch n {
	case NetNone:
		return "none"
	case NetOutbound:
		return "outbound"
	case NetHost:
		return "host"
	}
	return "Network(" + strconv.Itoa(int(n)) + ")"
}

// SlirpDNS is the resolver a NetOutbound sandbox uses (slirp4netns forwards it to the host's).
const SlirpDNS = "10.0.2.3"

// Mount is one path of the sandbox.
type Mount struct {
	// Source is the host file or directory bound at Dest. Empty: Dest is a fresh tmpfs
	// (mode 1777).
	Source string
	// Dest is the absolute path inside the sandbox.
	Dest string
	// Writable binds Source read-write (the sandbox user still needs write permission).
	Writable bool
	// Symlink, if set, makes Dest a symbolic link to it instead (nothing is bound).
	Symlink string
	// Size caps a tmpfs (Source "") at this many bytes; 0 means DefaultTmpfsSize.
	Size int64
}

// DefaultTmpfsSize caps a sandbox's tmpfs (it is memory): 512 MiB.
const DefaultTmpfsSize = 512 << 20

// DefaultMaxProcs caps the processes and threads of one sandbox's host uid (RLIMIT_NPROC,
// which each sandbox's own uid makes a per-app limit): a fork bomb stops there.
const DefaultMaxProcs = 4096

// Spec describes one sandboxed command.
type Spec struct {
	// Argv is the command and its arguments, resolved inside the sandbox. Required.
	Argv []string
	// Env is the command's whole environment ("KEY=value").
	Env []string
	// Dir is the working directory inside the sandbox ("" = "/").
	Dir string
	// Hostname is the sandbox's host name ("" = "sandbox").
	Hostname string
	// Root, if set, is the host directory bound as "/" (read-write: an app's own copy of its
	// image). Otherwise "/" is an empty tmpfs holding only Mounts.
	Root string
	// Mounts are bound in order, after Root.
	Mounts []Mount
	// HostIDs is the host id range the sandbox's ids map into: id n inside is HostIDs.Base+n
	// on the host.
	HostIDs IDRange
	// UID and GID are the sandbox user inside (host: HostIDs.Base + UID, HostIDs.Base + GID).
	UID, GID uint32
	// Network is what the sandbox's network reaches.
	Network Network
	// NewSession puts the command in a new session (no controlling terminal to inject into).
	NewSession bool
	// MaxProcs caps the processes and threads of the sandbox's host uid (0: DefaultMaxProcs).
	MaxProcs uint64
	// NoProc leaves /proc out, so that no path in the sandbox leads to the command's own
	// environment (/proc/self/environ): for commands whose environment holds a secret and
	// which read files someone else may have planted (a symlink to it would leak it).
	NoProc bool
	// Stdout and Stderr receive the command's output (nil: discarded).
	Stdout, Stderr io.Writer
}

// Sandbox is a started sandbox.
type Sandbox struct {
	cmd   *exec.Cmd
	slirp *slirp
	netns *os.File // the sandbox's network namespace (NetNone, NetOutbound), for DialContext
	done  chan struct{}
	err   error

	closeOnce sync.Once
}

// Start starts spec's command in a new sandbox and returns once it runs (for NetOutbound:
// once its network is up). Cancelling ctx kills the sandbox.
func Start(ctx context.Context, spec Spec) (*Sandbox, error) {
	if len(spec.Argv) == 0 {
		return nil, errors.New("sandbox: no command")
	}
	if err := spec.HostIDs.valid(spec.UID, spec.GID); err != nil {
		return nil, err
	}
	bwrap, err := tools.Path("bwrap")
	if err != nil {
		return nil, err
	}
	var slirpPath string
	if spec.Network == NetOutbound {
		if slirpPath, err = slirp4netnsPath(); err != nil {
			return nil, err
		}
	}
	filter, err := SeccompFilter()
	if err != nil {
		return nil, fmt.Errorf("sandbox: seccomp filter: %w", err)
	}

	var c child
	started := false
	defer func() {
		if !started {
			c.closeParentEnds()
		}
	}()
	argsR, argsW, err := c.pipe()
	if err != nil {
		return nil, err
	}
	argsFD := c.add(argsR)
	secR, secW, err := c.pipe()
	if err != nil {
		return nil, err
	}
	secFD := c.add(secR)

	p := plan{UID: spec.HostIDs.Host(spec.UID), GID: spec.HostIDs.Host(spec.GID), MaxProcs: spec.MaxProcs}
	if p.MaxProcs == 0 {
		p.MaxProcs = DefaultMaxProcs
	}
	stage := func(src string) (string, error) {
		if !path.IsAbs(src) {
			return "", fmt.Errorf("sandbox: mount source %q is not an absolute path", src)
		}
		fi, err := os.Stat(src)
		if err != nil {
			return "", fmt.Errorf("sandbox: %w", err)
		}
		n := len(p.Binds)
		p.Binds = append(p.Binds, bind{Source: src, Dir: fi.IsDir()})
		return path.Join(stageDir, strconv.Itoa(n)), nil
	}

	a := []string{
		"--unshare-user", "--disable-userns",
		"--uid", strconv.FormatUint(uint64(spec.UID), 10), "--gid", strconv.FormatUint(uint64(spec.GID), 10),
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		"--hostname", orDefault(spec.Hostname, "sandbox"),
		"--die-with-parent",
		"--cap-drop", "ALL",
		"--seccomp", strconv.Itoa(secFD),
	}
	if spec.Network != NetHost {
		a = append(a, "--unshare-net")
	}
	if spec.NewSession {
		a = append(a, "--new-session")
	}
	made := map[string]bool{"/": true}
	if spec.Root != "" {
		s, err := stage(spec.Root)
		if err != nil {
			return nil, err
		}
		a = append(a, "--bind", s, "/")
	}
	for _, m := range spec.Mounts {
		if !path.IsAbs(m.Dest) || path.Clean(m.Dest) != m.Dest {
			return nil, fmt.Errorf("sandbox: mount destination %q is not a clean absolute path", m.Dest)
		}
		if spec.Root == "" {
			a = append(a, parentDirs(m.Dest, made)...)
		}
		made[m.Dest] = true
		switch {
		case m.Symlink != "":
			a = append(a, "--symlink", m.Symlink, m.Dest)
		case m.Source == "":
			size := m.Size
			if size <= 0 {
				size = DefaultTmpfsSize
			}
			a = append(a, "--perms", "1777", "--size", strconv.FormatInt(size, 10), "--tmpfs", m.Dest)
		default:
			s, err := stage(m.Source)
			if err != nil {
				return nil, err
			}
			flag := "--ro-bind"
			if m.Writable {
				flag = "--bind"
			}
			a = append(a, flag, s, m.Dest)
		}
	}
	if !spec.NoProc {
		a = append(a, "--proc", "/proc")
	}
	// bwrap's /dev and a tmpfs root are tmpfs the sandbox user owns, of no set size: /dev/shm
	// gets a capped tmpfs of its own, and /dev (and a tmpfs root) turn read-only at the end.
	a = append(a, "--dev", "/dev", "--perms", "1777", "--size", strconv.Itoa(DefaultTmpfsSize/8), "--tmpfs", "/dev/shm")
	a = append(a, "--clearenv")
	for _, kv := range spec.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("sandbox: environment entry %q is not KEY=value", kv)
		}
		a = append(a, "--setenv", k, v)
	}
	a = append(a, "--remount-ro", "/dev")
	if spec.Root == "" {
		a = append(a, "--remount-ro", "/")
	}
	a = append(a, "--chdir", orDefault(spec.Dir, "/"))

	var infoR, blockW *os.File
	if spec.Network != NetHost {
		// bubblewrap reports the sandbox's PID and waits: kpush takes a handle on its network
		// namespace (DialContext) and, for NetOutbound, attaches slirp4netns first.
		var infoW, blockR *os.File
		if infoR, infoW, err = c.pipe(); err != nil {
			return nil, err
		}
		if blockR, blockW, err = c.pipe(); err != nil {
			return nil, err
		}
		a = append(a, "--info-fd", strconv.Itoa(c.add(infoW)), "--block-fd", strconv.Itoa(c.add(blockR)))
	}
	var argBuf strings.Builder
	for _, s := range a {
		if strings.ContainsRune(s, 0) {
			return nil, errors.New("sandbox: an argument or environment value contains a NUL byte")
		}
		argBuf.WriteString(s)
		argBuf.WriteByte(0)
	}

	// Options (env values among them) go through the pipe, so they never show in ps; the
	// command line follows on bwrap's own argv, where bwrap expects it.
	cmd, err := launcher(p, bwrap, append([]string{"bwrap", "--args", strconv.Itoa(argsFD), "--"}, spec.Argv...), c.files)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = orDiscard(spec.Stdout), orDiscard(spec.Stderr)
	err = cmd.Start()
	closeFiles(cmd.ExtraFiles)
	if err != nil {
		return nil, fmt.Errorf("sandbox: starting the launcher: %w", err)
	}
	started = true
	s := &Sandbox{cmd: cmd, done: make(chan struct{})}
	go func() {
		s.err = cmd.Wait()
		close(s.done)
	}()
	// Writes fail (EPIPE) if the launcher died, which Wait reports.
	go func() { io.WriteString(argsW, argBuf.String()); argsW.Close() }()
	go func() { secW.Write(filter); secW.Close() }()

	fail := func(err error) (*Sandbox, error) {
		s.kill()
		<-s.done
		s.release()
		return nil, err
	}
	stop := context.AfterFunc(ctx, s.kill)
	go func() { <-s.done; stop() }()

	if spec.Network != NetHost {
		pid, err := readChildPID(infoR, s.done)
		infoR.Close()
		if err != nil {
			return fail(fmt.Errorf("sandbox: %w (%v)", err, s.exitErr()))
		}
		if s.netns, err = os.Open(fmt.Sprintf("/proc/%d/ns/net", pid)); err != nil {
			return fail(fmt.Errorf("sandbox: opening the network namespace: %w", err))
		}
		if spec.Network == NetOutbound {
			// The user namespace that owns the network namespace: bubblewrap's first, where
			// the sandbox's host uid is 0 (the command runs in a nested one that maps only UID).
			nsfd, err := unix.IoctlRetInt(int(s.netns.Fd()), unix.NS_GET_USERNS)
			if err != nil {
				return fail(fmt.Errorf("sandbox: finding the network namespace's user namespace: %w", err))
			}
			userns := os.NewFile(uintptr(nsfd), "userns")
			// slirp4netns brings lo up too: only once bubblewrap has (its last step of setting
			// up the namespace), or bubblewrap's own set-up of lo fails now and then.
			if err := waitLoopbackUp(s.netns, s.done); err != nil {
				userns.Close()
				return fail(fmt.Errorf("sandbox: %w (%v)", err, s.exitErr()))
			}
			s.slirp, err = startSlirp(slirpPath, s.netns, userns, p.UID, p.GID, s.done)
			userns.Close()
			if err != nil {
				return fail(err)
			}
		}
		if _, err := blockW.Write([]byte{1}); err != nil {
			return fail(fmt.Errorf("sandbox: releasing the command: %w (%v)", err, s.exitErr()))
		}
		blockW.Close()
	}
	return s, nil
}

// Run runs spec's command in a new sandbox to its end.
func Run(ctx context.Context, spec Spec) error {
	s, err := Start(ctx, spec)
	if err != nil {
		return err
	}
	err = s.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Pid is the host PID of the sandbox's outermost process (bubblewrap); its process group
// holds every process of the sandbox.
func (s *Sandbox) Pid() int { return s.cmd.Process.Pid }

// Done is closed when the sandbox has exited.
func (s *Sandbox) Done() <-chan struct{} { return s.done }

// Wait waits for the sandbox to exit and returns the command's exit error, releasing what
// the sandbox held.
func (s *Sandbox) Wait() error {
	<-s.done
	s.release()
	return s.err
}

// Signal sends sig to every process of the sandbox (its process group).
func (s *Sandbox) Signal(sig syscall.Signal) error {
	select {
	case <-s.done:
		return os.ErrProcessDone
	default:
	}
	return syscall.Kill(-s.cmd.Process.Pid, sig)
}

func (s *Sandbox) kill() { _ = s.Signal(syscall.SIGKILL) }

func (s *Sandbox) exitErr() error {
	select {
	case <-s.done:
		return s.err
	case <-time.After(2 * time.Second):
		return errors.New("the sandbox is still running")
	}
}

// release stops slirp4netns and closes the namespace handle. The sandbox has exited.
func (s *Sandbox) release() {
	s.closeOnce.Do(func() {
		if s.slirp != nil {
			// Closing the tap device waits for the kernel to unregister it (an RCU grace
			// period, tens of ms): reap slirp4netns in the background, nobody waits for it.
			go s.slirp.stop()
		}
		if s.netns != nil {
			s.netns.Close()
		}
	})
}

// DialContext connects to address (e.g. "127.0.0.1:8080") from inside the sandbox's network
// namespace: how kpush reaches an app that listens only in its own sandbox.
func (s *Sandbox) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if s.netns == nil {
		return nil, errors.New("sandbox: no network namespace of its own to dial into")
	}
	var c net.Conn
	err := inNetns(s.netns, func() (err error) {
		// The socket keeps the namespace it was made in.
		var d net.Dialer
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// inNetns runs f on an OS thread of its own inside the network namespace netns: setns changes
// only the calling thread.
func inNetns(netns *os.File, f func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- err
			return
		}
		defer self.Close()
		if err := unix.Setns(int(netns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- fmt.Errorf("entering the sandbox's network namespace: %w", err)
			return
		}
		err = f()
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked and Go retires it with this goroutine
		ch <- err
	}()
	return <-ch
}

// child collects the descriptors a launched program inherits (firstExtraFD onwards, in order).
type child struct {
	files  []*os.File // the child's ends
	parent []*os.File // our ends, closed by closeParentEnds unless taken
}

func (c *child) add(f *os.File) int {
	c.files = append(c.files, f)
	return firstExtraFD - 1 + len(c.files)
}

func (c *child) pipe() (r, w *os.File, err error) {
	r, w, err = os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox: %w", err)
	}
	c.parent = append(c.parent, r, w)
	return r, w, nil
}

func (c *child) closeChildEnds() {
	for _, f := range c.files {
		f.Close()
	}
	c.files = nil
}

// closeParentEnds closes everything still open on an error path; closing twice is harmless.
func (c *child) closeParentEnds() {
	c.closeChildEnds()
	for _, f := range c.parent {
		f.Close()
	}
}

// readChildPID reads bubblewrap's --info-fd JSON ({"child-pid": N, ...}).
func readChildPID(r io.Reader, done <-chan struct{}) (int, error) {
	type res struct {
		pid int
		err error
	}
	ch := make(chan res, 1)
	go func() {
		var info struct {
			ChildPID int `json:"child-pid"`
		}
		err := json.NewDecoder(bufio.NewReader(r)).Decode(&info)
		if err == nil && info.ChildPID <= 0 {
			err = errors.New("no child-pid")
		}
		ch <- res{info.ChildPID, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return 0, fmt.Errorf("reading bubblewrap's info: %w", r.err)
		}
		return r.pid, nil
	case <-done:
		return 0, errors.New("bubblewrap exited before the sandbox started")
	case <-time.After(30 * time.Second):
		return 0, errors.New("bubblewrap did not start the sandbox within 30s")
	}
}

// parentDirs returns bwrap arguments that create p's missing parents (not p) with mode 0755:
// bwrap would make them 0700, which the sandbox user could not traverse.
func parentDirs(p string, made map[string]bool) []string {
	dir := path.Dir(p)
	if made[dir] {
		return nil
	}
	a := parentDirs(dir, made)
	made[dir] = true
	return append(a, "--perms", "0755", "--dir", dir)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
