//go:build tools

// Package tools pins the CNB lifecycle that kpush's local build runner executes.
package tools

import (
	_ "github.com/buildpacks/lifecycle/cmd/launcher"
	_ "github.com/buildpacks/lifecycle/cmd/lifecycle"
)
