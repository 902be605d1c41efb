// Command kpush is a Heroku-style `git push` server for Knative: `git push` over SSH builds
// the pushed commit with Cloud Native Buildpacks and deploys it as a Knative Service.
//
//	kpush dev     everything on one machine, no cluster
//	kpush serve   cluster mode: Knative Services in a namespace
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
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

// envOr returns $KPUSH_<name> when set, else def: flags default to the environment, so
// defaults ← KPUSH_* env ← flags.
func envOr(name, def string) string {
	if v, ok := os.LookupEnv("KPUSH_" + name); ok {
		return v
	}
	return def
}

// envDuration is envOr for durations: $KPUSH_<name> when set and valid, else def.
func envDuration(name string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv("KPUSH_" + name); ok {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}
