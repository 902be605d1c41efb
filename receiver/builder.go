package receiver

import (
	"context"
	"io"
	"time"

	"kpush.dev/kpush/buildpack"
)

// Builder builds a source tree into an image: buildpack.Local (the lifecycle on this machine)
// and buildpack.Kube (a build Pod per build) implement it.
//
// A Builder may also implement the optional capabilities below (AppForgetter,
// LeftoverRemover, BuildpackLister); the pipeline finds them by type assertion and does
// without them when they are missing. They use only stdlib and buildpack types, so that
// buildpack never imports receiver.
type Builder interface {
	Build(ctx context.Context, req buildpack.Request, out io.Writer) (buildpack.Result, error)
}

// AppForgetter is implemented by Builders that keep state per app (buildpack.Local's build
// cache): ForgetApp removes it, so that apps:destroy (Pipeline.Destroy) leaves nothing for
// the next app of that name.
type AppForgetter interface {
	ForgetApp(app string) error
}

// LeftoverRemover is implemented by Builders that keep per-build scratch directories
// (buildpack.Local): RemoveLeftovers removes those a killed process left, older than before,
// and returns their paths. Pipeline.RemoveLeftovers calls it once at start.
type LeftoverRemover interface {
	RemoveLeftovers(before time.Time) ([]string, error)
}

// BuildpackLister is implemented by Builders that can say which buildpacks they hold
// (buildpack.Local), so that a project descriptor's group is checked before the build
// (Pipeline.project). A build Pod's builder image is not known in advance: buildpack.Kube
// does not implement it.
type BuildpackLister interface {
	Buildpacks() ([]buildpack.GroupEntry, error)
}

var (
	_ Builder = (*buildpack.Kube)(nil)
	_ interface {
		Builder
		AppForgetter
		LeftoverRemover
		BuildpackLister
	} = (*buildpack.Local)(nil)
)
