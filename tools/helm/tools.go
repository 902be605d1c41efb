//go:build tools

// Package tools pins helm, which lints and renders charts/kpush in tests.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
