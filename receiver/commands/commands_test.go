package commands

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"kpush.dev/kpush/gitserver"
	"kpush.dev/kpush/gitserver/access"
	"kpush.dev/kpush/receiver"
)

// TestRunCommand runs command lines through the handler with a real access store and app
// store (no builder or deployer is reached), checking exit statuses, where messages go and
// the role each command needs.
func TestRunCommand(t *testing.T) {
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
	p := &receiver.Pipeline{Store: store, Access: acc}
	h := &Handler{Apps: p, Access: acc, SSH: "ssh -p 2222 git@127.0.0.1"}
	if _, err := p.Create(context.Background(), "demo", "ann"); err != nil {
		t.Fatal(err)
	}
	if err := acc.SetGrant("demo", "rita", access.RoleRead); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		user       string
		args       []string
		wantCode   int
		wantOut    string
		wantErr    string
		wantHint   bool
		wantJSONOK bool
	}{
		{"root", []string{"help"}, 0, "ssh -p 2222 git@127.0.0.1 COMMAND", "", false, false},
		{"root", []string{"help", "config:set"}, 0, "ssh -p 2222 git@127.0.0.1 config:set APP KEY=VALUE...", "", false, false},
		{"root", []string{"nope"}, 1, "", `unknown command "nope"`, true, false},
		{"root", []string{"config:set", "demo"}, 1, "", "missing KEY=VALUE", true, false},
		{"root", []string{"apps", "--json", "x"}, 1, "", `unexpected argument "x"`, true, false},
		{"ann", []string{"apps", "--json"}, 0, `"name": "demo"`, "", false, true},
		{"ann", []string{"config:set", "demo", "A=1"}, 0, "no release yet", "", false, false},
		{"ann", []string{"config", "demo", "--json"}, 0, `"A": "1"`, "", false, true},
		{"ann", []string{"config:set", "demo", "PORT=1"}, 1, "", "PORT is set by the runtime", false, false},
		{"ann", []string{"build-env:set", "demo", "BP=2"}, 0, "Set BP for the next build", "", false, false},
		{"rita", []string{"apps:info", "demo", "--json"}, 0, `"A": "(hidden: admins only)"`, "", false, true},
		{"rita", []string{"releases", "demo", "--json"}, 0, "[]", "", false, true},
		{"rita", []string{"builds", "demo", "--json"}, 0, "[]", "", false, true},
		{"rita", []string{"config", "demo"}, 1, "", "user rita does not have the admin role on app demo", false, false},
		{"rita", []string{"rollback", "demo", "v1"}, 1, "", "user rita does not have the deploy role on app demo", false, false},
		{"rita", []string{"rebuild", "demo"}, 1, "", "deploy role", false, false},
		{"ann", []string{"rollback", "demo", "v1"}, 1, "", "app demo has no release v1", false, false},
		{"ann", []string{"rollback", "demo", "one"}, 1, "", `"one" is not a release`, false, false},
		{"ann", []string{"builds:output", "demo"}, 1, "", "no builds yet", false, false},
		{"ann", []string{"apps:destroy", "demo"}, 1, "", "--confirm demo", false, false},
		{"rita", []string{"apps", "--json"}, 0, `"name": "demo"`, "", false, true},
		{"root", []string{"apps:create", "Bad"}, 1, "", "invalid app name", false, false},
		{"ann", []string{"apps:destroy", "demo", "--confirm", "demo"}, 0, "Destroyed demo", "", false, false},
		{"rita", []string{"apps", "--json"}, 0, "[]", "", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.user+" "+strings.Join(tt.args, " "), func(t *testing.T) {
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
