package buildpack

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

const (
	testKpushImage   = "ghcr.io/kpush/kpush@sha256:" + "1111111111111111111111111111111111111111111111111111111111111111"
	testBuilderImage = "registry.example.com/cnb/builder@sha256:" + "2222222222222222222222222222222222222222222222222222222222222222"
)

// TestBuildPodSpec checks the Pod's shape: kpack's container order, credentials only in
// analyze, restore and export, non-root, emptyDirs, deadline, no service account token.
func TestBuildPodSpec(t *testing.T) {
	previous := "reg.example.com/kpush/demo@sha256:" + strings.Repeat("ab", 32)
	spec := PodSpec{Name: "p", Namespace: "ns", App: "demo", Tag: "20260101-000000-abcdef",
		Image: "reg.example.com/kpush/demo", PreviousImage: previous, KpushImage: testKpushImage, BuilderImage: testBuilderImage,
		SourceURL: "http://kpush:8080/source", SourceToken: "tok", RegistrySecret: "regcred",
		Env: map[string]string{"GOFLAGS": "-tags=x"}, Deadline: 10 * time.Minute}
	pod, err := BuildPod(spec)
	if err != nil {
		t.Fatal(err)
	}
	checkBuildPod(t, pod)
	// The previous image goes to the analyzer only (the exporter reads it from analyzed.toml
	// and has no -previous-image flag in lifecycle v0.20.4); the output image stays last.
	for _, c := range pod.Spec.InitContainers {
		has := slices.Contains(c.Args, "-previous-image="+previous)
		if has != (c.Name == ContainerAnalyze) {
			t.Errorf("container %s: -previous-image=%s in args %v", c.Name, previous, c.Args)
		}
		if c.Name == ContainerAnalyze && c.Args[len(c.Args)-1] != "reg.example.com/kpush/demo:20260101-000000-abcdef" {
			t.Errorf("analyze: output image not last: %v", c.Args)
		}
	}
	spec.PreviousImage = ""
	if pod, err := BuildPod(spec); err != nil || slices.ContainsFunc(pod.Spec.InitContainers[1].Args, func(a string) bool { return strings.HasPrefix(a, "-previous-image") }) {
		t.Errorf("first build: err %v, analyze args %v", err, pod.Spec.InitContainers[1].Args)
	}
	spec.PreviousImage = "reg.example.com/kpush/other@sha256:" + strings.Repeat("ab", 32)
	if _, err := BuildPod(spec); err == nil {
		t.Errorf("BuildPod with a previous image in another repository succeeded")
	}
	if _, err := BuildPod(PodSpec{Name: "p", App: "a", Tag: "t", Image: "r/x", SourceURL: "u", SourceToken: "t"}); err == nil {
		t.Errorf("BuildPod without a kpush image succeeded")
	}
	if _, err := BuildPod(PodSpec{Name: "p", App: "a", Tag: "t", Image: "r/x", KpushImage: "k", SourceURL: "u", SourceToken: "t",
		Env: map[string]string{"BAD-NAME": "x"}}); err == nil {
		t.Errorf("BuildPod with a bad env name succeeded")
	}
}

// TestBuildPodSecurity checks the isolation settings of every container of the build Pod,
// with and without registry credentials: see checkBuildPodSecurity.
func TestBuildPodSecurity(t *testing.T) {
	for _, secret := range []string{"regcred", ""} {
		t.Run("registry secret "+strconv.Quote(secret), func(t *testing.T) {
			pod, err := BuildPod(PodSpec{Name: "p", Namespace: "ns", App: "demo", Tag: "20260101-000000-abcdef",
				Image: "reg.example.com/kpush/demo", KpushImage: testKpushImage, BuilderImage: testBuilderImage,
				SourceURL: "http://kpush:8080/source", SourceToken: "tok", RegistrySecret: secret, UserID: 1001, GroupID: 1000})
			if err != nil {
				t.Fatal(err)
			}
			checkBuildPodSecurity(t, pod)
			sc := pod.Spec.SecurityContext
			if *sc.RunAsUser != 1001 || *sc.RunAsGroup != 1000 || *sc.FSGroup != 1000 {
				t.Errorf("pod securityContext uid %d gid %d fsGroup %d, want 1001, 1000, 1000", *sc.RunAsUser, *sc.RunAsGroup, *sc.FSGroup)
			}
		})
	}
}

// checkBuildPodSecurity checks, container by container, what each may do: every one
// non-root, RuntimeDefault seccomp, no privilege escalation, no capabilities, a read-only
// root filesystem, and exactly the writable mounts its phase needs (a /tmp of its own for
// detect, build and export; $HOME only for detect and build; the registry credentials, when
// there are any, read-only and only in analyze, restore and export); and for the Pod no
// service account token, no service links.
func checkBuildPodSecurity(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	withAuth := slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == volAuth })
	for _, tc := range []struct {
		container string
		writes    []string // writable mount paths, sorted
		reads     []string // read-only mount paths, sorted (without the credentials)
		creds     bool     // mounts the registry credentials (when the Pod has them)
	}{
		{ContainerSource, []string{"/platform", "/workspace"}, nil, false},
		{ContainerAnalyze, []string{"/layers"}, nil, true},
		{ContainerDetect, []string{"/home/cnb", "/layers", "/tmp"}, []string{"/platform", "/workspace"}, false},
		{ContainerRestore, []string{"/layers"}, nil, true},
		{ContainerBuild, []string{"/home/cnb", "/layers", "/tmp", "/workspace"}, []string{"/platform"}, false},
		{ContainerExport, []string{"/layers", "/tmp"}, []string{"/workspace"}, true},
		{ContainerComplete, nil, nil, false},
	} {
		t.Run(tc.container, func(t *testing.T) {
			c := podContainer(pod, tc.container)
			if c == nil {
				t.Fatalf("no container %s", tc.container)
			}
			sc := c.SecurityContext
			if sc == nil {
				t.Fatalf("no securityContext")
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("allowPrivilegeEscalation %v, want false", show(sc.AllowPrivilegeEscalation))
			}
			if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
				t.Errorf("capabilities %+v, want drop [ALL] and nothing added", sc.Capabilities)
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("readOnlyRootFilesystem %v, want true", show(sc.ReadOnlyRootFilesystem))
			}
			if sc.Privileged != nil && *sc.Privileged {
				t.Errorf("privileged")
			}
			// Effective values: the container's, else the Pod's.
			ps := pod.Spec.SecurityContext
			nonRoot, uid, seccomp := ps.RunAsNonRoot, ps.RunAsUser, ps.SeccompProfile
			if sc.RunAsNonRoot != nil {
				nonRoot = sc.RunAsNonRoot
			}
			if sc.RunAsUser != nil {
				uid = sc.RunAsUser
			}
			if sc.SeccompProfile != nil {
				seccomp = sc.SeccompProfile
			}
			if nonRoot == nil || !*nonRoot || uid == nil || *uid == 0 {
				t.Errorf("runAsNonRoot %v runAsUser %v, want true and a non-root uid", show(nonRoot), show(uid))
			}
			if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("seccompProfile %+v, want RuntimeDefault", seccomp)
			}
			var writes, reads []string
			for _, m := range c.VolumeMounts {
				if m.Name == volAuth {
					continue
				}
				if m.ReadOnly {
					reads = append(reads, m.MountPath)
				} else {
					writes = append(writes, m.MountPath)
				}
				if m.MountPath == "/tmp" && m.Name != volTmpPrefix+c.Name {
					t.Errorf("/tmp is volume %s, want its own %s%s", m.Name, volTmpPrefix, c.Name)
				}
			}
			slices.Sort(writes)
			slices.Sort(reads)
			if !slices.Equal(writes, tc.writes) || !slices.Equal(reads, tc.reads) {
				t.Errorf("writable mounts %v, read-only %v; want %v and %v", writes, reads, tc.writes, tc.reads)
			}
			auth := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == volAuth })
			if (auth >= 0) != (tc.creds && withAuth) || auth >= 0 && !c.VolumeMounts[auth].ReadOnly {
				t.Errorf("registry credentials mounted %v (read-only %v); want %v", auth >= 0, auth >= 0 && c.VolumeMounts[auth].ReadOnly, tc.creds && withAuth)
			}
			if wd := c.WorkingDir; wd != "" && !slices.Contains(append(writes, reads...), wd) {
				t.Errorf("workingDir %s is not a mounted volume (a read-only root cannot have it created)", wd)
			}
		})
	}
	if n := len(pod.Spec.InitContainers) + len(pod.Spec.Containers); n != 7 {
		t.Errorf("%d containers, the table checks 7", n)
	}
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir == nil && v.Name != volAuth {
			t.Errorf("volume %s is neither an emptyDir nor the credentials Secret: %+v", v.Name, v.VolumeSource)
		}
	}
	if a := pod.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("automountServiceAccountToken %v, want false", show(a))
	}
	if l := pod.Spec.EnableServiceLinks; l == nil || *l {
		t.Errorf("enableServiceLinks %v, want false", show(l))
	}
	if pod.Spec.HostNetwork || pod.Spec.HostPID || pod.Spec.HostIPC {
		t.Errorf("host namespaces: network %v pid %v ipc %v", pod.Spec.HostNetwork, pod.Spec.HostPID, pod.Spec.HostIPC)
	}
}

func podContainer(pod *corev1.Pod, name string) *corev1.Container {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}

func checkBuildPod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	checkBuildPodSecurity(t, pod)
	var names []string
	for _, c := range pod.Spec.InitContainers {
		names = append(names, c.Name)
	}
	if want := []string{ContainerSource, ContainerAnalyze, ContainerDetect, ContainerRestore, ContainerBuild, ContainerExport}; !slices.Equal(names, want) {
		t.Errorf("init containers = %v, want %v", names, want)
	}
	if len(pod.Spec.Containers) != 1 || pod.Spec.Containers[0].Name != ContainerComplete {
		t.Errorf("containers = %v, want one %s", pod.Spec.Containers, ContainerComplete)
	}
	withCreds := map[string]bool{ContainerAnalyze: true, ContainerRestore: true, ContainerExport: true}
	for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		mounted := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == volAuth })
		env := slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "DOCKER_CONFIG" })
		if mounted != withCreds[c.Name] || env != withCreds[c.Name] {
			t.Errorf("container %s: credentials mounted %v, DOCKER_CONFIG %v; want %v", c.Name, mounted, env, withCreds[c.Name])
		}
		hasToken := slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == SourceTokenEnv })
		if hasToken != (c.Name == ContainerSource) {
			t.Errorf("container %s: source token env %v", c.Name, hasToken)
		}
		if lc, ok := lifecycleBinary[c.Name]; ok && (c.Image != pod.Spec.InitContainers[1].Image || c.Command[0] != "/cnb/lifecycle/"+lc) {
			t.Errorf("container %s: image %s command %v", c.Name, c.Image, c.Command)
		}
	}
	sc := pod.Spec.SecurityContext
	if *sc.RunAsUser != CNBUserID || *sc.RunAsGroup != CNBGroupID || *sc.FSGroup != CNBGroupID || !*sc.RunAsNonRoot {
		t.Errorf("pod securityContext %+v", sc)
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || pod.Spec.ActiveDeadlineSeconds == nil ||
		*pod.Spec.AutomountServiceAccountToken {
		t.Errorf("restartPolicy %s, deadline %v, automount token %v", pod.Spec.RestartPolicy, pod.Spec.ActiveDeadlineSeconds, *pod.Spec.AutomountServiceAccountToken)
	}
	for _, v := range pod.Spec.Volumes {
		if (v.EmptyDir == nil) != (v.Name == volAuth) {
			t.Errorf("volume %s: %+v", v.Name, v.VolumeSource)
		}
	}
	if pod.Labels[LabelManagedBy] != "kpush" || pod.Labels[LabelApp] == "" || pod.Labels[LabelBuild] == "" {
		t.Errorf("labels %v", pod.Labels)
	}
}

// show is *p for messages, "unset" for nil.
func show[T any](p *T) any {
	if p == nil {
		return "unset"
	}
	return *p
}
