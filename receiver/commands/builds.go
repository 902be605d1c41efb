package commands

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"kpush.dev/kpush/receiver"
)

// buildsCommands list builds, replay their output, and stop them.
var buildsCommands = []spec{
	{Use: "builds APP", Short: "List an app's builds, newest first",
		Role: appRead, Args: []string{"APP"}, JSON: true, Run: (*invocation).builds},
	{Use: "builds:output APP [N]", Short: "Print a build's output (default: the newest build); -f follows a running build",
		Role: appRead, Args: []string{"APP"}, More: 1, Run: (*invocation).buildsOutput,
		Flags: func(f *pflag.FlagSet) { f.BoolP("follow", "f", false, "keep printing until the build ends") }},
	{Use: "builds:cancel APP", Short: "Stop the running build of an app (its push is rejected; the previous release keeps serving)",
		Role: appDeploy, Args: []string{"APP"}, Run: (*invocation).buildsCancel},
	{Use: "apps:unlock APP",
		Short: "Free an app's build lease whoever holds it and cancel the build holding it (its push is rejected); " +
			"a crashed server's lease also expires by itself",
		Role: appAdmin, Args: []string{"APP"}, Run: (*invocation).appsUnlock},
}

// buildView is b as the caller may see it: readers see no build env values.
func (inv *invocation) buildView(app string, b *receiver.Build) *receiver.Build {
	c := *b
	if !inv.isAdmin(app) {
		c.Env = redactEnv(c.Env)
	}
	return &c
}

func (inv *invocation) builds(cmd *cobra.Command, a []string) error {
	all, err := inv.h.Apps.Builds(a[0])
	if err != nil {
		return err
	}
	bs := []*receiver.Build{}
	for _, b := range all {
		bs = append(bs, inv.buildView(a[0], b))
	}
	if wantJSON(cmd) {
		return printJSON(cmd.OutOrStdout(), bs)
	}
	if len(bs) == 0 {
		fmt.Fprintf(cmd.OutOrStdout(), "%s has no builds yet\n", a[0])
		return nil
	}
	w := table(cmd.OutOrStdout())
	fmt.Fprintf(w, "=== %s Builds\n", a[0])
	for _, b := range bs {
		took := "-"
		if !b.Finished.IsZero() {
			took = b.Finished.Sub(b.Started).Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(w, "#%d\tv%d\t%s\t%s\t%s\t%s\t%s\n", b.Number, b.Release, short(b.Commit), b.Phase(), b.User, stamp(b.Started), took)
	}
	return w.Flush()
}

func (inv *invocation) buildsOutput(cmd *cobra.Command, a []string) error {
	follow, _ := cmd.Flags().GetBool("follow")
	n := 0
	if len(a) > 1 {
		var err error
		if n, err = strconv.Atoi(strings.TrimPrefix(a[1], "#")); err != nil || n < 1 {
			return errors.New("builds:output: N is a build number, e.g. 3 (list them with: " + inv.h.ssh() + " builds " + a[0] + ")")
		}
	}
	if inv.isAdmin(a[0]) {
		return inv.h.Apps.BuildOutput(cmd.Context(), a[0], n, follow, cmd.OutOrStdout())
	}
	w := &redactWriter{w: cmd.OutOrStdout(), secrets: inv.secretsOf(a[0])}
	err := inv.h.Apps.BuildOutput(cmd.Context(), a[0], n, follow, w)
	w.Flush()
	return err
}

func (inv *invocation) buildsCancel(cmd *cobra.Command, a []string) error {
	r, err := inv.h.Apps.CancelBuild(cmd.Context(), a[0], inv.user)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("v%d", r.Version)
	if r.Build > 0 {
		what = fmt.Sprintf("build #%d (v%d)", r.Build, r.Version)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "Cancelling %s of %s, %s by %s; it stops within a second\n", what, a[0], short(r.Commit), r.User)
	return nil
}

func (inv *invocation) appsUnlock(cmd *cobra.Command, a []string) error {
	_, held, who, err := inv.h.Apps.Unlock(cmd.Context(), a[0], inv.user)
	if err != nil {
		return err
	}
	if !held {
		fmt.Fprintf(cmd.OutOrStdout(), "%s was not locked; nothing to do\n", a[0])
		return nil
	}
	fmt.Fprintf(cmd.OutOrStdout(), "Unlocked %s: its lease was held by %s; that build is cancelled within a second "+
		"(its pusher is told you ran apps:unlock) unless its server is gone\n", a[0], who)
	return nil
}
