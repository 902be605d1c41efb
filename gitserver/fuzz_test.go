package gitserver

import (
	"bytes"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/anmitsu/go-shlex"

	"kpush.dev/kpush/internal/names"
	"kpush.dev/kpush/internal/term"
)

// sqQuote quotes s as git's sq_quote_buf does for the path of git-receive-pack 'PATH'.
func sqQuote(s string) string {
	return "'" + strings.NewReplacer("'", `'\''`, "!", `'\!'`).Replace(s) + "'"
}

// FuzzParseGitCommand checks the app names and git command lines the server takes, on any
// command line (raw) and any repository path or name (path).
//
// ValidAppName and names.IsApp (which the access and app stores use) agree on path; a
// refused name's error is one printable line; an accepted name is what every repository path
// spelling of it maps to. parseGitCommand on raw: an accepted line names a valid app and a
// service, and its canonical spelling parses to the same request; a refused one says why in
// one printable line. On the line git itself sends for path (quoted by sqQuote): git's
// quoting is undone exactly, so the request names the app appFromPath makes of the path, or
// fails as appFromPath does.
func FuzzParseGitCommand(f *testing.F) {
	for _, c := range [][2]string{
		{"git-receive-pack 'demo'", "demo"},
		{"git-upload-pack '/demo.git'", "/demo.git"},
		{"git receive-pack 'demo'", "it's"},
		{"git-receive-pack 'it'\\''s'", "wow!"},
		{"git-receive-pack demo", "/demo/"},
		{"git-receive-pack 'demo' extra", "../demo"},
		{"git-upload-archive 'demo'", ""},
		{"git-receive-pack", "de'mo"},
		{"git-receive-pack ''", "demo\n"},
		{"apps:info demo --json", "a!b"},
		{"git-receive-pack 'de\\!mo'", "'"},
		{"git-upload-pack 'a'", "My-App"},
		{"git-upload-pack 'a'", strings.Repeat("a", 63)},
		{"git-upload-pack 'a'", strings.Repeat("a", 64)},
		{"git-upload-pack 'a'", "app\x00"},
		{"git-upload-pack 'a'", "äpp"},
		{"git-upload-pack 'a'", "app\x1b[31m"},
	} {
		f.Add(c[0], c[1])
	}
	f.Fuzz(func(t *testing.T, raw, path string) {
		if err := ValidAppName(path); (err == nil) != names.IsApp(path) {
			t.Fatalf("ValidAppName(%q) = %v but names.IsApp = %v: the two rules disagree", path, err, names.IsApp(path))
		} else if err != nil {
			if msg := err.Error(); !term.Printable(msg) || strings.Contains(msg, "\n") {
				t.Fatalf("ValidAppName(%q) error is not one printable line: %q", path, msg)
			}
		} else {
			for _, p := range []string{path, "/" + path, path + ".git", "/" + path + ".git", "/" + path + "/"} {
				if got, err := appFromPath(p); err != nil || got != path {
					t.Fatalf("appFromPath(%q) = %q, %v; want %q", p, got, err, path)
				}
			}
		}

		req, isGit, err := parseGitCommand(raw)
		switch {
		case !isGit && err != nil:
			t.Fatalf("parseGitCommand(%q): not git, yet error %v", raw, err)
		case isGit && err != nil:
			if msg := err.Error(); !term.Printable(msg) || strings.Contains(msg, "\n") {
				t.Fatalf("parseGitCommand(%q) error is not one printable line: %q", raw, msg)
			}
		case isGit:
			if verr := ValidAppName(req.App); verr != nil {
				t.Fatalf("parseGitCommand(%q) accepted app %q: %v", raw, req.App, verr)
			}
			if req.Service != serviceReceivePack && req.Service != serviceUploadPack {
				t.Fatalf("parseGitCommand(%q) gave service %q", raw, req.Service)
			}
			canon := "git-" + req.Service + " " + sqQuote(req.App)
			if again, ok, err := parseGitCommand(canon); !ok || err != nil || again != req {
				t.Fatalf("parseGitCommand(%q) = %+v, but its spelling %q parses to %+v, %v, %v", raw, req, canon, again, ok, err)
			}
		}

		for _, service := range []string{serviceReceivePack, serviceUploadPack} {
			line := "git-" + service + " " + sqQuote(path)
			if unq, err := unquoteGitArg(sqQuote(path)); err != nil || unq != path {
				t.Fatalf("unquoteGitArg(%q) = %q, %v; want %q", sqQuote(path), unq, err, path)
			}
			wantApp, wantErr := appFromPath(path)
			req, isGit, err := parseGitCommand(line)
			switch {
			case !isGit:
				t.Fatalf("parseGitCommand(%q): not git", line)
			case (err == nil) != (wantErr == nil):
				t.Fatalf("parseGitCommand(%q) = %+v, %v; appFromPath(%q) = %q, %v", line, req, err, path, wantApp, wantErr)
			case err == nil && (req.App != wantApp || req.Service != service):
				t.Fatalf("parseGitCommand(%q) = %+v; want app %q, service %s", line, req, wantApp, service)
			}
		}
	})
}

// gitOID reports whether s is an object name as git writes them: SHA-1 (40) or SHA-256 (64)
// in lowercase hex.
func gitOID(s string) bool {
	return (len(s) == 40 || len(s) == 64) && strings.Trim(s, "0123456789abcdef") == ""
}

// FuzzHookInput checks the parsers of what git hands the pre-receive hook.
//
// parseRefUpdates on stdin: an accepted input gives one update per line, each with object
// names git could have sent and a name under refs/, and writing them back as git does reads
// back the same updates; a refused input's error is printable.
//
// pushOptions on GIT_PUSH_OPTION_COUNT=count and GIT_PUSH_OPTION_<n> set to opts split at
// NUL (which no option can hold): when count is the number of options they all come back in
// order; any other count gives that many entries (the missing ones empty), or none for a
// count that is not a positive number.
func FuzzHookInput(f *testing.F) {
	a, b := strings.Repeat("a", 40), strings.Repeat("0", 40)
	s256 := strings.Repeat("b", 64)
	for i, s := range []string{
		"",
		b + " " + a + " refs/heads/main\n",
		a + " " + b + " refs/heads/gone\n" + b + " " + a + " refs/tags/v1\n",
		b + " " + s256 + " refs/heads/main",
		a + " " + a + " refs/heads/main\r\n",
		strings.ToUpper(a) + " " + a + " refs/heads/main\n",
		a + " " + a + " heads/main\n",
		a + "  " + a + " refs/heads/main\n",
		a + " " + a + " refs/heads/a b\n",
		"\n",
	} {
		opts := [][2]string{{"", ""}, {"1", "ci.skip"}, {"2", "ci.skip\x00app=demo"}, {"3", "a\x00b"},
			{"-1", "a"}, {"0x2", "a\x00b"}, {" 1", "a"}, {"+1", "a"}}[i%8]
		f.Add(s, opts[0], opts[1])
	}
	f.Fuzz(func(t *testing.T, stdin, count, opts string) {
		if updates, err := parseRefUpdates(strings.NewReader(stdin)); err != nil {
			if !term.Printable(err.Error()) {
				t.Fatalf("parseRefUpdates(%q) error is not printable: %q", stdin, err)
			}
		} else {
			if lines := strings.Count(strings.TrimSuffix(stdin, "\n"), "\n") + 1; stdin != "" && len(updates) != lines {
				t.Fatalf("parseRefUpdates(%q) = %d updates from %d lines", stdin, len(updates), lines)
			}
			var out bytes.Buffer
			for _, u := range updates {
				if !gitOID(u.Old) || !gitOID(u.New) || !strings.HasPrefix(u.Name, "refs/") || strings.ContainsAny(u.Name, " \n") {
					t.Fatalf("parseRefUpdates(%q) accepted %+v", stdin, u)
				}
				fmt.Fprintf(&out, "%s %s %s\n", u.Old, u.New, u.Name)
			}
			again, err := parseRefUpdates(&out)
			if err != nil || fmt.Sprint(again) != fmt.Sprint(updates) {
				t.Fatalf("parseRefUpdates(%q) = %v, written back and read again: %v, %v", stdin, updates, again, err)
			}
		}

		env := map[string]string{"GIT_PUSH_OPTION_COUNT": count}
		var given []string
		if opts != "" {
			given = strings.Split(opts, "\x00")
		}
		for i, o := range given {
			env["GIT_PUSH_OPTION_"+strconv.Itoa(i)] = o
		}
		n, err := strconv.Atoi(count)
		// git sets the count to the number of options it puts in the hook's environment,
		// which the kernel bounds to a few MB: larger counts are not inputs git gives.
		if err == nil && n > 1<<20 {
			return
		}
		got := pushOptions(env)
		if err != nil || n <= 0 {
			if got != nil {
				t.Fatalf("pushOptions(count %q) = %q, want none", count, got)
			}
			return
		}
		if len(got) != n {
			t.Fatalf("pushOptions(count %q) = %d options, want %d", count, len(got), n)
		}
		for i, o := range got {
			want := ""
			if i < len(given) {
				want = given[i]
			}
			if o != want {
				t.Fatalf("pushOptions(count %q)[%d] = %q, want %q", count, i, o, want)
			}
		}
	})
}

// FuzzCommandLine checks splitCommandLine, which turns an SSH exec request's command line
// that is not a git service into the words a command gets. A line it accepts splits as
// go-shlex splits it, faithfully: quoting the words again and splitting gives the same words.
// A line it refuses (not UTF-8, a quote left open, a final backslash) gets an error a person
// can read, and for a UTF-8 line the command it suggests, given to a real POSIX shell as the
// argument of ssh, reaches the server as a line that splits into the words that were typed.
func FuzzCommandLine(f *testing.F) {
	for _, s := range []string{
		"apps", "apps:info demo --json", `config:set demo "A=hello world" B='x y'`, `config:set demo A=a\ b`,
		"keys:add laptop", `apps:info "unterminated`, `apps:info demo\`, "help\tconfig:set", "  ", "",
		"config:set demo KEY=it's", "config:set demo KEY=$HOME`id`", `config:set demo 'a"b' "c'd`,
		"git-receive-pack 'demo'", `"git-receive-pack" 'demo'`, "config:set demo A=\x1b[31m", "bad \xff",
	} {
		f.Add(s)
	}
	const prefix = "ssh -p 2222 git@127.0.0.1"
	f.Fuzz(func(t *testing.T, raw string) {
		if _, isGit, _ := parseGitCommand(raw); isGit {
			return // a git service: never split
		}
		args, err := splitCommandLine(raw, prefix)
		if err == nil {
			want, werr := shlex.Split(raw, true)
			if werr != nil || !slices.Equal(args, want) {
				t.Fatalf("splitCommandLine(%q) = %q; go-shlex splits it into %q, %v", raw, args, want, werr)
			}
			quoted := make([]string, len(args))
			for i, a := range args {
				quoted[i] = "'" + strings.ReplaceAll(a, "'", `'"'"'`) + "'"
			}
			again, err := splitCommandLine(strings.Join(quoted, " "), prefix)
			if err != nil || !slices.Equal(again, args) {
				t.Fatalf("%q splits into %q; quoted again %q splits into %q, %v", raw, args, quoted, again, err)
			}
			return
		}
		if !term.Printable(err.Error()) {
			t.Fatalf("splitCommandLine(%q) error is not printable: %q", raw, err)
		}
		if !utf8.ValidString(raw) || strings.ContainsRune(raw, 0) {
			return // no suggestion to try: a shell argument cannot hold NUL
		}
		sent, serr := exec.Command("/bin/sh", "-c", "printf %s "+quoteForBoth(raw)).Output()
		if serr != nil {
			t.Fatalf("splitCommandLine(%q) suggests %s, which sh refuses: %v", raw, quoteForBoth(raw), serr)
		}
		got, err := splitCommandLine(string(sent), prefix)
		if want := intendedWords(raw); err != nil || !slices.Equal(got, want) {
			t.Fatalf("splitCommandLine(%q) suggests %s; sh sends %q, which splits into %q, %v; want %q",
				raw, quoteForBoth(raw), sent, got, err, want)
		}
	})
}
