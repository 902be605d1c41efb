// Package buildpacktest runs a build Pod's plan on this machine, for tests: PodRunner plays
// the kubelet for the Pods buildpack.BuildPod makes (in tests of buildpack and of the packages
// that use it), and LocalBuilderImage lays out the builder image it runs them with. No
// non-test code of kpush imports it.
package buildpacktest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/internal/tools"
)

// LocalImage stands in for a container image when PodRunner runs a Pod on this machine: the
// root filesystem is the host's (read-only, as in buildpack.Local), plus Files bound read-only.
type LocalImage struct {
	Entrypoint []string          // the image's ENTRYPOINT, used when a container sets no Command
	Env        []string          // the image config's "NAME=value" env; the container's env wins
	Files      map[string]string // path in the container → host file or directory (read-only)
}

// ContainerEvents are PodRunner.Run's callbacks, in the role of the kubelet's status reports
// and container logs. Any may be nil.
type ContainerEvents struct {
	Started  func(container string)               // the container's process started
	Finished func(container string, exitCode int) // it exited (128+signal if killed)
	Output   func(container string) io.Writer     // its stdout and stderr; nil writer: discarded
}

// PodRunner runs a Pod's containers on this machine, one after another, the way a kubelet runs
// a restartPolicy Never Pod: init containers in order, each to completion, then the (single)
// main container; the first non-zero exit ends the Pod. Each container runs in its own
// bubblewrap sandbox (private mount, PID, IPC and UTS namespaces, host network) as the Pod's
// runAsUser:runAsGroup with fsGroup as supplementary group, no capabilities and no_new_privs
// (setpriv), with exactly the Pod's volume mounts: every emptyDir is a host directory shared
// by the containers that mount it (mode 2777, group fsGroup, as the kubelet makes it), a
// Secret volume is a directory of the Secret's files (DefaultMode, group fsGroup), and
// read-only mounts are read-only. /etc/passwd has root and the run user ("cnb", home
// /home/cnb); env is the image's, then the container's. A container's securityContext is
// honoured as far as it can be: readOnlyRootFilesystem makes the root read-only and /tmp an
// unwritable directory of the image unless a volume is mounted there (without it, /tmp is a
// private tmpfs, 1777, as an image's writable /tmp); a root runAsUser is refused, so
// runAsNonRoot always holds; privileges the runner never grants (privileged, added
// capabilities, allowPrivilegeEscalation) and a container-level user or group other than the
// Pod's are refused. activeDeadlineSeconds bounds the whole run. Not modelled: resources,
// probes, env valueFrom, volume types other than emptyDir and secret (an error).
//
// Running as root is required (bubblewrap without a user namespace, setpriv).
type PodRunner struct {
	// Images maps each image reference the Pod names to its local stand-in. Required.
	Images map[string]LocalImage
	// Secrets maps Secret names to their data (key → bytes), for secret volumes.
	Secrets map[string]map[string][]byte
	// ScratchDir holds the Pod's volumes while it runs ("" = os.TempDir()).
	ScratchDir string
	// Log gets internal detail. Nil: discarded.
	Log *slog.Logger
}

// Run runs pod to completion. It returns nil when every container exited 0, an error naming
// the container and its exit code otherwise (the Finished event has the code too), or a
// wrapped ctx error / "deadline exceeded" error when ctx or activeDeadlineSeconds ends it.
func (r *PodRunner) Run(ctx context.Context, pod *corev1.Pod, ev ContainerEvents) error {
	log := r.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("pod", pod.Name)
	bwrap, err := tools.Path("bwrap")
	if err != nil {
		return err
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		return fmt.Errorf("setpriv (util-linux) is not installed: %w", err)
	}
	sc := pod.Spec.SecurityContext
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		return errors.New("pod runner: the Pod must set a non-root runAsUser")
	}
	uid, gid := *sc.RunAsUser, *sc.RunAsUser
	if sc.RunAsGroup != nil {
		gid = *sc.RunAsGroup
	}
	fsGroup := int64(-1)
	if sc.FSGroup != nil {
		fsGroup = *sc.FSGroup
	}
	if d := pod.Spec.ActiveDeadlineSeconds; d != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, time.Duration(*d)*time.Second,
			fmt.Errorf("pod %s: activeDeadlineSeconds (%d s) exceeded", pod.Name, *d))
		defer cancel()
	}

	scratch, err := os.MkdirTemp(r.ScratchDir, "kpush-pod-")
	if err != nil {
		return fmt.Errorf("creating pod scratch directory: %w", err)
	}
	defer os.RemoveAll(scratch)
	if err := os.Chmod(scratch, 0o755); err != nil {
		return err
	}
	vols, err := r.volumes(scratch, pod, fsGroup)
	if err != nil {
		return err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\n%s:x:%d:%d:CNB user:/home/%s:/bin/sh\n", buildpack.CNBUser, uid, gid, buildpack.CNBUser)
	grp := fmt.Sprintf("root:x:0:\n%s:x:%d:\n", buildpack.CNBUser, gid)
	if err := os.WriteFile(filepath.Join(scratch, "passwd"), []byte(passwd), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(scratch, "group"), []byte(grp), 0o644); err != nil {
		return err
	}
	groups := []string{strconv.FormatInt(gid, 10)}
	if fsGroup >= 0 {
		groups = append(groups, strconv.FormatInt(fsGroup, 10))
	}
	for _, g := range sc.SupplementalGroups {
		groups = append(groups, strconv.FormatInt(g, 10))
	}
	creds := []string{setpriv, "--reuid=" + strconv.FormatInt(uid, 10), "--regid=" + strconv.FormatInt(gid, 10),
		"--groups=" + strings.Join(groups, ","), "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"}

	containers := append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
	for _, c := range containers {
		if err := checkSecurityContext(c, uid, gid); err != nil {
			return err
		}
		img, ok := r.Images[c.Image]
		if !ok {
			return fmt.Errorf("pod runner: no local stand-in for image %q of container %s", c.Image, c.Name)
		}
		args, err := containerArgs(pod, c, img, scratch, vols)
		if err != nil {
			return err
		}
		argv := c.Command
		if len(argv) == 0 {
			argv = img.Entrypoint
		}
		if len(argv) == 0 {
			return fmt.Errorf("pod runner: container %s has no command and its image no entrypoint", c.Name)
		}
		args = append(args, creds...)
		args = append(args, argv...)
		args = append(args, c.Args...)
		env, err := containerEnv(pod, c, img)
		if err != nil {
			return err
		}
		var out io.Writer = io.Discard
		if ev.Output != nil {
			if w := ev.Output(c.Name); w != nil {
				out = w
			}
		}
		cmd := exec.CommandContext(ctx, bwrap, args...)
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = 5 * time.Second
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("starting container %s: %w", c.Name, err)
		}
		if ev.Started != nil {
			ev.Started(c.Name)
		}
		err = cmd.Wait()
		code := 0
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
		case err != nil:
			code = 128 + int(syscall.SIGKILL)
		}
		log.Info("container finished", "container", c.Name, "exit_code", code, "duration", time.Since(t0))
		if ev.Finished != nil {
			ev.Finished(c.Name, code)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("running pod %s: %w", pod.Name, context.Cause(ctx))
		}
		if code != 0 {
			return fmt.Errorf("container %s of pod %s exited with code %d", c.Name, pod.Name, code)
		}
	}
	return nil
}

// checkSecurityContext refuses what PodRunner cannot run as asked: privileges it never grants
// (every container runs without capabilities and with no_new_privs) and a container-level
// user or group other than the Pod's uid:gid.
func checkSecurityContext(c corev1.Container, uid, gid int64) error {
	sc := c.SecurityContext
	if sc == nil {
		return nil
	}
	switch {
	case sc.Privileged != nil && *sc.Privileged,
		sc.AllowPrivilegeEscalation != nil && *sc.AllowPrivilegeEscalation,
		sc.Capabilities != nil && len(sc.Capabilities.Add) > 0:
		return fmt.Errorf("pod runner: container %s asks for privileges (privileged, allowPrivilegeEscalation or added capabilities), which it never grants", c.Name)
	case sc.RunAsUser != nil && *sc.RunAsUser != uid, sc.RunAsGroup != nil && *sc.RunAsGroup != gid:
		return fmt.Errorf("pod runner: container %s: a container-level runAsUser or runAsGroup other than the Pod's is not supported", c.Name)
	}
	return nil
}

// readOnlyRoot reports whether c asks for a read-only root filesystem.
func readOnlyRoot(c corev1.Container) bool {
	return c.SecurityContext != nil && c.SecurityContext.ReadOnlyRootFilesystem != nil && *c.SecurityContext.ReadOnlyRootFilesystem
}

// volumes creates the Pod's volumes under scratch and returns volume name → host directory.
func (r *PodRunner) volumes(scratch string, pod *corev1.Pod, fsGroup int64) (map[string]string, error) {
	vols := map[string]string{}
	gid := -1
	if fsGroup >= 0 {
		gid = int(fsGroup)
	}
	for _, v := range pod.Spec.Volumes {
		dir := filepath.Join(scratch, "volumes", v.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		switch {
		case v.EmptyDir != nil:
			if err := os.Chown(dir, 0, gid); err != nil {
				return nil, err
			}
			if err := os.Chmod(dir, 0o777|os.ModeSetgid); err != nil {
				return nil, err
			}
		case v.Secret != nil:
			data, ok := r.Secrets[v.Secret.SecretName]
			if !ok {
				return nil, fmt.Errorf("pod runner: secret %q (volume %s) not found", v.Secret.SecretName, v.Name)
			}
			mode := os.FileMode(0o644)
			if v.Secret.DefaultMode != nil {
				mode = os.FileMode(*v.Secret.DefaultMode)
			}
			files := map[string]string{} // path → key
			if len(v.Secret.Items) == 0 {
				for k := range data {
					files[k] = k
				}
			}
			for _, it := range v.Secret.Items {
				files[it.Path] = it.Key
			}
			for p, k := range files {
				b, ok := data[k]
				if !ok {
					return nil, fmt.Errorf("pod runner: secret %q has no key %q", v.Secret.SecretName, k)
				}
				f := filepath.Join(dir, filepath.FromSlash(p))
				if err := os.WriteFile(f, b, mode); err != nil {
					return nil, err
				}
				if err := os.Chown(f, 0, gid); err != nil {
					return nil, err
				}
				if err := os.Chmod(f, mode); err != nil {
					return nil, err
				}
			}
		default:
			return nil, fmt.Errorf("pod runner: volume %s: only emptyDir and secret volumes are supported", v.Name)
		}
		vols[v.Name] = dir
	}
	return vols, nil
}

// containerArgs returns bubblewrap's arguments for c up to the command.
func containerArgs(pod *corev1.Pod, c corev1.Container, img LocalImage, scratch string, vols map[string]string) ([]string, error) {
	a := []string{"--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
		"--unshare-cgroup-try", "--hostname", pod.Name}
	a = append(a, hostRootArgs("/")...)
	a = append(a,
		"--ro-bind", filepath.Join(scratch, "passwd"), "/etc/passwd",
		"--ro-bind", filepath.Join(scratch, "group"), "/etc/group",
		"--proc", "/proc",
		"--dev", "/dev",
	)
	ro := readOnlyRoot(c)
	if ro {
		// The image's /tmp on a read-only root: there, and writable by nobody; a volume
		// mounted at /tmp (below) replaces it.
		a = append(a, "--perms", "0755", "--dir", "/tmp")
	} else {
		a = append(a, "--perms", "1777", "--tmpfs", "/tmp")
	}
	paths := make([]string, 0, len(img.Files))
	for p := range img.Files {
		paths = append(paths, p)
	}
	sort.Strings(paths) // parents before what is bound inside them
	for _, p := range paths {
		a = append(a, parentDirs(p)...)
		a = append(a, "--ro-bind", img.Files[p], p)
	}
	mounts := append([]corev1.VolumeMount(nil), c.VolumeMounts...)
	sort.SliceStable(mounts, func(i, j int) bool { return mounts[i].MountPath < mounts[j].MountPath })
	for _, m := range mounts {
		dir, ok := vols[m.Name]
		if !ok {
			return nil, fmt.Errorf("pod runner: container %s mounts unknown volume %s", c.Name, m.Name)
		}
		if m.SubPath != "" {
			return nil, fmt.Errorf("pod runner: container %s: subPath mounts are not supported", c.Name)
		}
		a = append(a, parentDirs(m.MountPath)...)
		if m.ReadOnly {
			a = append(a, "--ro-bind", dir, m.MountPath)
		} else {
			a = append(a, "--bind", dir, m.MountPath)
		}
	}
	wd := c.WorkingDir
	if wd == "" {
		wd = "/"
	} else {
		// Container runtimes create a missing working directory (runc does).
		a = append(a, parentDirs(wd)...)
		a = append(a, "--dir", wd)
	}
	if ro {
		// Last: the root itself (bubblewrap's tmpfs, where the directories above live)
		// becomes read-only; the mounts on it keep their own flags.
		a = append(a, "--remount-ro", "/")
	}
	return append(a, "--chdir", wd, "--"), nil
}

// containerEnv is c's environment: PATH default, the image's env, HOSTNAME, then c.Env.
func containerEnv(pod *corev1.Pod, c corev1.Container, img LocalImage) ([]string, error) {
	env := map[string]string{"PATH": buildpack.RunImagePath}
	for _, kv := range img.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	env["HOSTNAME"] = pod.Name
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			return nil, fmt.Errorf("pod runner: container %s: env %s uses valueFrom, which is not supported", c.Name, e.Name)
		}
		env[e.Name] = e.Value
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out, nil
}

// LocalBuilderImage lays out, in the empty directory dir, a CNB builder image's /cnb for
// PodRunner, as buildpack.Local lays it out for its builds (buildpack.WriteCNB): buildpacks
// (buildpack.BuiltinBuildpacks plus extra), order.toml (nil order: buildpack.DefaultOrder()),
// run.toml naming runImage, and the lifecycle and launcher binaries from the tools directory
// with the phase names linked to the lifecycle; plus the Go toolchain goRoot at
// buildpack.GoRootPath for the kpush/go buildpack. The result's Env puts GoRootPath/bin on PATH.
func LocalBuilderImage(dir string, extra []fs.FS, order []buildpack.Group, runImage, goRoot string) (LocalImage, error) {
	lifecycle, err := tools.Path("lifecycle")
	if err != nil {
		return LocalImage{}, err
	}
	launcher, err := tools.Path("launcher")
	if err != nil {
		return LocalImage{}, err
	}
	cnb := filepath.Join(dir, "cnb")
	if order == nil {
		order = buildpack.DefaultOrder()
	}
	if err := buildpack.WriteCNB(cnb, append(buildpack.BuiltinBuildpacks(), extra...), order, runImage); err != nil {
		return LocalImage{}, fmt.Errorf("writing local builder: %w", err)
	}
	img := LocalImage{
		Env: []string{"PATH=" + buildpack.GoRootPath + "/bin:" + buildpack.RunImagePath},
		Files: map[string]string{
			"/cnb":                     cnb,
			"/cnb/lifecycle/lifecycle": lifecycle,
			"/cnb/lifecycle/launcher":  launcher,
		},
	}
	if goRoot != "" {
		img.Files[buildpack.GoRootPath] = goRoot
	}
	return img, nil
}

// hostDirs are the host's top-level entries bound read-only (or re-created as symlinks when
// they are symlinks, as with merged /usr).
var hostDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"}

// hostRootArgs returns bubblewrap arguments binding root's /usr, /etc, ... (hostDirs)
// read-only at the same paths, re-creating top-level symlinks, plus resolv.conf's target when
// it lies outside /etc.
func hostRootArgs(root string) []string {
	var a []string
	for _, d := range hostDirs {
		hp := filepath.Join(root, d)
		fi, err := os.Lstat(hp)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(hp); err == nil {
				a = append(a, "--symlink", target, d)
			}
		case fi.IsDir():
			a = append(a, "--ro-bind", hp, d)
		}
	}
	// A resolv.conf that is a symlink (systemd-resolved) points outside /etc: bind its target.
	if fi, err := os.Lstat(filepath.Join(root, "etc/resolv.conf")); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if target, err := filepath.EvalSymlinks(filepath.Join(root, "etc/resolv.conf")); err == nil && !strings.HasPrefix(target, filepath.Join(root, "etc")+"/") {
			rel := strings.TrimPrefix(target, strings.TrimSuffix(root, "/"))
			a = append(a, parentDirs(rel)...)
			a = append(a, "--ro-bind", target, rel)
		}
	}
	return a
}

// parentDirs returns bwrap arguments creating p's parent directories (not p) with mode 0755.
func parentDirs(p string) []string {
	var a []string
	dir := filepath.Dir(p)
	if dir == "/" || dir == "." {
		return nil
	}
	a = append(a, parentDirs(dir)...)
	return append(a, "--perms", "0755", "--dir", dir)
}
