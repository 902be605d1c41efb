package test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// kpush killed with SIGKILL at a random moment of a push — while git sends the pack, while
// the build runs, while the release is deployed — loses nothing: after a restart on the same
// data dir the repository passes git fsck, no release of the dead process is left pending,
// the deploy branch names the commit of the release that serves, the app serves that commit
// and the next push deploys. Each phase runs a bounded number of trials on one server.

// crashTrials is how many times each phase kills kpush.
const crashTrials = 10

// livePush is a `git push --progress` running in the background whose output arrives line by
// line as git prints it (progress lines end in \r, not \n).
type livePush struct {
	lines <-chan string
	done  <-chan pushResult
}

func startLivePush(env []string, dir string, args ...string) *livePush {
	lines := make(chan string, 1024)
	done := make(chan pushResult, 1)
	go func() {
		start := time.Now()
		cmd := exec.Command("git", append([]string{"push", "--progress"}, args...)...)
		cmd.Dir, cmd.Env = dir, env
		pr, pw := io.Pipe()
		cmd.Stdout, cmd.Stderr = pw, pw
		var out bytes.Buffer
		scanned := make(chan struct{})
		go func() {
			defer close(scanned)
			sc := bufio.NewScanner(pr)
			sc.Split(scanCRLF)
			for sc.Scan() {
				out.WriteString(sc.Text() + "\n")
				select {
				case lines <- sc.Text():
				default: // nobody waits for more
				}
			}
			io.Copy(io.Discard, pr)
		}()
		err := cmd.Start()
		if err == nil {
			err = cmd.Wait()
		}
		pw.Close()
		<-scanned
		close(lines)
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			code = -1
			out.WriteString(err.Error())
		}
		done <- pushResult{out: out.String(), code: code, took: time.Since(start)}
	}()
	return &livePush{lines: lines, done: done}
}

// scanCRLF is bufio.ScanLines that also ends a line at \r.
func scanCRLF(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		return i + 1, data[:i], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// waitLine waits until p prints a line containing one of marks and returns that line; ""
// when the push ended first.
func (p *livePush) waitLine(t *testing.T, marks ...string) string {
	t.Helper()
	timeout := time.After(3 * time.Minute)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return ""
			}
			for _, m := range marks {
				if strings.Contains(l, m) {
					return l
				}
			}
		case <-timeout:
			t.Fatalf("the push printed none of %q within 3m", marks)
		}
	}
}

// crashPhase is one phase of a push at which kpush is killed.
type crashPhase struct {
	name string
	// prepare writes what the killed push's commit carries besides its page.
	prepare func(t *testing.T, dir string)
	// marks are the moments kpush is killed at, one chosen at random per trial.
	marks []crashMark
}

// crashMark is a moment of a push: a line it prints (any of lines), then a random wait of
// at most jitter.
type crashMark struct {
	lines  []string
	jitter time.Duration
}

func TestDevKilledServerRecoversAtEveryPhase(t *testing.T) {
	quiet, err := filepath.Abs(filepath.Join("testdata", "buildpacks", "quiet"))
	if err != nil {
		t.Fatal(err)
	}
	phases := []crashPhase{{
		name: "receive",
		// A pack big enough that git is still sending it when kpush dies: incompressible.
		prepare: func(t *testing.T, dir string) {
			blob := make([]byte, 16<<20)
			rand.Read(blob)
			writeFile(t, dir, "blob.bin", string(blob))
		},
		marks: []crashMark{{[]string{"Enumerating objects", "Counting objects"}, 40 * time.Millisecond},
			{[]string{"Writing objects"}, 40 * time.Millisecond}},
	}, {
		name: "build",
		// The quiet buildpack sleeps this long without a word: the build runs for seconds.
		prepare: func(t *testing.T, dir string) { writeFile(t, dir, "quiet", "2\n") },
		marks: []crashMark{{[]string{"-----> Building "}, 500 * time.Millisecond},
			{[]string{"quiet: silent for"}, 2500 * time.Millisecond}},
	}, {
		name:    "deploy",
		prepare: func(t *testing.T, dir string) {},
		// "Released" is printed just before the release is recorded and git moves the branch:
		// the last moment of the deploy, killed at once.
		marks: []crashMark{{[]string{"-----> Deploying "}, 300 * time.Millisecond},
			{[]string{"-----> Released "}, 0}},
	}}
	for _, ph := range phases {
		t.Run(ph.name, func(t *testing.T) {
			crashLoop(t, quiet, ph)
		})
	}
}

// crashLoop kills kpush crashTrials times during ph of a push to one app, checking after
// every restart that the app and its repository are whole and that the next push deploys.
func crashLoop(t *testing.T, quiet string, ph crashPhase) {
	s, httpAddr, env := devServer(t, "--buildpack", quiet)
	const app = "crash"
	url := "http://" + app + ".localhost:" + httpAddr[strings.LastIndex(httpAddr, ":")+1:] + "/"
	dir := workTree(t, env, "static")
	git(t, env, dir, "remote", "add", "kpush", s.remote(app))
	pages := map[string]string{} // commit → the page it serves
	pages[crashCommit(t, env, dir, "v0", nil)] = "page v0\n"
	if out, code := push(t, env, dir, "kpush", "main"); code != 0 {
		t.Fatalf("first push exited %d:\n%s", code, out)
	}
	begin := time.Now()
	seen := map[string]int{} // the last line kind seen before each kill
	for i := range crashTrials {
		name := fmt.Sprintf("%s%d", ph.name, i)
		pages[crashCommit(t, env, dir, name, ph.prepare)] = "page " + name + "\n"

		p := startLivePush(env, dir, "kpush", "main")
		marks := ph.marks[mrand.IntN(len(ph.marks))]
		line := p.waitLine(t, marks.lines...)
		if line == "" {
			r := <-p.done
			t.Fatalf("trial %d: the push ended before printing %q: exit %d\n%s", i, marks.lines, r.code, r.out)
		}
		jitter := time.Duration(mrand.Int64N(int64(marks.jitter) + 1))
		time.Sleep(jitter) // the kill moment, at random within the phase
		s.killHard(t)
		r := <-p.done
		seen[lastMark(r.out)]++
		if r.code == 0 && !strings.Contains(r.out, "-----> Released ") {
			t.Errorf("trial %d: push exited 0 without a release although its server was killed:\n%s", i, r.out)
		}

		s2 := start(t, s.sshAddr, s.args...)
		s2.key = s.key
		s = s2
		checkAfterCrash(t, s, env, httpAddr, url, app, pages, fmt.Sprintf("trial %d (killed %s after %q)", i, jitter, line))

		// The next push deploys, from whatever the server's branch is at now.
		git(t, env, dir, "fetch", "-q", "kpush")
		git(t, env, dir, "reset", "-q", "--hard", "kpush/main")
		next := "next" + name
		c := crashCommit(t, env, dir, next, nil)
		pages[c] = "page " + next + "\n"
		if out, code := push(t, env, dir, "kpush", "main"); code != 0 {
			t.Fatalf("trial %d: the push after the restart exited %d:\n%s", i, code, out)
		}
		if code, body := get(t, httpAddr, url); code != http.StatusOK || body != pages[c] {
			t.Errorf("trial %d: after the next push GET %s = %d %q, want %q", i, url, code, body, pages[c])
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	t.Logf("%d kills during the %s in %s; the last line the pusher saw before each: %v",
		crashTrials, ph.name, time.Since(begin).Round(time.Second), seen)
}

// crashCommit commits public/index.html saying name (after prepare, if not nil, wrote more),
// removing what an earlier trial's prepare left, and returns the commit.
func crashCommit(t *testing.T, env []string, dir, name string, prepare func(*testing.T, string)) string {
	t.Helper()
	for _, f := range []string{"blob.bin", "quiet"} {
		os.Remove(filepath.Join(dir, f))
	}
	if prepare != nil {
		prepare(t, dir)
	}
	writeFile(t, dir, "public/index.html", "page "+name+"\n")
	git(t, env, dir, "add", "-A")
	git(t, env, dir, "commit", "-q", "-m", name)
	return git(t, env, dir, "rev-parse", "HEAD")
}

func writeFile(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// lastMark names the last phase line in a push's output.
func lastMark(out string) string {
	last := "nothing"
	for _, l := range strings.Split(out, "\n") {
		for _, m := range []string{"Writing objects", "-----> Received", "-----> Building", "quiet: silent", "quiet: done",
			"-----> Deploying", "-----> Released"} {
			if strings.Contains(l, m) {
				last = m
			}
		}
	}
	return last
}

// checkAfterCrash checks app on a kpush just restarted after a kill: git fsck is clean, no
// release is pending, the deploy branch is at the commit of the current release, and the app
// serves that commit's page.
func checkAfterCrash(t *testing.T, s *server, env []string, httpAddr, url, app string, pages map[string]string, what string) {
	t.Helper()
	repo := filepath.Join(dataDirOf(s), "repos", app+".git")
	if out, err := exec.Command("git", "--git-dir="+repo, "fsck", "--no-dangling", "--no-progress").CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("%s: git fsck --no-dangling of %s: %v\n%s", what, repo, err, out)
	}
	var rels []release
	kpushJSON(t, s, &rels, "releases", app, "--json")
	for _, r := range rels {
		if r.Status == "pending" {
			t.Errorf("%s: v%d is still pending after the restart: %+v", what, r.Version, r)
		}
	}
	var info struct {
		Current int `json:"current_release"`
		Release release
	}
	kpushJSON(t, s, &info, "apps:info", app, "--json")
	branch, err := exec.Command("git", "--git-dir="+repo, "rev-parse", "--verify", "-q", "refs/heads/main").Output()
	if got := strings.TrimSpace(string(branch)); err != nil || got != info.Release.Commit {
		t.Errorf("%s: refs/heads/main is at %q (%v), want the commit of the current release v%d, %s",
			what, got, err, info.Current, info.Release.Commit)
	}
	want := pages[info.Release.Commit]
	var code int
	var body string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if code, body = get(t, httpAddr, url); code == http.StatusOK && body == want {
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Errorf("%s: GET %s = %d %q, want the current release v%d's page %q", what, url, code, body, info.Current, want)
}
