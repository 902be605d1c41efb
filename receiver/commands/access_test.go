package commands

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"kpush.dev/kpush/gitserver"
	"kpush.dev/kpush/gitserver/access"
	"kpush.dev/kpush/receiver"
)

// keygen makes a key pair with ssh-keygen -t typ (-b bits when bits > 0) and returns the
// public key's authorized_keys line and its SHA256 fingerprint.
func keygen(t *testing.T, typ string, bits int, comment string) (pub, fingerprint string) {
	t.Helper()
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		t.Fatal("ssh-keygen not found in $PATH: install it (apt-get install openssh-client)")
	}
	priv := filepath.Join(t.TempDir(), "id_"+typ)
	args := []string{"-q", "-t", typ, "-N", "", "-C", comment, "-f", priv}
	if bits > 0 {
		args = append(args, "-b", fmt.Sprint(bits))
	}
	if out, err := exec.Command("ssh-keygen", args...).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen %s: %v: %s", strings.Join(args, " "), err, out)
	}
	p, err := os.ReadFile(priv + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ssh-keygen", "-l", "-E", "sha256", "-f", priv+".pub").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(p)), strings.Fields(string(out))[1]
}

// accessHandler is a Handler over a real access store whose server admin is root, and a real
// app store.
func accessHandler(t *testing.T) (*Handler, *access.Store) {
	t.Helper()
	dir := t.TempDir()
	acc, err := access.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acc.AddUser("root", true); err != nil {
		t.Fatal(err)
	}
	store, err := receiver.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return &Handler{Apps: &receiver.Pipeline{Store: store, Access: acc}, Access: acc, SSH: "ssh -p 2222 git@127.0.0.1"}, acc
}

// run runs one command line as user with stdin and returns stdout, stderr and the exit status.
func run(h *Handler, user, stdin string, args ...string) (string, string, int) {
	var stdout, stderr bytes.Buffer
	code := h.RunCommand(context.Background(), &gitserver.Command{User: user, Args: args, Addr: "127.0.0.1:2222",
		Stdin: strings.NewReader(stdin), Stdout: &stdout, Stderr: &stderr})
	return stdout.String(), stderr.String(), code
}

// TestAccessCommands runs the user, key and grant commands against a real access store: who
// may manage users, keys and grants, what the lists print (tables and --json), the key policy
// at keys:add, and users:remove taking keys and grants along.
func TestAccessCommands(t *testing.T) {
	h, acc := accessHandler(t)
	ok := func(t *testing.T, user, stdin string, command ...string) string {
		t.Helper()
		stdout, stderr, code := run(h, user, stdin, command...)
		if code != 0 {
			t.Fatalf("%s %q: exit %d, stderr %q", user, command, code, stderr)
		}
		return stdout
	}
	refused := func(t *testing.T, user, stdin, want string, command ...string) {
		t.Helper()
		stdout, stderr, code := run(h, user, stdin, command...)
		if code != 1 || !strings.Contains(stderr, want) || stdout != "" {
			t.Errorf("%s %q: exit %d, stdout %q, stderr %q; want exit 1 and %q", user, command, code, stdout, stderr, want)
		}
	}

	bobPub, bobFP := keygen(t, "ed25519", 0, "bob@laptop")
	bob2Pub, bob2FP := keygen(t, "ecdsa", 384, "bob@desk")
	if out := ok(t, "root", "", "users:add", "bob"); !strings.Contains(out, "added user bob") {
		t.Errorf("users:add output %q", out)
	}
	if out := ok(t, "root", bobPub+"\n", "keys:add", "laptop", "--user", "bob"); !strings.Contains(out, "added ssh-ed25519 key laptop ("+bobFP+") for bob") {
		t.Errorf("keys:add output %q", out)
	}
	// bob adds his second key himself.
	ok(t, "bob", bob2Pub, "keys:add", "desk")
	var keys []access.Key
	if err := json.Unmarshal([]byte(ok(t, "bob", "", "keys", "--json")), &keys); err != nil {
		t.Fatalf("keys --json: %v", err)
	}
	if len(keys) != 2 || keys[0].Name != "desk" || keys[1].Name != "laptop" || keys[0].Fingerprint != bob2FP {
		t.Errorf("keys --json = %+v", keys)
	}
	if out := ok(t, "root", "", "keys", "--user", "bob"); !regexp.MustCompile(`(?m)^laptop +ssh-ed25519 +SHA256:`).MatchString(out) {
		t.Errorf("keys --user bob (table):\n%s", out)
	}
	ok(t, "bob", "", "keys:remove", "laptop")
	if keys, _ := acc.Keys("bob"); len(keys) != 1 || keys[0].Name != "desk" {
		t.Errorf("bob's keys after keys:remove laptop: %+v", keys)
	}

	// Only server admins manage users and others' keys.
	refused(t, "bob", "", "only server admins may add users", "users:add", "eve")
	refused(t, "bob", "", "only server admins may remove users", "users:remove", "root")
	refused(t, "bob", bobPub, "only server admins may act on another user's keys", "keys:add", "x", "--user", "root")
	refused(t, "bob", "", "only server admins", "keys", "--user", "root")
	var users []access.User
	if err := json.Unmarshal([]byte(ok(t, "bob", "", "users", "--json")), &users); err != nil {
		t.Fatalf("users --json: %v", err)
	}
	if len(users) != 2 || users[0].Name != "bob" || users[0].Admin || users[1].Name != "root" || !users[1].Admin {
		t.Errorf("users --json = %+v", users)
	}

	// Grants: server admins and app admins.
	ok(t, "root", "", "users:add", "eve")
	refused(t, "root", "", "cannot grant a role on demo: app demo does not exist; create it with ssh git@HOST apps:create demo", "apps:grant", "demo", "bob", "admin")
	if g := acc.Grants("demo"); len(g) != 0 {
		t.Errorf("grants after apps:grant on a missing app: %+v", g)
	}
	if err := h.Apps.Store.CreateApp(&receiver.App{Name: "demo", Owner: "root"}); err != nil {
		t.Fatal(err)
	}
	ok(t, "root", "", "apps:grant", "demo", "bob", "admin")
	if out := ok(t, "bob", "", "apps:grant", "demo", "eve", "read"); !strings.Contains(out, "eve now has the read role on demo") {
		t.Errorf("apps:grant output %q", out)
	}
	var grants []access.Grant
	if err := json.Unmarshal([]byte(ok(t, "bob", "", "apps:access", "demo", "--json")), &grants); err != nil {
		t.Fatalf("apps:access --json: %v", err)
	}
	if want := []access.Grant{{App: "demo", User: "bob", Role: "admin"}, {App: "demo", User: "eve", Role: "read"}}; !reflect.DeepEqual(grants, want) {
		t.Errorf("apps:access --json = %+v, want %+v", grants, want)
	}
	refused(t, "eve", "", "user eve does not have the admin role on app demo", "apps:grant", "demo", "eve", "admin")
	refused(t, "bob", "", "no app named other, or you (bob) have no role on it", "apps:grant", "other", "eve", "read")
	refused(t, "bob", "", `unknown role "owner"`, "apps:grant", "demo", "eve", "owner")
	refused(t, "bob", "", "apps:grant needs APP USER ROLE (missing ROLE)", "apps:grant", "demo", "eve")
	ok(t, "bob", "", "apps:revoke", "demo", "eve")
	refused(t, "bob", "", "user eve has no role on app demo", "apps:revoke", "demo", "eve")

	// Key policy at keys:add, for keys ssh-keygen made: DSA and 1024-bit RSA.
	dsaPub, _ := keygen(t, "dsa", 0, "old")
	rsaPub, _ := keygen(t, "rsa", 1024, "weak")
	refused(t, "bob", dsaPub, "ssh-dss (DSA) keys are not accepted; accepted: ssh-ed25519", "keys:add", "old")
	refused(t, "bob", rsaPub, "ssh-rsa key of 1024 bits is too small", "keys:add", "weak")
	refused(t, "bob", "", "no public key given", "keys:add", "empty")
	refused(t, "bob", bob2Pub, "already registered to you", "keys:add", "again")
	refused(t, "bob", strings.Repeat("x", maxKeyInput+1), "stdin holds more than 64 KiB", "keys:add", "big")

	// users:remove takes keys and grants along; the removed user's commands are refused.
	if out := ok(t, "root", "", "users:remove", "bob"); !strings.Contains(out, "removed user bob") {
		t.Errorf("users:remove output %q", out)
	}
	if keys, err := acc.Keys("bob"); err == nil || len(keys) != 0 {
		t.Errorf("keys of a removed user: %+v, %v", keys, err)
	}
	if g := acc.Grants("demo"); len(g) != 0 {
		t.Errorf("grants after users:remove bob: %+v", g)
	}
	refused(t, "bob", "", "you (bob) are no longer a registered user", "keys")
}
