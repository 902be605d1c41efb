package access

import (
	"bytes"
	"crypto/rsa"
	"errors"
	"fmt"
	"os"
	"strings"

	gossh "golang.org/x/crypto/ssh"

	"kpush.dev/kpush/internal/term"
)

// MinRSABits is the smallest RSA modulus AddKey accepts.
const MinRSABits = 2048

// acceptedTypes are the SSH public key types AddKey accepts (ssh-rsa only with MinRSABits).
var acceptedTypes = map[string]bool{
	gossh.KeyAlgoED25519:    true,
	gossh.KeyAlgoECDSA256:   true,
	gossh.KeyAlgoECDSA384:   true,
	gossh.KeyAlgoECDSA521:   true,
	gossh.KeyAlgoSKED25519:  true,
	gossh.KeyAlgoSKECDSA256: true,
	gossh.KeyAlgoRSA:        true,
}

const acceptedList = "accepted: ssh-ed25519, ecdsa-sha2-nistp256/384/521, sk-ssh-ed25519@openssh.com, " +
	"sk-ecdsa-sha2-nistp256@openssh.com, ssh-rsa of at least 2048 bits; make one with: ssh-keygen -t ed25519"

// CheckKey returns nil when key may be registered: type ssh-ed25519, ecdsa-sha2-nistp256/384/521,
// sk-ssh-ed25519@openssh.com, sk-ecdsa-sha2-nistp256@openssh.com, or ssh-rsa with a modulus of
// at least MinRSABits bits (the server accepts only rsa-sha2-256/512 signatures from it). Else
// the error names the key's type (and size) and what is accepted. Certificates are refused.
func CheckKey(key gossh.PublicKey) error {
	t := key.Type()
	if _, isCert := key.(*gossh.Certificate); isCert || strings.Contains(t, "-cert-") {
		return fmt.Errorf("%s is an SSH certificate; register the plain public key instead (%s)", t, acceptedList)
	}
	if !acceptedTypes[t] {
		what := t
		if t == gossh.InsecureKeyAlgoDSA {
			what = "ssh-dss (DSA)"
		}
		return fmt.Errorf("%s keys are not accepted; %s", what, acceptedList)
	}
	if t == gossh.KeyAlgoRSA {
		ck, ok := key.(gossh.CryptoPublicKey)
		if !ok {
			return fmt.Errorf("ssh-rsa key cannot be read; %s", acceptedList)
		}
		rk, ok := ck.CryptoPublicKey().(*rsa.PublicKey)
		if !ok {
			return fmt.Errorf("ssh-rsa key cannot be read; %s", acceptedList)
		}
		if bits := rk.N.BitLen(); bits < MinRSABits {
			return fmt.Errorf("ssh-rsa key of %d bits is too small (RSA needs at least %d bits); %s", bits, MinRSABits, acceptedList)
		}
	}
	return nil
}

// ParseKey reads one public key in OpenSSH authorized_keys format (options allowed, comment
// returned) and checks it with CheckKey. More than one key, a private key or anything that
// is not a public key is an error for people.
func ParseKey(line []byte) (gossh.PublicKey, string, error) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return nil, "", errors.New("no public key given: send the .pub file on stdin, e.g. < ~/.ssh/id_ed25519.pub")
	}
	if bytes.Contains(line, []byte("PRIVATE KEY")) {
		return nil, "", errors.New("that is a private key: never send it anywhere; send the public key, e.g. < ~/.ssh/id_ed25519.pub")
	}
	pub, comment, _, rest, err := gossh.ParseAuthorizedKey(line)
	if err != nil {
		first, _, _ := bytes.Cut(line, []byte(" "))
		if len(first) > 40 {
			first = append(first[:40:40], "..."...)
		}
		if bytes.HasPrefix(first, []byte("ssh-")) || bytes.HasPrefix(first, []byte("ecdsa-")) || bytes.HasPrefix(first, []byte("sk-")) {
			// x/crypto's error can quote bytes it decoded from the key: escaped too.
			return nil, "", fmt.Errorf("cannot read the %s public key: %s; %s", term.Sanitize(string(first)), term.Sanitize(err.Error()), acceptedList)
		}
		return nil, "", fmt.Errorf("not an OpenSSH public key (want one line like \"ssh-ed25519 AAAA... you@host\", the content of a .pub file); %s", acceptedList)
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		if _, _, _, _, err := gossh.ParseAuthorizedKey(rest); err == nil {
			return nil, "", errors.New("more than one public key given: add one key at a time")
		}
	}
	if err := CheckKey(pub); err != nil {
		return nil, "", err
	}
	return pub, comment, nil
}

// BootstrapUserName turns a key comment into the name of the server admin Bootstrap registers
// the key to: the part before '@', lowercased, every run of characters other than [a-z0-9]
// made one '-', leading characters up to the first letter and trailing '-' dropped, cut to 63
// characters; "admin" when nothing is left. "Alice.Smith@laptop" → "alice-smith".
func BootstrapUserName(comment string) string {
	name, _, _ := strings.Cut(strings.TrimSpace(comment), "@")
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9' && b.Len() > 0:
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(r)
		default:
			dash = true
		}
	}
	out := b.String()
	if len(out) > 63 {
		out = strings.TrimRight(out[:63], "-")
	}
	if out == "" {
		return "admin"
	}
	return out
}

// Bootstrap registers every key in files (OpenSSH authorized_keys format; a .pub file is one)
// to a server admin named BootstrapUserName(the key's comment), creating the user or making
// an existing one a server admin. A key already registered stays with its owner, who is made
// a server admin: these files are the configuration of who administers the server. It runs at
// every start and changes nothing the second time. Missing files are skipped; keys the policy
// refuses (CheckKey) are skipped with a warning in the log; an unreadable file is an error.
func (s *Store) Bootstrap(files ...string) error {
	type entry struct {
		pub     gossh.PublicKey
		comment string
		file    string
	}
	var entries []entry
	for _, f := range files {
		data, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			s.log.Warn("authorized keys file is missing", "file", f)
			continue
		}
		if err != nil {
			return fmt.Errorf("reading admin keys: %w", err)
		}
		for rest := data; len(bytes.TrimSpace(rest)) > 0; {
			var (
				pub     gossh.PublicKey
				comment string
			)
			pub, comment, _, rest, err = gossh.ParseAuthorizedKey(rest)
			if err != nil {
				break // no key left; lines that are not keys are skipped by ParseAuthorizedKey
			}
			if err := CheckKey(pub); err != nil {
				s.log.Warn("admin key refused", "file", f, "fingerprint", gossh.FingerprintSHA256(pub), "err", err)
				continue
			}
			entries = append(entries, entry{pub, comment, f})
		}
	}
	return s.update(func(st *state) error {
		for _, e := range entries {
			fp := gossh.FingerprintSHA256(e.pub)
			if k, ok := st.keys[fp]; ok {
				if u := st.users[k.User]; !u.Admin {
					u.Admin = true
					st.users[k.User] = u
					s.log.Info("made server admin by authorized keys file", "user", k.User, "file", e.file)
				}
				continue
			}
			name := BootstrapUserName(e.comment)
			u, ok := st.users[name]
			if !ok {
				u = User{Name: name, Created: s.now().UTC()}
			}
			if !u.Admin {
				u.Admin = true
				s.log.Info("server admin from authorized keys file", "user", name, "file", e.file)
			}
			st.users[name] = u
			keyName := bootstrapKeyName(st, name, e.comment)
			if _, err := addKey(st, name, keyName, e.pub, s.now()); err != nil {
				return fmt.Errorf("registering admin key from %s: %w", e.file, err)
			}
			s.log.Info("registered admin key", "user", name, "key", keyName, "fingerprint", fp)
		}
		return nil
	})
}

// bootstrapKeyName names a bootstrapped key after its comment (made a valid key name), or
// "bootstrap", with -2, -3… when the user already has a key of that name.
func bootstrapKeyName(st *state, user, comment string) string {
	var b strings.Builder
	for _, r := range strings.TrimSpace(comment) {
		if r < 128 && (keyNameRE.MatchString("a" + string(r))) {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	base := strings.TrimLeft(b.String(), "._@+-")
	if len(base) > 56 {
		base = base[:56]
	}
	if base == "" {
		base = "bootstrap"
	}
	taken := map[string]bool{}
	for _, k := range st.keys {
		if k.User == user {
			taken[k.Name] = true
		}
	}
	name := base
	for i := 2; taken[name]; i++ {
		name = fmt.Sprintf("%s-%d", base, i)
	}
	return name
}
