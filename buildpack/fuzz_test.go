package buildpack

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/BurntSushi/toml"
)

// procfileProcess is one [[processes]] table of the launch.toml kpush/procfile writes.
type procfileProcess struct {
	Type    string   `toml:"type"`
	Command []string `toml:"command"`
	Default bool     `toml:"default"`
}

// procfileWant is the Procfile rule of kpush/procfile's bin/build written out in Go: carriage
// returns are dropped; blank lines and lines starting with # are skipped, and lines without
// ':'; the type is what comes before the first ':' without spaces and tabs, and must be
// [A-Za-z0-9_.-]+; the command is the rest, trimmed of white space, and must not be empty; a
// repeated type keeps its first line; "web" is the default process.
func procfileWant(procfile string) []procfileProcess {
	var out []procfileProcess
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.ReplaceAll(procfile, "\r", ""), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		typ, cmd, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		typ = strings.NewReplacer(" ", "", "\t", "").Replace(typ)
		cmd = strings.Trim(cmd, " \t\n\v\f\r")
		if typ == "" || strings.Trim(typ, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") != "" ||
			seen[typ] || cmd == "" || strings.ContainsFunc(cmd, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }) {
			continue
		}
		seen[typ] = true
		out = append(out, procfileProcess{Type: typ, Command: []string{"/bin/sh", "-c", cmd}, Default: typ == "web"})
	}
	return out
}

// FuzzProcfile checks what becomes of a Procfile in a build. kpush/procfile's bin/build (the
// embedded script, with the host's /bin/sh as builds run it) is checked against procfileWant:
// it succeeds exactly when the Procfile declares a process, and then writes a launch.toml that
// is valid TOML (the lifecycle must read it) holding exactly those processes, each command
// byte for byte. That needs a Procfile a text editor can save: UTF-8 without NUL (a shell
// variable cannot hold NUL, and the lifecycle reads TOML, which is UTF-8).
//
// The script prints Procfile lines back (its warnings), and every line of build output
// reaches the pusher's terminal through cleanLine, so cleanLine is checked on every line of
// any Procfile: what it returns is UTF-8 with no control character but tab (no C0, DEL or C1
// control, no bytes that are not UTF-8 a terminal could read as one), a line that has none
// comes back as it was, and cleaning twice changes nothing more.
func FuzzProcfile(f *testing.F) {
	for _, s := range []string{
		"web: ./server\n",
		"# comment\nweb: busybox httpd -f -p $PORT -h public\r\nworker: echo \"quoted\" \\ back\n",
		"web: a\nweb: b\n",
		"w e b : spaced\n",
		"bad type: x\n",
		"web:\n",
		"no colon\n",
		"web: a: b: c",
		"release: ./migrate && echo $HOME\n",
		"web: printf '%s %d\\n' x 1\n",
		"web: echo `id` $(id)\n",
		"  # indented comment: is a line\n",
		"web: ünï cödé ✓\n",
		"web:\techo tab\t\n",
		"",
		"\n\n",
		"warn \x1b[31mred\x1b[0m \x1b]0;title\x07x \x1b]8;;http://x\x1b\\link \x1bc\n",
		"bad: \xff byte\n\x1b[\n\x1b]unterminated\n",
	} {
		f.Add(s)
	}
	script, err := embedded.ReadFile("buildpacks/procfile/bin/build")
	if err != nil {
		f.Fatal(err)
	}
	build := filepath.Join(f.TempDir(), "build")
	if err := os.WriteFile(build, script, 0o755); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, procfile string) {
		for _, line := range strings.Split(procfile, "\n") {
			checkCleanLine(t, []byte(line))
		}
		if !utf8.ValidString(procfile) || strings.ContainsRune(procfile, 0) {
			return
		}
		app, layers := t.TempDir(), t.TempDir()
		if err := os.WriteFile(filepath.Join(app, "Procfile"), []byte(procfile), 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "/bin/sh", build, layers, "/nonexistent-platform", "/nonexistent-plan")
		cmd.Dir = app
		cmd.Env = []string{"PATH=/usr/bin:/bin", "TMPDIR=" + t.TempDir()}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		runErr := cmd.Run()
		want := procfileWant(procfile)
		if (runErr == nil) != (len(want) > 0) {
			t.Fatalf("bin/build on Procfile %q: %v, want processes %+v; output:\n%s", procfile, runErr, want, out.String())
		}
		if runErr != nil {
			return
		}
		var launch struct {
			Processes []procfileProcess `toml:"processes"`
		}
		data, err := os.ReadFile(filepath.Join(layers, "launch.toml"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := toml.Decode(string(data), &launch); err != nil {
			t.Fatalf("bin/build on Procfile %q wrote a launch.toml the lifecycle cannot read: %v\n%s", procfile, err, data)
		}
		if !reflect.DeepEqual(launch.Processes, want) {
			t.Fatalf("bin/build on Procfile %q declared %+v, want %+v", procfile, launch.Processes, want)
		}
	})
}

// checkCleanLine fails t unless cleanLine(line) is printable, idempotent, and line itself
// when line has no control character.
func checkCleanLine(t *testing.T, line []byte) {
	t.Helper()
	got := cleanLine(line)
	if !utf8.ValidString(got) {
		t.Fatalf("cleanLine(%q) = %q: not UTF-8", line, got)
	}
	for _, r := range got {
		if (r < 0x20 && r != '\t') || (r >= 0x7f && r <= 0x9f) {
			t.Fatalf("cleanLine(%q) = %q: keeps control character %U", line, got, r)
		}
	}
	if again := cleanLine([]byte(got)); again != got {
		t.Fatalf("cleanLine(cleanLine(%q)) = %q, want %q", line, again, got)
	}
	if utf8.Valid(line) && !bytes.ContainsFunc(line, func(r rune) bool { return r < 0x20 && r != '\t' || r >= 0x7f && r <= 0x9f }) &&
		got != string(line) {
		t.Fatalf("cleanLine(%q) = %q: changed a line without control characters", line, got)
	}
}
