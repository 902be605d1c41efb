package ops

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

func TestNewLoggerJSON(t *testing.T) {
	var buf bytes.Buffer
	log, err := NewLogger(&buf, LogJSON, slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	plog := log.With("push_id", "p-123", "app", "demo")
	plog.Debug("hidden below the level")
	plog.Info("build finished", "image", "127.0.0.1:5000/kpush/demo@sha256:abc",
		"registry_password", "hunter2", "auth", slog.GroupValue(slog.String("token", "t0ken"), slog.String("user", "kpush")))

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d records, want 1 (debug is below info):\n%s", len(lines), buf.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatalf("record is not JSON: %v\n%s", err, lines[0])
	}
	for k, want := range map[string]any{
		"level": "INFO", "msg": "build finished", "push_id": "p-123", "app": "demo",
		"registry_password": "[REDACTED]",
	} {
		if rec[k] != want {
			t.Errorf("%s = %v, want %v", k, rec[k], want)
		}
	}
	if auth, _ := rec["auth"].(map[string]any); auth["token"] != "[REDACTED]" || auth["user"] != "kpush" {
		t.Errorf("auth group = %v, want token redacted and user kept", rec["auth"])
	}
	if strings.Contains(buf.String(), "hunter2") || strings.Contains(buf.String(), "t0ken") {
		t.Errorf("a secret reached the log:\n%s", buf.String())
	}
}

func TestNewLoggerFormats(t *testing.T) {
	for _, tc := range []struct {
		format  string
		wantErr bool
		prefix  string
	}{
		{LogJSON, false, `{"time":`},
		{LogText, false, `time=`},
		{"yaml", true, ""},
		{"", true, ""},
	} {
		var buf bytes.Buffer
		log, err := NewLogger(&buf, tc.format, slog.LevelDebug)
		if (err != nil) != tc.wantErr {
			t.Errorf("NewLogger(%q): %v, want error %v", tc.format, err, tc.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		log.Debug("hello", "push_id", "p-1")
		if !strings.HasPrefix(buf.String(), tc.prefix) || !strings.Contains(buf.String(), "p-1") {
			t.Errorf("NewLogger(%q) wrote %q", tc.format, buf.String())
		}
	}
}
