// Package gitserver is kpush's SSH git server: it accepts `git push` and `git clone`/`fetch`
// over SSH, keeps one bare repository per app, and hands every push to a Handler before any
// ref moves.
//
// The API is shaped like net/http: New(handler, options...), then Serve(listener) or
// ListenAndServe(addr), and Shutdown(ctx). SSH is github.com/gliderlabs/ssh; the git wire
// protocol is the real git binary (git receive-pack, git upload-pack) with the SSH channel as
// its stdin and stdout.
//
// Data directory layout (WithDataDir):
//
//	<dir>/ssh_host_ed25519_key   host key, OpenSSH PEM, 0600, made on first start
//	<dir>/repos/<app>.git        bare repository of app, made on its first push
//	<dir>/hooks/pre-receive      core.hooksPath of every repository; execs the hook command;
//	                             rewritten and verified on every start, file and directory
//	                             0555 and owned by the server's uid (installHook)
//	<dir>/state/access.json      users, keys and grants (package access; opened by the caller;
//	                             changed under an flock of access.json.lock)
//
// Every repository has receive.hideRefs=refs/kpush (HiddenRefPrefix): pushes cannot touch
// refs under it, fetches get them. Every push is checked by git's fsck (receive.fsckObjects,
// with duplicate, empty, ".", "..", ".git" and "/"-holding tree entry names made errors:
// fsckConfig): a pack with such an object is refused whole, nothing of it is kept, and the
// pusher gets git's "remote: error: object …" lines and a line of kpush's own saying why.
//
// Who gets in: WithAccess (users, keys and per-app roles from package access; an unregistered
// key gets a session only to be told how to register it), or WithAuthorizedKeys /
// WithAuthenticator (any listed key, every role). Exec requests that are not git services go
// to WithCommandHandler.
//
// A push goes: SSH exec "git-receive-pack '<app>'" → the key's user looked up (WithAccess) →
// app name checked (ValidAppName) → the deploy role checked, or the repository created if
// missing (the pusher becomes the app's admin) → git receive-pack runs with KPUSH_HOOK_URL, KPUSH_PUSH_ID and
// KPUSH_HOOK_TOKEN in its environment → git receives the objects into its quarantine and runs
// hooks/pre-receive → that execs `kpush hook pre-receive`, i.e. RunHook → RunHook POSTs the
// ref updates, push options and quarantine environment to the server's loopback HTTP endpoint
// with the push's ID and secret token → the server finds the SSH session the push belongs to,
// points HEAD of an empty repository at the first pushed branch, and calls
// Handler.PreReceive(sessionCtx, push, out) → whatever the handler writes to out is streamed
// back (flushed per write) and RunHook copies it to its stdout, which git shows the pusher as
// "remote: " lines → the exit status travels in an HTTP trailer; non-zero makes git reject
// every ref of the push ("pre-receive hook declined").
package gitserver
