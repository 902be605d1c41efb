package commands

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/gitserver/access"
	"kpush.dev/kpush/receiver"
)

// TestHiddenAppsUsageErrorsAndPhases, with the real access and app stores: build-env values of past builds stay hidden from readers after an unset, errors that do not
// reveal an app to people without a role on it, missing arguments named with the usage line
// (also for the access commands), a refused rollback naming the differing variables and the
// command, real addresses instead of placeholders, the last admin unable to revoke
// themselves, and "building"/"cancelled" in the tables.
func TestHiddenAppsUsageErrorsAndPhases(t *testing.T) {
	dir := t.TempDir()
	acc, err := access.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acc.AddUser("root", true); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"ann", "dan", "rita", "solo", "carol"} {
		if _, err := acc.AddUser(u, false); err != nil {
			t.Fatal(err)
		}
	}
	store, err := receiver.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	p := &receiver.Pipeline{Store: store, Access: acc, Deployer: deployerFunc(func(context.Context, deployer.Release, io.Writer) (string, error) {
		return "http://demo.example.com", nil
	})}
	h := &Handler{Apps: p, Access: acc, SSH: "ssh -p 2345 git@127.0.0.1"}
	ctx := context.Background()
	for app, owner := range map[string]string{"demo": "ann", "lonely": "solo"} {
		if _, err := p.Create(ctx, app, owner); err != nil {
			t.Fatal(err)
		}
	}
	acc.SetGrant("demo", "dan", access.RoleDeploy)
	acc.SetGrant("demo", "rita", access.RoleRead)

	// Build #1 ran with a build-env secret that was unset since (the app's build env is empty
	// now); its log has the value. Build #2 runs now; build #3 was cancelled.
	const btoken = "btoken-rotated-away"
	img := "127.0.0.1:5000/kpush/demo@sha256:" + strings.Repeat("ab", 32)
	for _, r := range []*receiver.Release{
		{Kind: receiver.KindPush, Commit: strings.Repeat("1", 40), Image: img, Env: map[string]string{"COLOR": "red", "SIZE": "xl"}, ConfigVersion: 1, Status: receiver.StatusSucceeded, User: "ann", Build: 1},
		{Kind: receiver.KindConfig, Commit: strings.Repeat("1", 40), Image: img, Env: map[string]string{"COLOR": "blue", "DEBUG": "1"}, ConfigVersion: 2, Status: receiver.StatusSucceeded, User: "ann"},
		{Kind: receiver.KindPush, Commit: strings.Repeat("3", 40), ConfigVersion: 2, Status: receiver.StatusPending, User: "dan", Build: 2},
		{Kind: receiver.KindPush, Commit: strings.Repeat("4", 40), ConfigVersion: 2, Status: receiver.StatusCancelled, User: "dan", Build: 3, Reason: "build cancelled by ann (builds:cancel)"},
	} {
		if _, err := store.NewRelease("demo", r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.UpdateApp("demo", func(a *receiver.App) error {
		a.Current, a.Config = 2, receiver.Config{Version: 2, Env: map[string]string{"COLOR": "blue", "DEBUG": "1"}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, b := range []*receiver.Build{
		{Release: 1, User: "ann", Status: receiver.StatusSucceeded, Env: map[string]string{"BTOKEN": btoken}},
		{Release: 3, User: "dan", Status: receiver.StatusPending},
		{Release: 4, User: "dan", Status: receiver.StatusCancelled},
	} {
		if _, err := store.NewBuild("demo", b); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeFile(store.BuildLog("demo", 1), "       probe: BTOKEN="+btoken+"\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Release("demo", 1); err != nil {
		t.Fatal(err)
	}

	tests := []cmdCase{
		{"reader: old build-env value hidden in the log", "rita", []string{"builds:output", "demo", "1"}, 0,
			"probe: BTOKEN=[hidden]", "", []string{btoken}, nil},
		{"reader: build env hidden in builds --json", "rita", []string{"builds", "demo", "--json"}, 0,
			`"BTOKEN": "(hidden: admins only)"`, "", []string{btoken}, nil},
		{"admin: build env in builds --json", "ann", []string{"builds", "demo", "--json"}, 0, `"BTOKEN": "` + btoken + `"`, "", nil, nil},
		{"no role: nonexistent app", "carol", []string{"apps:info", "nosuch"}, 1, "",
			"no app named nosuch, or you (carol) have no role on it", nil, []string{"does not exist"}},
		{"no role: existing app looks the same", "carol", []string{"releases", "demo"}, 1, "",
			"no app named demo, or you (carol) have no role on it", nil, []string{"read role"}},
		{"no role: access commands too", "carol", []string{"apps:access", "nosuch"}, 1, "",
			"no app named nosuch, or you (carol) have no role on it", nil, nil},
		{"lesser role keeps the role message", "rita", []string{"config", "demo"}, 1, "", "does not have the admin role on app demo", nil, nil},
		{"server admin: nonexistent app", "root", []string{"apps:info", "nosuch"}, 1, "", "app nosuch does not exist", nil, nil},
		{"missing argument of an access command", "ann", []string{"apps:grant", "demo", "carol"}, 1, "",
			"apps:grant needs APP USER ROLE (missing ROLE); usage: ssh -p 2345 git@127.0.0.1 apps:grant APP USER ROLE", nil, nil},
		{"missing argument of an app command", "ann", []string{"rollback", "demo"}, 1, "",
			"rollback needs APP vN (missing vN); usage: ssh -p 2345 git@127.0.0.1 rollback APP vN", nil, nil},
		{"rollback names the differing vars and the command", "dan", []string{"rollback", "demo", "v1"}, 1, "",
			"COLOR, DEBUG, SIZE differ between v1 and the current config", nil, nil},
		{"rollback names the command", "dan", []string{"rollback", "demo", "v1"}, 1, "", "rollback demo v1", nil, nil},
		{"releases:info: a real fetch command", "ann", []string{"releases:info", "demo", "v1"}, 0,
			"", "", []string{"<remote>"}, nil},
		{"apps: a real remote", "carol", []string{"apps"}, 0, "git push to ssh://git@127.0.0.1:2345/APP", "", []string{"HOST"}, nil},
		{"builds: running is building, cancelled is cancelled", "ann", []string{"builds", "demo"}, 0, "building", "", []string{"pending"}, nil},
		{"builds: cancelled", "ann", []string{"builds", "demo"}, 0, "cancelled", "", []string{"failed"}, nil},
		{"releases: building and cancelled", "ann", []string{"releases", "demo"}, 0, "building", "", []string{"pending"}, nil},
		{"releases: cancelled", "ann", []string{"releases", "demo"}, 0, "cancelled: build cancelled by ann", "", nil, nil},
		{"apps:info --json: the server is not the owner", "ann", []string{"apps:info", "demo", "--json"}, 0, `"owner": "ann"`, "", nil, nil},
		{"last admin cannot revoke themselves", "solo", []string{"apps:revoke", "lonely", "solo"}, 1, "",
			"solo is the last admin of lonely", nil, nil},
		{"a server admin can", "root", []string{"apps:revoke", "lonely", "solo"}, 0, "solo no longer has a role on lonely", "", nil, nil},
	}
	runCmdCases(t, ctx, h, tests)
}

func writeFile(path, body string) error {
	return os.WriteFile(path, []byte(body), 0o600)
}
