// Package charts holds kpush's Helm chart (charts/kpush) and its tests: helm lint, helm
// template with default and custom values, every rendered manifest created with server-side
// dry-run on a real kube-apiserver with the Knative Serving CRDs (deployer/knativetest), kpush's
// Pod security settings and NetworkPolicies read from the rendered manifests, that Pod
// admitted by the API server under the "restricted" Pod Security Standard, and a real helm
// install, upgrade, uninstall and reinstall on that server that must keep the SSH host key.
package charts

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/deployer/knativetest"
	"kpush.dev/kpush/internal/baseimage"
	"kpush.dev/kpush/internal/tools"
)

const (
	chart       = "kpush"
	hostKeyName = "ssh_host_ed25519_key"
	adminKey    = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"
)

// apiserver is shared by the package's tests; each test works in namespaces of its own.
var apiserver *rest.Config

func TestMain(m *testing.M) { os.Exit(knativetest.Main(m, &apiserver)) }

// helm runs the helm binary that `make tools` builds and returns its stdout; a failure fails
// the test with helm's stderr.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := helmErr(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func helmErr(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin, err := tools.Path("helm")
	if err != nil {
		t.Fatalf("finding helm (run make tools): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	// Helm's own state (repositories, cache) stays out of the user's home.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// valueSets are the values the tests render the chart with: the defaults, everything
// customised (testdata/custom-values.yaml plus app namespaces), and a host key Secret of the
// user's own with every optional object (ServiceAccount, RBAC, NetworkPolicies) turned off.
func valueSets(appNamespaces ...string) map[string][]string {
	custom := []string{"-f", "testdata/custom-values.yaml"}
	if len(appNamespaces) > 0 {
		custom = append(custom, "--set", "apps.namespaces={"+strings.Join(appNamespaces, ",")+"}")
	}
	return map[string][]string{
		"default": nil,
		"custom":  custom,
		"existing host key": {"--set", "ssh.hostKey.existingSecret=my-host-key", "--set", "admin.publicKeys[0]=" + adminKey,
			"--set", "ssh.service.type=ClusterIP", "--set", "serviceAccount.create=false", "--set", "rbac.create=false",
			"--set", "networkPolicy.enabled=false"},
	}
}

func TestLint(t *testing.T) {
	for name, values := range valueSets("apps-a", "apps-b") {
		t.Run(name, func(t *testing.T) {
			out := helm(t, append([]string{"lint", "--strict", chart}, values...)...)
			if !strings.Contains(out, "0 chart(s) failed") {
				t.Errorf("helm lint:\n%s", out)
			}
		})
	}
}

// TestLintRefusesBadValues checks that values.schema.json turns mistakes into lint (and
// install) errors that name the value.
func TestLintRefusesBadValues(t *testing.T) {
	for _, tc := range []struct{ set, want string }{
		{"ssh.service.type=Ingress", "/ssh/service/type"},
		{"registy.url=registry.example.com", "registy"},
		{"apps.namespaces={Apps_1}", "/apps/namespaces/0"},
		{"apps.readyTimeout=5 minutes", "/apps/readyTimeout"},
		{"image.digest=latest", "/image/digest"},
		{"admin.publicKeys[0]=AAAAC3NzaC1lZDI1NTE5", "/admin/publicKeys/0"},
		{"networkPolicy.registry.ports[0].protocol=HTTP", "/networkPolicy/registry/ports/0"},
		{"networkPolicy.enabled=yes", "/networkPolicy/enabled"},
		{"serviceAccount.tokenExpirationSeconds=60", "/serviceAccount/tokenExpirationSeconds"},
	} {
		t.Run(tc.set, func(t *testing.T) {
			out, err := helmErr(t, "lint", "--strict", chart, "--set", tc.set)
			if err == nil || !strings.Contains(out+err.Error(), tc.want) {
				t.Errorf("helm lint --set %s: err %v, want a failure naming %q:\n%s", tc.set, err, tc.want, out)
			}
		})
	}
}

// TestTemplateServerDryRun renders the chart and creates every manifest with server-side
// dry-run (DryRun=All): the API server decodes, defaults, validates (OpenAPI schemas,
// including RBAC, NetworkPolicies and the Knative CRDs) and admits each object without
// storing it. The Pod the StatefulSet would make is dry-run too, in a namespace that enforces
// the restricted Pod Security Standard (a control Pod that breaks it is refused there).
func TestTemplateServerDryRun(t *testing.T) {
	appA, appB := knativetest.Namespace(t, apiserver), knativetest.Namespace(t, apiserver)
	restricted := restrictedNamespace(t)
	for name, values := range valueSets(appA, appB) {
		t.Run(name, func(t *testing.T) {
			ns := knativetest.Namespace(t, apiserver)
			out := helm(t, append([]string{"template", "kpush", chart, "--namespace", ns}, values...)...)
			objs := decode(t, out)
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.GetKind()]++
				dryRunCreate(t, o, ns)
			}
			if kinds["ClusterRole"]+kinds["ClusterRoleBinding"] > 0 {
				t.Errorf("rendered cluster-scoped RBAC %v; want namespaced Roles only", kinds)
			}
			for _, k := range []string{"StatefulSet", "Service"} {
				if kinds[k] == 0 {
					t.Errorf("no %s rendered; got %v", k, kinds)
				}
			}
			checkRendered(t, name, ns, []string{appA, appB}, objs)
			dryRunStatefulSetPod(t, find(t, objs, "StatefulSet", ""), restricted)
		})
	}
}

// restrictedNamespace makes a namespace that enforces the restricted Pod Security Standard
// and checks that the API server's PodSecurity admission is on: a Pod that may escalate
// privileges is refused there.
func restrictedNamespace(t *testing.T) string {
	t.Helper()
	ns := knativetest.Namespace(t, apiserver)
	cs, err := kubernetes.NewForConfig(apiserver)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	patch := `{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"restricted","pod-security.kubernetes.io/enforce-version":"latest"}}}`
	if _, err := cs.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	control := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "control"},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{Name: "c", Image: "example.com/c", SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: ptr(true), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
		},
	}
	_, err = cs.CoreV1().Pods(ns).Create(ctx, control, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "PodSecurity") {
		t.Fatalf("a Pod with allowPrivilegeEscalation in a restricted namespace: err %v, want PodSecurity's refusal", err)
	}
	return ns
}

// dryRunStatefulSetPod creates, with server-side dry-run in namespace ns, the Pod that the
// StatefulSet's controller would make from sts (its template plus the data volume claim).
func dryRunStatefulSetPod(t *testing.T, sts *unstructured.Unstructured, ns string) {
	t.Helper()
	var set appsv1.StatefulSet
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(sts.Object, &set); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: *set.Spec.Template.ObjectMeta.DeepCopy(), Spec: *set.Spec.Template.Spec.DeepCopy()}
	pod.Name = set.Name + "-0"
	for _, c := range set.Spec.VolumeClaimTemplates {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: c.Name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c.Name + "-" + pod.Name}}})
	}
	cs, err := kubernetes.NewForConfig(apiserver)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}); err != nil {
		t.Errorf("kpush's Pod in a namespace enforcing the restricted Pod Security Standard: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// checkRendered checks what each value set must have produced.
func checkRendered(t *testing.T, name, ns string, appNamespaces []string, objs []*unstructured.Unstructured) {
	t.Helper()
	sts := find(t, objs, "StatefulSet", "")
	pod := sts.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	c := pod["containers"].([]any)[0].(map[string]any)
	env := map[string]string{}
	for _, e := range c["env"].([]any) {
		e := e.(map[string]any)
		v, _ := e["value"].(string)
		env[e["name"].(string)] = v
	}
	mounts := map[string]string{}
	for _, m := range c["volumeMounts"].([]any) {
		m := m.(map[string]any)
		sub, _ := m["subPath"].(string)
		mounts[m["mountPath"].(string)] = sub
	}
	// The host key Secret is mounted where gitserver looks for it, for every value set.
	if env["KPUSH_DATA"] == "" || mounts[env["KPUSH_DATA"]+"/"+hostKeyName] != hostKeyName {
		t.Errorf("host key not mounted at KPUSH_DATA/%s: env %v, mounts %v", hostKeyName, env, mounts)
	}
	if env["KPUSH_SSH_ADDR"] != ":2222" {
		t.Errorf("KPUSH_SSH_ADDR = %q, want :2222", env["KPUSH_SSH_ADDR"])
	}
	svc := find(t, objs, "Service", "kpush")
	svcSpec := svc.Object["spec"].(map[string]any)
	port := svcSpec["ports"].([]any)[0].(map[string]any)
	var set appsv1.StatefulSet
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(sts.Object, &set); err != nil {
		t.Fatal(err)
	}
	tokenTTL := int64(3600)
	if name == "custom" {
		tokenTTL = 7200
	}
	checkPodSecurity(t, &set, tokenTTL)
	for _, o := range objs {
		if o.GetKind() == "ServiceAccount" {
			if a, ok := o.Object["automountServiceAccountToken"].(bool); !ok || a {
				t.Errorf("ServiceAccount %s: automountServiceAccountToken %v, want false", o.GetName(), o.Object["automountServiceAccountToken"])
			}
		}
	}
	checkNetworkPolicies(t, name, objs, &set)

	switch name {
	case "default":
		if env["KPUSH_NAMESPACE"] != ns {
			t.Errorf("KPUSH_NAMESPACE = %q, want the release namespace %s", env["KPUSH_NAMESPACE"], ns)
		}
		if _, ok := env["KPUSH_AUTHORIZED_KEYS"]; ok {
			t.Errorf("KPUSH_AUTHORIZED_KEYS set without admin.publicKeys")
		}
		if svcSpec["type"] != "LoadBalancer" || fmt.Sprint(port["port"]) != "22" {
			t.Errorf("SSH Service: type %v port %v, want LoadBalancer 22", svcSpec["type"], port["port"])
		}
		if c["image"] != "ghcr.io/kpush/kpush:0.1.0" {
			t.Errorf("image = %v, want ghcr.io/kpush/kpush:<appVersion>", c["image"])
		}
		find(t, objs, "Secret", "kpush-ssh-host-key")
		roleRules(t, objs, ns, "kpush-apps")
		// Build Pods run kpush's image and reach the source port through a ClusterIP Service.
		if env["KPUSH_BUILDER"] != "kube" || env["KPUSH_IMAGE"] != c["image"] ||
			env["KPUSH_SOURCE_URL"] != "http://kpush-source."+ns+".svc:8082/source" || env["KPUSH_SOURCE_ADDR"] != ":8082" {
			t.Errorf("build Pod env: KPUSH_BUILDER %q KPUSH_IMAGE %q KPUSH_SOURCE_URL %q KPUSH_SOURCE_ADDR %q",
				env["KPUSH_BUILDER"], env["KPUSH_IMAGE"], env["KPUSH_SOURCE_URL"], env["KPUSH_SOURCE_ADDR"])
		}
		src := find(t, objs, "Service", "kpush-source").Object["spec"].(map[string]any)
		if sp := src["ports"].([]any)[0].(map[string]any); src["type"] != "ClusterIP" || fmt.Sprint(sp["port"]) != "8082" || sp["targetPort"] != "source" {
			t.Errorf("source Service: type %v ports %v, want ClusterIP 8082 → source", src["type"], src["ports"])
		}
	case "custom":
		want := map[string]string{
			"KPUSH_NAMESPACE":         appNamespaces[0],
			"KPUSH_REGISTRY":          "registry.example.com/apps",
			"KPUSH_REGISTRY_SECRET":   "registry-push",
			"KPUSH_RUN_IMAGE":         "registry.example.com/cnb/run@sha256:2222222222222222222222222222222222222222222222222222222222222222",
			"KPUSH_BUILDER_IMAGE":     "registry.example.com/cnb/builder@sha256:1111111111111111111111111111111111111111111111111111111111111111",
			"KPUSH_BUILDER_RESOURCES": `{"limits":{"memory":"2Gi"},"requests":{"cpu":"500m","memory":"1Gi"}}`,
			"KPUSH_READY_TIMEOUT":     "90s",
			"KPUSH_AUTHORIZED_KEYS":   "/etc/kpush/admin/authorized_keys",
			"DOCKER_CONFIG":           "/etc/kpush/registry",
			"KPUSH_EXTRA":             "1",
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("env %s = %q, want %q", k, env[k], v)
			}
		}
		if svcSpec["type"] != "NodePort" || fmt.Sprint(port["nodePort"]) != "30022" || fmt.Sprint(port["port"]) != "2022" {
			t.Errorf("SSH Service: type %v port %v nodePort %v, want NodePort 2022 30022", svcSpec["type"], port["port"], port["nodePort"])
		}
		if !strings.HasSuffix(c["image"].(string), "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef") {
			t.Errorf("image = %v, want the digest", c["image"])
		}
		keys := find(t, objs, "ConfigMap", "kpush-admin-keys").Object["data"].(map[string]any)["authorized_keys"].(string)
		if lines := strings.Split(strings.TrimSpace(keys), "\n"); len(lines) != 3 {
			t.Errorf("authorized_keys has %d lines, want 3 (one per key):\n%s", len(lines), keys)
		}
		for _, l := range strings.Split(strings.TrimSpace(keys), "\n") {
			if _, _, _, _, err := gossh.ParseAuthorizedKey([]byte(l)); err != nil {
				t.Errorf("authorized_keys line %q: %v", l, err)
			}
		}
		for _, app := range appNamespaces {
			roleRules(t, objs, app, "kpush-apps")
		}
		if find(t, objs, "ServiceAccount", "").GetName() != "kpush-sa" {
			t.Errorf("ServiceAccount name is not serviceAccount.name")
		}
	case "existing host key":
		for _, o := range objs {
			if o.GetKind() == "Secret" {
				t.Errorf("rendered Secret %s although ssh.hostKey.existingSecret is set", o.GetName())
			}
			if strings.HasPrefix(o.GetKind(), "Role") || o.GetKind() == "ServiceAccount" {
				t.Errorf("rendered %s %s with rbac.create=false and serviceAccount.create=false", o.GetKind(), o.GetName())
			}
		}
		var secretName string
		for _, v := range pod["volumes"].([]any) {
			if s, ok := v.(map[string]any)["secret"].(map[string]any); ok && v.(map[string]any)["name"] == "ssh-host-key" {
				secretName = s["secretName"].(string)
			}
		}
		if secretName != "my-host-key" {
			t.Errorf("host key volume uses Secret %q, want my-host-key", secretName)
		}
	}
}

// checkPodSecurity checks kpush's Pod: non-root as the base image's nonroot user, whose
// group owns the volumes (fsGroup); RuntimeDefault seccomp; no privilege escalation, no
// capabilities, a read-only root filesystem with only the data volume and /tmp writable; the
// API token not automounted but projected with expiry tokenTTL, read-only; no service links,
// no host namespaces or host paths.
func checkPodSecurity(t *testing.T, set *appsv1.StatefulSet, tokenTTL int64) {
	t.Helper()
	pod := set.Spec.Template.Spec
	ps := pod.SecurityContext
	uid := int64(baseimage.NonrootUID)
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser != uid ||
		ps.RunAsGroup == nil || *ps.RunAsGroup != uid || ps.FSGroup == nil || *ps.FSGroup != uid {
		t.Errorf("pod securityContext %+v, want runAsNonRoot and user, group and fsGroup %d (the image's nonroot user)", ps, uid)
	}
	if ps == nil || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccompProfile not RuntimeDefault: %+v", ps)
	}
	if a := pod.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("automountServiceAccountToken %v, want false (the token is projected explicitly)", show(a))
	}
	if l := pod.EnableServiceLinks; l == nil || *l {
		t.Errorf("enableServiceLinks %v, want false", show(l))
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Errorf("host namespaces: network %v pid %v ipc %v", pod.HostNetwork, pod.HostPID, pod.HostIPC)
	}
	if len(pod.Containers) != 1 || len(pod.InitContainers) != 0 {
		t.Fatalf("containers %d, init containers %d; want one kpush container", len(pod.Containers), len(pod.InitContainers))
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	if sc == nil {
		t.Fatalf("container %s has no securityContext", c.Name)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("allowPrivilegeEscalation %v, want false", show(sc.AllowPrivilegeEscalation))
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("capabilities %+v, want drop [ALL], none added", sc.Capabilities)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("readOnlyRootFilesystem %v, want true", show(sc.ReadOnlyRootFilesystem))
	}
	if sc.Privileged != nil && *sc.Privileged || sc.RunAsUser != nil && *sc.RunAsUser == 0 ||
		sc.SeccompProfile != nil && sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container securityContext overrides the pod's: %+v", sc)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	var writable []string
	var token *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if !m.ReadOnly {
			writable = append(writable, m.MountPath)
		}
		if m.MountPath == "/var/run/secrets/kubernetes.io/serviceaccount" {
			token = &c.VolumeMounts[i]
		}
	}
	slices.Sort(writable)
	if want := []string{"/tmp", env["KPUSH_DATA"]}; !slices.Equal(writable, want) {
		t.Errorf("writable mounts %v, want only %v", writable, want)
	}
	if !strings.HasPrefix(env["HOME"]+"/", "/tmp/") {
		t.Errorf("HOME %q is not on a writable mount", env["HOME"])
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
		if v.HostPath != nil {
			t.Errorf("volume %s is a hostPath", v.Name)
		}
	}
	if token == nil || !token.ReadOnly {
		t.Fatalf("no read-only API token mount at /var/run/secrets/kubernetes.io/serviceaccount: %+v", c.VolumeMounts)
	}
	var ttl *int64
	var ca bool
	if p := vols[token.Name].Projected; p != nil {
		for _, src := range p.Sources {
			if src.ServiceAccountToken != nil && src.ServiceAccountToken.Path == "token" && src.ServiceAccountToken.Audience == "" {
				ttl = src.ServiceAccountToken.ExpirationSeconds
			}
			if src.ConfigMap != nil && src.ConfigMap.Name == "kube-root-ca.crt" {
				ca = true
			}
		}
	}
	if ttl == nil || *ttl != tokenTTL || !ca {
		t.Errorf("API token volume %s: token expiry %v, CA %v; want a projected token expiring after %d s and kube-root-ca.crt",
			token.Name, ttl, ca, tokenTTL)
	}
}

// checkNetworkPolicies checks the NetworkPolicies of the value set name from what they allow,
// rule by rule: build Pods (selected as buildpack.BuildPod labels them) no ingress, egress to
// kpush's source port, DNS and the registry only; kpush's Pod ingress on SSH, on the source
// port from build Pods only and on the ops port only from networkPolicy.ops.from, egress to
// DNS, the API server and the registry only. The ports must be the container's.
func checkNetworkPolicies(t *testing.T, name string, objs []*unstructured.Unstructured, set *appsv1.StatefulSet) {
	t.Helper()
	policies := map[string]*networkingv1.NetworkPolicy{}
	for _, o := range objs {
		if o.GetKind() != "NetworkPolicy" {
			continue
		}
		var np networkingv1.NetworkPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &np); err != nil {
			t.Fatal(err)
		}
		policies[np.Name] = &np
	}
	if name == "existing host key" { // networkPolicy.enabled=false
		if len(policies) != 0 {
			t.Errorf("NetworkPolicies rendered with networkPolicy.enabled=false: %v", slices.Collect(maps.Keys(policies)))
		}
		return
	}
	builds, kp := policies["kpush-builds"], policies["kpush"]
	if builds == nil || kp == nil || len(policies) != 2 {
		t.Fatalf("NetworkPolicies %v, want kpush and kpush-builds", slices.Collect(maps.Keys(policies)))
	}

	// The ports the rules name are the container's.
	ports := map[string]int32{}
	for _, p := range set.Spec.Template.Spec.Containers[0].Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["ssh"] != 2222 || ports["source"] != 8082 || ports["ops"] != 8081 {
		t.Errorf("container ports %v, want ssh 2222, source 8082, ops 8081 as the NetworkPolicies say", ports)
	}
	// Build Pods run in the release namespace, where the policies are.
	for _, e := range set.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "KPUSH_BUILD_NAMESPACE" && (e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace") {
			t.Errorf("KPUSH_BUILD_NAMESPACE is not the release namespace: %+v", e)
		}
	}

	// Each policy selects its Pods and only them: a real build Pod, the StatefulSet's Pod.
	buildPod, err := buildpack.BuildPod(buildpack.PodSpec{Name: "kpush-build-demo-x", App: "demo", Tag: "20260101-000000-abcdef",
		Image: "registry.example.com/apps/demo", KpushImage: "registry.example.com/kpush", SourceURL: "http://kpush-source:8082/source", SourceToken: "t"})
	if err != nil {
		t.Fatal(err)
	}
	buildLabels, kpushLabels := labels.Set(buildPod.Labels), labels.Set(set.Spec.Template.Labels)
	selects := func(sel *metav1.LabelSelector, l labels.Set) bool {
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			t.Fatalf("selector %v: %v", sel, err)
		}
		return s.Matches(l)
	}
	if !selects(&builds.Spec.PodSelector, buildLabels) || selects(&builds.Spec.PodSelector, kpushLabels) {
		t.Errorf("kpush-builds selects %v: build Pod %v kpush's Pod %v; want only build Pods", builds.Spec.PodSelector,
			selects(&builds.Spec.PodSelector, buildLabels), selects(&builds.Spec.PodSelector, kpushLabels))
	}
	if !selects(&kp.Spec.PodSelector, kpushLabels) || selects(&kp.Spec.PodSelector, buildLabels) {
		t.Errorf("kpush selects %v: kpush's Pod %v build Pod %v; want only kpush's Pod", kp.Spec.PodSelector,
			selects(&kp.Spec.PodSelector, kpushLabels), selects(&kp.Spec.PodSelector, buildLabels))
	}
	// The source rules' pod selectors: build Pods reach kpush's Pod, and only build Pods
	// reach its source port.
	source := func(ports []networkingv1.NetworkPolicyPort) bool {
		return slices.ContainsFunc(ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port != nil && p.Port.IntValue() == 8082 })
	}
	for _, r := range builds.Spec.Egress {
		if source(r.Ports) && (len(r.To) != 1 || r.To[0].PodSelector == nil || r.To[0].NamespaceSelector != nil || !selects(r.To[0].PodSelector, kpushLabels)) {
			t.Errorf("kpush-builds egress rule %s: want the source port of kpush's Pod in this namespace", describeRule(r.Ports, r.To))
		}
	}
	for _, r := range kp.Spec.Ingress {
		if source(r.Ports) && (len(r.From) != 1 || r.From[0].PodSelector == nil || r.From[0].NamespaceSelector != nil || !selects(r.From[0].PodSelector, buildLabels)) {
			t.Errorf("kpush ingress rule %s: want the source port for this namespace's build Pods only", describeRule(r.Ports, r.From))
		}
	}

	both := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	for _, np := range []*networkingv1.NetworkPolicy{builds, kp} {
		if !slices.Equal(np.Spec.PolicyTypes, both) {
			t.Errorf("%s: policyTypes %v, want %v (what no rule allows is denied both ways)", np.Name, np.Spec.PolicyTypes, both)
		}
	}
	const (
		kpushPods = "pods(app.kubernetes.io/instance=kpush,app.kubernetes.io/name=kpush)"
		buildPods = "pods(app.kubernetes.io/managed-by=kpush,kpush.dev/build)"
		kubeDNS   = "ns(kubernetes.io/metadata.name=kube-system) pods(k8s-app=kube-dns)"
	)
	want := map[string]struct{ buildsEgress, kpushIngress, kpushEgress []string }{
		"default": {
			buildsEgress: []string{"TCP:8082 " + kpushPods, "UDP:53,TCP:53 " + kubeDNS, "TCP:443 anywhere"},
			kpushIngress: []string{"TCP:2222 anywhere", "TCP:8082 " + buildPods},
			kpushEgress:  []string{"UDP:53,TCP:53 " + kubeDNS, "TCP:443,TCP:6443 anywhere", "TCP:443 anywhere"},
		},
		"custom": {
			buildsEgress: []string{"TCP:8082 " + kpushPods, "UDP:53 ip(169.254.20.10/32)",
				"TCP:5000 ip(203.0.113.0/24) | ns(kubernetes.io/metadata.name=registry) pods(app=registry)",
				"TCP:443 ip(0.0.0.0/0 except [10.0.0.0/8])"},
			kpushIngress: []string{"TCP:2222 ip(192.0.2.0/24)", "TCP:8082 " + buildPods,
				"TCP:8081 ns(kubernetes.io/metadata.name=monitoring)", "TCP:8081 pods(app=debug)"},
			kpushEgress: []string{"UDP:53 ip(169.254.20.10/32)", "TCP:6443 ip(198.51.100.10/32)",
				"TCP:5000 ip(203.0.113.0/24) | ns(kubernetes.io/metadata.name=registry) pods(app=registry)",
				"TCP:9000 ip(192.0.2.50/32)"},
		},
	}[name]
	var buildsEgress, kpushIngress, kpushEgress []string
	for _, r := range builds.Spec.Egress {
		buildsEgress = append(buildsEgress, describeRule(r.Ports, r.To))
	}
	for _, r := range kp.Spec.Ingress {
		kpushIngress = append(kpushIngress, describeRule(r.Ports, r.From))
	}
	for _, r := range kp.Spec.Egress {
		kpushEgress = append(kpushEgress, describeRule(r.Ports, r.To))
	}
	for _, c := range []struct {
		what      string
		got, want []string
	}{
		{"kpush-builds ingress", describeIngress(builds.Spec.Ingress), nil},
		{"kpush-builds egress", buildsEgress, want.buildsEgress},
		{"kpush ingress", kpushIngress, want.kpushIngress},
		{"kpush egress", kpushEgress, want.kpushEgress},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s rules:\n  %s\nwant\n  %s", c.what, strings.Join(c.got, "\n  "), strings.Join(c.want, "\n  "))
		}
	}
}

func describeIngress(rules []networkingv1.NetworkPolicyIngressRule) []string {
	var d []string
	for _, r := range rules {
		d = append(d, describeRule(r.Ports, r.From))
	}
	return d
}

// describeRule says what a rule allows: "TCP:8082 pods(a=b)", "UDP:53,TCP:53 ns(x=y)
// pods(k=v)", "TCP:443 anywhere", peers separated by " | ".
func describeRule(ports []networkingv1.NetworkPolicyPort, peers []networkingv1.NetworkPolicyPeer) string {
	var ps, ds []string
	for _, p := range ports {
		proto := "TCP"
		if p.Protocol != nil {
			proto = string(*p.Protocol)
		}
		port := "any"
		if p.Port != nil {
			port = p.Port.String()
		}
		ps = append(ps, proto+":"+port)
	}
	if len(ps) == 0 {
		ps = []string{"all-ports"}
	}
	for _, p := range peers {
		var parts []string
		if p.IPBlock != nil {
			b := p.IPBlock.CIDR
			if len(p.IPBlock.Except) > 0 {
				b += fmt.Sprintf(" except %v", p.IPBlock.Except)
			}
			parts = append(parts, "ip("+b+")")
		}
		if p.NamespaceSelector != nil {
			parts = append(parts, "ns("+metav1.FormatLabelSelector(p.NamespaceSelector)+")")
		}
		if p.PodSelector != nil {
			parts = append(parts, "pods("+metav1.FormatLabelSelector(p.PodSelector)+")")
		}
		ds = append(ds, strings.Join(parts, " "))
	}
	if len(ds) == 0 {
		ds = []string{"anywhere"}
	}
	return strings.Join(ps, ",") + " " + strings.Join(ds, " | ")
}

// roleRules checks that the Role name in namespace ns lets kpush write Knative Services.
func roleRules(t *testing.T, objs []*unstructured.Unstructured, ns, name string) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "Role" || o.GetNamespace() != ns || o.GetName() != name {
			continue
		}
		for _, r := range o.Object["rules"].([]any) {
			r := r.(map[string]any)
			if fmt.Sprint(r["apiGroups"]) == "[serving.knative.dev]" && fmt.Sprint(r["resources"]) == "[services]" &&
				slices.Contains(r["verbs"].([]any), any("create")) && slices.Contains(r["verbs"].([]any), any("watch")) {
				return
			}
		}
		t.Errorf("Role %s/%s does not allow create and watch on Knative Services: %v", ns, name, o.Object["rules"])
		return
	}
	t.Errorf("no Role %s in namespace %s", name, ns)
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			return o
		}
	}
	t.Fatalf("no %s %q rendered", kind, name)
	return nil
}

// decode splits helm's multi-document YAML into objects.
func decode(t *testing.T, manifests string) []*unstructured.Unstructured {
	t.Helper()
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		err := d.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decoding rendered manifests: %v\n%s", err, manifests)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	if len(objs) == 0 {
		t.Fatalf("helm rendered no manifests")
	}
	return objs
}

func dynamicClient(t *testing.T) (dynamic.Interface, meta.RESTMapper) {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(apiserver)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(apiserver)
	if err != nil {
		t.Fatal(err)
	}
	return dyn, restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
}

// dryRunCreate creates o with DryRun=All, in defaultNS when the template left the namespace
// out.
func dryRunCreate(t *testing.T, o *unstructured.Unstructured, defaultNS string) {
	t.Helper()
	dyn, mapper := dynamicClient(t)
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(schema.GroupKind{Group: gvk.Group, Kind: gvk.Kind}, gvk.Version)
	if err != nil {
		t.Errorf("%s %s: no such resource on the API server: %v", gvk.Kind, o.GetName(), err)
		return
	}
	var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := o.GetNamespace()
		if ns == "" {
			ns = defaultNS
		}
		r = dyn.Resource(m.Resource).Namespace(ns)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.Create(ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}); err != nil {
		t.Errorf("server-side dry-run of %s %s/%s: %v", gvk.Kind, o.GetNamespace(), o.GetName(), err)
	}
}

// TestHostKeyKeptAcrossUpgrade installs the chart for real on the API server, upgrades it with
// changed values, uninstalls and reinstalls it, and checks that the SSH host key Secret never
// changes; that x/crypto/ssh (what gitserver uses) reads the generated key as ed25519; and that
// the fingerprint command in NOTES.txt prints the key's SHA256 fingerprint.
func TestHostKeyKeptAcrossUpgrade(t *testing.T) {
	ns := knativetest.Namespace(t, apiserver)
	kc := knativetest.WriteKubeconfig(t, apiserver, ns)
	base := []string{"kpush", chart, "--namespace", ns, "--kubeconfig", kc}
	kcs, err := kubernetes.NewForConfig(apiserver)
	if err != nil {
		t.Fatal(err)
	}
	hostKey := func() []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := kcs.CoreV1().Secrets(ns).Get(ctx, "kpush-ssh-host-key", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("reading the host key Secret: %v", err)
		}
		return s.Data[hostKeyName]
	}

	// A render without the cluster makes a new key each time: it is lookup that keeps it.
	k1 := renderedHostKey(t, helm(t, append([]string{"template"}, base[:2]...)...))
	k2 := renderedHostKey(t, helm(t, append([]string{"template"}, base[:2]...)...))
	if bytes.Equal(k1, k2) {
		t.Fatalf("two offline renders gave the same host key; the generator is not random")
	}

	notes := helm(t, append(append([]string{"install"}, base...), "--set", "admin.publicKeys[0]="+adminKey, "--set", "registry.url=registry.example.com/apps")...)
	key := hostKey()
	signer, err := gossh.ParsePrivateKey(key)
	if err != nil {
		t.Fatalf("x/crypto/ssh cannot parse the generated host key: %v\n%s", err, key)
	}
	if typ := signer.PublicKey().Type(); typ != gossh.KeyAlgoED25519 {
		t.Fatalf("host key type %s, want %s", typ, gossh.KeyAlgoED25519)
	}
	checkNotes(t, notes, ns, key, gossh.FingerprintSHA256(signer.PublicKey()))

	// What `helm upgrade` renders, seen before it applies anything: lookup reaches the server.
	dry := helm(t, append(append([]string{"upgrade"}, base...), "--reuse-values", "--dry-run=server", "--set", "registry.url=other.example.com/apps")...)
	if got := renderedHostKey(t, dry); !bytes.Equal(got, key) {
		t.Errorf("helm upgrade --dry-run=server renders another host key:\n%s\nwant\n%s", got, key)
	}
	helm(t, append(append([]string{"upgrade"}, base...), "--reuse-values", "--set", "registry.url=other.example.com/apps")...)
	if got := hostKey(); !bytes.Equal(got, key) {
		t.Errorf("helm upgrade changed the host key:\n%s\nwant\n%s", got, key)
	}
	helm(t, append([]string{"uninstall"}, base[0], "--namespace", ns, "--kubeconfig", kc)...)
	if got := hostKey(); !bytes.Equal(got, key) {
		t.Errorf("host key changed or removed by helm uninstall")
	}
	helm(t, append(append([]string{"install"}, base...), "--set", "admin.publicKeys[0]="+adminKey, "--set", "registry.url=registry.example.com/apps")...)
	if got := hostKey(); !bytes.Equal(got, key) {
		t.Errorf("reinstall after uninstall changed the host key")
	}
	// The ConfigMap and StatefulSet of the release exist: the install did apply.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := kcs.AppsV1().StatefulSets(ns).Get(ctx, "kpush", metav1.GetOptions{}); apierrors.IsNotFound(err) {
		t.Errorf("helm install created no StatefulSet")
	}
}

// renderedHostKey returns the decoded host key of the Secret in helm's output.
func renderedHostKey(t *testing.T, out string) []byte {
	t.Helper()
	// helm install/upgrade print NOTES after the manifests; decode only the manifests.
	if i := strings.Index(out, "\nNOTES:"); i >= 0 {
		out = out[:i]
	}
	if i := strings.Index(out, "\n---"); i >= 0 && !strings.HasPrefix(out, "---") {
		out = out[i:] // drop helm's release summary before the first document
	}
	for _, o := range decode(t, out) {
		if o.GetKind() != "Secret" {
			continue
		}
		v, _ := o.Object["data"].(map[string]any)[hostKeyName].(string)
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			t.Fatalf("host key in Secret %s: %v", o.GetName(), err)
		}
		return b
	}
	t.Fatalf("no host key Secret in:\n%s", out)
	return nil
}

// checkNotes checks that NOTES.txt gives the git remote line and a fingerprint command that,
// run on the key in the Secret, prints fp.
func checkNotes(t *testing.T, notes, ns string, key []byte, fp string) {
	t.Helper()
	if !strings.Contains(notes, "git remote add knative ssh://git@$HOST:$PORT/hello") {
		t.Errorf("NOTES lack the git remote add line:\n%s", notes)
	}
	if !strings.Contains(notes, "ssh-keyscan -t ed25519 -p $PORT $HOST") {
		t.Errorf("NOTES lack the ssh-keyscan command:\n%s", notes)
	}
	kubectl := "kubectl -n " + ns + " get secret kpush-ssh-host-key -o jsonpath='{.data.ssh_host_ed25519_key}'"
	var line string
	for _, l := range strings.Split(notes, "\n") {
		if strings.Contains(l, kubectl) {
			line = strings.TrimSpace(l)
		}
	}
	if line == "" {
		t.Fatalf("NOTES lack the command %q:\n%s", kubectl, notes)
	}
	openssl, err := tools.Path("openssl")
	if err != nil {
		t.Fatalf("openssl checks the fingerprint command of NOTES.txt: %v", err)
	}
	// The same pipeline, fed the Secret's data instead of kubectl's output.
	script := strings.Replace(line, kubectl, "printf %s '"+base64.StdEncoding.EncodeToString(key)+"'", 1)
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(openssl)+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("NOTES fingerprint command: %v\n%s\n%s", err, script, out)
	}
	if got := strings.TrimSpace(string(out)); got != fp {
		t.Errorf("NOTES fingerprint command printed %q, want %q", got, fp)
	}
}

// show is *p for messages, "unset" for nil.
func show[T any](p *T) any {
	if p == nil {
		return "unset"
	}
	return *p
}
