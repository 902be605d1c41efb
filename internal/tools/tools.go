// Package tools finds the external binaries kpush runs beside itself: git, and the ones
// `make tools` builds (lifecycle, launcher, registry, bwrap, busybox, kube-apiserver, etcd).
package tools

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// EnvDir names the environment variable that points at the tools directory.
const EnvDir = "KPUSH_TOOLS"

// Dir returns the tools directory: $KPUSH_TOOLS, else the first ".tools/bin" found walking up
// from the kpush executable's directory and then from the working directory, else "".
func Dir() string {
	if d := os.Getenv(EnvDir); d != "" {
		return d
	}
	var starts []string
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, s := range starts {
		for d := s; ; d = filepath.Dir(d) {
			if fi, err := os.Stat(filepath.Join(d, ".tools", "bin")); err == nil && fi.IsDir() {
				return filepath.Join(d, ".tools", "bin")
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	return ""
}

// Path returns the absolute path of the tool name: from Dir() first, then $PATH.
// The error says which command installs it.
func Path(name string) (string, error) {
	if d := Dir(); d != "" {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found in %s=%q or $PATH: run `make tools`", name, EnvDir, Dir())
	}
	return filepath.Abs(p)
}
