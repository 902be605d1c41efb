package state

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// TestStorePersists numbers releases and builds per app from 1, keeps them across a reopen,
// and marks what a stopped server left pending as failed, but not what a live one runs.
func TestStorePersists(t *testing.T) {
	data := t.TempDir()
	s, err := OpenStore(data)
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, app := range []string{"demo", "other"} {
		if err := s.CreateApp(&App{Name: app, Created: created, Owner: "alice", Config: Config{Version: 2, Env: map[string]string{"A": "1"}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateApp(&App{Name: "demo"}); err == nil {
		t.Error("creating demo twice succeeded")
	}
	steps := []struct {
		app     string
		status  string
		wantRel int
	}{
		{"demo", StatusSucceeded, 1},
		{"demo", StatusFailed, 2},
		{"other", StatusSucceeded, 1},
		{"demo", StatusPending, 3}, // the server "stops" during v3
	}
	for _, st := range steps {
		r := &Release{Kind: KindPush, Commit: "c", Status: st.status, Env: map[string]string{"A": "1"}}
		n, err := s.NewRelease(st.app, r)
		if err != nil || n != st.wantRel || r.Version != n {
			t.Fatalf("NewRelease(%s) = %d, %v; want %d", st.app, n, err, st.wantRel)
		}
		b := &Build{Commit: "c", Release: n, Status: st.status}
		if _, err := s.NewBuild(st.app, b); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(s.BuildLog(st.app, b.Number), []byte("log of "+st.app), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if fi, err := os.Stat(filepath.Join(data, "state", "apps", "demo", "releases", "v1.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("v1.json: %v, mode %v; want 0600", err, fi.Mode())
	}

	// A second process on the same data dir leaves the live one's pending release alone.
	other, err := OpenStore(data)
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := other.Release("demo", 3); r == nil || r.Status != StatusPending {
		t.Errorf("v3 after a second process opened the store = %+v, want still pending", r)
	}
	other.Close()
	// The first "stops" during v3.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := OpenStore(data)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s2.App("demo")
	if err != nil {
		t.Fatal(err)
	}
	if !a.Created.Equal(created) || a.Owner != "alice" || !reflect.DeepEqual(a.Config, Config{Version: 2, Env: map[string]string{"A": "1"}}) {
		t.Errorf("reopened app = %+v", a)
	}
	rels, err := s2.Releases("demo")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rels {
		got = append(got, r.Status)
	}
	if want := []string{StatusFailed, StatusFailed, StatusSucceeded}; !reflect.DeepEqual(got, want) {
		t.Errorf("statuses newest first = %v, want %v (pending v3 becomes failed)", got, want)
	}
	if rels[0].Version != 3 || rels[0].Reason == "" {
		t.Errorf("interrupted release = %+v, want v3 with a reason", rels[0])
	}
	bs, _ := s2.Builds("demo")
	if len(bs) != 3 || bs[0].Number != 3 || bs[0].Status != StatusFailed {
		t.Errorf("builds = %+v", bs)
	}
	if b, _ := os.ReadFile(s2.BuildLog("demo", 2)); string(b) != "log of demo" {
		t.Errorf("build log 2 = %q", b)
	}
	if n, _ := s2.NewRelease("demo", &Release{}); n != 4 {
		t.Errorf("next release after reopen = v%d, want v4", n)
	}
	if apps, _ := s2.Apps(); len(apps) != 2 || apps[0].Name != "demo" || apps[1].Name != "other" {
		t.Errorf("apps = %+v", apps)
	}

	if err := s2.RemoveApp("demo"); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.App("demo"); !errors.Is(err, ErrNoApp) {
		t.Errorf("App after RemoveApp: %v, want ErrNoApp", err)
	}
	if apps, _ := s2.Apps(); len(apps) != 1 {
		t.Errorf("apps after RemoveApp = %+v", apps)
	}
	// A recreated app starts numbering again.
	if err := s2.CreateApp(&App{Name: "demo"}); err != nil {
		t.Fatal(err)
	}
	if n, _ := s2.NewRelease("demo", &Release{}); n != 1 {
		t.Errorf("first release of the recreated app = v%d, want v1", n)
	}
}
