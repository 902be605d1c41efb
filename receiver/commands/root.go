// Package commands is kpush's SSH command line, Heroku/Dokku style:
// `ssh -p PORT git@HOST COMMAND [ARGS]`. A cobra command tree is built for every invocation
// with the caller bound to it. Every command is a spec (one file per family: apps.go,
// config.go, releases.go, builds.go, access.go) that declares the role it needs; build checks
// that role before the command runs. The app commands run the app operations of
// receiver.Pipeline, the access commands those of the access store.
package commands

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"kpush.dev/kpush/gitserver"
	"kpush.dev/kpush/gitserver/access"
	"kpush.dev/kpush/internal/term"
	"kpush.dev/kpush/receiver"
)

// Access is who may do what: the users, their keys and their roles per app. *access.Store
// implements it.
type Access interface {
	// Authorize returns nil when user holds need on app, a *access.DeniedError when they do
	// not, or another error for people.
	Authorize(user, app string, need access.Role) error
	User(name string) (access.User, error)
	Users() []access.User
	AddUser(name string, admin bool) (access.User, error)
	RemoveUser(name string) error
	Keys(user string) ([]access.Key, error)
	AddKey(user, name string, authorizedLine []byte) (access.Key, error)
	RemoveKey(user, nameOrFingerprint string) error
	Grants(app string) []access.Grant
	SetGrant(app, user string, role access.Role) error
	Revoke(app, user string) error
}

// Handler runs SSH commands. It implements gitserver.CommandHandler.
type Handler struct {
	Apps *receiver.Pipeline
	// Access checks roles and backs the user, key and grant commands; without it every
	// caller holds every role and those commands do not exist.
	Access Access
	// SSH is how people reach the server, for hints: "ssh -p 2222 git@127.0.0.1".
	SSH string
}

var _ gitserver.CommandHandler = (*Handler)(nil)

// RunCommand runs c.Args as the user c.User and returns the exit status: 0 on success, 1 with
// a message on c.Stderr otherwise; a usage error (unknown command, wrong arguments or flags)
// adds a hint to run help.
func (h *Handler) RunCommand(ctx context.Context, c *gitserver.Command) int {
	inv := &invocation{h: h, user: c.User, addr: c.Addr, terminal: c.Terminal}
	// Everything printed reaches a person's terminal: names, reasons, values and build logs
	// that others wrote show their control characters escaped (term.SanitizeText). JSON
	// needs nothing more: printJSON escapes every control character inside its strings.
	stdout, stderr := term.NewWriter(c.Stdout), term.NewWriter(c.Stderr)
	defer stdout.Flush()
	defer stderr.Flush()
	root := inv.root()
	root.SetArgs(c.Args)
	root.SetIn(c.Stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	stdout.Flush()
	if err == nil {
		return 0
	}
	err = inv.hideApps(err)
	fmt.Fprintln(stderr, strings.TrimRight(err.Error(), "\n"))
	if !inv.ran {
		fmt.Fprintf(stderr, "run `%s help` for the list of commands, `%s help COMMAND` for one\n", h.ssh(), h.ssh())
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
	// terminal: the client asked for a PTY, so stdin is what a person types (keys:add refuses it)
	terminal bool

	secrets map[string][]string // per app, for readers: values to hide (secretsOf)
}

// role is what a command needs of its caller; build checks it (authorize) before the
// command runs. The zero value is no role: a spec that leaves Role out is refused to everyone.
type role int

const (
	_           role = iota
	anyone           // nothing checked: apps (which lists what the caller may read), apps:create
	registered       // the caller is still a registered user (keys, users)
	appRead          // the read role on the app named by the first argument
	appDeploy        // the deploy role on it
	appAdmin         // the admin role on it
	serverAdmin      // a server admin (users:add, users:remove)
)

// appRoles are the access roles of the app-scoped roles.
var appRoles = map[role]access.Role{appRead: access.RoleRead, appDeploy: access.RoleDeploy, appAdmin: access.RoleAdmin}

// spec is one SSH command: its usage, the role it needs, its arguments and what it runs.
type spec struct {
	Use, Short, Example string
	Role                role
	Denied              string   // serverAdmin: what the refusal says only server admins may do ("add users")
	Args                []string // the required arguments, named as in Use
	More                int      // how many optional arguments may follow them; -1: any number
	JSON                bool     // takes --json (read with wantJSON)
	Flags               func(*pflag.FlagSet)
	Run                 func(inv *invocation, cmd *cobra.Command, args []string) error
}

// specs are the commands of every family; access ones only with a Handler.Access.
func (inv *invocation) specs() []spec {
	all := slices.Concat(appsCommands, configCommands, releasesCommands, buildsCommands)
	if inv.h.Access != nil {
		all = append(all, accessCommands...)
	}
	return all
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
	for _, s := range inv.specs() {
		root.AddCommand(inv.build(s))
	}
	return root
}

// build makes the cobra command of s: its arguments are checked against s.Args and s.More,
// then the caller's role (authorize), then s.Run runs.
func (inv *invocation) build(s spec) *cobra.Command {
	cmd := &cobra.Command{
		Use:     s.Use,
		Short:   s.Short,
		Example: s.Example,
		Args:    args(s.Args, s.More),
		RunE: func(cmd *cobra.Command, a []string) error {
			if err := inv.authorize(s, a); err != nil {
				return err
			}
			return s.Run(inv, cmd, a)
		},
	}
	if s.JSON {
		cmd.Flags().Bool("json", false, "print JSON")
	}
	if s.Flags != nil {
		s.Flags(cmd.Flags())
	}
	return cmd
}

// authorize checks that the caller holds the role s needs; a, the arguments, name the app of
// an app role first. It is the one place roles are checked.
func (inv *invocation) authorize(s spec, a []string) error {
	switch s.Role {
	case anyone:
		return nil
	case registered:
		_, err := inv.me()
		return err
	case serverAdmin:
		me, err := inv.me()
		if err != nil {
			return err
		}
		if !me.Admin {
			return fmt.Errorf("only server admins may %s; you are %s", s.Denied, me.Name)
		}
		return nil
	}
	need, ok := appRoles[s.Role]
	if !ok || len(a) == 0 { // a spec mistake, which TestSpecsDeclareRolesAndArguments catches
		return fmt.Errorf("%s declares no role it needs, or an app role without taking an APP", s.Use)
	}
	return inv.need(a[0], need)
}

// me is the caller as a registered user; without an access store, nobody in particular.
func (inv *invocation) me() (access.User, error) {
	if inv.h.Access == nil {
		return access.User{Name: inv.user}, nil
	}
	u, err := inv.h.Access.User(inv.user)
	if err != nil {
		return access.User{}, fmt.Errorf("you (%s) are no longer a registered user", inv.user)
	}
	return u, nil
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

// hideApps turns an *access.DeniedError about an app the caller has no role on into "no app
// named APP, or you (USER) have no role on it"; a caller with a lesser role keeps the message
// naming the role they lack.
func (inv *invocation) hideApps(err error) error {
	denied, ok := errors.AsType[*access.DeniedError](err)
	if !ok || inv.h.Access == nil || denied.User != inv.user {
		return err
	}
	if inv.h.Access.Authorize(inv.user, denied.App, access.RoleRead) == nil {
		return err
	}
	return &access.NoAppError{User: inv.user, App: denied.App, Need: denied.Need, SSH: inv.h.ssh()}
}

// isAdmin reports whether the caller may see app's config values.
func (inv *invocation) isAdmin(app string) bool { return inv.need(app, access.RoleAdmin) == nil }

// help is `help [COMMAND]`: cobra's own prints "Unknown help topic" and exits 0.
func (inv *invocation) help() *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND]",
		Short: "Show the list of commands, or help for one",
		RunE: func(c *cobra.Command, args []string) error {
			root := c.Root()
			target, rest, err := root.Find(args)
			if err != nil || target == nil || len(rest) > 0 || (len(args) > 0 && target == root) {
				inv.ran = false // a usage error: RunCommand adds the hint to run help
				return fmt.Errorf("help: unknown command %q", strings.Join(args, " "))
			}
			target.InitDefaultHelpFlag()
			return target.Help()
		},
	}
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

// remoteURL is the git remote of app on the server the client reached at addr (host:port):
// "ssh://git@127.0.0.1:2222/demo", with HOST for an unknown address.
func remoteURL(addr, app string) string { return receiver.RemoteURL(addr, app) }

// wantJSON reports whether --json was given.
func wantJSON(cmd *cobra.Command) bool {
	v, _ := cmd.Flags().GetBool("json")
	return v
}

// printJSON writes v as indented JSON. encoding/json escapes C0 controls in strings but not
// DEL or the C1 controls (U+0080–U+009F), which terminals obey too: those are escaped here as
// well ("\u009b"), so a value keeps its exact content and none reaches a terminal raw.
func printJSON(w io.Writer, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := io.WriteString(w, escapeJSONControls(b.String()))
	return err
}

// escapeJSONControls writes DEL and the C1 controls of encoded JSON as \u escapes: outside
// strings JSON has none, so every one is inside a string, where the escape means the same.
func escapeJSONControls(s string) string {
	if !strings.ContainsFunc(s, isC1OrDEL) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isC1OrDEL(r) {
			fmt.Fprintf(&b, `\u%04x`, r)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

func isC1OrDEL(r rune) bool { return r >= 0x7f && r <= 0x9f }

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// stamp is a time in the release and build tables; day a date in the key and user tables.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func day(t time.Time) string { return t.UTC().Format("2006-01-02") }

func short(oid string) string {
	if len(oid) > 7 {
		return oid[:7]
	}
	if oid == "" {
		return "-"
	}
	return oid
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
