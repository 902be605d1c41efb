package commands

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"testing"

	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/gitserver"
	"kpush.dev/kpush/gitserver/access"
	"kpush.dev/kpush/receiver"
)

// demoHandler is a Handler over real access and app stores (no builder or deployer) with
// the server admin root, ann the owner (admin) of the app demo, and rita a reader of it.
func demoHandler(t *testing.T) *Handler {
	t.Helper()
	dir := t.TempDir()
	acc, err := access.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []struct {
		name  string
		admin bool
	}{{"root", true}, {"ann", false}, {"rita", false}} {
		if _, err := acc.AddUser(u.name, u.admin); err != nil {
			t.Fatal(err)
		}
	}
	store, err := receiver.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	p := &receiver.Pipeline{Store: store, Access: acc}
	if _, err := p.Create(context.Background(), "demo", "ann"); err != nil {
		t.Fatal(err)
	}
	if err := acc.SetGrant("demo", "rita", access.RoleRead); err != nil {
		t.Fatal(err)
	}
	return &Handler{Apps: p, Access: acc, SSH: "ssh -p 2222 git@127.0.0.1"}
}

// TestRunCommandStatusOutputAndRoles runs command lines through the handler, each on a
// fresh demoHandler (setup adds what the row needs), checking exit statuses, where messages
// go, the hint to run help after usage errors only, and the role each command needs.
func TestRunCommandStatusOutputAndRoles(t *testing.T) {
	withConfigA := func(t *testing.T, h *Handler) {
		if _, err := h.Apps.ChangeConfig(context.Background(), "demo", "ann", map[string]string{"A": "1"}, nil, io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	withEscapes := func(t *testing.T, h *Handler) {
		if _, err := h.Apps.ChangeConfig(context.Background(), "demo", "ann", map[string]string{"T": "a\x1b]0;TITLE\x07b"}, nil, io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	destroyed := func(t *testing.T, h *Handler) {
		if err := h.Apps.Destroy(context.Background(), "demo", io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		user       string
		args       []string
		setup      func(*testing.T, *Handler)
		wantCode   int
		wantOut    string
		wantErr    string
		wantHint   bool
		wantJSONOK bool
	}{
		{"root", []string{"help"}, nil, 0, "ssh -p 2222 git@127.0.0.1 COMMAND", "", false, false},
		{"root", []string{"help", "config:set"}, nil, 0, "ssh -p 2222 git@127.0.0.1 config:set APP KEY=VALUE...", "", false, false},
		{"root", []string{"nope"}, nil, 1, "", `unknown command "nope"`, true, false},
		{"root", []string{"config:set", "demo"}, nil, 1, "", "missing KEY=VALUE", true, false},
		{"root", []string{"apps", "--json", "x"}, nil, 1, "", `unexpected argument "x"`, true, false},
		{"root", []string{"apps", "--nope"}, nil, 1, "", "unknown flag: --nope", true, false},
		{"ann", []string{"apps", "--json"}, nil, 0, `"name": "demo"`, "", false, true},
		{"ann", []string{"config:set", "demo", "A=1"}, nil, 0, "no release yet", "", false, false},
		{"ann", []string{"config", "demo", "--json"}, withConfigA, 0, `"A": "1"`, "", false, true},
		// A value's control characters reach a terminal escaped; --json keeps them (JSON-escaped).
		{"ann", []string{"config", "demo"}, withEscapes, 0, `T=a\x1b]0;TITLE\x07b`, "", false, false},
		{"ann", []string{"config", "demo", "--json"}, withEscapes, 0, `"T": "a\u001b]0;TITLE\u0007b"`, "", false, true},
		{"ann", []string{"config:set", "demo", "PORT=1"}, nil, 1, "", "PORT is set by the runtime", false, false},
		{"ann", []string{"config:set", "demo", "A"}, nil, 1, "", `config:set: "A" is not KEY=VALUE`, false, false},
		{"ann", []string{"build-env:set", "demo", "BP=2"}, nil, 0, "Set BP for the next build", "", false, false},
		{"rita", []string{"apps:info", "demo", "--json"}, withConfigA, 0, `"A": "(hidden: admins only)"`, "", false, true},
		{"rita", []string{"releases", "demo", "--json"}, nil, 0, "[]", "", false, true},
		{"rita", []string{"builds", "demo", "--json"}, nil, 0, "[]", "", false, true},
		{"rita", []string{"config", "demo"}, nil, 1, "", "user rita does not have the admin role on app demo", false, false},
		{"rita", []string{"rollback", "demo", "v1"}, nil, 1, "", "user rita does not have the deploy role on app demo", false, false},
		{"rita", []string{"rebuild", "demo"}, nil, 1, "", "deploy role", false, false},
		{"rita", []string{"builds:cancel", "demo"}, nil, 1, "", "deploy role", false, false},
		{"rita", []string{"apps:unlock", "demo"}, nil, 1, "", "admin role", false, false},
		{"rita", []string{"apps:grant", "demo", "rita", "admin"}, nil, 1, "", "admin role", false, false},
		{"ann", []string{"rollback", "demo", "v1"}, nil, 1, "", "app demo has no release v1", false, false},
		{"ann", []string{"rollback", "demo", "one"}, nil, 1, "", `"one" is not a release`, false, false},
		{"ann", []string{"builds:output", "demo"}, nil, 1, "", "no builds yet", false, false},
		{"ann", []string{"builds:output", "demo", "x"}, nil, 1, "", "builds:output: N is a build number", false, false},
		{"ann", []string{"apps:destroy", "demo"}, nil, 1, "", "--confirm demo", false, false},
		{"ann", []string{"apps:info", "Bad"}, nil, 1, "", `invalid app name "Bad"`, false, false},
		{"rita", []string{"apps", "--json"}, nil, 0, `"name": "demo"`, "", false, true},
		{"root", []string{"apps:create", "Bad"}, nil, 1, "", "invalid app name", false, false},
		{"ann", []string{"apps:destroy", "demo", "--confirm", "demo"}, nil, 0, "Destroyed demo", "", false, false},
		{"rita", []string{"apps", "--json"}, destroyed, 0, "[]", "", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.user+" "+strings.Join(tt.args, " "), func(t *testing.T) {
			h := demoHandler(t)
			if tt.setup != nil {
				tt.setup(t, h)
			}
			var stdout, stderr bytes.Buffer
			code := h.RunCommand(context.Background(), &gitserver.Command{
				User: tt.user, Args: tt.args, Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr,
			})
			if code != tt.wantCode {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.wantOut) {
				t.Errorf("stdout lacks %q:\n%s", tt.wantOut, stdout.String())
			}
			if !strings.Contains(stderr.String(), tt.wantErr) {
				t.Errorf("stderr lacks %q:\n%s", tt.wantErr, stderr.String())
			}
			if hint := strings.Contains(stderr.String(), "ssh -p 2222 git@127.0.0.1 help"); hint != tt.wantHint {
				t.Errorf("hint to run help = %v, want %v: %s", hint, tt.wantHint, stderr.String())
			}
			if tt.wantJSONOK && !json.Valid(stdout.Bytes()) {
				t.Errorf("stdout is not JSON: %s", stdout.String())
			}
		})
	}
}

// TestSpecsDeclareRolesAndArguments: every command is declared once, its required arguments
// are the words of its usage line after the name, in order, and an app role is checked on
// an APP argument that comes first. Without an access store the user, key and grant commands
// do not exist and every app command runs for anyone.
func TestSpecsDeclareRolesAndArguments(t *testing.T) {
	inv := &invocation{h: &Handler{Access: &access.Store{}}}
	seen := map[string]bool{}
	for _, s := range inv.specs() {
		words := strings.Fields(s.Use)
		name := words[0]
		if seen[name] {
			t.Errorf("%s is declared twice", name)
		}
		seen[name] = true
		if s.Run == nil {
			t.Errorf("%s: no Run", name)
		}
		var usage []string
		for _, w := range words[1:] {
			if strings.HasPrefix(w, "[") || strings.HasPrefix(w, "-") {
				break
			}
			usage = append(usage, strings.TrimSuffix(w, "..."))
		}
		if !slices.Equal(usage, s.Args) {
			t.Errorf("%s: Args %q, but its usage line %q names %q", name, s.Args, s.Use, usage)
		}
		if s.Role == 0 {
			t.Errorf("%s declares no role", name)
		}
		if _, app := appRoles[s.Role]; app && (len(s.Args) == 0 || s.Args[0] != "APP") {
			t.Errorf("%s: role %d is checked on APP, but its first argument is %q", name, s.Role, s.Args)
		}
		if s.Role == serverAdmin && s.Denied == "" {
			t.Errorf("%s: a server-admin command without the Denied text", name)
		}
		if strings.HasSuffix(s.Use, "...") != (s.More == -1) {
			t.Errorf("%s: More %d, usage %q", name, s.More, s.Use)
		}
	}
	for _, want := range []string{"apps", "apps:create", "apps:info", "apps:destroy", "config", "config:set", "config:unset",
		"build-env", "build-env:set", "build-env:unset", "releases", "releases:info", "rollback", "rebuild",
		"builds", "builds:output", "builds:cancel", "apps:unlock", "keys", "keys:add", "keys:remove",
		"users", "users:add", "users:remove", "apps:grant", "apps:revoke", "apps:access"} {
		if !seen[want] {
			t.Errorf("no command %s", want)
		}
	}
	if len(seen) != 27 {
		t.Errorf("%d commands, want 27", len(seen))
	}

	// Without an access store.
	p := &receiver.Pipeline{}
	h := &Handler{Apps: p, SSH: "ssh git@h"}
	inv = &invocation{h: h}
	for _, s := range inv.specs() {
		if s.Role == registered || s.Role == serverAdmin {
			t.Errorf("%s exists without an access store", s.Use)
		}
	}
	if err := inv.authorize(spec{Use: "config APP", Role: appAdmin, Args: []string{"APP"}}, []string{"demo"}); err != nil {
		t.Errorf("admin role without an access store: %v", err)
	}
	if err := inv.authorize(spec{Use: "config APP", Role: appAdmin, Args: []string{"APP"}}, []string{"Bad"}); err == nil {
		t.Error("an invalid app name passed without an access store")
	}
	if err := inv.authorize(spec{Use: "new"}, nil); err == nil {
		t.Error("a spec without a role ran")
	}
}

// TestRemoteURL covers the address forms apps:create prints.
func TestRemoteURL(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:2222":     "ssh://git@127.0.0.1:2222/demo",
		"git.example.com:22": "ssh://git@git.example.com/demo",
		"[::1]:2222":         "ssh://git@[::1]:2222/demo",
		"[::1]:22":           "ssh://git@[::1]/demo",
		"":                   "ssh://git@HOST/demo",
	} {
		if got := remoteURL(addr, "demo"); got != want {
			t.Errorf("remoteURL(%q) = %q, want %q", addr, got, want)
		}
	}
}

// deployerFunc adapts a function to deployer.Deployer: the real runtimes need a registry
// and images; test/ runs them end to end.
type deployerFunc func(context.Context, deployer.Release, io.Writer) (string, error)

func (f deployerFunc) Deploy(ctx context.Context, r deployer.Release, out io.Writer) (string, error) {
	return f(ctx, r, out)
}

// cmdCase is one SSH command run through the Handler by user, with the exit status and the
// output fragments it must (and must not) print.
type cmdCase struct {
	name           string
	user           string
	args           []string
	code           int
	stdout, stderr string   // fragments wanted
	notOut, notErr []string // fragments that must not appear
}

func runCmdCases(t *testing.T, ctx context.Context, h gitserver.CommandHandler, tests []cmdCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := h.RunCommand(ctx, &gitserver.Command{User: tt.user, Args: tt.args, Addr: "127.0.0.1:2345",
				Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr})
			if code != tt.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.stdout) {
				t.Errorf("stdout lacks %q:\n%s", tt.stdout, stdout.String())
			}
			if !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tt.stderr, stderr.String())
			}
			for _, n := range tt.notOut {
				if strings.Contains(stdout.String(), n) {
					t.Errorf("stdout has %q:\n%s", n, stdout.String())
				}
			}
			for _, n := range tt.notErr {
				if strings.Contains(stderr.String(), n) {
					t.Errorf("stderr has %q:\n%s", n, stderr.String())
				}
			}
		})
	}
}
