package local

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// identity is who the app runs as inside the sandbox.
type identity struct {
	uid, gid uint32
	home     string // from the image's /etc/passwd, "" when unknown
}

// resolveUser interprets an OCI image config User ("", "uid", "uid:gid", "name", "name:group",
// per the OCI image spec's config.User) against the image's own /etc/passwd and /etc/group.
// An empty User means root. A numeric uid without a group takes the passwd entry's primary
// group, else gid 0 (what container engines do).
func resolveUser(user, rootfs string) (identity, error) {
	if user == "" {
		return identity{home: "/root"}, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	passwd := readColonFile(rootfs, "etc/passwd")
	var id identity
	if n, err := strconv.ParseUint(u, 10, 32); err == nil {
		id.uid = uint32(n)
		id.gid = 0
		for _, f := range passwd {
			if len(f) >= 6 && f[2] == u {
				if gid, err := strconv.ParseUint(f[3], 10, 32); err == nil {
					id.gid = uint32(gid)
				}
				id.home = f[5]
				break
			}
		}
	} else {
		found := false
		for _, f := range passwd {
			if len(f) >= 6 && f[0] == u {
				uid, err1 := strconv.ParseUint(f[2], 10, 32)
				gid, err2 := strconv.ParseUint(f[3], 10, 32)
				if err1 != nil || err2 != nil {
					return identity{}, fmt.Errorf("image user %q: malformed /etc/passwd entry", user)
				}
				id = identity{uid: uint32(uid), gid: uint32(gid), home: f[5]}
				found = true
				break
			}
		}
		if !found {
			return identity{}, fmt.Errorf("image user %q is not in the image's /etc/passwd", user)
		}
	}
	if hasGroup {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil {
			id.gid = uint32(n)
		} else {
			found := false
			for _, f := range readColonFile(rootfs, "etc/group") {
				if len(f) >= 3 && f[0] == g {
					gid, err := strconv.ParseUint(f[2], 10, 32)
					if err != nil {
						return identity{}, fmt.Errorf("image group %q: malformed /etc/group entry", g)
					}
					id.gid = uint32(gid)
					found = true
					break
				}
			}
			if !found {
				return identity{}, fmt.Errorf("image group %q is not in the image's /etc/group", g)
			}
		}
	}
	return id, nil
}

// readColonFile reads a passwd/group style file of the rootfs through an os.Root, so no
// symlink (of /etc or of the file) leads outside it, and only a regular file of at most 1 MiB
// counts, opened without blocking (a missing, unreadable or special file is empty).
func readColonFile(rootfs, name string) [][]string {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return nil
	}
	defer root.Close()
	// Non-blocking: the app can make it a FIFO, and kpush must not wait on one.
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil
	}
	var out [][]string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Split(line, ":"))
	}
	return out
}
