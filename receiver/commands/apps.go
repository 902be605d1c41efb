package commands

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"kpush.dev/kpush/gitserver/access"
	"kpush.dev/kpush/receiver"
)

// appsCommands list, create, show and destroy apps.
var appsCommands = []spec{
	{Use: "apps", Short: "List the apps you can read", Role: anyone, JSON: true, Run: (*invocation).apps},
	{Use: "apps:create APP", Short: "Create an empty app; you become its admin (a first git push does this too)",
		Role: anyone, Args: []string{"APP"}, Run: (*invocation).appsCreate},
	{Use: "apps:info APP", Short: "Show an app: deploy branch, current release, URL, status",
		Role: appRead, Args: []string{"APP"}, JSON: true, Run: (*invocation).appsInfo},
	{Use: "apps:destroy APP --confirm APP",
		Short: "Delete an app for good: the running release, the repository with every release's source, its images in the registry, grants, releases, builds, config",
		Role:  appAdmin, Args: []string{"APP"}, Run: (*invocation).appsDestroy,
		Flags: func(f *pflag.FlagSet) { f.String("confirm", "", "the app's name again, to confirm") }},
}

// appView is an app as a command shows it; config values only to admins.
type appView struct {
	Name         string            `json:"name"`
	Owner        string            `json:"owner"`
	Created      time.Time         `json:"created"`
	DeployBranch string            `json:"deploy_branch,omitempty"`
	Current      int               `json:"current_release,omitempty"`
	URL          string            `json:"url,omitempty"`
	Status       string            `json:"status,omitempty"`
	Config       receiver.Config   `json:"config"`
	BuildEnv     map[string]string `json:"build_env,omitempty"`
	Release      *receiver.Release `json:"release,omitempty"`
	Latest       *receiver.Release `json:"latest_release,omitempty"`
}

func (inv *invocation) view(a *receiver.App) *appView {
	v := &appView{Name: a.Name, Owner: a.Owner, Created: a.Created, DeployBranch: a.DeployBranch,
		Current: a.Current, URL: a.URL, Config: a.Config, BuildEnv: a.BuildEnv}
	if !inv.isAdmin(a.Name) {
		v.Config.Env, v.BuildEnv = redactEnv(v.Config.Env), redactEnv(v.BuildEnv)
	}
	return v
}

func (inv *invocation) apps(cmd *cobra.Command, _ []string) error {
	all, err := inv.h.Apps.Apps()
	if err != nil {
		return err
	}
	views := []*appView{}
	for _, a := range all {
		if inv.need(a.Name, access.RoleRead) == nil {
			views = append(views, inv.view(a))
		}
	}
	if wantJSON(cmd) {
		return printJSON(cmd.OutOrStdout(), views)
	}
	if len(views) == 0 {
		fmt.Fprintf(cmd.OutOrStdout(), "no apps yet; git push to %s or run: %s apps:create APP\n", remoteURL(inv.addr, "APP"), inv.h.ssh())
		return nil
	}
	w := table(cmd.OutOrStdout())
	fmt.Fprintln(w, "NAME\tRELEASE\tOWNER\tURL")
	for _, v := range views {
		rel := "-"
		if v.Current > 0 {
			rel = fmt.Sprintf("v%d", v.Current)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", v.Name, rel, v.Owner, orDash(v.URL))
	}
	return w.Flush()
}

func (inv *invocation) appsCreate(cmd *cobra.Command, a []string) error {
	if _, err := inv.h.Apps.Create(cmd.Context(), a[0], inv.user); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "Created %s; you are its admin. Deploy with:\n  git remote add knative %s\n  git push knative main\n", a[0], remoteURL(inv.addr, a[0]))
	return nil
}

func (inv *invocation) appsInfo(cmd *cobra.Command, a []string) error {
	info, err := inv.h.Apps.Info(a[0])
	if err != nil {
		return err
	}
	v := inv.view(info.App)
	v.Status, v.Release, v.Latest = info.Status, inv.releaseView(a[0], info.Release), inv.releaseView(a[0], info.Latest)
	if wantJSON(cmd) {
		return printJSON(cmd.OutOrStdout(), v)
	}
	w := table(cmd.OutOrStdout())
	fmt.Fprintf(w, "=== %s\n", v.Name)
	fmt.Fprintf(w, "Deploy branch:\t%s\n", orDash(v.DeployBranch))
	if r := v.Release; r != nil {
		fmt.Fprintf(w, "Release:\tv%d %s (%s) by %s at %s\n", r.Version, r.Description, short(r.Commit), r.User, stamp(r.Created))
		fmt.Fprintf(w, "Image:\t%s\n", r.Image)
	} else {
		fmt.Fprintf(w, "Release:\tnone yet\n")
	}
	fmt.Fprintf(w, "Status:\t%s\n", v.Status)
	if r := v.Latest; r != nil {
		fmt.Fprintf(w, "Latest:\tv%d %s: %s %s\n", r.Version, r.Description, r.Phase(), strings.ReplaceAll(r.Reason, "\n", " "))
	}
	fmt.Fprintf(w, "URL:\t%s\n", orDash(v.URL))
	fmt.Fprintf(w, "Config:\tv%d (%d vars)\n", v.Config.Version, len(v.Config.Env))
	fmt.Fprintf(w, "Owner:\t%s\n", v.Owner)
	fmt.Fprintf(w, "Created:\t%s\n", stamp(v.Created))
	return w.Flush()
}

func (inv *invocation) appsDestroy(cmd *cobra.Command, a []string) error {
	confirm, _ := cmd.Flags().GetString("confirm")
	if confirm != "" && confirm != a[0] {
		return fmt.Errorf("apps:destroy: --confirm %s does not match the app name %s; nothing was deleted. To delete %s, run:\n  %s apps:destroy %s --confirm %s",
			confirm, a[0], a[0], inv.h.ssh(), a[0], a[0])
	}
	if confirm != a[0] {
		return fmt.Errorf("apps:destroy deletes %s with its repository and every release; to confirm, run:\n  %s apps:destroy %s --confirm %s", a[0], inv.h.ssh(), a[0], a[0])
	}
	if err := inv.h.Apps.Destroy(cmd.Context(), a[0], cmd.OutOrStdout()); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "Destroyed %s\n", a[0])
	return nil
}
