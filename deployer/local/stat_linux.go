package local

import (
	"io/fs"
	"syscall"
)

type owner struct{ uid, gid uint32 }

func statOwner(fi fs.FileInfo) (owner, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return owner{}, false
	}
	return owner{st.Uid, st.Gid}, true
}
