// Package buildpack builds app source into OCI images with the Cloud Native Buildpacks
// lifecycle (https://github.com/buildpacks/spec, Platform API 0.14).
package buildpack

// Request is one build.
type Request struct {
	App       string            // DNS-1035 app name; also names the per-app build cache
	SourceDir string            // host directory holding the app's source tree; the runner may take ownership of it
	Image     string            // repository to publish to, e.g. "127.0.0.1:5000/kpush/demo"; the runner picks a unique tag
	Env       map[string]string // build-time environment, handed to buildpacks as <platform>/env/NAME files
	// Group, if not empty, is the build's only buildpack group: it replaces the builder's
	// order (a project descriptor's [[io.buildpacks.group]], https://buildpacks.io/docs/reference/config/project-descriptor/).
	// Its entries must name buildpacks the builder holds; none is optional.
	Group Group
	// PreviousImage, if not empty, is the app's current release image, by digest
	// ("<repository>@sha256:<hex>") or tag, in the same repository as Image: the lifecycle's
	// previous image (creator and analyzer -previous-image, Platform API 0.14). The analyzer
	// reads its layer metadata, so the export reuses launch layers whose content is unchanged
	// ("Reusing layer 'kpush/go:app'") and buildpacks see their launch layers' previous
	// metadata. Empty (first build): the lifecycle looks for the build's fresh tag, which never
	// exists, and the runner prints "No previous image (first build)" instead of the
	// lifecycle's "Image with name ... not found". One in another repository (the registry
	// moved, the app was renamed) is ignored and logged; one that no longer resolves makes the
	// lifecycle print its "not found" line and reuse nothing. An unparsable one is an error.
	PreviousImage string
}

// Result is a finished build.
type Result struct {
	Image string // the published image by digest: "<repository>@sha256:<64 hex>"
}
