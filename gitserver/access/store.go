package access

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gofrs/flock"
	gossh "golang.org/x/crypto/ssh"

	"kpush.dev/kpush/internal/atomicfile"
	"kpush.dev/kpush/internal/names"
)

// StateFile is where Open keeps the store, relative to the data dir.
const StateFile = "state/access.json"

// stateVersion is the "version" field of the state file this code writes and reads.
const stateVersion = 1

var (
	// ErrUnknownKey is returned (wrapped, with the key's fingerprint) by UserByKey for a key no
	// user has registered.
	ErrUnknownKey = errors.New("key is not registered")
	// ErrUnknownUser is returned (wrapped, with the name) for a user that does not exist.
	ErrUnknownUser = errors.New("unknown user")
)

// Store holds users, their SSH keys and their per-app grants, persisted as JSON in
// <data>/state/access.json (mode 0600, replaced whole by internal/atomicfile). Several kpush
// processes may share a data dir, each with its Store: every change is a read-modify-write of
// the file under an exclusive flock of <data>/state/access.json.lock, so no process loses
// another's, and every read sees the file's current content (it is read again whenever its
// inode, size or mtime changed). Within a process a Store is safe for concurrent use.
// Every method that changes something has written the file when it returns nil; when writing
// fails nothing changed.
type Store struct {
	path string
	log  *slog.Logger
	now  func() time.Time

	mu    sync.Mutex
	st    *state // never modified in place: view and update swap in another
	stamp stamp  // of the file st was read from
}

// stamp tells one content of the state file from another without reading it: every change
// renames a new file over it.
type stamp struct {
	ino         uint64
	size, mtime int64 // mtime in nanoseconds
}

func stampOf(fi os.FileInfo) stamp {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return stamp{}
	}
	return stamp{ino: uint64(st.Ino), size: fi.Size(), mtime: fi.ModTime().UnixNano()}
}

// Option configures a Store in Open.
type Option func(*Store)

// WithLogger sets where the store logs bootstrap decisions (default: nowhere).
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.log = l } }

// WithClock sets the clock that stamps User.Created and Key.Added (default time.Now).
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// state is the store's content; the file holds it with users, keys and grants as sorted lists.
type state struct {
	users  map[string]User            // by name
	keys   map[string]Key             // by fingerprint
	grants map[string]map[string]Role // app → user → role
}

func emptyState() *state {
	return &state{users: map[string]User{}, keys: map[string]Key{}, grants: map[string]map[string]Role{}}
}

type stateFile struct {
	Version int     `json:"version"`
	Users   []User  `json:"users"`
	Keys    []Key   `json:"keys"`
	Grants  []Grant `json:"grants"`
}

func (st *state) clone() *state {
	c := &state{users: maps.Clone(st.users), keys: maps.Clone(st.keys), grants: map[string]map[string]Role{}}
	for app, g := range st.grants {
		c.grants[app] = maps.Clone(g)
	}
	return c
}

// Open reads the store of the data dir dataDir, or starts an empty one when the file does not
// exist yet (it is written at the first change). A file it cannot read or parse is an error
// naming the file.
func Open(dataDir string, opts ...Option) (*Store, error) {
	s := &Store{
		path: filepath.Join(dataDir, filepath.FromSlash(StateFile)),
		log:  slog.New(slog.DiscardHandler),
		now:  time.Now,
	}
	for _, o := range opts {
		o(s)
	}
	st, stamp, err := s.read()
	if err != nil {
		return nil, err
	}
	s.st, s.stamp = st, stamp
	return s, nil
}

// read reads the state file as it is now (an empty state when there is none yet) and the
// stamp of what it read.
func (s *Store) read() (*state, stamp, error) {
	st := emptyState()
	f, err := os.Open(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return st, stamp{}, nil
	}
	if err != nil {
		return nil, stamp{}, fmt.Errorf("reading users and keys: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat() // of the file read, even if another process renames a new one over it meanwhile
	if err != nil {
		return nil, stamp{}, fmt.Errorf("reading users and keys: %w", err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, stamp{}, fmt.Errorf("reading users and keys: %w", err)
	}
	var sf stateFile
	if err := json.Unmarshal(data, &sf); err != nil {
		return nil, stamp{}, fmt.Errorf("reading users and keys from %s: %w (restore it from a backup or remove it; the authorized keys files register the admins again at the next start)", s.path, err)
	}
	if sf.Version != stateVersion {
		return nil, stamp{}, fmt.Errorf("reading users and keys from %s: version %d, this kpush reads version %d", s.path, sf.Version, stateVersion)
	}
	for _, u := range sf.Users {
		st.users[u.Name] = u
	}
	for _, k := range sf.Keys {
		st.keys[k.Fingerprint] = k
	}
	for _, g := range sf.Grants {
		if st.grants[g.App] == nil {
			st.grants[g.App] = map[string]Role{}
		}
		st.grants[g.App][g.User] = g.Role
	}
	return st, stampOf(fi), nil
}

// update runs f on a copy of the file's current state and, when f succeeds, writes the copy
// and makes it the state, all under the exclusive flock of the state file (other processes
// sharing the data dir take turns).
func (s *Store) update(f func(st *state) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
		return fmt.Errorf("saving users and keys: %w", err)
	}
	lock := flock.New(s.path + ".lock")
	if err := lock.Lock(); err != nil {
		return fmt.Errorf("locking users and keys: %w", err)
	}
	defer lock.Unlock() //nolint:errcheck // closing drops it anyway
	cur, _, err := s.read()
	if err != nil {
		return err
	}
	next := cur.clone()
	if err := f(next); err != nil {
		return err
	}
	if err := s.save(next); err != nil {
		return err
	}
	fi, err := os.Stat(s.path) // still ours: nobody writes without the lock
	if err != nil {
		return fmt.Errorf("saving users and keys: %w", err)
	}
	s.st, s.stamp = next, stampOf(fi)
	return nil
}

// view returns the file's current state, read again when another process (or Store) changed
// it. A file that became unreadable keeps the last state read, with a warning in the log.
func (s *Store) view() *state {
	s.mu.Lock()
	defer s.mu.Unlock()
	fi, err := os.Stat(s.path)
	if errors.Is(err, os.ErrNotExist) && s.stamp == (stamp{}) {
		return s.st // still no file
	}
	if err == nil && s.stamp != (stamp{}) && stampOf(fi) == s.stamp {
		return s.st // unchanged
	}
	st, stamp, err := s.read()
	if err != nil {
		s.log.Warn("users and keys: keeping the last state read", "err", err)
		return s.st
	}
	s.st, s.stamp = st, stamp
	return s.st
}

func (s *Store) save(st *state) error {
	f := stateFile{Version: stateVersion, Users: []User{}, Keys: []Key{}, Grants: []Grant{}}
	for _, name := range slices.Sorted(maps.Keys(st.users)) {
		f.Users = append(f.Users, st.users[name])
	}
	f.Keys = sortedKeys(maps.Values(st.keys))
	for _, app := range slices.Sorted(maps.Keys(st.grants)) {
		f.Grants = append(f.Grants, grantsOf(st, app)...)
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("saving users and keys: %w", err)
	}
	if err := atomicfile.WriteFile(s.path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("saving users and keys: %w", err)
	}
	return nil
}

func sortedKeys(seq func(func(Key) bool)) []Key {
	keys := slices.Collect(seq)
	slices.SortFunc(keys, func(a, b Key) int {
		return strings.Compare(a.User+"\x00"+a.Name, b.User+"\x00"+b.Name)
	})
	if keys == nil {
		keys = []Key{}
	}
	return keys
}

func grantsOf(st *state, app string) []Grant {
	g := []Grant{}
	for _, user := range slices.Sorted(maps.Keys(st.grants[app])) {
		g = append(g, Grant{App: app, User: user, Role: st.grants[app][user]})
	}
	return g
}

// Names of users and apps are DNS-1035 labels, like app names in gitserver: lowercase letters,
// digits and '-', starting with a letter, ending with a letter or digit, at most 63 characters.

// ValidUserName returns nil when name can be a user name (a DNS-1035 label, as app names),
// else an error for people that states the rule.
func ValidUserName(name string) error {
	if !names.IsApp(name) {
		return fmt.Errorf("invalid user name %q: user names are lowercase letters, digits and '-', starting with a letter, at most 63 characters (e.g. alice)", name)
	}
	return nil
}

func validApp(app string) error {
	if !names.IsApp(app) {
		return fmt.Errorf("invalid app name %q: app names are lowercase letters, digits and '-', starting with a letter, at most 63 characters (e.g. my-app)", app)
	}
	return nil
}

func unknownUser(name string) error {
	return fmt.Errorf("%w %q (the users command lists them)", ErrUnknownUser, name)
}

// UserByKey returns the user key is registered to, or an error wrapping ErrUnknownKey.
func (s *Store) UserByKey(key gossh.PublicKey) (User, error) {
	st := s.view()
	fp := gossh.FingerprintSHA256(key)
	k, ok := st.keys[fp]
	if !ok {
		return User{}, fmt.Errorf("%w: %s", ErrUnknownKey, fp)
	}
	u, ok := st.users[k.User]
	if !ok { // cannot happen: RemoveUser removes the keys too
		return User{}, fmt.Errorf("%w: %s", ErrUnknownKey, fp)
	}
	return u, nil
}

// User returns the user named name, or an error wrapping ErrUnknownUser.
func (s *Store) User(name string) (User, error) {
	u, ok := s.view().users[name]
	if !ok {
		return User{}, unknownUser(name)
	}
	return u, nil
}

// Authorize returns nil when user holds need (or a role including it) on app, or is a server
// admin; a *DeniedError when the user exists but lacks the role; an error wrapping
// ErrUnknownUser when there is no such user.
func (s *Store) Authorize(user, app string, need Role) error {
	if rank(need) == 0 {
		return fmt.Errorf("authorizing %s on %s: unknown role %q", user, app, need)
	}
	st := s.view()
	u, ok := st.users[user]
	if !ok {
		return unknownUser(user)
	}
	if u.Admin || st.grants[app][user].Includes(need) {
		return nil
	}
	return &DeniedError{User: user, App: app, Need: need}
}

// RoleOf returns the role user holds on app through a grant ("" for none; server admins hold
// every role without one).
func (s *Store) RoleOf(user, app string) Role { return s.view().grants[app][user] }

// SetGrant gives user role on app, replacing any role they had on it. The user must exist.
func (s *Store) SetGrant(app, user string, role Role) error {
	if rank(role) == 0 {
		_, err := ParseRole(string(role))
		return err
	}
	if err := validApp(app); err != nil {
		return err
	}
	return s.update(func(st *state) error {
		if _, ok := st.users[user]; !ok {
			return unknownUser(user)
		}
		if st.grants[app] == nil {
			st.grants[app] = map[string]Role{}
		}
		st.grants[app][user] = role
		return nil
	})
}

// Revoke removes user's grant on app; it is an error when there is none.
func (s *Store) Revoke(app, user string) error {
	return s.update(func(st *state) error {
		if _, ok := st.grants[app][user]; !ok {
			return fmt.Errorf("user %s has no role on app %s (apps:access %s lists who has)", user, app, app)
		}
		delete(st.grants[app], user)
		if len(st.grants[app]) == 0 {
			delete(st.grants, app)
		}
		return nil
	})
}

// Grants returns app's grants sorted by user (empty, not nil, when there are none).
func (s *Store) Grants(app string) []Grant { return grantsOf(s.view(), app) }

// AppsOf returns user's grants sorted by app (empty when none; server admins' implicit roles
// are not listed).
func (s *Store) AppsOf(user string) []Grant {
	st := s.view()
	g := []Grant{}
	for _, app := range slices.Sorted(maps.Keys(st.grants)) {
		if r, ok := st.grants[app][user]; ok {
			g = append(g, Grant{App: app, User: user, Role: r})
		}
	}
	return g
}

// RemoveApp drops every grant on app (for apps:destroy). No grants is not an error.
func (s *Store) RemoveApp(app string) error {
	if len(s.view().grants[app]) == 0 {
		return nil
	}
	return s.update(func(st *state) error {
		delete(st.grants, app)
		return nil
	})
}

// AddUser creates a user; admin makes them a server admin. The name must pass ValidUserName
// and be free.
func (s *Store) AddUser(name string, admin bool) (User, error) {
	if err := ValidUserName(name); err != nil {
		return User{}, err
	}
	u := User{Name: name, Admin: admin, Created: s.now().UTC()}
	err := s.update(func(st *state) error {
		if _, ok := st.users[name]; ok {
			return fmt.Errorf("user %s already exists", name)
		}
		st.users[name] = u
		return nil
	})
	return u, err
}

// adminCanLogIn reports whether some server admin still has a key: without one, nobody could
// manage users and keys any more (short of restarting with new bootstrap keys).
func adminCanLogIn(st *state) bool {
	for _, k := range st.keys {
		if u, ok := st.users[k.User]; ok && u.Admin {
			return true
		}
	}
	return false
}

// RemoveUser deletes a user with their keys and grants. The last server admin cannot be
// removed.
func (s *Store) RemoveUser(name string) error {
	return s.update(func(st *state) error {
		u, ok := st.users[name]
		if !ok {
			return unknownUser(name)
		}
		if u.Admin {
			admins := 0
			for _, o := range st.users {
				if o.Admin {
					admins++
				}
			}
			if admins == 1 {
				return fmt.Errorf("%s is the last server admin; add another first: users:add NAME --admin", name)
			}
		}
		delete(st.users, name)
		for fp, k := range st.keys {
			if k.User == name {
				delete(st.keys, fp)
			}
		}
		for app, g := range st.grants {
			delete(g, name)
			if len(g) == 0 {
				delete(st.grants, app)
			}
		}
		return nil
	})
}

// Users returns every user sorted by name.
func (s *Store) Users() []User {
	st := s.view()
	users := []User{}
	for _, name := range slices.Sorted(maps.Keys(st.users)) {
		users = append(users, st.users[name])
	}
	return users
}

// Key names: what people call their keys ("laptop", "ci", "alice@work").
var keyNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$`)

func validKeyName(name string) error {
	if !keyNameRE.MatchString(name) {
		return fmt.Errorf("invalid key name %q: use letters, digits and . _ @ + - (at most 64, e.g. laptop)", name)
	}
	return nil
}

// AddKey registers the public key in authorizedLine (one line of OpenSSH authorized_keys
// format, e.g. the content of ~/.ssh/id_ed25519.pub; options and comment are ignored) to user
// under name (unique per user). The key must pass CheckKey and not be registered to anyone.
func (s *Store) AddKey(user, name string, authorizedLine []byte) (Key, error) {
	if err := validKeyName(name); err != nil {
		return Key{}, err
	}
	pub, _, err := ParseKey(authorizedLine)
	if err != nil {
		return Key{}, err
	}
	var k Key
	err = s.update(func(st *state) error {
		k, err = addKey(st, user, name, pub, s.now())
		return err
	})
	return k, err
}

func addKey(st *state, user, name string, pub gossh.PublicKey, now time.Time) (Key, error) {
	if _, ok := st.users[user]; !ok {
		return Key{}, unknownUser(user)
	}
	fp := gossh.FingerprintSHA256(pub)
	if old, ok := st.keys[fp]; ok {
		if old.User == user {
			return Key{}, fmt.Errorf("key %s is already registered to you as %q", fp, old.Name)
		}
		return Key{}, fmt.Errorf("key %s is already registered to user %s (as %q); a key belongs to one user", fp, old.User, old.Name)
	}
	for _, o := range st.keys {
		if o.User == user && o.Name == name {
			return Key{}, fmt.Errorf("user %s already has a key named %q (%s); pick another name or keys:remove it first", user, name, o.Fingerprint)
		}
	}
	k := Key{
		User:        user,
		Name:        name,
		Type:        pub.Type(),
		Fingerprint: fp,
		PublicKey:   strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pub))),
		Added:       now.UTC(),
	}
	st.keys[fp] = k
	return k, nil
}

// RemoveKey deletes the key of user named nameOrFingerprint (its name, or "SHA256:…" as
// ssh-keygen -lf prints it). It refuses to remove the last key through which a server admin
// can log in.
func (s *Store) RemoveKey(user, nameOrFingerprint string) error {
	return s.update(func(st *state) error {
		if _, ok := st.users[user]; !ok {
			return unknownUser(user)
		}
		could := adminCanLogIn(st)
		for fp, k := range st.keys {
			if k.User == user && (k.Name == nameOrFingerprint || k.Fingerprint == nameOrFingerprint) {
				delete(st.keys, fp)
				if could && !adminCanLogIn(st) {
					return fmt.Errorf("%s is the last key of the last server admin who can log in; add another key first: keys:add NAME < key.pub", k.Name)
				}
				return nil
			}
		}
		return fmt.Errorf("user %s has no key %q (the keys command lists them)", user, nameOrFingerprint)
	})
}

// Keys returns user's keys sorted by name, or an error wrapping ErrUnknownUser.
func (s *Store) Keys(user string) ([]Key, error) {
	st := s.view()
	if _, ok := st.users[user]; !ok {
		return nil, unknownUser(user)
	}
	return sortedKeys(func(yield func(Key) bool) {
		for _, k := range st.keys {
			if k.User == user && !yield(k) {
				return
			}
		}
	}), nil
}
