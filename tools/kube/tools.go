//go:build tools

// Package tools pins kube-apiserver, the real API server kpush's integration tests run against.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
