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

// releasesCommands list and show releases and make new ones from old ones.
var releasesCommands = []spec{
	{Use: "releases APP", Short: "List an app's releases, newest first",
		Role: appRead, Args: []string{"APP"}, JSON: true, Run: (*invocation).releases},
	{Use: "releases:info APP vN", Short: "Show one release",
		Role: appRead, Args: []string{"APP", "vN"}, JSON: true, Run: (*invocation).releasesInfo},
	// rollback needs admin as well when vN's config differs from the current one; the
	// pipeline decides, told whether the caller is an admin.
	{Use: "rollback APP vN",
		Short: "Deploy release vN's image and config again, as a new release (no build); the deploy role suffices when vN's config equals the current one, else it needs admin",
		Role:  appDeploy, Args: []string{"APP", "vN"}, Run: (*invocation).rollback},
	{Use: "rebuild APP [REV]", Short: "Build REV (default: the deploy branch) again and deploy it as a new release, without a push",
		Role: appDeploy, Args: []string{"APP"}, More: 1, Run: (*invocation).rebuild},
}

// releaseView is r as the caller may see it: readers see neither config values nor any of
// them quoted in the failure reason (an app that printed its env as it crashed).
// Tables show its Phase ("building" rather than "pending" while it runs); JSON keeps the
// stored Status.
func (inv *invocation) releaseView(app string, r *receiver.Release) *receiver.Release {
	if r == nil || inv.isAdmin(app) {
		return r
	}
	c := *r
	c.Env = redactEnv(c.Env)
	c.Reason = redact(c.Reason, inv.secretsOf(app))
	return &c
}

func (inv *invocation) releases(cmd *cobra.Command, a []string) error {
	rels, err := inv.h.Apps.Releases(a[0])
	if err != nil {
		return err
	}
	out := []*receiver.Release{}
	for _, r := range rels {
		out = append(out, inv.releaseView(a[0], r))
	}
	if wantJSON(cmd) {
		return printJSON(cmd.OutOrStdout(), out)
	}
	if len(out) == 0 {
		fmt.Fprintf(cmd.OutOrStdout(), "%s has no releases yet\n", a[0])
		return nil
	}
	app, err := inv.h.Apps.App(a[0])
	if err != nil {
		return err
	}
	w := table(cmd.OutOrStdout())
	fmt.Fprintf(w, "=== %s Releases\n", a[0])
	for _, r := range out {
		mark := ""
		if r.Version == app.Current {
			mark = "current"
		}
		status := r.Phase()
		if r.Reason != "" {
			status += ": " + firstLine(r.Reason)
		}
		fmt.Fprintf(w, "v%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Version, r.Description, short(r.Commit), r.User, stamp(r.Created), status, mark)
	}
	return w.Flush()
}

func (inv *invocation) releasesInfo(cmd *cobra.Command, a []string) error {
	n, err := receiver.ParseVersion(a[1])
	if err != nil {
		return err
	}
	r, err := inv.h.Apps.ReleaseInfo(a[0], n)
	if err != nil {
		return err
	}
	r = inv.releaseView(a[0], r)
	if wantJSON(cmd) {
		return printJSON(cmd.OutOrStdout(), r)
	}
	w := table(cmd.OutOrStdout())
	fmt.Fprintf(w, "=== %s v%d\n", a[0], r.Version)
	fmt.Fprintf(w, "Description:\t%s\n", r.Description)
	fmt.Fprintf(w, "Kind:\t%s\n", r.Kind)
	fmt.Fprintf(w, "Status:\t%s\n", r.Phase())
	if r.Reason != "" {
		fmt.Fprintf(w, "Reason:\t%s\n", strings.ReplaceAll(r.Reason, "\n", " "))
	}
	if r.Commit != "" && inv.h.Apps.HasReleaseRef(a[0], r.Version) {
		fmt.Fprintf(w, "Commit:\t%s (git fetch %s %s)\n", r.Commit, remoteURL(inv.addr, a[0]), r.Ref())
	} else {
		fmt.Fprintf(w, "Commit:\t%s\n", orDash(r.Commit))
	}
	fmt.Fprintf(w, "Image:\t%s\n", orDash(r.Image))
	if r.Build > 0 {
		fmt.Fprintf(w, "Build:\t#%d\n", r.Build)
	}
	fmt.Fprintf(w, "Config:\tv%d\n", r.ConfigVersion)
	for _, k := range slices.Sorted(maps.Keys(r.Env)) {
		fmt.Fprintf(w, "  %s\t%s\n", k, term.Sanitize(r.Env[k])) // one line per var, as config shows them
	}
	fmt.Fprintf(w, "By:\t%s\n", r.User)
	fmt.Fprintf(w, "When:\t%s\n", stamp(r.Created))
	return w.Flush()
}

func (inv *invocation) rollback(cmd *cobra.Command, a []string) error {
	n, err := receiver.ParseVersion(a[1])
	if err != nil {
		return err
	}
	_, err = inv.h.Apps.Rollback(cmd.Context(), a[0], inv.user, n, inv.isAdmin(a[0]), cmd.OutOrStdout())
	return err
}

func (inv *invocation) rebuild(cmd *cobra.Command, a []string) error {
	rev := ""
	if len(a) > 1 {
		rev = a[1]
	}
	_, err := inv.h.Apps.Rebuild(cmd.Context(), a[0], inv.user, rev, cmd.OutOrStdout())
	return err
}
