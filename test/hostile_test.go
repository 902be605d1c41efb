package test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	gossh "golang.org/x/crypto/ssh"
)

// updateDocs rewrites docs/hostile-inputs.md from hostileRows instead of checking it.
var updateDocs = flag.Bool("update", false, "rewrite docs/hostile-inputs.md from the hostile-input table (also KPUSH_UPDATE_DOCS=1)")

const hostileDoc = "../docs/hostile-inputs.md"

// hostileEnv is what a row runs against: a `kpush dev` with an app "demo" that has a
// deployed release v1 on main, the admin's git environment and a work tree of demo.
type hostileEnv struct {
	t    *testing.T
	s    *server
	env  []string
	work string // a clone of demo with its remote "knative"
	host string // "127.0.0.1"
	port string
	mark string // a path that exists only if something ran a command it was handed
}

// outcome is what one hostile input got back: its exit status and everything it printed.
type outcome struct {
	code int
	out  string
}

// hostileRow is one input a careless or hostile client sends. Every row is refused: a non-zero
// exit, a message for people containing want (and no raw control character), and the data
// dir's snapshot (hostileSnapshot) unchanged.
type hostileRow struct {
	area  string // what is attacked: "repository path", "SSH request", …
	input string // the input as the docs show it
	via   string // what sends it: git, OpenSSH, x/crypto/ssh
	want  string // a fragment of the message the client must print
	run   func(h *hostileEnv) outcome
}

// TestDevRefusesHostileInputs sends every input of hostileRows to a real `kpush dev` over
// real SSH and git, and checks that each is refused with a message for people that says why,
// exits non-zero, and leaves the data dir as it was; nothing a row carried ran as a command.
// The same rows are the table of docs/hostile-inputs.md (see TestHostileInputsDocIsCurrent).
func TestDevRefusesHostileInputs(t *testing.T) {
	s, _, env := devServer(t)
	host, port, _ := net.SplitHostPort(s.sshAddr)
	h := &hostileEnv{t: t, s: s, env: env, host: host, port: port, mark: filepath.Join(t.TempDir(), "pwned")}
	h.work = workTree(t, env, "static")
	git(t, env, h.work, "remote", "add", "knative", s.remote("demo"))
	if out, code := push(t, env, h.work, "knative", "main"); code != 0 {
		t.Fatalf("first push of demo exited %d:\n%s", code, out)
	}
	data := dataDirOf(s)
	before := hostileSnapshot(t, data)
	for _, want := range []string{"repos/demo.git/refs/heads/main ", "state/access.json ", "state/apps/demo/releases/v1.json "} {
		if !strings.Contains(strings.Join(before, "\n"), want) {
			t.Fatalf("the data dir snapshot lacks %q: it would compare nothing:\n%s", want, strings.Join(before, "\n"))
		}
	}
	for _, row := range hostileRows() {
		t.Run(row.area+": "+row.input, func(t *testing.T) {
			h.t = t
			got := row.run(h)
			t.Logf("exit %d:\n%s", got.code, got.out)
			if got.code == 0 {
				t.Errorf("exit 0, want a refusal")
			}
			if !strings.Contains(got.out, row.want) {
				t.Errorf("output lacks %q", row.want)
			}
			if i := strings.IndexFunc(got.out, func(r rune) bool { return unicode.IsControl(r) && r != '\n' && r != '\t' && r != '\r' }); i >= 0 {
				t.Errorf("output carries a raw control character %q at byte %d", got.out[i:i+1], i)
			}
			if after := hostileSnapshot(t, data); !slices.Equal(after, before) {
				t.Errorf("the data dir changed:\n%s", diffLines(before, after))
				before = after
			}
			if _, err := os.Lstat(h.mark); err == nil {
				t.Errorf("%s exists: something ran a command the input carried", h.mark)
				os.Remove(h.mark)
			}
		})
	}
}

// hostileSnapshot lists what a refused input must not change under the data dir dir: the
// repositories (every file: refs, objects, config, reflogs), the state (apps, releases,
// builds, access grants and keys), the hooks and the host key, each as path, mode and content
// hash. Left out, because they change without any input being accepted:
//   - tmp/ and builds/ (git's quarantine and build scratch come and go), and logs;
//   - registry/ (its blob store and garbage collection are the registry's), cache/ (build
//     caches, written only by builds) and apps/ (the local runtime's extracted images and
//     the running apps' output, which grows as they serve);
//   - state/leases (a build lease's file carries its holder's expiry time);
//   - sockets (the hook endpoint), and directories' own entries beyond the files in them.
func hostileSnapshot(t *testing.T, dir string) []string {
	t.Helper()
	skip := []string{"tmp", "builds", "logs", "registry", "cache", "apps", "state/leases"}
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // gone between listing and reading: git's lock files
			}
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		for _, s := range skip {
			if rel == s || strings.HasPrefix(rel, s+"/") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		fi, err := d.Info()
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSocket != 0, strings.HasSuffix(rel, ".lock"):
			return nil
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			out = append(out, fmt.Sprintf("%s %v -> %s", rel, fi.Mode(), l))
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out = append(out, fmt.Sprintf("%s %v sha256:%x", rel, fi.Mode(), sha256.Sum256(b)))
		default:
			out = append(out, fmt.Sprintf("%s %v", rel, fi.Mode()))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// gitURL runs git with args, where "URL" stands for ssh://git@HOST:PORT and MARK for h.mark.
func (h *hostileEnv) git(args ...string) outcome {
	for i := range args {
		args[i] = strings.ReplaceAll(strings.ReplaceAll(args[i], "URL", "ssh://git@"+h.s.sshAddr), "MARK", h.mark)
	}
	cmd := exec.Command("git", args...)
	cmd.Dir, cmd.Env = h.work, h.env
	out, err := cmd.CombinedOutput()
	return outcome{exitCode(h.t, err), string(out)}
}

// openssh runs the OpenSSH client as the admin: ssh -p PORT [flags] git@HOST [args].
func (h *hostileEnv) openssh(flags []string, args ...string) outcome {
	r := sshRun(h.t, h.s, h.s.key, "", flags, args...)
	return outcome{r.code, r.stdout + r.stderr}
}

// client logs in as the admin with x/crypto/ssh, which sends what OpenSSH will not: NUL bytes
// in an exec request, a shell without a terminal, requests in any order.
func (h *hostileEnv) client() *gossh.Client {
	h.t.Helper()
	pem, err := os.ReadFile(h.s.key)
	if err != nil {
		h.t.Fatal(err)
	}
	signer, err := gossh.ParsePrivateKey(pem)
	if err != nil {
		h.t.Fatal(err)
	}
	c, err := gossh.Dial("tcp", h.s.sshAddr, &gossh.ClientConfig{
		User: "git", Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 30 * time.Second,
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

// session runs one session on a fresh connection: prepare sends requests and may return a
// refusal of its own (outcome.out), then start (exec, shell, subsystem) runs it with stdin.
func (h *hostileEnv) session(prepare func(*gossh.Session) string, start func(*gossh.Session) error, stdin string) outcome {
	h.t.Helper()
	sess, err := h.client().NewSession()
	if err != nil {
		h.t.Fatal(err)
	}
	defer sess.Close()
	var note string
	if prepare != nil {
		note = prepare(sess)
	}
	var out, errOut bytes.Buffer
	sess.Stdout, sess.Stderr, sess.Stdin = &out, &errOut, strings.NewReader(stdin)
	all := func() string { return out.String() + errOut.String() }
	if err := start(sess); err != nil {
		return outcome{-1, note + "start: " + err.Error()}
	}
	done := make(chan error, 1)
	go func() { done <- sess.Wait() }()
	var err2 error
	select {
	case err2 = <-done:
	case <-time.After(30 * time.Second):
		return outcome{-1, note + all() + "\n(no exit within 30s)"}
	}
	code := 0
	if ee, ok := err2.(*gossh.ExitError); ok {
		code = ee.ExitStatus()
	} else if err2 != nil {
		return outcome{-1, note + all() + "\n" + err2.Error()}
	}
	return outcome{code, note + all()}
}

// exec sends cmd as one exec request, bytes as they are.
func (h *hostileEnv) exec(cmd string) outcome {
	return h.session(nil, func(s *gossh.Session) error { return s.Start(cmd) }, "")
}

// refusedRequest sends a session request of type typ and, when it is refused, runs `help`
// on the same session: a refusal must not break it. The outcome says whether it was refused.
func (h *hostileEnv) refusedRequest(typ string, payload []byte) outcome {
	var ok bool
	o := h.session(func(s *gossh.Session) string {
		var err error
		ok, err = s.SendRequest(typ, true, payload)
		if err != nil {
			return "request: " + err.Error() + "\n"
		}
		return ""
	}, func(s *gossh.Session) error { return s.Start("help") }, "")
	if ok {
		return outcome{0, "the server accepted " + typ + "\n" + o.out}
	}
	if o.code != 0 {
		return outcome{0, "after the refusal the session failed:\n" + o.out}
	}
	return outcome{1, typ + " refused; the session still ran help"}
}

// envIgnored sends env requests name=value on a session that then runs cmd (which must
// succeed), and reports a refusal when the variable changed nothing kpush's git did.
func (h *hostileEnv) envIgnored(name, value, cmd, wantOut string) outcome {
	o := h.session(func(s *gossh.Session) string {
		s.Setenv(name, value) // refused or accepted: what counts is that git never sees it
		return ""
	}, func(s *gossh.Session) error { return s.Start(cmd) }, "0000")
	if o.code != 0 || !strings.Contains(o.out, wantOut) || strings.Contains(o.out, "ld.so") {
		return outcome{0, fmt.Sprintf("%s=%s changed what %q did (exit %d):\n%s", name, value, cmd, o.code, o.out)}
	}
	return outcome{1, name + " ignored: only GIT_PROTOCOL reaches git"}
}

// pushOut is `git push` in the work tree of demo with args.
func (h *hostileEnv) push(args ...string) outcome {
	out, code := push(h.t, h.env, h.work, args...)
	return outcome{code, out}
}

// receivePack speaks git's receive-pack protocol to demo over an exec request, for ref
// updates the git client refuses to send: it reads the advertisement, sends commands (a
// delete of each ref name, so no pack follows) with report-status, and returns the report.
func (h *hostileEnv) receivePack(refs ...string) outcome {
	sess, err := h.client().NewSession()
	if err != nil {
		h.t.Fatal(err)
	}
	defer sess.Close()
	in, _ := sess.StdinPipe()
	outp, _ := sess.StdoutPipe()
	var stderr bytes.Buffer
	sess.Stderr = &stderr
	if err := sess.Start("git-receive-pack 'demo'"); err != nil {
		h.t.Fatal(err)
	}
	r := bufio.NewReader(outp)
	old := ""
	for {
		line, err := readPkt(r)
		if err != nil {
			h.t.Fatalf("reading the advertisement: %v", err)
		}
		if line == "" {
			break
		}
		if old == "" {
			old = line[:40]
		}
	}
	for i, ref := range refs {
		cmd := old + " " + strings.Repeat("0", 40) + " " + ref
		if i == 0 {
			cmd += "\x00report-status"
		}
		fmt.Fprintf(in, "%04x%s\n", len(cmd)+5, cmd)
	}
	io.WriteString(in, "0000")
	var report strings.Builder
	for {
		line, err := readPkt(r)
		if err != nil || line == "" {
			break
		}
		report.WriteString(fmt.Sprintf("%q\n", strings.TrimSuffix(line, "\n")))
	}
	in.Close()
	code := 0
	if ee, ok := sess.Wait().(*gossh.ExitError); ok {
		code = ee.ExitStatus()
	}
	if strings.Contains(report.String(), `"ok `) || !strings.Contains(report.String(), `"ng `) {
		code = 0 // a ref accepted, or no refusal reported
	} else {
		code = 1 // git's report names the refusal; the exit status of receive-pack is 0
	}
	return outcome{code, report.String() + stderr.String()}
}

// readPkt reads one pkt-line; "" is a flush.
func readPkt(r *bufio.Reader) (string, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return "", err
	}
	var n int
	if _, err := fmt.Sscanf(string(hdr[:]), "%04x", &n); err != nil {
		return "", fmt.Errorf("bad pkt-line header %q", hdr)
	}
	if n == 0 {
		return "", nil
	}
	b := make([]byte, n-4)
	_, err := io.ReadFull(r, b)
	return string(b), err
}

func exitCode(t *testing.T, err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0
}

const buildN = "N is a build number, e.g. 3"

// hostileRows is the table: what is sent, how, and the message that must come back.
func hostileRows() []hostileRow {
	lsRemote := func(path string) func(h *hostileEnv) outcome {
		return func(h *hostileEnv) outcome { return h.git("ls-remote", "URL/"+path) }
	}
	clone := func(path string) func(h *hostileEnv) outcome {
		return func(h *hostileEnv) outcome {
			return h.git("clone", "-q", "URL/"+path, filepath.Join(h.t.TempDir(), "clone"))
		}
	}
	pushTo := func(path string) func(h *hostileEnv) outcome {
		return func(h *hostileEnv) outcome { return h.git("push", "URL/"+path, "main") }
	}
	rawExec := func(cmd string) func(h *hostileEnv) outcome {
		return func(h *hostileEnv) outcome { return h.exec(strings.ReplaceAll(cmd, "MARK", h.mark)) }
	}
	ssh := func(args ...string) func(h *hostileEnv) outcome {
		return func(h *hostileEnv) outcome {
			for i := range args {
				args[i] = strings.ReplaceAll(args[i], "MARK", h.mark)
			}
			return h.openssh(nil, args...)
		}
	}
	long := strings.Repeat("a", 300)
	manyKeys := make([]string, 10000)
	for i := range manyKeys {
		manyKeys[i] = fmt.Sprintf("K%05d=v", i)
	}
	rows := []hostileRow{
		// Repository paths, in every way git and people name one.
		{"repository path", "../x", "git ls-remote", `invalid app name "../x"`, lsRemote("../x")},
		{"repository path", "a/../../etc", "git clone", `invalid app name "a/../../etc"`, clone("a/../../etc")},
		{"repository path", "../../../../etc/passwd", "git push", `invalid app name "../../../../etc/passwd"`, pushTo("../../../../etc/passwd")},
		{"repository path", "%2e%2e/x (git decodes it)", "git ls-remote", `invalid app name "../x"`, lsRemote("%2e%2e/x")},
		{"repository path", `\xc0\xae\xc0\xae/x (overlong UTF-8 "..")`, "git ls-remote", `invalid app name "\xc0\xae\xc0\xae/x"`, lsRemote("\xc0\xae\xc0\xae/x")},
		{"repository path", `demo\x00x (NUL)`, "x/crypto exec git-upload-pack", `invalid app name "demo\x00x"`, rawExec("git-upload-pack 'demo\x00x'")},
		{"repository path", "--upload-pack=touch MARK", "x/crypto exec git-upload-pack", `app name "--upload-pack=touch "...`, rawExec("git-upload-pack '--upload-pack=touch MARK'")},
		{"repository path", "-h, unquoted", "OpenSSH exec git-upload-pack", "repository path must be one single-quoted argument", ssh("git-upload-pack", "-h")},
		{"repository path", "'-h'", "OpenSSH exec git-receive-pack", `invalid app name "-h"`, ssh("git-receive-pack", "'-h'")},
		{"repository path", "demo;touch MARK", "git ls-remote", `invalid app name "demo;touch`, lsRemote("demo;touch%20MARK")},
		{"repository path", "'demo'; touch MARK", "OpenSSH exec git-upload-pack", "repository path must be one single-quoted argument", ssh("git-upload-pack", "'demo';", "touch", "MARK")},
		{"repository path", "$(touch MARK)", "git push", `invalid app name "$(touch`, pushTo("$(touch MARK)")},
		{"repository path", "`touch MARK`", "git clone", "invalid app name \"`touch", clone("`touch MARK`")},
		{"repository path", "demo|touch MARK", "git ls-remote", `invalid app name "demo|touch`, lsRemote("demo|touch MARK")},
		{"repository path", "300 × a", "git ls-remote", "is 300 characters long", lsRemote(long)},
		{"repository path", "dеmo (Cyrillic е)", "git push", `invalid app name "d\u0435mo"`, pushTo("dеmo")},
		{"repository path", `demo\u202e (RTL override)`, "git ls-remote", `invalid app name "demo\u202e"`, lsRemote("demo\u202e")},
		{"repository path", "Demo", "git push", `invalid app name "Demo"`, pushTo("Demo")},
		{"repository path", "demo.git.git", "git ls-remote", `invalid app name "demo.git"`, lsRemote("demo.git.git")},
		{"repository path", ".git", "git ls-remote", "app name is empty", lsRemote(".git")},
		{"repository path", "demo/.git", "git clone", `invalid app name "demo/"`, clone("demo/.git")},
		{"repository path", "demo.GIT", "git push", `invalid app name "demo.GIT"`, pushTo("demo.GIT")},
		{"repository path", "none given", "OpenSSH exec git-upload-pack", "git-upload-pack needs a repository path", ssh("git-upload-pack")},

		// SSH requests other than exec of a git service or a kpush command.
		{"SSH request", "shell", "x/crypto/ssh", "interactive shells are not supported; run: ssh -p",
			func(h *hostileEnv) outcome { return h.session(nil, (*gossh.Session).Shell, "") }},
		{"SSH request", "pty-req, then shell", "OpenSSH ssh -tt", "interactive shells are not supported; run: ssh -p",
			func(h *hostileEnv) outcome { return h.openssh([]string{"-tt"}) }},
		{"SSH request", "env LD_PRELOAD=/nonexistent.so", "x/crypto/ssh", "LD_PRELOAD ignored",
			func(h *hostileEnv) outcome {
				return h.envIgnored("LD_PRELOAD", "/nonexistent.so", "git-upload-pack 'demo'", "refs/heads/main")
			}},
		{"SSH request", "env GIT_DIR=/etc", "x/crypto/ssh", "GIT_DIR ignored",
			func(h *hostileEnv) outcome {
				return h.envIgnored("GIT_DIR", "/etc", "git-upload-pack 'demo'", "refs/heads/main")
			}},
		{"SSH request", "env GIT_CONFIG_PARAMETERS='uploadpack.hideRefs=refs/heads'", "x/crypto/ssh", "GIT_CONFIG_PARAMETERS ignored",
			func(h *hostileEnv) outcome {
				return h.envIgnored("GIT_CONFIG_PARAMETERS", "'uploadpack.hiderefs=refs/heads'", "git-upload-pack 'demo'", "refs/heads/main")
			}},
		{"SSH request", "env GIT_PROTOCOL=version=2:x=$(touch MARK)", "x/crypto/ssh", "GIT_PROTOCOL ignored",
			func(h *hostileEnv) outcome {
				return h.envIgnored("GIT_PROTOCOL", "version=2:x=$(touch "+h.mark+")", "git-upload-pack 'demo'", "refs/heads/main")
			}},
		{"SSH request", "local port forwarding (-L)", "x/crypto/ssh direct-tcpip", "port forwarding is not supported",
			func(h *hostileEnv) outcome {
				_, err := h.client().Dial("tcp", h.s.sshAddr)
				if err == nil {
					return outcome{0, "forwarded"}
				}
				return outcome{1, err.Error()}
			}},
		{"SSH request", "remote port forwarding (-R)", "OpenSSH ssh -R", "remote port forwarding failed",
			func(h *hostileEnv) outcome {
				return h.openssh([]string{"-o", "ExitOnForwardFailure=yes", "-R", "127.0.0.1:0:127.0.0.1:1"}, "help")
			}},
		{"SSH request", "agent forwarding (-A)", "x/crypto/ssh auth-agent-req@openssh.com", "auth-agent-req@openssh.com refused",
			func(h *hostileEnv) outcome { return h.refusedRequest("auth-agent-req@openssh.com", nil) }},
		{"SSH request", "X11 forwarding (-X)", "x/crypto/ssh x11-req", "x11-req refused",
			func(h *hostileEnv) outcome {
				return h.refusedRequest("x11-req", gossh.Marshal(struct {
					Single        bool
					Proto, Cookie string
					Screen        uint32
				}{false, "MIT-MAGIC-COOKIE-1", "00112233445566778899aabbccddeeff", 0}))
			}},
		{"SSH request", "subsystem sftp", "OpenSSH ssh -s", `subsystem "sftp" is not supported`,
			func(h *hostileEnv) outcome { return h.openssh([]string{"-s"}, "sftp") }},
		{"SSH request", "exec ls", "OpenSSH", `unknown command "ls"`, ssh("ls")},
		{"SSH request", "exec sh -c 'touch MARK'", "OpenSSH", `unknown command "sh"`, ssh("sh", "-c", "'touch MARK'")},
		{"SSH request", "exec git-upload-archive 'demo'", "OpenSSH", "git archive --remote is not supported", ssh("git-upload-archive", "'demo'")},
		{"SSH request", "exec git receive-pack '../x' (with a space)", "OpenSSH", `invalid app name "../x"`, ssh("git", "receive-pack", "'../x'")},
		{"SSH request", "exec git-shell -c 'touch MARK'", "OpenSSH", `unknown command "git-shell"`, ssh("git-shell", "-c", "'touch MARK'")},

		// Arguments of kpush's commands.
		{"command argument", "apps:info 'demo (unbalanced ')", "OpenSSH", "a ' quote is not closed", ssh("apps:info", "'demo")},
		{"command argument", `apps:info "demo (unbalanced ")`, "OpenSSH", `a " quote is not closed`, ssh("apps:info", `"demo`)},
		{"command argument", "apps:create 'x;touch MARK'", "OpenSSH", `invalid app name "x;touch`, ssh("apps:create", "'x;touch MARK'")},
		{"command argument", "apps:info demo $(touch MARK)", "OpenSSH", `unexpected argument "$(touch`, ssh("apps:info", "demo", "'$(touch MARK)'")},
		{"command argument", "config:set demo 'A=x\\x00y' (NUL)", "x/crypto exec", "the value of A contains a NUL byte",
			rawExec("config:set demo 'A=x\x00y'")},
		// Over the SSH transport's 256 KiB packet limit (x/crypto/ssh): the connection is cut
		// before kpush sees the command, and OpenSSH says only that; nothing is stored.
		{"command argument", "config:set demo 'A=<1 MiB>'", "OpenSSH", "Broken pipe",
			func(h *hostileEnv) outcome {
				// One argument of ssh holds at most 128 KiB (Linux's MAX_ARG_STRLEN): the value
				// goes in 16 words, quoted for the server to join.
				args := []string{"config:set", "demo"}
				for i := range 16 {
					w := strings.Repeat("x", 64<<10)
					if i == 0 {
						w = "'A=" + w
					}
					if i == 15 {
						w += "'"
					}
					args = append(args, w)
				}
				return h.openssh(nil, args...)
			}},
		{"command argument", "config:set demo A=<200 KiB>", "x/crypto exec", "over the limit of 73728 (72 KiB)",
			rawExec("config:set demo A=" + strings.Repeat("x", 200<<10))},
		{"command argument", "config:set demo K00000=v … K09999=v (10,000 keys)", "OpenSSH", "over the limit of 73728 (72 KiB)",
			func(h *hostileEnv) outcome {
				return h.openssh(nil, append([]string{"config:set", "demo"}, manyKeys...)...)
			}},
		{"command argument", "rollback demo v0", "OpenSSH", "v0", ssh("rollback", "demo", "v0")},
		{"command argument", "rollback demo v-1", "OpenSSH", "v-1", ssh("rollback", "demo", "v-1")},
		{"command argument", "rollback demo v99999999999999999999", "OpenSSH", "v99999999999999999999", ssh("rollback", "demo", "v99999999999999999999")},
		{"command argument", "rollback demo vx", "OpenSSH", `"vx"`, ssh("rollback", "demo", "vx")},
		{"command argument", "rollback demo v2 (no such release)", "OpenSSH", "v2", ssh("rollback", "demo", "v2")},
		{"command argument", "builds:output demo 0", "OpenSSH", buildN, ssh("builds:output", "demo", "0")},
		{"command argument", "builds:output demo -- -1", "OpenSSH", buildN, ssh("builds:output", "demo", "--", "-1")},
		{"command argument", "builds:output demo 99999999999999999999", "OpenSSH", buildN, ssh("builds:output", "demo", "99999999999999999999")},
		{"command argument", "builds:output demo x", "OpenSSH", buildN, ssh("builds:output", "demo", "x")},
		{"command argument", "builds:output demo 1x", "OpenSSH", buildN, ssh("builds:output", "demo", "1x")},
		{"command argument", "builds:output demo 2 (no such build)", "OpenSSH", "2", ssh("builds:output", "demo", "2")},

		// Ref names pushed.
		{"ref name", "refs/kpush/releases/v1 (kpush's hidden namespace)", "git push", "deny updating a hidden ref",
			func(h *hostileEnv) outcome { return h.push("knative", "HEAD:refs/kpush/releases/v1") }},
		{"ref name", "refs/heads/<300 × a> (longer than a file name may be)", "git push", "remote rejected",
			func(h *hostileEnv) outcome { return h.push("knative", "HEAD:refs/heads/"+long) }},
		{"ref name", `refs/heads/a\x01b (control character)`, "receive-pack protocol over x/crypto exec", "funny refname",
			func(h *hostileEnv) outcome { return h.receivePack("refs/heads/a\x01b") }},
		{"ref name", `refs/heads/a\x1b[2Jb (escape sequence)`, "receive-pack protocol over x/crypto exec", "funny refname",
			func(h *hostileEnv) outcome { return h.receivePack("refs/heads/a\x1b[2Jb") }},
		{"ref name", "refs/heads/../x", "receive-pack protocol over x/crypto exec", "funny refname",
			func(h *hostileEnv) outcome { return h.receivePack("refs/heads/../x") }},

		// Push options.
		{"push option", "-o opt0 … -o opt999", "git push", `unknown push option "opt0" (of 1000 given)`,
			func(h *hostileEnv) outcome {
				args := []string{}
				for i := range 1000 {
					args = append(args, "-o", fmt.Sprintf("opt%d", i))
				}
				// A commit to push: the options reach kpush only with a ref update. Every
				// push-option row pushes it, since none may store it.
				if err := os.WriteFile(filepath.Join(h.work, "options"), []byte("options\n"), 0o644); err != nil {
					h.t.Fatal(err)
				}
				git(h.t, h.env, h.work, "add", "options")
				git(h.t, h.env, h.work, "commit", "-q", "-m", "options")
				return h.push(append(args, "knative", "main")...)
			}},
		{"push option", "-o <65,000 bytes> (a pkt-line holds 65,516)", "git push", `unknown push option "oooooooo`,
			func(h *hostileEnv) outcome { return h.push("-o", strings.Repeat("o", 65000), "knative", "main") }},
		{"push option", `-o "a\x1b[2Jb" (control character)`, "git push", `unknown push option "a\x1b[2Jb"`,
			func(h *hostileEnv) outcome { return h.push("-o", "a\x1b[2Jb", "knative", "main") }},
		{"push option", "-o no-such-option", "git push", `unknown push option "no-such-option"`,
			func(h *hostileEnv) outcome { return h.push("-o", "no-such-option", "knative", "main") }},
	}
	return rows
}

// hostileTable renders rows as the Markdown table of docs/hostile-inputs.md.
func hostileTable(rows []hostileRow) string {
	cell := func(s string) string {
		s = strings.ReplaceAll(s, "|", `\|`)
		if strings.Contains(s, "`") {
			return "`` " + s + " ``"
		}
		return "`" + s + "`"
	}
	var b strings.Builder
	b.WriteString("| what | input | sent with | answer contains |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.area, cell(strings.ToValidUTF8(r.input, "?")), r.via, cell(r.want))
	}
	return b.String()
}

var (
	generatedTable = regexp.MustCompile(`(?s)(<!-- generated from hostileRows .*?-->\n).*?(<!-- end of generated table -->)`)
	faultTable     = regexp.MustCompile(`(?s)<!-- faults injected elsewhere -->\n(.*?)<!-- end of faults -->`)
)

// TestHostileInputsDocIsCurrent checks that docs/hostile-inputs.md holds the table of
// hostileRows as it is (with -update or KPUSH_UPDATE_DOCS=1 it writes it), and that every
// test its hand-kept table of injected faults names exists.
func TestHostileInputsDocIsCurrent(t *testing.T) {
	doc, err := os.ReadFile(hostileDoc)
	if err != nil {
		t.Fatal(err)
	}
	m := generatedTable.FindSubmatchIndex(doc)
	if m == nil {
		t.Fatalf("%s lacks the generated table's markers", hostileDoc)
	}
	want := hostileTable(hostileRows())
	if got := string(doc[m[3]:m[4]]); got != want {
		if *updateDocs || os.Getenv("KPUSH_UPDATE_DOCS") == "1" {
			doc = slices.Concat(doc[:m[3]], []byte(want), doc[m[4]:])
			if err := os.WriteFile(hostileDoc, doc, 0o644); err != nil {
				t.Fatal(err)
			}
		} else {
			t.Errorf("%s is out of date with hostileRows; run: go test ./test -run TestHostileInputsDocIsCurrent -update\n%s",
				hostileDoc, diffLines(strings.Split(got, "\n"), strings.Split(want, "\n")))
		}
	}

	f := faultTable.FindSubmatch(doc)
	if f == nil {
		t.Fatalf("%s lacks the table of faults injected elsewhere", hostileDoc)
	}
	named := regexp.MustCompile("`((?:[a-z]+/)*[a-z_]+_test\\.go)` `(Test[A-Za-z0-9_]+)`").FindAllStringSubmatch(string(f[1]), -1)
	if len(named) == 0 {
		t.Fatalf("the table of faults names no test")
	}
	for _, n := range named {
		src, err := os.ReadFile(filepath.Join("..", n[1]))
		if err != nil {
			t.Errorf("%s names %s in %s: %v", hostileDoc, n[2], n[1], err)
			continue
		}
		if !regexp.MustCompile(`(?m)^func ` + n[2] + `\(t \*testing\.T\)`).Match(src) {
			t.Errorf("%s names %s, which %s does not define", hostileDoc, n[2], n[1])
		}
	}
}
