package gitserver

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// seen is what a test handler observed inside PreReceive.
type seen struct {
	push       Push
	catFile    string // `git cat-file -t <new>` with GitEnv
	catFileErr error  // the same without GitEnv: the object is still quarantined
	archive    []string
}

// recorder is a Handler that reads each pushed commit the way the receiver will (git with
// Push.GitEnv) and accepts the push unless a push option says "reject=<message>".
type recorder struct {
	mu    sync.Mutex
	seen  []seen
	write string // written to out before deciding
}

func (r *recorder) PreReceive(ctx context.Context, p *Push, out io.Writer) error {
	s := seen{push: *p}
	for _, u := range p.Updates {
		if u.New == ZeroID {
			continue
		}
		run := func(env []string, args ...string) ([]byte, error) {
			cmd := exec.CommandContext(ctx, "git", append([]string{"--git-dir=" + p.Dir}, args...)...)
			cmd.Env = append(os.Environ(), env...)
			return cmd.Output()
		}
		typ, err := run(p.GitEnv, "cat-file", "-t", u.New)
		if err != nil {
			return fmt.Errorf("cat-file with GitEnv: %w", err)
		}
		s.catFile = strings.TrimSpace(string(typ))
		_, s.catFileErr = run(nil, "cat-file", "-t", u.New)
		tarball, err := run(p.GitEnv, "archive", "--format=tar", u.New)
		if err != nil {
			return fmt.Errorf("archive with GitEnv: %w", err)
		}
		tr := tar.NewReader(bytes.NewReader(tarball))
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			if h.Typeflag == tar.TypeReg {
				s.archive = append(s.archive, h.Name)
			}
		}
		break
	}
	r.mu.Lock()
	r.seen = append(r.seen, s)
	r.mu.Unlock()
	if r.write != "" {
		fmt.Fprint(out, r.write)
	}
	for _, o := range p.Options {
		if o == "panic" {
			panic("test handler panics")
		}
		if msg, ok := strings.CutPrefix(o, "reject="); ok {
			if msg != "" {
				fmt.Fprintln(out, msg)
			}
			return errors.New("rejected by test")
		}
	}
	return nil
}

func (r *recorder) last(t *testing.T) seen {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seen) == 0 {
		t.Fatal("handler was not called")
	}
	return r.seen[len(r.seen)-1]
}

func TestPushCreatesRepoAndCloneBack(t *testing.T) {
	rec := &recorder{write: "building...\n"}
	ts := startServer(t, rec)
	g := ts.git(t, ts.aliceKey)
	work := g.newRepo()
	g.must(work, "checkout", "-q", "-b", "dev")
	dev := g.commit(work, "dev.txt", "dev\n")

	// First push: branch dev, scp-style URL (no leading slash), two push options.
	_, stderr, err := g.run(work, "push", "-o", "a=b", "-o", "with space", ts.scpURL("demo"), "dev")
	if err != nil {
		t.Fatalf("first push: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "remote: building...") {
		t.Errorf("push output lacks the handler's line:\n%s", stderr)
	}
	s := rec.last(t)
	dir := filepath.Join(ts.dataDir, "repos", "demo.git")
	if s.push.App != "demo" || s.push.Dir != dir || s.push.User != "alice" || s.push.ID == "" {
		t.Errorf("push = %+v, want app demo, dir %s, user alice, an ID", s.push, dir)
	}
	if want := []RefUpdate{{ZeroID, dev, "refs/heads/dev"}}; !reflect.DeepEqual(s.push.Updates, want) {
		t.Errorf("updates = %+v, want %+v", s.push.Updates, want)
	}
	if want := []string{"a=b", "with space"}; !reflect.DeepEqual(s.push.Options, want) {
		t.Errorf("options = %q, want %q", s.push.Options, want)
	}
	if s.catFile != "commit" {
		t.Errorf("git cat-file -t with GitEnv = %q, want commit", s.catFile)
	}
	if s.catFileErr == nil {
		t.Error("the pushed commit was readable without GitEnv: it should still be in quarantine")
	}
	if !reflect.DeepEqual(s.archive, []string{"dev.txt", "hello.txt"}) {
		t.Errorf("git archive with GitEnv listed %q, want dev.txt and hello.txt", s.archive)
	}

	// The repository: HEAD at the first branch pushed, the ref moved, the settings in place.
	if got := serverGit(t, dir, "symbolic-ref", "HEAD"); got != "refs/heads/dev" {
		t.Errorf("HEAD = %q, want refs/heads/dev", got)
	}
	if got := serverGit(t, dir, "rev-parse", "refs/heads/dev"); got != dev {
		t.Errorf("refs/heads/dev = %s, want %s", got, dev)
	}
	for key, want := range map[string]string{
		"receive.advertisePushOptions": "true", "receive.shallowUpdate": "true",
		"uploadpack.allowFilter": "true", "receive.unpackLimit": "1",
		"receive.maxInputSize": "1073741824", "core.hooksPath": filepath.Join(ts.dataDir, "hooks"),
		"core.logAllRefUpdates": "always", "core.bare": "true", "receive.hideRefs": "refs/kpush",
		"receive.fsckObjects": "true", "receive.fsck.duplicateEntries": "error", "receive.fsck.hasDotdot": "error",
	} {
		if got := serverGit(t, dir, "config", "--get", key); got != want {
			t.Errorf("config %s = %q, want %q", key, got, want)
		}
	}
	if got := repoEntries(t, ts.dataDir); !reflect.DeepEqual(got, []string{"demo.git"}) {
		t.Errorf("repos dir holds %q, want only demo.git", got)
	}

	// A second push (main, ssh:// URL with .git) leaves HEAD alone.
	g.must(work, "checkout", "-q", "main")
	main := g.commit(work, "main.txt", "main\n")
	g.must(work, "push", "-q", ts.sshURL("demo.git"), "main")
	if got := serverGit(t, dir, "symbolic-ref", "HEAD"); got != "refs/heads/dev" {
		t.Errorf("after pushing main: HEAD = %q, want refs/heads/dev", got)
	}
	if got := serverGit(t, dir, "rev-parse", "refs/heads/main"); got != main {
		t.Errorf("refs/heads/main = %s, want %s", got, main)
	}
	if s := rec.last(t); s.push.Updates[0].Old != ZeroID || s.push.Updates[0].Name != "refs/heads/main" {
		t.Errorf("second push updates = %+v", s.push.Updates)
	}
	// Reflog kept (core.logAllRefUpdates=always).
	if got := serverGit(t, dir, "reflog", "show", "--format=%H", "refs/heads/main"); got != main {
		t.Errorf("reflog of main = %q, want %s", got, main)
	}

	// Clone back over protocol v2: the clone checks out dev, HEAD's branch.
	clone := filepath.Join(t.TempDir(), "clone")
	cmd := g.cmd("", "-c", "protocol.version=2", "clone", ts.sshURL("demo"), clone)
	cmd.Env = append(cmd.Env, "GIT_TRACE_PACKET=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "< version 2") {
		t.Errorf("the server did not speak protocol v2:\n%s", out)
	}
	if got := g.must(clone, "rev-parse", "HEAD"); got != dev {
		t.Errorf("clone HEAD = %s, want %s (dev)", got, dev)
	}
	if got := g.must(clone, "rev-parse", "origin/main"); got != main {
		t.Errorf("clone origin/main = %s, want %s", got, main)
	}

	// And over protocol v0 with the scp-style URL.
	clone0 := filepath.Join(t.TempDir(), "clone0")
	g.must("", "-c", "protocol.version=0", "clone", "-q", ts.scpURL("demo.git"), clone0)
	if got := g.must(clone0, "rev-parse", "HEAD"); got != dev {
		t.Errorf("v0 clone HEAD = %s, want %s", got, dev)
	}
}

func TestRejectedPush(t *testing.T) {
	ts := startServer(t, &recorder{})
	g := ts.git(t, ts.aliceKey)
	work := g.newRepo()
	first := g.must(work, "rev-parse", "HEAD")
	g.must(work, "push", "-q", ts.scpURL("app"), "main")
	dir := filepath.Join(ts.dataDir, "repos", "app.git")

	for _, tc := range []struct {
		name, option, wantOut string
	}{
		{"handler explains", "reject=no buildpack could build this app", "remote: no buildpack could build this app"},
		{"handler silent", "reject=", "remote: push rejected (push ID "},
		{"handler panics", "panic", "remote: push rejected (push ID "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := g.commit(work, "f.txt", tc.name)
			_, stderr, err := g.run(work, "push", "-o", tc.option, ts.scpURL("app"), "main")
			if err == nil {
				t.Fatalf("push succeeded; want it rejected\n%s", stderr)
			}
			for _, want := range []string{tc.wantOut, "pre-receive hook declined"} {
				if !strings.Contains(stderr, want) {
					t.Errorf("push output lacks %q:\n%s", want, stderr)
				}
			}
			if got := serverGit(t, dir, "rev-parse", "refs/heads/main"); got != first {
				t.Errorf("server main = %s after a rejected push, want %s", got, first)
			}
			// The rejected commit went away with git's quarantine.
			cmd := exec.Command("git", "--git-dir="+dir, "cat-file", "-e", next)
			if cmd.Run() == nil {
				t.Errorf("rejected commit %s is in the repository", next)
			}
		})
	}
}

// TestLiveStreaming proves handler output reaches the pusher while the handler still runs:
// the handler blocks after its first line until the test has read that line from git push.
func TestLiveStreaming(t *testing.T) {
	release := make(chan struct{})
	ts := startServer(t, HandlerFunc(func(ctx context.Context, p *Push, out io.Writer) error {
		fmt.Fprintln(out, "line1")
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(30 * time.Second): // a guard against hanging, not part of the proof
			return errors.New("the test did not see line1 while the handler was running")
		}
		fmt.Fprintln(out, "line2")
		return nil
	}))
	g := ts.git(t, ts.aliceKey)
	work := g.newRepo()
	cmd := g.cmd(work, "push", ts.scpURL("live"), "main")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var transcript []string
	sc := bufio.NewScanner(stderr)
	released := false
	for sc.Scan() {
		transcript = append(transcript, sc.Text())
		if !released && strings.Contains(sc.Text(), "remote: line1") {
			close(release)
			released = true
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("push: %v\n%s", err, strings.Join(transcript, "\n"))
	}
	if !released {
		t.Fatalf("never saw remote: line1:\n%s", strings.Join(transcript, "\n"))
	}
	if !strings.Contains(strings.Join(transcript, "\n"), "remote: line2") {
		t.Errorf("never saw remote: line2:\n%s", strings.Join(transcript, "\n"))
	}
}

func TestShallowPushIntoNewApp(t *testing.T) {
	rec := &recorder{}
	ts := startServer(t, rec)
	g := ts.git(t, ts.aliceKey)
	work := g.newRepo()
	g.commit(work, "b.txt", "b")
	g.commit(work, "c.txt", "c")
	g.must(work, "push", "-q", ts.sshURL("full"), "main")

	// A CI checkout: a depth-1 clone, one more commit, pushed to a new app.
	ci := filepath.Join(t.TempDir(), "ci")
	g.must("", "clone", "-q", "--depth", "1", ts.sshURL("full"), ci)
	if got := g.must(ci, "rev-parse", "--is-shallow-repository"); got != "true" {
		t.Fatalf("clone is not shallow: %s", got)
	}
	head := g.commit(ci, "d.txt", "d")
	if _, stderr, err := g.run(ci, "push", ts.scpURL("from-ci"), "HEAD:refs/heads/main"); err != nil {
		t.Fatalf("shallow push: %v\n%s", err, stderr)
	}
	if s := rec.last(t); s.push.App != "from-ci" || s.catFile != "commit" {
		t.Errorf("handler saw %+v", s)
	}
	dir := filepath.Join(ts.dataDir, "repos", "from-ci.git")
	if got := serverGit(t, dir, "rev-parse", "refs/heads/main"); got != head {
		t.Errorf("from-ci main = %s, want %s", got, head)
	}
	clone := filepath.Join(t.TempDir(), "clone")
	g.must("", "clone", "-q", ts.sshURL("from-ci"), clone)
	if got := g.must(clone, "rev-parse", "HEAD"); got != head {
		t.Errorf("clone of from-ci HEAD = %s, want %s", got, head)
	}
}

func TestFetchOfMissingApp(t *testing.T) {
	ts := startServer(t, &recorder{})
	g := ts.git(t, ts.aliceKey)
	_, stderr, err := g.run("", "clone", ts.sshURL("ghost"), filepath.Join(t.TempDir(), "c"))
	if err == nil || !strings.Contains(stderr, "app ghost does not exist") {
		t.Errorf("clone of missing app: err %v, output:\n%s", err, stderr)
	}
	if got := repoEntries(t, ts.dataDir); len(got) != 0 {
		t.Errorf("repos dir holds %q after a fetch, want nothing", got)
	}
}

// sshRun runs the system ssh client against the server with command (none: a shell) and
// returns its stderr and exit status.
func (ts *testServer) sshRun(t *testing.T, key string, extra []string, command ...string) (string, int) {
	t.Helper()
	args := append(ts.sshArgs(key), extra...)
	args = append(append(args, "git@127.0.0.1"), command...)
	cmd := exec.Command("ssh", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stderr.String(), 0
	case errors.As(err, &ee):
		return stderr.String(), ee.ExitCode()
	default:
		t.Fatalf("ssh: %v", err)
		return "", 0
	}
}

func TestHostileNamesRefused(t *testing.T) {
	handlerCalled := false
	ts := startServer(t, HandlerFunc(func(context.Context, *Push, io.Writer) error {
		handlerCalled = true
		return nil
	}))
	long := strings.Repeat("a", 64)
	for _, tc := range []struct{ command, want string }{
		{`git-receive-pack '../x'`, `invalid app name "../x"`},
		{`git-receive-pack '/../../etc'`, `invalid app name "../../etc"`},
		{`git-receive-pack 'a/b'`, `invalid app name "a/b"`},
		{`git-receive-pack 'UPPER'`, `invalid app name "UPPER"`},
		{`git-receive-pack '1abc'`, `invalid app name "1abc"`},
		{`git-receive-pack 'a_b'`, `invalid app name "a_b"`},
		{`git-receive-pack '` + long + `'`, "is 64 characters long"},
		{`git-receive-pack 'it'\''s'`, `invalid app name "it's"`},
		{`git-receive-pack 'a b'`, `invalid app name "a b"`},
		{`git-receive-pack 'app;id'`, `invalid app name "app;id"`},
		{`git-receive-pack ''`, "app name is empty"},
		{`git-receive-pack app`, "single-quoted"},
		{`git-receive-pack 'app' ; id`, "single-quoted"},
		{`git-upload-pack '../x'`, `invalid app name "../x"`},
		{`git receive-pack 'a.b'`, `invalid app name "a.b"`},
	} {
		stderr, code := ts.sshRun(t, ts.aliceKey, nil, tc.command)
		if code != 1 || !strings.Contains(stderr, tc.want) || !strings.Contains(stderr, "DNS-1035") && !strings.Contains(stderr, "single-quoted") {
			t.Errorf("%s: exit %d, stderr %q; want exit 1 and %q", tc.command, code, stderr, tc.want)
		}
		if n := strings.Count(strings.TrimSpace(stderr), "\n"); n != 0 {
			t.Errorf("%s: message is %d lines, want one: %q", tc.command, n+1, stderr)
		}
	}
	// Through git itself, too.
	g := ts.git(t, ts.aliceKey)
	work := g.newRepo()
	for _, url := range []string{ts.scpURL("Bad_Name"), ts.sshURL("a/b"), ts.scpURL("../escape")} {
		_, stderr, err := g.run(work, "push", url, "main")
		if err == nil || !strings.Contains(stderr, "invalid app name") {
			t.Errorf("push to %s: err %v, output:\n%s", url, err, stderr)
		}
	}
	if got := repoEntries(t, ts.dataDir); len(got) != 0 {
		t.Errorf("repos dir holds %q after hostile names, want nothing", got)
	}
	var top []string
	ents, _ := os.ReadDir(ts.dataDir)
	for _, e := range ents {
		top = append(top, e.Name())
	}
	if want := []string{"hooks", "repos", HostKeyFile}; !reflect.DeepEqual(top, want) {
		t.Errorf("data dir holds %q, want %q", top, want)
	}
	if handlerCalled {
		t.Error("the handler was called for a hostile name")
	}
}

func TestUnknownKeyRefused(t *testing.T) {
	ts := startServer(t, &recorder{})
	stranger, _ := sshKey(t, "mallory")
	g := ts.git(t, stranger)
	work := g.newRepo()
	_, stderr, err := g.run(work, "push", ts.scpURL("app"), "main")
	if err == nil || !strings.Contains(stderr, "Permission denied (publickey)") {
		t.Errorf("push with unknown key: err %v, output:\n%s", err, stderr)
	}
	if got := repoEntries(t, ts.dataDir); len(got) != 0 {
		t.Errorf("repos dir holds %q, want nothing", got)
	}
}

func TestNonGitSessionsRefused(t *testing.T) {
	ts := startServer(t, &recorder{})
	for _, tc := range []struct {
		name    string
		extra   []string
		command []string
		want    []string
		code    int
	}{
		{"shell", nil, nil, []string{"interactive shells are not supported"}, 1},
		// A PTY is granted (and ignored): the refusal arrives, with CRLF line ends.
		{"pty", []string{"-tt"}, []string{"ls"}, []string{"unknown command \"ls\": this server only serves git (git push, git clone)\r\n"}, 1},
		{"other command", nil, []string{"ls", "-la"}, []string{`unknown command "ls"`}, 1},
		{"sftp subsystem", []string{"-s"}, []string{"sftp"}, []string{`subsystem "sftp" is not supported`}, 1},
		{"git-upload-archive", nil, []string{"git-upload-archive 'app'"}, []string{"not supported"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stderr, code := ts.sshRun(t, ts.aliceKey, tc.extra, tc.command...)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tc.code, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q lacks %q", stderr, w)
				}
			}
			if strings.Contains(stderr, "PTY allocation request failed") {
				t.Errorf("the PTY request was refused: %q", stderr)
			}
		})
	}
}

// TestCommandWithPTY: `ssh -t git@host COMMAND` (and -tt, as a script forces it) runs the
// command and delivers its output with CRLF line ends, its exit status intact; without a PTY
// output is untouched. The handler learns the address the client connected to; a bare
// `ssh git@host` is pointed at help.
func TestCommandWithPTY(t *testing.T) {
	var addr string
	h := CommandHandlerFunc(func(_ context.Context, c *Command) int {
		addr = c.Addr
		fmt.Fprint(c.Stdout, "one\ntwo\n")
		fmt.Fprint(c.Stderr, "warn\n")
		if len(c.Args) > 1 {
			return 3
		}
		return 0
	})
	ts := startServer(t, &recorder{}, WithCommandHandler(h))
	for _, tc := range []struct {
		name           string
		extra          []string
		command        []string
		stdout, stderr string
		code           int
	}{
		{"no pty", []string{"-T"}, []string{"hello"}, "one\ntwo\n", "warn\n", 0},
		{"pty", []string{"-tt"}, []string{"hello"}, "one\r\ntwo\r\n", "warn\r\n", 0},
		{"pty, failing", []string{"-tt"}, []string{"hello", "x"}, "one\r\ntwo\r\n", "warn\r\n", 3},
		{"shell", []string{"-T"}, nil, "", "interactive shells are not supported; run: ssh -p " + ts.port + " git@127.0.0.1 help\n", 1},
		{"shell with pty", []string{"-tt"}, nil, "", "interactive shells are not supported; run: ssh -p " + ts.port + " git@127.0.0.1 help\r\n", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := ts.ssh(t, ts.aliceKey, "", tc.extra, tc.command...)
			if stdout != tc.stdout || stderr != tc.stderr || code != tc.code {
				t.Errorf("stdout %q, stderr %q, exit %d; want %q, %q, %d", stdout, stderr, code, tc.stdout, tc.stderr, tc.code)
			}
		})
	}
	if want := "127.0.0.1:" + ts.port; addr != want {
		t.Errorf("Command.Addr = %q, want %q", addr, want)
	}
}

// TestHandlerContextEndsWithConnection: the ctx given to PreReceive is the SSH session's, so
// it ends when the pusher goes away.
func TestHandlerContextEndsWithConnection(t *testing.T) {
	started, cancelled := make(chan struct{}), make(chan error, 1)
	ts := startServer(t, HandlerFunc(func(ctx context.Context, p *Push, out io.Writer) error {
		close(started)
		<-ctx.Done()
		cancelled <- ctx.Err()
		return ctx.Err()
	}))
	g := ts.git(t, ts.aliceKey)
	work := g.newRepo()
	cmd := g.cmd(work, "push", ts.scpURL("gone"), "main")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // so git and its ssh die together
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(60 * time.Second): // a guard against hanging, not part of the proof
		t.Fatal("handler never called")
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	cmd.Wait()
	select {
	case err := <-cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("handler ctx ended with %v, want context.Canceled", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("handler ctx not cancelled after the pusher disconnected")
	}
	// The refused first push leaves no ref, and its empty repository goes too once git has
	// exited (TestAbandonedFirstPushLeavesNothing): wait for that, which also keeps the removal
	// from racing the test's own cleanup of the data dir.
	dir := filepath.Join(ts.dataDir, "repos", "gone.git")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			refs, _ := exec.Command("git", "--git-dir="+dir, "for-each-ref").Output()
			t.Fatalf("the repository of the abandoned first push is still there after 30s, with refs %q", refs)
		}
	}
}

func TestMaxPushSize(t *testing.T) {
	ts := startServer(t, &recorder{}, WithMaxPushSize(10_000))
	g := ts.git(t, ts.aliceKey)
	work := g.newRepo()
	big := make([]byte, 64<<10)
	rand.Read(big) // incompressible
	g.commit(work, "big.bin", string(big))
	_, stderr, err := g.run(work, "push", ts.scpURL("big"), "main")
	if err == nil || !strings.Contains(stderr, "maximum allowed size") {
		t.Errorf("push over the limit: err %v, output:\n%s", err, stderr)
	}
}
