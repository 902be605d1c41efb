package commands

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"kpush.dev/kpush/internal/term"
	"kpush.dev/kpush/receiver"
)

// configCommands show and change an app's run-time config and build-time env (admins).
var configCommands = []spec{
	{Use: "config APP", Short: "Show an app's run-time config vars (admins)",
		Role: appAdmin, Args: []string{"APP"}, JSON: true, Run: (*invocation).config},
	{Use: "config:set APP KEY=VALUE...", Short: "Set run-time config vars: a new release with the current image (no build)",
		Role: appAdmin, Args: []string{"APP", "KEY=VALUE"}, More: -1, Run: (*invocation).configSet},
	{Use: "config:unset APP KEY...", Short: "Remove run-time config vars: a new release with the current image (no build)",
		Role: appAdmin, Args: []string{"APP", "KEY"}, More: -1, Run: (*invocation).configUnset},
	{Use: "build-env APP", Short: "Show an app's build-time env vars (admins)",
		Role: appAdmin, Args: []string{"APP"}, JSON: true, Run: (*invocation).buildEnv},
	{Use: "build-env:set APP KEY=VALUE...", Short: "Set build-time env vars, handed to buildpacks by the next build (no release)",
		Role: appAdmin, Args: []string{"APP", "KEY=VALUE"}, More: -1, Run: (*invocation).buildEnvSet},
	{Use: "build-env:unset APP KEY...", Short: "Remove build-time env vars from the next build (no release)",
		Role: appAdmin, Args: []string{"APP", "KEY"}, More: -1, Run: (*invocation).buildEnvUnset},
}

func (inv *invocation) config(cmd *cobra.Command, a []string) error {
	app, err := inv.h.Apps.App(a[0])
	if err != nil {
		return err
	}
	env := orEmpty(app.Config.Env)
	if wantJSON(cmd) {
		return printJSON(cmd.OutOrStdout(), receiver.Config{Version: app.Config.Version, Env: env})
	}
	return printEnv(cmd, a[0], "config", env)
}

func (inv *invocation) buildEnv(cmd *cobra.Command, a []string) error {
	app, err := inv.h.Apps.App(a[0])
	if err != nil {
		return err
	}
	env := orEmpty(app.BuildEnv)
	if wantJSON(cmd) {
		return printJSON(cmd.OutOrStdout(), env)
	}
	return printEnv(cmd, a[0], "build-env", env)
}

func orEmpty(env map[string]string) map[string]string {
	if env == nil {
		return map[string]string{}
	}
	return env
}

// printEnv prints env as KEY=VALUE lines, sorted, or that app has no vars of this kind.
// Control characters in a value are shown escaped (term.Sanitize): someone else set it, and it
// reaches the reader's terminal; --json gives the exact bytes.
func printEnv(cmd *cobra.Command, app, kind string, env map[string]string) error {
	if len(env) == 0 {
		fmt.Fprintf(cmd.OutOrStdout(), "%s has no %s vars\n", app, kind)
		return nil
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		fmt.Fprintf(cmd.OutOrStdout(), "%s=%s\n", k, term.Sanitize(env[k]))
	}
	return nil
}

// parseAssignments parses K=V arguments.
func parseAssignments(cmd *cobra.Command, a []string) (map[string]string, error) {
	set := map[string]string{}
	for _, kv := range a {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("%s: %q is not KEY=VALUE\nusage: %s", cmd.Name(), kv, sshUse(cmd))
		}
		set[k] = v
	}
	return set, nil
}

func (inv *invocation) configSet(cmd *cobra.Command, a []string) error {
	set, err := parseAssignments(cmd, a[1:])
	if err != nil {
		return err
	}
	_, err = inv.h.Apps.ChangeConfig(cmd.Context(), a[0], inv.user, set, nil, cmd.OutOrStdout())
	return err
}

func (inv *invocation) configUnset(cmd *cobra.Command, a []string) error {
	_, err := inv.h.Apps.ChangeConfig(cmd.Context(), a[0], inv.user, nil, a[1:], cmd.OutOrStdout())
	return err
}

func (inv *invocation) buildEnvSet(cmd *cobra.Command, a []string) error {
	set, err := parseAssignments(cmd, a[1:])
	if err != nil {
		return err
	}
	if _, err := inv.h.Apps.ChangeBuildEnv(cmd.Context(), a[0], set, nil); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "Set %s for the next build of %s (git push or rebuild %s)\n",
		strings.Join(slices.Sorted(maps.Keys(set)), ", "), a[0], a[0])
	return nil
}

func (inv *invocation) buildEnvUnset(cmd *cobra.Command, a []string) error {
	if _, err := inv.h.Apps.ChangeBuildEnv(cmd.Context(), a[0], nil, a[1:]); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "Removed %s from the next build of %s\n", strings.Join(a[1:], ", "), a[0])
	return nil
}
