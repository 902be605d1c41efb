package ops

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Log formats accepted by NewLogger.
const (
	LogJSON = "json" // one JSON object per line (slog.JSONHandler), for log collectors
	LogText = "text" // key=value lines (slog.TextHandler), for people at a terminal
)

// redacted replaces the value of an attribute whose key names a secret.
const redacted = "[REDACTED]"

// secretKeys are substrings of attribute keys (lowercased) whose values are never written.
var secretKeys = []string{"password", "passwd", "secret", "token", "authorization", "credential", "private_key"}

// NewLogger returns a logger writing records at level and above to w in format (LogJSON or
// LogText). Keys are the callers' (kpush uses snake_case: push_id, app, err). As a last line
// of defence, the value of any attribute whose key contains password, passwd, secret, token,
// authorization, credential or private_key is written as "[REDACTED]"; callers still must
// not log secrets under other keys. An unknown format is an error.
func NewLogger(w io.Writer, format string, level slog.Leveler) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: redact}
	switch format {
	case LogJSON:
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case LogText:
		return slog.New(slog.NewTextHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("log format %q: want %q or %q", format, LogJSON, LogText)
	}
}

func redact(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindGroup {
		return a // its attributes are passed to redact one by one
	}
	k := strings.ToLower(a.Key)
	for _, s := range secretKeys {
		if strings.Contains(k, s) {
			return slog.String(a.Key, redacted)
		}
	}
	return a
}
