package buildpack

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultBuilderImage is the CNB builder image build Pods run in when PodSpec.BuilderImage is
// empty: Paketo's Ubuntu Jammy base builder (CNB user 1001:1000, so set PodSpec.UserID 1001
// with it).
const DefaultBuilderImage = "docker.io/paketobuildpacks/builder-jammy-base:latest"

// Build Pod labels.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by" // "kpush"
	LabelApp       = "kpush.dev/app"                // Request.App
	LabelBuild     = "kpush.dev/build"              // the build's unique tag
)

// Names of the build Pod's containers, in the order they run (init containers, then the main
// container).
const (
	ContainerSource   = "source" // kpush image: `kpush source fetch`
	ContainerAnalyze  = "analyze"
	ContainerDetect   = "detect"
	ContainerRestore  = "restore"
	ContainerBuild    = "build"
	ContainerExport   = "export"
	ContainerComplete = "complete" // kpush image: `kpush source complete`
)

// RegistryAuthPath is where analyze, restore and export (only they) mount the registry
// credentials Secret: RegistryAuthPath/config.json, named by $DOCKER_CONFIG.
const RegistryAuthPath = "/var/run/kpush/registry"

// PodSpec is one build as a Pod: what BuildPod needs.
type PodSpec struct {
	Name      string // Pod name (DNS-1123 subdomain)
	Namespace string
	App       string // DNS-1035 app name, label kpush.dev/app
	Tag       string // the build's unique tag, label kpush.dev/build; the image is published as Image:Tag
	Image     string // repository to publish to, e.g. "registry.example.com/kpush/demo"
	// PreviousImage is the analyzer's -previous-image (Request.PreviousImage): by digest or
	// tag, in Image's repository (else BuildPod fails). The exporter has no such flag and
	// takes it from analyzed.toml. Empty: none (the lifecycle looks for Image:Tag).
	PreviousImage string
	// CacheImage is the build cache image. Empty: CacheImageFor(Image).
	CacheImage string
	// BuilderImage is the CNB builder (lifecycle at /cnb/lifecycle, buildpacks, order.toml,
	// run.toml). Empty: DefaultBuilderImage.
	BuilderImage string
	// RunImage overrides the builder's run.toml (analyzer -run-image). Empty: the builder's.
	RunImage string
	// KpushImage runs the source fetch and the completion container; its entrypoint must be
	// the kpush binary (as ko builds it). Required.
	KpushImage string
	// SourceURL is where the Pod reaches kpush's SourceServer; SourceToken the build's token
	// (set as $KPUSH_SOURCE_TOKEN on the source container only). Required.
	SourceURL, SourceToken string
	// Env is the build-time environment, written to /platform/env/NAME by the source container.
	Env map[string]string
	// RegistrySecret names a Secret of type kubernetes.io/dockerconfigjson mounted only into
	// analyze, restore and export. Empty: anonymous registry access.
	RegistrySecret string
	// ServiceAccount runs the Pod ("" = the namespace's default); its token is never mounted.
	ServiceAccount string
	// Resources apply to every container (the Pod's effective request is their maximum).
	Resources corev1.ResourceRequirements
	// Deadline is activeDeadlineSeconds. Zero: 30 minutes.
	Deadline time.Duration
	// UserID and GroupID are the builder's CNB user and group (runAsUser, runAsGroup, fsGroup).
	// Zero: 1000 and 1000.
	UserID, GroupID int64
	// InsecureRegistries are reached over plain HTTP (lifecycle -insecure-registry).
	InsecureRegistries []string
	// ImagePullSecrets pull the builder, run and kpush images.
	ImagePullSecrets []string
}

// CacheImageFor returns the build cache image of a repository: "<repo>:cache" (same
// repository, so the same credentials and no extra repository to create).
func CacheImageFor(repo string) string { return repo + ":cache" }

// Volumes of the build Pod (emptyDirs except registry-auth).
const (
	volLayers    = "layers"    // /layers: analyzed.toml, group.toml, plan.toml, layers, report.toml
	volWorkspace = "workspace" // /workspace: the app source
	volPlatform  = "platform"  // /platform: env/NAME
	volHome      = "home"      // /home/cnb: $HOME of every phase
	volAuth      = "registry-auth"
)

// BuildPod returns the build Pod for s in kpack's layout: init containers source (kpush image,
// fetches the pushed tree and writes /platform/env), then analyze, detect, restore, build,
// export (the builder image's /cnb/lifecycle/<phase>, Platform API 0.14), then a main
// container "complete" that exits at once. Only analyze, restore and export mount the registry
// credentials (RegistryAuthPath, $DOCKER_CONFIG); detect and build, which run buildpack code,
// see neither them nor the Kubernetes API token. Every container runs as UserID:GroupID with
// fsGroup GroupID, non-root, no privilege escalation, all capabilities dropped, RuntimeDefault
// seccomp. restartPolicy Never, activeDeadlineSeconds from Deadline. It returns an error for
// a missing required field or an unparsable image name.
func BuildPod(s PodSpec) (*corev1.Pod, error) {
	switch {
	case s.Name == "" || s.App == "" || s.Tag == "":
		return nil, errors.New("build pod: name, app and tag are required")
	case s.KpushImage == "":
		return nil, errors.New("build pod: the kpush image is required (it fetches the source)")
	case s.SourceURL == "" || s.SourceToken == "":
		return nil, errors.New("build pod: source URL and token are required")
	}
	repo, err := name.NewRepository(s.Image)
	if err != nil {
		return nil, fmt.Errorf("build pod: parsing image repository %q: %w", s.Image, err)
	}
	image := repo.Tag(s.Tag).String()
	previous, _, err := previousImage(repo, s.PreviousImage)
	if err != nil {
		return nil, fmt.Errorf("build pod: %w", err)
	}
	if s.PreviousImage != "" && previous == "" {
		return nil, fmt.Errorf("build pod: previous image %q is not in repository %s", s.PreviousImage, repo)
	}
	cache := s.CacheImage
	if cache == "" {
		cache = CacheImageFor(repo.String())
	}
	builder := s.BuilderImage
	if builder == "" {
		builder = DefaultBuilderImage
	}
	uid, gid := s.UserID, s.GroupID
	if uid == 0 {
		uid = CNBUserID
	}
	if gid == 0 {
		gid = CNBGroupID
	}
	deadline := s.Deadline
	if deadline <= 0 {
		deadline = 30 * time.Minute
	}
	envJSON := "{}"
	if len(s.Env) > 0 {
		for k := range s.Env {
			if !envName.MatchString(k) {
				return nil, fmt.Errorf("build pod: build environment variable name %q is invalid", k)
			}
		}
		b, err := json.Marshal(s.Env)
		if err != nil {
			return nil, err
		}
		envJSON = string(b)
	}

	mount := func(vol, path string, ro bool) corev1.VolumeMount {
		return corev1.VolumeMount{Name: vol, MountPath: path, ReadOnly: ro}
	}
	layers, workspace := mount(volLayers, "/layers", false), mount(volWorkspace, "/workspace", false)
	platform, home := mount(volPlatform, "/platform", false), mount(volHome, "/home/cnb", false)
	common := []corev1.EnvVar{
		{Name: "CNB_PLATFORM_API", Value: PlatformAPI},
		{Name: "CNB_USER_ID", Value: strconv.FormatInt(uid, 10)},
		{Name: "CNB_GROUP_ID", Value: strconv.FormatInt(gid, 10)},
		{Name: "CNB_NO_COLOR", Value: "true"},
		{Name: "HOME", Value: "/home/cnb"},
	}
	insecure := func(args []string) []string {
		for _, r := range s.InsecureRegistries {
			args = append(args, "-insecure-registry="+r)
		}
		return args
	}
	withAuth := s.RegistrySecret != ""
	phase := func(cname string, auth bool, args []string, mounts ...corev1.VolumeMount) corev1.Container {
		env := append([]corev1.EnvVar(nil), common...)
		if auth && withAuth {
			mounts = append(mounts, mount(volAuth, RegistryAuthPath, true))
			env = append(env, corev1.EnvVar{Name: "DOCKER_CONFIG", Value: RegistryAuthPath})
		}
		return corev1.Container{
			Name:         cname,
			Image:        builder,
			Command:      []string{"/cnb/lifecycle/" + lifecycleBinary[cname]},
			Args:         append([]string{"-log-level=info"}, args...),
			Env:          env,
			VolumeMounts: mounts,
			WorkingDir:   "/workspace",
		}
	}
	const (
		analyzed = "-analyzed=/layers/analyzed.toml"
		group    = "-group=/layers/group.toml"
		plan     = "-plan=/layers/plan.toml"
	)
	analyzeArgs := []string{"-layers=/layers", analyzed, "-cache-image=" + cache}
	if s.RunImage != "" {
		analyzeArgs = append(analyzeArgs, "-run-image="+s.RunImage)
	}
	if previous != "" {
		analyzeArgs = append(analyzeArgs, "-previous-image="+previous)
	}
	init := []corev1.Container{
		{
			Name:  ContainerSource,
			Image: s.KpushImage,
			Args:  []string{"source", "fetch", "--url=" + s.SourceURL, "--dest=/workspace", "--platform=/platform"},
			Env: []corev1.EnvVar{
				{Name: SourceTokenEnv, Value: s.SourceToken},
				{Name: PlatformEnvEnv, Value: envJSON},
				{Name: "HOME", Value: "/home/cnb"},
			},
			VolumeMounts: []corev1.VolumeMount{workspace, platform, home},
		},
		phase(ContainerAnalyze, true, append(insecure(analyzeArgs), image), layers),
		phase(ContainerDetect, false, []string{"-app=/workspace", "-layers=/layers", "-platform=/platform",
			"-buildpacks=/cnb/buildpacks", "-order=/cnb/order.toml", analyzed, group, plan},
			layers, mount(volWorkspace, "/workspace", true), mount(volPlatform, "/platform", true), home),
		phase(ContainerRestore, true, insecure([]string{"-layers=/layers", "-cache-image=" + cache, analyzed, group}), layers, home),
		phase(ContainerBuild, false, []string{"-app=/workspace", "-layers=/layers", "-platform=/platform",
			"-buildpacks=/cnb/buildpacks", group, plan},
			layers, workspace, mount(volPlatform, "/platform", true), home),
		phase(ContainerExport, true, append(insecure([]string{"-app=/workspace", "-layers=/layers", "-cache-image=" + cache,
			"-launcher=/cnb/lifecycle/launcher", "-report=/layers/report.toml", analyzed, group}), image),
			layers, mount(volWorkspace, "/workspace", true), home),
	}
	sec := &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	for i := range init {
		init[i].SecurityContext = sec.DeepCopy()
		init[i].Resources = *s.Resources.DeepCopy()
		init[i].ImagePullPolicy = corev1.PullIfNotPresent
	}
	complete := corev1.Container{
		Name:            ContainerComplete,
		Image:           s.KpushImage,
		Args:            []string{"source", "complete"},
		SecurityContext: sec.DeepCopy(),
		Resources:       *s.Resources.DeepCopy(),
		ImagePullPolicy: corev1.PullIfNotPresent,
	}
	emptyDir := func(n string) corev1.Volume {
		return corev1.Volume{Name: n, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	}
	vols := []corev1.Volume{emptyDir(volLayers), emptyDir(volWorkspace), emptyDir(volPlatform), emptyDir(volHome)}
	if withAuth {
		vols = append(vols, corev1.Volume{Name: volAuth, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName:  s.RegistrySecret,
			Items:       []corev1.KeyToPath{{Key: corev1.DockerConfigJsonKey, Path: "config.json"}},
			DefaultMode: ptr(int32(0o440)),
		}}})
	}
	var pullSecrets []corev1.LocalObjectReference
	for _, p := range s.ImagePullSecrets {
		pullSecrets = append(pullSecrets, corev1.LocalObjectReference{Name: p})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      s.Name,
			Namespace: s.Namespace,
			Labels:    map[string]string{LabelManagedBy: "kpush", LabelApp: s.App, LabelBuild: s.Tag},
			Annotations: map[string]string{
				"kpush.dev/image": image,
			},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			ActiveDeadlineSeconds:         ptr(int64(deadline / time.Second)),
			ServiceAccountName:            s.ServiceAccount,
			AutomountServiceAccountToken:  ptr(false),
			EnableServiceLinks:            ptr(false),
			TerminationGracePeriodSeconds: ptr(int64(5)),
			ImagePullSecrets:              pullSecrets,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsUser:      ptr(uid),
				RunAsGroup:     ptr(gid),
				FSGroup:        ptr(gid),
				RunAsNonRoot:   ptr(true),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			InitContainers: init,
			Containers:     []corev1.Container{complete},
			Volumes:        vols,
		},
	}, nil
}

// lifecycleBinary maps phase container names to the lifecycle's phase binaries.
var lifecycleBinary = map[string]string{
	ContainerAnalyze: "analyzer", ContainerDetect: "detector", ContainerRestore: "restorer",
	ContainerBuild: "builder", ContainerExport: "exporter",
}

func ptr[T any](v T) *T { return &v }
