// Package knative deploys releases as Knative Serving Services (serving.knative.dev/v1,
// https://knative.dev/docs/serving/reference/serving-api/) and waits until they are Ready.
//
// Every write is a read-modify-write of one Service that carries the resourceVersion it read;
// each operation changes only the fields it owns, so a conflict with another writer is
// resolved by re-reading and re-applying those fields, never by overwriting theirs. Deploy,
// DeployFrom and ApplyPlan (plan.go) also remember the value each owned field was planned on
// and fail with deployer.ErrFieldConflict when another writer changed that same field meanwhile.
package knative

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	servingclientset "knative.dev/serving/pkg/client/clientset/versioned"

	"kpush.dev/kpush/deployer"
)

// Labels and annotations kpush writes on the Services it manages.
const (
	LabelManagedBy    = "app.kubernetes.io/managed-by" // on the Service; value ManagedBy
	ManagedBy         = "kpush"
	AnnotationApp     = "kpush.dev/app"     // on the Service and its revision template
	AnnotationCommit  = "kpush.dev/commit"  // 40-hex git commit of the release
	AnnotationPusher  = "kpush.dev/pusher"  // who pushed the release
	AnnotationRelease = "kpush.dev/release" // the release's "vN" (receiver's numbering), when known
)

// Defaults for New.
const (
	DefaultReadyTimeout     = 5 * time.Minute
	DefaultPollInterval     = 2 * time.Second
	DefaultMaxWriteAttempts = 5
)

// conflictBackoff is the pause before the second write attempt after a conflict; it doubles
// (with jitter) before each one after.
const conflictBackoff = 50 * time.Millisecond

// Errors returned (wrapped) by Deploy, Apply and WaitReady; test with errors.Is.
var (
	ErrInvalidRelease = errors.New("invalid release")
	ErrNotManaged     = errors.New("service not managed by kpush")
	ErrNotReady       = errors.New("service not ready")
	ErrReadyTimeout   = errors.New("service not ready in time")
	ErrConflict       = errors.New("too many conflicting writes")
)

// reservedEnv are the variables Knative sets itself and refuses in a container's env
// (knative.dev/serving pkg/apis/serving/k8s_validation.go, reservedEnvVars).
var reservedEnv = []string{"PORT", "K_SERVICE", "K_CONFIGURATION", "K_REVISION"}

// Deployer puts releases into service as Knative Services in one namespace. It implements
// deployer.Deployer. Build it with New; it is safe for concurrent use.
type Deployer struct {
	cs           servingclientset.Interface
	ns           string
	readyTimeout time.Duration
	pollInterval time.Duration
	maxAttempts  int
	log          *slog.Logger
}

var _ deployer.Deployer = (*Deployer)(nil)

// Option configures a Deployer.
type Option func(*Deployer)

// WithReadyTimeout sets how long Deploy waits for Ready after writing (default 5 min).
func WithReadyTimeout(d time.Duration) Option { return func(k *Deployer) { k.readyTimeout = d } }

// WithPollInterval sets how often the Ready wait also reads the Service directly, as a
// fallback for a watch that cannot start or breaks (default 2 s).
func WithPollInterval(d time.Duration) Option { return func(k *Deployer) { k.pollInterval = d } }

// WithMaxWriteAttempts bounds the read-modify-write attempts of one Apply when writes conflict
// (default 5).
func WithMaxWriteAttempts(n int) Option { return func(k *Deployer) { k.maxAttempts = n } }

// WithLogger sets the logger for internal detail (default: discard).
func WithLogger(l *slog.Logger) Option { return func(k *Deployer) { k.log = l } }

// New returns a Deployer that writes serving.knative.dev/v1 Services in namespace through cs.
func New(cs servingclientset.Interface, namespace string, opts ...Option) *Deployer {
	d := &Deployer{
		cs:           cs,
		ns:           namespace,
		readyTimeout: DefaultReadyTimeout,
		pollInterval: DefaultPollInterval,
		maxAttempts:  DefaultMaxWriteAttempts,
		log:          slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		o(d)
	}
	if d.maxAttempts < 1 {
		d.maxAttempts = 1
	}
	if d.pollInterval <= 0 {
		d.pollInterval = DefaultPollInterval
	}
	d.log = d.log.With("namespace", namespace)
	return d
}

// Deploy creates or updates the Service named r.App so that it runs r.Image with r.Env, then
// waits until the Knative controller reports it Ready for that generation, and returns
// status.url (e.g. "http://demo.default.example.com"). Progress lines go to out.
//
// Errors (wrapped, see errors.Is): ErrInvalidRelease (name not DNS-1035, image not by digest,
// reserved env name), ErrNotManaged (a Service of that name exists without label
// app.kubernetes.io/managed-by=kpush), ErrConflict, ErrNotReady (Ready=False: reason and
// message), ErrReadyTimeout, deployer.ErrFieldConflict, or the API error. On error the previous
// revision keeps serving.
//
// Deploy plans on the Service as it first reads it (PlanRelease from that state to r): if a
// write conflicts (409), it re-reads and re-applies only the image and the environment
// variables it changes, and fails with deployer.ErrFieldConflict if another writer changed one of
// those in between. DeployFrom takes the base from the caller instead.
func (d *Deployer) Deploy(ctx context.Context, r deployer.Release, out io.Writer) (string, error) {
	return d.deploy(ctx, nil, r, out) // plan.go: based on the Service as first read
}

// ValidateRelease checks what Deploy needs of r: App a DNS-1035 label, Image a digest
// reference ("<repository>@sha256:<64 hex>"), no env name Knative reserves (PORT, K_SERVICE,
// K_CONFIGURATION, K_REVISION) and every env name a C identifier. Errors wrap ErrInvalidRelease.
func ValidateRelease(r deployer.Release) error {
	if errs := validation.IsDNS1035Label(r.App); len(errs) > 0 {
		return fmt.Errorf("%w: app name %q: %s", ErrInvalidRelease, r.App, errs[0])
	}
	if _, err := name.NewDigest(r.Image); err != nil {
		return fmt.Errorf("%w: image %q is not a digest reference (<repository>@sha256:<64 hex>); Knative needs the digest so every revision runs exactly the image that was built: %v",
			ErrInvalidRelease, r.Image, err)
	}
	for k := range r.Env {
		if slices.Contains(reservedEnv, k) {
			return fmt.Errorf("%w: environment variable %s is set by Knative and cannot be configured", ErrInvalidRelease, k)
		}
		if errs := validation.IsEnvVarName(k); len(errs) > 0 {
			return fmt.Errorf("%w: environment variable name %q: %s", ErrInvalidRelease, k, errs[0])
		}
	}
	return nil
}

// Mutation sets the fields one operation owns on a Service and leaves every other field as
// it is. Apply calls it on a freshly read copy for each attempt (or on a new Service carrying
// only name, namespace and the managed-by label), so it must be idempotent and must not depend
// on what an earlier attempt saw. An error stops Apply without writing.
type Mutation func(*servingv1.Service) error

// ReleaseMutation owns what a push changes: ImageMutation(r.Image), EnvMutation(r.Env) and
// AnnotationsMutation with kpush.dev/app, kpush.dev/commit, kpush.dev/pusher and, when
// r.Version > 0, kpush.dev/release ("v<N>"). Traffic, labels, other annotations, other
// containers and other container fields are left alone.
func ReleaseMutation(r deployer.Release) Mutation {
	ann := map[string]string{AnnotationApp: r.App, AnnotationCommit: r.Commit, AnnotationPusher: r.Pusher}
	if r.Version > 0 {
		ann[AnnotationRelease] = "v" + strconv.Itoa(r.Version)
	}
	return Mutations(
		ImageMutation(r.Image),
		EnvMutation(r.Env),
		AnnotationsMutation(ann),
	)
}

var _ deployer.Destroyer = (*Deployer)(nil)

// Destroy deletes the Service named app (Knative then removes its Configurations, Revisions
// and Routes by owner reference). A missing Service is not an error; a Service without label
// app.kubernetes.io/managed-by=kpush is refused with ErrNotManaged.
func (d *Deployer) Destroy(ctx context.Context, app string) error {
	services := d.cs.ServingV1().Services(d.ns)
	cur, err := services.Get(ctx, app, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading Knative Service %s/%s: %w", d.ns, app, err)
	}
	if cur.Labels[LabelManagedBy] != ManagedBy {
		return fmt.Errorf("%w: Knative Service %s in namespace %s was not created by kpush (label %s=%s missing); kpush will not delete it",
			ErrNotManaged, app, d.ns, LabelManagedBy, ManagedBy)
	}
	uid := cur.UID
	err = services.Delete(ctx, app, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting Knative Service %s/%s: %w", d.ns, app, err)
	}
	d.log.Info("service deleted", "app", app)
	return nil
}

// Mutations applies ms in order and stops at the first error.
func Mutations(ms ...Mutation) Mutation {
	return func(s *servingv1.Service) error {
		for _, m := range ms {
			if err := m(s); err != nil {
				return err
			}
		}
		return nil
	}
}

// ImageMutation owns spec.template.spec.containers[0].image (creating containers[0] if the
// template has none).
func ImageMutation(image string) Mutation {
	return func(s *servingv1.Service) error {
		firstContainer(s).Image = image
		return nil
	}
}

// EnvMutation owns all of spec.template.spec.containers[0].env: it becomes env sorted by
// name (nil when env is empty). envFrom is left alone.
func EnvMutation(env map[string]string) Mutation {
	vars := envVars(env)
	return func(s *servingv1.Service) error {
		firstContainer(s).Env = slices.Clone(vars)
		return nil
	}
}

// AnnotationsMutation owns the keys of ann on the Service and on its revision template
// (spec.template.metadata.annotations); other annotations are kept.
func AnnotationsMutation(ann map[string]string) Mutation {
	return func(s *servingv1.Service) error {
		s.Annotations = withAll(s.Annotations, ann)
		s.Spec.Template.Annotations = withAll(s.Spec.Template.Annotations, ann)
		return nil
	}
}

func firstContainer(s *servingv1.Service) *corev1.Container {
	spec := &s.Spec.Template.Spec
	if len(spec.Containers) == 0 {
		spec.Containers = []corev1.Container{{}}
	}
	return &spec.Containers[0]
}

func envVars(m map[string]string) []corev1.EnvVar {
	var env []corev1.EnvVar
	for _, k := range slices.Sorted(maps.Keys(m)) {
		env = append(env, corev1.EnvVar{Name: k, Value: m[k]})
	}
	return env
}

func withAll(dst, src map[string]string) map[string]string {
	if dst == nil {
		dst = make(map[string]string, len(src))
	}
	maps.Copy(dst, src)
	return dst
}

// Change says what Apply did.
type Change string

// Changes reported by Apply.
const (
	Created   Change = "created"
	Updated   Change = "updated"
	Unchanged Change = "unchanged"
)

// Apply reads the Service name, applies m to a copy and writes it back with the
// resourceVersion it read (create if there is none), and returns the Service as written. A
// write the API server answers with 409 Conflict (someone wrote in between) or AlreadyExists
// is retried from a fresh read, up to WithMaxWriteAttempts times in all, then fails with
// ErrConflict. If m changes nothing, nothing is written and Unchanged is returned. A Service
// without label app.kubernetes.io/managed-by=kpush is refused with ErrNotManaged.
func (d *Deployer) Apply(ctx context.Context, name string, m Mutation) (*servingv1.Service, Change, error) {
	return d.write(ctx, name, func(_, next *servingv1.Service, _ bool, _ int) error { return m(next) })
}

// write is the read-modify-write loop behind Apply and ApplyPlan. Each attempt reads the
// Service name (a fresh object labelled managed-by=kpush if there is none; an existing one
// without that label is refused with ErrNotManaged), lets modify change next, a copy of cur,
// and creates or updates it carrying the resourceVersion it read. An unchanged object is not
// written. A 409 Conflict or AlreadyExists starts the next attempt from a fresh read
// (client-go's retry.OnError, backing off from conflictBackoff), up to WithMaxWriteAttempts in
// all (then ErrConflict); any other error, including modify's, ends the loop.
func (d *Deployer) write(ctx context.Context, name string, modify func(cur, next *servingv1.Service, exists bool, attempt int) error) (*servingv1.Service, Change, error) {
	services := d.cs.ServingV1().Services(d.ns)
	log := d.log.With("app", name)
	var (
		written  *servingv1.Service
		change   Change
		attempt  int
		writeErr error // the last attempt's failed create or update
	)
	isConflict := func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }
	conflicting := func(err error) bool {
		if err != writeErr || !isConflict(err) || ctx.Err() != nil {
			return false
		}
		log.Warn("conflicting write, retrying from a fresh read", "attempt", attempt, "max_attempts", d.maxAttempts, "err", err)
		return true
	}
	backoff := wait.Backoff{Steps: d.maxAttempts, Duration: conflictBackoff, Factor: 2, Jitter: 0.2}
	err := retry.OnError(backoff, conflicting, func() error {
		attempt++
		cur, err := services.Get(ctx, name, metav1.GetOptions{})
		exists := true
		switch {
		case apierrors.IsNotFound(err):
			exists = false
			cur = &servingv1.Service{ObjectMeta: metav1.ObjectMeta{
				Name: name, Namespace: d.ns, Labels: map[string]string{LabelManagedBy: ManagedBy},
			}}
		case err != nil:
			return fmt.Errorf("reading Knative Service %s/%s: %w", d.ns, name, err)
		case cur.Labels[LabelManagedBy] != ManagedBy:
			return fmt.Errorf("%w: Knative Service %s in namespace %s exists and was not created by kpush (label %s=%s missing); kpush will not take it over: delete it with `kubectl delete ksvc %s -n %s`, or push under another app name",
				ErrNotManaged, name, d.ns, LabelManagedBy, ManagedBy, name, d.ns)
		}
		next := cur.DeepCopy()
		if err := modify(cur, next, exists, attempt); err != nil {
			return err
		}
		switch {
		case !exists:
			written, err = services.Create(ctx, next, metav1.CreateOptions{FieldManager: ManagedBy})
			change = Created
		case equality.Semantic.DeepEqual(cur, next):
			written, change = cur, Unchanged
			return nil
		default:
			written, err = services.Update(ctx, next, metav1.UpdateOptions{FieldManager: ManagedBy})
			change = Updated
		}
		writeErr = err
		return err
	})
	switch {
	case err == nil:
		return written, change, nil
	case err != writeErr: // reading, refusing, modify's
		return nil, "", err
	case ctx.Err() != nil:
		return nil, "", fmt.Errorf("writing Knative Service %s/%s: %w", d.ns, name, ctx.Err())
	case isConflict(err):
		return nil, "", fmt.Errorf("%w: Knative Service %s/%s changed under kpush %d times in a row; try again: %w",
			ErrConflict, d.ns, name, attempt, err)
	}
	return nil, "", fmt.Errorf("writing Knative Service %s/%s: %w", d.ns, name, err)
}
