package commands

import (
	"bytes"
	"cmp"
	"io"
	"maps"
	"slices"
	"strings"
)

// minSecretLen is the shortest config value hidden inside text (reasons, build logs): shorter
// ones ("1", "on", "dev") would blank out ordinary words and reveal nothing.
const minSecretLen = 4

// hiddenValue replaces a config value inside text shown to readers.
const hiddenValue = "[hidden]"

// secretsOf returns the values readers of app must not see quoted in reasons and build
// logs: those of its current config and build env, of every release's config snapshot and of
// every build's build env (so that a build-env value unset or rotated since stays hidden in
// old build logs), at least minSecretLen long, longest first. Computed once per invocation
// and app.
func (inv *invocation) secretsOf(app string) []string {
	if v, ok := inv.secrets[app]; ok {
		return v
	}
	set := map[string]bool{}
	add := func(env map[string]string) {
		for _, v := range env {
			if len(v) >= minSecretLen {
				set[v] = true
			}
		}
	}
	if a, err := inv.h.Apps.App(app); err == nil {
		add(a.Config.Env)
		add(a.BuildEnv)
	}
	if rels, err := inv.h.Apps.Releases(app); err == nil {
		for _, r := range rels {
			add(r.Env)
		}
	}
	if bs, err := inv.h.Apps.Builds(app); err == nil {
		for _, b := range bs {
			add(b.Env)
		}
	}
	out := slices.SortedFunc(maps.Keys(set), func(a, b string) int {
		return cmp.Or(len(b)-len(a), strings.Compare(a, b))
	})
	if inv.secrets == nil {
		inv.secrets = map[string][]string{}
	}
	inv.secrets[app] = out
	return out
}

// redact replaces every occurrence of the secrets (longest first) in s with hiddenValue.
func redact(s string, secrets []string) string {
	if len(secrets) == 0 || s == "" {
		return s
	}
	pairs := make([]string, 0, 2*len(secrets))
	for _, v := range secrets {
		pairs = append(pairs, v, hiddenValue)
	}
	return strings.NewReplacer(pairs...).Replace(s)
}

// redactWriter writes whole lines to w with the secrets redacted; a secret split across two
// writes is still found. Flush writes the last, unterminated line.
type redactWriter struct {
	w       io.Writer
	secrets []string
	buf     []byte
}

func (r *redactWriter) Write(b []byte) (int, error) {
	r.buf = append(r.buf, b...)
	i := bytes.LastIndexByte(r.buf, '\n')
	if i < 0 {
		return len(b), nil
	}
	line := string(r.buf[:i+1])
	r.buf = append(r.buf[:0], r.buf[i+1:]...)
	if _, err := io.WriteString(r.w, redact(line, r.secrets)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// Flush writes what is buffered.
func (r *redactWriter) Flush() error {
	if len(r.buf) == 0 {
		return nil
	}
	_, err := io.WriteString(r.w, redact(string(r.buf), r.secrets))
	r.buf = r.buf[:0]
	return err
}

// hidden is what readers see instead of config values: only admins of an app see them.
const hidden = "(hidden: admins only)"

// redactEnv is env with every value hidden (nil stays nil).
func redactEnv(env map[string]string) map[string]string {
	if env == nil {
		return nil
	}
	out := make(map[string]string, len(env))
	for k := range env {
		out[k] = hidden
	}
	return out
}
