package buildpack

import (
	"kpush.dev/kpush/internal/sandbox"

	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/google/go-containerregistry/pkg/name"
)

func TestLifecycleError(t *testing.T) {
	tests := []struct {
		code     int
		detail   string
		kind     error
		msg      string
		wantHint bool
	}{
		{20, "failed to detect: no buildpacks participating", ErrDetect, "no buildpack could build this app", true},
		{21, "", ErrDetect, "no buildpack could build this app (a buildpack's detect step failed with an error, see above)", true},
		{51, "failed to build: exit status 1", ErrBuild, "build failed: see the buildpack output above", false},
		{52, "", ErrBuild, "build failed: see the buildpack output above", false},
		{32, "boom", ErrExport, "publishing the image to r/x failed: boom", true},
		{62, "failed to export: saving image", ErrExport, "publishing the image to r/x failed: failed to export: saving image", true},
		{1, "failed to initialize analyzer: validating registry read access", ErrExport, "publishing the image to r/x failed: failed to initialize analyzer: validating registry read access", true},
		{42, "untar", ErrLifecycle, "restoring the build cache failed: untar", true},
		{11, "incompatible platform API", ErrLifecycle, "the build system failed (lifecycle exit code 11): incompatible platform API", false},
		{-1, "", ErrLifecycle, "the build system failed (lifecycle exit code -1)", false},
	}
	for _, tt := range tests {
		cause := errors.New("exit status")
		e := lifecycleError(tt.code, tt.detail, "r/x", cause)
		if !errors.Is(e, tt.kind) {
			t.Errorf("code %d: kind %v, want %v", tt.code, e.Kind, tt.kind)
		}
		if !errors.Is(e, cause) {
			t.Errorf("code %d: cause not reachable with errors.Is", tt.code)
		}
		if e.Error() != tt.msg {
			t.Errorf("code %d: msg %q, want %q", tt.code, e.Error(), tt.msg)
		}
		if (e.Hint != "") != tt.wantHint {
			t.Errorf("code %d: hint %q, want hint: %v", tt.code, e.Hint, tt.wantHint)
		}
		for _, other := range []error{ErrDetect, ErrBuild, ErrExport, ErrLifecycle} {
			if other != tt.kind && errors.Is(e, other) {
				t.Errorf("code %d: also matches %v", tt.code, other)
			}
		}
	}
}

func TestLineWriter(t *testing.T) {
	tests := []struct {
		name    string
		writes  []string
		want    string
		lastErr string
	}{
		{"lines", []string{"a\nb\n"}, "a\nb\n", ""},
		{"split across writes", []string{"hel", "lo\nwor", "ld"}, "hello\nworld\n", ""},
		{"crlf", []string{"a\r\nb\r", "\nc"}, "a\nb\nc\n", ""},
		{"progress carriage returns", []string{"10%\r20%\r", "done\n"}, "10%\n20%\ndone\n", ""},
		{"colours and cursor", []string{"\x1b[31;1mred\x1b[0m \x1b[2K\x1b[1Agone\n"}, "red gone\n", ""},
		{"osc title", []string{"\x1b]0;title\x07text\n"}, "text\n", ""},
		{"control chars kept tab", []string{"a\tb\x00c\x07\n"}, "a\tbc\n", ""},
		{"empty lines kept", []string{"\n\n"}, "\n\n", ""},
		{"last error", []string{"ERROR: one\nok\nERROR: failed to export: x\n"}, "ERROR: one\nok\nERROR: failed to export: x\n", "failed to export: x"},
		{"no newline at end", []string{"tail\r"}, "tail\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			s := &lineSink{out: &out}
			w := &lineWriter{sink: s}
			for _, p := range tt.writes {
				if n, err := w.Write([]byte(p)); n != len(p) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			w.Flush()
			if out.String() != tt.want {
				t.Errorf("out = %q, want %q", out.String(), tt.want)
			}
			if s.lastError() != tt.lastErr {
				t.Errorf("lastError = %q, want %q", s.lastError(), tt.lastErr)
			}
		})
	}
}

func TestPreviousImage(t *testing.T) {
	digest := "@sha256:" + strings.Repeat("ab", 32)
	tests := []struct {
		name, prev      string
		ref, noPrevious string
		wantErr         bool
	}{
		{"first build", "", "", msgFirstBuild, false},
		{"by digest", "127.0.0.1:5000/kpush/demo" + digest, "127.0.0.1:5000/kpush/demo" + digest, "", false},
		{"by tag", "127.0.0.1:5000/kpush/demo:20261130-000000-abcdef", "127.0.0.1:5000/kpush/demo:20261130-000000-abcdef", "", false},
		{"other registry", "127.0.0.1:5001/kpush/demo" + digest, "", msgPreviousElsewhere, false},
		{"other app", "127.0.0.1:5000/kpush/other" + digest, "", msgPreviousElsewhere, false},
		{"unparsable", "127.0.0.1:5000/kpush/demo@sha256:short", "", "", true},
	}
	repo, err := name.NewRepository("127.0.0.1:5000/kpush/demo")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ref, noPrevious, err := previousImage(repo, tt.prev)
			if (err != nil) != tt.wantErr || ref != tt.ref || noPrevious != tt.noPrevious {
				t.Errorf("previousImage(%q) = %q, %q, %v; want %q, %q, error %v", tt.prev, ref, noPrevious, err, tt.ref, tt.noPrevious, tt.wantErr)
			}
		})
	}
}

// TestLineSinkNoPrevious: the analyzer's "not found" line for the build's own fresh tag is
// replaced; the same line for any other image (a previous image that is gone) is kept.
func TestLineSinkNoPrevious(t *testing.T) {
	fresh := "127.0.0.1:5000/kpush/demo:20261130-000000-abcdef"
	tests := []struct {
		name, noPrevious, in, want string
	}{
		{"fresh tag replaced", msgFirstBuild, `Image with name "` + fresh + `" not found`, msgFirstBuild},
		{"other image kept", msgFirstBuild, `Image with name "127.0.0.1:5000/kpush/demo@sha256:00" not found`, `Image with name "127.0.0.1:5000/kpush/demo@sha256:00" not found`},
		{"previous image passed: kept", "", `Image with name "` + fresh + `" not found`, `Image with name "` + fresh + `" not found`},
		{"other lines kept", msgFirstBuild, "===> ANALYZING", "===> ANALYZING"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			w := &lineWriter{sink: &lineSink{out: &out, freshImage: fresh, noPrevious: tt.noPrevious}}
			w.Write([]byte(tt.in + "\n"))
			if got := strings.TrimSuffix(out.String(), "\n"); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLineWriterLongLine(t *testing.T) {
	var out bytes.Buffer
	w := &lineWriter{sink: &lineSink{out: &out}}
	w.Write(bytes.Repeat([]byte("x"), 3*maxLine+5))
	w.Write([]byte("\n"))
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 4 || len(lines[0]) != maxLine || len(lines[3]) != 5 {
		t.Errorf("got %d lines, first %d bytes", len(lines), len(lines[0]))
	}
}

func TestRenderOrder(t *testing.T) {
	versions := map[string]string{GoID: "0.1.0", ProcfileID: "0.1.0", "test/probe": "0.0.1"}
	tests := []struct {
		name    string
		order   []Group
		want    string
		wantErr string
	}{
		{"default", DefaultOrder(),
			"[[order]]\n\n  [[order.group]]\n    id = \"kpush/go\"\n    version = \"0.1.0\"\n\n  [[order.group]]\n    id = \"kpush/procfile\"\n    version = \"0.1.0\"\n    optional = true\n\n[[order]]\n\n  [[order.group]]\n    id = \"kpush/procfile\"\n    version = \"0.1.0\"\n", ""},
		{"unknown buildpack", []Group{{{ID: "nope/x"}}}, "", `order names buildpack "nope/x"`},
		{"wrong version", []Group{{{ID: GoID, Version: "9"}}}, "", "builder has version 0.1.0"},
		{"empty", []Group{}, "", "order is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := renderOrder(tt.order, versions)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("order.toml =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

func TestWriteBuilder(t *testing.T) {
	dir := t.TempDir()
	if err := writeBuilder(dir, BuiltinBuildpacks(), DefaultOrder(), "r/run@sha256:abc"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"kpush_go/0.1.0/bin/build", "kpush_go/0.1.0/bin/detect", "kpush_procfile/0.1.0/bin/build", "kpush_procfile/0.1.0/bin/detect"} {
		fi, err := os.Stat(filepath.Join(dir, "buildpacks", p))
		if err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v, mode %v; want 0755", p, err, fi)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, "buildpacks", "kpush_go", "0.1.0", "buildpack.toml"))
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("buildpack.toml: %v %v", err, fi)
	}
	var run struct {
		Images []struct{ Image string } `toml:"images"`
	}
	if _, err := toml.DecodeFile(filepath.Join(dir, "run.toml"), &run); err != nil || len(run.Images) != 1 || run.Images[0].Image != "r/run@sha256:abc" {
		t.Errorf("run.toml = %+v, %v", run, err)
	}
	// Descriptors of the built-in buildpacks use Buildpack API 0.10.
	for _, bp := range BuiltinBuildpacks() {
		d, err := readDescriptor(bp)
		if err != nil || d.API != "0.10" {
			t.Errorf("descriptor %+v, %v; want api 0.10", d, err)
		}
	}
	if err := writeBuilder(t.TempDir(), []fs.FS{os.DirFS(t.TempDir())}, nil, "x"); err == nil {
		t.Errorf("a buildpack without buildpack.toml was accepted")
	}
}

func TestDefaultRunImageRepository(t *testing.T) {
	tests := map[string]string{
		"127.0.0.1:5000/kpush/demo": "127.0.0.1:5000/kpush/kpush.run",
		"127.0.0.1:5000/demo":       "127.0.0.1:5000/kpush.run",
		"reg.example/a/b/demo":      "reg.example/a/b/kpush.run",
	}
	for in, want := range tests {
		got, err := DefaultRunImageRepository(in)
		if err != nil || got != want {
			t.Errorf("DefaultRunImageRepository(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := DefaultRunImageRepository("UPPER/case"); err == nil {
		t.Errorf("invalid repository accepted")
	}
}

func TestRegistryAuth(t *testing.T) {
	if got := registryAuth("", "pw", "127.0.0.1:5000/a"); got != "" {
		t.Errorf("no user: %q", got)
	}
	got := registryAuth("u", "p:w", "127.0.0.1:5000/kpush/a", "127.0.0.1:5000/kpush/kpush.run@sha256:"+strings.Repeat("a", 64), "reg.example/x")
	var m map[string]string
	if err := json.Unmarshal([]byte(got), &m); err != nil {
		t.Fatal(err)
	}
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("u:p:w"))
	if len(m) != 2 || m["127.0.0.1:5000"] != basic || m["reg.example"] != basic {
		t.Errorf("CNB_REGISTRY_AUTH = %s", got)
	}
}

// Each phase's sandbox gets exactly what that phase needs: the registry credentials and the
// host's network only where no buildpack code runs, buildpacks an isolated network, and the
// host's /etc nowhere.
func TestBuildSandboxPhases(t *testing.T) {
	b := &buildSandbox{build: "/b", source: "/src", cache: "/c", goRoot: "/go", lifecycle: "/t/lifecycle", launcher: "/t/launcher",
		ids: sandbox.IDRange{Base: sandbox.FirstHostID}, auth: `{"r:1":"Basic x"}`}
	type want struct {
		network            sandbox.Network
		creds              bool
		mounts, notMounted []string // "dest" or "dest rw"
	}
	wants := map[string]want{
		"analyzer": {sandbox.NetHost, true, []string{"/layers rw", "/kpush rw", "/cnb", "/etc/passwd", "/etc/resolv.conf"}, []string{"/workspace", "/platform", "/home/cnb", "/cache", "/opt/kpush/go", "/kpush/analyzed.toml"}},
		"detector": {sandbox.NetNone, false, []string{"/workspace", "/platform", "/home/cnb rw", "/opt/kpush/go", "/layers rw", "/kpush/analyzed.toml"}, []string{"/cache", "/kpush", "/kpush/analyzed.toml rw"}},
		"restorer": {sandbox.NetHost, true, []string{"/cache rw", "/layers rw", "/kpush rw"}, []string{"/workspace", "/platform", "/home/cnb"}},
		"builder":  {sandbox.NetOutbound, false, []string{"/workspace rw", "/platform", "/home/cnb rw", "/opt/kpush/go", "/kpush/analyzed.toml"}, []string{"/cache", "/kpush", "/kpush/analyzed.toml rw"}},
		"exporter": {sandbox.NetHost, true, []string{"/workspace", "/cache rw", "/layers rw", "/kpush rw"}, []string{"/platform", "/home/cnb"}},
	}
	phs := phases("r:1/app:tag", "r:1/app@sha256:ab", []string{"r:1"})
	if len(phs) != len(wants) {
		t.Fatalf("%d phases, want %d", len(phs), len(wants))
	}
	for _, ph := range phs {
		w, ok := wants[ph.name]
		if !ok {
			t.Fatalf("unexpected phase %s", ph.name)
		}
		s := b.spec(ph)
		mounted := map[string]bool{}
		for _, m := range s.Mounts {
			if m.Source == "/etc" || m.Dest == "/etc" {
				t.Errorf("%s: mounts the host's /etc", ph.name)
			}
			k := m.Dest
			if m.Writable {
				k += " rw"
			}
			mounted[k] = true
			mounted[m.Dest] = true
		}
		for _, d := range w.mounts {
			if !mounted[d] {
				t.Errorf("%s: %q not mounted (mounts %v)", ph.name, d, s.Mounts)
			}
		}
		for _, d := range w.notMounted {
			if mounted[d] {
				t.Errorf("%s: %q mounted, want not", ph.name, d)
			}
		}
		if s.Network != w.network {
			t.Errorf("%s: network %v, want %v", ph.name, s.Network, w.network)
		}
		env := strings.Join(s.Env, "\n")
		if got := strings.Contains(env, "CNB_REGISTRY_AUTH="); got != w.creds {
			t.Errorf("%s: registry credentials %v, want %v", ph.name, got, w.creds)
		}
		for _, e := range []string{"CNB_PLATFORM_API=0.14", "CNB_USER_ID=1000", "CNB_GROUP_ID=1000"} {
			if !strings.Contains(env, e) {
				t.Errorf("%s: env lacks %s", ph.name, e)
			}
		}
		if s.UID != CNBUserID || s.GID != CNBGroupID || s.HostIDs != b.ids || !s.NewSession {
			t.Errorf("%s: runs as %d:%d on %v (new session %v)", ph.name, s.UID, s.GID, s.HostIDs, s.NewSession)
		}
		if s.Argv[0] != "/cnb/lifecycle/"+ph.name {
			t.Errorf("%s: argv %v", ph.name, s.Argv)
		}
	}
	args := func(name string) string {
		for _, ph := range phs {
			if ph.name == name {
				return strings.Join(ph.args, " ")
			}
		}
		return ""
	}
	for name, wantArgs := range map[string][]string{
		"analyzer": {"-previous-image=r:1/app@sha256:ab", "-insecure-registry=r:1", "-run=/cnb/run.toml"},
		"restorer": {"-cache-dir=/cache", "-insecure-registry=r:1"},
		"exporter": {"-cache-dir=/cache", "-report=/kpush/report.toml", "-launcher=/cnb/lifecycle/launcher", "-insecure-registry=r:1"},
	} {
		for _, w := range wantArgs {
			if !strings.Contains(args(name), w) {
				t.Errorf("%s args lack %q: %s", name, w, args(name))
			}
		}
	}
	for _, name := range []string{"analyzer", "exporter"} {
		if !strings.HasSuffix(args(name), " r:1/app:tag") {
			t.Errorf("%s: image not last: %s", name, args(name))
		}
	}
	for _, ph := range phases("r/app:tag", "", nil) {
		if strings.Contains(strings.Join(ph.args, " "), "-previous-image") {
			t.Errorf("first build passes -previous-image to %s", ph.name)
		}
	}
}

func TestReadReportDigest(t *testing.T) {
	good := "sha256:" + strings.Repeat("ab", 32)
	outside := filepath.Join(t.TempDir(), "outside.toml")
	os.WriteFile(outside, []byte("[image]\ndigest = \""+good+"\"\n"), 0o644)
	tests := []struct {
		name   string
		report string // "" with link: report.toml is a symlink to link
		link   string
		want   string
	}{
		{name: "digest", report: "[image]\ntags = [\"r/a:t\"]\ndigest = \"" + good + "\"\nmanifest-size = 1\n", want: good},
		{name: "short digest", report: "[image]\ndigest = \"sha256:short\"\n"},
		{name: "no image", report: "[build]\n"},
		{name: "not toml", report: "not toml ["},
		{name: "too big", report: "[image]\ndigest = \"" + good + "\"\n#" + strings.Repeat("x", maxControlFile)},
		// The exporter writes where a build left a symlink; kpush must not follow it.
		{name: "symlink to a good report", link: outside},
		{name: "symlink to /dev/zero", link: "/dev/zero"},
		{name: "missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			build := t.TempDir()
			os.Mkdir(filepath.Join(build, "control"), 0o700)
			p := filepath.Join(build, "control", "report.toml")
			switch {
			case tt.link != "":
				os.Symlink(tt.link, p)
			case tt.report != "":
				os.WriteFile(p, []byte(tt.report), 0o644)
			}
			got, err := readReportDigest(build)
			if got != tt.want || (tt.want == "") != (err != nil) {
				t.Errorf("%q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestValidateRequest(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		req     Request
		wantErr string
	}{
		{Request{App: "demo", SourceDir: dir}, ""},
		{Request{App: "demo-2", SourceDir: dir, Env: map[string]string{"GOFLAGS": "-x", "_a1": ""}}, ""},
		{Request{App: "Demo", SourceDir: dir}, "DNS-1035"},
		{Request{App: "../x", SourceDir: dir}, "DNS-1035"},
		{Request{App: "", SourceDir: dir}, "DNS-1035"},
		{Request{App: "demo", SourceDir: filepath.Join(dir, "nope")}, "not a directory"},
		{Request{App: "demo", SourceDir: dir, Env: map[string]string{"../x": "y"}}, "invalid"},
		{Request{App: "demo", SourceDir: dir, Env: map[string]string{"A=B": "y"}}, "invalid"},
	}
	for _, tt := range tests {
		err := validateRequest(tt.req)
		if (tt.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%+v: err = %v, want %q", tt.req, err, tt.wantErr)
		}
	}
}

func TestNewTag(t *testing.T) {
	now := time.Date(2026, 11, 30, 5, 6, 7, 0, time.UTC)
	a, b := newTag(now), newTag(now)
	if !regexp.MustCompile(`^20261130-050607-[0-9a-f]{6}$`).MatchString(a) || a == b {
		t.Errorf("tags %q %q", a, b)
	}
}

// runBuildpackScript runs a built-in buildpack's bin/build on the host (as the lifecycle
// would: cwd = app, args = layers platform plan) and returns the layers dir and output.
func runBuildpackScript(t *testing.T, bp string, app string, env []string) (string, string, error) {
	t.Helper()
	bpDir := t.TempDir()
	for _, fsys := range BuiltinBuildpacks() {
		d, _ := readDescriptor(fsys)
		if d.Buildpack.ID == bp {
			if err := copyFS(bpDir, fsys); err != nil {
				t.Fatal(err)
			}
		}
	}
	layers := t.TempDir()
	cmd := exec.Command(filepath.Join(bpDir, "bin", "build"), layers, t.TempDir(), filepath.Join(t.TempDir(), "plan.toml"))
	cmd.Dir = app
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return layers, string(out), err
}

type launchTOML struct {
	Processes []struct {
		Type    string   `toml:"type"`
		Command []string `toml:"command"`
		Default bool     `toml:"default"`
	} `toml:"processes"`
}

func readLaunch(t *testing.T, layers string) launchTOML {
	t.Helper()
	var l launchTOML
	if _, err := toml.DecodeFile(filepath.Join(layers, "launch.toml"), &l); err != nil {
		t.Fatalf("launch.toml: %v", err)
	}
	return l
}

func TestProcfileBuildpackScript(t *testing.T) {
	tests := []struct {
		name     string
		procfile string
		want     []string // "type|command|default"
		wantErr  string
	}{
		{"web", "web: ./server --port $PORT\n", []string{"web|./server --port $PORT|true"}, ""},
		{"crlf comments blanks", "# c\r\n\r\nweb:  a  \r\nworker:b\r\n", []string{"web|a|true", "worker|b|false"}, ""},
		{"no final newline", "web: a", []string{"web|a|true"}, ""},
		{"quotes and backslashes", `web: echo "hi" \n 'x'` + "\n", []string{`web|echo "hi" \n 'x'|true`}, ""},
		{"colon in command", "web: curl http://x:80/\n", []string{"web|curl http://x:80/|true"}, ""},
		{"repeated type keeps first", "web: a\nweb: b\n", []string{"web|a|true"}, ""},
		{"invalid lines skipped", "no colon\nbad type!: x\nempty:\nweb: ok\n", []string{"web|ok|true"}, ""},
		{"nothing usable", "# only a comment\n", nil, "declares no processes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := writeTree(t, map[string]string{"Procfile": tt.procfile})
			layers, out, err := runBuildpackScript(t, ProcfileID, app, nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(out, tt.wantErr) {
					t.Fatalf("err = %v, out %q; want failure with %q", err, out, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			var got []string
			for _, p := range readLaunch(t, layers).Processes {
				if len(p.Command) != 3 || p.Command[0] != "/bin/sh" || p.Command[1] != "-c" {
					t.Fatalf("command %q, want /bin/sh -c …", p.Command)
				}
				got = append(got, p.Type+"|"+p.Command[2]+"|"+map[bool]string{true: "true", false: "false"}[p.Default])
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("processes\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestGoBuildpackScriptMainPackage(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("go not on PATH")
	}
	gocache := t.TempDir() // shared, so only the first case compiles the runtime
	main := "package main\n\nfunc main() {}\n"
	lib := "package lib\n"
	tests := []struct {
		name    string
		files   map[string]string
		wantBin string // binary name under layers/app/bin
		wantPkg string
		wantErr string
	}{
		{"root main", map[string]string{"go.mod": "module example.com/demo\n", "main.go": main}, "demo", "(.)", ""},
		{"cmd/<base>", map[string]string{"go.mod": "module example.com/demo\n", "lib.go": lib, "cmd/demo/main.go": main, "cmd/other/main.go": main}, "demo", "(./cmd/demo)", ""},
		{"v2 module base", map[string]string{"go.mod": "module example.com/demo/v2\n", "lib.go": lib, "cmd/demo/main.go": main}, "demo", "(./cmd/demo)", ""},
		{"only cmd main", map[string]string{"go.mod": "module example.com/demo\n", "lib.go": lib, "cmd/server/main.go": main, "cmd/tool/lib.go": "package tool\n"}, "server", "(./cmd/server)", ""},
		{"two cmd mains", map[string]string{"go.mod": "module example.com/demo\n", "lib.go": lib, "cmd/a/main.go": main, "cmd/b/main.go": main}, "", "", "no main package to build"},
		{"library only", map[string]string{"go.mod": "module example.com/demo\n", "lib.go": lib}, "", "", "no main package to build"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := writeTree(t, tt.files)
			layers, out, err := runGoScript(t, app, gocache)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(out, tt.wantErr) {
					t.Fatalf("err = %v; want failure with %q\n%s", err, tt.wantErr, out)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if !strings.Contains(out, tt.wantPkg) {
				t.Errorf("output lacks %q:\n%s", tt.wantPkg, out)
			}
			bin := filepath.Join(layers, "app", "bin", tt.wantBin)
			if fi, err := os.Stat(bin); err != nil || fi.Mode()&0o111 == 0 {
				t.Errorf("binary %s: %v", bin, err)
			}
			l := readLaunch(t, layers)
			if len(l.Processes) != 1 || l.Processes[0].Type != "web" || !l.Processes[0].Default || strings.Join(l.Processes[0].Command, " ") != bin {
				t.Errorf("launch.toml = %+v", l)
			}
			var cacheLayer struct {
				Types struct{ Cache, Launch bool } `toml:"types"`
			}
			if _, err := toml.DecodeFile(filepath.Join(layers, "go-cache.toml"), &cacheLayer); err != nil || !cacheLayer.Types.Cache || cacheLayer.Types.Launch {
				t.Errorf("go-cache.toml: %+v %v", cacheLayer, err)
			}
		})
	}
}

// runGoScript runs kpush/go's bin/build with the go-cache layer pointing at a shared dir.
func runGoScript(t *testing.T, app, gocache string, env ...string) (string, string, error) {
	t.Helper()
	bpDir := t.TempDir()
	for _, fsys := range BuiltinBuildpacks() {
		if d, _ := readDescriptor(fsys); d.Buildpack.ID == GoID {
			copyFS(bpDir, fsys)
		}
	}
	layers := t.TempDir()
	if err := os.Symlink(gocache, filepath.Join(layers, "go-cache")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bpDir, "bin", "build"), layers, t.TempDir(), "plan.toml")
	cmd.Dir = app
	cmd.Env = append(append(os.Environ(), "GOFLAGS=", "GOPROXY=off"), env...)
	out, err := cmd.CombinedOutput()
	return layers, string(out), err
}

// An app's own -ldflags in GOFLAGS (build-env or project.toml) reaches the linker: the
// buildpack's default -ldflags would override it on the command line.
func TestGoScriptKeepsAppLdflags(t *testing.T) {
	app := writeTree(t, map[string]string{
		"go.mod":  "module example.com/ver\n",
		"main.go": "package main\n\nimport \"fmt\"\n\nvar version = \"dev\"\n\nfunc main() { fmt.Print(version) }\n",
	})
	for _, tt := range []struct {
		goflags, want string
	}{
		{"", "dev"},
		{"-ldflags=-X=main.version=1.2.3", "1.2.3"},
	} {
		layers, out, err := runGoScript(t, app, t.TempDir(), "GOFLAGS="+tt.goflags)
		if err != nil {
			t.Fatalf("GOFLAGS=%q: %v\n%s", tt.goflags, err, out)
		}
		got, err := exec.Command(filepath.Join(layers, "app", "bin", "ver")).Output()
		if err != nil || string(got) != tt.want {
			t.Errorf("GOFLAGS=%q: binary prints %q (%v), want %q", tt.goflags, got, err, tt.want)
		}
	}
}

func TestLockAppWaitsAndHonoursContext(t *testing.T) {
	l := &Local{DataDir: t.TempDir()}
	unlock, err := l.lockApp(context.Background(), "demo", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// Another app is not blocked.
	u2, err := l.lockApp(context.Background(), "other", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	u2()
	// The same app waits, says so, and gives up when ctx ends.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var out bytes.Buffer
	if _, err := l.lockApp(ctx, "demo", &out); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock: %v, want deadline exceeded", err)
	}
	if !strings.Contains(out.String(), "Waiting for another build of demo") {
		t.Errorf("output %q", out.String())
	}
	// A second Local on the same DataDir (another process, as far as flock can tell) waits too.
	other := &Local{DataDir: l.DataDir}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if _, err := other.lockApp(ctx2, "demo", io.Discard); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lock from another Local: %v, want deadline exceeded", err)
	}
	unlock()
	u3, err := other.lockApp(context.Background(), "demo", io.Discard)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	u3()
}
