package receiver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"kpush.dev/kpush/deployer"
)

// Destroy removes app for good: the running release (when the Deployer implements
// deployer.Destroyer), the repository with every release's source, the build cache (when the
// Builder implements AppForgetter), the grants, the state and the app's images in the
// registry (deleteImages). What it removed is told to out.
func (p *Pipeline) Destroy(ctx context.Context, app string, out io.Writer) error {
	if _, err := p.App(app); err != nil {
		return err
	}
	// The build lease and the release lock: no build or deploy of the app runs meanwhile.
	l, err := p.leases().Acquire(ctx, app, "apps:destroy", nil)
	if err != nil {
		return userErrorf("gave up waiting for the running build of %s: %v", app, err)
	}
	defer l.Release(context.WithoutCancel(ctx))
	unlock, err := p.Store.LockRelease(ctx, app, "apps:destroy", nil)
	if err != nil {
		return err
	}
	defer unlock()
	if d, ok := p.Deployer.(deployer.Destroyer); ok {
		if err := d.Destroy(ctx, app); err != nil {
			return p.internal(app, "stopping the app", err)
		}
	}
	images := p.releaseImages(app) // read before the state goes
	if err := p.Store.RemoveApp(app); err != nil {
		return p.internal(app, "removing the app's state", err)
	}
	if p.Repos != nil {
		if err := p.Repos.DeleteRepo(app); err != nil {
			return p.internal(app, "removing the repository", err)
		}
	}
	// The build cache, so that the next app of this name starts cold rather than with
	// layers (and whatever they hold) of the destroyed one.
	if f, ok := p.Builder.(AppForgetter); ok {
		if err := f.ForgetApp(app); err != nil {
			return p.internal(app, "removing the app's build cache", err)
		}
	}
	if p.Access != nil {
		if err := p.Access.RemoveApp(app); err != nil {
			return p.internal(app, "removing the app's grants", err)
		}
	}
	if p.Registry != "" {
		repo := p.Registry + "/" + app
		n, err := p.deleteImagesHeld(ctx, repo, images)
		switch {
		case err != nil:
			fmt.Fprintf(out, "Could not delete the images of %s from the registry (%s); the server log has details\n", app, repo)
		case n == 0:
			fmt.Fprintf(out, "No images of %s left in the registry (%s)\n", app, repo)
		case p.RegistryGC != nil:
			fmt.Fprintf(out, "Deleted %d image manifests of %s from the registry (%s); their layers are freed as soon as no build is using the registry\n", n, app, repo)
			p.RegistryGC.CollectGarbage()
		default:
			fmt.Fprintf(out, "Deleted %d image manifests of %s from the registry (%s); the registry frees their layers at its next garbage collection\n", n, app, repo)
		}
	}
	p.logger().Info("app destroyed", "app", app)
	return nil
}

// releaseImages returns the digests of app's release images (they may have no tag left).
func (p *Pipeline) releaseImages(app string) []string {
	rels, _ := p.Store.Releases(app)
	var out []string
	for _, r := range rels {
		if _, d, ok := strings.Cut(r.Image, "@"); ok && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// deleteImages deletes from the registry repository repo ("127.0.0.1:5000/kpush/demo") the
// manifests of every tag (OCI distribution spec: GET /v2/<name>/tags/list, then DELETE
// /v2/<name>/manifests/<digest>) and of the given digests, and returns how many it deleted. A
// repository or manifest that is gone already (404), and a registry that does not allow
// deletes (405 UNSUPPORTED), are logged and skipped. Authentication: RegistryOptions, else
// the default keychain (~/.docker/config.json).
func (p *Pipeline) deleteImages(ctx context.Context, repo string, digests []string) (int, error) {
	log := p.logger().With("repository", repo)
	r, err := name.NewRepository(repo)
	if err != nil {
		log.Error("parsing the app's image repository", "err", err)
		return 0, err
	}
	opts := append([]remote.Option{remote.WithContext(ctx)}, p.RegistryOptions...)
	if len(p.RegistryOptions) == 0 {
		opts = append(opts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	}
	skip := func(err error) bool {
		var te *transport.Error
		if errors.As(err, &te) && (te.StatusCode == http.StatusNotFound || te.StatusCode == http.StatusMethodNotAllowed) {
			log.Info("registry: nothing to delete or deletes not supported; skipping", "err", err)
			return true
		}
		return false
	}
	tags, err := remote.List(r, opts...)
	if err != nil && !skip(err) {
		log.Error("listing the app's image tags", "err", err)
		return 0, err
	}
	for _, t := range tags {
		d, err := remote.Head(r.Tag(t), opts...)
		if err != nil {
			if !skip(err) {
				log.Warn("reading an image tag", "tag", t, "err", err)
			}
			continue
		}
		if ds := d.Digest.String(); !slices.Contains(digests, ds) {
			digests = append(digests, ds)
		}
	}
	n := 0
	var firstErr error
	for _, d := range digests {
		err := remote.Delete(r.Digest(d), opts...)
		switch {
		case err == nil:
			n++
			log.Info("deleted an image manifest", "digest", d)
		case skip(err):
		default:
			log.Warn("deleting an image manifest", "digest", d, "err", err)
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	return n, firstErr
}

// deleteImagesHeld is deleteImages with the registry held (RegistryGC), so that a garbage
// collection does not stop the registry under the deletes.
func (p *Pipeline) deleteImagesHeld(ctx context.Context, repo string, digests []string) (int, error) {
	if p.RegistryGC != nil {
		release, err := p.RegistryGC.Hold(ctx)
		if err != nil {
			p.logger().Error("holding the registry to delete images", "repository", repo, "err", err)
			return 0, err
		}
		defer release()
	}
	return p.deleteImages(ctx, repo, digests)
}
