package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Check tells whether this host can run sandboxes with every protection, and if not, what is
// missing and how to enable it: kpush refuses to start its runtime rather than run builds or
// apps with less. It checks the prerequisites, then starts one sandbox (running `true` from
// the host's /usr with network) to prove they work together.
func Check(ctx context.Context, ids IDRange) error {
	if os.Geteuid() != 0 {
		return errors.New("kpush must run as root to sandbox builds and apps: it maps each sandbox to unprivileged host ids of its own (run it with sudo)")
	}
	if n, err := readInt("/proc/sys/user/max_user_namespaces"); err == nil && n == 0 {
		return errors.New("user namespaces are disabled (user.max_user_namespaces = 0): enable them with `sysctl -w user.max_user_namespaces=15000`")
	}
	if n, err := readInt("/proc/sys/kernel/unprivileged_userns_clone"); err == nil && n == 0 {
		return errors.New("unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0): enable them with `sysctl -w kernel.unprivileged_userns_clone=1`")
	}
	if n, err := readInt("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"); err == nil && n != 0 {
		return errors.New("AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1): allow them with `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`")
	}
	if _, err := slirp4netnsPath(); err != nil {
		return err
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := Run(ctx, Spec{
		Argv:    []string{"/bin/true"},
		Env:     []string{"PATH=/usr/bin:/bin"},
		Mounts:  HostSystemMounts(),
		HostIDs: ids, UID: 1000, GID: 1000,
		Network: NetOutbound,
		Stdout:  &out, Stderr: &out,
	})
	if err != nil {
		return fmt.Errorf("a test sandbox failed (bubblewrap with user, network and PID namespaces, seccomp, slirp4netns): %w: %s",
			err, strings.TrimSpace(out.String()))
	}
	return nil
}

// HostSystemMounts are the host's /usr and its top-level companions (/bin, /lib, ... or their
// merged-/usr symlinks), read-only: the programs and libraries of a build sandbox, without
// the host's /etc.
func HostSystemMounts() []Mount {
	var m []Mount
	for _, d := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(d)
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			if t, err := os.Readlink(d); err == nil {
				m = append(m, Mount{Dest: d, Symlink: t})
			}
			continue
		}
		if fi.IsDir() {
			m = append(m, Mount{Source: d, Dest: d})
		}
	}
	return m
}

func readInt(p string) (int, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
