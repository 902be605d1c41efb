package gitserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/anmitsu/go-shlex"

	"kpush.dev/kpush/internal/term"
)

// Command is one non-git SSH exec request, e.g. `ssh git@host apps:info demo --json`.
type Command struct {
	User string   // the authenticated, registered user
	Args []string // the command line split the way a POSIX shell would (splitCommandLine)
	// Addr is the "host:port" the client connected to (WithPublicAddr when set, else the
	// connection's local address), for messages such as the remote URL of a new app.
	Addr  string
	Stdin io.Reader // the client's stdin (e.g. a public key for keys:add)
	// Terminal is true when the client asked for a PTY (ssh -t): Stdin is then what a person
	// types, not a file.
	Terminal bool
	Stdout   io.Writer // output for people (or JSON); "\n" becomes "\r\n" when the client asked for a PTY
	Stderr   io.Writer // errors for people; translated like Stdout
}

// CommandHandler runs SSH commands that are not git services. It returns the exit status
// sent to the client; ctx ends when the client disconnects.
type CommandHandler interface {
	RunCommand(ctx context.Context, c *Command) int
}

// CommandHandlerFunc adapts a function to CommandHandler.
type CommandHandlerFunc func(ctx context.Context, c *Command) int

// RunCommand calls f(ctx, c).
func (f CommandHandlerFunc) RunCommand(ctx context.Context, c *Command) int { return f(ctx, c) }

// splitCommandLine splits an SSH exec request's command line into words the way a POSIX shell
// would (go-shlex; what sshd's login shell would do). ssh sends the words of its own command
// line joined by spaces, after the local shell removed its quotes, so a value quoted once
// arrives bare: `ssh git@host config:set demo "A=it's"` sends `config:set demo A=it's`. A line
// that does not split (a quote left open, a backslash at its end) or is not UTF-8 is refused
// with what is wrong and the command line, for sshPrefix ("ssh -p 2222 git@127.0.0.1"), that
// quotes the words for both shells; never split some other way, which would store a value
// other than the one meant.
func splitCommandLine(raw, sshPrefix string) ([]string, error) {
	if len(raw) > MaxCommandLine {
		return nil, fmt.Errorf("the command line is %d bytes, over the limit of %d (72 KiB); nothing was run", len(raw), MaxCommandLine)
	}
	if !utf8.ValidString(raw) {
		return nil, fmt.Errorf("the command line %q is not UTF-8; nothing was run", raw)
	}
	args, err := shlex.Split(raw, true)
	if err == nil {
		return args, nil
	}
	what := "it does not split into words"
	switch q := openQuote(raw); {
	case q != 0:
		what = fmt.Sprintf("a %c quote is not closed", q)
	case errors.Is(err, shlex.ErrNoEscaped):
		what = `it ends in a backslash, which escapes nothing`
	}
	return nil, fmt.Errorf("cannot run %q: %s; nothing was run.\n"+
		"The server splits the command line like a shell, after your shell has removed its own quotes, so quote a value for both, e.g.:\n  %s %s",
		raw, what, sshPrefix, term.Sanitize(quoteForBoth(raw)))
}

// MaxCommandLine bounds a command line kpush splits: room for the largest config a config:set
// may store (64 KiB) and its command. go-shlex's split takes time quadratic in a word's length,
// so a longer line is refused before it is split.
const MaxCommandLine = 72 << 10

// openQuote returns the quote character left open at the end of line ('\” or '"'), or 0,
// by the POSIX rules go-shlex follows.
func openQuote(line string) rune {
	var quote rune
	escaped := false
	for _, r := range line {
		switch {
		case escaped:
			escaped = false
		case quote == '\'':
			if r == '\'' {
				quote = 0
			}
		case r == '\\':
			escaped = true
		case quote == '"':
			if r == '"' {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		}
	}
	return quote
}

// intendedWords is how the hint reads a line whose quote is left open: the words before the
// one holding the open quote, then that word and the rest of the line as one, the value people
// meant ("KEY=it's me"), without the quote when it opened the word (`"KEY=x y`); any other
// quote is kept, as a character of the value.
// A line without an open quote is split at spaces.
func intendedWords(line string) []string {
	q := openQuote(line)
	if q == 0 {
		return strings.Fields(line)
	}
	i := strings.LastIndexByte(line, byte(q))
	start := 0
	if sp := strings.LastIndexFunc(line[:i], unicode.IsSpace); sp >= 0 {
		_, n := utf8.DecodeRuneInString(line[sp:])
		start = sp + n
	}
	rest := strings.TrimRightFunc(line[start:], unicode.IsSpace)
	words := strings.Fields(line[:start])
	if i == start { // it opened the word: the quoting people meant
		rest = rest[1:]
	}
	if rest == "" { // the server's split keeps no empty word
		return words
	}
	return append(words, rest)
}

// quoteForBoth is line's intended words, every one holding a quote, a backslash or a space put
// in double quotes for the server (which keeps what is inside: `"A=it's me"`), and the whole
// put in double quotes for the local shell: "config:set demo \"A=it's me\"".
func quoteForBoth(line string) string {
	words := intendedWords(line)
	for i, w := range words {
		if strings.ContainsAny(w, "'\"\\") || strings.IndexFunc(w, unicode.IsSpace) >= 0 {
			words[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(w) + `"`
		}
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`, "`", "\\`").Replace(strings.Join(words, " ")) + `"`
}
