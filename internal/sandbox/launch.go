package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// launcherName is argv[0] of kpush started again as a sandbox launcher (Start).
const launcherName = "kpush-sandbox-launcher"

// stageDir is where the launcher, in its private mount namespace, binds the paths a sandbox
// is given (a tmpfs it mounts there first, mode 0755).
const stageDir = "/tmp"

// The launcher's descriptors: the plan, the executable to run, then the program's own.
const (
	planFD       = 3
	exeFD        = 4
	firstExtraFD = 5
)

// plan is what the launcher is handed on planFD.
type plan struct {
	Name     string // the program's argv[0]
	Parent   int    // kpush's PID, the launcher's parent
	UID, GID uint32 // host ids to run the program as
	Binds    []bind // stageDir/<index> ← Source
	// MaxProcs, if not 0, is RLIMIT_NPROC: the uid's processes and threads, counted in the
	// user namespaces it creates too.
	MaxProcs uint64
	// Files is how many descriptors from firstExtraFD the program is given.
	Files int
	// Tun gives the program a /dev/net/tun it may open (a node of its own, owned by UID:GID),
	// for slirp4netns where the host's is root's alone.
	Tun bool
}

// bind is one host path to stage. It is bound by path, here: a bind mount's source must be
// in the caller's own mount namespace, which a descriptor opened by kpush is not.
type bind struct {
	Source string // absolute host path of a file or directory
	Dir    bool   // a directory (else a file)
}

// The launcher must run before anything else in the process: every binary that links this
// package (kpush, and the test binaries of the packages that use it) can be a launcher.
func init() {
	if len(os.Args) > 0 && os.Args[0] == launcherName {
		if err := launch(os.Args); err != nil {
			fmt.Fprintf(os.Stderr, "kpush sandbox: %v\n", err)
		}
		os.Exit(125)
	}
}

// launch stages the plan's binds, drops to its ids and executes bubblewrap with args. It
// returns only on failure.
func launch(args []string) error {
	f := os.NewFile(planFD, "plan")
	var p plan
	if err := json.NewDecoder(f).Decode(&p); err != nil {
		return fmt.Errorf("reading the launch plan: %w", err)
	}
	f.Close()
	if p.UID == 0 || p.GID == 0 {
		return fmt.Errorf("refusing to run a sandbox as host uid %d / gid %d", p.UID, p.GID)
	}
	// Our mount namespace is private (Start's Unshareflags); nothing here reaches the host's.
	// Each source is cloned as a detached mount first (open_tree), since the tmpfs over
	// stageDir may hide it (a source under /tmp), then moved onto its place in the tmpfs.
	trees := make([]int, len(p.Binds))
	for i, b := range p.Binds {
		fd, err := unix.OpenTree(unix.AT_FDCWD, b.Source, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			return fmt.Errorf("staging %s: %w", b.Source, err)
		}
		trees[i] = fd
	}
	if err := unix.Mount("kpush-stage", stageDir, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mounting the staging tmpfs on %s: %w", stageDir, err)
	}
	for i, b := range p.Binds {
		dst := path.Join(stageDir, strconv.Itoa(i))
		if b.Dir {
			if err := unix.Mkdir(dst, 0o755); err != nil {
				return fmt.Errorf("staging: %w", err)
			}
		} else {
			fd, err := unix.Open(dst, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return fmt.Errorf("staging: %w", err)
			}
			unix.Close(fd)
		}
		if err := unix.MoveMount(trees[i], "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("staging %s: %w", b.Source, err)
		}
		unix.Close(trees[i])
	}
	if p.Tun {
		// mknod in our own tmpfs (not nodev), owned by the program: the host's node may be
		// 0600 root; this one opens the same device for the program only.
		node := path.Join(stageDir, "tun")
		if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(10, 200))); err != nil {
			return fmt.Errorf("creating a tun node: %w", err)
		}
		if err := unix.Chown(node, int(p.UID), int(p.GID)); err != nil {
			return fmt.Errorf("creating a tun node: %w", err)
		}
		if err := unix.Mount(node, "/dev/net/tun", "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding the tun node on /dev/net/tun: %w", err)
		}
	}
	if p.MaxProcs > 0 {
		lim := unix.Rlimit{Cur: p.MaxProcs, Max: p.MaxProcs}
		if err := unix.Setrlimit(unix.RLIMIT_NPROC, &lim); err != nil {
			return fmt.Errorf("limiting processes: %w", err)
		}
	}
	// Drop root for good before bubblewrap runs: no supplementary groups, then gid, then uid.
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(int(p.GID), int(p.GID), int(p.GID)); err != nil {
		return fmt.Errorf("setresgid %d: %w", p.GID, err)
	}
	if err := syscall.Setresuid(int(p.UID), int(p.UID), int(p.UID)); err != nil {
		return fmt.Errorf("setresuid %d: %w", p.UID, err)
	}
	// A change of credentials clears the parent-death signal; kpush's death must still end us.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("prctl: %w", err)
	}
	if os.Getppid() != p.Parent { // it died before the parent-death signal was set again
		return fmt.Errorf("kpush exited")
	}
	// Nothing kpush itself inherited reaches the program: every descriptor past the ones it
	// is given closes on exec.
	if err := unix.CloseRange(uint(firstExtraFD+p.Files), ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("close_range: %w", err)
	}
	// The kernel opens the executable before it closes close-on-exec descriptors.
	unix.CloseOnExec(exeFD)
	args = append([]string{p.Name}, args[1:]...)
	exe := "/proc/self/fd/" + strconv.Itoa(exeFD)
	return fmt.Errorf("executing %s: %w", args[0], syscall.Exec(exe, args, os.Environ()))
}

// launcher returns the command that runs exe (a host path kpush opens; the program need
// not be able to reach it) with argv (argv[0] its name) as p's ids, after staging p's binds,
// with files as descriptors firstExtraFD onwards. The caller closes cmd.ExtraFiles once the
// command has started (closeFiles). It is started in a private mount namespace
// of its own, in a process group of its own, and dies with kpush.
func launcher(p plan, exe string, argv []string, files []*os.File) (*exec.Cmd, error) {
	p.Name, p.Parent, p.Files = argv[0], os.Getpid(), len(files)
	planJSON, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	planR, planW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	exeFile, err := os.Open(exe)
	if err != nil {
		planR.Close()
		planW.Close()
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	// The plan is small (far below a pipe's buffer): written now, read by the launcher.
	_, err = planW.Write(planJSON)
	planW.Close()
	if err != nil {
		planR.Close()
		exeFile.Close()
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	cmd := exec.Command("/proc/self/exe", argv[1:]...)
	cmd.Args[0] = launcherName
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.ExtraFiles = append([]*os.File{planR, exeFile}, files...)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:      true,                // one process group to signal
		Pdeathsig:    syscall.SIGKILL,     // if kpush dies, so does the program
		Unshareflags: syscall.CLONE_NEWNS, // the launcher's mounts stay its own (Go makes / private)
	}
	return cmd, nil
}

// closeFiles closes the descriptors a started launcher inherited (ours are copies).
func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}
