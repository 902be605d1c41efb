// Package commands is kpush's SSH command line, Heroku/Dokku style:
// `ssh -p PORT git@HOST COMMAND [ARGS]`. A cobra command tree is built for every invocation
// with the caller bound to it, runs the app operations of receiver.Pipeline after checking the
// caller's role on the app, and adds the user, key and grant commands of the access store.
package commands

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"kpush.dev/kpush/gitserver"
	"kpush.dev/kpush/gitserver/access"
	"kpush.dev/kpush/receiver"
)

// Access is who may do what; *access.Store implements it.
type Access interface {
	// Authorize returns nil when user holds need on app, else an error for people.
	Authorize(user, app string, need access.Role) error
	// Commands returns the user, key and grant commands, run as caller.
	Commands(caller string) []*cobra.Command
}

// Handler runs SSH commands. It implements gitserver.CommandHandler.
type Handler struct {
	Apps   *receiver.Pipeline
	Access Access
	// SSH is how people reach the server, for hints: "ssh -p 2222 git@127.0.0.1".
	SSH string
}

var _ gitserver.CommandHandler = (*Handler)(nil)

// RunCommand runs c.Args as the user c.User and returns the exit status: 0 on success, 1 with
// a message on c.Stderr otherwise; a usage error (unknown command, wrong arguments or flags)
// adds a hint to run help.
func (h *Handler) RunCommand(ctx context.Context, c *gitserver.Command) int {
	inv := &invocation{h: h, user: c.User, addr: c.Addr}
	root := inv.root()
	root.SetArgs(c.Args)
	root.SetIn(c.Stdin)
	root.SetOut(c.Stdout)
	root.SetErr(c.Stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	err = inv.hideApps(err)
	fmt.Fprintln(c.Stderr, strings.TrimRight(err.Error(), "\n"))
	if !inv.ran {
		fmt.Fprintf(c.Stderr, "run `%s help` for the list of commands, `%s help COMMAND` for one\n", h.ssh(), h.ssh())
	}
	return 1
}

func (h *Handler) ssh() string {
	if h.SSH != "" {
		return h.SSH
	}
	return "ssh git@HOST"
}

// invocation is one command run by one user.
type invocation struct {
	h    *Handler
	user string
	addr string // host:port the client connected to ("" when unknown)
	ran  bool   // arguments and flags were accepted; errors from here on are not usage errors

	secrets map[string][]string // per app, for readers: values to hide (secretsOf)
}

func (inv *invocation) root() *cobra.Command {
	root := &cobra.Command{
		Use:   "kpush",
		Short: "kpush over SSH",
		Long: "Commands of kpush's git server. Run them as:\n  " + inv.h.ssh() + " COMMAND [ARGS]\n" +
			"Deploy with git push; roles: read (clone, list, info), deploy (push, rollback, rebuild),\n" +
			"admin (config, build-env, grants, destroy).",
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		PersistentPreRun:  func(*cobra.Command, []string) { inv.ran = true },
		Annotations:       map[string]string{"ssh": inv.h.ssh()},
	}
	root.SetUsageTemplate(strings.NewReplacer(
		"{{.UseLine}}", `{{sshUseLine .}}`,
		"{{.CommandPath}} [command]", `{{sshPrefix .}} [command]`,
	).Replace(root.UsageTemplate()))
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return err })
	root.SetHelpCommand(inv.help())
	root.AddCommand(
		inv.apps(), inv.appsCreate(), inv.appsInfo(), inv.appsDestroy(),
		inv.releases(), inv.releasesInfo(), inv.rollback(), inv.rebuild(),
		inv.config(), inv.configSet(), inv.configUnset(),
		inv.buildEnv(), inv.buildEnvSet(), inv.buildEnvUnset(),
		inv.builds(), inv.buildsOutput(), inv.buildsCancel(), inv.appsUnlock(),
	)
	if inv.h.Access != nil {
		for _, c := range inv.h.Access.Commands(inv.user) {
			inv.adapt(c)
			root.AddCommand(c)
		}
	}
	return root
}

// adapt gives an access command (gitserver/access) this tree's argument errors, which name
// the arguments and carry the usage line, from its Use ("apps:grant APP USER ROLE": three
// required); apps:revoke also refuses to take the last admin of an app away from themselves.
func (inv *invocation) adapt(c *cobra.Command) {
	var required []string
	for _, f := range strings.Fields(c.Use)[1:] {
		if !strings.HasPrefix(f, "[") {
			required = append(required, f)
		}
	}
	c.Args = args(required, 0)
	if c.Name() == "apps:revoke" && c.RunE != nil {
		run := c.RunE
		c.RunE = func(cmd *cobra.Command, a []string) error {
			if err := inv.lastAdmin(a[0], a[1]); err != nil {
				return err
			}
			return run(cmd, a)
		}
	}
}

// grantLister is the part of *access.Store that lastAdmin reads.
type grantLister interface {
	Grants(app string) []access.Grant
	User(name string) (access.User, error)
}

// lastAdmin refuses to revoke user's role on app when user is the app's only admin by grant
// and the caller is not a server admin (who keeps every role anyway): nobody but server admins
// could manage the app after it.
func (inv *invocation) lastAdmin(app, user string) error {
	gl, ok := inv.h.Access.(grantLister)
	if !ok {
		return nil
	}
	if me, err := gl.User(inv.user); err != nil || me.Admin {
		return nil
	}
	admins := 0
	isAdmin := false
	for _, g := range gl.Grants(app) {
		if g.Role == access.RoleAdmin {
			admins++
			isAdmin = isAdmin || g.User == user
		}
	}
	if !isAdmin || admins > 1 {
		return nil
	}
	return fmt.Errorf("%s is the last admin of %s, and nobody but server admins could manage it afterwards; "+
		"first make someone else admin:\n  %s apps:grant %s USER admin\nor ask a server admin to run the revoke", user, app, inv.h.ssh(), app)
}

func init() {
	cobra.AddTemplateFunc("sshPrefix", func(c *cobra.Command) string { return c.Root().Annotations["ssh"] })
	cobra.AddTemplateFunc("sshUseLine", func(c *cobra.Command) string {
		line := c.UseLine() // "kpush apps:create APP [flags]"
		_, rest, _ := strings.Cut(line, " ")
		if c == c.Root() {
			rest = "COMMAND [ARGS]"
		}
		return c.Root().Annotations["ssh"] + " " + rest
	})
}

// need checks the caller's role on app. A caller with no role on it at all is told that
// there is no such app or they have no role on it: whether an app exists is not revealed to
// people who may not read it (hideApps).
func (inv *invocation) need(app string, role access.Role) error {
	if err := gitserver.ValidAppName(app); err != nil {
		return err
	}
	if inv.h.Access == nil {
		return nil
	}
	return inv.hideApps(inv.h.Access.Authorize(inv.user, app, role))
}

// hideApps turns an *access.DeniedError (also from the access commands) about an app the
// caller has no role on into "no app named APP, or you (USER) have no role on it"; a caller with a
// lesser role keeps the message naming the role they lack.
func (inv *invocation) hideApps(err error) error {
	denied, ok := errors.AsType[*access.DeniedError](err)
	if !ok || inv.h.Access == nil || denied.User != inv.user {
		return err
	}
	if inv.h.Access.Authorize(inv.user, denied.App, access.RoleRead) == nil {
		return err
	}
	return fmt.Errorf("no app named %s, or you (%s) have no role on it; `%s apps` lists yours. If it exists, an admin of it can run: apps:grant %s %s %s",
		denied.App, inv.user, inv.h.ssh(), denied.App, inv.user, denied.Need)
}

// isAdmin reports whether the caller may see app's config values.
func (inv *invocation) isAdmin(app string) bool { return inv.need(app, access.RoleAdmin) == nil }

// args checks the positional arguments: the names of the required ones, then how many more
// are allowed (-1: any number).
func args(required []string, optional int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		switch {
		case len(a) < len(required):
			return fmt.Errorf("%s needs %s (missing %s); usage: %s", cmd.Name(), strings.Join(required, " "),
				strings.Join(required[len(a):], " "), sshUse(cmd))
		case optional >= 0 && len(a) > len(required)+optional:
			return fmt.Errorf("%s: unexpected argument %q\nusage: %s", cmd.Name(), a[len(required)+optional], sshUse(cmd))
		}
		return nil
	}
}

func sshUse(cmd *cobra.Command) string {
	_, rest, _ := strings.Cut(cmd.UseLine(), " ")
	return cmd.Root().Annotations["ssh"] + " " + rest
}

func jsonFlag(cmd *cobra.Command) *bool {
	return cmd.Flags().Bool("json", false, "print JSON")
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func short(oid string) string {
	if len(oid) > 7 {
		return oid[:7]
	}
	if oid == "" {
		return "-"
	}
	return oid
}

// hidden is what readers see instead of config values: only admins of an app see them.
const hidden = "(hidden: admins only)"

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

// buildView is b as the caller may see it: readers see no build env values.
func (inv *invocation) buildView(app string, b *receiver.Build) *receiver.Build {
	c := *b
	if !inv.isAdmin(app) {
		c.Env = redactEnv(c.Env)
	}
	return &c
}

func (inv *invocation) apps() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "apps",
		Short: "List the apps you can read",
		Args:  args(nil, 0),
	}
	asJSON := jsonFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
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
		if *asJSON {
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
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (inv *invocation) appsCreate() *cobra.Command {
	return &cobra.Command{
		Use:   "apps:create APP",
		Short: "Create an empty app; you become its admin (a first git push does this too)",
		Args:  args([]string{"APP"}, 0),
		RunE: func(cmd *cobra.Command, a []string) error {
			if _, err := inv.h.Apps.Create(cmd.Context(), a[0], inv.user); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Created %s; you are its admin. Deploy with:\n  git remote add knative %s\n  git push knative main\n", a[0], remoteURL(inv.addr, a[0]))
			return nil
		},
	}
}

func (inv *invocation) appsInfo() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "apps:info APP",
		Short: "Show an app: deploy branch, current release, URL, status",
		Args:  args([]string{"APP"}, 0),
	}
	asJSON := jsonFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, a []string) error {
		if err := inv.need(a[0], access.RoleRead); err != nil {
			return err
		}
		info, err := inv.h.Apps.Info(a[0])
		if err != nil {
			return err
		}
		v := inv.view(info.App)
		v.Status, v.Release, v.Latest = info.Status, inv.releaseView(a[0], info.Release), inv.releaseView(a[0], info.Latest)
		if *asJSON {
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
			fmt.Fprintf(w, "Latest:\tv%d %s: %s %s\n", r.Version, r.Description, r.Phase(), r.Reason)
		}
		fmt.Fprintf(w, "URL:\t%s\n", orDash(v.URL))
		fmt.Fprintf(w, "Config:\tv%d (%d vars)\n", v.Config.Version, len(v.Config.Env))
		fmt.Fprintf(w, "Owner:\t%s\n", v.Owner)
		fmt.Fprintf(w, "Created:\t%s\n", stamp(v.Created))
		return w.Flush()
	}
	return cmd
}

func (inv *invocation) appsDestroy() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "apps:destroy APP --confirm APP",
		Short: "Delete an app for good: the running release, the repository with every release's source, its images in the registry, grants, releases, builds, config",
		Args:  args([]string{"APP"}, 0),
	}
	confirm := cmd.Flags().String("confirm", "", "the app's name again, to confirm")
	cmd.RunE = func(cmd *cobra.Command, a []string) error {
		if err := inv.need(a[0], access.RoleAdmin); err != nil {
			return err
		}
		if *confirm != "" && *confirm != a[0] {
			return fmt.Errorf("apps:destroy: --confirm %s does not match the app name %s; nothing was deleted. To delete %s, run:\n  %s apps:destroy %s --confirm %s",
				*confirm, a[0], a[0], inv.h.ssh(), a[0], a[0])
		}
		if *confirm != a[0] {
			return fmt.Errorf("apps:destroy deletes %s with its repository and every release; to confirm, run:\n  %s apps:destroy %s --confirm %s", a[0], inv.h.ssh(), a[0], a[0])
		}
		if err := inv.h.Apps.Destroy(cmd.Context(), a[0], cmd.OutOrStdout()); err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "Destroyed %s\n", a[0])
		return nil
	}
	return cmd
}

func (inv *invocation) releases() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "releases APP",
		Short: "List an app's releases, newest first",
		Args:  args([]string{"APP"}, 0),
	}
	asJSON := jsonFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, a []string) error {
		if err := inv.need(a[0], access.RoleRead); err != nil {
			return err
		}
		rels, err := inv.h.Apps.Releases(a[0])
		if err != nil {
			return err
		}
		out := []*receiver.Release{}
		for _, r := range rels {
			out = append(out, inv.releaseView(a[0], r))
		}
		if *asJSON {
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
	return cmd
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func (inv *invocation) releasesInfo() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "releases:info APP vN",
		Short: "Show one release",
		Args:  args([]string{"APP", "vN"}, 0),
	}
	asJSON := jsonFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, a []string) error {
		if err := inv.need(a[0], access.RoleRead); err != nil {
			return err
		}
		n, err := receiver.ParseVersion(a[1])
		if err != nil {
			return err
		}
		r, err := inv.h.Apps.ReleaseInfo(a[0], n)
		if err != nil {
			return err
		}
		r = inv.releaseView(a[0], r)
		if *asJSON {
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
			fmt.Fprintf(w, "  %s\t%s\n", k, r.Env[k])
		}
		fmt.Fprintf(w, "By:\t%s\n", r.User)
		fmt.Fprintf(w, "When:\t%s\n", stamp(r.Created))
		return w.Flush()
	}
	return cmd
}

func (inv *invocation) rollback() *cobra.Command {
	return &cobra.Command{
		Use:   "rollback APP vN",
		Short: "Deploy release vN's image and config again, as a new release (no build); the deploy role suffices when vN's config equals the current one, else it needs admin",
		Args:  args([]string{"APP", "vN"}, 0),
		RunE: func(cmd *cobra.Command, a []string) error {
			if err := inv.need(a[0], access.RoleDeploy); err != nil {
				return err
			}
			n, err := receiver.ParseVersion(a[1])
			if err != nil {
				return err
			}
			_, err = inv.h.Apps.Rollback(cmd.Context(), a[0], inv.user, n, inv.isAdmin(a[0]), cmd.OutOrStdout())
			return err
		},
	}
}

func (inv *invocation) rebuild() *cobra.Command {
	return &cobra.Command{
		Use:   "rebuild APP [REV]",
		Short: "Build REV (default: the deploy branch) again and deploy it as a new release, without a push",
		Args:  args([]string{"APP"}, 1),
		RunE: func(cmd *cobra.Command, a []string) error {
			if err := inv.need(a[0], access.RoleDeploy); err != nil {
				return err
			}
			rev := ""
			if len(a) > 1 {
				rev = a[1]
			}
			_, err := inv.h.Apps.Rebuild(cmd.Context(), a[0], inv.user, rev, cmd.OutOrStdout())
			return err
		},
	}
}

func (inv *invocation) config() *cobra.Command {
	return inv.envList("config", "Show an app's run-time config vars (admins)", func(a *receiver.App) (int, map[string]string) {
		return a.Config.Version, a.Config.Env
	})
}

func (inv *invocation) buildEnv() *cobra.Command {
	return inv.envList("build-env", "Show an app's build-time env vars (admins)", func(a *receiver.App) (int, map[string]string) {
		return 0, a.BuildEnv
	})
}

func (inv *invocation) envList(name, short string, get func(*receiver.App) (int, map[string]string)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   name + " APP",
		Short: short,
		Args:  args([]string{"APP"}, 0),
	}
	asJSON := jsonFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, a []string) error {
		if err := inv.need(a[0], access.RoleAdmin); err != nil {
			return err
		}
		app, err := inv.h.Apps.App(a[0])
		if err != nil {
			return err
		}
		version, env := get(app)
		if env == nil {
			env = map[string]string{}
		}
		if *asJSON {
			if name == "config" {
				return printJSON(cmd.OutOrStdout(), receiver.Config{Version: version, Env: env})
			}
			return printJSON(cmd.OutOrStdout(), env)
		}
		if len(env) == 0 {
			fmt.Fprintf(cmd.OutOrStdout(), "%s has no %s vars\n", a[0], name)
			return nil
		}
		for _, k := range slices.Sorted(maps.Keys(env)) {
			fmt.Fprintf(cmd.OutOrStdout(), "%s=%s\n", k, env[k])
		}
		return nil
	}
	return cmd
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

func (inv *invocation) configSet() *cobra.Command {
	return &cobra.Command{
		Use:   "config:set APP KEY=VALUE...",
		Short: "Set run-time config vars: a new release with the current image (no build)",
		Args:  args([]string{"APP", "KEY=VALUE"}, -1),
		RunE: func(cmd *cobra.Command, a []string) error {
			if err := inv.need(a[0], access.RoleAdmin); err != nil {
				return err
			}
			set, err := parseAssignments(cmd, a[1:])
			if err != nil {
				return err
			}
			_, err = inv.h.Apps.ChangeConfig(cmd.Context(), a[0], inv.user, set, nil, cmd.OutOrStdout())
			return err
		},
	}
}

func (inv *invocation) configUnset() *cobra.Command {
	return &cobra.Command{
		Use:   "config:unset APP KEY...",
		Short: "Remove run-time config vars: a new release with the current image (no build)",
		Args:  args([]string{"APP", "KEY"}, -1),
		RunE: func(cmd *cobra.Command, a []string) error {
			if err := inv.need(a[0], access.RoleAdmin); err != nil {
				return err
			}
			_, err := inv.h.Apps.ChangeConfig(cmd.Context(), a[0], inv.user, nil, a[1:], cmd.OutOrStdout())
			return err
		},
	}
}

func (inv *invocation) buildEnvSet() *cobra.Command {
	return &cobra.Command{
		Use:   "build-env:set APP KEY=VALUE...",
		Short: "Set build-time env vars, handed to buildpacks by the next build (no release)",
		Args:  args([]string{"APP", "KEY=VALUE"}, -1),
		RunE: func(cmd *cobra.Command, a []string) error {
			if err := inv.need(a[0], access.RoleAdmin); err != nil {
				return err
			}
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
		},
	}
}

func (inv *invocation) buildEnvUnset() *cobra.Command {
	return &cobra.Command{
		Use:   "build-env:unset APP KEY...",
		Short: "Remove build-time env vars from the next build (no release)",
		Args:  args([]string{"APP", "KEY"}, -1),
		RunE: func(cmd *cobra.Command, a []string) error {
			if err := inv.need(a[0], access.RoleAdmin); err != nil {
				return err
			}
			if _, err := inv.h.Apps.ChangeBuildEnv(cmd.Context(), a[0], nil, a[1:]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Removed %s from the next build of %s\n", strings.Join(a[1:], ", "), a[0])
			return nil
		},
	}
}

func (inv *invocation) builds() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "builds APP",
		Short: "List an app's builds, newest first",
		Args:  args([]string{"APP"}, 0),
	}
	asJSON := jsonFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, a []string) error {
		if err := inv.need(a[0], access.RoleRead); err != nil {
			return err
		}
		bs, err := inv.h.Apps.Builds(a[0])
		if err != nil {
			return err
		}
		views := []*receiver.Build{}
		for _, b := range bs {
			views = append(views, inv.buildView(a[0], b))
		}
		bs = views
		if *asJSON {
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
	return cmd
}

func (inv *invocation) buildsOutput() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "builds:output APP [N]",
		Short: "Print a build's output (default: the newest build); -f follows a running build",
		Args:  args([]string{"APP"}, 1),
	}
	follow := cmd.Flags().BoolP("follow", "f", false, "keep printing until the build ends")
	cmd.RunE = func(cmd *cobra.Command, a []string) error {
		if err := inv.need(a[0], access.RoleRead); err != nil {
			return err
		}
		n := 0
		if len(a) > 1 {
			var err error
			if _, err = fmt.Sscanf(strings.TrimPrefix(a[1], "#"), "%d", &n); err != nil || n < 1 {
				return errors.New("builds:output: N is a build number, e.g. 3 (list them with: builds " + a[0] + ")")
			}
		}
		if inv.isAdmin(a[0]) {
			return inv.h.Apps.BuildOutput(cmd.Context(), a[0], n, *follow, cmd.OutOrStdout())
		}
		w := &redactWriter{w: cmd.OutOrStdout(), secrets: inv.secretsOf(a[0])}
		err := inv.h.Apps.BuildOutput(cmd.Context(), a[0], n, *follow, w)
		w.Flush()
		return err
	}
	return cmd
}

func (inv *invocation) buildsCancel() *cobra.Command {
	return &cobra.Command{
		Use:   "builds:cancel APP",
		Short: "Stop the running build of an app (its push is rejected; the previous release keeps serving)",
		Args:  args([]string{"APP"}, 0),
		RunE: func(cmd *cobra.Command, a []string) error {
			if err := inv.need(a[0], access.RoleDeploy); err != nil {
				return err
			}
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
		},
	}
}

func (inv *invocation) appsUnlock() *cobra.Command {
	return &cobra.Command{
		Use: "apps:unlock APP",
		Short: "Free an app's build lease whoever holds it and cancel the build holding it (its push is rejected); " +
			"a crashed server's lease also expires by itself",
		Args: args([]string{"APP"}, 0),
		RunE: func(cmd *cobra.Command, a []string) error {
			if err := inv.need(a[0], access.RoleAdmin); err != nil {
				return err
			}
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
		},
	}
}
