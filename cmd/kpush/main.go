// Command kpush is a Heroku-style `git push` server for Knative: `git push` over SSH builds
// the pushed commit with Cloud Native Buildpacks and deploys it as a Knative Service.
//
//	kpush dev     everything on one machine, no cluster
//	kpush serve   cluster mode: Knative Services in a namespace
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := &cobra.Command{
		Use:           "kpush",
		Short:         "Heroku-style git push deploys to Knative, built with Cloud Native Buildpacks",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(devCommand(), serveCommand(), hookCommand())
	root.AddCommand(sourceCommand())
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "kpush:", err)
		os.Exit(1)
	}
}

// envAnnotation is the pflag annotation naming the environment variable a flag defaults to
// (bindEnv).
const envAnnotation = "kpush.dev/env"

// bindEnv names, for each flag of fs in vars (flag name → variable), the environment variable
// that supplies its default; applyEnv applies them.
func bindEnv(fs *pflag.FlagSet, vars map[string]string) {
	for name, v := range vars {
		if err := fs.SetAnnotation(name, envAnnotation, []string{v}); err != nil {
			panic(err) // no such flag: a mistake in this package
		}
	}
}

// applyEnv sets each flag of fs that has an environment variable (bindEnv) from it, when
// the variable is set and the flag was not given: defaults ← KPUSH_* env ← flags. The value
// goes through the flag's own parser, so a value the flag would refuse fails start-up too,
// naming the variable: KPUSH_LEASE_TTL="10": time: missing unit in duration "10"; …. A list
// flag takes a ':'-separated list (filepath.SplitList).
func applyEnv(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		vars := f.Annotations[envAnnotation]
		if len(vars) == 0 || f.Changed {
			return
		}
		v, ok := lookup(vars[0])
		if !ok {
			return
		}
		var err error
		if list, isList := f.Value.(pflag.SliceValue); isList {
			err = list.Replace(filepath.SplitList(v))
		} else {
			err = f.Value.Set(v)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w; it sets --%s: want a %s, e.g. %s", vars[0], v, err, f.Name, f.Value.Type(), f.DefValue))
		}
	})
	return errors.Join(errs...)
}

// envPreRun is the PreRunE of commands with environment defaults: it applies them
// (applyEnv) once the command line is parsed.
func envPreRun(cmd *cobra.Command, _ []string) error { return applyEnv(cmd.Flags(), os.LookupEnv) }
