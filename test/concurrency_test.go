package test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kpush.dev/kpush/receiver"
)

// Issue 4: concurrent pushes and config changes never clobber each other. These tests use
// the gate buildpack (testdata/buildpacks/gate) to hold a build open until the test lets it
// go on: a handshake over loopback HTTP, not a sleep.

// gate is the test side of the gate buildpack: a build of a commit whose file "gate" holds
// g.url(name) waits until g.open(name). It serves on a test host (listenOnTestHost), which
// builds reach through their outbound network.
type gate struct {
	srv     *httptest.Server
	mu      sync.Mutex
	started map[string]chan struct{}
	opened  map[string]chan struct{}
}

func newGate(t *testing.T) *gate {
	g := &gate{started: map[string]chan struct{}{}, opened: map[string]chan struct{}{}}
	g.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/")
		st, op := g.chans(name)
		g.mu.Lock()
		select {
		case <-st:
		default:
			close(st)
		}
		g.mu.Unlock()
		select {
		case <-op:
			io.WriteString(w, "open\n")
		case <-r.Context().Done():
		}
	}))
	// Builds cannot reach the host's loopback: the gate is on a test host of its own.
	g.srv.Listener.Close()
	g.srv.Listener = listenOnTestHost(t)
	g.srv.Start()
	t.Cleanup(func() {
		g.mu.Lock()
		for _, op := range g.opened {
			select {
			case <-op:
			default:
				close(op)
			}
		}
		g.mu.Unlock()
		g.srv.Close()
	})
	return g
}

func (g *gate) chans(name string) (started, opened chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started[name] == nil {
		g.started[name], g.opened[name] = make(chan struct{}), make(chan struct{})
	}
	return g.started[name], g.opened[name]
}

func (g *gate) url(name string) string { return g.srv.URL + "/" + name }

// waitStarted waits until the build of name reached the gate.
func (g *gate) waitStarted(t *testing.T, name string) {
	t.Helper()
	st, _ := g.chans(name)
	select {
	case <-st:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the build of %s did not reach the gate within 2m", name)
	}
}

func (g *gate) open(name string) {
	_, op := g.chans(name)
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-op:
	default:
		close(op)
	}
}

// pushResult is one `git push` run in the background.
type pushResult struct {
	name string
	out  string
	code int
	took time.Duration
}

// pushBg runs `git push` in dir in the background; the result arrives on the channel. A
// failure to start git is a result with code -1.
func pushBg(env []string, dir, name string, args ...string) <-chan pushResult {
	ch := make(chan pushResult, 1)
	go func() {
		start := time.Now()
		cmd := exec.Command("git", append([]string{"push"}, args...)...)
		cmd.Dir, cmd.Env = dir, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			code = -1
			out.WriteString(err.Error())
		}
		ch <- pushResult{name: name, out: out.String(), code: code, took: time.Since(start)}
	}()
	return ch
}

// page commits public/index.html saying name; with g, also a file "gate" that makes its
// build wait at g.url(name).
func page(t *testing.T, env []string, dir, name string, g *gate) string {
	t.Helper()
	if g != nil {
		if err := os.WriteFile(filepath.Join(dir, "gate"), []byte(g.url(name)), 0o644); err != nil {
			t.Fatal(err)
		}
		git(t, env, dir, "add", "gate")
	} else if _, err := os.Stat(filepath.Join(dir, "gate")); err == nil {
		git(t, env, dir, "rm", "-q", "gate")
	}
	return commitFile(t, env, dir, "public/index.html", "page "+name+"\n", name)
}

var releasedRE = regexp.MustCompile(`remote: -----> Released \S+ v(\d+) \(([0-9a-f]{7})\)`)

// checkHonest fails unless r's exit status matches what it printed: 0 with "Released",
// non-zero with a reason (superseded, branch moved, rejected) and without "Released". It
// returns the release number r reports as released, 0 if none.
func checkHonest(t *testing.T, r pushResult) int {
	t.Helper()
	m := releasedRE.FindStringSubmatch(r.out)
	switch {
	case r.code == 0 && m == nil:
		t.Errorf("push %s exited 0 without releasing:\n%s", r.name, r.out)
	case r.code != 0 && m != nil:
		t.Errorf("push %s exited %d but printed a release:\n%s", r.name, r.code, r.out)
	case r.code != 0 && !strings.Contains(r.out, "superseded by v") && !strings.Contains(r.out, "moved to") &&
		!strings.Contains(r.out, "rejected"):
		t.Errorf("push %s exited %d without saying why:\n%s", r.name, r.code, r.out)
	}
	if m == nil {
		return 0
	}
	var v int
	fmt.Sscan(m[1], &v)
	return v
}

// release is the part of `releases --json` these tests read.
type release struct {
	Version int    `json:"version"`
	Kind    string `json:"kind"`
	Commit  string `json:"commit"`
	Image   string `json:"image"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Base    int    `json:"base"`
	Env     map[string]string
}

// checkRepo checks the server's repository of app in dataDir: every commit in want is kept
// by a refs/kpush/releases/* ref, and `git fsck --strict` is clean.
func checkRepo(t *testing.T, dataDir, app string, want []string) {
	t.Helper()
	repo := filepath.Join(dataDir, "repos", app+".git")
	kept := map[string]bool{}
	out, err := exec.Command("git", "--git-dir="+repo, "for-each-ref", "--format=%(objectname)", "refs/kpush/releases/").CombinedOutput()
	if err != nil {
		t.Fatalf("git for-each-ref: %v\n%s", err, out)
	}
	for _, l := range strings.Fields(string(out)) {
		kept[l] = true
	}
	for _, c := range want {
		if !kept[c] {
			t.Errorf("pushed commit %s is kept by no refs/kpush/releases/* ref", c)
		}
	}
	if out, err := exec.Command("git", "--git-dir="+repo, "fsck", "--strict", "--no-progress").CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("git fsck --strict of %s: %v\n%s", repo, err, out)
	}
}

// TestDevConcurrentPushes: ten clones push ten different commits to one app at
// once over SSH. Each pusher gets an exit status that matches its message; the app's current
// release is the last one released and serves its commit; every pushed commit stays
// reachable by a release ref; the repository passes git fsck --strict.
func TestDevConcurrentPushes(t *testing.T) {
	s, httpAddr, env := devServer(t)
	work := workTree(t, env, "static")
	git(t, env, work, "remote", "add", "knative", s.remote("static"))
	if out, code := push(t, env, work, "knative", "main"); code != 0 {
		t.Fatalf("first push exited %d:\n%s", code, out)
	}
	const n = 10
	commits := map[string]string{} // name → commit
	dirs := map[string]string{}
	for i := range n {
		name := fmt.Sprintf("c%d", i)
		dir := filepath.Join(t.TempDir(), name)
		git(t, env, "", "clone", "-q", s.remote("static"), dir)
		commits[name] = page(t, env, dir, name, nil)
		dirs[name] = dir
	}
	var results []<-chan pushResult
	for name, dir := range dirs {
		results = append(results, pushBg(env, dir, name, "origin", "main"))
	}
	last, lastCommit := 0, ""
	for _, ch := range results {
		r := <-ch
		if v := checkHonest(t, r); v > last {
			last, lastCommit = v, commits[r.name]
		}
	}
	if last == 0 {
		t.Fatal("none of the concurrent pushes was released")
	}
	var rels []release
	kpushJSON(t, s, &rels, "releases", "static", "--json")
	var info struct {
		Current int    `json:"current_release"`
		URL     string `json:"url"`
		Release release
	}
	kpushJSON(t, s, &info, "apps:info", "static", "--json")
	if info.Current != last || info.Release.Commit != lastCommit {
		t.Errorf("current release v%d (%s), want the last released v%d (%s)", info.Current, info.Release.Commit, last, lastCommit)
	}
	for _, r := range rels {
		if r.Status == "succeeded" && r.Version > last {
			t.Errorf("v%d succeeded after the last release a pusher was told about (v%d)", r.Version, last)
		}
		if r.Status == "pending" {
			t.Errorf("v%d still pending after every push returned", r.Version)
		}
	}
	if code, body := get(t, httpAddr, info.URL); code != http.StatusOK || body != "page "+nameOf(commits, lastCommit)+"\n" {
		t.Errorf("GET %s = %d %q, want the page of %s", info.URL, code, body, lastCommit)
	}
	if got := strings.Fields(git(t, env, work, "ls-remote", "knative", "refs/heads/main"))[0]; got != lastCommit {
		t.Errorf("server's main = %s, want the released %s", got, lastCommit)
	}
	var want []string
	for _, c := range commits {
		want = append(want, c)
	}
	checkRepo(t, dataDirOf(s), "static", want)
}

func nameOf(m map[string]string, v string) string {
	for k, x := range m {
		if x == v {
			return k
		}
	}
	return "?"
}

// dataDirOf is the --data of a started kpush.
func dataDirOf(s *server) string {
	for i, a := range s.args {
		if a == "--data" && i+1 < len(s.args) {
			return s.args[i+1]
		}
	}
	return ""
}

// watchBodies GETs url through the router every 50 ms until stop is closed and returns the
// distinct bodies seen.
func watchBodies(routerAddr, url string, stop <-chan struct{}) <-chan map[string]bool {
	ch := make(chan map[string]bool, 1)
	go func() {
		seen := map[string]bool{}
		client := routerClient(routerAddr)
		for {
			if resp, err := client.Get(url); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				seen[string(b)] = true
			}
			select {
			case <-stop:
				ch <- seen
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return ch
}

// TestDevSlowBuildNeverDeploysStale, in dev mode: a slow build of commit A
// starts before a fast push of B. B queues behind A and says so; when A's build ends, B is
// newer, so A is not deployed ("superseded by v…") and B is. Throughout, the app never
// serves A's page.
func TestDevSlowBuildNeverDeploysStale(t *testing.T) {
	g := newGate(t)
	s, httpAddr, env := devServer(t, "--buildpack", filepath.Join("testdata", "buildpacks", "gate"))
	work := workTree(t, env, "static")
	git(t, env, work, "remote", "add", "knative", s.remote("static"))
	out, code := push(t, env, work, "knative", "main")
	if code != 0 {
		t.Fatalf("first push exited %d:\n%s", code, out)
	}
	url := printedURL(t, out)
	other := filepath.Join(t.TempDir(), "other")
	git(t, env, "", "clone", "-q", s.remote("static"), other)

	a := page(t, env, work, "A", g)
	b := page(t, env, other, "B", nil)
	stop := make(chan struct{})
	bodies := watchBodies(httpAddr, url, stop)
	resA := pushBg(env, work, "A", "knative", "main")
	g.waitStarted(t, "A")
	resB := pushBg(env, other, "B", "origin", "main")
	waitQueued(t, s, "static", b) // B arrives while A builds
	g.open("A")
	ra, rb := <-resA, <-resB
	close(stop)
	checkHonest(t, ra)
	checkHonest(t, rb)
	if ra.code == 0 || !strings.Contains(ra.out, "v2 not deployed: superseded by v3 ("+b[:7]+" by alice)") {
		t.Errorf("slow push of A: exit %d, want superseded by v3:\n%s", ra.code, ra.out)
	}
	if rb.code != 0 || !strings.Contains(rb.out, "v3 queued behind build #2 by alice, "+a[:7]+", running") {
		t.Errorf("fast push of B: exit %d, want queued behind build #2 and released:\n%s", rb.code, rb.out)
	}
	seen := <-bodies
	if seen["page A\n"] {
		t.Errorf("the app served A's page at some point: %v", seen)
	}
	if code, body := get(t, httpAddr, url); code != http.StatusOK || body != "page B\n" {
		t.Errorf("GET %s = %d %q, want B's page", url, code, body)
	}
	checkRepo(t, dataDirOf(s), "static", []string{a, b})
}

// waitQueued waits until app has a release of the push of commit, as `releases --json` shows
// it: from then on a build of an older push is not deployed (it is superseded), whether the
// push still waits in the queue or, its predecessor cancelled, already builds. The pusher's own
// output is only read at the end.
func waitQueued(t *testing.T, s *server, app, commit string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		for _, r := range releasesOf(t, s, app) {
			if r.Kind == receiver.KindPush && r.Commit == commit {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no release of %s's push of %s within 1m", app, commit)
		}
	}
}

func routerClient(routerAddr string) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, routerAddr)
		}}}
}

// killHard kills kpush and everything in its process group with SIGKILL, as a crash would,
// and waits until it is gone and its SSH port is free.
func (s *server) killHard(t *testing.T) {
	t.Helper()
	s.stopped = true
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
}

// TestDevLeaseOfKilledServerExpires: kpush is killed with SIGKILL while a
// push holds the app's lease; restarted on the same data dir, a new push does not wait for
// the dead holder's lease (its pid is gone from this host) and succeeds.
func TestDevLeaseOfKilledServerExpires(t *testing.T) {
	const ttl = 2 * time.Minute // long: waiting it out would fail the test
	g := newGate(t)
	s, _, env := devServer(t, "--lease-ttl", ttl.String(), "--buildpack", filepath.Join("testdata", "buildpacks", "gate"))
	work := workTree(t, env, "static")
	git(t, env, work, "remote", "add", "knative", s.remote("static"))
	t0 := time.Now()
	if out, code := push(t, env, work, "knative", "main"); code != 0 {
		t.Fatalf("first push exited %d:\n%s", code, out)
	}
	normal := time.Since(t0)

	page(t, env, work, "A", g)
	resA := pushBg(env, work, "A", "knative", "main")
	g.waitStarted(t, "A")
	s.killHard(t)
	killed := time.Now()
	if r := <-resA; r.code == 0 {
		t.Errorf("push A exited 0 although its server was killed:\n%s", r.out)
	}

	s2 := start(t, s.sshAddr, s.args...)
	s2.key = s.key
	b := page(t, env, work, "B", nil)
	r := <-pushBg(env, work, "B", "knative", "main")
	if r.code != 0 {
		t.Fatalf("push after the restart exited %d:\n%s", r.code, r.out)
	}
	// The dead server's lease names a pid of this host that is gone: it is free at once, not
	// after its TTL (dev mode's file leases).
	if strings.Contains(r.out, "queued behind") {
		t.Errorf("push after the restart waited for the dead server's lease:\n%s", r.out)
	}
	if took := time.Since(killed); took > 2*normal+20*time.Second {
		t.Errorf("push after the restart finished %s after the kill; want at once (a normal push takes %s)", took, normal)
	}
	var rels []release
	kpushJSON(t, s2, &rels, "releases", "static", "--json")
	if len(rels) != 3 || rels[1].Status != "failed" || !strings.Contains(rels[1].Reason, "interrupted") || rels[0].Commit != b || rels[0].Status != "succeeded" {
		t.Errorf("releases after the crash = %+v; want v2 interrupted, v3 = %s succeeded", rels, b)
	}
}
