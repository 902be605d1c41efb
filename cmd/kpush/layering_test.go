package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The packages depend one way: cmd → receiver/commands → receiver → state, gitserver,
// buildpack, deployer, internal/…; nothing below the receiver imports it or the commands,
// and the app state is the pipeline's alone (the git server, builders and deployers do not
// reach into it).
func TestPackagesDependOneWay(t *testing.T) {
	const mod = "kpush.dev/kpush/"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	above := map[string][]string{ // package → what may import it (prefixes)
		mod + "receiver/commands": {mod + "cmd/", mod + "receiver/commands", mod + "test"},
		mod + "receiver":          {mod + "cmd/", mod + "receiver", mod + "test"},
		mod + "state":             {mod + "cmd/", mod + "receiver", mod + "state", mod + "test"},
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, deps := f[0], f[1:]
		checked++
		for _, d := range deps {
			allowed, guarded := above[d]
			if !guarded {
				continue
			}
			ok := false
			for _, a := range allowed {
				if strings.HasPrefix(pkg, a) {
					ok = true
				}
			}
			if !ok {
				t.Errorf("%s imports %s, which sits above it", pkg, d)
			}
		}
	}
	if checked < 15 {
		t.Fatalf("go list listed only %d packages", checked)
	}
}
