package gitserver

import (
	"errors"
	"fmt"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"kpush.dev/kpush/gitserver/access"
)

// Access is who may do what: the registered users and their keys, and their roles per app.
// *access.Store implements it. With WithAccess, every client whose key signature verifies gets
// a session; the session then answers an unregistered key with how to register it, and each git
// service checks the user's role on the app.
type Access interface {
	// UserByKey returns the user key is registered to, or an error wrapping
	// access.ErrUnknownKey.
	UserByKey(key gossh.PublicKey) (access.User, error)
	// Authorize returns nil when user holds need on app, a *access.DeniedError when they do
	// not, or another error (e.g. the user was just removed) whose text is for people.
	Authorize(user, app string, need access.Role) error
	// SetGrant gives user role on app; the server grants access.RoleAdmin to whoever creates
	// an app by pushing to it.
	SetGrant(app, user string, role access.Role) error
	// RemoveApp drops every grant on app: the server does when a first push ends without
	// creating the app (dropAbandoned).
	RemoveApp(app string) error
}

// pubKeyAuthAlgorithms are the signature algorithms the server accepts for public key
// authentication: x/crypto's secure set, which leaves out ssh-rsa (RSA with SHA-1) and
// ssh-dss. RSA keys sign with rsa-sha2-256 or rsa-sha2-512 (RFC 8332).
var pubKeyAuthAlgorithms = []string{
	gossh.KeyAlgoED25519, gossh.KeyAlgoSKED25519,
	gossh.KeyAlgoECDSA256, gossh.KeyAlgoECDSA384, gossh.KeyAlgoECDSA521, gossh.KeyAlgoSKECDSA256,
	gossh.KeyAlgoRSASHA256, gossh.KeyAlgoRSASHA512,
}

// identify finds the registered user of the key the session logged in with and records it
// in the connection's context (userFrom). For an unregistered key it tells the client how to
// get it registered, exits 1 and returns false.
func (s *Server) identify(sess ssh.Session) bool {
	ctx := sess.Context()
	key := sess.PublicKey()
	if key == nil { // cannot happen: public keys are the only way in
		s.refuse(sess, "log in with an SSH key")
		return false
	}
	u, err := s.access.UserByKey(key)
	switch {
	case errors.Is(err, access.ErrUnknownKey):
		h := s.hint(sess.LocalAddr())
		s.refuse(sess, fmt.Sprintf("key %s is not registered; ask an admin to run: %s\n(for a new user, first: %s)",
			gossh.FingerprintSHA256(key), h.Command("keys:add NAME --user USER < key.pub"), h.Command("users:add USER")))
		return false
	case err != nil:
		s.log.Error("looking up the user of a key", "remote_addr", sess.RemoteAddr().String(),
			"fingerprint", gossh.FingerprintSHA256(key), "err", err)
		fmt.Fprintln(sess.Stderr(), "internal server error: could not look up your key; the server log has details")
		sess.Exit(1)
		return false
	}
	ctx.SetValue(ctxKeyUser{}, u.Name)
	return true
}

// authorize checks that the session's user holds need on app. When not, it tells the client
// why (denial), exits 1 and returns false. Without Access every authenticated user holds every
// role.
func (s *Server) authorize(sess ssh.Session, app string, need access.Role) bool {
	err := s.denial(sess, app, need)
	if err == nil {
		return true
	}
	var denied *access.DeniedError
	var noApp *access.NoAppError
	if errors.As(err, &noApp) || errors.As(err, &denied) || errors.Is(err, access.ErrUnknownUser) {
		s.refuse(sess, err.Error())
		return false
	}
	s.log.Error("authorizing", "remote_addr", sess.RemoteAddr().String(), "user", userFrom(sess.Context()), "app", app, "err", err)
	fmt.Fprintln(sess.Stderr(), "internal server error: could not check your access; the server log has details")
	sess.Exit(1)
	return false
}

// denial is nil when the session's user holds need on app. A user with no role on app at all
// gets an *access.NoAppError, the same whether app exists or not; one with a lesser role the
// *access.DeniedError naming the role they lack (they may read the app, so they know it
// exists).
func (s *Server) denial(sess ssh.Session, app string, need access.Role) error {
	if s.access == nil {
		return nil
	}
	user := userFrom(sess.Context())
	err := s.access.Authorize(user, app, need)
	var denied *access.DeniedError
	if !errors.As(err, &denied) || s.access.Authorize(user, app, access.RoleRead) == nil {
		return err
	}
	return &access.NoAppError{User: user, App: app, Need: need, SSH: s.hint(sess.LocalAddr()).Command()}
}
