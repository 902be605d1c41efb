package gitserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"

	gossh "golang.org/x/crypto/ssh"
)

// ErrUnknownKey is returned by an Authenticator for a public key it does not know.
var ErrUnknownKey = errors.New("public key is not authorized")

// Authenticator decides who an SSH public key belongs to. It is asked during the SSH handshake
// for every key the client offers; the user name it returns becomes Push.User. A non-nil error
// (ErrUnknownKey for a key it does not know) refuses the key; the client then tries its next
// key or fails with "Permission denied (publickey)".
//
// It is the seam for user management: WithAuthorizedKeys is one Authenticator; a store of
// registered users with per-app roles is another.
type Authenticator interface {
	Authenticate(ctx context.Context, key gossh.PublicKey) (user string, err error)
}

// AuthenticatorFunc adapts a function to Authenticator.
type AuthenticatorFunc func(ctx context.Context, key gossh.PublicKey) (user string, err error)

// Authenticate calls f(ctx, key).
func (f AuthenticatorFunc) Authenticate(ctx context.Context, key gossh.PublicKey) (string, error) {
	return f(ctx, key)
}

// AuthorizedKeysFiles is an Authenticator over files in OpenSSH authorized_keys format
// (sshd(8), "AUTHORIZED_KEYS FILE FORMAT"): one key per line, optional leading options
// (ignored), "#" comments and blank lines; a single `.pub` file is the same format. The
// files are read on every authentication, so edits apply to the next connection; a missing
// file holds no keys. The user name is the key's comment, or its SHA256 fingerprint
// ("SHA256:...", as ssh-keygen -l prints it) when the comment is empty.
type AuthorizedKeysFiles []string

// Authenticate returns the user name of the first line in the files holding key, or
// ErrUnknownKey. Unreadable files (other than missing ones) and malformed lines make an error
// only when the key is not found elsewhere.
func (files AuthorizedKeysFiles) Authenticate(_ context.Context, key gossh.PublicKey) (string, error) {
	want := key.Marshal()
	var errs []error
	for _, f := range files {
		data, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reading authorized keys: %w", err))
			continue
		}
		for rest := data; len(bytes.TrimSpace(rest)) > 0; {
			var (
				k       gossh.PublicKey
				comment string
			)
			// ParseAuthorizedKey skips lines it cannot parse and fails only when no key is left.
			k, comment, _, rest, err = gossh.ParseAuthorizedKey(rest)
			if err != nil {
				break
			}
			if bytes.Equal(k.Marshal(), want) {
				if comment == "" {
					comment = gossh.FingerprintSHA256(k)
				}
				return comment, nil
			}
		}
	}
	return "", errors.Join(append([]error{ErrUnknownKey}, errs...)...)
}
