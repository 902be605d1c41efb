package gitserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"kpush.dev/kpush/gitserver/access"
)

// keygen makes a key pair with ssh-keygen -t typ (-b bits when bits > 0) and returns the
// private key's path and the public key's authorized_keys line.
func keygen(t *testing.T, typ string, bits int, comment string) (priv, pub string) {
	t.Helper()
	needTool(t, "ssh-keygen", "openssh-client")
	priv = filepath.Join(t.TempDir(), "id_"+typ)
	args := []string{"-q", "-t", typ, "-N", "", "-C", comment, "-f", priv}
	if bits > 0 {
		args = append(args, "-b", fmt.Sprint(bits))
	}
	out, err := exec.Command("ssh-keygen", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ssh-keygen %s: %v: %s", strings.Join(args, " "), err, out)
	}
	p, err := os.ReadFile(priv + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return priv, strings.TrimSpace(string(p))
}

// testRoot stands in for kpush's command tree (receiver/commands, which imports this package
// and so cannot be used here): "keys" lists the caller's keys from the store, "keys:add NAME"
// registers the key on stdin for the caller; anything else is an unknown command. Errors go
// to stderr with exit status 1.
func testRoot(store *access.Store) CommandHandler {
	return CommandHandlerFunc(func(ctx context.Context, c *Command) int {
		fail := func(err error) int {
			fmt.Fprintln(c.Stderr, "error:", err)
			return 1
		}
		switch {
		case len(c.Args) == 1 && c.Args[0] == "keys":
			keys, err := store.Keys(c.User)
			if err != nil {
				return fail(err)
			}
			for _, k := range keys {
				fmt.Fprintln(c.Stdout, k.Name, k.Fingerprint)
			}
		case len(c.Args) == 2 && c.Args[0] == "keys:add":
			line, err := io.ReadAll(c.Stdin)
			if err != nil {
				return fail(err)
			}
			if _, err := store.AddKey(c.User, c.Args[1], line); err != nil {
				return fail(err)
			}
		default:
			return fail(fmt.Errorf("unknown command %q", strings.Join(c.Args, " ")))
		}
		return 0
	})
}

// accessServer is a server with WithAccess over a store whose server admin "root" logs in with
// rootKey, and testRoot as command handler.
type accessServer struct {
	*testServer
	store   *access.Store
	rootKey string
}

func startAccessServer(t *testing.T, h Handler, opts ...Option) *accessServer {
	t.Helper()
	needTool(t, "git", "git")
	needTool(t, "ssh", "openssh-client")
	dataDir := t.TempDir()
	store, err := access.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	priv, pub := keygen(t, "ed25519", 0, "root@admin-laptop")
	keys := filepath.Join(t.TempDir(), "admin.pub")
	os.WriteFile(keys, []byte(pub+"\n"), 0o600)
	if err := store.Bootstrap(keys); err != nil {
		t.Fatal(err)
	}
	ts := serveDir(t, dataDir, h, priv, append([]Option{WithAccess(store), WithCommandHandler(testRoot(store))}, opts...)...)
	return &accessServer{testServer: ts, store: store, rootKey: priv}
}

// addUser registers a user (not a server admin) with one new key of type typ and returns the
// private key's path.
func (as *accessServer) addUser(t *testing.T, name, typ string, bits int) string {
	t.Helper()
	priv, pub := keygen(t, typ, bits, name+"@test")
	if _, err := as.store.AddUser(name, false); err != nil {
		t.Fatal(err)
	}
	if _, err := as.store.AddKey(name, "k", []byte(pub)); err != nil {
		t.Fatal(err)
	}
	return priv
}

// ssh runs the system ssh client with command and stdin, and returns stdout, stderr and the
// exit status.
func (ts *testServer) ssh(t *testing.T, key, stdin string, extra []string, command ...string) (string, string, int) {
	t.Helper()
	args := append(append(ts.sshArgs(key), extra...), "git@127.0.0.1")
	cmd := exec.Command("ssh", append(args, command...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), stderr.String(), 0
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	default:
		t.Fatalf("ssh: %v", err)
		return "", "", 0
	}
}

func fingerprint(t *testing.T, privKey string) string {
	t.Helper()
	out, err := exec.Command("ssh-keygen", "-l", "-E", "sha256", "-f", privKey+".pub").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(out))[1]
}

// TestAccessKeyTypes: each accepted key type, made by ssh-keygen and registered in the store,
// pushes with the system ssh client; RSA only with SHA-2 signatures.
func TestAccessKeyTypes(t *testing.T) {
	rec := &recorder{}
	as := startAccessServer(t, rec)
	g := as.git(t, as.rootKey)
	work := g.newRepo()
	g.must(work, "push", "-q", as.scpURL("matrix"), "main")

	var rsaKey string
	for _, kt := range []struct {
		user, typ string
		bits      int
	}{
		{"ed", "ed25519", 0}, {"ec256", "ecdsa", 256}, {"ec384", "ecdsa", 384}, {"ec521", "ecdsa", 521}, {"rsa", "rsa", 3072},
	} {
		key := as.addUser(t, kt.user, kt.typ, kt.bits)
		if kt.typ == "rsa" {
			rsaKey = key
		}
		if err := as.store.SetGrant("matrix", kt.user, access.RoleDeploy); err != nil {
			t.Fatal(err)
		}
		t.Run(kt.user, func(t *testing.T) {
			g := as.git(t, key)
			head := g.commit(work, kt.user+".txt", kt.user)
			if _, stderr, err := g.run(work, "push", as.scpURL("matrix"), "main"); err != nil {
				t.Fatalf("push with %s key: %v\n%s", kt.typ, err, stderr)
			}
			if s := rec.last(t); s.push.User != kt.user || s.push.Updates[0].New != head {
				t.Errorf("handler saw user %q, updates %+v; want %s pushing %s", s.push.User, s.push.Updates, kt.user, head)
			}
		})
	}
	// RSA with SHA-1 signatures (ssh-rsa) is not accepted, even for a registered key.
	_, stderr, code := as.ssh(t, rsaKey, "", []string{"-o", "PubkeyAcceptedAlgorithms=ssh-rsa"}, "keys")
	if code != 255 || !strings.Contains(stderr, "Permission denied") {
		t.Errorf("ssh-rsa (SHA-1) signature: exit %d, stderr %q; want refused", code, stderr)
	}
	if _, stderr, code := as.ssh(t, rsaKey, "", []string{"-o", "PubkeyAcceptedAlgorithms=rsa-sha2-512"}, "keys"); code != 0 {
		t.Errorf("rsa-sha2-512 signature: exit %d, stderr %q", code, stderr)
	}
}

func TestAccessRefusals(t *testing.T) {
	rec := &recorder{}
	as := startAccessServer(t, rec)
	root := as.git(t, as.rootKey)
	work := root.newRepo()
	root.must(work, "push", "-q", as.scpURL("demo"), "main")
	rita := as.addUser(t, "rita", "ed25519", 0) // read on demo
	nora := as.addUser(t, "nora", "ed25519", 0) // no grants
	as.store.SetGrant("demo", "rita", access.RoleRead)
	pushes := len(rec.seen)

	t.Run("unknown key", func(t *testing.T) {
		stranger, _ := keygen(t, "ed25519", 0, "mallory")
		want := "key " + fingerprint(t, stranger) + " is not registered; ask an admin to run: ssh -p " + as.port +
			" git@127.0.0.1 keys:add NAME --user USER < key.pub\n(for a new user, first: ssh -p " + as.port +
			" git@127.0.0.1 users:add USER)\n"
		_, stderr, err := as.git(t, stranger).run(work, "push", as.scpURL("demo"), "main")
		if err == nil || !strings.Contains(stderr, want) {
			t.Errorf("push with unknown key: err %v, output %q; want %q", err, stderr, want)
		}
		for _, command := range [][]string{nil, {"keys"}, {"git-upload-pack 'demo'"}} {
			stdout, stderr, code := as.ssh(t, stranger, "", nil, command...)
			if code != 1 || stderr != want || stdout != "" {
				t.Errorf("ssh %q with unknown key: exit %d, stdout %q, stderr %q; want exit 1 and %q", command, code, stdout, stderr, want)
			}
		}
		if _, err := os.Stat(filepath.Join(as.dataDir, "repos", "new.git")); err == nil {
			t.Error("an unknown key created an app")
		}
	})

	t.Run("reader clones but cannot push", func(t *testing.T) {
		g := as.git(t, rita)
		clone := filepath.Join(t.TempDir(), "c")
		g.must("", "clone", "-q", as.sshURL("demo"), clone)
		g.commit(clone, "r.txt", "r")
		_, stderr, err := g.run(clone, "push", as.scpURL("demo"), "main")
		want := "user rita does not have the deploy role on app demo; ask an admin of demo to run: apps:grant demo rita deploy"
		if err == nil || !strings.Contains(stderr, want) {
			t.Errorf("push by a reader: err %v, output:\n%s\nwant %q", err, stderr, want)
		}
	})

	// To a user without a role, an app and a missing one look alike: same words, same bytes.
	t.Run("user without a role", func(t *testing.T) {
		g := as.git(t, nora)
		into := filepath.Join(t.TempDir(), "c") // a refused clone leaves nothing there
		_, stderr, err := g.run("", "clone", as.sshURL("demo"), into)
		if err == nil || !strings.Contains(stderr, "no app named demo, or you (nora) have no role on it") {
			t.Errorf("clone without a role: err %v, output:\n%s", err, stderr)
		}
		_, missing, _ := g.run("", "clone", as.sshURL("ghost"), into)
		if got := strings.ReplaceAll(missing, "ghost", "demo"); got != stderr {
			t.Errorf("clone of a missing app:\n%s\nclone of an existing app without a role:\n%s\nwant the same but for the name", missing, stderr)
		}
		_, stderr, err = g.run(work, "push", as.scpURL("demo"), "main")
		if err == nil || !strings.Contains(stderr, "no app named demo, or you (nora) have no role on it") || strings.Contains(stderr, "root") {
			t.Errorf("push without a role: err %v, output:\n%s", err, stderr)
		}
	})
	if len(rec.seen) != pushes {
		t.Errorf("the handler saw %d refused pushes", len(rec.seen)-pushes)
	}

	t.Run("any user creates an app and is its admin", func(t *testing.T) {
		g := as.git(t, nora)
		if _, stderr, err := g.run(work, "push", as.scpURL("noras"), "main"); err != nil {
			t.Fatalf("first push to a new app: %v\n%s", err, stderr)
		}
		if want := []access.Grant{{App: "noras", User: "nora", Role: access.RoleAdmin}}; !reflect.DeepEqual(as.store.Grants("noras"), want) {
			t.Errorf("grants of the new app = %+v, want %+v", as.store.Grants("noras"), want)
		}
		// rita may not push to it now that it exists.
		_, stderr, err := as.git(t, rita).run(work, "push", as.scpURL("noras"), "main:other")
		if err == nil || !strings.Contains(stderr, "no app named noras, or you (rita) have no role on it") {
			t.Errorf("push by rita to nora's app: err %v, output:\n%s", err, stderr)
		}
	})

	t.Run("removed key", func(t *testing.T) {
		dan := as.addUser(t, "dan", "ecdsa", 256)
		as.store.SetGrant("demo", "dan", access.RoleDeploy)
		g := as.git(t, dan)
		g.must(work, "push", "-q", as.scpURL("demo"), "main")
		if err := as.store.RemoveKey("dan", "k"); err != nil {
			t.Fatal(err)
		}
		g.commit(work, "d.txt", "d")
		_, stderr, err := g.run(work, "push", as.scpURL("demo"), "main")
		want := "key " + fingerprint(t, dan) + " is not registered; ask an admin to run: ssh -p " + as.port + " git@127.0.0.1 keys:add NAME --user USER < key.pub"
		if err == nil || !strings.Contains(stderr, want) {
			t.Errorf("push with a removed key: err %v, output:\n%s\nwant %q", err, stderr, want)
		}
	})
}

func TestAccessPublicAddr(t *testing.T) {
	as := startAccessServer(t, &recorder{}, WithPublicAddr("git.example.com:2222"))
	stranger, _ := keygen(t, "ed25519", 0, "")
	_, stderr, code := as.ssh(t, stranger, "", nil, "keys")
	want := "ask an admin to run: ssh -p 2222 git@git.example.com keys:add NAME --user USER < key.pub"
	if code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("exit %d, stderr %q; want %q", code, stderr, want)
	}
	if _, err := New(&recorder{}, WithDataDir(t.TempDir()), WithAuthorizedKeys("/x"), WithPublicAddr("nohost")); err == nil || !strings.Contains(err.Error(), "host:port") {
		t.Errorf("WithPublicAddr without a port: %v", err)
	}
}

// TestAccessLoginFollowsTheStore: a user logs in with each registered key (one of them sent
// to the command handler on stdin), a key removed from the store no longer logs in, nor does
// any key of a removed user; the command handler's exit status and stderr reach the client. (The user, key and grant commands themselves are
// tested in receiver/commands.)
func TestAccessLoginFollowsTheStore(t *testing.T) {
	as := startAccessServer(t, &recorder{})
	loggedIn := func(t *testing.T, key string) {
		t.Helper()
		if stdout, stderr, code := as.ssh(t, key, "", nil, "keys"); code != 0 {
			t.Errorf("keys: exit %d, stdout %q, stderr %q; want logged in", code, stdout, stderr)
		}
	}
	refused := func(t *testing.T, key, want string, command ...string) {
		t.Helper()
		stdout, stderr, code := as.ssh(t, key, "", nil, command...)
		if code != 1 || !strings.Contains(stderr, want) || stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 1 and %q", command, code, stdout, stderr, want)
		}
	}

	bobKey, bobPub := keygen(t, "ed25519", 0, "bob@laptop")
	bob2Key, bob2Pub := keygen(t, "ecdsa", 384, "bob@desk")
	if _, err := as.store.AddUser("bob", false); err != nil {
		t.Fatal(err)
	}
	if _, err := as.store.AddKey("bob", "laptop", []byte(bobPub)); err != nil {
		t.Fatal(err)
	}
	loggedIn(t, bobKey)
	// bob registers his second key himself, sending it on stdin.
	if _, stderr, code := as.ssh(t, bobKey, bob2Pub+"\n", nil, "keys:add", "desk"); code != 0 {
		t.Fatalf("keys:add desk: exit %d, stderr %q", code, stderr)
	}
	loggedIn(t, bob2Key)
	if err := as.store.RemoveKey("bob", "laptop"); err != nil {
		t.Fatal(err)
	}
	refused(t, bobKey, "key "+fingerprint(t, bobKey)+" is not registered", "keys")
	loggedIn(t, bob2Key)
	if err := as.store.RemoveUser("bob"); err != nil {
		t.Fatal(err)
	}
	refused(t, bob2Key, "key "+fingerprint(t, bob2Key)+" is not registered", "keys")
	refused(t, as.rootKey, "unknown command", "frobnicate")
	refused(t, as.rootKey, `no command in "  "`, "  ")
}

// TestHiddenRefs: pushes cannot create, update or delete refs under refs/kpush, also in a
// repository created before the setting existed; fetches still get them.
func TestHiddenRefs(t *testing.T) {
	ts := startServer(t, &recorder{})
	g := ts.git(t, ts.aliceKey)
	work := g.newRepo()
	head := g.must(work, "rev-parse", "HEAD")
	g.must(work, "push", "-q", ts.scpURL("app"), "main")
	dir := filepath.Join(ts.dataDir, "repos", "app.git")
	if got := serverGit(t, dir, "config", "receive.hideRefs"); got != HiddenRefPrefix {
		t.Errorf("receive.hideRefs = %q, want %s", got, HiddenRefPrefix)
	}
	serverGit(t, dir, "update-ref", "refs/kpush/releases/v1", head)

	for _, old := range []bool{false, true} {
		if old { // a repository from before: the -c on receive-pack still hides the refs
			serverGit(t, dir, "config", "--unset", "receive.hideRefs")
		}
		next := g.commit(work, "n.txt", fmt.Sprint(old))
		for _, refspec := range []string{"main:refs/kpush/x", "main:refs/kpush/releases/v1", ":refs/kpush/releases/v1", "+main:refs/kpush/releases/v1"} {
			_, stderr, err := g.run(work, "push", ts.scpURL("app"), refspec)
			if err == nil || !regexp.MustCompile(`remote rejected\] .*\(deny (updating|deleting) a hidden ref\)`).MatchString(stderr) {
				t.Errorf("old=%v: push %s: err %v, output:\n%s", old, refspec, err, stderr)
			}
		}
		if got := serverGit(t, dir, "for-each-ref", "--format=%(refname) %(objectname)", "refs/kpush"); got != "refs/kpush/releases/v1 "+head {
			t.Errorf("old=%v: refs/kpush after refused pushes = %q (pushed %s)", old, got, next)
		}
	}

	out := g.must(work, "ls-remote", ts.scpURL("app"))
	if !strings.Contains(out, head+"\trefs/kpush/releases/v1") {
		t.Errorf("ls-remote does not list refs/kpush/releases/v1:\n%s", out)
	}
	fresh := t.TempDir()
	g.must(fresh, "init", "-q")
	g.must(fresh, "fetch", "-q", ts.sshURL("app"), "refs/kpush/releases/v1")
	if got := g.must(fresh, "rev-parse", "FETCH_HEAD"); got != head {
		t.Errorf("fetched refs/kpush/releases/v1 = %s, want %s", got, head)
	}
}

func TestRepoHelpers(t *testing.T) {
	needTool(t, "git", "git")
	s, err := New(&recorder{}, WithDataDir(t.TempDir()), WithAuthorizedKeys("/nonexistent"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if dir, exists := s.RepoDir("demo"); exists || dir != filepath.Join(s.reposDir, "demo.git") {
		t.Errorf("RepoDir before = %q, %v", dir, exists)
	}
	dir, err := s.CreateRepo(ctx, "demo")
	if err != nil {
		t.Fatal(err)
	}
	if d, exists := s.RepoDir("demo"); !exists || d != dir {
		t.Errorf("RepoDir after CreateRepo = %q, %v; want %q, true", d, exists, dir)
	}
	if got := serverGit(t, dir, "config", "receive.hideRefs"); got != HiddenRefPrefix {
		t.Errorf("receive.hideRefs = %q", got)
	}
	if _, err := s.CreateRepo(ctx, "demo"); !errors.Is(err, ErrAppExists) {
		t.Errorf("second CreateRepo = %v, want ErrAppExists", err)
	}
	if err := s.DeleteRepo("demo"); err != nil {
		t.Fatal(err)
	}
	if _, exists := s.RepoDir("demo"); exists {
		t.Error("repository still there after DeleteRepo")
	}
	if err := s.DeleteRepo("demo"); err != nil {
		t.Errorf("DeleteRepo of a missing repository: %v", err)
	}
	for _, bad := range []string{"../x", "", "A"} {
		if d, exists := s.RepoDir(bad); d != "" || exists {
			t.Errorf("RepoDir(%q) = %q, %v", bad, d, exists)
		}
		if _, err := s.CreateRepo(ctx, bad); err == nil {
			t.Errorf("CreateRepo(%q) succeeded", bad)
		}
		if err := s.DeleteRepo(bad); err == nil {
			t.Errorf("DeleteRepo(%q) succeeded", bad)
		}
	}
	if ents, _ := os.ReadDir(s.reposDir); len(ents) != 0 {
		t.Errorf("repos dir not empty: %v", ents)
	}
}
