//go:build !linux

package knativetest

import "errors"

// checkPrivateNetwork: private network namespaces (InPrivateNetwork, StartServing) are Linux's.
func checkPrivateNetwork() error {
	return errors.New("private network namespaces need Linux")
}
