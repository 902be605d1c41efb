package gitserver

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"
)

func newPublicKey(t *testing.T) gossh.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func authorizedLine(k gossh.PublicKey, comment string) string {
	line := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k)))
	if comment != "" {
		line += " " + comment
	}
	return line
}

func TestAuthorizedKeysFiles(t *testing.T) {
	dir := t.TempDir()
	alice, bob, carol, nobody := newPublicKey(t), newPublicKey(t), newPublicKey(t), newPublicKey(t)
	keys := filepath.Join(dir, "authorized_keys")
	os.WriteFile(keys, []byte(strings.Join([]string{
		"# team keys",
		"",
		authorizedLine(alice, "alice@laptop"),
		"this line is not a key",
		`no-pty,command="/bin/false" ` + authorizedLine(bob, "bob"),
	}, "\n")+"\n"), 0o600)
	pub := filepath.Join(dir, "carol.pub")
	os.WriteFile(pub, []byte(authorizedLine(carol, "")+"\n"), 0o600)

	a := AuthorizedKeysFiles{keys, pub, filepath.Join(dir, "missing")}
	for _, tc := range []struct {
		key  gossh.PublicKey
		user string
	}{
		{alice, "alice@laptop"},
		{bob, "bob"},
		{carol, gossh.FingerprintSHA256(carol)},
	} {
		user, err := a.Authenticate(context.Background(), tc.key)
		if err != nil || user != tc.user {
			t.Errorf("Authenticate = %q, %v; want %q", user, err, tc.user)
		}
	}
	if !strings.HasPrefix(gossh.FingerprintSHA256(carol), "SHA256:") {
		t.Errorf("fingerprint %q is not in ssh-keygen -l form", gossh.FingerprintSHA256(carol))
	}
	if _, err := a.Authenticate(context.Background(), nobody); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("unknown key: err = %v, want ErrUnknownKey", err)
	}

	// Files are re-read: a key added now works at once, a removed one stops working.
	os.WriteFile(keys, []byte(authorizedLine(nobody, "late")+"\n"), 0o600)
	if user, err := a.Authenticate(context.Background(), nobody); err != nil || user != "late" {
		t.Errorf("after adding: Authenticate = %q, %v; want late", user, err)
	}
	if _, err := a.Authenticate(context.Background(), alice); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("after removing: err = %v, want ErrUnknownKey", err)
	}
}
