//go:build tools

// Package tools pins Knative Serving's controller and webhook, run from source against the
// test kube-apiserver to check that the Services kpush writes are accepted and reconciled.
package tools

import (
	_ "knative.dev/serving/cmd/controller"
	_ "knative.dev/serving/cmd/webhook"
)
