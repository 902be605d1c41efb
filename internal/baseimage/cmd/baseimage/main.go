// Command baseimage builds kpush's base image from Debian packages (kpush.dev/kpush/internal/
// baseimage) and pushes it to a registry; `make image` runs it before ko builds kpush onto
// the result. It prints the pushed image as REPOSITORY@sha256:DIGEST on stdout, progress on
// stderr.
//
// Usage: go run ./internal/baseimage/cmd/baseimage --repo 127.0.0.1:5000/kpush-base [--tag latest]
//
//	[--packages ca-certificates,dash,...] [--cache DIR]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"kpush.dev/kpush/internal/baseimage"
)

func main() {
	repo := flag.String("repo", "", "repository to push to, e.g. 127.0.0.1:5000/kpush-base (plain HTTP for loopback)")
	tag := flag.String("tag", "latest", "tag to push")
	pkgs := flag.String("packages", strings.Join(baseimage.DefaultPackages, ","), "comma-separated Debian packages (no dependency resolution: list the closure)")
	cache := flag.String("cache", "", "directory for downloaded .deb files (default $XDG_CACHE_HOME/kpush/debs)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *repo, *tag, *pkgs, *cache); err != nil {
		fmt.Fprintln(os.Stderr, "baseimage:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, repo, tag, pkgs, cache string) error {
	if repo == "" {
		return fmt.Errorf("--repo is empty: give the repository to push to, e.g. --repo 127.0.0.1:5000/kpush-base")
	}
	ref, err := name.NewTag(repo + ":" + tag)
	if err != nil {
		return fmt.Errorf("parsing --repo %q and --tag %q: %w", repo, tag, err)
	}
	img, debs, err := baseimage.Build(ctx, baseimage.Options{
		Packages: strings.Split(pkgs, ","),
		CacheDir: cache,
		Stderr:   os.Stderr,
	})
	if err != nil {
		return err
	}
	for _, d := range debs {
		fmt.Fprintf(os.Stderr, "baseimage: %s %s %s\n", d.Package, d.Version, d.Arch)
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("pushing the base image to %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Println(ref.Context().Digest(d.String()).String())
	return nil
}
