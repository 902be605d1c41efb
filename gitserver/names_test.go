package gitserver

import (
	"strings"
	"testing"
)

func TestValidAppName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"a", true},
		{"my-app", true},
		{"app1", true},
		{"a-1-b", true},
		{strings.Repeat("a", 63), true},
		{"", false},
		{strings.Repeat("a", 64), false},
		{"UPPER", false},
		{"Abc", false},
		{"1abc", false},
		{"-app", false},
		{"app-", false},
		{"a_b", false},
		{"a.b", false},
		{"a/b", false},
		{"../x", false},
		{"a b", false},
		{"app;id", false},
		{"it's", false},
		{"app\n", false},
		{"ünï", false},
	} {
		err := ValidAppName(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("ValidAppName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "DNS-1035") {
			t.Errorf("ValidAppName(%q) error %q does not state the rule", tc.name, err)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("ValidAppName(%q) error %q is not one line", tc.name, err)
		}
	}
}

func TestParseGitCommand(t *testing.T) {
	for _, tc := range []struct {
		raw     string
		isGit   bool
		service string
		app     string
		errHas  string // "" means no error
	}{
		{raw: "git-receive-pack '/app'", isGit: true, service: serviceReceivePack, app: "app"},
		{raw: "git-receive-pack '/app.git'", isGit: true, service: serviceReceivePack, app: "app"},
		{raw: "git-receive-pack 'app'", isGit: true, service: serviceReceivePack, app: "app"},
		{raw: "git-receive-pack 'app.git'", isGit: true, service: serviceReceivePack, app: "app"},
		{raw: "git receive-pack 'app'", isGit: true, service: serviceReceivePack, app: "app"},
		{raw: "git-receive-pack '/app/'", isGit: true, service: serviceReceivePack, app: "app"},
		{raw: "git-upload-pack '/app.git/'", isGit: true, service: serviceUploadPack, app: "app"},
		{raw: "git-upload-pack '/app//'", isGit: true, errHas: "invalid app name"},
		{raw: "git-upload-pack '/my-app.git'", isGit: true, service: serviceUploadPack, app: "my-app"},
		{raw: "git upload-pack 'my-app'", isGit: true, service: serviceUploadPack, app: "my-app"},
		// quoting: git writes ' as '\'' and ! as '\!'; both make invalid names here
		{raw: `git-receive-pack 'it'\''s'`, isGit: true, errHas: `invalid app name "it's"`},
		{raw: `git-receive-pack 'hi'\!''`, isGit: true, errHas: `invalid app name "hi!"`},
		{raw: "git-receive-pack app", isGit: true, errHas: "single-quoted"},
		{raw: "git-receive-pack 'app", isGit: true, errHas: "single-quoted"},
		{raw: "git-receive-pack 'app' 'other'", isGit: true, errHas: "single-quoted"},
		{raw: "git-receive-pack 'a''b'", isGit: true, errHas: "single-quoted"},
		{raw: "git-receive-pack  'app'", isGit: true, errHas: "single-quoted"},
		{raw: "git-receive-pack", isGit: true, errHas: "needs a repository path"},
		{raw: "git-receive-pack ", isGit: true, errHas: "needs a repository path"},
		{raw: "git-receive-pack ''", isGit: true, errHas: "app name is empty"},
		{raw: "git-receive-pack '/'", isGit: true, errHas: "app name is empty"},
		{raw: "git-receive-pack '.git'", isGit: true, errHas: "app name is empty"},
		{raw: "git-receive-pack '../x'", isGit: true, errHas: "invalid app name"},
		{raw: "git-receive-pack '/a/b'", isGit: true, errHas: "invalid app name"},
		{raw: "git-receive-pack '//app'", isGit: true, errHas: "invalid app name"},
		{raw: "git-receive-pack '~/app'", isGit: true, errHas: "invalid app name"},
		{raw: "git-receive-pack 'app.git.git'", isGit: true, errHas: "invalid app name"},
		{raw: "git-upload-pack 'UPPER'", isGit: true, errHas: "invalid app name"},
		{raw: "git-upload-pack 'app;id'", isGit: true, errHas: "invalid app name"},
		{raw: "git-upload-pack '" + strings.Repeat("a", 64) + "'", isGit: true, errHas: "64 characters"},
		{raw: "git-upload-archive 'app'", isGit: true, errHas: "not supported"},
		{raw: "ls", isGit: false},
		{raw: "keys:add alice", isGit: false},
		{raw: "git status", isGit: false},
		{raw: "git-shell", isGit: false},
	} {
		req, isGit, err := parseGitCommand(tc.raw)
		if isGit != tc.isGit {
			t.Errorf("parseGitCommand(%q): isGit = %v, want %v", tc.raw, isGit, tc.isGit)
			continue
		}
		if tc.errHas != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("parseGitCommand(%q): err = %v, want it to contain %q", tc.raw, err, tc.errHas)
			}
			continue
		}
		if err != nil {
			t.Errorf("parseGitCommand(%q): unexpected error %v", tc.raw, err)
			continue
		}
		if tc.isGit && (req.Service != tc.service || req.App != tc.app) {
			t.Errorf("parseGitCommand(%q) = %+v, want service %q app %q", tc.raw, req, tc.service, tc.app)
		}
	}
}

func TestParseRefUpdates(t *testing.T) {
	a, b := strings.Repeat("a", 40), strings.Repeat("b", 40)
	got, err := parseRefUpdates(strings.NewReader(ZeroID + " " + a + " refs/heads/dev\n" + a + " " + b + " refs/tags/v1\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []RefUpdate{{ZeroID, a, "refs/heads/dev"}, {a, b, "refs/tags/v1"}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("parseRefUpdates = %+v, want %+v", got, want)
	}
	for _, bad := range []string{
		a + " " + b + "\n",
		a + " " + b + " main\n",
		a + " XYZ refs/heads/main\n",
		a + "  " + b + " refs/heads/main\n",
		strings.ToUpper(a) + " " + b + " refs/heads/main\n",
	} {
		if _, err := parseRefUpdates(strings.NewReader(bad)); err == nil {
			t.Errorf("parseRefUpdates(%q) accepted a malformed line", bad)
		}
	}
}

func TestPushOptionsAndQuarantineEnv(t *testing.T) {
	env := map[string]string{
		"GIT_PUSH_OPTION_COUNT": "2", "GIT_PUSH_OPTION_0": "a=b", "GIT_PUSH_OPTION_1": "c d",
		"GIT_OBJECT_DIRECTORY": "/r/objects/tmp", "GIT_ALTERNATE_OBJECT_DIRECTORIES": "/r/objects",
		"GIT_QUARANTINE_PATH": "/r/objects/tmp", "GIT_DIR": ".",
	}
	if got := pushOptions(env); strings.Join(got, "|") != "a=b|c d" {
		t.Errorf("pushOptions = %q", got)
	}
	if got := pushOptions(map[string]string{}); got != nil {
		t.Errorf("pushOptions without count = %q, want nil", got)
	}
	got := strings.Join(quarantineEnv(env), "|")
	want := "GIT_OBJECT_DIRECTORY=/r/objects/tmp|GIT_ALTERNATE_OBJECT_DIRECTORIES=/r/objects|GIT_QUARANTINE_PATH=/r/objects/tmp"
	if got != want {
		t.Errorf("quarantineEnv = %q, want %q", got, want)
	}
}

func TestDeployBranchOf(t *testing.T) {
	const c = "1111111111111111111111111111111111111111"
	up := func(names ...string) []RefUpdate {
		var us []RefUpdate
		for _, n := range names {
			us = append(us, RefUpdate{Old: ZeroID, New: c, Name: n})
		}
		return us
	}
	tests := []struct {
		name    string
		updates []RefUpdate
		want    string
	}{
		{"single branch", up("refs/heads/dev"), "refs/heads/dev"},
		{"main wins over earlier branches", up("refs/heads/add-feature", "refs/heads/main"), "refs/heads/main"},
		{"master when no main", up("refs/heads/-dash", "refs/heads/master"), "refs/heads/master"},
		{"main over master", up("refs/heads/master", "refs/heads/main"), "refs/heads/main"},
		{"tags are not branches", up("refs/tags/v1", "refs/heads/dev"), "refs/heads/dev"},
		{"only tags", up("refs/tags/v1"), ""},
		{"deletions create nothing", []RefUpdate{{Old: c, New: ZeroID, Name: "refs/heads/main"}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := deployBranchOf(tt.updates); got != tt.want {
				t.Errorf("deployBranchOf = %q, want %q", got, tt.want)
			}
		})
	}
}
