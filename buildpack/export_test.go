package buildpack

// What the tests of package buildpack_test (podplan_test.go) use of this package's unexported
// code and test helpers. Those tests run build Pods with buildpacktest.PodRunner, and
// buildpacktest imports buildpack, so they cannot be in package buildpack.

const (
	TestKpushImage   = testKpushImage
	TestBuilderImage = testBuilderImage
	VolAuth          = volAuth
	MsgFirstBuild    = msgFirstBuild
)

var (
	RequireTools    = requireTools
	WriteTree       = writeTree
	GoApp           = goApp
	KpushForPods    = kpushForPods
	NewTag          = newTag
	CheckBuildPod   = checkBuildPod
	ContainerStatus = containerStatus
)

func Ptr[T any](v T) *T { return ptr(v) }
