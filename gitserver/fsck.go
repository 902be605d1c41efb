package gitserver

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync"
)

// fsckArgs are fsckConfig as `git -c` arguments, for receive-pack's command line.
func fsckArgs() []string {
	var args []string
	for _, kv := range fsckConfig {
		args = append(args, "-c", kv[0]+"="+kv[1])
	}
	return args
}

// fsckLine is how git reports an object that failed its checks, in index-pack's output that
// receive-pack relays to the pusher (as "remote: error: object <oid>: <msg-id>: <text>"
// over side-band, or on stderr): a ref name cannot hold ": ", so nothing else matches.
var fsckLine = regexp.MustCompile(`error: object ([0-9a-f]{40,64}): ([A-Za-z]+): ([^\r\n\x00]*)`)

// pathMsgIDs are the fsck message ids about tree entry names (fsckConfig).
var pathMsgIDs = map[string]bool{
	"duplicateEntries": true, "emptyName": true, "fullPathname": true, "hasDot": true,
	"hasDotdot": true, "hasDotgit": true, "badTree": true, "treeNotSorted": true,
}

// fsckWatch passes what git writes to the pusher through to w, remembering the first object
// git's fsck refused. Once hookRan is closed (the pre-receive hook called in, so the pack
// passed fsck) it only passes data through: a build's output that looks like git's refusal is
// not one. Safe for git's stdout and stderr at once.
type fsckWatch struct {
	mu      *sync.Mutex
	found   *fsckFinding
	hookRan <-chan struct{}
	w       io.Writer
	pending []byte // the unfinished last line, at most 4 KiB
}

type fsckFinding struct{ oid, msgID, text string }

func newFsckWatch(stdout, stderr io.Writer, hookRan <-chan struct{}) (out, errOut *fsckWatch) {
	mu, found := &sync.Mutex{}, &fsckFinding{}
	return &fsckWatch{mu: mu, found: found, hookRan: hookRan, w: stdout},
		&fsckWatch{mu: mu, found: found, hookRan: hookRan, w: stderr}
}

func (f *fsckWatch) closed() bool {
	select {
	case <-f.hookRan:
		return true
	default:
		return false
	}
}

func (f *fsckWatch) Write(p []byte) (int, error) {
	f.mu.Lock()
	if f.found.oid == "" && !f.closed() {
		f.pending = append(f.pending, p...)
		for {
			i := bytes.IndexByte(f.pending, '\n')
			if i < 0 {
				break
			}
			f.scan(f.pending[:i])
			f.pending = f.pending[i+1:]
		}
		if len(f.pending) > 4096 {
			f.scan(f.pending)
			f.pending = f.pending[:0]
		}
	}
	f.mu.Unlock()
	return f.w.Write(p)
}

func (f *fsckWatch) scan(line []byte) {
	if f.found.oid != "" {
		return
	}
	if m := fsckLine.FindSubmatch(line); m != nil {
		*f.found = fsckFinding{oid: string(m[1]), msgID: string(m[2]), text: string(bytes.TrimSpace(m[3]))}
	}
}

// refusal is kpush's own line for the pusher after git refused a pack for an object failing
// its checks, or "" when git refused none.
func (f *fsckWatch) refusal() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.found.oid == "" || f.closed() {
		return ""
	}
	why := ""
	if pathMsgIDs[f.found.msgID] {
		why = `: a tree entry named twice, empty, ".", "..", ".git" or with a "/" could write outside the build directory`
	}
	return fmt.Sprintf("kpush: push refused: object %s fails git's object checks (%s: %s)%s. Nothing of this push was stored.\n",
		f.found.oid[:12], f.found.msgID, f.found.text, why)
}

// noteRefusal writes kpush's line to w (the SSH stderr, which reaches the pusher's terminal)
// after git refused the pack for an object failing fsck: git has told the pusher in its own
// words ("remote: error: object …"); this says it was kpush's check and what it means.
func (f *fsckWatch) noteRefusal(w io.Writer, log *slog.Logger) {
	if msg := f.refusal(); msg != "" {
		log.Warn("push refused by git's object checks", "detail", strings.TrimSpace(msg))
		fmt.Fprint(w, msg)
	}
}
