package gitserver

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kpush.dev/kpush/gitserver/access"
)

// TestAbandonedFirstPushLeavesNothing: a first push that ends without a ref (the client sent
// nothing, or a push the handler refused) leaves no repository and no grant, so another user
// can create the app; an empty repository a stopped server left with its grant is taken over
// by the next creator; and a push another push still holds is not removed under it.
func TestAbandonedFirstPushLeavesNothing(t *testing.T) {
	release := make(chan struct{})
	holding := make(chan struct{}, 1)
	as := startAccessServer(t, HandlerFunc(func(ctx context.Context, p *Push, out io.Writer) error {
		if p.App == "held" {
			holding <- struct{}{}
			<-release
			return errors.New("refused")
		}
		return nil
	}))
	nora := as.addUser(t, "nora", "ed25519", 0)
	rita := as.addUser(t, "rita", "ed25519", 0)
	repo := func(app string) string { return filepath.Join(as.dataDir, "repos", app+".git") }
	gone := func(t *testing.T, app string) {
		t.Helper()
		if _, err := os.Stat(repo(app)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("repository of %s after an abandoned first push: %v, want none", app, err)
		}
		if g := as.store.Grants(app); len(g) != 0 {
			t.Errorf("grants on %s after an abandoned first push: %+v, want none", app, g)
		}
	}

	// The client connects and hangs up: receive-pack reads no command.
	as.ssh(t, nora, "", nil, "git-receive-pack 'quiet'") // git exits 128: the client hung up
	gone(t, "quiet")
	// A push with nothing to send (an empty repository pushing --all).
	g := as.git(t, nora)
	empty := t.TempDir()
	g.must(empty, "init", "-q")
	_, stderr, _ := g.run(empty, "push", "--all", as.sshURL("nothing")) // git: "doing nothing"
	gone(t, "nothing")
	if want := "app nothing was not created: the push stored no branch"; !strings.Contains(stderr, want) {
		t.Errorf("push of nothing to a new app: output\n%s\nwant %q", stderr, want)
	}
	// rita creates the name nora tried.
	rg := as.git(t, rita)
	work := rg.newRepo()
	rg.must(work, "push", "-q", as.sshURL("quiet"), "main")
	if want := []access.Grant{{App: "quiet", User: "rita", Role: access.RoleAdmin}}; len(as.store.Grants("quiet")) != 1 || as.store.Grants("quiet")[0] != want[0] {
		t.Errorf("grants of quiet = %+v, want %+v", as.store.Grants("quiet"), want)
	}

	// What a server stopped in the middle of nora's first push left: an empty repository and
	// her grant. rita's push takes the name over; nora keeps nothing on it.
	if _, err := as.ensureRepo(context.Background(), "left", as.log); err != nil {
		t.Fatal(err)
	}
	as.store.SetGrant("left", "nora", access.RoleAdmin)
	rg.must(work, "push", "-q", as.sshURL("left"), "main")
	if g := as.store.Grants("left"); len(g) != 1 || g[0].User != "rita" || g[0].Role != access.RoleAdmin {
		t.Errorf("grants of left after rita's push = %+v, want rita admin only", g)
	}

	// nora's first push of held waits in the handler; her second connection to it ends with
	// nothing sent, and must not remove the repository the first one is using.
	first := g.cmd(work, "push", as.sshURL("held"), "main")
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-holding:
	case <-time.After(60 * time.Second): // a guard against hanging, not part of the proof
		t.Fatal("the first push never reached the handler")
	}
	as.ssh(t, nora, "", nil, "git-receive-pack 'held'")
	if _, err := os.Stat(filepath.Join(repo("held"), "HEAD")); err != nil {
		t.Errorf("repository of held while its first push runs: %v", err)
	}
	close(release)
	if err := first.Wait(); err == nil {
		t.Error("the refused first push succeeded")
	}
	gone(t, "held")
}
