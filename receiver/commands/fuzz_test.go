package commands

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/anmitsu/go-shlex"

	"kpush.dev/kpush/gitserver"
	"kpush.dev/kpush/internal/term"
)

// FuzzParseAssignments checks the KEY=VALUE parser of config:set and build-env:set on any
// arguments (args, split at NUL, which no SSH argument holds): it accepts exactly the lists
// whose every argument has a '=', splits each at its first '=', the last of a repeated key
// winning, so that writing the result back as KEY=VALUE parses to the same; a refusal is
// printable.
func FuzzParseAssignments(f *testing.F) {
	for _, s := range []string{"A=1", "A=1\x00B=2", "A=", "=x", "A", "A=1=2", "A=1\x00A=2", "A=a b\x00B=\x1b[31m",
		"A=1\x00nokey", "PATH=/bin:/usr/bin", "Ä=ü", ""} {
		f.Add(s)
	}
	cmd, _, err := (&invocation{h: &Handler{}}).root().Find([]string{"config:set"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, args string) {
		a := strings.Split(args, "\x00")
		set, err := parseAssignments(cmd, a)
		allHaveEq := true
		for _, kv := range a {
			allHaveEq = allHaveEq && strings.Contains(kv, "=")
		}
		if (err == nil) != allHaveEq {
			t.Fatalf("parseAssignments(%q) = %v, %v", a, set, err)
		}
		if err != nil {
			if !term.Printable(err.Error()) {
				t.Fatalf("parseAssignments(%q) error is not printable: %q", a, err)
			}
			return
		}
		want := map[string]string{}
		for _, kv := range a {
			k, v, _ := strings.Cut(kv, "=")
			want[k] = v
		}
		var back []string
		for k, v := range set {
			if want[k] != v || strings.Contains(k, "=") {
				t.Fatalf("parseAssignments(%q) = %q; want %q", a, set, want)
			}
			back = append(back, k+"="+v)
		}
		if len(set) != len(want) {
			t.Fatalf("parseAssignments(%q) = %q; want %q", a, set, want)
		}
		if again, err := parseAssignments(cmd, back); err != nil || len(again) != len(set) {
			t.Fatalf("parseAssignments(%q) = %q, written back as %q parses to %q, %v", a, set, back, again, err)
		}
	})
}

// FuzzRunCommand runs any SSH command line, split as gliderlabs' Session.Command splits it,
// through a real handler (demoHandler: access and app stores on disk; demo's config and build
// env hold values with escape sequences, C1 controls and newlines) as one of four callers,
// and checks what holds for every command: the exit status is 0 or 1, a failure says why on
// stderr, nothing written to the caller is unprintable (someone else's values are shown
// escaped, --json is JSON), and a caller who may not change anything (rita, who reads demo,
// and mallory, who is no user: removed after the server let their session in) changed
// nothing: not demo, its grants, the users or the apps.
func FuzzRunCommand(f *testing.F) {
	for _, c := range []struct {
		who  byte
		line string
	}{
		{0, "help"}, {0, "apps"}, {0, "apps:info demo"}, {0, "apps:info demo --json"}, {0, "config demo"},
		{0, "config:set demo A=1"}, {0, "config:unset demo A"}, {0, "build-env:set demo A=1"},
		{0, "apps:destroy demo --confirm demo"}, {0, "apps:grant demo rita admin"}, {0, "apps:revoke demo ann"},
		{1, "apps"}, {1, "apps:info demo"}, {1, "keys"}, {1, "users:add eve"},
		{2, "config:set demo A=1 'B=two words'"}, {2, "config demo --json"}, {2, "releases demo"},
		{2, "builds:output demo"}, {2, "rollback demo v1"}, {2, "apps:access demo"}, {2, "config demo"},
		{3, "build-env demo"}, {3, "build-env demo --json"}, {2, "releases demo --json"},
		{3, "users"}, {3, "users:add eve"}, {3, "users:remove rita"}, {3, "help config:set"},
		{0, "apps:info 'de mo'"}, {0, "--bogus"}, {0, "apps:info demo --json=maybe"}, {0, "nope"},
		{2, "config:set demo A=\x1b[31m"}, {0, "apps:info \x1b]0;title\x07"}, {0, "help \x1b[2J"},
	} {
		f.Add(c.who, c.line)
	}
	callers := []string{"rita", "mallory", "ann", "root"}
	f.Fuzz(func(t *testing.T, who byte, line string) {
		user := callers[int(who)%len(callers)]
		args, _ := shlex.Split(line, true) // exactly Session.Command's split
		if len(args) == 0 {
			return // the server answers a blank line itself
		}
		h := demoHandler(t)
		// Values someone else set, which reach the caller's terminal only escaped.
		hostile := map[string]string{"T": "a\x1b]0;TITLE\x07b", "C1": "\u009b2J", "NL": "x\ny"}
		if _, err := h.Apps.ChangeConfig(context.Background(), "demo", "ann", hostile, nil, io.Discard); err != nil {
			t.Fatal(err)
		}
		if _, err := h.Apps.ChangeBuildEnv(context.Background(), "demo", hostile, nil); err != nil {
			t.Fatal(err)
		}
		before := stateOf(t, h)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var stdout, stderr bytes.Buffer
		code := h.RunCommand(ctx, &gitserver.Command{User: user, Args: args, Addr: "127.0.0.1:2222",
			Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr})
		switch {
		case code != 0 && code != 1:
			t.Fatalf("%s ran %q: exit status %d", user, args, code)
		case code == 1 && strings.TrimSpace(stderr.String()) == "":
			t.Fatalf("%s ran %q: exit status 1 and nothing on stderr", user, args)
		case !term.Printable(stderr.String()):
			t.Fatalf("%s ran %q: stderr is not printable: %q", user, args, stderr.String())
		case !term.Printable(stdout.String()):
			t.Fatalf("%s ran %q: stdout is not printable: %q", user, args, stdout.String())
		}
		if user == "rita" || user == "mallory" {
			if after := stateOf(t, h); after != before {
				t.Fatalf("%s ran %q (exit %d) and changed what they may not:\nbefore %s\nafter  %s", user, args, code, before, after)
			}
		}
	})
}

// stateOf is what FuzzRunCommand's callers without a role to change anything must leave as
// it is: the apps, demo's record and grants, and the users.
func stateOf(t *testing.T, h *Handler) string {
	t.Helper()
	apps, err := h.Apps.Store.Apps()
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal([]any{apps, h.Access.Grants("demo"), h.Access.Users()})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
