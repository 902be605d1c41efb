package main

import (
	"io"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// commandFor returns a new `kpush dev` or `kpush serve` command (name) that writes nowhere.
func commandFor(t *testing.T, name string) *cobra.Command {
	t.Helper()
	var cmd *cobra.Command
	switch name {
	case "dev":
		cmd = devCommand()
	case "serve":
		cmd = serveCommand()
	default:
		t.Fatalf("no command %q", name)
	}
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	return cmd
}

// TestEnvBadValueFailsStartup: a KPUSH_* variable the flag's parser refuses stops start-up
// before anything runs, naming the variable and its flag, with the error the same value
// gives as a flag.
func TestEnvBadValueFailsStartup(t *testing.T) {
	for _, tc := range []struct {
		name    string
		command string
		env     map[string]string
		flag    []string // the same value as a flag
		want    []string // in the error from the environment
	}{
		{name: "lease TTL without a unit", command: "serve", env: map[string]string{"KPUSH_LEASE_TTL": "10"}, flag: []string{"--lease-ttl", "10"},
			want: []string{`KPUSH_LEASE_TTL="10": time: missing unit in duration "10"`, "it sets --lease-ttl: want a duration, e.g. 30s"}},
		{name: "shutdown grace in words", command: "dev", env: map[string]string{"KPUSH_SHUTDOWN_GRACE": "soon"}, flag: []string{"--shutdown-grace", "soon"},
			want: []string{`KPUSH_SHUTDOWN_GRACE="soon": time: invalid duration "soon"`, "it sets --shutdown-grace: want a duration, e.g. 30s"}},
		{name: "ready timeout empty", command: "serve", env: map[string]string{"KPUSH_READY_TIMEOUT": ""}, flag: []string{"--ready-timeout", ""},
			want: []string{`KPUSH_READY_TIMEOUT="": time: invalid duration ""`, "it sets --ready-timeout: want a duration, e.g. 5m0s"}},
		{name: "two bad variables", command: "dev", env: map[string]string{"KPUSH_LEASE_TTL": "1 minute", "KPUSH_SHUTDOWN_GRACE": "-"},
			want: []string{`KPUSH_LEASE_TTL="1 minute": time: unknown unit " minute" in duration "1 minute"`, `KPUSH_SHUTDOWN_GRACE="-": time: invalid duration "-"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			cmd := commandFor(t, tc.command)
			cmd.SetArgs([]string{})
			err := cmd.ExecuteContext(t.Context())
			if err == nil {
				t.Fatalf("kpush %s with %v started", tc.command, tc.env)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("kpush %s with %v: error lacks %q:\n%v", tc.command, tc.env, w, err)
				}
			}
			if tc.flag == nil {
				return
			}
			for k := range tc.env {
				os.Unsetenv(k) // restored by t.Setenv's cleanup
			}
			cmd = commandFor(t, tc.command)
			cmd.SetArgs(tc.flag)
			ferr := cmd.ExecuteContext(t.Context())
			if ferr == nil {
				t.Fatalf("kpush %s %q started", tc.command, tc.flag)
			}
			// What the flag's parser said is what the variable's error says.
			_, cause, _ := strings.Cut(ferr.Error(), " flag: ")
			if cause == "" || !strings.Contains(err.Error(), cause) {
				t.Errorf("the flag's error %q is not in the variable's %q", ferr, err)
			}
		})
	}
}

// TestEnvDefaultsAndFlagsWin: a KPUSH_* variable sets its flag's value through the flag set
// (lists ':'-separated), and a flag given on the command line wins over the variable, even
// over one that would not parse.
func TestEnvDefaultsAndFlagsWin(t *testing.T) {
	for k, v := range map[string]string{
		"KPUSH_LEASE_TTL":       "not a duration", // --lease-ttl wins
		"KPUSH_READY_TIMEOUT":   "45s",
		"KPUSH_NAMESPACE":       "from-env", // --namespace wins
		"KPUSH_IMAGE":           "registry.example.com/kpush@sha256:00",
		"KPUSH_AUTHORIZED_KEYS": "/keys/a.pub:/keys/b.pub",
		"KPUSH_OPS_ADDR":        "", // set and empty: turns the endpoints off
		"KUBECONFIG":            "/kube/config",
	} {
		t.Setenv(k, v)
	}
	cmd := commandFor(t, "serve")
	if err := cmd.ParseFlags([]string{"--lease-ttl", "20s", "--namespace", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if err := cmd.PreRunE(cmd, nil); err != nil {
		t.Fatalf("applying the environment: %v", err)
	}
	for flag, want := range map[string]string{
		"lease-ttl":       "20s",
		"ready-timeout":   "45s",
		"namespace":       "from-flag",
		"kpush-image":     "registry.example.com/kpush@sha256:00",
		"authorized-keys": "[/keys/a.pub,/keys/b.pub]",
		"ops-addr":        "",
		"kubeconfig":      "/kube/config",
		"registry":        "", // KPUSH_REGISTRY unset: the default
	} {
		if got := cmd.Flags().Lookup(flag).Value.String(); got != want {
			t.Errorf("--%s = %q, want %q", flag, got, want)
		}
	}
}

// TestDocumentedEnvNames: every environment variable the README's flag tables of kpush dev
// and kpush serve name defaults its flag.
func TestDocumentedEnvNames(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	flagRE, envRE := regexp.MustCompile("`--([a-z-]+)"), regexp.MustCompile("`([A-Z][A-Z_]+)`")
	var command string
	checked := 0
	for _, line := range strings.Split(string(readme), "\n") {
		switch {
		case strings.HasPrefix(line, "### `kpush dev`"):
			command = "dev"
		case strings.HasPrefix(line, "### `kpush serve`"):
			command = "serve"
		case strings.HasPrefix(line, "#"):
			command = ""
		}
		cols := strings.Split(line, "|")
		if command == "" || len(cols) < 3 || !strings.HasPrefix(strings.TrimSpace(cols[1]), "`--") {
			continue
		}
		flags, envs := flagRE.FindAllStringSubmatch(cols[1], -1), envRE.FindAllStringSubmatch(cols[2], -1)
		if len(envs) == 0 {
			continue
		}
		if len(flags) != len(envs) {
			t.Errorf("README row %q: %d flags, %d variables", line, len(flags), len(envs))
			continue
		}
		cmd := commandFor(t, command)
		for i, f := range flags {
			flag := cmd.Flags().Lookup(f[1])
			if flag == nil {
				t.Errorf("kpush %s has no --%s (README)", command, f[1])
				continue
			}
			if got := flag.Annotations[envAnnotation]; len(got) != 1 || got[0] != envs[i][1] {
				t.Errorf("kpush %s --%s defaults to %v, README says %s", command, f[1], got, envs[i][1])
			}
			checked++
		}
	}
	if checked < 20 {
		t.Errorf("checked %d documented variables; did the README's tables move?", checked)
	}
}
