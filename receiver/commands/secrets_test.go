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

// TestReadersSeeNoSecretsAndRollbackRoles: readers never see config values in failure
// reasons or build logs, a deploy-role rollback that would change the config needs admin, help
// for an unknown command fails, apps:destroy with another name says so, config of an app
// without vars says so, and apps:create prints the remote at the address the client used.
// The access and app stores are real; releases and build logs are written into the
// store as a crashed app would have left them.
func TestReadersSeeNoSecretsAndRollbackRoles(t *testing.T) {
	dir := t.TempDir()
	acc, err := access.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"ann", "dan", "rita"} {
		if _, err := acc.AddUser(u, false); err != nil {
			t.Fatal(err)
		}
	}
	store, err := receiver.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	var deployed []deployer.Release
	p := &receiver.Pipeline{Store: store, Access: acc, Deployer: deployerFunc(func(_ context.Context, r deployer.Release, _ io.Writer) (string, error) {
		deployed = append(deployed, r)
		return "http://demo.example.com", nil
	})}
	h := &Handler{Apps: p, Access: acc, SSH: "ssh -p 2222 git@127.0.0.1"}
	ctx := context.Background()
	for _, app := range []string{"demo", "bare"} {
		if _, err := p.Create(ctx, app, "ann"); err != nil {
			t.Fatal(err)
		}
	}
	acc.SetGrant("demo", "dan", access.RoleDeploy)
	acc.SetGrant("demo", "rita", access.RoleRead)
	acc.SetGrant("bare", "rita", access.RoleRead)

	// v1 ran with an old secret; v2 is current with a new one and a short value; v3 crashed
	// printing its env, and its build log has it too.
	const oldSecret, secret = "hunter2-old", "s3cr3t-token"
	img := "127.0.0.1:5000/kpush/demo@sha256:" + strings.Repeat("ab", 32)
	for _, r := range []*receiver.Release{
		{Kind: receiver.KindPush, Image: img, Env: map[string]string{"TOKEN": oldSecret}, ConfigVersion: 1, Status: receiver.StatusSucceeded, User: "ann"},
		{Kind: receiver.KindConfig, Image: img, Env: map[string]string{"TOKEN": secret, "N": "1"}, ConfigVersion: 2, Status: receiver.StatusSucceeded, User: "ann"},
		{Kind: receiver.KindPush, Env: map[string]string{"TOKEN": secret, "N": "1"}, ConfigVersion: 2, Status: receiver.StatusFailed, User: "ann", Build: 1,
			Reason: "deploy failed: app demo failed to start: exited 1; last output: TOKEN=" + secret + " N=1 OLD=" + oldSecret},
	} {
		if _, err := store.NewRelease("demo", r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.UpdateApp("demo", func(a *receiver.App) error {
		a.Current, a.Config = 2, receiver.Config{Version: 2, Env: map[string]string{"TOKEN": secret, "N": "1"}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b := &receiver.Build{Release: 3, User: "ann", Status: receiver.StatusFailed}
	if _, err := store.NewBuild("demo", b); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(store.BuildLog("demo", b.Number), []byte("-----> Starting demo\n       TOKEN="+secret+"\n       N=1\n !     failed, no newline "+secret), 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []cmdCase{
		{"reader: release reason redacted", "rita", []string{"releases:info", "demo", "v3"}, 0,
			"TOKEN=[hidden] N=1 OLD=[hidden]", "", []string{secret, oldSecret}, nil},
		{"reader: release list redacted", "rita", []string{"releases", "demo"}, 0, "TOKEN=[hidden]", "", []string{secret, oldSecret}, nil},
		{"reader: JSON redacted", "rita", []string{"releases", "demo", "--json"}, 0, "TOKEN=[hidden]", "", []string{secret, oldSecret}, nil},
		{"reader: apps:info latest redacted", "rita", []string{"apps:info", "demo"}, 0, "TOKEN=[hidden]", "", []string{secret}, nil},
		{"reader: build log redacted", "rita", []string{"builds:output", "demo"}, 0,
			"       TOKEN=[hidden]\n       N=1\n !     failed, no newline [hidden]", "", []string{secret}, nil},
		{"admin: build log whole", "ann", []string{"builds:output", "demo", "1"}, 0, "TOKEN=" + secret, "", nil, nil},
		{"admin: reason whole", "ann", []string{"releases:info", "demo", "v3"}, 0, "OLD=" + oldSecret, "", nil, nil},
		{"deployer: rollback changing config needs admin", "dan", []string{"rollback", "demo", "v1"}, 1, "",
			"rollback to v1 would change the config of demo", nil, []string{"run `ssh"}},
		{"deployer: rollback names the role", "dan", []string{"rollback", "demo", "v1"}, 1, "", "needs the admin role on demo", nil, nil},
		{"deployer: rollback keeping config", "dan", []string{"rollback", "demo", "v2"}, 0, "Rollback to v2", "", nil, nil},
		{"admin: rollback changing config", "ann", []string{"rollback", "demo", "v1"}, 0, "Rollback to v1", "", nil, nil},
		{"help for an unknown command", "ann", []string{"help", "nosuch"}, 1, "", `help: unknown command "nosuch"`, nil, nil},
		{"help for a command", "ann", []string{"help", "rollback"}, 0, "rollback APP vN", "", nil, nil},
		{"destroy with another name", "ann", []string{"apps:destroy", "demo", "--confirm", "other"}, 1, "",
			"--confirm other does not match the app name demo; nothing was deleted", nil, nil},
		{"config without vars", "ann", []string{"config", "bare"}, 0, "bare has no config vars\n", "", nil, nil},
		{"build env without vars", "ann", []string{"build-env", "bare"}, 0, "bare has no build-env vars\n", "", nil, nil},
		{"create prints the real remote", "ann", []string{"apps:create", "fresh"}, 0,
			"git remote add knative ssh://git@127.0.0.1:2345/fresh\n", "", []string{"HOST"}, nil},
	}
	runCmdCases(t, ctx, h, tests)
	// Only the two rollbacks that were allowed deployed, each with its target's config.
	if len(deployed) != 2 || deployed[0].Env["TOKEN"] != secret || deployed[1].Env["TOKEN"] != oldSecret {
		t.Errorf("deployed %+v; want v2's config, then v1's", deployed)
	}
	// The refused rollback recorded no release.
	if rels, _ := store.Releases("demo"); len(rels) != 5 {
		t.Errorf("%d releases, want 3 + the two allowed rollbacks", len(rels))
	}
}
