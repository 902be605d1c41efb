package ops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape GETs /metrics from a real HTTP server and parses the text exposition.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return mfs
}

// series returns the metric of family name whose labels are exactly labels (name=value
// pairs), failing the test if there is none.
func series(t *testing.T, mfs map[string]*dto.MetricFamily, name string, labels ...string) *dto.Metric {
	t.Helper()
	if _, ok := mfs[name]; !ok {
		t.Fatalf("no metric family %s", name)
	}
	m := find(mfs, name, labels...)
	if m == nil {
		t.Fatalf("%s has no series %v", name, labels)
	}
	return m
}

// find is series without the test: nil if there is no such metric.
func find(mfs map[string]*dto.MetricFamily, name string, labels ...string) *dto.Metric {
	mf := mfs[name]
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
next:
	for _, m := range mf.GetMetric() {
		if len(m.GetLabel()) != len(want) {
			continue
		}
		for _, l := range m.GetLabel() {
			if want[l.GetName()] != l.GetValue() {
				continue next
			}
		}
		return m
	}
	return nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return -1
}

func TestMetricsExposition(t *testing.T) {
	m := NewMetrics()
	srv := httptest.NewServer((&Server{Metrics: m}).Handler())
	t.Cleanup(srv.Close)

	// Before any event every known series exists at zero, so rate() sees the first one.
	before := scrape(t, srv.URL)
	for _, tc := range []struct{ name, label, value string }{
		{"kpush_pushes_total", "result", PushAccepted},
		{"kpush_pushes_total", "result", PushStored},
		{"kpush_builds_total", "result", ResultCancelled},
		{"kpush_build_duration_seconds", "result", ResultSucceeded},
		{"kpush_deploys_total", "result", ResultFailed},
		{"kpush_deploy_duration_seconds", "result", ResultSucceeded},
		{"kpush_failures_total", "stage", StageInternal},
	} {
		if v := value(series(t, before, tc.name, tc.label, tc.value)); v != 0 {
			t.Errorf("%s{%s=%q} = %v before any event, want 0", tc.name, tc.label, tc.value, v)
		}
	}

	m.PushFinished(PushAccepted)
	m.PushFinished(PushAccepted)
	m.PushFinished(PushRejected)
	m.PushFinished("made-up") // outside the set: "other", not a new series per value
	m.BuildStarted()
	m.BuildStarted()
	m.BuildEnded()
	m.BuildFinished(ResultSucceeded, 90*time.Second)
	m.BuildFinished(ResultFailed, 2*time.Second)
	m.DeployFinished(ResultSucceeded, 1500*time.Millisecond)
	m.Failure(StageBuild)
	m.Failure(StageDeploy)
	m.Failure(StageDeploy)
	m.QueueChanged("demo", 2)
	m.QueueChanged("other-app", 1)
	done := m.Queued("demo")
	done()
	done() // a second call changes nothing

	mfs := scrape(t, srv.URL)
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"kpush_pushes_total", []string{"result", PushAccepted}, 2},
		{"kpush_pushes_total", []string{"result", PushRejected}, 1},
		{"kpush_pushes_total", []string{"result", PushSuperseded}, 0},
		{"kpush_pushes_total", []string{"result", "other"}, 1},
		{"kpush_builds_running", nil, 1},
		{"kpush_builds_total", []string{"result", ResultSucceeded}, 1},
		{"kpush_builds_total", []string{"result", ResultFailed}, 1},
		{"kpush_build_duration_seconds", []string{"result", ResultSucceeded}, 1},
		{"kpush_deploys_total", []string{"result", ResultSucceeded}, 1},
		{"kpush_deploy_duration_seconds", []string{"result", ResultSucceeded}, 1},
		{"kpush_failures_total", []string{"stage", StageBuild}, 1},
		{"kpush_failures_total", []string{"stage", StageDeploy}, 2},
		{"kpush_failures_total", []string{"stage", StageSource}, 0},
		{"kpush_queue_length", nil, 3},
	} {
		if got := value(series(t, mfs, tc.name, tc.labels...)); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	if got := find(mfs, "kpush_pushes_total", "result", "made-up"); got != nil {
		t.Errorf("an unknown result made its own series")
	}

	h := series(t, mfs, "kpush_build_duration_seconds", "result", ResultSucceeded).GetHistogram()
	if got := h.GetSampleSum(); got != 90 {
		t.Errorf("build duration sum = %v s, want 90", got)
	}
	var le60, le120 uint64
	for _, b := range h.GetBucket() {
		switch b.GetUpperBound() {
		case 60:
			le60 = b.GetCumulativeCount()
		case 120:
			le120 = b.GetCumulativeCount()
		}
	}
	if le60 != 0 || le120 != 1 {
		t.Errorf("90 s build: bucket le=60 has %d, le=120 has %d; want 0 and 1", le60, le120)
	}
	var largest float64
	for _, b := range h.GetBucket() {
		if ub := b.GetUpperBound(); !math.IsInf(ub, +1) {
			largest = max(largest, ub)
		}
	}
	if largest != 1800 {
		t.Errorf("largest finite build bucket = %v s, want 1800 (30 min)", largest)
	}

	// The Go runtime and process collectors are on the registry too.
	for _, name := range []string{"go_goroutines", "process_start_time_seconds", "promhttp_metric_handler_requests_total"} {
		if _, ok := mfs[name]; !ok {
			t.Errorf("no %s in /metrics", name)
		}
	}
}

func TestQueueLength(t *testing.T) {
	m := NewMetrics()
	queue := func() float64 {
		t.Helper()
		mfs, err := m.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "kpush_queue_length" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no kpush_queue_length")
		return 0
	}
	for _, step := range []struct {
		do   func()
		want float64
	}{
		{func() { m.QueueChanged("a", 3) }, 3},
		{func() { m.QueueChanged("b", 2) }, 5},
		{func() { m.QueueChanged("a", 1) }, 3},
		{func() { m.QueueChanged("b", -4) }, 1}, // below zero counts as zero
		{func() { m.QueueChanged("a", 0) }, 0},
	} {
		step.do()
		if got := queue(); got != step.want {
			t.Fatalf("kpush_queue_length = %v, want %v", got, step.want)
		}
	}
	d1, d2 := m.Queued("a"), m.Queued("a")
	if got := queue(); got != 2 {
		t.Fatalf("after two Queued: %v, want 2", got)
	}
	d1()
	d1()
	if got := queue(); got != 1 {
		t.Fatalf("after one dequeued twice: %v, want 1", got)
	}
	d2()
	if got := queue(); got != 0 {
		t.Fatalf("after both dequeued: %v, want 0", got)
	}
}

// TestNilMetrics: every method of a nil *Metrics is a no-op, so callers need no setup.
func TestNilMetrics(t *testing.T) {
	var m *Metrics
	m.PushFinished(PushAccepted)
	m.BuildStarted()
	m.BuildEnded()
	m.BuildFinished(ResultSucceeded, time.Second)
	m.DeployFinished(ResultFailed, time.Second)
	m.Failure(StageInternal)
	m.QueueChanged("demo", 3)
	m.Queued("demo")()
	if m.Registry() != nil {
		t.Error("nil Metrics has a registry")
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("nil Metrics handler: %d, want 404", rec.Code)
	}
}

func TestResultOf(t *testing.T) {
	cancelled, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("cancelled by ada (builds:cancel)"))
	timedOut, cancel2 := context.WithTimeout(context.Background(), 0)
	defer cancel2()
	<-timedOut.Done()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want string
	}{
		{"success", context.Background(), nil, ResultSucceeded},
		{"success under a nil context", nil, nil, ResultSucceeded},
		{"failure", context.Background(), errors.New("exit status 1"), ResultFailed},
		{"failure under a nil context", nil, errors.New("exit status 1"), ResultFailed},
		{"the error says cancelled", nil, fmt.Errorf("running lifecycle: %w", context.Canceled), ResultCancelled},
		{"the context was cancelled, the error does not say so", cancelled, errors.New("signal: killed"), ResultCancelled},
		{"a cancelled context but success", cancelled, nil, ResultSucceeded},
		{"timeout", timedOut, fmt.Errorf("building: %w", context.DeadlineExceeded), ResultFailed},
	} {
		if got := ResultOf(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: ResultOf(%v) = %q, want %q", tc.name, tc.err, got, tc.want)
		}
	}
}
