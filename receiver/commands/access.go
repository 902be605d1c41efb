package commands

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"kpush.dev/kpush/gitserver/access"
)

// maxKeyInput bounds what keys:add reads from stdin: an authorized_keys line of the largest
// accepted key (RSA 16384) is about 3 KiB.
const maxKeyInput = 64 << 10

// accessCommands are about users, their keys and their roles on apps, kept by
// Handler.Access. Any user manages their own keys, server admins anyone's (--user); server
// admins manage users; admins of an app manage its grants.
var accessCommands = []spec{
	{Use: "keys", Short: "List your SSH keys (server admins: anyone's with --user)",
		Role: registered, JSON: true, Run: (*invocation).keys,
		Flags: func(f *pflag.FlagSet) { f.String("user", "", "the user whose keys to list (server admins)") }},
	{Use: "keys:add NAME", Short: "Register the SSH public key on stdin as NAME (server admins: for anyone with --user)",
		Example: "  ssh git@HOST keys:add laptop < ~/.ssh/id_ed25519.pub\n" +
			"  ssh git@HOST keys:add laptop --user bob < bob.pub",
		Role: registered, Args: []string{"NAME"}, Run: (*invocation).keysAdd,
		Flags: func(f *pflag.FlagSet) { f.String("user", "", "register the key for this user (server admins)") }},
	{Use: "keys:remove NAME|FINGERPRINT", Short: "Remove one of your SSH keys (server admins: anyone's with --user)",
		Role: registered, Args: []string{"NAME|FINGERPRINT"}, Run: (*invocation).keysRemove,
		Flags: func(f *pflag.FlagSet) { f.String("user", "", "remove a key of this user (server admins)") }},
	{Use: "users", Short: "List users", Role: registered, JSON: true, Run: (*invocation).users},
	{Use: "users:add USER", Short: "Create a user (server admins); then register their key with keys:add NAME --user USER",
		Example: "  ssh git@HOST users:add bob\n  ssh git@HOST keys:add laptop --user bob < bob.pub",
		Role:    serverAdmin, Denied: "add users", Args: []string{"USER"}, Run: (*invocation).usersAdd,
		Flags: func(f *pflag.FlagSet) {
			f.Bool("admin", false, "make the user a server admin (every role on every app; manages users and keys)")
		}},
	{Use: "users:remove USER", Short: "Delete a user with their keys and grants (server admins)",
		Role: serverAdmin, Denied: "remove users", Args: []string{"USER"}, Run: (*invocation).usersRemove},
	{Use: "apps:grant APP USER ROLE", Short: "Give USER a role on APP: read (clone), deploy (push, rollback, rebuild) or admin (config, grants, destroy)",
		Role: appAdmin, Args: []string{"APP", "USER", "ROLE"}, Run: (*invocation).appsGrant},
	{Use: "apps:revoke APP USER", Short: "Take USER's role on APP away",
		Role: appAdmin, Args: []string{"APP", "USER"}, Run: (*invocation).appsRevoke},
	{Use: "apps:access APP", Short: "List who has which role on APP (server admins have every role without a grant)",
		Role: appRead, Args: []string{"APP"}, JSON: true, Run: (*invocation).appsAccess},
}

// target is the user a keys command acts on: the caller, or --user for server admins.
func (inv *invocation) target(cmd *cobra.Command) (string, error) {
	me, err := inv.me()
	if err != nil {
		return "", err
	}
	other, _ := cmd.Flags().GetString("user")
	if !cmd.Flags().Changed("user") || other == me.Name {
		return me.Name, nil
	}
	if !me.Admin {
		return "", fmt.Errorf("only server admins may act on another user's keys (--user %s); leave out --user for your own", other)
	}
	if _, err := inv.h.Access.User(other); err != nil {
		return "", err
	}
	return other, nil
}

func (inv *invocation) keys(cmd *cobra.Command, _ []string) error {
	user, err := inv.target(cmd)
	if err != nil {
		return err
	}
	keys, err := inv.h.Access.Keys(user)
	if err != nil {
		return err
	}
	if wantJSON(cmd) {
		return printJSON(cmd.OutOrStdout(), keys)
	}
	if len(keys) == 0 {
		fmt.Fprintf(cmd.OutOrStdout(), "%s has no keys\n", user)
		return nil
	}
	tw := table(cmd.OutOrStdout())
	fmt.Fprintln(tw, "NAME\tTYPE\tFINGERPRINT\tADDED")
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.Name, k.Type, k.Fingerprint, day(k.Added))
	}
	return tw.Flush()
}

func (inv *invocation) keysAdd(cmd *cobra.Command, a []string) error {
	user, err := inv.target(cmd)
	if err != nil {
		return err
	}
	send := fmt.Sprintf("%s keys:add %s < ~/.ssh/id_ed25519.pub", inv.h.ssh(), a[0])
	if cmd.Flags().Changed("user") {
		send = fmt.Sprintf("%s keys:add %s --user %s < %s.pub", inv.h.ssh(), a[0], user, user)
	}
	if inv.terminal {
		return fmt.Errorf("keys:add reads the public key from stdin, and with ssh -t that is your terminal; send the .pub file instead:\n  %s", send)
	}
	line, err := readKey(cmd.Context(), cmd.InOrStdin(), keyWait)
	if errors.Is(err, errNoKeyArrived) {
		return fmt.Errorf("no public key arrived on stdin within %s; keys:add reads one from stdin, send the .pub file:\n  %s", keyWait, send)
	}
	if err != nil {
		return fmt.Errorf("reading the public key from stdin: %w", err)
	}
	if len(line) > maxKeyInput {
		return fmt.Errorf("stdin holds more than %d KiB: send one public key (a .pub file)", maxKeyInput>>10)
	}
	k, err := inv.h.Access.AddKey(user, a[0], line)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "added %s key %s (%s) for %s\n", k.Type, k.Name, k.Fingerprint, user)
	return nil
}

// keyWait is how long keys:add waits for the first byte of a key on stdin: someone who ran it
// without "< key.pub" would otherwise wait for nothing, ssh forwarding their silent terminal.
var keyWait = 10 * time.Second

// keyRead bounds the whole read once a key started to arrive.
const keyRead = time.Minute

var errNoKeyArrived = errors.New("no public key arrived on stdin")

// readKey reads stdin to its end (at most maxKeyInput+1 bytes), or gives up with
// errNoKeyArrived when nothing at all came within wait.
func readKey(ctx context.Context, stdin io.Reader, wait time.Duration) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	first := make(chan struct{})
	done := make(chan result, 1)
	go func() { // left blocked on stdin when it gives up: the session's end unblocks it
		b, err := io.ReadAll(&notifyReader{r: io.LimitReader(stdin, maxKeyInput+1), first: first})
		done <- result{b, err}
	}()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.b, r.err
	case <-first:
	case <-timer.C:
		return nil, errNoKeyArrived
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	select {
	case r := <-done:
		return r.b, r.err
	case <-time.After(keyRead):
		return nil, fmt.Errorf("the key was still arriving after %s", keyRead)
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// notifyReader closes first at the first byte read through it (or its end).
type notifyReader struct {
	r     io.Reader
	first chan struct{}
	once  bool
}

func (n *notifyReader) Read(p []byte) (int, error) {
	k, err := n.r.Read(p)
	if (k > 0 || err != nil) && !n.once {
		n.once = true
		close(n.first)
	}
	return k, err
}

func (inv *invocation) keysRemove(cmd *cobra.Command, a []string) error {
	user, err := inv.target(cmd)
	if err != nil {
		return err
	}
	if err := inv.h.Access.RemoveKey(user, a[0]); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "removed key %s of %s\n", a[0], user)
	return nil
}

func (inv *invocation) users(cmd *cobra.Command, _ []string) error {
	users := inv.h.Access.Users()
	if wantJSON(cmd) {
		return printJSON(cmd.OutOrStdout(), users)
	}
	tw := table(cmd.OutOrStdout())
	fmt.Fprintln(tw, "NAME\tSERVER ADMIN\tCREATED")
	for _, u := range users {
		admin := "no"
		if u.Admin {
			admin = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", u.Name, admin, day(u.Created))
	}
	return tw.Flush()
}

func (inv *invocation) usersAdd(cmd *cobra.Command, a []string) error {
	admin, _ := cmd.Flags().GetBool("admin")
	u, err := inv.h.Access.AddUser(a[0], admin)
	if err != nil {
		return err
	}
	what := "user"
	if u.Admin {
		what = "server admin"
	}
	fmt.Fprintf(cmd.OutOrStdout(), "added %s %s; register their key with: %s keys:add NAME --user %s < key.pub\n", what, u.Name, inv.h.ssh(), u.Name)
	return nil
}

func (inv *invocation) usersRemove(cmd *cobra.Command, a []string) error {
	if err := inv.h.Access.RemoveUser(a[0]); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "removed user %s with their keys and grants\n", a[0])
	return nil
}

func (inv *invocation) appsGrant(cmd *cobra.Command, a []string) error {
	app, user := a[0], a[1]
	role, err := access.ParseRole(a[2])
	if err != nil {
		return err
	}
	// A grant on an app that does not exist would go to whoever creates it next.
	if _, err := inv.h.Apps.App(app); err != nil {
		return fmt.Errorf("cannot grant a role on %s: %w", app, err)
	}
	if err := inv.h.Access.SetGrant(app, user, role); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s now has the %s role on %s\n", user, role, app)
	return nil
}

func (inv *invocation) appsRevoke(cmd *cobra.Command, a []string) error {
	app, user := a[0], a[1]
	if err := inv.lastAdmin(app, user); err != nil {
		return err
	}
	if err := inv.h.Access.Revoke(app, user); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s no longer has a role on %s\n", user, app)
	return nil
}

// lastAdmin refuses to revoke user's role on app when user is the app's only admin by grant
// and the caller is not a server admin (who keeps every role anyway): nobody but server admins
// could manage the app after it.
func (inv *invocation) lastAdmin(app, user string) error {
	if me, err := inv.me(); err != nil || me.Admin {
		return nil
	}
	admins := 0
	isAdmin := false
	for _, g := range inv.h.Access.Grants(app) {
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

func (inv *invocation) appsAccess(cmd *cobra.Command, a []string) error {
	app := a[0]
	grants := inv.h.Access.Grants(app)
	if wantJSON(cmd) {
		return printJSON(cmd.OutOrStdout(), grants)
	}
	if len(grants) == 0 {
		fmt.Fprintf(cmd.OutOrStdout(), "nobody has a role on %s; server admins have every role\n", app)
		return nil
	}
	tw := table(cmd.OutOrStdout())
	fmt.Fprintln(tw, "USER\tROLE")
	for _, g := range grants {
		fmt.Fprintf(tw, "%s\t%s\n", g.User, g.Role)
	}
	return tw.Flush()
}
