package gitserver

import (
	"errors"
	"fmt"
	"strings"

	"kpush.dev/kpush/internal/names"
)

// MaxAppNameLen is the longest app name: a DNS-1035 label has at most 63 characters (RFC 1035
// section 2.3.4), and an app name becomes a Knative Service name.
const MaxAppNameLen = 63

const appNameRule = "app names are DNS-1035 labels: lowercase letters, digits and '-', " +
	"starting with a letter, ending with a letter or digit, at most 63 characters (e.g. my-app)"

// ValidAppName reports whether name can be an app name: a DNS-1035 label
// ([a-z]([-a-z0-9]*[a-z0-9])?, at most 63 characters; RFC 1035 section 2.3.1 as Kubernetes
// applies it to Service names). The error is a one-line sentence for the pusher that states
// the rule.
func ValidAppName(name string) error {
	switch {
	case name == "":
		return errors.New("app name is empty; " + appNameRule)
	// %+q: a name is shown in ASCII, so a look-alike letter (Cyrillic "е" in "dеmo") or a
	// bidirectional override reads as what it is, not as the valid name it imitates.
	case len(name) > MaxAppNameLen:
		return fmt.Errorf("app name %.20q... is %d characters long; %s", name, len(name), appNameRule)
	case !names.IsApp(name):
		return fmt.Errorf("invalid app name %+q; %s", name, appNameRule)
	}
	return nil
}

// Git services this server runs, as git-shell names them.
const (
	serviceReceivePack = "receive-pack"
	serviceUploadPack  = "upload-pack"
)

// gitRequest is a parsed git command line: which service, for which app.
type gitRequest struct {
	Service string // serviceReceivePack or serviceUploadPack
	App     string
}

// parseGitCommand parses the command line an SSH client asked to exec. isGit is false when
// the command is not a git service at all (it goes to the command handler). When isGit is true
// and err is nil, req names a valid app. err is a one-line message for the client.
//
// git sends `git-receive-pack '<path>'` (or `git-upload-pack`), quoting the path with
// sq_quote_buf (git's quote.c): the path inside single quotes, each single quote written as
// quote-backslash-quote-quote and each ! as quote-backslash-!-quote. Older clients and people
// typing by hand use `git receive-pack '<path>'`. The path is /app, /app.git, app or app.git.
func parseGitCommand(raw string) (req gitRequest, isGit bool, err error) {
	verb, rest, hasArg := strings.Cut(raw, " ")
	if verb == "git" {
		verb, rest, hasArg = strings.Cut(rest, " ")
		verb = "git-" + verb
	}
	switch verb {
	case "git-receive-pack":
		req.Service = serviceReceivePack
	case "git-upload-pack":
		req.Service = serviceUploadPack
	case "git-upload-archive":
		return req, true, errors.New("git archive --remote is not supported by this server; clone the app instead")
	default:
		return req, false, nil
	}
	if !hasArg || rest == "" {
		return req, true, fmt.Errorf("%s needs a repository path, e.g. %s 'my-app'", verb, verb)
	}
	path, err := unquoteGitArg(rest)
	if err != nil {
		return req, true, fmt.Errorf("%s: %w", verb, err)
	}
	req.App, err = appFromPath(path)
	return req, true, err
}

// unquoteGitArg undoes git's sq_quote_buf: the whole argument is single-quoted, and a quote or
// ! inside it is written as quote, backslash, the character, quote. Anything else (unquoted
// text, a trailing argument, an unterminated quote) is an error.
func unquoteGitArg(s string) (string, error) {
	const bad = "repository path must be one single-quoted argument, as git sends it: 'my-app'"
	if !strings.HasPrefix(s, "'") {
		return "", errors.New(bad)
	}
	var b strings.Builder
	s = s[1:]
	for {
		i := strings.IndexByte(s, '\'')
		if i < 0 {
			return "", errors.New(bad)
		}
		b.WriteString(s[:i])
		s = s[i+1:]
		switch {
		case s == "":
			return b.String(), nil
		case strings.HasPrefix(s, `\''`), strings.HasPrefix(s, `\!'`):
			b.WriteByte(s[1])
			s = s[3:]
		default:
			return "", errors.New(bad)
		}
	}
}

// appFromPath maps the repository path of a git URL to an app name: "/app", "/app.git",
// "app" and "app.git" all name app. The name must pass ValidAppName.
func appFromPath(path string) (string, error) {
	// "ssh://host/app/" names the same repository as "ssh://host/app".
	name := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(path, "/"), "/"), ".git")
	if err := ValidAppName(name); err != nil {
		return "", err
	}
	return name, nil
}
