package receiver

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/buildpacks/pack/pkg/project/types"
	"github.com/google/go-cmp/cmp"

	"kpush.dev/kpush/buildpack"
)

// writeTree writes files (slash path → content) under a fresh directory and returns it.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// treeFiles lists the files and directories under dir, slash-separated, directories with a
// trailing slash, sorted.
func treeFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if e.IsDir() {
			rel += "/"
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

var testBuildpacks = []buildpack.GroupEntry{
	{ID: buildpack.GoID, Version: "0.1.0"},
	{ID: buildpack.ProcfileID, Version: "0.1.0"},
	{ID: "kpush-test/probe", Version: "0.1.0"},
}

func TestApplyProject(t *testing.T) {
	app := map[string]string{"Procfile": "web: x\n", "public/index.html": "hi\n"}
	with := func(project string, extra ...string) map[string]string {
		m := map[string]string{"project.toml": project}
		for k, v := range app {
			m[k] = v
		}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		return m
	}
	tests := []struct {
		name      string
		files     map[string]string
		appEnv    map[string]string
		noList    bool // the builder cannot list its buildpacks (the kube builder)
		wantEnv   map[string]string
		wantGroup buildpack.Group
		wantFiles []string // nil: the tree is unchanged
		wantOut   []string // substrings of the output, in order; "" entries ignored
		wantErr   []string // substrings of the error; nil: no error
	}{
		{
			name:    "no project.toml changes nothing",
			files:   app,
			appEnv:  map[string]string{"A": "1"},
			wantEnv: map[string]string{"A": "1"},
		},
		{
			name: "schema 0.2 build env; build-env:set wins",
			files: with(`[_]
schema-version = "0.2"
id = "demo"

[[io.buildpacks.build.env]]
name = "A"
value = "from-project"

[[io.buildpacks.build.env]]
name = "B"
value = "b"
`),
			appEnv:  map[string]string{"A": "from-build-env", "C": "c"},
			wantEnv: map[string]string{"A": "from-build-env", "B": "b", "C": "c"},
			wantOut: []string{"-----> project.toml: 2 build env vars (build-env:set wins for A)\n"},
		},
		{
			name: "schema 0.2 deprecated [[io.buildpacks.env.build]] still read, as pack does",
			files: with(`[_]
schema-version = "0.2"
[[io.buildpacks.env.build]]
name = "OLD"
value = "yes"
`),
			wantEnv: map[string]string{"OLD": "yes"},
			wantOut: []string{"project.toml: 1 build env var\n"},
		},
		{
			name: "schema 0.1 [[build.env]], [build] exclude and [[build.buildpacks]]",
			files: with(`[project]
id = "demo"
[build]
exclude = ["*.log"]
[[build.env]]
name = "LEGACY"
value = "1"
[[build.buildpacks]]
id = "kpush/procfile"
version = "0.1.0"
`, "debug.log", "x", "public/a.log", "y"),
			wantEnv:   map[string]string{"LEGACY": "1"},
			wantGroup: buildpack.Group{{ID: buildpack.ProcfileID, Version: "0.1.0"}},
			wantFiles: []string{"Procfile", "project.toml", "public/", "public/index.html"},
			wantOut: []string{
				"No schema version declared in project.toml, defaulting to schema version 0.1",
				"-----> project.toml: 1 build env var\n",
				"-----> project.toml: buildpack group kpush/procfile\n",
				"-----> project.toml: exclude left out 2 files\n",
			},
		},
		{
			name: "exclude: names at any depth, directories, anchored paths, negation",
			files: with(`[_]
schema-version = "0.2"
[io.buildpacks]
exclude = ["*.log", "!keep.log", "secret/", "/top.txt", "docs/**/*.md", "# a comment", ""]
`, "a.log", "x", "keep.log", "x", "sub/b.log", "x", "secret/key", "x", "sub/secret/key", "x",
				"top.txt", "x", "sub/top.txt", "x", "docs/a/b/c.md", "x", "docs/readme.txt", "x"),
			wantEnv: map[string]string{},
			// docs/a/b/ stays, empty: no pattern excludes it, and pack keeps its entry.
			wantFiles: []string{"Procfile", "docs/", "docs/a/", "docs/a/b/", "docs/readme.txt", "keep.log", "project.toml", "public/",
				"public/index.html", "sub/", "sub/top.txt"},
			wantOut: []string{"-----> project.toml: exclude left out 6 files\n"},
		},
		{
			name: "include: only matching files stay; their directories with them",
			files: with(`[_]
schema-version = "0.2"
[io.buildpacks]
include = ["Procfile", "public/", "*.go"]
`, "README.md", "x", "cmd/main.go", "x", "cmd/notes.txt", "x", "secret/key", "x"),
			wantEnv:   map[string]string{},
			wantFiles: []string{"Procfile", "cmd/", "cmd/main.go", "public/", "public/index.html"},
			wantOut:   []string{"-----> project.toml: include left out 4 files\n"},
		},
		{
			name: "group of buildpacks the builder holds",
			files: with(`[_]
schema-version = "0.2"
[[io.buildpacks.group]]
id = "kpush-test/probe"
[[io.buildpacks.group]]
id = "kpush/procfile"
version = "0.1.0"
`),
			wantEnv:   map[string]string{},
			wantGroup: buildpack.Group{{ID: "kpush-test/probe"}, {ID: buildpack.ProcfileID, Version: "0.1.0"}},
			wantOut:   []string{"-----> project.toml: buildpack group kpush-test/probe, kpush/procfile\n"},
		},
		{
			name: "group naming an unknown buildpack",
			files: with(`[_]
schema-version = "0.2"
[[io.buildpacks.group]]
id = "heroku/nodejs"
`),
			wantErr: []string{"the builder has no buildpack heroku/nodejs",
				"available buildpacks: kpush/go@0.1.0, kpush/procfile@0.1.0, kpush-test/probe@0.1.0"},
		},
		{
			name: "group naming a version the builder lacks",
			files: with(`[_]
schema-version = "0.2"
[[io.buildpacks.group]]
id = "kpush/go"
version = "9.9.9"
`),
			wantErr: []string{"kpush/go@9.9.9 is not available; the builder has kpush/go@0.1.0"},
		},
		{
			name: "group naming a buildpack by uri",
			files: with(`[_]
schema-version = "0.2"
[[io.buildpacks.group]]
uri = "docker://example.com/bp:1"
`),
			wantErr: []string{"buildpack docker://example.com/bp:1 is given by uri", "available buildpacks: kpush/go@0.1.0"},
		},
		{
			name: "inline buildpack",
			files: with(`[_]
schema-version = "0.2"
[[io.buildpacks.group]]
id = "me/inline"
[io.buildpacks.group.script]
api = "0.10"
inline = "echo hi"
`),
			wantErr: []string{"buildpack me/inline is an inline script"},
		},
		{
			name: "pre group",
			files: with(`[_]
schema-version = "0.2"
[[io.buildpacks.pre.group]]
id = "kpush/go"
`),
			wantErr: []string{"pre and post buildpack groups are not supported"},
		},
		{
			name: "a builder that cannot list its buildpacks gets the group unchecked",
			files: with(`[_]
schema-version = "0.2"
[[io.buildpacks.group]]
id = "heroku/nodejs"
`),
			noList:    true,
			wantEnv:   map[string]string{},
			wantGroup: buildpack.Group{{ID: "heroku/nodejs"}},
			wantOut:   []string{"-----> project.toml: buildpack group heroku/nodejs\n"},
		},
		{
			name: "malformed TOML: pack's error and the line to fix",
			files: with(`[_]
schema-version = "0.2"
[io.buildpacks
exclude = ["x"]
`),
			wantErr: []string{"project.toml is not valid: expected '.' or ']' to end table name", "line 3: [io.buildpacks\n",
				"fix line 3 of project.toml"},
		},
		{
			name: "wrong type: the line of the key",
			files: with(`[_]
schema-version = "0.2"

[io.buildpacks]
exclude = "secret.txt"
`),
			wantErr: []string{"project.toml is not valid: ", "incompatible types", `line 5: exclude = "secret.txt"`, "fix line 5 of"},
		},
		{
			name: "include and exclude together: pack's own validation",
			files: with(`[_]
schema-version = "0.2"
[io.buildpacks]
include = ["a"]
exclude = ["b"]
`),
			wantErr: []string{"project.toml is not valid: project.toml: cannot have both include and exclude defined"},
		},
		{
			name:    "unknown schema version",
			files:   with("[_]\nschema-version = \"9.9\"\n"),
			wantErr: []string{"unknown project descriptor schema version 9.9"},
		},
		{
			name: "build env name a buildpack cannot receive",
			files: with(`[_]
schema-version = "0.2"
[[io.buildpacks.build.env]]
name = "1BAD"
value = "x"
`),
			wantErr: []string{`build env name "1BAD" is invalid`},
		},
		{
			name: "unknown keys: pack's warning reaches the pusher",
			files: with(`[_]
schema-version = "0.2"
[io.buildpacks]
exclud = ["typo"]
`),
			wantEnv: map[string]string{},
			wantOut: []string{"project.toml: warning: ", "- io.buildpacks.exclud"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeTree(t, tt.files)
			before := treeFiles(t, dir)
			var out strings.Builder
			got, err := applyProject(dir, tt.appEnv, testBuildpacks, !tt.noList, &out)
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("no error; output:\n%s", out.String())
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error lacks %q:\n%v", w, err)
					}
				}
				if after := treeFiles(t, dir); !slices.Equal(after, before) {
					t.Errorf("a refused project.toml changed the tree: %v", after)
				}
				return
			}
			if err != nil {
				t.Fatalf("error: %v\noutput:\n%s", err, out.String())
			}
			if diff := cmp.Diff(tt.wantEnv, got.Env); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantGroup, got.Group); diff != "" {
				t.Errorf("group (-want +got):\n%s", diff)
			}
			wantFiles := tt.wantFiles
			if wantFiles == nil {
				wantFiles = before
			}
			if diff := cmp.Diff(wantFiles, treeFiles(t, dir)); diff != "" {
				t.Errorf("files (-want +got):\n%s", diff)
			}
			rest := out.String()
			for _, w := range tt.wantOut {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Errorf("output lacks %q (in order):\n%s", w, out.String())
					break
				}
				rest = rest[i+len(w):]
			}
			if tt.wantOut == nil && out.Len() > 0 {
				t.Errorf("unexpected output:\n%s", out.String())
			}
		})
	}
}

// TestApplyProjectKeepsAppEnv checks that the app's build env map is not written to.
func TestApplyProjectKeepsAppEnv(t *testing.T) {
	dir := writeTree(t, map[string]string{"project.toml": "[_]\nschema-version = \"0.2\"\n[[io.buildpacks.build.env]]\nname = \"X\"\nvalue = \"1\"\n"})
	appEnv := map[string]string{"Y": "2"}
	if _, err := applyProject(dir, appEnv, nil, true, &strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"Y": "2"}, appEnv); diff != "" {
		t.Errorf("app env changed (-want +got):\n%s", diff)
	}
}

// TestProjectFilter checks single paths against include/exclude lists, the gitignore rules
// pack applies to each path of the build context.
func TestProjectFilter(t *testing.T) {
	tests := []struct {
		exclude, include []string
		path             string
		isDir            bool
		keep             bool
	}{
		{exclude: []string{"secret.txt"}, path: "secret.txt", keep: false},
		{exclude: []string{"secret.txt"}, path: "public/secret.txt", keep: false},
		{exclude: []string{"/secret.txt"}, path: "public/secret.txt", keep: true},
		{exclude: []string{"public/secret.txt"}, path: "public/secret.txt", keep: false},
		{exclude: []string{"public/secret.txt"}, path: "x/public/secret.txt", keep: true},
		{exclude: []string{"node_modules"}, path: "web/node_modules/a/b.js", keep: false},
		{exclude: []string{"build/"}, path: "build", isDir: false, keep: true}, // a file named build
		{exclude: []string{"build/"}, path: "build", isDir: true, keep: false},
		{exclude: []string{"build/"}, path: "build/out.bin", keep: false},
		{exclude: []string{"*.log", "!important.log"}, path: "logs/important.log", keep: true},
		{exclude: []string{"!important.log", "*.log"}, path: "logs/important.log", keep: false}, // the later pattern wins
		{exclude: []string{"**/testdata"}, path: "a/b/testdata/x", keep: false},
		{include: []string{"*.go"}, path: "cmd/main.go", keep: true},
		{include: []string{"*.go"}, path: "README.md", keep: false},
		{include: []string{"src/"}, path: "src/a/b.txt", keep: true},
		{include: []string{"src/", "!src/gen"}, path: "src/gen/x.go", keep: false},
	}
	for _, tt := range tests {
		d := types.Descriptor{Build: types.Build{Exclude: tt.exclude, Include: tt.include}}
		keep, _ := projectFilter(d)
		if got := keep(tt.path, tt.isDir); got != tt.keep {
			t.Errorf("exclude %q include %q: keep(%q, dir=%v) = %v, want %v", tt.exclude, tt.include, tt.path, tt.isDir, got, tt.keep)
		}
	}
	if keep, _ := projectFilter(types.Descriptor{}); keep != nil {
		t.Error("a descriptor without include or exclude filters files")
	}
}
