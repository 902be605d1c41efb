// Package deployer runs released images: on Knative Serving (subpackage knative) or, in dev
// mode, as sandboxed processes on this machine (subpackage local).
package deployer

import (
	"context"
	"errors"
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
// A Deployer may also implement the optional capabilities below (BaseDeployer, Destroyer);
// callers holding a Deployer find them by type assertion.
type Deployer interface {
	Deploy(ctx context.Context, r Release, out io.Writer) (url string, err error)
}

// BaseDeployer is implemented by Deployers that write only what a release changes
// (knative.Deployer; the local runtime does not, it replaces the whole process). DeployFrom
// is like Deploy, but the caller says which release it planned r on (base; the zero Release
// for a first deploy). The Deployer then writes only what differs between base and r (a
// push: the image; a config change: the variables it sets or unsets), and refuses with an
// error matching ErrFieldConflict (errors.Is) when someone else changed one of those same
// fields since base, instead of overwriting it. The receiver uses it so that a push and a
// config change that overlap cannot overwrite each other's fields.
type BaseDeployer interface {
	DeployFrom(ctx context.Context, base, r Release, out io.Writer) (url string, err error)
}

// ErrFieldConflict is matched (errors.Is) by a BaseDeployer's error when a field the deploy
// owns was changed by someone else after the base it was planned on. The deploy wrote
// nothing: it has to be planned again on the new value. knative.FieldConflictError wraps it
// and says which field, and to what.
var ErrFieldConflict = errors.New("field changed by another writer")

// Destroyer is implemented by Deployers that can take an app out of service for good
// (apps:destroy): knative.Deployer (deletes the Service) and local.Runtime (stops the
// process and removes its files). Destroying an app the Deployer does not know is not an
// error.
type Destroyer interface {
	Destroy(ctx context.Context, app string) error
}
