// Package names holds the rules for the names kpush takes from people: app names and
// environment variable names.
package names

import (
	"regexp"

	"k8s.io/apimachinery/pkg/util/validation"
)

// IsApp reports whether s can be an app name: a DNS-1035 label (lowercase letters, digits and
// '-', starting with a letter, ending with a letter or digit, at most 63 characters), since an
// app becomes a Knative Service of that name. Kubernetes' own validation decides.
func IsApp(s string) bool { return len(validation.IsDNS1035Label(s)) == 0 }

var envRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// IsEnv reports whether s can be an environment variable name kpush sets: a POSIX name
// ([A-Za-z_][A-Za-z0-9_]*), which every shell and buildpack can read (Kubernetes' own
// IsEnvVarName also allows '.' and '-').
func IsEnv(s string) bool { return envRE.MatchString(s) }
