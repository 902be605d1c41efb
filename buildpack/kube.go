package buildpack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// Kube builds in the cluster: each build is a Pod (BuildPod) from the CNB builder image, whose
// source container fetches the pushed tree from Sources with a single-use token. Kube follows
// each container's log live to the pusher, resolves the image digest from the build's unique
// tag in the registry (never from Pod output), and deletes the Pod when the build ends, also on
// failure or cancel. Safe for concurrent use. Needs pods create, get, watch, delete and
// pods/log get in Namespace.
type Kube struct {
	// Client reaches the cluster. Required.
	Client kubernetes.Interface
	// Namespace the build Pods run in. Required.
	Namespace string
	// Sources serves build contexts; SourceURL is where build Pods reach it (e.g.
	// "http://kpush.kpush.svc:8080/source"). Required.
	Sources   *SourceServer
	SourceURL string
	// KpushImage is kpush's own image (runs `kpush source fetch`). Required.
	KpushImage string
	// BuilderImage, RunImage, RegistrySecret, ServiceAccount, Resources, Deadline, UserID,
	// GroupID, InsecureRegistries and ImagePullSecrets go to every PodSpec (see there).
	BuilderImage       string
	RunImage           string
	RegistrySecret     string
	ServiceAccount     string
	Resources          corev1.ResourceRequirements
	Deadline           time.Duration
	UserID, GroupID    int64
	InsecureRegistries []string
	ImagePullSecrets   []string
	// Keychain authenticates kpush's own registry reads (resolving the tag). Nil:
	// authn.DefaultKeychain ($DOCKER_CONFIG/config.json).
	Keychain authn.Keychain
	// RemoteOptions are extra go-containerregistry options for that read (e.g. a transport).
	RemoteOptions []remote.Option
	// Logs opens a container's log, following it until the container ends. Nil: the pods/log
	// API with follow=true. (Tests without a kubelet stand in for it.)
	Logs func(ctx context.Context, namespace, pod, container string) (io.ReadCloser, error)
	// Log gets internal detail (pod names, phases, exit codes). Nil: discarded.
	Log *slog.Logger
}

// failingWaits are container waiting reasons that never resolve by themselves.
var failingWaits = map[string]bool{
	"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true,
	"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true,
}

// Build runs req as a build Pod and publishes req.Image:<unique tag>, reusing unchanged layers
// of req.PreviousImage (analyzer -previous-image, see Request). Output: one line per
// container start ("-----> Fetching source" ...) and the lifecycle's and buildpacks' output,
// cleaned of terminal escapes. Errors: *Error with ErrDetect, ErrBuild, ErrExport (mapped from
// the phase's exit code, Platform API 0.14) or ErrLifecycle (the source fetch, an image pull,
// the deadline, a vanished Pod); a plain error for a bad request or a refused Pod; ctx.Err()
// wrapped when ctx ends. The Pod is deleted before Build returns.
func (k *Kube) Build(ctx context.Context, req Request, out io.Writer) (Result, error) {
	log := k.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("app", req.App)
	if err := validateRequest(req); err != nil {
		return Result{}, err
	}
	if len(req.Group) > 0 {
		// The Pod runs the builder image's own /cnb/order.toml; a per-build order is not wired.
		return Result{}, errors.New("a buildpack group ([[io.buildpacks.group]] in project.toml) is not supported with the kube builder yet; " +
			"remove it to build with the builder's order")
	}
	if k.Client == nil || k.Sources == nil || k.SourceURL == "" || k.Namespace == "" {
		return Result{}, errors.New("buildpack.Kube: Client, Namespace, Sources and SourceURL are required")
	}
	repo, previous, noPrevious, err := outputRepository(req, log)
	if err != nil {
		return Result{}, err
	}
	tag := newTag(time.Now())
	podName := "kpush-build-" + req.App + "-" + tag
	token, err := k.Sources.Register(podName, req.SourceDir)
	if err != nil {
		return Result{}, err
	}
	defer k.Sources.Revoke(token)
	pod, err := BuildPod(PodSpec{
		Name: podName, Namespace: k.Namespace, App: req.App, Tag: tag, Image: req.Image, PreviousImage: previous,
		BuilderImage: k.BuilderImage, RunImage: k.RunImage, KpushImage: k.KpushImage,
		SourceURL: k.SourceURL, SourceToken: token, Env: req.Env,
		RegistrySecret: k.RegistrySecret, ServiceAccount: k.ServiceAccount, Resources: k.Resources,
		Deadline: k.Deadline, UserID: k.UserID, GroupID: k.GroupID,
		InsecureRegistries: k.InsecureRegistries, ImagePullSecrets: k.ImagePullSecrets,
	})
	if err != nil {
		return Result{}, err
	}
	pods := k.Client.CoreV1().Pods(k.Namespace)
	t0 := time.Now()
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return Result{}, fmt.Errorf("creating build pod %s in namespace %s: %w", podName, k.Namespace, err)
	}
	log = log.With("pod", podName)
	log.Info("build pod created", "image", repo.Tag(tag).String())
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		err := pods.Delete(dctx, podName, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
		if err != nil && !apierrors.IsNotFound(err) {
			log.Warn("deleting build pod", "err", err)
		}
	}()
	fmt.Fprintf(out, "-----> Building in pod %s/%s\n", k.Namespace, podName)

	sink := &lineSink{out: out, freshImage: repo.Tag(tag).String(), noPrevious: noPrevious}
	for _, c := range pod.Spec.InitContainers {
		code, err := k.runContainer(ctx, podName, c.Name, sink)
		if err != nil {
			if ctx.Err() != nil {
				return Result{}, fmt.Errorf("building %s: %w", req.App, ctx.Err())
			}
			log.Warn("build pod failed", "container", c.Name, "err", err)
			return Result{}, err
		}
		if code != 0 {
			e := k.containerError(c.Name, code, sink.lastError(), req.Image)
			log.Warn("build failed", "container", c.Name, "exit_code", code, "kind", e.Kind, "duration", time.Since(t0))
			return Result{}, e
		}
	}
	var opts []remote.Option
	kc := k.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	opts = append(opts, remote.WithContext(ctx), remote.WithAuthFromKeychain(kc))
	opts = append(opts, k.RemoteOptions...)
	desc, err := remote.Head(repo.Tag(tag), opts...)
	if err != nil {
		return Result{}, &Error{Kind: ErrExport, ExitCode: 0, Err: err,
			Msg:  fmt.Sprintf("the build finished but %s could not be read back from the registry", repo.Tag(tag)),
			Hint: "check that kpush's registry credentials can read " + repo.String()}
	}
	res := Result{Image: repo.Digest(desc.Digest.String()).String()}
	log.Info("build finished", "image", res.Image, "duration", time.Since(t0))
	return res, nil
}

// runContainer waits for container c of the Pod to start, copies its log to sink until it
// ends, and returns its exit code. An error means it never ran to an exit code: the Pod
// failed, vanished, hit its deadline, or the image could not be pulled.
func (k *Kube) runContainer(ctx context.Context, pod, c string, sink *lineSink) (int, error) {
	_, err := k.waitPod(ctx, pod, func(p *corev1.Pod) (bool, error) {
		st := containerStatus(p, c)
		if st != nil && (st.State.Running != nil || st.State.Terminated != nil) {
			return true, nil
		}
		if st != nil && st.State.Waiting != nil && failingWaits[st.State.Waiting.Reason] {
			return false, &Error{Kind: ErrLifecycle, ExitCode: -1,
				Msg:  fmt.Sprintf("the build container %s could not start: %s: %s", c, st.State.Waiting.Reason, st.State.Waiting.Message),
				Hint: "check the builder and kpush image names and the image pull secrets"}
		}
		return false, podEnded(p)
	})
	if err != nil {
		return -1, err
	}
	sink.emit([]byte("-----> " + phaseTitle[c]))
	open := k.Logs
	if open == nil {
		open = k.apiLogs
	}
	rc, err := open(ctx, k.Namespace, pod, c)
	if err != nil {
		return -1, fmt.Errorf("reading the log of build container %s: %w", c, err)
	}
	lw := &lineWriter{sink: sink}
	_, cerr := io.Copy(lw, rc)
	rc.Close()
	lw.Flush()
	if cerr != nil && ctx.Err() == nil {
		k.log().Warn("build log stream broke", "pod", pod, "container", c, "err", cerr)
	}
	p, err := k.waitPod(ctx, pod, func(p *corev1.Pod) (bool, error) {
		if st := containerStatus(p, c); st != nil && st.State.Terminated != nil {
			return true, nil
		}
		return false, podEnded(p)
	})
	if err != nil {
		return -1, err
	}
	return int(containerStatus(p, c).State.Terminated.ExitCode), nil
}

var phaseTitle = map[string]string{
	ContainerSource: "Fetching source", ContainerAnalyze: "Analyzing", ContainerDetect: "Detecting",
	ContainerRestore: "Restoring", ContainerBuild: "Building", ContainerExport: "Exporting",
}

func (k *Kube) log() *slog.Logger {
	if k.Log != nil {
		return k.Log
	}
	return slog.New(slog.DiscardHandler)
}

func (k *Kube) apiLogs(ctx context.Context, ns, pod, c string) (io.ReadCloser, error) {
	return k.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: c, Follow: true}).Stream(ctx)
}

// podEnded returns an *Error if the Pod failed as a whole (deadline, eviction) or was marked
// Succeeded/Failed while a container is still awaited.
func podEnded(p *corev1.Pod) error {
	if p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded {
		return nil
	}
	msg := "the build pod stopped"
	if p.Status.Reason == "DeadlineExceeded" {
		msg = "the build took too long and was stopped"
		if d := p.Spec.ActiveDeadlineSeconds; d != nil {
			msg += fmt.Sprintf(" (limit %s)", time.Duration(*d)*time.Second)
		}
	} else if p.Status.Reason != "" || p.Status.Message != "" {
		msg += ": " + strings.TrimSpace(p.Status.Reason+" "+p.Status.Message)
	}
	return &Error{Kind: ErrLifecycle, Msg: msg, ExitCode: -1}
}

// containerError maps a phase container's exit code to an *Error.
func (k *Kube) containerError(c string, code int, detail, image string) *Error {
	if c == ContainerSource {
		return &Error{Kind: ErrLifecycle, ExitCode: code, Detail: detail,
			Msg:  "the build pod could not fetch the pushed source",
			Hint: "check that build pods can reach kpush at " + k.SourceURL}
	}
	if code == 137 || code == 143 {
		return &Error{Kind: ErrLifecycle, ExitCode: code, Detail: detail,
			Msg:  fmt.Sprintf("the %s phase was killed (exit code %d), e.g. for running out of memory", c, code),
			Hint: "raise the build pod's memory limit"}
	}
	return lifecycleError(code, detail, image, nil)
}

// containerStatus returns the status of container c (init or main), or nil.
func containerStatus(p *corev1.Pod, c string) *corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for i := range list {
			if list[i].Name == c {
				return &list[i]
			}
		}
	}
	return nil
}

// waitPod watches the Pod until cond is true or returns an error (client-go's
// watchtools.UntilWithSync: an informer that re-lists when the watch breaks or its resource
// version is too old).
func (k *Kube) waitPod(ctx context.Context, name string, cond func(*corev1.Pod) (bool, error)) (*corev1.Pod, error) {
	pods := k.Client.CoreV1().Pods(k.Namespace)
	byName := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = byName
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName
			return pods.Watch(ctx, o)
		},
	}
	deleted := &Error{Kind: ErrLifecycle, ExitCode: -1, Msg: "the build pod " + name + " was deleted while the build ran"}
	exists := func(store cache.Store) (bool, error) {
		if _, ok, err := store.GetByKey(k.Namespace + "/" + name); err != nil || !ok {
			return false, deleted
		}
		return false, nil
	}
	ev, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, exists, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Deleted {
			return false, deleted
		}
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			return false, nil
		}
		return cond(p)
	})
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil && ev != nil:
		p, _ := ev.Object.(*corev1.Pod)
		return p, err // cond's verdict, with the Pod it was made on
	case err != nil:
		return nil, err
	}
	return ev.Object.(*corev1.Pod), nil
}
