// Package deployer runs released images: on Knative Serving (subpackage knative) or, in dev
// mode, as sandboxed processes on this machine (subpackage local).
package deployer

import (
	"context"
	"io"
)

// Release is what one deploy puts into service.
type Release struct {
	App    string            // DNS-1035 app name; the Knative Service's name
	Image  string            // image by digest: "<repository>@sha256:<64 hex>"
	Commit string            // 40-hex git commit the image was built from
	Pusher string            // user who caused the release
	Env    map[string]string // run-time environment (PORT is the runtime's to set)
	// Version is the app's release number N of "vN" (receiver's releases), 0 when unknown.
	Version int
}

// Deployer puts a Release into service and waits until it answers. Progress for people goes
// to out; the returned URL is where the app now serves, e.g. "http://demo.default.example.com".
// On error the previous release keeps serving.
//
// A Deployer may also implement the optional
//
//	DeployFrom(ctx context.Context, base, r Release, out io.Writer) (url string, err error)
//
// (knative.BaseDeployer; find it by type assertion): like Deploy, but the caller says which
// release it planned r on (base; the zero Release for a first deploy). The Deployer then
// writes only what differs between base and r (a push: the image; a config change: the
// variables it sets or unsets), and refuses with an error matching knative.ErrFieldConflict
// when someone else changed one of those same fields since base, instead of overwriting it.
type Deployer interface {
	Deploy(ctx context.Context, r Release, out io.Writer) (url string, err error)
}

// Destroyer is implemented by Deployers that can take an app out of service for good
// (apps:destroy). Callers find it by type assertion. Destroying an app the Deployer does not
// know is not an error.
type Destroyer interface {
	Destroy(ctx context.Context, app string) error
}
