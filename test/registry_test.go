package test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"golang.org/x/crypto/bcrypt"

	"kpush.dev/kpush/receiver"
)

// devRegistryAddr is "127.0.0.1:PORT" of the registry `kpush dev` s runs.
func devRegistryAddr(t *testing.T, s *server) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDirOf(s), "registry", "port"))
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strings.TrimSpace(string(b))
}

// devRegistryPID is the PID of the registry process kpush s started (its child named
// "registry").
func devRegistryPID(t *testing.T, s *server) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid …
		st := string(b)
		i := strings.LastIndexByte(st, ')')
		if i < 0 || !strings.HasSuffix(st[:i], "(registry") {
			continue
		}
		f := strings.Fields(st[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(s.cmd.Process.Pid) {
			pid, _ := strconv.Atoi(strings.Fields(st)[0])
			return pid
		}
	}
	t.Fatalf("kpush (pid %d) runs no registry process", s.cmd.Process.Pid)
	return 0
}

// pushFails pushes a new commit of dir and checks that it is refused within 10 s with
// every fragment of want in its output.
func pushFails(t *testing.T, env []string, dir string, want ...string) {
	t.Helper()
	commitFile(t, env, dir, "public/index.html", "not deployed "+strconv.FormatInt(time.Now().UnixNano(), 10)+"\n", "change")
	start := time.Now()
	out, code := push(t, env, dir, "knative", "main")
	took := time.Since(start)
	if code == 0 {
		t.Fatalf("push exited 0:\n%s", out)
	}
	if took > 10*time.Second {
		t.Errorf("the refused push took %s, want under 10s", took)
	}
	if strings.Contains(out, "===> ") { // a lifecycle phase header
		t.Errorf("a build step ran before the registry check:\n%s", out)
	}
	mustContain(t, out, want...)
	t.Logf("refused in %s:\n%s", took, out)
}

// TestDevPushFailsFastWhenTheRegistryIsDownOrRefuses: with the registry refusing kpush's
// login, and then with the registry process gone, a push fails within seconds, before any
// build step, naming the registry and the fix, and the release deployed before still answers.
func TestDevPushFailsFastWhenTheRegistryIsDownOrRefuses(t *testing.T) {
	s, httpAddr, env := devServer(t)
	dir := workTree(t, env, "static")
	git(t, env, dir, "remote", "add", "knative", s.remote("static"))
	out, code := push(t, env, dir, "knative", "main")
	if code != 0 {
		t.Fatalf("first push exited %d:\n%s", code, out)
	}
	url := printedURL(t, out)
	answers := func() {
		t.Helper()
		if code, body := get(t, httpAddr, url); code != http.StatusOK || body != "hello from a Procfile app\n" {
			t.Errorf("GET %s = %d %q, want the release deployed before", url, code, body)
		}
	}
	reg := devRegistryAddr(t, s)

	t.Run("refused credentials", func(t *testing.T) {
		// The registry rereads its htpasswd when it changes: another login than kpush's.
		hp := filepath.Join(dataDirOf(s), "registry", "htpasswd")
		orig, err := os.ReadFile(hp)
		if err != nil {
			t.Fatal(err)
		}
		h, err := bcrypt.GenerateFromPassword([]byte("not-kpush"), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(hp, []byte("someone:"+string(h)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		defer func() {
			os.WriteFile(hp, orig, 0o600)
			later := time.Now().Add(time.Second) // a modification time the registry has not seen
			os.Chtimes(hp, later, later)
		}()
		pushFails(t, env, dir, "registry "+reg+" refused kpush's credentials", "nothing was built", "fix: ")
		answers()
	})

	t.Run("registry down", func(t *testing.T) {
		pid := devRegistryPID(t, s)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("registry pid %d still runs 10s after SIGKILL", pid)
			}
		}
		pushFails(t, env, dir, "registry "+reg+" is unreachable (connection refused)", "nothing was built", "restart kpush dev")
		answers()
	})
}

// TestDevDestroyFreesRegistryBlobsAndKeepsEveryLiveRelease: after apps:destroy, the blobs
// only the destroyed app's images used are gone from the registry's storage, and both
// releases of another app (the serving one and the older one a rollback returns to) pull
// whole.
func TestDevDestroyFreesRegistryBlobsAndKeepsEveryLiveRelease(t *testing.T) {
	s, _, env := devServer(t)
	deploy := func(app, body string) {
		t.Helper()
		dir := workTree(t, env, "static")
		git(t, env, dir, "remote", "add", "knative", s.remote(app))
		commitFile(t, env, dir, "public/index.html", body, "v1")
		if out, code := push(t, env, dir, "knative", "main"); code != 0 {
			t.Fatalf("push of %s exited %d:\n%s", app, code, out)
		}
		if app == "live" {
			commitFile(t, env, dir, "public/index.html", body+" v2\n", "v2")
			if out, code := push(t, env, dir, "knative", "main"); code != 0 {
				t.Fatalf("second push of %s exited %d:\n%s", app, code, out)
			}
		}
	}
	deploy("gone", "the destroyed app\n")
	deploy("live", "the live app\n")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuth(devRegistryLogin(t, s))}
	images := func(app string) []v1.Image {
		t.Helper()
		var rels []receiver.Release
		kpushJSON(t, s, &rels, "releases", app, "--json")
		var out []v1.Image
		for _, r := range rels {
			if r.Image == "" {
				continue
			}
			ref, err := name.NewDigest(r.Image)
			if err != nil {
				t.Fatal(err)
			}
			img, err := remote.Image(ref, opts...)
			if err != nil {
				t.Fatalf("pulling %s of %s v%d: %v", r.Image, app, r.Version, err)
			}
			out = append(out, img)
		}
		return out
	}
	blobs := func(imgs []v1.Image) map[v1.Hash]bool {
		t.Helper()
		m := map[v1.Hash]bool{}
		for _, img := range imgs {
			mf, err := img.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			m[mf.Config.Digest] = true
			for _, l := range mf.Layers {
				m[l.Digest] = true
			}
		}
		return m
	}
	live := images("live")
	if len(live) != 2 {
		t.Fatalf("live has %d release images, want 2", len(live))
	}
	keep := blobs(live)
	var only []v1.Hash // blobs of the destroyed app alone
	for h := range blobs(images("gone")) {
		if !keep[h] {
			only = append(only, h)
		}
	}
	if len(only) == 0 {
		t.Fatal("the destroyed app's images share every blob with the live app's")
	}
	store := filepath.Join(dataDirOf(s), "registry", "data", "docker", "registry", "v2", "blobs")
	onDisk := func(h v1.Hash) bool {
		_, err := os.Stat(filepath.Join(store, h.Algorithm, h.Hex[:2], h.Hex, "data"))
		return err == nil
	}
	for _, h := range only {
		if !onDisk(h) {
			t.Fatalf("blob %s of gone is not on disk before apps:destroy", h)
		}
	}

	out := kpushOK(t, s, "apps:destroy", "gone", "--confirm", "gone")
	mustContain(t, out, "image manifests of gone from the registry")
	start := time.Now()
	for left := len(only); left > 0; time.Sleep(100 * time.Millisecond) {
		left = 0
		for _, h := range only {
			if onDisk(h) {
				left++
			}
		}
		if left > 0 && time.Since(start) > time.Minute {
			t.Fatalf("%d of %d blobs of the destroyed app still on disk 1m after apps:destroy", left, len(only))
		}
	}
	t.Logf("%d blobs of the destroyed app freed %s after apps:destroy", len(only), time.Since(start))

	for i, img := range images("live") {
		if err := validate.Image(img); err != nil { // reads every layer back and checks its digest
			t.Errorf("live release image %d after the collection: %v", i, err)
		}
	}
	for h := range keep {
		if !onDisk(h) {
			t.Errorf("blob %s of a live release is gone from disk", h)
		}
	}
	// The registry serves pushes again after the collection.
	dir := workTree(t, env, "static")
	git(t, env, dir, "remote", "add", "knative", s.remote("after"))
	if out, code := push(t, env, dir, "knative", "main"); code != 0 {
		t.Fatalf("push after the collection exited %d:\n%s", code, out)
	}
}
