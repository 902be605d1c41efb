// Package access keeps kpush's users, their SSH keys and their per-app roles, durably in the
// data dir, and answers who a key belongs to and what its user may do.
package access

import (
	"fmt"
	"time"
)

// Role is a user's standing on one app. Roles are ordered: admin includes deploy, deploy
// includes read.
type Role string

const (
	RoleRead   Role = "read"   // clone and fetch; read releases, builds and app info
	RoleDeploy Role = "deploy" // push, rollback, rebuild
	RoleAdmin  Role = "admin"  // config, build-env, grants, destroy
)

// Includes reports whether r grants everything need grants.
func (r Role) Includes(need Role) bool { return rank(r) >= rank(need) && rank(need) > 0 }

func rank(r Role) int {
	switch r {
	case RoleRead:
		return 1
	case RoleDeploy:
		return 2
	case RoleAdmin:
		return 3
	}
	return 0
}

// ParseRole returns the Role named s, or an error listing the roles.
func ParseRole(s string) (Role, error) {
	if r := Role(s); rank(r) > 0 {
		return r, nil
	}
	return "", fmt.Errorf("unknown role %q: want read, deploy or admin", s)
}

// User is a person or robot that pushes. Admin users are server admins: they manage users
// and keys and hold every role on every app.
type User struct {
	Name    string    `json:"name"`
	Admin   bool      `json:"admin"`
	Created time.Time `json:"created"`
}

// Key is an SSH public key registered to a user.
type Key struct {
	User        string    `json:"user"`
	Name        string    `json:"name"`        // the user's label for it, unique per user
	Type        string    `json:"type"`        // SSH key type, e.g. "ssh-ed25519"
	Fingerprint string    `json:"fingerprint"` // "SHA256:<base64>" (ssh-keygen -lf)
	PublicKey   string    `json:"public_key"`  // authorized_keys form, without options or comment
	Added       time.Time `json:"added"`
}

// Grant gives User a Role on App.
type Grant struct {
	App  string `json:"app"`
	User string `json:"user"`
	Role Role   `json:"role"`
}

// DeniedError says that a known user lacks the role an operation needs on an app.
type DeniedError struct {
	User, App string
	Need      Role
}

func (e *DeniedError) Error() string {
	return fmt.Sprintf("user %s does not have the %s role on app %s; ask an admin of %s to run: apps:grant %s %s %s",
		e.User, e.Need, e.App, e.App, e.App, e.User, e.Need)
}

// NoAppError is what a user with no role on an app is told, whether the app exists or not:
// that there is no app of that name or they have no role on it. Whether an app exists, and so
// who administers it, is not revealed to people who may not read it; git, the SSH commands and
// their errors all say this, in the same words. SSH is how people reach the server ("ssh -p
// 2222 git@127.0.0.1"), for the hint.
type NoAppError struct {
	User, App string
	Need      Role // the role the refused operation needs, for the grant an admin would run
	SSH       string
}

func (e *NoAppError) Error() string {
	return fmt.Sprintf("no app named %s, or you (%s) have no role on it; `%s apps` lists yours. If it exists, an admin of it can run: apps:grant %s %s %s",
		e.App, e.User, e.SSH, e.App, e.User, e.Need)
}
