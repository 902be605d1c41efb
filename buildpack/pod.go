package buildpack

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kpush.dev/kpush/internal/names"
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
	volHome      = "home"      // /home/cnb: $HOME of detect and build (buildpack code)
	volAuth      = "registry-auth"
	// volTmpPrefix+container is that container's own /tmp: every container runs on a
	// read-only root filesystem, and detect, build and export need a scratch directory (the
	// lifecycle's detector and builder put each buildpack's plan in os.MkdirTemp, buildpacks
	// and their tools use $TMPDIR; the exporter stages layer tarballs there). One per
	// container, as each container's writable /tmp would be: buildpack code in detect and
	// build leaves nothing for the credentialed export to find.
	volTmpPrefix = "tmp-"
)

// Where each build Pod container may write, beside its volumes: nowhere. Every container has
// readOnlyRootFilesystem; the phases that need scratch space get a /tmp emptyDir of their own
// (tmpContainers). source (kpush's code) writes only /workspace and /platform, complete
// nothing; analyze and restore write only /layers (the lifecycle's analyzer and restorer
// create no temporary files, and go-containerregistry streams to and from the registry).
// Without its /tmp, detect fails at once (the detector's os.MkdirTemp), and so does export;
// TestPodPlanRunsLocally runs every phase this way.
var tmpContainers = map[string]bool{ContainerDetect: true, ContainerBuild: true, ContainerExport: true}

// BuildPod returns the build Pod for s in kpack's layout: init containers source (kpush image,
// fetches the pushed tree and writes /platform/env), then analyze, detect, restore, build,
// export (the builder image's /cnb/lifecycle/<phase>, Platform API 0.14), then a main
// container "complete" that exits at once. Only analyze, restore and export mount the registry
// credentials (RegistryAuthPath, $DOCKER_CONFIG); detect and build, which run buildpack code,
// see neither them nor the Kubernetes API token, and only they share $HOME (/home/cnb), so
// nothing buildpack code leaves there (a ~/.docker/config.json) reaches a phase that talks to
// the registry. Every container runs as UserID:GroupID with fsGroup GroupID, non-root, no
// privilege escalation, all capabilities dropped, a read-only root filesystem (detect, build
// and export get a /tmp emptyDir each, see tmpContainers), under the RuntimeDefault seccomp
// profile; no service account token, no service links. The Pod passes the "restricted" Pod
// Security Standard. restartPolicy Never, activeDeadlineSeconds from Deadline. It returns an
// error for a missing required field or an unparsable image name.
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
			if !names.IsEnv(k) {
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
		// The working directory is a mounted volume: on a read-only root filesystem the
		// runtime could not create a missing one. The lifecycle takes absolute paths only.
		wd := "/layers"
		if slices.ContainsFunc(mounts, func(m corev1.VolumeMount) bool { return m.Name == volWorkspace }) {
			wd = "/workspace"
		}
		return corev1.Container{
			Name:         cname,
			Image:        builder,
			Command:      []string{"/cnb/lifecycle/" + lifecycleBinary[cname]},
			Args:         append([]string{"-log-level=info"}, args...),
			Env:          env,
			VolumeMounts: mounts,
			WorkingDir:   wd,
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
			// Mounts only what it writes; it needs no $HOME.
			VolumeMounts: []corev1.VolumeMount{workspace, platform},
			WorkingDir:   "/workspace",
		},
		// analyze, restore and export talk to the registry (credentials) and run no buildpack
		// code; they mount neither the shared $HOME nor /platform, and the app read-only.
		phase(ContainerAnalyze, true, append(insecure(analyzeArgs), image), layers),
		phase(ContainerDetect, false, []string{"-app=/workspace", "-layers=/layers", "-platform=/platform",
			"-buildpacks=/cnb/buildpacks", "-order=/cnb/order.toml", analyzed, group, plan},
			layers, mount(volWorkspace, "/workspace", true), mount(volPlatform, "/platform", true), home),
		phase(ContainerRestore, true, insecure([]string{"-layers=/layers", "-cache-image=" + cache, analyzed, group}), layers),
		phase(ContainerBuild, false, []string{"-app=/workspace", "-layers=/layers", "-platform=/platform",
			"-buildpacks=/cnb/buildpacks", group, plan},
			layers, workspace, mount(volPlatform, "/platform", true), home),
		phase(ContainerExport, true, append(insecure([]string{"-app=/workspace", "-layers=/layers", "-cache-image=" + cache,
			"-launcher=/cnb/lifecycle/launcher", "-report=/layers/report.toml", analyzed, group}), image),
			layers, mount(volWorkspace, "/workspace", true)),
	}
	complete := corev1.Container{
		Name:  ContainerComplete,
		Image: s.KpushImage,
		Args:  []string{"source", "complete"},
	}
	emptyDir := func(n string) corev1.Volume {
		return corev1.Volume{Name: n, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	}
	vols := []corev1.Volume{emptyDir(volLayers), emptyDir(volWorkspace), emptyDir(volPlatform), emptyDir(volHome)}
	// The same container-level settings for every container: the lifecycle needs no
	// privilege in any phase on Platform API 0.14 (it runs as the CNB user throughout; only
	// the image extension phases, which kpush does not run, need root).
	harden := func(c *corev1.Container) {
		c.SecurityContext = &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			ReadOnlyRootFilesystem:   ptr(true),
		}
		c.Resources = *s.Resources.DeepCopy()
		c.ImagePullPolicy = corev1.PullIfNotPresent
		if tmpContainers[c.Name] {
			c.VolumeMounts = append(c.VolumeMounts, mount(volTmpPrefix+c.Name, "/tmp", false))
			vols = append(vols, emptyDir(volTmpPrefix+c.Name))
		}
	}
	for i := range init {
		harden(&init[i])
	}
	harden(&complete)
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
			RestartPolicy:         corev1.RestartPolicyNever,
			ActiveDeadlineSeconds: ptr(int64(deadline / time.Second)),
			ServiceAccountName:    s.ServiceAccount,
			// No container talks to the Kubernetes API: kpush watches the Pod from outside.
			AutomountServiceAccountToken: ptr(false),
			// No $<SERVICE>_SERVICE_HOST variables: buildpack code learns nothing of the
			// namespace's Services from its environment.
			EnableServiceLinks:            ptr(false),
			TerminationGracePeriodSeconds: ptr(int64(5)),
			ImagePullSecrets:              pullSecrets,
			// Every phase runs as the builder's CNB user (Platform API 0.14 needs root for
			// none of them), so runAsNonRoot holds for the whole Pod; fsGroup makes the
			// emptyDirs and the credentials Secret the CNB group's.
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
