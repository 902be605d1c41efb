package commands

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"kpush.dev/kpush/gitserver"
	"kpush.dev/kpush/receiver"
)

func TestEscapeJSONControlsKeepsValuesExact(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"a": "plain ✓"}`, `{"a": "plain ✓"}`},
		{"{\"a\": \"c1 \u009b31m del \x7f\"}", `{"a": "c1 \u009b31m del \u007f"}`},
		{`{"a": "\u001b[31m"}`, `{"a": "\u001b[31m"}`}, // encoding/json's own escapes stay
	} {
		if got := escapeJSONControls(c.in); got != c.want {
			t.Errorf("escapeJSONControls(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestKeysAddWithoutAKey: keys:add refuses a terminal at once and gives up on a stdin that
// stays silent, saying how to send the key; nothing is registered.
func TestKeysAddWithoutAKey(t *testing.T) {
	h, acc := accessHandler(t)
	defer func(d time.Duration) { keyWait = d }(keyWait)
	keyWait = 50 * time.Millisecond
	silent, w := io.Pipe() // open, never written: ssh forwarding a terminal nobody types in
	defer w.Close()
	guard := time.AfterFunc(10*time.Second, func() { w.Close() }) // a keys:add that waits for ever fails below
	defer guard.Stop()
	for _, c := range []struct {
		name     string
		stdin    io.Reader
		terminal bool
		want     string
	}{
		{"terminal", strings.NewReader(""), true, "with ssh -t that is your terminal; send the .pub file instead:\n  ssh -p 2222 git@127.0.0.1 keys:add laptop < ~/.ssh/id_ed25519.pub"},
		{"silent stdin", silent, false, "no public key arrived on stdin within 50ms; keys:add reads one from stdin, send the .pub file:\n  ssh -p 2222 git@127.0.0.1 keys:add laptop < ~/.ssh/id_ed25519.pub"},
		{"empty stdin", strings.NewReader(""), false, "no public key given"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := h.RunCommand(context.Background(), &gitserver.Command{User: "root", Args: []string{"keys:add", "laptop"},
				Stdin: c.stdin, Terminal: c.terminal, Stdout: &stdout, Stderr: &stderr})
			if code != 1 || !strings.Contains(stderr.String(), c.want) {
				t.Errorf("exit %d, stderr %q; want 1 and %q", code, stderr.String(), c.want)
			}
		})
	}
	if keys, _ := acc.Keys("root"); len(keys) != 0 {
		t.Errorf("keys after refused keys:add: %+v", keys)
	}
}

// TestHumanOutputEscapesControls: whatever a command prints for people, its control
// characters but newline and tab arrive escaped; JSON keeps the exact value, escaped inside
// its strings.
func TestHumanOutputEscapesControls(t *testing.T) {
	h, _ := accessHandler(t)
	// A branch name may hold C1 controls (git refuses only bytes below 0x20 and DEL).
	if err := h.Apps.Store.CreateApp(&receiver.App{Name: "demo", Owner: "root", DeployBranch: "br\u009b2J\x1b]0;x"}); err != nil {
		t.Fatal(err)
	}
	// A failure reason quoting what an app or a buildpack printed.
	rel := &receiver.Release{Kind: receiver.KindPush, Description: "Deploy 1234567", Status: receiver.StatusFailed,
		Reason: "deploy failed: \x1b]0;PWNED\x07\x1b[2Jgone", Env: map[string]string{"ESC": "\x1b[31mred\nFAKE=1"}}
	if _, err := h.Apps.Store.NewRelease("demo", rel); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"apps:info", "demo"}, `br\u009b2J\x1b]0;x`},
		{[]string{"apps:info", "demo"}, `deploy failed: \x1b]0;PWNED\x07\x1b[2Jgone`},
		{[]string{"releases", "demo"}, `deploy failed: \x1b]0;PWNED\x07\x1b[2Jgone`},
		{[]string{"releases:info", "demo", "v1"}, `deploy failed: \x1b]0;PWNED\x07\x1b[2Jgone`},
		{[]string{"releases:info", "demo", "v1"}, `ESC         \x1b[31mred\x0aFAKE=1`},
		{[]string{"releases:info", "demo", "v1", "--json"}, `"ESC": "\u001b[31mred\nFAKE=1"`},
		{[]string{"apps"}, "demo"},
		{[]string{"apps:info", "demo", "--json"}, `"deploy_branch": "br\u009b2J\u001b]0;x"`},
	} {
		stdout, stderr, code := run(h, "root", "", c.args...)
		if code != 0 || strings.ContainsAny(stdout+stderr, "\x1b\u009b") || !strings.Contains(stdout, c.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %q and no raw control character", c.args, code, stdout, stderr, c.want)
		}
	}
}
