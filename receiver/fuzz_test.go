package receiver

import (
	"slices"
	"strings"
	"testing"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/internal/names"
	"kpush.dev/kpush/internal/term"
)

// FuzzValidEnvName checks the two env name rules against each other and names.IsEnv (which
// project.toml's build env uses): a build-env name is exactly a POSIX name, a config name is
// one that is not PORT or K_*, and a refusal is one printable line.
func FuzzValidEnvName(f *testing.F) {
	for _, s := range []string{"", "A", "_x", "PATH", "PORT", "K_SERVICE", "K_", "k_x", "1A", "A-B", "A=B",
		"A\n", "Ä", "A\x00", "PORT\n", "port"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		build, run := ValidBuildEnvName(name), ValidEnvName(name)
		if (build == nil) != names.IsEnv(name) {
			t.Fatalf("ValidBuildEnvName(%q) = %v, but names.IsEnv = %v", name, build, names.IsEnv(name))
		}
		reserved := name == "PORT" || strings.HasPrefix(name, "K_")
		if want := build == nil && !reserved; (run == nil) != want {
			t.Fatalf("ValidEnvName(%q) = %v; want accepted = %v", name, run, want)
		}
		for _, err := range []error{build, run} {
			if err != nil && (!term.Printable(err.Error()) || strings.Contains(err.Error(), "\n")) {
				t.Fatalf("env name %q: the error is not one printable line: %q", name, err)
			}
		}
	})
}

// FuzzApplyProject checks applyProject on any project.toml in a small tree: what it tells the
// pusher (its output and its error) is printable; a refused descriptor leaves the tree as it
// was; an accepted one gives a build env of names a buildpack can receive in which the app's
// build-env:set values win, a group of the builder's buildpacks, and a tree that only lost
// files (never gained or moved one).
func FuzzApplyProject(f *testing.F) {
	for _, s := range []string{
		"",
		"[_]\nschema-version = \"0.2\"\n[[io.buildpacks.build.env]]\nname = \"A\"\nvalue = \"1\"\n",
		"[_]\nschema-version = \"0.2\"\n[[io.buildpacks.build.env]]\nname = \"APP_WINS\"\nvalue = \"descriptor\"\n",
		"[_]\nschema-version = \"0.2\"\n[io.buildpacks]\nexclude = [\"public\", \"*.md\"]\n",
		"[_]\nschema-version = \"0.2\"\n[io.buildpacks]\ninclude = [\"Procfile\", \"src/\"]\n",
		"[_]\nschema-version = \"0.2\"\n[[io.buildpacks.group]]\nid = \"kpush/procfile\"\n",
		"[_]\nschema-version = \"0.2\"\n[[io.buildpacks.group]]\nuri = \"docker://evil\"\n",
		"[_]\nschema-version = \"0.2\"\n[[io.buildpacks.pre.group]]\nid = \"x\"\n",
		"[project]\nid = \"x\"\n[build]\nexclude = [\"README.md\"]\n[[build.env]]\nname = \"B\"\nvalue = \"2\"\n",
		"[_]\nschema-version = \"0.2\"\n[io.buildpacks]\nexclud = [\"typo\"]\n",
		"[_]\nschema-version = \"0.2\"\n[io.buildpacks]\nexclude = [\"!Procfile\", \"**\"]\n",
		"[_\nschema-version = 0.2\n",
		"[[io.buildpacks.build.env]]\nname = \"1BAD\"\n",
	} {
		f.Add(s)
	}
	appEnv := map[string]string{"APP_WINS": "app"}
	f.Fuzz(func(t *testing.T, project string) {
		dir := writeTree(t, map[string]string{
			"project.toml": project, "Procfile": "web: x\n", "README.md": "hi\n",
			"public/index.html": "hi\n", "src/main.go": "package main\n", "src/deep/x.txt": "x\n",
		})
		before := treeFiles(t, dir)
		var out strings.Builder
		pb, err := applyProject(dir, appEnv, testBuildpacks, true, &out)
		if !term.Printable(out.String()) {
			t.Fatalf("applyProject(%q) told the pusher %q: not printable", project, out.String())
		}
		after := treeFiles(t, dir)
		if err != nil {
			if !term.Printable(err.Error()) {
				t.Fatalf("applyProject(%q) error is not printable: %q", project, err)
			}
			if !slices.Equal(after, before) {
				t.Fatalf("applyProject(%q) refused it (%v) but changed the tree: %v, now %v", project, err, before, after)
			}
			return
		}
		for k := range pb.Env {
			if !names.IsEnv(k) {
				t.Fatalf("applyProject(%q) gave the build env name %q", project, k)
			}
		}
		if pb.Env["APP_WINS"] != "app" {
			t.Fatalf("applyProject(%q): APP_WINS = %q; the app's build-env:set value must win", project, pb.Env["APP_WINS"])
		}
		for _, e := range pb.Group {
			if !slices.ContainsFunc(testBuildpacks, func(b buildpack.GroupEntry) bool { return b.ID == e.ID }) {
				t.Fatalf("applyProject(%q) gave a group entry %+v the builder does not have", project, e)
			}
		}
		for _, p := range after {
			if !slices.Contains(before, p) {
				t.Fatalf("applyProject(%q) made %s: the tree was %v, now %v", project, p, before, after)
			}
		}
	})
}
