package gitserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"kpush.dev/kpush/gitserver/access"
	"kpush.dev/kpush/internal/term"
)

// Session requests refused on a session channel before gliderlabs sees them: gliderlabs
// accepts agent forwarding unconditionally.
// maxEnvRequests and maxEnvRequest bound the environment a session may send (ssh SendEnv):
// more, or larger, requests are refused. kpush reads only GIT_PROTOCOL.
const (
	maxEnvRequests = 16
	maxEnvRequest  = 1 << 10
)

var refusedSessionRequests = map[string]string{
	"auth-agent-req@openssh.com": "agent forwarding",
	"x11-req":                    "X11 forwarding",
}

// sessionChannel runs gliderlabs' session handler on a channel whose agent and X11 forwarding
// requests are refused first.
func (s *Server) sessionChannel(srv *ssh.Server, conn *gossh.ServerConn, ch gossh.NewChannel, ctx ssh.Context) {
	ssh.DefaultSessionHandler(srv, conn, filteredChannel{ch, s.log, ctx}, ctx)
}

type filteredChannel struct {
	gossh.NewChannel
	log *slog.Logger
	ctx ssh.Context
}

func (c filteredChannel) Accept() (gossh.Channel, <-chan *gossh.Request, error) {
	ch, in, err := c.NewChannel.Accept()
	if err != nil {
		return ch, in, err
	}
	out := make(chan *gossh.Request)
	go func() {
		defer close(out)
		envs := 0
		for req := range in {
			switch {
			case req.Type == "window-change":
				// No terminal is allocated (PtyCallback): nothing to resize. gliderlabs hands
				// every window change to a channel nobody reads, which blocks its request
				// loop, and the session with it, for good.
				if req.WantReply {
					req.Reply(true, nil)
				}
				continue
			case req.Type == "env" && (len(req.Payload) > maxEnvRequest || envs >= maxEnvRequests):
				// Only GIT_PROTOCOL is used (gitEnv); gliderlabs keeps every one it is sent.
				if req.WantReply {
					req.Reply(false, nil)
				}
				continue
			case req.Type == "env":
				envs++
			}
			if what, refused := refusedSessionRequests[req.Type]; refused {
				c.log.Info("refused "+what, "remote_addr", c.ctx.RemoteAddr().String(), "user", userFrom(c.ctx))
				if req.WantReply {
					req.Reply(false, nil)
				}
				continue
			}
			out <- req
		}
	}()
	return ch, out, nil
}

// rejectChannel refuses every channel type but "session": direct-tcpip (ssh -L),
// direct-streamlocal (ssh -L with a socket) and anything else.
func (s *Server) rejectChannel(_ *ssh.Server, _ *gossh.ServerConn, ch gossh.NewChannel, ctx ssh.Context) {
	s.log.Info("refused channel", "type", ch.ChannelType(), "remote_addr", ctx.RemoteAddr().String(), "user", userFrom(ctx))
	msg := fmt.Sprintf("%s channels are not supported: this server only serves git", ch.ChannelType())
	if ch.ChannelType() == "direct-tcpip" || ch.ChannelType() == "direct-streamlocal@openssh.com" {
		msg = "port forwarding is not supported: this server only serves git"
	}
	ch.Reject(gossh.Prohibited, msg)
}

// rejectGlobalRequest refuses every global request: tcpip-forward (ssh -R),
// streamlocal-forward and the rest. OpenSSH's keepalives accept a refusal as an answer.
func (s *Server) rejectGlobalRequest(ctx ssh.Context, _ *ssh.Server, req *gossh.Request) (bool, []byte) {
	if !strings.HasPrefix(req.Type, "keepalive@") {
		s.log.Info("refused global request", "type", req.Type, "remote_addr", ctx.RemoteAddr().String(), "user", userFrom(ctx))
	}
	return false, nil
}

func (s *Server) refuseSubsystem(sess ssh.Session) {
	s.refuse(sess, fmt.Sprintf("subsystem %q is not supported: this server only serves git (git push, git clone)", sess.Subsystem()))
}

// refuse tells the client why in one line on stderr and exits 1.
func (s *Server) refuse(sess ssh.Session, msg string) {
	s.log.Info("refused session", "remote_addr", sess.RemoteAddr().String(), "user", userFrom(sess.Context()), "reason", msg)
	fmt.Fprintln(forTerminal(sess, sess.Stderr()), msg)
	sess.Exit(1)
}

// forTerminal returns w, or when the client was granted a PTY (ssh -t) w with "\n" written
// as "\r\n": no terminal is allocated, so nothing else turns line feeds into the carriage
// return plus line feed a raw-mode terminal needs (OpenSSH puts the local one in raw mode).
func forTerminal(sess ssh.Session, w io.Writer) io.Writer {
	if _, _, isPty := sess.Pty(); isPty {
		return crlfWriter{w}
	}
	return w
}

// crlfWriter writes "\n" as "\r\n".
type crlfWriter struct{ w io.Writer }

func (c crlfWriter) Write(b []byte) (int, error) {
	if _, err := c.w.Write(bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n"))); err != nil {
		return 0, err
	}
	return len(b), nil
}

// hint is how people reach this server from the connection whose local address is local:
// WithPublicAddr when set, else that address.
func (s *Server) hint(local net.Addr) Hint {
	var addr string
	if local != nil {
		addr = local.String()
	}
	return NewHint(s.publicAddr, addr)
}

// handleSession runs one SSH exec or shell request.
func (s *Server) handleSession(sess ssh.Session) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("panic in ssh session", "panic", r, "stack", string(debug.Stack()),
				"remote_addr", sess.RemoteAddr().String())
			fmt.Fprintln(sess.Stderr(), "internal server error; the server log has details")
			sess.Exit(1)
		}
	}()
	if s.access != nil && !s.identify(sess) {
		return
	}
	raw := sess.RawCommand()
	if raw == "" {
		if s.commands != nil {
			s.refuse(sess, "interactive shells are not supported; run: "+s.hint(sess.LocalAddr()).Command("help"))
		} else {
			s.refuse(sess, "interactive shells are not supported: this server only serves git (git push, git clone)")
		}
		return
	}
	req, isGit, err := parseGitCommand(raw)
	switch {
	case !isGit:
		sess.Exit(s.runCommand(sess.Context(), sess, raw))
	case err != nil:
		s.refuse(sess, err.Error())
	case req.Service == serviceReceivePack:
		sess.Exit(s.receivePack(sess, req.App))
	default:
		sess.Exit(s.uploadPack(sess, req.App))
	}
}

// runCommand runs a command that is not a git service and returns its exit status: the
// WithCommandHandler's answer, or a refusal without one.
func (s *Server) runCommand(ctx ssh.Context, sess ssh.Session, raw string) int {
	if s.commands != nil {
		args, err := splitCommandLine(raw, s.hint(sess.LocalAddr()).Command())
		if err != nil {
			s.log.Info("refused command", "remote_addr", ctx.RemoteAddr().String(), "user", userFrom(ctx), "err", err)
			fmt.Fprintln(forTerminal(sess, sess.Stderr()), err)
			return 1
		}
		if len(args) == 0 {
			fmt.Fprintf(forTerminal(sess, sess.Stderr()), "no command in %q: run help for the list of commands\n", raw)
			return 1
		}
		word := args[0]
		log := s.log.With("user", userFrom(ctx), "remote_addr", ctx.RemoteAddr().String(), "command", word)
		log.Info("command started")
		start := time.Now()
		_, _, isPty := sess.Pty()
		code := s.commands.RunCommand(ctx, &Command{User: userFrom(ctx), Args: args, Addr: s.hint(sess.LocalAddr()).Addr(),
			Stdin: sess, Terminal: isPty, Stdout: forTerminal(sess, sess), Stderr: forTerminal(sess, sess.Stderr())})
		log.Info("command finished", "exit_status", code, "duration", time.Since(start))
		return code
	}
	word, _, _ := strings.Cut(raw, " ")
	msg := fmt.Sprintf("unknown command %q: this server only serves git (git push, git clone)", word)
	s.log.Info("refused command", "remote_addr", ctx.RemoteAddr().String(), "user", userFrom(ctx), "command", word)
	fmt.Fprintln(forTerminal(sess, sess.Stderr()), msg)
	return 1
}

// pushState is one running git receive-pack, as the hook endpoint finds it by push ID.
type pushState struct {
	id, token string
	app, dir  string
	user      string
	ctx       context.Context // the SSH session's
	log       *slog.Logger
	claimed   chan struct{} // closed when the pre-receive hook called in; a push has one
	done      chan struct{} // closed when git receive-pack has exited (Push.Done)
}

func (p *pushState) claim() bool {
	select {
	case <-p.claimed:
		return false
	default:
		close(p.claimed)
		return true
	}
}

func (s *Server) receivePack(sess ssh.Session, app string) int {
	ctx := sess.Context()
	id, token := newID(8), newID(24)
	log := s.log.With("push_id", id, "app", app, "user", userFrom(ctx), "remote_addr", sess.RemoteAddr().String())
	dir, created, lock, ok := s.repoForPush(sess, app, log, id)
	if !ok {
		return 1
	}
	defer func() {
		lock.Close()
		// A first push that ended without creating the app (no ref update reached the
		// handler, or it recorded no app) leaves nothing behind: not the name taken.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		dropped, err := s.dropAbandoned(dctx, app, dir, log)
		if err != nil {
			log.Error("removing the empty repository of an app no push created", "err", err)
		} else if dropped && created {
			fmt.Fprintf(sess.Stderr(), "app %s was not created: the push stored no branch; push one to create it, e.g.: git push %s main\n",
				app, s.hint(sess.LocalAddr()).RemoteURL(app))
		}
	}()
	ps := &pushState{id: id, token: token, app: app, dir: dir, user: userFrom(ctx), ctx: ctx, log: log,
		claimed: make(chan struct{}), done: make(chan struct{})}
	s.mu.Lock()
	s.pushes[id] = ps
	s.mu.Unlock()
	defer func() {
		close(ps.done)
		s.mu.Lock()
		delete(s.pushes, id)
		s.mu.Unlock()
	}()
	env := append(gitEnv(sess.Environ()),
		envHookURL+"="+s.hookURL, envPushID+"="+id, envHookToken+"="+token)
	args := append([]string{
		// Also in the repository's config; given here too so the server's current settings win
		// (and repositories made before a setting existed get it).
		"-c", "core.hooksPath=" + s.hooksDir,
		"-c", "receive.maxInputSize=" + strconv.FormatInt(s.maxPushSize, 10),
		"-c", "receive.hideRefs=" + HiddenRefPrefix,
	}, append(fsckArgs(), "receive-pack", dir)...)
	log.Info("push started")
	start := time.Now()
	stdout, stderr := newFsckWatch(sess, sess.Stderr(), ps.claimed)
	code := s.runGitIO(ctx, sess, stdout, stderr, env, args, log)
	stdout.noteRefusal(sess.Stderr(), log)
	log.Info("push finished", "exit_status", code, "duration", time.Since(start))
	return code
}

// repoForPush returns app's repository for a push by the session's user, held (holdRepo)
// until the caller closes lock: the existing one when they hold the deploy role on it, else a
// new one they become admin of. An empty repository of an app nobody created, which another
// user's first push left when the server stopped in its middle, is removed first
// (dropAbandoned). When it returns false it has told the client why and exited.
func (s *Server) repoForPush(sess ssh.Session, app string, log *slog.Logger, id string) (dir string, created bool, lock *repoLock, ok bool) {
	ctx := sess.Context()
	for range 3 { // again when a repository is removed between finding and holding it
		dir, exists := s.RepoDir(app)
		if exists && s.denial(sess, app, access.RoleDeploy) != nil {
			if dropped, err := s.dropAbandoned(ctx, app, dir, log); err != nil {
				log.Error("removing the empty repository of an app no push created", "err", err)
			} else if dropped {
				exists = false
			}
		}
		if exists {
			if !s.authorize(sess, app, access.RoleDeploy) {
				return "", false, nil, false
			}
			lock, err := holdRepo(dir)
			if errors.Is(err, errRepoGone) {
				continue
			}
			if err != nil {
				log.Error("locking the repository", "err", err)
				fmt.Fprintf(sess.Stderr(), "could not open the repository of app %s (push ID %s); the server log has details\n", app, id)
				return "", false, nil, false
			}
			return dir, false, lock, true
		}
		// Any registered user may create an app by pushing to it and becomes its admin; if
		// someone else created it meanwhile, this is an ordinary push to their app.
		dir, created, lock, err := s.createRepo(ctx, app, log)
		if err != nil {
			log.Error("creating repository", "err", err)
			fmt.Fprintf(sess.Stderr(), "could not create the repository for app %s (push ID %s); the server log has details\n", app, id)
			return "", false, nil, false
		}
		if !created {
			continue // someone else's: look again
		}
		if s.access != nil {
			if err := s.access.SetGrant(app, userFrom(ctx), access.RoleAdmin); err != nil {
				lock.Close()
				log.Error("granting the admin role to the creator of an app", "err", err)
				fmt.Fprintf(sess.Stderr(), "could not make you admin of the new app %s (push ID %s); the server log has details\n", app, id)
				return "", false, nil, false
			}
			log.Info("app created by push; its pusher is its admin")
		}
		return dir, true, lock, true
	}
	log.Error("the repository kept changing while the push looked for it")
	fmt.Fprintf(sess.Stderr(), "could not open the repository of app %s (push ID %s): it changed while the push started; push again\n", app, id)
	return "", false, nil, false
}

func (s *Server) uploadPack(sess ssh.Session, app string) int {
	ctx := sess.Context()
	log := s.log.With("app", app, "user", userFrom(ctx), "remote_addr", sess.RemoteAddr().String())
	// The role first: to people without one, a missing app and another's look the same.
	if !s.authorize(sess, app, access.RoleRead) {
		return 1
	}
	dir, exists := s.RepoDir(app)
	if !exists {
		log.Info("fetch of missing app")
		fmt.Fprintf(sess.Stderr(), "app %s does not exist; a first git push creates it\n", app)
		return 1
	}
	log.Info("fetch started")
	start := time.Now()
	code := s.runGit(ctx, sess, gitEnv(sess.Environ()), []string{"upload-pack", "--strict", dir}, log)
	log.Info("fetch finished", "exit_status", code, "duration", time.Since(start))
	return code
}

// runGit runs git with the session as its stdin and stdout and the session's stderr as its
// stderr, and returns git's exit status. When ctx ends (the client went away) git and its
// children (the hook) are killed.
func (s *Server) runGit(ctx context.Context, sess ssh.Session, env, args []string, log *slog.Logger) int {
	return s.runGitIO(ctx, sess, sess, sess.Stderr(), env, args, log)
}

// runGitIO is runGit with git's stdout and stderr going to stdout and stderr (which pass it
// on to the session).
func (s *Server) runGitIO(ctx context.Context, sess ssh.Session, stdout, stderr io.Writer, env, args []string, log *slog.Logger) int {
	cmd := exec.CommandContext(ctx, s.git, args...)
	cmd.Env = env
	cmd.Stdout = stdout
	// git's own messages can quote what the client sent (a ref name with control characters
	// in "refusing to create funny ref"): shown escaped, like everything kpush prints.
	errw := term.NewWriter(stderr)
	defer errw.Flush()
	cmd.Stderr = errw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	// Not cmd.Stdin = sess: Wait would wait for the client to close its side.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		log.Error("starting git", "err", err)
		return 1
	}
	if err := cmd.Start(); err != nil {
		log.Error("starting git", "err", err)
		fmt.Fprintln(sess.Stderr(), "internal server error: could not start git; the server log has details")
		return 1
	}
	go func() {
		io.Copy(stdin, sess)
		stdin.Close()
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee) && ee.ExitCode() > 0:
		return ee.ExitCode()
	default:
		if ctx.Err() == nil {
			log.Error("running git", "args", args, "err", err)
		}
		return 1
	}
}

// gitEnv is the environment of git processes the server starts: the server's own, minus
// variables that would point git elsewhere (git rev-parse --local-env-vars, the quarantine,
// push options, kpush's hook variables), plus GIT_PROTOCOL from the client's env request
// (gitprotocol-v2(5): "version=2" turns on protocol v2).
func gitEnv(clientEnv []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if localGitVars[k] || strings.HasPrefix(k, "GIT_PUSH_OPTION_") || strings.HasPrefix(k, "KPUSH_HOOK_") || k == envPushID {
			continue
		}
		env = append(env, kv)
	}
	for _, kv := range clientEnv {
		if v, ok := strings.CutPrefix(kv, "GIT_PROTOCOL="); ok && validProtocol(v) {
			env = append(env, kv)
		}
	}
	return env
}

var localGitVars = map[string]bool{
	"GIT_ALTERNATE_OBJECT_DIRECTORIES": true, "GIT_CONFIG": true, "GIT_CONFIG_PARAMETERS": true,
	"GIT_CONFIG_COUNT": true, "GIT_OBJECT_DIRECTORY": true, "GIT_DIR": true, "GIT_WORK_TREE": true,
	"GIT_IMPLICIT_WORK_TREE": true, "GIT_GRAFT_FILE": true, "GIT_INDEX_FILE": true,
	"GIT_NO_REPLACE_OBJECTS": true, "GIT_REPLACE_REF_BASE": true, "GIT_PREFIX": true,
	"GIT_SHALLOW_FILE": true, "GIT_COMMON_DIR": true, "GIT_QUARANTINE_PATH": true,
	"GIT_PROTOCOL": true, "GIT_PUSH_OPTION_COUNT": true, "GIT_NAMESPACE": true,
}

// validProtocol accepts GIT_PROTOCOL values made of "key=value" items separated by ':'.
func validProtocol(v string) bool {
	if v == "" || len(v) > 256 {
		return false
	}
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("=:._-", r)) {
			return false
		}
	}
	return true
}

// newID returns n random bytes in hex.
func newID(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
