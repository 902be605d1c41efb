package gitserver

import (
	"bufio"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/gofrs/flock"

	"kpush.dev/kpush/internal/atomicfile"
)

// How the pre-receive hook finds its way back to the server: git receive-pack runs with these
// in its environment, and its hook inherits them.
const (
	envHookURL   = "KPUSH_HOOK_URL"   // http://127.0.0.1:<port> of the server's hook endpoint
	envPushID    = "KPUSH_PUSH_ID"    // Push.ID
	envHookToken = "KPUSH_HOOK_TOKEN" // per-push secret the endpoint checks
)

const (
	hookPath          = "/pre-receive"
	headerPushID      = "Kpush-Push-Id"
	trailerExitStatus = "Kpush-Exit-Status"
	maxHookRequest    = 64 << 20 // bytes; ~600k ref updates
)

// hookRequest is what the hook POSTs to the server.
type hookRequest struct {
	Updates []RefUpdate `json:"updates"`
	Options []string    `json:"options"`
	GitEnv  []string    `json:"git_env"`
}

// hookScript is the pre-receive hook: a shell script that execs argv.
func hookScript(argv []string) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Written by kpush's git server on every start: hands the push to the server.\nexec")
	for _, a := range argv {
		b.WriteString(" '" + strings.ReplaceAll(a, "'", `'\''`) + "'")
	}
	b.WriteString(" \"$@\"\n")
	return b.String()
}

// installHook makes <hooksDir>/pre-receive, the hook every repository runs (core.hooksPath),
// the script that execs argv, and makes it a file no push, build or app can change:
//
//   - hooksDir (<data>/hooks) is no directory any extraction writes into (those are under
//     <data>/tmp, <data>/builds and <data>/apps) and no repository's;
//   - it must be a real directory owned by the server's uid: a symbolic link, anything else or
//     another owner is refused with an error saying how to fix it (kpush does not start);
//   - under an flock of the directory (kpush processes sharing a data dir take turns), the
//     script is written to a temporary file and renamed over pre-receive (so git never runs
//     half a script), mode 0555; every other entry is removed, since git would run any hook it
//     finds there (post-receive, update, ...);
//   - the directory is left mode 0555: only the owner (or root) can make it writable again;
//   - finally both are checked (type, owner, exact mode, the script's content and one link),
//     and any difference is an error.
//
// It runs on every start, so a changed hook is put back by a restart.
func installHook(hooksDir string, argv []string, log *slog.Logger) error {
	uid := os.Geteuid()
	if err := os.Mkdir(hooksDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("creating the hooks directory: %w", err)
	}
	if err := checkHooksDir(hooksDir, uid, 0); err != nil {
		return err
	}
	root, err := os.OpenRoot(hooksDir)
	if err != nil {
		return fmt.Errorf("opening the hooks directory: %w", err)
	}
	defer root.Close()
	d, err := root.Open(".")
	if err != nil {
		return fmt.Errorf("opening the hooks directory: %w", err)
	}
	defer d.Close()
	// Several kpush processes may share the data dir and start together: one at a time here.
	lock := flock.New(hooksDir, flock.SetFlag(os.O_RDONLY))
	if err := lock.Lock(); err != nil {
		return fmt.Errorf("locking the hooks directory: %w", err)
	}
	defer lock.Unlock() //nolint:errcheck // closing drops it anyway

	if err := d.Chmod(0o700); err != nil { // writable while the hook is written, for a non-root server
		return fmt.Errorf("installing the pre-receive hook: %w", err)
	}
	entries, err := d.ReadDir(-1)
	if err != nil {
		return fmt.Errorf("installing the pre-receive hook: %w", err)
	}
	for _, e := range entries {
		if n := e.Name(); n != "pre-receive" || !e.Type().IsRegular() {
			if err := root.RemoveAll(n); err != nil {
				return fmt.Errorf("removing %s from the hooks directory: %w", n, err)
			}
			if !strings.HasPrefix(n, hookTmpPrefix) { // a crashed start's is no news
				log.Warn("removed an unexpected file from the hooks directory: git would have run it as a hook", "file", filepath.Join(hooksDir, n))
			}
		}
	}
	script := hookScript(argv)
	if err := atomicfile.WriteFileIn(root, "pre-receive", []byte(script), 0o555); err != nil {
		return fmt.Errorf("writing pre-receive hook: %w", err)
	}
	if err := d.Chmod(0o555); err != nil {
		return fmt.Errorf("making the hooks directory read-only: %w", err)
	}
	// Verify what git will run.
	if err := checkHooksDir(hooksDir, uid, 0o555); err != nil {
		return err
	}
	fi, err := root.Lstat("pre-receive")
	if err != nil {
		return fmt.Errorf("checking the pre-receive hook: %w", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	got, rerr := root.ReadFile("pre-receive")
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o555 || fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 ||
		st == nil || int(st.Uid) != uid || st.Nlink != 1 || rerr != nil || string(got) != script {
		return fmt.Errorf("checking the pre-receive hook: %s is not the read-only script kpush just wrote (mode %v, %d links); is another process changing it?",
			filepath.Join(hooksDir, "pre-receive"), fi.Mode(), nlink(st))
	}
	return nil
}

// hookTmpPrefix starts the names of installHook's temporary files.
var hookTmpPrefix = atomicfile.TempPrefix("pre-receive")

// checkHooksDir fails unless dir is a real directory (not a symbolic link) owned by uid and
// writable by nobody else; perm, when not 0, is the exact permission bits it must have.
func checkHooksDir(dir string, uid int, perm fs.FileMode) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("checking the hooks directory: %w", err)
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, _ := os.Readlink(dir)
		return fmt.Errorf("the hooks directory %s is a symbolic link (to %s): every repository runs the hook in it, so it must be a real directory owned by kpush (uid %d); remove the link and start kpush again",
			dir, target, uid)
	case !fi.IsDir():
		return fmt.Errorf("the hooks directory %s is not a directory (mode %v); remove it and start kpush again", dir, fi.Mode())
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != uid {
		owner := -1
		if ok {
			owner = int(st.Uid)
		}
		return fmt.Errorf("the hooks directory %s is owned by uid %d, not by kpush's uid %d: every repository runs the hook in it, so only kpush may own it; remove it (or chown it to uid %d) and start kpush again",
			dir, owner, uid, uid)
	}
	if perm != 0 && (fi.Mode().Perm() != perm || fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0) {
		return fmt.Errorf("the hooks directory %s has mode %v, want %v", dir, fi.Mode(), fs.ModeDir|perm)
	}
	return nil
}

func nlink(st *syscall.Stat_t) uint64 {
	if st == nil {
		return 0
	}
	return uint64(st.Nlink)
}

// RunHook runs the git hook called name ("pre-receive" is the only one) and returns its exit
// status: 0 lets git update the refs, anything else rejects the whole push. It is the body of
// `kpush hook pre-receive`, which the repositories' hook script execs; git gives it the ref
// updates on stdin ("<old> <new> <ref>" lines), push options in GIT_PUSH_OPTION_COUNT and
// GIT_PUSH_OPTION_<n>, and the quarantine in GIT_OBJECT_DIRECTORY,
// GIT_ALTERNATE_OBJECT_DIRECTORIES and GIT_QUARANTINE_PATH (githooks(5), git-receive-pack(1)).
// RunHook sends them to the server that started git (found through environ's KPUSH_HOOK_URL,
// KPUSH_PUSH_ID, KPUSH_HOOK_TOKEN), which calls Handler.PreReceive; what the handler writes
// is copied to stdout as it arrives, and git relays it to the pusher as "remote: " lines.
// Problems of the hook itself are written to stderr.
func RunHook(ctx context.Context, name string, stdin io.Reader, stdout, stderr io.Writer, environ []string) int {
	if name != "pre-receive" {
		fmt.Fprintf(stderr, "kpush hook: unknown hook %q: only pre-receive is handled\n", name)
		return 1
	}
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	base, id, token := env[envHookURL], env[envPushID], env[envHookToken]
	if base == "" || id == "" || token == "" {
		fmt.Fprintf(stderr, "kpush hook: %s, %s or %s is not set: git runs this hook inside kpush's git server; it is not a command for people\n",
			envHookURL, envPushID, envHookToken)
		return 1
	}
	if u, err := url.Parse(base); err != nil || u.Scheme != "http" || !isLoopback(u.Hostname()) {
		fmt.Fprintf(stderr, "kpush hook: %s=%q is not an http:// loopback address\n", envHookURL, base)
		return 1
	}
	updates, err := parseRefUpdates(stdin)
	if err != nil {
		fmt.Fprintf(stderr, "kpush hook: reading ref updates from git: %v\n", err)
		return 1
	}
	req := hookRequest{Updates: updates, Options: pushOptions(env), GitEnv: quarantineEnv(env)}
	body, err := json.Marshal(req)
	if err != nil {
		fmt.Fprintf(stderr, "kpush hook: %v\n", err)
		return 1
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, base+hookPath, strings.NewReader(string(body)))
	if err != nil {
		fmt.Fprintf(stderr, "kpush hook: %v\n", err)
		return 1
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Authorization", "Bearer "+token)
	hreq.Header.Set(headerPushID, id)
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := client.Do(hreq)
	if err != nil {
		fmt.Fprintf(stderr, "kpush hook: reaching the git server (push ID %s): %v\n", id, err)
		return 1
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		fmt.Fprintf(stderr, "kpush hook: the git server refused the hook (push ID %s): %s: %s\n",
			id, resp.Status, strings.TrimSpace(string(msg)))
		return 1
	}
	if err := copyFlushing(stdout, resp.Body); err != nil {
		fmt.Fprintf(stderr, "kpush hook: connection to the git server lost (push ID %s): %v\n", id, err)
		return 1
	}
	code, err := strconv.Atoi(resp.Trailer.Get(trailerExitStatus))
	if err != nil {
		fmt.Fprintf(stderr, "kpush hook: the git server ended without deciding the push (push ID %s)\n", id)
		return 1
	}
	return code
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// copyFlushing copies src to dst, passing on every read as soon as it arrives.
func copyFlushing(dst io.Writer, src io.Reader) error {
	f, _ := dst.(interface{ Flush() error })
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
			if f != nil {
				if ferr := f.Flush(); ferr != nil {
					return ferr
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// parseRefUpdates reads pre-receive's stdin: "<old-oid> SP <new-oid> SP <ref-name> LF" lines.
func parseRefUpdates(r io.Reader) ([]RefUpdate, error) {
	var updates []RefUpdate
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Split(sc.Text(), " ")
		if len(f) != 3 || !isOID(f[0]) || !isOID(f[1]) || !strings.HasPrefix(f[2], "refs/") {
			return nil, fmt.Errorf("malformed line %q: want \"<old-oid> <new-oid> <ref>\"", sc.Text())
		}
		updates = append(updates, RefUpdate{Old: f[0], New: f[1], Name: f[2]})
	}
	return updates, sc.Err()
}

// isOID accepts SHA-1 (40) and SHA-256 (64) object names in lowercase hex.
func isOID(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// pushOptions collects GIT_PUSH_OPTION_0 .. GIT_PUSH_OPTION_<count-1>.
func pushOptions(env map[string]string) []string {
	n, err := strconv.Atoi(env["GIT_PUSH_OPTION_COUNT"])
	if err != nil || n <= 0 {
		return nil
	}
	if n > 1<<20 { // one variable per option: a count this large is a corrupt environment
		return nil
	}

	opts := make([]string, 0, n)
	for i := range n {
		opts = append(opts, env["GIT_PUSH_OPTION_"+strconv.Itoa(i)])
	}
	return opts
}

// quarantineEnv returns the variables under which git sees the push's quarantined objects,
// with relative directories made absolute (git passes absolute ones).
func quarantineEnv(env map[string]string) []string {
	var out []string
	for _, k := range []string{"GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_QUARANTINE_PATH"} {
		v, ok := env[k]
		if !ok {
			continue
		}
		if k != "GIT_ALTERNATE_OBJECT_DIRECTORIES" && v != "" && !filepath.IsAbs(v) {
			if abs, err := filepath.Abs(v); err == nil {
				v = abs
			}
		}
		out = append(out, k+"="+v)
	}
	return out
}

// serveHook answers a pre-receive hook: it finds the push by ID and token, points HEAD of an
// empty repository at the pushed branch, calls the Handler with a writer that streams to the
// hook, and ends the response with the hook's exit status in a trailer.
func (s *Server) serveHook(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(headerPushID)
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	s.mu.Lock()
	ps := s.pushes[id]
	s.mu.Unlock()
	if ps == nil || subtle.ConstantTimeCompare([]byte(token), []byte(ps.token)) != 1 {
		s.log.Warn("hook call for unknown push", "push_id", id, "remote_addr", r.RemoteAddr)
		http.Error(w, "unknown push", http.StatusForbidden)
		return
	}
	if !ps.claim() {
		ps.log.Warn("second pre-receive call for one push")
		http.Error(w, "pre-receive already ran for this push", http.StatusConflict)
		return
	}
	var req hookRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxHookRequest)).Decode(&req); err != nil {
		ps.log.Error("decoding hook request", "err", err)
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	for _, u := range req.Updates {
		if !isOID(u.Old) || !isOID(u.New) || !strings.HasPrefix(u.Name, "refs/") {
			http.Error(w, fmt.Sprintf("bad ref update %+v", u), http.StatusBadRequest)
			return
		}
	}
	ctx := ps.ctx
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Trailer", trailerExitStatus)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	out := &streamWriter{w: w, rc: rc}

	code := 1
	defer func() { w.Header().Set(trailerExitStatus, strconv.Itoa(code)) }()
	if head, err := s.setHeadIfEmpty(ctx, ps.dir, req.Updates); err != nil {
		ps.log.Error("setting HEAD of empty repository", "err", err)
		fmt.Fprintf(w, "push rejected: internal server error (push ID %s)\n", ps.id)
		return
	} else if head != "" {
		ps.log.Info("pointed HEAD at first pushed branch", "ref", head)
	}
	push := &Push{
		ID: ps.id, App: ps.app, Dir: ps.dir, User: ps.user,
		Updates: req.Updates, Options: req.Options, GitEnv: req.GitEnv, Done: ps.done,
	}
	ps.log.Info("deciding push", "updates", len(push.Updates), "options", len(push.Options))
	err := s.callHandler(ctx, push, out)
	written := out.close()
	if err != nil {
		ps.log.Info("push rejected", "err", err)
		if written == 0 {
			fmt.Fprintf(w, "push rejected (push ID %s)\n", ps.id)
		}
		return
	}
	ps.log.Info("push accepted")
	code = 0
}

// callHandler calls the Handler, turning a panic into an error so one bad push cannot take
// the server down.
func (s *Server) callHandler(ctx context.Context, p *Push, out io.Writer) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("panic in push handler", "push_id", p.ID, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("push handler panicked: %v", r)
		}
	}()
	return s.handler.PreReceive(ctx, p, out)
}

// streamWriter is the out of Handler.PreReceive: every Write is flushed to the hook at once.
// It is safe for concurrent use and refuses writes after the handler returned.
type streamWriter struct {
	mu     sync.Mutex
	w      io.Writer
	rc     *http.ResponseController
	n      int64
	closed bool
}

var errHandlerReturned = errors.New("gitserver: write to push output after PreReceive returned")

func (sw *streamWriter) Write(p []byte) (int, error) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if sw.closed {
		return 0, errHandlerReturned
	}
	n, err := sw.w.Write(p)
	sw.n += int64(n)
	if err == nil {
		err = sw.rc.Flush()
	}
	return n, err
}

// close stops further writes and returns how many bytes were written.
func (sw *streamWriter) close() int64 {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	sw.closed = true
	return sw.n
}
