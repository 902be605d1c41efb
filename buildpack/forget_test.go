package buildpack

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestForgetApp: the app's cache and its leftover build directories go; other apps' stay,
// including an app whose name has the forgotten one as prefix.
func TestForgetApp(t *testing.T) {
	l := &Local{DataDir: t.TempDir()}
	mk := func(parts ...string) string {
		p := filepath.Join(append([]string{l.DataDir}, parts...)...)
		if err := os.MkdirAll(filepath.Join(p, "layer"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gone := []string{mk("cache", "demo"), mk("builds", "demo-20260101-120000-abcdef")}
	kept := []string{mk("cache", "demo-two"), mk("builds", "demo-two-20260101-120000-abcdef"), mk("cache", "other")}
	if err := l.ForgetApp("demo"); err != nil {
		t.Fatal(err)
	}
	for _, p := range gone {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still exists (%v)", p, err)
		}
	}
	for _, p := range kept {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
	if err := l.ForgetApp("../x"); err == nil {
		t.Error("ForgetApp accepted an invalid app name")
	}
}

// TestRemoveLeftovers: build directories older than the given time whose app's build lock is
// free are removed; one whose app is building (the lock held, as by another process) or that
// is newer stays.
func TestRemoveLeftovers(t *testing.T) {
	l := &Local{DataDir: t.TempDir()}
	start := time.Now()
	old := start.Add(-time.Hour)
	dir := func(name string, mtime time.Time) string {
		p := filepath.Join(l.DataDir, "builds", name)
		if err := os.MkdirAll(filepath.Join(p, "layers"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dead := dir("dead-20260101-120000-abcdef", old)
	busy := dir("busy-20260101-120000-abcdef", old)
	fresh := dir("fresh-20260101-120000-abcdef", start.Add(time.Minute))
	odd := dir("not-a-build", old)
	// A build of "busy" runs elsewhere: it holds the app's flock on its own open file.
	os.MkdirAll(filepath.Join(l.DataDir, "cache"), 0o755)
	f, err := os.OpenFile(filepath.Join(l.DataDir, "cache", "busy.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	removed, err := l.RemoveLeftovers(start)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != dead {
		t.Errorf("removed %q, want only %s", removed, dead)
	}
	for _, p := range []string{busy, fresh, odd} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
	// Once the build is over, its directory (had it been left) goes too.
	f.Close()
	if removed, _ := l.RemoveLeftovers(start); len(removed) != 1 || removed[0] != busy {
		t.Errorf("after the build ended removed %q, want %s", removed, busy)
	}
}

// TestBuildShipsLifecycleSBOMs: the lifecycle finds its own and the launcher's SBOMs beside
// it, so a build prints none of the six "Did not find SBOM" warnings, and the launcher's
// SBOM lands in the image.
func TestBuildShipsLifecycleSBOMs(t *testing.T) {
	h := newHarness(t)
	src := writeTree(t, map[string]string{"Procfile": "web: busybox httpd -f -p $PORT\n"})
	res, out, err := h.build(t, "sbomapp", src, nil)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	if strings.Contains(out, "Did not find SBOM") {
		t.Errorf("build output mentions SBOMs:\n%s", out)
	}
	img, _ := checkAppImage(t, res.Image)
	b, _ := fileFromImage(t, img, "layers/sbom/launch/buildpacksio_lifecycle/launcher/sbom.cdx.json")
	var doc struct {
		BOMFormat string `json:"bomFormat"`
		Metadata  struct {
			Component struct{ Name, Version string }
		}
	}
	if err := json.Unmarshal(b, &doc); err != nil || doc.BOMFormat != "CycloneDX" || doc.Metadata.Component.Name != "launcher" ||
		doc.Metadata.Component.Version != LifecycleVersion {
		t.Errorf("launcher SBOM in the image = %s (%v)", b, err)
	}
}
