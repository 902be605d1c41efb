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
}

// Deployer puts a Release into service and waits until it answers. Progress for people goes
// to out; the returned URL is where the app now serves, e.g. "http://demo.default.example.com".
// On error the previous release keeps serving.
type Deployer interface {
	Deploy(ctx context.Context, r Release, out io.Writer) (url string, err error)
}
