package buildpack

import (
	"fmt"
	"log/slog"

	"github.com/google/go-containerregistry/pkg/name"
)

// Output lines replacing the analyzer's `Image with name "<fresh tag>" not found` (see
// lineSink.noPrevious).
const (
	msgFirstBuild        = "No previous image (first build)"
	msgPreviousElsewhere = "No previous image in this repository (the last release's image is elsewhere): no layers reused"
	analyzerNotFoundLine = "Image with name %q not found" // phase/analyzer.go, lifecycle v0.20.4
)

// outputRepository parses req.Image, the repository a build publishes to, and checks
// req.PreviousImage against it (previousImage), logging when a previous image in another
// repository is left out.
func outputRepository(req Request, log *slog.Logger) (repo name.Repository, previous, noPrevious string, err error) {
	repo, err = name.NewRepository(req.Image)
	if err != nil {
		return repo, "", "", fmt.Errorf("parsing image repository %q: %w", req.Image, err)
	}
	previous, noPrevious, err = previousImage(repo, req.PreviousImage)
	if err == nil && noPrevious == msgPreviousElsewhere {
		log.Warn("previous image is in another repository: not reusing its layers", "previous_image", req.PreviousImage, "repository", repo.String())
	}
	return repo, previous, noPrevious, err
}

// previousImage checks Request.PreviousImage against the output repository. It returns the
// reference to pass as -previous-image ("" for none) and the line to print in place of the
// analyzer's "not found" line for the fresh tag, which appears exactly when no previous image
// is passed (the lifecycle then defaults it to the output image). A previous image in another
// repository is not passed: layers are only reused within the app's repository, whose
// credentials the build has. Error: prev does not parse as an image reference.
func previousImage(repo name.Repository, prev string) (ref, noPrevious string, err error) {
	if prev == "" {
		return "", msgFirstBuild, nil
	}
	r, err := name.ParseReference(prev)
	if err != nil {
		return "", "", fmt.Errorf("parsing previous image %q: %w", prev, err)
	}
	if r.Context().String() != repo.String() {
		return "", msgPreviousElsewhere, nil
	}
	return r.String(), "", nil
}
