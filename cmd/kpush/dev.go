package main

import (
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/spf13/cobra"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/deployer/local"
	"kpush.dev/kpush/internal/ops"
	"kpush.dev/kpush/receiver"
	"kpush.dev/kpush/state/lease"
)

// devCommand is `kpush dev`: SSH git server, a local registry process, local builds and the
// local runtime behind the router — one machine, no cluster.
func devCommand() *cobra.Command {
	var (
		c            gitConfig
		httpAddr     string
		registryPort int
		buildpacks   []string
		logc         logConfig
		opsAddr      *string
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run kpush on this machine with no cluster: git push builds and runs apps locally",
		Long: `kpush dev runs the whole of kpush on one machine: the SSH git server, a local OCI
registry (distribution), CNB builds under bubblewrap and a local runtime that stands in for
Knative, with apps at http://APP.localhost:PORT/ through a built-in router.`,
		Args:    cobra.NoArgs,
		PreRunE: envPreRun,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log, err := logc.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if len(c.AuthorizedKeys) == 0 {
				c.AuthorizedKeys = userPublicKeys()
			}
			if err := c.validate(); err != nil {
				return err
			}
			routerPort, err := portOf(httpAddr)
			if err != nil || routerPort == 0 {
				return fmt.Errorf("--http-addr %q: want HOST:PORT with a fixed port, e.g. 127.0.0.1:8080", httpAddr)
			}
			if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
				return err
			}
			if err := checkSandbox(ctx, c.DataDir, log); err != nil {
				return err
			}

			reg, err := local.StartRegistry(ctx, local.RegistryConfig{DataDir: c.DataDir, Port: registryPort, Log: log})
			if err != nil {
				return fmt.Errorf("starting the local registry: %w", err)
			}
			defer reg.Close()
			log.Info("registry", "addr", reg.Addr())
			m, inflight := ops.NewMetrics(), &ops.Tracker{}
			rc, err := registryCheck(reg.Addr() + "/kpush")
			if err != nil {
				return err
			}
			shutdownOps, err := startOps(ctx, *opsAddr, log, m, ops.DialCheck("ssh", c.SSHAddr), rc)
			if err != nil {
				return err
			}
			defer stopOps(shutdownOps, log)

			rt, err := local.New(local.Config{DataDir: c.DataDir, RouterPort: routerPort, Keychain: reg.Keychain(), Log: log})
			if err != nil {
				return err
			}
			defer rt.Close()
			hl, err := net.Listen("tcp", httpAddr)
			if err != nil {
				return fmt.Errorf("listening for HTTP: %w", err)
			}
			hs := &http.Server{Handler: rt.Router(), ReadHeaderTimeout: 10 * time.Second}
			go hs.Serve(hl)
			defer hs.Close()
			if err := rt.Restore(ctx); err != nil {
				log.Warn("restoring apps", "err", err)
			}

			builder := &buildpack.Local{DataDir: c.DataDir, Log: log}
			builder.RegistryUsername, builder.RegistryPassword = reg.Credentials()
			if len(buildpacks) > 0 {
				if builder.ExtraBuildpacks, builder.Order, err = extraBuildpacks(buildpacks); err != nil {
					return err
				}
			}
			// Leases are files in the data dir, so two dev processes sharing it are safe too.
			leases, err := lease.NewFile(filepath.Join(c.DataDir, "state", "leases"), lease.WithTTL(c.LeaseTTL), lease.WithLogger(log))
			if err != nil {
				return err
			}
			p := &receiver.Pipeline{
				Builder:  builder,
				Deployer: rt,
				Leases:   leases,
				Registry: reg.Addr() + "/kpush",
				// apps:destroy deletes the app's images with kpush's login.
				RegistryOptions: []remote.Option{remote.WithAuthFromKeychain(reg.Keychain())},
				// Builds hold it; apps:destroy has it collect the garbage it leaves.
				RegistryGC: reg,
				WorkDir:    filepath.Join(c.DataDir, "tmp"),
				Log:        log,
				Metrics:    m,
				Inflight:   inflight,
			}
			if err := os.MkdirAll(p.WorkDir, 0o700); err != nil {
				return err
			}
			return serveGit(ctx, c, p, log, func(hostKey string) {
				w := cmd.ErrOrStderr()
				fmt.Fprintf(w, "kpush dev: git push to ssh://git@%s/APP, apps at http://APP.localhost:%d/\n", c.SSHAddr, routerPort)
				fmt.Fprintf(w, "kpush dev: SSH host key %s (ssh shows it on the first connection)\n", hostKey)
			})
		},
	}
	c.flags(cmd.Flags(), defaultDataDir(), "127.0.0.1:2222", 30*time.Second)
	logc.flags(cmd.Flags(), "text")
	opsAddr = opsFlags(cmd.Flags(), "127.0.0.1:0")
	cmd.Flags().StringVar(&httpAddr, "http-addr", "127.0.0.1:8080", "address of the router that serves apps as http://APP.localhost:PORT/ (env KPUSH_HTTP_ADDR)")
	bindEnv(cmd.Flags(), map[string]string{"http-addr": "KPUSH_HTTP_ADDR"})
	cmd.Flags().StringArrayVar(&buildpacks, "buildpack", nil, "directory of an extra buildpack (buildpack.toml, bin/detect, bin/build), run as optional in front of every group of the default order; repeatable")
	cmd.Flags().IntVar(&registryPort, "registry-port", 0, "port of the local registry on 127.0.0.1 (default: a free one, kept in the data dir)")
	return cmd
}

func defaultDataDir() string {
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".kpush")
}

// userPublicKeys returns ~/.ssh/*.pub, the default authorized keys of `kpush dev`.
func userPublicKeys() []string {
	home, err := os.UserHomeDir()
	if err != nil {
		return nil
	}
	keys, _ := filepath.Glob(filepath.Join(home, ".ssh", "*.pub"))
	return keys
}

// extraBuildpacks loads the buildpack directories dirs and returns them with kpush's default
// order, each of them added as optional in front of every group, in the order given.
func extraBuildpacks(dirs []string) ([]fs.FS, []buildpack.Group, error) {
	var (
		bps   []fs.FS
		front buildpack.Group
	)
	for _, d := range dirs {
		var desc struct {
			Buildpack struct {
				ID      string `toml:"id"`
				Version string `toml:"version"`
			} `toml:"buildpack"`
		}
		if _, err := toml.DecodeFile(filepath.Join(d, "buildpack.toml"), &desc); err != nil {
			return nil, nil, fmt.Errorf("--buildpack %s: reading buildpack.toml: %w", d, err)
		}
		if desc.Buildpack.ID == "" {
			return nil, nil, fmt.Errorf("--buildpack %s: buildpack.toml has no [buildpack] id", d)
		}
		bps = append(bps, os.DirFS(d))
		front = append(front, buildpack.GroupEntry{ID: desc.Buildpack.ID, Optional: true})
	}
	var order []buildpack.Group
	for _, g := range buildpack.DefaultOrder() {
		order = append(order, append(append(buildpack.Group{}, front...), g...))
	}
	return bps, order, nil
}
