package local

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func TestRegistryKeepsImageAcrossRestart(t *testing.T) {
	data := t.TempDir()
	reg := startTestRegistry(t, data)
	addr := reg.Addr()
	ref := pushAppImage(t, addr, "demo", appImage{index: "kept"})

	// A second registry on the same data dir is refused while the first runs.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if r2, err := StartRegistry(ctx, RegistryConfig{DataDir: data}); err == nil {
		r2.Close()
		t.Fatal("second registry on the same data dir started")
	} else if !strings.Contains(err.Error(), "in use") {
		t.Errorf("second registry: %v, want an in-use error", err)
	}

	if err := reg.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if processGone(reg.PID()) == false {
		t.Errorf("registry pid %d survives Close", reg.PID())
	}
	reg2 := startTestRegistry(t, data)
	if reg2.Addr() != addr {
		t.Fatalf("restarted registry on %s, want the persisted %s", reg2.Addr(), addr)
	}
	d, err := name.NewDigest(ref)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Image(d, remote.WithContext(ctx), remote.WithAuthFromKeychain(reg2.Keychain())); err != nil {
		t.Fatalf("image pushed before the restart is gone: %v", err)
	}
	if err := reg2.Err(); err != nil {
		t.Errorf("Err() of a running registry: %v", err)
	}
}

func TestRegistryReportsDeath(t *testing.T) {
	reg := startTestRegistry(t, t.TempDir())
	if err := reg.proc.cmd.Process.Kill(); err != nil { // a crash the real registry cannot be asked for
		t.Fatal(err)
	}
	<-reg.Done()
	if err := reg.Err(); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Errorf("Err() after the process died: %v", err)
	}
}

// TestRegistryRequiresAuth: without kpush's login (or with a wrong password) the registry
// answers 401 to reads, writes and deletes, even of an image that exists; with the login a
// remote.Write and a read back work, and so do the same requests.
func TestRegistryRequiresAuth(t *testing.T) {
	reg := startTestRegistry(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	user, pass := reg.Credentials()
	if user == "" || len(pass) < 32 {
		t.Fatalf("Credentials() = %q, %d-byte password; want a user and a long random password", user, len(pass))
	}

	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(reg.Addr() + "/kpush/demo:latest")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img, remote.WithContext(ctx)); err == nil {
		t.Fatal("anonymous remote.Write succeeded")
	}
	auth := remote.WithAuthFromKeychain(reg.Keychain())
	if err := remote.Write(tag, img, remote.WithContext(ctx), auth); err != nil {
		t.Fatalf("remote.Write with the login: %v", err)
	}
	want, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Image(tag, remote.WithContext(ctx)); err == nil {
		t.Error("anonymous remote.Image succeeded")
	}
	got, err := remote.Image(tag, remote.WithContext(ctx), auth)
	if err != nil {
		t.Fatalf("reading the image back with the login: %v", err)
	}
	if d, err := got.Digest(); err != nil || d != want {
		t.Fatalf("read back digest %v (%v), want %v", d, err, want)
	}
	if _, err := got.RawConfigFile(); err != nil { // a blob read, not only the manifest
		t.Errorf("reading the config blob with the login: %v", err)
	}

	base := "http://" + reg.Addr() + "/v2/"
	manifest := base + "kpush/demo/manifests/"
	reqs := []struct {
		method, url string
		ok          int // status with the login
	}{
		{http.MethodGet, base + "_catalog", http.StatusOK},
		{http.MethodGet, manifest + "latest", http.StatusOK},
		{http.MethodPost, base + "kpush/demo/blobs/uploads/", http.StatusAccepted},
		{http.MethodDelete, manifest + want.String(), http.StatusAccepted}, // last: it deletes
	}
	do := func(method, url, user, pass string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, r := range reqs {
		for _, login := range []struct{ name, user, pass string }{
			{"anonymous", "", ""},
			{"wrong password", user, pass + "x"},
			{"unknown user", "docker", pass},
		} {
			resp := do(r.method, r.url, login.user, login.pass)
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s %s %s: %s, want 401", login.name, r.method, r.url, resp.Status)
			}
			if h := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(h, "Basic ") {
				t.Errorf("%s %s %s: WWW-Authenticate %q, want a Basic challenge", login.name, r.method, r.url, h)
			}
		}
		if resp := do(r.method, r.url, user, pass); resp.StatusCode != r.ok {
			t.Errorf("%s %s with the login: %s, want %d", r.method, r.url, resp.Status, r.ok)
		}
	}
	if _, err := remote.Head(tag.Digest(want.String()), remote.WithContext(ctx), auth); err == nil {
		t.Error("the manifest is still there after an authenticated DELETE")
	}
}

// TestRegistryLoginKeptAcrossRestart: the login is made once, kept in credentials.json at
// mode 0600 (the htpasswd too), reused by the next start, and never written to the registry's
// log or config; a corrupt credentials file is replaced by a new login that works.
func TestRegistryLoginKeptAcrossRestart(t *testing.T) {
	data := t.TempDir()
	dir := filepath.Join(data, "registry")
	reg := startTestRegistry(t, data)
	user, pass := reg.Credentials()
	for _, f := range []string{"credentials.json", "htpasswd"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if m := fi.Mode().Perm(); m != 0o600 {
			t.Errorf("%s has mode %o, want 600", f, m)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "credentials.json"))
	if err != nil {
		t.Fatal(err)
	}
	var kept struct{ Username, Password string }
	if err := json.Unmarshal(b, &kept); err != nil || kept.Username != user || kept.Password != pass {
		t.Fatalf("credentials.json = %s (%v), want the login Credentials() returns", b, err)
	}
	ref := pushAppImage(t, reg.Addr(), "demo", appImage{index: "kept"})
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"registry.log", "config.yml", "htpasswd"} {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err != nil || strings.Contains(string(b), pass) {
			t.Errorf("%s holds the password in clear (or is unreadable: %v)", f, err)
		}
	}

	// Loosened by hand: the next start makes it 0600 again and keeps the login.
	if err := os.Chmod(filepath.Join(dir, "credentials.json"), 0o644); err != nil {
		t.Fatal(err)
	}
	reg2 := startTestRegistry(t, data)
	if u, p := reg2.Credentials(); u != user || p != pass {
		t.Fatalf("restarted registry's login %q differs from the kept %q", u, user)
	}
	if fi, err := os.Stat(filepath.Join(dir, "credentials.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("credentials.json after a restart: %v, %v; want mode 600", fi.Mode(), err)
	}
	d, err := name.NewDigest(ref)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	old := &authn.Basic{Username: user, Password: pass}
	if _, err := remote.Image(d, remote.WithContext(ctx), remote.WithAuth(old)); err != nil {
		t.Fatalf("the kept login does not read after a restart: %v", err)
	}
	if err := reg2.Close(); err != nil {
		t.Fatal(err)
	}

	if err := os.WriteFile(filepath.Join(dir, "credentials.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	reg3 := startTestRegistry(t, data) // its readiness check logs in with the new login
	if _, p := reg3.Credentials(); p == pass || p == "" {
		t.Errorf("after a corrupt credentials file the password is %q, want a new one", p)
	}
	if _, err := remote.Image(d, remote.WithContext(ctx), remote.WithAuth(old)); err == nil {
		t.Error("the replaced login still reads")
	}
	if _, err := remote.Image(d, remote.WithContext(ctx), remote.WithAuthFromKeychain(reg3.Keychain())); err != nil {
		t.Errorf("the new login does not read: %v", err)
	}
}

// Keychain hands the login to the registry's own address only.
func TestRegistryKeychainOnlyItsHost(t *testing.T) {
	r := &Registry{addr: "127.0.0.1:5000", user: "u", pass: "p"}
	for host, want := range map[string]bool{"127.0.0.1:5000": true, "127.0.0.1:5001": false, "localhost:5000": false, "index.docker.io": false} {
		reg, err := name.NewRegistry(host)
		if err != nil {
			t.Fatal(err)
		}
		a, err := r.Keychain().Resolve(reg)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := a.Authorization()
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Username == "u" && cfg.Password == "p"; got != want {
			t.Errorf("Keychain for %s gives the login: %v, want %v", host, got, want)
		}
	}
}
