package test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDevCommandLineAndAccessEdges: careless and hostile users at the SSH command line and
// the access edges, against `kpush dev` with the real OpenSSH client and git:
//   - a command line whose quoting does not close is refused, nothing changed, with a quoting
//     that works;
//   - keys:add without a key on stdin does not wait for ever, and refuses a terminal;
//   - to a user without a role, an app and a missing one answer byte for byte the same, in git
//     and in every command (apps:create of a taken name says taken, never by whom);
//   - escape sequences in a config value, a failure reason, an app's output, a build log and
//     a branch name are shown escaped in human output and kept exact in --json;
//   - a first push that ends with nothing leaves no repository and no grant;
//   - a grant needs an existing app.
func TestDevCommandLineAndAccessEdges(t *testing.T) {
	bp := escapeBuildpack(t)
	s, _, env := devServer(t, "--buildpack", bp)
	data := dataDirOf(s)
	bobKey := addUser(t, s, "bob") // a registered user without a role on anything
	kpushOK(t, s, "apps:create", "demo")

	t.Run("unbalanced quotes are refused and change nothing", func(t *testing.T) {
		for _, value := range []string{"KEY='unbalanced", "KEY=it's", `KEY="open`, `KEY=x\`} {
			// exec passes the argument as a shell would after removing its quotes:
			// ssh … config:set demo "KEY=it's"
			r := sshCmd(t, s, s.key, "", "config:set", "demo", value)
			if r.code == 0 || !strings.Contains(r.stderr, "nothing was run") ||
				!strings.Contains(r.stderr, "quote a value for both") || r.stdout != "" {
				t.Errorf("config:set demo %s: %+v; want refused with a quoting hint", value, r)
			}
		}
		var cfg struct{ Env map[string]string }
		kpushJSON(t, s, &cfg, "config", "demo", "--json")
		if len(cfg.Env) != 0 {
			t.Errorf("config of demo after refused config:set = %v, want none", cfg.Env)
		}
		// The suggested quoting, as the shell hands it to ssh, sets the value meant.
		r := sshCmd(t, s, s.key, "", "config:set", "demo", "KEY=it's")
		_, port, _ := net.SplitHostPort(s.sshAddr)
		want := `ssh -p ` + port + ` git@127.0.0.1 "config:set demo \"KEY=it's\""`
		if !strings.Contains(r.stderr, want) {
			t.Fatalf("hint for config:set demo KEY=it's:\n%s\nwant %s", r.stderr, want)
		}
		kpushOK(t, s, `config:set demo "KEY=it's"`)
		kpushJSON(t, s, &cfg, "config", "demo", "--json")
		if cfg.Env["KEY"] != "it's" {
			t.Errorf("KEY = %q after the suggested command, want %q", cfg.Env["KEY"], "it's")
		}
	})

	t.Run("keys:add without a key on stdin gives up", func(t *testing.T) {
		r := sshCmd(t, s, bobKey, "", "keys:add", "empty")
		if r.code != 1 || !strings.Contains(r.stderr, "no public key given") {
			t.Errorf("keys:add with empty stdin: %+v", r)
		}
		// stdin open and silent: what `ssh … keys:add NAME` without "< key.pub" sends.
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer pr.Close()
		defer pw.Close()
		// A kpush that waits for ever gets the end of stdin after a minute, and fails below.
		guard := time.AfterFunc(time.Minute, func() { pw.Close() })
		defer guard.Stop()
		start := time.Now()
		r = sshWithStdin(t, s, bobKey, pr, "keys:add", "silent")
		took := time.Since(start)
		if r.code != 1 || !strings.Contains(r.stderr, "no public key arrived on stdin within 10s") ||
			!strings.Contains(r.stderr, "keys:add silent < ~/.ssh/id_ed25519.pub") {
			t.Errorf("keys:add with a silent stdin: %+v", r)
		}
		if took > 30*time.Second {
			t.Errorf("keys:add with a silent stdin gave up after %s", took)
		}
		r = sshRun(t, s, bobKey, "", []string{"-tt"}, "keys:add", "typed")
		if out := r.stdout + r.stderr; r.code != 1 || !strings.Contains(out, "with ssh -t that is your terminal") {
			t.Errorf("keys:add on a terminal: %+v", r)
		}
	})

	// An app with a release, a build and a failure: its config value, its crash output and
	// its branch name carry escape sequences.
	const esc = "\x1b]0;PWNED\x07\x1b[31mred"
	kpushOK(t, s, "apps:create", "shady")
	kpushOK(t, s, "config:set", "shady", "ESC="+esc)
	work := workTree(t, env, "static")
	commitFile(t, env, work, "Procfile", `web: printf '\033]0;PWNED\007\033[2J crashed\n'; exit 1`+"\n", "crash")
	git(t, env, work, "remote", "add", "knative", s.remote("shady"))
	if out, code := push(t, env, work, "knative", "main"); code == 0 {
		t.Fatalf("push of a crashing app exited 0:\n%s", out)
	}
	// A build whose buildpack prints escape sequences and fails, from a branch whose name
	// holds a C1 control (git allows any byte from 0x80 in ref names).
	const branch = "br\u009b31m"
	escWork := workTree(t, env, "static")
	if err := os.WriteFile(filepath.Join(escWork, "escape"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, env, escWork, "add", "escape")
	git(t, env, escWork, "commit", "-q", "-m", "escape")
	git(t, env, escWork, "branch", "-m", branch)
	if out, code := push(t, env, escWork, s.remote("esc"), branch); code == 0 {
		t.Fatalf("push of a failing build exited 0:\n%s", out)
	}

	t.Run("human output shows control characters escaped", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"config", "shady"}, `ESC=\x1b]0;PWNED\x07\x1b[31mred`},
			{[]string{"releases:info", "shady", "v1"}, `\x1b]0;PWNED\x07\x1b[31mred`},
			{[]string{"releases", "shady"}, "failed"},
			{[]string{"apps:info", "shady"}, "failed"},
			{[]string{"builds:output", "esc"}, `escape buildpack \u009b31m fails`},
			{[]string{"builds:output", "shady"}, "BUILDING"},
			{[]string{"apps:info", "esc"}, `br\u009b31m`},
			{[]string{"apps", "--json"}, `"deploy_branch": "br\u009b31m"`},
			{[]string{"config", "shady", "--json"}, `"ESC": "\u001b]0;PWNED\u0007\u001b[31mred"`},
		} {
			out := kpushOK(t, s, c.args...)
			if strings.ContainsAny(out, "\x1b\x07\u009b") || !strings.Contains(out, c.want) {
				t.Errorf("%v:\n%q\nwant %q and no raw control character", c.args, out, c.want)
			}
		}
		var cfg struct{ Env map[string]string }
		kpushJSON(t, s, &cfg, "config", "shady", "--json")
		if cfg.Env["ESC"] != esc {
			t.Errorf("config --json ESC = %q, want the exact value %q", cfg.Env["ESC"], esc)
		}
	})

	t.Run("an app and a missing one look alike to a user without a role", func(t *testing.T) {
		bobEnv := gitEnv(bobKey)
		into := filepath.Join(t.TempDir(), "clone") // a refused clone leaves nothing there
		answer := func(app string, template ...string) string {
			args := make([]string, len(template))
			for i, a := range template {
				args[i] = strings.ReplaceAll(a, "APP", app)
			}
			if args[0] == "git" {
				out, err := gitResult(bobEnv, "", args[1:]...)
				return strings.ReplaceAll(out, app, "APP") + errString(err)
			}
			r := sshCmd(t, s, bobKey, "", args...)
			return strings.ReplaceAll(r.stdout+"\x00"+r.stderr, app, "APP") + string(rune('0'+r.code))
		}
		for _, args := range [][]string{
			{"git", "clone", s.remote("APP"), into},
			{"git", "ls-remote", s.remote("APP")},
			{"apps:info", "APP"}, {"apps:info", "APP", "--json"}, {"config", "APP"}, {"config:set", "APP", "A=b"},
			{"build-env", "APP"}, {"releases", "APP"}, {"releases:info", "APP", "v1"}, {"rollback", "APP", "v1"},
			{"rebuild", "APP"}, {"builds", "APP"}, {"builds:output", "APP"}, {"builds:cancel", "APP"},
			{"apps:unlock", "APP"}, {"apps:destroy", "APP", "--confirm", "APP"},
			{"apps:grant", "APP", "bob", "admin"}, {"apps:revoke", "APP", "alice"}, {"apps:access", "APP"},
		} {
			existing, missing := answer("shady", args...), answer("nosuch", args...)
			if existing != missing {
				t.Errorf("%v: for an existing app\n%q\nfor a missing one\n%q\nwant the same", args, existing, missing)
			}
			if !strings.Contains(existing, "no app named APP, or you (bob) have no role on it") || strings.Contains(existing, "alice") {
				t.Errorf("%v: %q; want the refusal that names nobody", args, existing)
			}
		}
		// A push creates a missing app, so its answer for an existing one is compared with the
		// refusal's words: the same as every other path's, naming neither owner nor admin.
		out, code := push(t, bobEnv, work, s.remote("shady"), "main")
		if code == 0 || !strings.Contains(out, "no app named shady, or you (bob) have no role on it") || strings.Contains(out, "alice") {
			t.Errorf("push by bob to shady: exit %d\n%s", code, out)
		}
		// apps:create of a taken name says it is taken, never by whom.
		r := sshCmd(t, s, bobKey, "", "apps:create", "shady")
		if r.code != 1 || !strings.Contains(r.stderr, "shady already exists") || strings.Contains(r.stdout+r.stderr, "alice") {
			t.Errorf("apps:create of a taken name: %+v", r)
		}
	})

	t.Run("a first push that ends with nothing leaves nothing", func(t *testing.T) {
		sshCmd(t, s, bobKey, "", "git-receive-pack 'ghost'") // connects, sends nothing, hangs up
		empty := t.TempDir()
		git(t, env, empty, "init", "-q")
		gitResult(gitEnv(bobKey), empty, "push", "--all", s.remote("ghost2")) // a flush, no update
		for _, app := range []string{"ghost", "ghost2"} {
			if _, err := os.Stat(filepath.Join(data, "repos", app+".git")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("repository of %s after a first push of nothing: %v, want none", app, err)
			}
			var grants []struct{ User string }
			kpushJSON(t, s, &grants, "apps:access", app, "--json")
			if len(grants) != 0 {
				t.Errorf("grants on %s after a first push of nothing: %+v, want none", app, grants)
			}
			carol := addUser(t, s, "carol-"+app)
			if r := sshCmd(t, s, carol, "", "apps:create", app); r.code != 0 {
				t.Errorf("another user's apps:create %s after bob's push of nothing: %+v", app, r)
			}
		}
	})

	t.Run("a grant needs an existing app", func(t *testing.T) {
		r := sshCmd(t, s, s.key, "", "apps:grant", "later", "bob", "admin")
		if r.code != 1 || !strings.Contains(r.stderr, "cannot grant a role on later: app later does not exist") {
			t.Errorf("apps:grant on a missing app: %+v", r)
		}
		var grants []struct{ User string }
		kpushJSON(t, s, &grants, "apps:access", "later", "--json")
		if len(grants) != 0 {
			t.Errorf("grants on later after a refused grant: %+v", grants)
		}
		kpushOK(t, s, "apps:create", "later")
		if r := sshCmd(t, s, s.key, "", "apps:grant", "later", "bob", "read"); r.code != 0 {
			t.Errorf("apps:grant on an existing app: %+v", r)
		}
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return "\x00" + err.Error()
}

// escapeBuildpack writes a buildpack that applies to apps with a file "escape" and fails
// their build after printing escape sequences: OSC (set the terminal's title), CSI (red) and
// a raw C1 CSI, as a hostile or careless buildpack or build script might.
func escapeBuildpack(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "escape")
	files := map[string]string{
		"buildpack.toml": "api = \"0.10\"\n\n[buildpack]\nid = \"kpush-test/escape\"\nversion = \"0.1.0\"\n\n[[targets]]\nos = \"linux\"\n",
		"bin/detect":     "#!/bin/sh\n[ -f escape ] || exit 100\n",
		"bin/build":      "#!/bin/sh\nprintf '\\033]0;PWNED\\007\\033[31mescape buildpack \\302\\23331m fails\\n'\nexit 1\n",
	}
	for name, body := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// sshWithStdin is sshCmd with stdin read from the file r (no copying goroutine to wait for),
// for a stdin that stays open.
func sshWithStdin(t *testing.T, s *server, key string, r *os.File, args ...string) sshResult {
	t.Helper()
	host, port, _ := net.SplitHostPort(s.sshAddr)
	argv := []string{"-p", port, "-i", key, "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "git@" + host}
	cmd := exec.Command("ssh", append(argv, args...)...)
	cmd.Stdin = r
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("ssh %s: %v", strings.Join(args, " "), err)
	}
	return sshResult{stdout.String(), stderr.String(), code}
}
