package access

import (
	"crypto/dsa"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

func TestRoles(t *testing.T) {
	for _, tc := range []struct {
		have, need Role
		want       bool
	}{
		{RoleRead, RoleRead, true}, {RoleRead, RoleDeploy, false}, {RoleRead, RoleAdmin, false},
		{RoleDeploy, RoleRead, true}, {RoleDeploy, RoleDeploy, true}, {RoleDeploy, RoleAdmin, false},
		{RoleAdmin, RoleRead, true}, {RoleAdmin, RoleDeploy, true}, {RoleAdmin, RoleAdmin, true},
		{"", RoleRead, false}, {"owner", RoleRead, false}, {RoleAdmin, "", false}, {RoleAdmin, "owner", false},
	} {
		if got := tc.have.Includes(tc.need); got != tc.want {
			t.Errorf("%q.Includes(%q) = %v, want %v", tc.have, tc.need, got, tc.want)
		}
	}
	for _, s := range []string{"read", "deploy", "admin"} {
		if r, err := ParseRole(s); err != nil || string(r) != s {
			t.Errorf("ParseRole(%q) = %q, %v", s, r, err)
		}
	}
	if _, err := ParseRole("Admin"); err == nil || !strings.Contains(err.Error(), "read, deploy or admin") {
		t.Errorf("ParseRole(Admin) error = %v, want the list of roles", err)
	}
}

// authLine returns the authorized_keys line of a public key made with crypto/*.
func authLine(t *testing.T, pub any, comment string) []byte {
	t.Helper()
	k, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k)))
	if comment != "" {
		line += " " + comment
	}
	return []byte(line)
}

func ed25519Line(t *testing.T, comment string) []byte {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return authLine(t, pub, comment)
}

func rsaLine(t *testing.T, bits int) []byte {
	k, err := rsa.GenerateKey(rand.Reader, bits)
	if err != nil {
		t.Fatal(err)
	}
	return authLine(t, &k.PublicKey, "")
}

func ecdsaLine(t *testing.T, c elliptic.Curve) []byte {
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return authLine(t, &k.PublicKey, "")
}

// dsaLine builds an ssh-dss key with crypto/dsa (deprecated in Go, still able to make one).
func dsaLine(t *testing.T) []byte {
	var k dsa.PrivateKey
	if err := dsa.GenerateParameters(&k.Parameters, rand.Reader, dsa.L1024N160); err != nil {
		t.Fatal(err)
	}
	if err := dsa.GenerateKey(&k, rand.Reader); err != nil {
		t.Fatal(err)
	}
	return authLine(t, &k.PublicKey, "old")
}

// certLine is an ed25519 user certificate signed by a throwaway CA.
func certLine(t *testing.T) []byte {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	_, caPriv, _ := ed25519.GenerateKey(rand.Reader)
	k, _ := gossh.NewPublicKey(pub)
	ca, _ := gossh.NewSignerFromKey(caPriv)
	cert := &gossh.Certificate{Key: k, CertType: gossh.UserCert, ValidBefore: gossh.CertTimeInfinity}
	if err := cert.SignCert(rand.Reader, ca); err != nil {
		t.Fatal(err)
	}
	return []byte(strings.TrimSpace(string(gossh.MarshalAuthorizedKey(cert))))
}

func TestKeyPolicy(t *testing.T) {
	// sk-* keys live on hardware tokens; their public halves are built here in the wire format
	// of OpenSSH's PROTOCOL.u2f (key type, key, application "ssh:").
	skEd := gossh.Marshal(struct {
		Name, Key, App string
	}{gossh.KeyAlgoSKED25519, string(make([]byte, 32)), "ssh:"})
	skEdLine := []byte(gossh.KeyAlgoSKED25519 + " " + b64(skEd))
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecPub, _ := ec.PublicKey.ECDH()
	skEC := gossh.Marshal(struct {
		Name, Curve, Key, App string
	}{gossh.KeyAlgoSKECDSA256, "nistp256", string(ecPub.Bytes()), "ssh:"})
	skECLine := []byte(gossh.KeyAlgoSKECDSA256 + " " + b64(skEC))

	for _, tc := range []struct {
		name string
		line []byte
		want string // "" accepted; else a substring of the error
	}{
		{"ed25519", ed25519Line(t, "a@b"), ""},
		{"ecdsa p256", ecdsaLine(t, elliptic.P256()), ""},
		{"ecdsa p384", ecdsaLine(t, elliptic.P384()), ""},
		{"ecdsa p521", ecdsaLine(t, elliptic.P521()), ""},
		{"sk ed25519", skEdLine, ""},
		{"sk ecdsa", skECLine, ""},
		{"rsa 2048", rsaLine(t, 2048), ""},
		{"rsa 3072 with options", append([]byte(`no-pty,command="x" `), rsaLine(t, 3072)...), ""},
		{"rsa 1024", rsaLine(t, 1024), "ssh-rsa key of 1024 bits is too small"},
		{"dsa", dsaLine(t), "ssh-dss (DSA) keys are not accepted"},
		{"certificate", certLine(t), "is an SSH certificate"},
		{"garbage", []byte("hello world"), "not an OpenSSH public key"},
		{"bad base64", []byte("ssh-ed25519 !!!!"), "cannot read the ssh-ed25519 public key"},
		{"empty", []byte("  \n"), "no public key given"},
		{"private key", []byte("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n"), "that is a private key"},
		{"two keys", append(append(ed25519Line(t, "x"), '\n'), ed25519Line(t, "y")...), "more than one public key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ParseKey(tc.line)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error = %v, want it to contain %q", err, tc.want)
			case tc.want != "" && tc.name != "empty" && tc.name != "private key" && tc.name != "two keys" &&
				!strings.Contains(err.Error(), "accepted: ssh-ed25519, ecdsa-sha2-nistp256/384/521"):
				t.Errorf("error %q does not say what is accepted", err)
			}
		})
	}
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func openT(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, WithClock(func() time.Time { return time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC) }))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func parsed(t *testing.T, line []byte) gossh.PublicKey {
	t.Helper()
	k, _, _, _, err := gossh.ParseAuthorizedKey(line)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestStorePersistsAcrossOpen(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	if _, err := s.AddUser("alice", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddUser("bob", false); err != nil {
		t.Fatal(err)
	}
	aliceLine, bobLine := ed25519Line(t, "alice@laptop"), rsaLine(t, 2048)
	if _, err := s.AddKey("alice", "laptop", aliceLine); err != nil {
		t.Fatal(err)
	}
	bk, err := s.AddKey("bob", "work", bobLine)
	if err != nil {
		t.Fatal(err)
	}
	if bk.Type != "ssh-rsa" || !strings.HasPrefix(bk.Fingerprint, "SHA256:") || bk.User != "bob" || bk.Name != "work" {
		t.Errorf("AddKey = %+v", bk)
	}
	for _, g := range []Grant{{"demo", "bob", RoleDeploy}, {"other", "bob", RoleRead}, {"demo", "alice", RoleAdmin}} {
		if err := s.SetGrant(g.App, g.User, g.Role); err != nil {
			t.Fatal(err)
		}
	}

	fi, err := os.Stat(filepath.Join(dir, "state", "access.json"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("access.json mode %v, want 0600", fi.Mode().Perm())
	}
	var raw map[string]any
	data, _ := os.ReadFile(filepath.Join(dir, "state", "access.json"))
	if err := json.Unmarshal(data, &raw); err != nil || raw["version"] != 1.0 {
		t.Errorf("access.json: %v, version %v", err, raw["version"])
	}

	r := openT(t, dir)
	if !reflect.DeepEqual(r.Users(), s.Users()) || len(r.Users()) != 2 {
		t.Errorf("users after reopen = %+v, want %+v", r.Users(), s.Users())
	}
	for _, u := range []string{"alice", "bob"} {
		a, _ := s.Keys(u)
		b, _ := r.Keys(u)
		if !reflect.DeepEqual(a, b) || len(b) != 1 {
			t.Errorf("keys of %s after reopen = %+v, want %+v", u, b, a)
		}
	}
	if want := []Grant{{"demo", "alice", RoleAdmin}, {"demo", "bob", RoleDeploy}}; !reflect.DeepEqual(r.Grants("demo"), want) {
		t.Errorf("grants after reopen = %+v, want %+v", r.Grants("demo"), want)
	}
	if u, err := r.UserByKey(parsed(t, bobLine)); err != nil || u.Name != "bob" {
		t.Errorf("UserByKey(bob's key) after reopen = %+v, %v", u, err)
	}
	if want := []Grant{{"demo", "bob", RoleDeploy}, {"other", "bob", RoleRead}}; !reflect.DeepEqual(r.AppsOf("bob"), want) {
		t.Errorf("AppsOf(bob) = %+v", r.AppsOf("bob"))
	}

	// A corrupt file is an error naming it.
	os.WriteFile(filepath.Join(dir, "state", "access.json"), []byte("{"), 0o600)
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "access.json") {
		t.Errorf("Open of a corrupt file: %v", err)
	}
}

func TestAuthorize(t *testing.T) {
	s := openT(t, t.TempDir())
	s.AddUser("root", true)
	s.AddUser("rita", false)
	s.AddUser("dan", false)
	s.AddUser("ann", false)
	s.SetGrant("demo", "rita", RoleRead)
	s.SetGrant("demo", "dan", RoleDeploy)
	s.SetGrant("demo", "ann", RoleAdmin)
	for _, tc := range []struct {
		user string
		need Role
		ok   bool
	}{
		{"root", RoleAdmin, true},
		{"rita", RoleRead, true}, {"rita", RoleDeploy, false},
		{"dan", RoleDeploy, true}, {"dan", RoleAdmin, false},
		{"ann", RoleAdmin, true}, {"ann", RoleRead, true},
	} {
		err := s.Authorize(tc.user, "demo", tc.need)
		if tc.ok != (err == nil) {
			t.Errorf("Authorize(%s, demo, %s) = %v, want ok=%v", tc.user, tc.need, err, tc.ok)
		}
		var d *DeniedError
		if err != nil && (!errors.As(err, &d) || d.User != tc.user || d.App != "demo" || d.Need != tc.need) {
			t.Errorf("Authorize(%s, demo, %s) = %#v, want a DeniedError", tc.user, tc.need, err)
		}
	}
	if err := s.Authorize("dan", "elsewhere", RoleRead); err == nil {
		t.Error("dan may read an app he has no grant on")
	}
	if err := s.Authorize("ghost", "demo", RoleRead); !errors.Is(err, ErrUnknownUser) {
		t.Errorf("Authorize(ghost) = %v, want ErrUnknownUser", err)
	}
	if err := s.SetGrant("demo", "ghost", RoleRead); !errors.Is(err, ErrUnknownUser) {
		t.Errorf("SetGrant(ghost) = %v, want ErrUnknownUser", err)
	}
	if err := s.SetGrant("Bad_App", "dan", RoleRead); err == nil {
		t.Error("SetGrant accepted an invalid app name")
	}
	if err := s.SetGrant("demo", "dan", "owner"); err == nil {
		t.Error("SetGrant accepted an unknown role")
	}
	if err := s.Revoke("demo", "dan"); err != nil {
		t.Fatal(err)
	}
	if err := s.Revoke("demo", "dan"); err == nil || !strings.Contains(err.Error(), "has no role") {
		t.Errorf("second Revoke = %v", err)
	}
	if err := s.Authorize("dan", "demo", RoleRead); err == nil {
		t.Error("revoked dan may still read")
	}
	if err := s.RemoveApp("demo"); err != nil || len(s.Grants("demo")) != 0 {
		t.Errorf("RemoveApp: %v, grants left %+v", err, s.Grants("demo"))
	}
}

func TestRemoveUserCascades(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	s.AddUser("root", true)
	s.AddUser("bob", false)
	line := ed25519Line(t, "")
	s.AddKey("bob", "k1", line)
	s.AddKey("bob", "k2", ecdsaLine(t, elliptic.P384()))
	s.SetGrant("demo", "bob", RoleDeploy)
	s.SetGrant("demo", "root", RoleAdmin)
	if err := s.RemoveUser("bob"); err != nil {
		t.Fatal(err)
	}
	r := openT(t, dir)
	for _, st := range []*Store{s, r} {
		if _, err := st.UserByKey(parsed(t, line)); !errors.Is(err, ErrUnknownKey) {
			t.Errorf("bob's key after RemoveUser: %v, want ErrUnknownKey", err)
		}
		if _, err := st.Keys("bob"); !errors.Is(err, ErrUnknownUser) {
			t.Errorf("Keys(bob) after RemoveUser: %v", err)
		}
		if want := []Grant{{"demo", "root", RoleAdmin}}; !reflect.DeepEqual(st.Grants("demo"), want) {
			t.Errorf("grants after RemoveUser = %+v, want %+v", st.Grants("demo"), want)
		}
	}
	// The key is free again: another user may register it.
	s.AddUser("carol", false)
	if _, err := s.AddKey("carol", "k1", line); err != nil {
		t.Errorf("re-registering a removed user's key: %v", err)
	}
	if err := s.RemoveUser("root"); err == nil || !strings.Contains(err.Error(), "last server admin") {
		t.Errorf("removing the last admin: %v", err)
	}
	if err := s.RemoveUser("nobody"); !errors.Is(err, ErrUnknownUser) {
		t.Errorf("RemoveUser(nobody) = %v", err)
	}
}

func TestKeys(t *testing.T) {
	s := openT(t, t.TempDir())
	s.AddUser("alice", false)
	s.AddUser("bob", false)
	line := ed25519Line(t, "alice@laptop")
	k, err := s.AddKey("alice", "laptop", line)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		user, name string
		line       []byte
		want       string
	}{
		{"bob", "mine", line, "already registered to user alice"},
		{"alice", "again", line, "already registered to you"},
		{"alice", "laptop", ed25519Line(t, ""), `already has a key named "laptop"`},
		{"alice", "bad name", ed25519Line(t, ""), "invalid key name"},
		{"alice", "SHA256:x", ed25519Line(t, ""), "invalid key name"},
		{"ghost", "k", ed25519Line(t, ""), "unknown user"},
		{"alice", "old", dsaLine(t), "ssh-dss (DSA)"},
	} {
		if _, err := s.AddKey(tc.user, tc.name, tc.line); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("AddKey(%s, %s) = %v, want %q", tc.user, tc.name, err, tc.want)
		}
	}
	k2, _ := s.AddKey("alice", "desk", ecdsaLine(t, elliptic.P521()))
	keys, _ := s.Keys("alice")
	if len(keys) != 2 || keys[0].Name != "desk" || keys[1].Name != "laptop" {
		t.Errorf("Keys(alice) = %+v, want desk and laptop", keys)
	}
	if err := s.RemoveKey("bob", "laptop"); err == nil {
		t.Error("bob removed alice's key")
	}
	if err := s.RemoveKey("alice", k.Fingerprint); err != nil {
		t.Errorf("RemoveKey by fingerprint: %v", err)
	}
	if err := s.RemoveKey("alice", "desk"); err != nil {
		t.Errorf("RemoveKey by name: %v", err)
	}
	if _, err := s.UserByKey(parsed(t, []byte(k2.PublicKey))); !errors.Is(err, ErrUnknownKey) || !strings.Contains(err.Error(), k2.Fingerprint) {
		t.Errorf("UserByKey of a removed key = %v, want ErrUnknownKey with its fingerprint", err)
	}
}

func TestBootstrapUserName(t *testing.T) {
	for in, want := range map[string]string{
		"alice":                 "alice",
		"alice@laptop":          "alice",
		"Alice.Smith@corp":      "alice-smith",
		"bob_jones@x":           "bob-jones",
		"  carol  ":             "carol",
		"":                      "admin",
		"@host":                 "admin",
		"123":                   "admin",
		"9lives":                "lives",
		"x--y__z-":              "x-y-z",
		"élodie":                "lodie",
		strings.Repeat("a", 70): strings.Repeat("a", 63),
	} {
		if got := BootstrapUserName(in); got != want {
			t.Errorf("BootstrapUserName(%q) = %q, want %q", in, got, want)
		}
		if err := ValidUserName(BootstrapUserName(in)); err != nil {
			t.Errorf("BootstrapUserName(%q) is not a valid user name: %v", in, err)
		}
	}
}

func TestBootstrap(t *testing.T) {
	dir := t.TempDir()
	files := t.TempDir()
	alice1, alice2, anon, small := ed25519Line(t, "alice@laptop"), ecdsaLine(t, elliptic.P256()), ed25519Line(t, ""), rsaLine(t, 1024)
	ak := filepath.Join(files, "authorized_keys")
	os.WriteFile(ak, []byte("# admins\n"+string(alice1)+"\n"+string(alice2)+" alice@desk\n"+string(small)+" weak@x\n"), 0o600)
	pub := filepath.Join(files, "id.pub")
	os.WriteFile(pub, append(anon, '\n'), 0o600)

	s := openT(t, dir)
	s.AddUser("bob", false)
	bobLine := ed25519Line(t, "")
	s.AddKey("bob", "k", bobLine)
	// bob's key is in the admins file too (with another comment): bob becomes an admin.
	os.WriteFile(filepath.Join(files, "bob.pub"), append(bobLine, " robert@home\n"...), 0o600)

	all := []string{ak, pub, filepath.Join(files, "bob.pub"), filepath.Join(files, "missing.pub")}
	if err := s.Bootstrap(all...); err != nil {
		t.Fatal(err)
	}
	want := []User{
		{Name: "admin", Admin: true, Created: s.now().UTC()},
		{Name: "alice", Admin: true, Created: s.now().UTC()},
		{Name: "bob", Admin: true, Created: s.now().UTC()},
	}
	if got := s.Users(); !reflect.DeepEqual(got, want) {
		t.Errorf("users after Bootstrap = %+v, want %+v", got, want)
	}
	keys, _ := s.Keys("alice")
	if len(keys) != 2 || keys[0].Name != "alice@desk" || keys[1].Name != "alice@laptop" {
		t.Errorf("alice's keys = %+v", keys)
	}
	if keys, _ := s.Keys("admin"); len(keys) != 1 || keys[0].Name != "bootstrap" {
		t.Errorf("admin's keys = %+v", keys)
	}
	if _, err := s.UserByKey(parsed(t, small)); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("the 1024-bit RSA key was registered: %v", err)
	}
	if keys, _ := s.Keys("bob"); len(keys) != 1 {
		t.Errorf("bob's keys = %+v, want his one key, not a second copy", keys)
	}

	// Idempotent: the same files at the next start change nothing, not even the file.
	before, _ := os.ReadFile(filepath.Join(dir, "state", "access.json"))
	r := openT(t, dir)
	if err := r.Bootstrap(all...); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "state", "access.json"))
	if string(before) != string(after) {
		t.Errorf("second Bootstrap changed the state:\n%s\n---\n%s", before, after)
	}

	// Unreadable file (a directory) is an error.
	if err := r.Bootstrap(files); err == nil {
		t.Error("Bootstrap of a directory succeeded")
	}
}

func TestStoreConcurrent(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	s.AddUser("root", true)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			name := "u" + string(rune('a'+i))
			if _, err := s.AddUser(name, false); err != nil {
				t.Error(err)
			}
			if _, err := s.AddKey(name, "k", ed25519Line(t, "")); err != nil {
				t.Error(err)
			}
			if err := s.SetGrant("demo", name, RoleRead); err != nil {
				t.Error(err)
			}
			s.Authorize(name, "demo", RoleRead)
			s.Users()
		})
	}
	wg.Wait()
	r := openT(t, dir)
	if len(r.Users()) != 9 || len(r.Grants("demo")) != 8 {
		t.Errorf("after concurrent updates: %d users, %d grants; want 9 and 8", len(r.Users()), len(r.Grants("demo")))
	}
}

// The last key of the last server admin who can log in cannot be removed: nobody could
// manage users and keys afterwards.
func TestRemoveKeyKeepsAnAdminWhoCanLogIn(t *testing.T) {
	s := openT(t, t.TempDir())
	for _, u := range []struct {
		name  string
		admin bool
	}{{"alice", true}, {"bob", false}} {
		if _, err := s.AddUser(u.name, u.admin); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []struct{ user, name string }{{"alice", "laptop"}, {"alice", "desk"}, {"bob", "work"}} {
		if _, err := s.AddKey(k.user, k.name, ed25519Line(t, k.name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.RemoveKey("alice", "laptop"); err != nil {
		t.Fatalf("removing one of two admin keys: %v", err)
	}
	if err := s.RemoveKey("alice", "desk"); err == nil || !strings.Contains(err.Error(), "last server admin who can log in") {
		t.Fatalf("removing the last admin key = %v, want a refusal", err)
	}
	if keys, _ := s.Keys("alice"); len(keys) != 1 {
		t.Errorf("alice's keys after the refusal = %v, want desk kept", keys)
	}
	if err := s.RemoveKey("bob", "work"); err != nil {
		t.Errorf("a non-admin may remove their last key: %v", err)
	}
}
