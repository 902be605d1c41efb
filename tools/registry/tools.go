//go:build tools

// Package tools pins distribution's registry, the persistent OCI registry of `kpush dev`.
package tools

import _ "github.com/distribution/distribution/v3/cmd/registry"
