package local

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	passwd := readColonFile(filepath.Join(rootfs, "etc", "passwd"))
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
			for _, f := range readColonFile(filepath.Join(rootfs, "etc", "group")) {
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

// readColonFile reads a passwd/group style file of the rootfs without following symlinks out
// of it (a missing or unreadable file is empty).
func readColonFile(p string) [][]string {
	fi, err := os.Lstat(p)
	if err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	b, err := os.ReadFile(p)
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

// searchableBy reports whether uid/gid can traverse every directory from / down to dir, which
// bubblewrap needs when it runs as that user.
func searchableBy(dir string, uid, gid uint32) bool {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return false
		}
		st, ok := statOwner(fi)
		if !ok {
			return false
		}
		m := fi.Mode().Perm()
		switch {
		case st.uid == uid:
			if m&0o100 == 0 {
				return false
			}
		case st.gid == gid:
			if m&0o010 == 0 {
				return false
			}
		default:
			if m&0o001 == 0 {
				return false
			}
		}
		if filepath.Dir(d) == d {
			return true
		}
	}
}
