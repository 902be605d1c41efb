// Package deps pins kpush's dependency set while the packages that use it are written.
package deps

import (
	_ "github.com/BurntSushi/toml"
	_ "github.com/buildpacks/pack/pkg/project"
	_ "github.com/gliderlabs/ssh"
	_ "github.com/go-git/go-git/v5"
	_ "github.com/google/go-containerregistry/pkg/crane"
	_ "github.com/google/go-containerregistry/pkg/registry"
	_ "github.com/google/go-containerregistry/pkg/v1/empty"
	_ "github.com/google/go-containerregistry/pkg/v1/mutate"
	_ "github.com/google/go-containerregistry/pkg/v1/remote"
	_ "github.com/google/go-containerregistry/pkg/v1/tarball"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/spf13/cobra"
	_ "golang.org/x/crypto/ssh"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/tools/clientcmd"
	_ "knative.dev/pkg/apis"
	_ "knative.dev/serving/pkg/apis/serving/v1"
	_ "knative.dev/serving/pkg/client/clientset/versioned"
	_ "sigs.k8s.io/controller-runtime/pkg/envtest"
)
