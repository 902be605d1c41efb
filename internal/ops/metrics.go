// Package ops is what operators see of a running kpush: Prometheus metrics, the /healthz,
// /readyz and /metrics HTTP endpoints, a tracker of in-flight builds for graceful shutdown,
// and the slog logger.
//
// The receiver records events through *Metrics methods with plain string and time.Duration
// arguments, so it never imports Prometheus; a nil *Metrics ignores every call.
package ops

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Push results, the result label of kpush_pushes_total.
const (
	// PushAccepted: the push updated the deploy branch and its build and deploy succeeded.
	PushAccepted = "accepted"
	// PushRejected: the push was refused (failed build or deploy, forbidden update, …).
	PushRejected = "rejected"
	// PushSuperseded: the deploy branch moved while the push waited for the app's lock.
	PushSuperseded = "superseded"
	// PushStored: the push updated only other refs; it was stored without a build.
	PushStored = "stored"
)

// Build and deploy results, the result label of kpush_builds_total, kpush_deploys_total and
// the duration histograms.
const (
	ResultSucceeded = "succeeded"
	ResultFailed    = "failed"
	// ResultCancelled: the context ended (the pusher went away, or shutdown).
	ResultCancelled = "cancelled"
)

// Failure stages, the stage label of kpush_failures_total.
const (
	StageBuild    = "build"    // the buildpack build failed
	StageDeploy   = "deploy"   // the deployer failed or the release never became ready
	StageSource   = "source"   // reading or keeping the pushed source failed
	StageInternal = "internal" // kpush's own state (store, locks, I/O) failed
)

// ResultOf classifies how a build or deploy run under ctx ended, for BuildFinished and
// DeployFinished: ResultSucceeded for a nil err; ResultCancelled when err wraps
// context.Canceled or ctx was cancelled (the pusher went away, builds:cancel, shutdown) —
// a killed lifecycle's error often does not say so itself; else ResultFailed (a timeout is
// a failure). ctx may be nil.
func ResultOf(ctx context.Context, err error) string {
	switch {
	case err == nil:
		return ResultSucceeded
	case errors.Is(err, context.Canceled), ctx != nil && errors.Is(ctx.Err(), context.Canceled):
		return ResultCancelled
	default:
		return ResultFailed
	}
}

// otherLabel replaces a label value outside a metric's known set, so that no caller can grow
// a metric's series without bound.
const otherLabel = "other"

var (
	pushResults   = []string{PushAccepted, PushRejected, PushSuperseded, PushStored}
	runResults    = []string{ResultSucceeded, ResultFailed, ResultCancelled}
	failureStages = []string{StageBuild, StageDeploy, StageSource, StageInternal}
)

// Bucket upper bounds in seconds. Builds take from about a second (a cached rebuild) to
// kpush's build timeout (30 min); deploys from well under a second (the local runtime) to the
// Knative ready timeout (minutes).
var (
	buildBuckets  = []float64{1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 450, 600, 900, 1200, 1800}
	deployBuckets = []float64{0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 180, 300, 600}
)

// Metrics holds kpush's Prometheus collectors on a registry of its own, with the Go runtime
// and process collectors. Create it with NewMetrics; a nil *Metrics is valid and records
// nothing, so tests and callers need no setup. Safe for concurrent use.
//
// Series (names follow https://prometheus.io/docs/practices/naming/):
//
//	kpush_pushes_total{result}              accepted|rejected|superseded|stored
//	kpush_builds_total{result}              succeeded|failed|cancelled
//	kpush_build_duration_seconds{result}    histogram, 1 s … 30 min
//	kpush_deploys_total{result}             succeeded|failed|cancelled
//	kpush_deploy_duration_seconds{result}   histogram, 0.25 s … 10 min
//	kpush_failures_total{stage}             build|deploy|source|internal
//	kpush_queue_length                      pushes waiting for their app's previous push
//	kpush_builds_running                    builds in progress
//
// A label value outside its set is recorded as "other". kpush_queue_length has no app label:
// app names are chosen by the people who push, and a series per app ever pushed would
// outlive the app; the per-app wait is in the logs (push_id, app).
type Metrics struct {
	reg *prometheus.Registry

	pushes       *prometheus.CounterVec
	builds       *prometheus.CounterVec
	buildSecs    *prometheus.HistogramVec
	deploys      *prometheus.CounterVec
	deploySecs   *prometheus.HistogramVec
	failures     *prometheus.CounterVec
	queue        prometheus.Gauge
	buildRunning prometheus.Gauge

	mu     sync.Mutex
	queued map[string]int // app → pushes waiting; absent when 0
}

// NewMetrics returns Metrics registered on a new registry, every known label value
// initialised to zero so that rate() sees the first event.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kpush_pushes_total",
			Help: "Git pushes handled, by result: accepted, rejected, superseded (the deploy branch moved while waiting) or stored (no deploy branch update).",
		}, []string{"result"}),
		builds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kpush_builds_total",
			Help: "Buildpack builds finished, by result.",
		}, []string{"result"}),
		buildSecs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kpush_build_duration_seconds",
			Help:    "Time from the start of a build to its image being pushed or the build failing, by result.",
			Buckets: buildBuckets,
		}, []string{"result"}),
		deploys: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kpush_deploys_total",
			Help: "Deploys finished, by result.",
		}, []string{"result"}),
		deploySecs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kpush_deploy_duration_seconds",
			Help:    "Time from the start of a deploy to the release serving or the deploy failing, by result.",
			Buckets: deployBuckets,
		}, []string{"result"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kpush_failures_total",
			Help: "Failed pushes and operations, by the stage that failed: build, deploy, source or internal.",
		}, []string{"stage"}),
		queue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kpush_queue_length",
			Help: "Pushes and app operations waiting for their app's previous one to finish, over all apps.",
		}),
		buildRunning: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kpush_builds_running",
			Help: "Builds in progress.",
		}),
		queued: map[string]int{},
	}
	for _, r := range pushResults {
		m.pushes.WithLabelValues(r)
	}
	for _, r := range runResults {
		m.builds.WithLabelValues(r)
		m.buildSecs.WithLabelValues(r)
		m.deploys.WithLabelValues(r)
		m.deploySecs.WithLabelValues(r)
	}
	for _, s := range failureStages {
		m.failures.WithLabelValues(s)
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.pushes, m.builds, m.buildSecs, m.deploys, m.deploySecs, m.failures, m.queue, m.buildRunning,
	)
	return m
}

// Registry is the registry the metrics are on, to register more collectors or to gather in
// tests. Nil for a nil *Metrics.
func (m *Metrics) Registry() *prometheus.Registry {
	if m == nil {
		return nil
	}
	return m.reg
}

// Handler serves the registry in the Prometheus exposition formats (text, or protobuf and
// OpenMetrics when asked), counting its own scrapes and errors
// (promhttp_metric_handler_*). A nil *Metrics serves 404.
func (m *Metrics) Handler() http.Handler {
	if m == nil {
		return http.NotFoundHandler()
	}
	return promhttp.InstrumentMetricHandler(m.reg, promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
}

// PushFinished counts a push that ended with result (PushAccepted, PushRejected,
// PushSuperseded or PushStored).
func (m *Metrics) PushFinished(result string) {
	if m == nil {
		return
	}
	m.pushes.WithLabelValues(known(result, pushResults)).Inc()
}

// BuildStarted counts a build as running until the matching BuildEnded.
func (m *Metrics) BuildStarted() {
	if m == nil {
		return
	}
	m.buildRunning.Inc()
}

// BuildEnded ends what BuildStarted began: call it exactly once per BuildStarted, e.g. with
// defer right after it.
func (m *Metrics) BuildEnded() {
	if m == nil {
		return
	}
	m.buildRunning.Dec()
}

// BuildFinished counts a build that ended with result (ResultSucceeded, ResultFailed or
// ResultCancelled) after d.
func (m *Metrics) BuildFinished(result string, d time.Duration) {
	if m == nil {
		return
	}
	r := known(result, runResults)
	m.builds.WithLabelValues(r).Inc()
	m.buildSecs.WithLabelValues(r).Observe(d.Seconds())
}

// DeployFinished counts a deploy that ended with result (ResultSucceeded, ResultFailed or
// ResultCancelled) after d.
func (m *Metrics) DeployFinished(result string, d time.Duration) {
	if m == nil {
		return
	}
	r := known(result, runResults)
	m.deploys.WithLabelValues(r).Inc()
	m.deploySecs.WithLabelValues(r).Observe(d.Seconds())
}

// Failure counts a failure at stage (StageBuild, StageDeploy, StageSource or StageInternal).
func (m *Metrics) Failure(stage string) {
	if m == nil {
		return
	}
	m.failures.WithLabelValues(known(stage, failureStages)).Inc()
}

// QueueChanged records that n pushes or operations of app now wait for the app's previous
// one; kpush_queue_length is the sum over apps. n < 0 counts as 0. Use either QueueChanged
// or Queued for an app, not both.
func (m *Metrics) QueueChanged(app string, n int) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.setQueuedLocked(app, n)
}

// Queued counts one more push or operation of app as waiting, until dequeued is called (when
// it got the app's lock or gave up). Calling dequeued more than once has no further effect.
func (m *Metrics) Queued(app string) (dequeued func()) {
	if m == nil {
		return func() {}
	}
	m.mu.Lock()
	m.setQueuedLocked(app, m.queued[app]+1)
	m.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			m.setQueuedLocked(app, m.queued[app]-1)
			m.mu.Unlock()
		})
	}
}

func (m *Metrics) setQueuedLocked(app string, n int) {
	n = max(n, 0)
	if n == 0 {
		delete(m.queued, app)
	} else {
		m.queued[app] = n
	}
	total := 0
	for _, v := range m.queued {
		total += v
	}
	m.queue.Set(float64(total))
}

// known returns v if it is one of set, else "other".
func known(v string, set []string) string {
	for _, s := range set {
		if v == s {
			return v
		}
	}
	return otherLabel
}
