package local

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kpush.dev/kpush/internal/tools"
)

// needTool fails the test (never skips) when a tool is missing.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := tools.Path(name)
	if err != nil {
		t.Fatalf("%v (run make tools)", err)
	}
	return p
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// tarEntry is one file of a test layer.
type tarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
}

func buildTar(t *testing.T, entries []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			Linkname: e.link, Size: int64(len(e.body)), ModTime: time.Unix(1700000000, 0)}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// appImage describes a busybox test image.
type appImage struct {
	index string   // /www/index.html
	user  string   // config User
	env   []string // config Env
	cmd   string   // shell command; default serves /www copied to /tmp/www with env.txt, id.txt, caps.txt
}

const serveCmd = `/bin/busybox mkdir -p /tmp/www && /bin/busybox cp -r /www/. /tmp/www/ && ` +
	`/bin/busybox env > /tmp/www/env.txt && /bin/busybox id > /tmp/www/id.txt && ` +
	`/bin/busybox grep -E '^CapEff' /proc/self/status > /tmp/www/caps.txt && ` +
	`exec /bin/busybox httpd -f -p $PORT -h /tmp/www`

// pushAppImage builds an image holding the static busybox at /bin/busybox, /bin/sh → busybox
// and /www/index.html, pushes it to regAddr/repo and returns "<repo>@sha256:…".
func pushAppImage(t *testing.T, regAddr, repo string, ai appImage) string {
	t.Helper()
	bb, err := os.ReadFile(needTool(t, "busybox"))
	if err != nil {
		t.Fatal(err)
	}
	layerTar := buildTar(t, []tarEntry{
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/busybox", typ: tar.TypeReg, mode: 0o755, body: string(bb)},
		{name: "bin/sh", typ: tar.TypeSymlink, link: "busybox", mode: 0o777},
		{name: "www/", typ: tar.TypeDir, mode: 0o755},
		{name: "www/index.html", typ: tar.TypeReg, mode: 0o644, body: ai.index},
		{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/passwd", typ: tar.TypeReg, mode: 0o644, body: "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n"},
	})
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cmd := ai.cmd
	if cmd == "" {
		cmd = serveCmd
	}
	cf.Config = v1.Config{
		Entrypoint: []string{"/bin/sh", "-c", cmd},
		Env:        append([]string{"PATH=/bin"}, ai.env...),
		User:       ai.user,
		WorkingDir: "/www",
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(fmt.Sprintf("%s/%s:latest", regAddr, repo))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := remote.Write(tag, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(testKeychain{})); err != nil {
		t.Fatalf("pushing test image: %v", err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s/%s@%s", regAddr, repo, d)
}

// startTestRegistry starts the real distribution registry on a fresh data dir.
func startTestRegistry(t *testing.T, dataDir string) *Registry {
	t.Helper()
	needTool(t, "registry")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := StartRegistry(ctx, RegistryConfig{DataDir: dataDir, StopGrace: 5 * time.Second, Log: testLogger(t)})
	if err != nil {
		t.Fatalf("starting registry: %v", err)
	}
	testRegistries.Store(r.Addr(), r.Keychain())
	t.Cleanup(func() { r.Close() })
	return r
}

// testRegistries maps the address of every registry startTestRegistry started to its
// Keychain, so that testKeychain logs in to any of them.
var testRegistries sync.Map

// testKeychain logs in to the registries startTestRegistry started, and to others anonymously.
type testKeychain struct{}

func (testKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if kc, ok := testRegistries.Load(r.RegistryStr()); ok {
		return kc.(authn.Keychain).Resolve(r)
	}
	return authn.Anonymous, nil
}
