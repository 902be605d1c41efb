package access

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// maxKeyInput bounds what keys:add reads from stdin: an authorized_keys line of the largest
// accepted key (RSA 16384) is about 3 KiB.
const maxKeyInput = 64 << 10

// Commands returns the SSH commands about users, keys and grants, run as caller (a registered
// user): keys, keys:add, keys:remove, users, users:add, users:remove, apps:grant, apps:revoke,
// apps:access. Add them to a root command built for one SSH session. Who may do what:
//   - keys, keys:add, keys:remove: any user, on their own keys; server admins on anyone's with
//     --user USER.
//   - users: any user; users:add and users:remove: server admins.
//   - apps:grant, apps:revoke: admins of the app and server admins; apps:access: readers of it.
//
// List commands print a table, or JSON with --json (their own flag, or an inherited persistent
// flag named "json"): keys → []Key, users → []User, apps:access → []Grant. Errors are returned
// (not printed) with text for people; the caller's root prints them.
func (s *Store) Commands(caller string) []*cobra.Command {
	c := &commands{s: s, caller: caller}
	return []*cobra.Command{c.keys(), c.keysAdd(), c.keysRemove(), c.users(), c.usersAdd(), c.usersRemove(),
		c.appsGrant(), c.appsRevoke(), c.appsAccess()}
}

type commands struct {
	s      *Store
	caller string
}

func (c *commands) me() (User, error) {
	u, err := c.s.User(c.caller)
	if err != nil {
		return User{}, fmt.Errorf("you (%s) are no longer a registered user", c.caller)
	}
	return u, nil
}

// target is the user a keys command acts on: the caller, or --user for server admins.
func (c *commands) target(cmd *cobra.Command) (string, error) {
	me, err := c.me()
	if err != nil {
		return "", err
	}
	f := cmd.Flags().Lookup("user")
	if f == nil || !f.Changed || f.Value.String() == me.Name {
		return me.Name, nil
	}
	if !me.Admin {
		return "", fmt.Errorf("only server admins may act on another user's keys (--user %s); leave out --user for your own", f.Value.String())
	}
	if _, err := c.s.User(f.Value.String()); err != nil {
		return "", err
	}
	return f.Value.String(), nil
}

func (c *commands) requireServerAdmin(what string) error {
	me, err := c.me()
	if err != nil {
		return err
	}
	if !me.Admin {
		return fmt.Errorf("only server admins may %s; you are %s", what, me.Name)
	}
	return nil
}

// wantJSON reads the "json" flag, whether defined on cmd or inherited from a parent.
func wantJSON(cmd *cobra.Command) bool {
	f := cmd.Flags().Lookup("json")
	if f == nil {
		f = cmd.InheritedFlags().Lookup("json")
	}
	return f != nil && f.Value.String() == "true"
}

func addJSONFlag(cmd *cobra.Command) {
	cmd.Flags().Bool("json", false, "print JSON instead of a table")
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

func day(t time.Time) string { return t.UTC().Format("2006-01-02") }

func (c *commands) keys() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "List your SSH keys (server admins: anyone's with --user)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			user, err := c.target(cmd)
			if err != nil {
				return err
			}
			keys, err := c.s.Keys(user)
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
		},
	}
	cmd.Flags().String("user", "", "the user whose keys to list (server admins)")
	addJSONFlag(cmd)
	return cmd
}

func (c *commands) keysAdd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys:add NAME",
		Short: "Register the SSH public key on stdin as NAME (server admins: for anyone with --user)",
		Example: "  ssh git@HOST keys:add laptop < ~/.ssh/id_ed25519.pub\n" +
			"  ssh git@HOST keys:add laptop --user bob < bob.pub",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			user, err := c.target(cmd)
			if err != nil {
				return err
			}
			line, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxKeyInput+1))
			if err != nil {
				return fmt.Errorf("reading the public key from stdin: %w", err)
			}
			if len(line) > maxKeyInput {
				return fmt.Errorf("stdin holds more than %d KiB: send one public key (a .pub file)", maxKeyInput>>10)
			}
			k, err := c.s.AddKey(user, args[0], line)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "added %s key %s (%s) for %s\n", k.Type, k.Name, k.Fingerprint, user)
			return nil
		},
	}
	cmd.Flags().String("user", "", "register the key for this user (server admins)")
	return cmd
}

func (c *commands) keysRemove() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys:remove NAME|FINGERPRINT",
		Short: "Remove one of your SSH keys (server admins: anyone's with --user)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			user, err := c.target(cmd)
			if err != nil {
				return err
			}
			if err := c.s.RemoveKey(user, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed key %s of %s\n", args[0], user)
			return nil
		},
	}
	cmd.Flags().String("user", "", "remove a key of this user (server admins)")
	return cmd
}

func (c *commands) users() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "users",
		Short: "List users",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := c.me(); err != nil {
				return err
			}
			users := c.s.Users()
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
		},
	}
	addJSONFlag(cmd)
	return cmd
}

func (c *commands) usersAdd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "users:add USER",
		Short:   "Create a user (server admins); then register their key with keys:add NAME --user USER",
		Example: "  ssh git@HOST users:add bob\n  ssh git@HOST keys:add laptop --user bob < bob.pub",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := c.requireServerAdmin("add users"); err != nil {
				return err
			}
			admin, _ := cmd.Flags().GetBool("admin")
			u, err := c.s.AddUser(args[0], admin)
			if err != nil {
				return err
			}
			what := "user"
			if u.Admin {
				what = "server admin"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "added %s %s; register their key with: keys:add NAME --user %s < key.pub\n", what, u.Name, u.Name)
			return nil
		},
	}
	cmd.Flags().Bool("admin", false, "make the user a server admin (every role on every app; manages users and keys)")
	return cmd
}

func (c *commands) usersRemove() *cobra.Command {
	return &cobra.Command{
		Use:   "users:remove USER",
		Short: "Delete a user with their keys and grants (server admins)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := c.requireServerAdmin("remove users"); err != nil {
				return err
			}
			if err := c.s.RemoveUser(args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed user %s with their keys and grants\n", args[0])
			return nil
		},
	}
}

func (c *commands) appsGrant() *cobra.Command {
	return &cobra.Command{
		Use:   "apps:grant APP USER ROLE",
		Short: "Give USER a role on APP: read (clone), deploy (push, rollback, rebuild) or admin (config, grants, destroy)",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			app, user := args[0], args[1]
			role, err := ParseRole(args[2])
			if err != nil {
				return err
			}
			if err := c.s.Authorize(c.caller, app, RoleAdmin); err != nil {
				return err
			}
			if err := c.s.SetGrant(app, user, role); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s now has the %s role on %s\n", user, role, app)
			return nil
		},
	}
}

func (c *commands) appsRevoke() *cobra.Command {
	return &cobra.Command{
		Use:   "apps:revoke APP USER",
		Short: "Take USER's role on APP away",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			app, user := args[0], args[1]
			if err := c.s.Authorize(c.caller, app, RoleAdmin); err != nil {
				return err
			}
			if err := c.s.Revoke(app, user); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s no longer has a role on %s\n", user, app)
			return nil
		},
	}
}

func (c *commands) appsAccess() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "apps:access APP",
		Short: "List who has which role on APP (server admins have every role without a grant)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			app := args[0]
			if err := c.s.Authorize(c.caller, app, RoleRead); err != nil {
				return err
			}
			grants := c.s.Grants(app)
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
		},
	}
	addJSONFlag(cmd)
	return cmd
}
