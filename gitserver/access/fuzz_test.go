package access

import (
	"bytes"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"kpush.dev/kpush/internal/term"
)

// seedKey is the authorized_keys line of a fixed ed25519 key, for seeds.
func seedKey(b byte) string {
	k, err := gossh.NewPublicKey(ed25519.NewKeyFromSeed(bytes.Repeat([]byte{b}, ed25519.SeedSize)).Public())
	if err != nil {
		panic(err)
	}
	return strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k)))
}

// FuzzParseKey checks ParseKey, the parser of keys:add's stdin: an accepted key passes
// CheckKey, and its authorized_keys form (what the store keeps) reads back as the same key,
// with a comment or not; a refused one's error is printable.
func FuzzParseKey(f *testing.F) {
	k := seedKey(1)
	for _, s := range []string{
		"", k, k + " alice@laptop", "  " + k + "\n", `command="echo hi",no-pty ` + k + " ci",
		k + "\n" + seedKey(2), "# comment\n" + k, "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n",
		"ssh-ed25519 AAAA", "ssh-dss AAAAB3NzaC1kc3MAAACBAP", strings.Replace(k, "ssh-ed25519", "ssh-rsa", 1),
		"ecdsa-sha2-nistp256 !!!", "sk-ssh-ed25519@openssh.com", "hello world",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		pub, _, err := ParseKey(line)
		if err != nil {
			if !term.Printable(err.Error()) {
				t.Fatalf("ParseKey(%q) error is not printable: %q", line, err)
			}
			return
		}
		if err := CheckKey(pub); err != nil {
			t.Fatalf("ParseKey(%q) accepted a key CheckKey refuses: %v", line, err)
		}
		stored := bytes.TrimSpace(gossh.MarshalAuthorizedKey(pub))
		for _, again := range [][]byte{stored, append(append([]byte{}, stored...), " a comment"...)} {
			back, _, err := ParseKey(again)
			if err != nil || !bytes.Equal(back.Marshal(), pub.Marshal()) {
				t.Fatalf("ParseKey(%q) = %s; its stored form %q reads back as %v, %v", line, stored, again, back, err)
			}
		}
	})
}

// FuzzBootstrap checks Bootstrap on any authorized keys file: it never fails on content (bad
// lines are skipped), every key CheckKey accepts is registered to a server admin whose name
// passes ValidUserName under a name that passes validKeyName, a second run changes nothing;
// and BootstrapUserName and bootstrapKeyName make valid names of any comment.
func FuzzBootstrap(f *testing.F) {
	k1, k2 := seedKey(1), seedKey(2)
	for _, s := range []string{
		"", k1 + " alice@laptop\n", k1 + " Alice.Smith@laptop\n" + k2 + " alice@desk\n", k1 + "\n" + k1 + " again\n",
		"# only a comment\n", k1 + " 1234@host\n", k1 + " " + strings.Repeat("x-", 50) + "\n", k1 + " ünï cödé\n",
		k1 + " \x1b[31mred\n", "garbage\n" + k2 + " after-garbage\n", `no-pty,command="x" ` + k1 + " opts\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		comment := string(data)
		if u := BootstrapUserName(comment); ValidUserName(u) != nil {
			t.Fatalf("BootstrapUserName(%q) = %q: %v", comment, u, ValidUserName(u))
		}
		st := emptyState()
		st.users["u"] = User{Name: "u"}
		for range 3 { // the first name, then -2 and -3 when taken
			n := bootstrapKeyName(st, "u", comment)
			if err := validKeyName(n); err != nil {
				t.Fatalf("bootstrapKeyName(%q) = %q: %v", comment, n, err)
			}
			if _, err := addKey(st, "u", n, mustKey(t, seedKey(byte(len(st.keys)+10))), time.Time{}); err != nil {
				t.Fatalf("bootstrapKeyName(%q) = %q, which addKey refuses: %v", comment, n, err)
			}
		}

		dir := t.TempDir()
		file := filepath.Join(dir, "authorized_keys")
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(filepath.Join(dir, "data"))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Bootstrap(file); err != nil {
			t.Fatalf("Bootstrap(%q): %v", data, err)
		}
		for rest := data; len(bytes.TrimSpace(rest)) > 0; {
			var pub gossh.PublicKey
			if pub, _, _, rest, err = gossh.ParseAuthorizedKey(rest); err != nil {
				break
			}
			u, err := s.UserByKey(pub)
			switch {
			case CheckKey(pub) != nil:
				if err == nil {
					t.Fatalf("Bootstrap(%q) registered the refused key %s to %s", data, pub.Type(), u.Name)
				}
			case err != nil:
				t.Fatalf("Bootstrap(%q) did not register %s: %v", data, gossh.FingerprintSHA256(pub), err)
			case !u.Admin || ValidUserName(u.Name) != nil:
				t.Fatalf("Bootstrap(%q) registered a key to %+v", data, u)
			}
		}
		users := s.Users()
		keys := map[string][]Key{}
		for _, u := range users {
			ks, err := s.Keys(u.Name)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range ks {
				if err := validKeyName(k.Name); err != nil {
					t.Fatalf("Bootstrap(%q) named a key %q: %v", data, k.Name, err)
				}
			}
			keys[u.Name] = ks
		}
		if err := s.Bootstrap(file); err != nil {
			t.Fatalf("second Bootstrap(%q): %v", data, err)
		}
		for _, u := range s.Users() {
			if ks, _ := s.Keys(u.Name); !reflect.DeepEqual(ks, keys[u.Name]) {
				t.Fatalf("second Bootstrap(%q) changed the keys of %s: %+v, then %+v", data, u.Name, keys[u.Name], ks)
			}
		}
		if !reflect.DeepEqual(s.Users(), users) {
			t.Fatalf("second Bootstrap(%q) changed the users: %+v, then %+v", data, users, s.Users())
		}
	})
}

func mustKey(t *testing.T, line string) gossh.PublicKey {
	t.Helper()
	pub, _, _, _, err := gossh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	return pub
}
