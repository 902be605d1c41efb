package buildpack

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"kpush.dev/kpush/internal/tools"
)

// harness is a real in-process registry on 127.0.0.1 and a Local with its own data dir.
type harness struct {
	reg   string // "127.0.0.1:port"
	local *Local
}

func requireTools(tb testing.TB, names ...string) {
	tb.Helper()
	for _, n := range names {
		if _, err := tools.Path(n); err != nil {
			tb.Fatalf("tool %s missing (run make tools): %v", n, err)
		}
	}
}

func newHarness(tb testing.TB) *harness {
	tb.Helper()
	requireTools(tb, "bwrap", "lifecycle", "launcher", "busybox")
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	tb.Cleanup(srv.Close)
	reg := strings.TrimPrefix(srv.URL, "http://")
	if !strings.HasPrefix(reg, "127.0.0.1:") {
		tb.Fatalf("registry listens on %s, want 127.0.0.1", reg)
	}
	l := &Local{DataDir: tb.TempDir()}
	if os.Getenv("KPUSH_TEST_BUILD_LOG") != "" {
		l.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return &harness{reg: reg, local: l}
}

// writeTree writes files (path → content) under a new temp dir and returns it.
func writeTree(tb testing.TB, files map[string]string) string {
	tb.Helper()
	dir := tb.TempDir()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			tb.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(p, "bin/") {
			mode = 0o755
		}
		if err := os.WriteFile(full, []byte(c), mode); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}

const goMainWeb = `package main

import (
	"fmt"
	"net/http"
	"os"
)

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello from goapp") })
	if err := http.ListenAndServe("127.0.0.1:"+os.Getenv("PORT"), nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
`

func goApp(tb testing.TB) string {
	return writeTree(tb, map[string]string{
		"go.mod":  "module example.com/goapp\n\ngo 1.22\n",
		"main.go": goMainWeb,
	})
}

func (h *harness) build(tb testing.TB, app, src string, env map[string]string) (Result, string, error) {
	tb.Helper()
	return h.buildReq(tb, Request{App: app, SourceDir: src, Image: h.reg + "/kpush/" + app, Env: env})
}

func (h *harness) buildReq(tb testing.TB, req Request) (Result, string, error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := h.local.Build(ctx, req, &out)
	if testing.Verbose() {
		tb.Logf("build output of %s:\n%s", req.App, out.String())
	}
	if strings.Contains(out.String(), "\x1b") {
		tb.Errorf("build output contains terminal escapes")
	}
	return res, out.String(), err
}

var digestRef = regexp.MustCompile(`^127\.0\.0\.1:\d+/kpush/[a-z0-9-]+@sha256:[0-9a-f]{64}$`)

// image fetches ref and checks what every kpush app image has.
func checkAppImage(tb testing.TB, ref string) (v1.Image, *v1.ConfigFile) {
	tb.Helper()
	if !digestRef.MatchString(ref) {
		tb.Fatalf("result image %q is not <repo>@sha256:<hex>", ref)
	}
	r, err := name.NewDigest(ref)
	if err != nil {
		tb.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		tb.Fatalf("resolving %s in the registry: %v", ref, err)
	}
	if d, _ := img.Digest(); d.String() != r.DigestStr() {
		tb.Fatalf("registry digest %s != result %s", d, r.DigestStr())
	}
	cf, err := img.ConfigFile()
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range []string{"io.buildpacks.lifecycle.metadata", "io.buildpacks.build.metadata"} {
		if cf.Config.Labels[l] == "" {
			tb.Errorf("image config lacks label %s", l)
		}
	}
	if got := strings.Join(cf.Config.Entrypoint, " "); got != "/cnb/process/web" {
		tb.Errorf("entrypoint = %q, want /cnb/process/web", got)
	}
	return img, cf
}

// buildMetadata is the part of the io.buildpacks.build.metadata label the tests read.
type buildMetadata struct {
	Processes []struct {
		Type        string   `json:"type"`
		Command     []string `json:"command"`
		BuildpackID string   `json:"buildpackID"`
	} `json:"processes"`
	Buildpacks []struct {
		ID string `json:"id"`
	} `json:"buildpacks"`
}

func readBuildMetadata(tb testing.TB, cf *v1.ConfigFile) buildMetadata {
	tb.Helper()
	var md buildMetadata
	if err := json.Unmarshal([]byte(cf.Config.Labels["io.buildpacks.build.metadata"]), &md); err != nil {
		tb.Fatalf("parsing io.buildpacks.build.metadata: %v", err)
	}
	return md
}

// fileFromImage returns the content of path (no leading slash) in img's flattened filesystem.
func fileFromImage(tb testing.TB, img v1.Image, path string) ([]byte, *tar.Header) {
	tb.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, nil
		}
		if err != nil {
			tb.Fatal(err)
		}
		if strings.TrimPrefix(h.Name, "/") == path {
			b, err := io.ReadAll(tr)
			if err != nil {
				tb.Fatal(err)
			}
			return b, h
		}
	}
}

func TestBuildGoApp(t *testing.T) {
	h := newHarness(t)
	src := goApp(t)

	res, out, err := h.build(t, "goapp", src, nil)
	if err != nil {
		t.Fatalf("cold build: %v\n%s", err, out)
	}
	img, cf := checkAppImage(t, res.Image)
	for _, want := range []string{"===> DETECTING", "kpush/go", "Go build cache: cold", "Building example.com/goapp (.)",
		"===> ANALYZING\n" + msgFirstBuild + "\n", "Adding layer 'kpush/go:app'"} {
		if !strings.Contains(out, want) {
			t.Errorf("cold build output lacks %q", want)
		}
	}
	if strings.Contains(out, "not found") {
		t.Errorf("first build output has a \"not found\" line:\n%s", out)
	}
	md := readBuildMetadata(t, cf)
	if len(md.Processes) != 1 || md.Processes[0].Type != "web" || md.Processes[0].BuildpackID != GoID ||
		md.Processes[0].Command[0] != "/layers/kpush_go/app/bin/goapp" {
		t.Errorf("processes = %+v, want web → /layers/kpush_go/app/bin/goapp from %s", md.Processes, GoID)
	}

	// The image really holds a working program: run its binary on the host (static, CGO off).
	bin, hdr := fileFromImage(t, img, "layers/kpush_go/app/bin/goapp")
	if bin == nil {
		t.Fatal("image lacks layers/kpush_go/app/bin/goapp")
	}
	if hdr.Uid != CNBUserID && hdr.Uid != 0 {
		t.Errorf("binary owned by uid %d", hdr.Uid)
	}
	checkServes(t, bin, "hello from goapp")

	// Warm, the way the receiver builds a release: same source, same app, the first build as
	// the previous image → cache layer restored, nothing recompiled, the unchanged launch
	// layers reused from the previous image (the first build said "Adding layer"), same digest.
	src2 := goApp(t)
	res2, out2, err := h.buildReq(t, Request{App: "goapp", SourceDir: src2, Image: h.reg + "/kpush/goapp", PreviousImage: res.Image})
	if err != nil {
		t.Fatalf("warm build: %v\n%s", err, out2)
	}
	checkAppImage(t, res2.Image)
	for _, want := range []string{`Restoring data for "kpush/go:go-cache" from cache`, "Go build cache: warm",
		`Restoring metadata for "kpush/go:app" from app image`,
		"Reusing layers from image '" + res.Image + "'", "Reusing layer 'kpush/go:app'", "Reused 1/1 app layer(s)"} {
		if !strings.Contains(out2, want) {
			t.Errorf("warm build output lacks %q", want)
		}
	}
	if strings.Contains(out2, "not found") || strings.Contains(out2, msgFirstBuild) || strings.Contains(out2, "Adding layer 'kpush/go:app'") {
		t.Errorf("warm build with a previous image did not find it:\n%s", out2)
	}
	if res2.Image != res.Image {
		t.Errorf("warm rebuild of identical source: digest %s, first build %s (want identical: the lifecycle normalises timestamps)", res2.Image, res.Image)
	}

	// Compile error: ErrBuild, the compiler's message in the output.
	bad := writeTree(t, map[string]string{
		"go.mod":  "module example.com/goapp\n\ngo 1.22\n",
		"main.go": "package main\n\nfunc main() { nope() }\n",
	})
	_, out3, err := h.build(t, "goapp", bad, nil)
	var be *Error
	if !errors.Is(err, ErrBuild) || !errors.As(err, &be) {
		t.Fatalf("compile error: err = %v, want ErrBuild\n%s", err, out3)
	}
	if be.ExitCode != 51 || be.Error() != "build failed: see the buildpack output above" {
		t.Errorf("compile error: exit %d, message %q", be.ExitCode, be.Error())
	}
	if !strings.Contains(out3, "undefined: nope") {
		t.Errorf("compile error output lacks the compiler's message:\n%s", out3)
	}
}

// TestBuildGoAppWithDependency downloads a module through the host's GOPROXY (a platform env
// file) inside the sandbox, and finds it in the go-cache layer on the next build.
func TestBuildGoAppWithDependency(t *testing.T) {
	h := newHarness(t)
	files := map[string]string{
		"go.mod": "module example.com/dep\n\ngo 1.22\n\nrequire github.com/google/go-cmp v0.7.0\n",
		"go.sum": "github.com/google/go-cmp v0.7.0 h1:wk8382ETsv4JYUZwIsn6YpYiWiBsYLSJiTsyBybVuN8=\n" +
			"github.com/google/go-cmp v0.7.0/go.mod h1:pXiqmnSA92OHEEa9HXL2W4E7lf9JzCmGVUdgjX3N/iU=\n",
		"main.go": "package main\n\nimport \"github.com/google/go-cmp/cmp\"\n\nfunc main() { println(cmp.Equal(1, 1)) }\n",
	}
	res, out, err := h.build(t, "dep", writeTree(t, files), nil)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	checkAppImage(t, res.Image)
	if !strings.Contains(out, "go: downloading github.com/google/go-cmp v0.7.0") {
		t.Errorf("first build did not download go-cmp through GOPROXY:\n%s", out)
	}
	res2, out2, err := h.build(t, "dep", writeTree(t, files), nil)
	if err != nil {
		t.Fatalf("second build: %v\n%s", err, out2)
	}
	if strings.Contains(out2, "go: downloading") {
		t.Errorf("second build downloaded modules again (module cache not restored):\n%s", out2)
	}
	if res2.Image != res.Image {
		t.Errorf("rebuild digest %s != %s", res2.Image, res.Image)
	}
}

// checkServes runs an app binary on the host with $PORT and expects body at /.
func checkServes(t *testing.T, bin []byte, body string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "app")
	if err := os.WriteFile(p, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(p)
	cmd.Env = []string{"PORT=" + strconv.Itoa(port)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(b), body) {
				t.Errorf("app answered %q, want %q", b, body)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("app never answered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestBuildProcfileApp(t *testing.T) {
	h := newHarness(t)
	src := writeTree(t, map[string]string{
		"Procfile":          "# comment\nweb: busybox httpd -f -p $PORT -h public\r\nworker: echo \"quoted\" \\ back\n",
		"public/index.html": "hello\n",
	})
	// A previous image that no longer resolves (e.g. garbage-collected): the lifecycle says so
	// and builds without it.
	gone := h.reg + "/kpush/procapp@sha256:" + strings.Repeat("0", 64)
	res, out, err := h.buildReq(t, Request{App: "procapp", SourceDir: src, Image: h.reg + "/kpush/procapp", PreviousImage: gone})
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	if want := `Image with name "` + gone + `" not found`; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	img, cf := checkAppImage(t, res.Image)
	md := readBuildMetadata(t, cf)
	want := map[string]string{
		"web":    "busybox httpd -f -p $PORT -h public",
		"worker": `echo "quoted" \ back`,
	}
	if len(md.Processes) != len(want) {
		t.Fatalf("processes = %+v, want %v", md.Processes, want)
	}
	for _, p := range md.Processes {
		if got := strings.Join(p.Command, "|"); got != "/bin/sh|-c|"+want[p.Type] || p.BuildpackID != ProcfileID {
			t.Errorf("process %s: command %q from %s, want /bin/sh -c %q", p.Type, p.Command, p.BuildpackID, want[p.Type])
		}
	}
	if b, _ := fileFromImage(t, img, "workspace/public/index.html"); string(b) != "hello\n" {
		t.Errorf("workspace/public/index.html = %q", b)
	}
	if b, _ := fileFromImage(t, img, "bin/busybox"); len(b) == 0 {
		t.Errorf("app image lacks the run image's /bin/busybox")
	}
}

func TestBuildGoAppWithProcfileOverridesWeb(t *testing.T) {
	h := newHarness(t)
	src := writeTree(t, map[string]string{
		"go.mod":   "module example.com/both\n\ngo 1.22\n",
		"main.go":  "package main\n\nfunc main() {}\n",
		"Procfile": "web: /layers/kpush_go/app/bin/both --flag\n",
	})
	res, out, err := h.build(t, "both", src, nil)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	_, cf := checkAppImage(t, res.Image)
	md := readBuildMetadata(t, cf)
	var ids []string
	for _, b := range md.Buildpacks {
		ids = append(ids, b.ID)
	}
	if strings.Join(ids, ",") != GoID+","+ProcfileID {
		t.Errorf("buildpacks = %v, want [%s %s]", ids, GoID, ProcfileID)
	}
	if len(md.Processes) != 1 || md.Processes[0].BuildpackID != ProcfileID {
		t.Errorf("processes = %+v, want one web from %s", md.Processes, ProcfileID)
	}
}

func TestBuildNothingDetectable(t *testing.T) {
	h := newHarness(t)
	src := writeTree(t, map[string]string{"README.md": "nothing to build\n"})
	_, out, err := h.build(t, "empty", src, nil)
	var e *Error
	if !errors.Is(err, ErrDetect) || !errors.As(err, &e) {
		t.Fatalf("err = %v, want ErrDetect\n%s", err, out)
	}
	if e.ExitCode != 20 || e.Error() != "no buildpack could build this app" || !strings.Contains(e.Hint, "go.mod") {
		t.Errorf("detect error: exit %d, msg %q, hint %q", e.ExitCode, e.Error(), e.Hint)
	}
	if errors.Is(err, ErrBuild) || errors.Is(err, ErrExport) {
		t.Errorf("detect error also matches another kind")
	}
}

func TestBuildEnvReachesBuildpacksNotImage(t *testing.T) {
	h := newHarness(t)
	probe := writeTree(t, map[string]string{
		"buildpack.toml": "api = \"0.10\"\n[buildpack]\nid = \"test/probe\"\nversion = \"0.0.1\"\n[[targets]]\nos = \"linux\"\n",
		"bin/detect":     "#!/bin/sh\nexit 0\n",
		"bin/build": "#!/bin/sh\nset -eu\n" +
			"echo \"probe env: KPUSH_PROBE=${KPUSH_PROBE:-unset}\"\n" +
			"echo \"probe file: $(cat \"$2/env/KPUSH_PROBE\")\"\n" +
			"echo \"probe registry auth env: ${CNB_REGISTRY_AUTH:-unset}\"\n" +
			"if cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -q '^CNB_REGISTRY_AUTH='; then echo 'probe registry auth proc: readable'; else echo 'probe registry auth proc: hidden'; fi\n",
	})
	h.local.RegistryUsername, h.local.RegistryPassword = "user", "hunter2-password" // ggcr's registry accepts any
	h.local.ExtraBuildpacks = append(h.local.ExtraBuildpacks, os.DirFS(probe))
	h.local.Order = []Group{{{ID: ProcfileID}, {ID: "test/probe"}}}
	src := writeTree(t, map[string]string{"Procfile": "web: sleep 1000\n"})
	res, out, err := h.build(t, "probe", src, map[string]string{"KPUSH_PROBE": "s3cret-value"})
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, want := range []string{"probe env: KPUSH_PROBE=s3cret-value", "probe file: s3cret-value",
		"probe registry auth env: unset", "probe registry auth proc: hidden"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	img, cf := checkAppImage(t, res.Image)
	for _, e := range cf.Config.Env {
		if strings.HasPrefix(e, "KPUSH_PROBE=") {
			t.Errorf("image config env has %s", e)
		}
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte("s3cret-value")) {
		t.Errorf("image config contains the build-time value")
	}
}

func TestBuildRegistryCredentialsNotPrinted(t *testing.T) {
	h := newHarness(t)
	h.local.RegistryUsername, h.local.RegistryPassword = "user", "hunter2-password"
	src := writeTree(t, map[string]string{"Procfile": "web: sleep 1000\n"})
	// ggcr's registry ignores credentials: the build succeeds and the password must not show.
	_, out, err := h.build(t, "creds", src, nil)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	if strings.Contains(out, "hunter2-password") || strings.Contains(out, "aHVudGVyMi") {
		t.Errorf("output contains the registry password")
	}
}

func TestBuildRegistryDown(t *testing.T) {
	h := newHarness(t)
	src := writeTree(t, map[string]string{"Procfile": "web: sleep 1000\n"})
	// Run image pushed first, then the registry for the app image is a closed port.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	ref, err := EnsureRunImage(context.Background(), h.reg+"/kpush/kpush.run")
	if err != nil {
		t.Fatal(err)
	}
	h.local.RunImage = ref
	var out bytes.Buffer
	_, err = h.local.Build(context.Background(), Request{App: "down", SourceDir: src, Image: dead + "/kpush/down"}, &out)
	if !errors.Is(err, ErrExport) {
		t.Fatalf("err = %v, want ErrExport\n%s", err, out.String())
	}
	t.Logf("error for people: %v", err)
	if !strings.Contains(err.Error(), dead) {
		t.Errorf("error %q does not name the registry", err)
	}
}

func TestBuildCancel(t *testing.T) {
	h := newHarness(t)
	probe := writeTree(t, map[string]string{
		"buildpack.toml": "api = \"0.10\"\n[buildpack]\nid = \"test/slow\"\nversion = \"0.0.1\"\n[[targets]]\nos = \"linux\"\n",
		"bin/detect":     "#!/bin/sh\nexit 0\n",
		"bin/build":      "#!/bin/sh\necho slow build started\nsleep 600\n",
	})
	h.local.ExtraBuildpacks = []fs.FS{os.DirFS(probe)}
	h.local.Order = []Group{{{ID: "test/slow"}}}
	src := writeTree(t, map[string]string{"x": "y"})
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := h.local.Build(ctx, Request{App: "slow", SourceDir: src, Image: h.reg + "/kpush/slow"}, pw)
		pw.Close()
		done <- err
	}()
	buf := make([]byte, 0, 4096)
	tmp := make([]byte, 4096)
	for !bytes.Contains(buf, []byte("slow build started")) {
		n, err := pr.Read(tmp)
		if err != nil {
			t.Fatalf("output ended before the build started: %v\n%s", err, buf)
		}
		buf = append(buf, tmp[:n]...)
	}
	t0 := time.Now()
	cancel()
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("build still running 30 s after cancel")
	}
	t.Logf("cancel took %v", time.Since(t0))
}

// BenchmarkBuildWarm measures a rebuild of an unchanged Go web app with a warm cache and the
// first build as the previous image (the realistic second push): sandbox set-up, the
// lifecycle's five phases, a no-op `go build` and the export to an in-process registry,
// reusing the previous image's layers.
func BenchmarkBuildWarm(b *testing.B) {
	h := newHarness(b)
	src := goApp(b)
	req := Request{App: "bench", SourceDir: src, Image: h.reg + "/kpush/bench"}
	var out bytes.Buffer
	first, err := h.local.Build(context.Background(), req, &out)
	if err != nil {
		b.Fatalf("cold build: %v\n%s", err, out.String())
	}
	req.PreviousImage = first.Image // as the receiver does: the current release's image
	for b.Loop() {
		out.Reset()
		res, err := h.local.Build(context.Background(), req, &out)
		if err != nil {
			b.Fatalf("warm build: %v\n%s", err, out.String())
		}
		if res.Image != first.Image {
			b.Fatalf("warm build digest %s != %s", res.Image, first.Image)
		}
	}
}

// A buildpack can write anything under /layers, which the registry phases read after it: a
// symlink there must not lead them to their own environment and print the credentials.
func TestBuildpackCannotLeadRegistryPhasesToTheCredentials(t *testing.T) {
	for _, c := range []struct{ name, detect, build string }{
		// detect replaces what analyze wrote and restore reads
		{"analyzed.toml", "ln -sf /proc/self/environ /kpush/analyzed.toml; ln -sf /proc/self/environ /layers/analyzed.toml\n", ""},
		// build leaves a layer whose metadata export reads
		{"layer metadata", "", "mkdir -p \"$1/leak\"\nprintf '[types]\\nlaunch = true\\n' > \"$1/leak.toml\"\n" +
			"ln -sf /proc/self/environ /layers/report.toml\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			h.local.RegistryUsername, h.local.RegistryPassword = "user", "hunter2-password"
			hostile := writeTree(t, map[string]string{
				"buildpack.toml": "api = \"0.10\"\n[buildpack]\nid = \"test/hostile\"\nversion = \"0.0.1\"\n[[targets]]\nos = \"linux\"\n",
				"bin/detect":     "#!/bin/sh\n" + c.detect + "exit 0\n",
				"bin/build":      "#!/bin/sh\n" + c.build + "exit 0\n",
			})
			h.local.ExtraBuildpacks = []fs.FS{os.DirFS(hostile)}
			h.local.Order = []Group{{{ID: ProcfileID}, {ID: "test/hostile"}}}
			src := writeTree(t, map[string]string{"Procfile": "web: sleep 1000\n"})
			_, out, err := h.build(t, "hostile", src, nil)
			t.Logf("build error: %v", err)
			// Any sign of the phase's environment (even a parser naming its first key, "PATH")
			// means the symlink reached it.
			for _, secret := range []string{"hunter2-password", "aHVudGVyMi", "CNB_REGISTRY_AUTH", "dXNlcjpodW50ZXI", `"PATH"`, "CNB_PLATFORM_API"} {
				if strings.Contains(out, secret) || (err != nil && strings.Contains(err.Error(), secret)) {
					t.Errorf("the build output shows %q:\n%s", secret, out)
				}
			}
		})
	}
}

// The run image and previous image the export uses come from analyze alone: a buildpack
// (here its detect and build steps) cannot rewrite analyzed.toml to make the export base the
// app on another app's image, or reach a registry or host service of its choosing.
func TestBuildpackCannotChooseTheExportsRunImage(t *testing.T) {
	h := newHarness(t)
	evil := `[run-image]\n  reference = "127.0.0.1:1/victim@sha256:` + strings.Repeat("ab", 32) + `"\n  image = "127.0.0.1:1/victim"\n`
	try := "for f in /kpush/analyzed.toml /layers/analyzed.toml; do if printf '" + evil + "' > $f 2>/dev/null; then echo \"hostile: wrote $f\"; else echo \"hostile: refused $f\"; fi; done\n"
	hostile := writeTree(t, map[string]string{
		"buildpack.toml": "api = \"0.10\"\n[buildpack]\nid = \"test/hostile\"\nversion = \"0.0.1\"\n[[targets]]\nos = \"linux\"\n",
		"bin/detect":     "#!/bin/sh\n" + try + "exit 0\n",
		"bin/build":      "#!/bin/sh\n" + try + "exit 0\n",
	})
	h.local.ExtraBuildpacks = []fs.FS{os.DirFS(hostile)}
	h.local.Order = []Group{{{ID: ProcfileID}, {ID: "test/hostile"}}}
	src := writeTree(t, map[string]string{"Procfile": "web: sleep 1000\n"})
	res, out, err := h.build(t, "hostile", src, nil)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	if strings.Contains(out, "hostile: wrote /kpush/analyzed.toml") || !strings.Contains(out, "hostile: refused /kpush/analyzed.toml") {
		t.Errorf("a buildpack could write the analyzed.toml the export reads:\n%s", out)
	}
	// The image is based on kpush's run image, not the one the buildpack asked for.
	ref, err := name.ParseReference(res.Image)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if md := cf.Config.Labels["io.buildpacks.lifecycle.metadata"]; strings.Contains(md, "victim") || !strings.Contains(md, "kpush.run") {
		t.Errorf("the image's lifecycle metadata names another run image: %s", md)
	}
}

// The restorer writes cached layers back through symlinks buildpack code planted in /layers:
// a cached layer holding an analyzed.toml, restored through a symlink at the layer's path onto
// the restorer's control directory, must not change the images the export uses.
func TestBuildpackCannotSwapAnalyzedThroughTheRestorer(t *testing.T) {
	h := newHarness(t)
	evil := `[run-image]\n  reference = "127.0.0.1:1/victim@sha256:` + strings.Repeat("ab", 32) + `"\n  image = "127.0.0.1:1/victim"\n`
	hostile := writeTree(t, map[string]string{
		"buildpack.toml": "api = \"0.10\"\n[buildpack]\nid = \"test/hostile\"\nversion = \"0.0.1\"\n[[targets]]\nos = \"linux\"\n",
		// On the second push, the layer's path leads to the restorer's control directory.
		"bin/detect": "#!/bin/sh\nif [ -f plant ]; then mkdir -p /layers/test_hostile && ln -sfn /kpush /layers/test_hostile/x; fi\nexit 0\n",
		// The first push caches a layer that holds the analyzed.toml of the attacker's choice.
		"bin/build": "#!/bin/sh\n[ -f plant ] && exit 0\nmkdir -p \"$1/x\"\nprintf '[types]\\ncache = true\\n' > \"$1/x.toml\"\nprintf '" + evil + "' > \"$1/x/analyzed.toml\"\n",
	})
	h.local.ExtraBuildpacks = []fs.FS{os.DirFS(hostile)}
	h.local.Order = []Group{{{ID: ProcfileID}, {ID: "test/hostile"}}}
	src := writeTree(t, map[string]string{"Procfile": "web: sleep 1000\n"})
	first, out, err := h.build(t, "hostile", src, nil)
	if err != nil {
		t.Fatalf("first build: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(src, "plant"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res, out, err := h.buildReq(t, Request{App: "hostile", SourceDir: src, Image: h.reg + "/kpush/hostile", PreviousImage: first.Image})
	if err == nil {
		ref, _ := name.ParseReference(res.Image)
		img, _ := remote.Image(ref)
		cf, _ := img.ConfigFile()
		t.Fatalf("the second build was exported (metadata %s):\n%s", cf.Config.Labels["io.buildpacks.lifecycle.metadata"], out)
	}
	if !errors.Is(err, ErrBuild) || !strings.Contains(err.Error(), "another image") {
		t.Fatalf("second build: %v, want the refusal of the changed images\n%s", err, out)
	}
}
