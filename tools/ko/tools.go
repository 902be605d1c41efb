//go:build tools

// Package tools pins ko, which builds kpush's container image without a Docker daemon.
package tools

import _ "github.com/google/ko"
