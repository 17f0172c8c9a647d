package dispatchprom

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
)

// defaultBuckets are the histograms' buckets when Options leaves them nil
// (see Options.ExecBuckets).
var defaultBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// defaultMaxLabelValues is Options.MaxLabelValues's default.
const defaultMaxLabelValues = 64

// Options configures an Observer. The zero value is valid: each field's
// default is in its doc.
type Options struct {
	// Namespace prefixes every metric name ("dispatch" if empty). Use
	// "scheduler" to get kube-scheduler's KEP-5229 names, e.g.
	// scheduler_async_api_call_execution_total.
	Namespace string
	// Subsystem, if set, goes between the namespace and the name.
	Subsystem string
	// ConstLabels are added to every metric, e.g. {"dispatcher": "binds"} to
	// tell the Observers of several Dispatchers apart in one registry.
	ConstLabels prometheus.Labels
	// ExecBuckets are the buckets of the execution-duration histogram, in
	// seconds. nil means 1ms to 60s — .001, .0025, .005, .01, .025, .05,
	// .1, .25, .5, 1, 2.5, 5, 10, 30, 60 — fine where API calls usually
	// land (tens of milliseconds) and coarse in the tail, where a slow API
	// or a long backlog shows.
	ExecBuckets []float64
	// QueueWaitBuckets are the buckets of the queue-wait histogram, in
	// seconds (nil: ExecBuckets' default).
	QueueWaitBuckets []float64
	// MaxLabelValues bounds the distinct values each of the call_type and
	// tenant labels may take; later newcomers are exported as "other". 0
	// means 64, a negative number no bound. The bound is a safety net:
	// Config.Label and tenant names should come from a small fixed set in
	// the first place.
	MaxLabelValues int
	// Stats, if set, is read at every scrape for the gauges that need a
	// snapshot (pending calls by call type, queue depth, in flight, tracked
	// keys, tenants, mode, breaker state). The Dispatcher this Observer is
	// given to is made after it: call SetStats once it exists (d.Stats
	// taken before, d still nil, panics at every scrape, which then fails
	// with an error saying so). nil: no gauges until SetStats.
	Stats func() dispatch.Stats
}

// Observer is a dispatch.Observer that counts the dispatcher's events in
// Prometheus metrics, and a prometheus.Collector that exports them together
// with gauges read from a Stats snapshot at scrape time. Register it with a
// registry (reg.MustRegister(obs)) and give it to one Dispatcher
// (dispatch.Config.Observer).
//
// An Observer is safe for concurrent use. Each event method does a few map
// lookups (under client_golang's read locks) and atomic adds, about 100ns,
// and allocates nothing once its label values have been seen; the first
// sighting of a new value takes a short lock. Use NewObserver: the zero
// value is not usable.
type Observer struct {
	stats atomic.Pointer[func() dispatch.Stats]

	callTypes, tenants            *bounded
	finished                      *prometheus.CounterVec
	duration                      *prometheus.HistogramVec
	attempts                      *prometheus.CounterVec
	queueWait                     *prometheus.HistogramVec
	submissions, coalesced        *prometheus.CounterVec
	rejected, dropped, retries    *prometheus.CounterVec
	breakerChanges, modeChanges   *prometheus.CounterVec
	limitChanges                  *prometheus.CounterVec
	events                        []prometheus.Collector // the vecs above, for Describe and Collect
	pending, queued, inFlight     *prometheus.Desc
	keys, mode, breaker           *prometheus.Desc
	limit, reserved, belowReserve *prometheus.Desc
	tenantQueued, tenantInFlight  *prometheus.Desc
}

var _ dispatch.Observer = (*Observer)(nil)
var _ prometheus.Collector = (*Observer)(nil)

// NewObserver returns an Observer configured by opts. It reports invalid
// options — a namespace, subsystem or constant label that is not a valid
// Prometheus name, buckets that are not increasing — here rather than as a
// panic or a registration error later.
func NewObserver(opts Options) (*Observer, error) {
	opts.Namespace = cmp.Or(opts.Namespace, "dispatch")
	execBuckets, waitBuckets, err := opts.check()
	if err != nil {
		return nil, err
	}
	limit := cmp.Or(opts.MaxLabelValues, defaultMaxLabelValues)
	o := &Observer{callTypes: &bounded{max: limit}, tenants: &bounded{max: limit}}
	if opts.Stats != nil {
		o.SetStats(opts.Stats)
	}
	m := &metrics{o: o, ns: opts.Namespace, sub: opts.Subsystem, cl: opts.ConstLabels}
	o.newCounters(m)
	o.duration = m.histogram("async_api_call_execution_duration_seconds",
		"Time a finished call spent executing, over all its attempts, by call type and terminal state. Calls that never ran are not observed.",
		execBuckets, "call_type", "result")
	o.queueWait = m.histogram("queue_wait_seconds",
		"Time from a call's enqueue to its first execution, by call type.",
		waitBuckets, "call_type")
	o.newGauges(m)
	// A pedantic registry checks every name and label as registration
	// would, so a bad Namespace or ConstLabels fails here, not at Register.
	if err := prometheus.NewPedanticRegistry().Register(o); err != nil {
		return nil, fmt.Errorf("dispatchprom: NewObserver: %w", err)
	}
	return o, nil
}

// check reports a bad option, and returns the buckets to use.
func (opts *Options) check() (execBuckets, waitBuckets []float64, err error) {
	// Names are held to the classic character set, which every Prometheus
	// server and exposition format accepts; client_golang alone would take
	// any UTF-8 and quote it.
	for _, part := range []string{opts.Namespace, opts.Subsystem} {
		if part != "" && !model.LegacyValidation.IsValidMetricName(part) {
			return nil, nil, fmt.Errorf("dispatchprom: NewObserver: %q is not a valid metric name part", part)
		}
	}
	for name := range opts.ConstLabels {
		if !model.LegacyValidation.IsValidLabelName(name) {
			return nil, nil, fmt.Errorf("dispatchprom: NewObserver: %q is not a valid label name", name)
		}
	}
	if _, ok := opts.ConstLabels["le"]; ok {
		// A histogram's bucket label: client_golang would panic on the
		// first observation rather than at registration.
		return nil, nil, errors.New(`dispatchprom: NewObserver: ConstLabels must not use "le"`)
	}
	if execBuckets, err = buckets(opts.ExecBuckets, "ExecBuckets"); err != nil {
		return nil, nil, err
	}
	waitBuckets, err = buckets(opts.QueueWaitBuckets, "QueueWaitBuckets")
	return execBuckets, waitBuckets, err
}

func buckets(b []float64, field string) ([]float64, error) {
	if b == nil {
		b = defaultBuckets
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("dispatchprom: NewObserver: %s is empty", field)
	}
	for i, v := range b {
		if math.IsNaN(v) || (i > 0 && v <= b[i-1]) {
			return nil, fmt.Errorf("dispatchprom: NewObserver: %s must be strictly increasing numbers", field)
		}
	}
	return append([]float64(nil), b...), nil
}

// SetStats sets the source of the snapshot gauges, read at every scrape:
// typically the Dispatcher's Stats method, once the Dispatcher (built with
// this Observer) exists. A nil stats removes the source, and the gauges
// with it.
func (o *Observer) SetStats(stats func() dispatch.Stats) {
	if stats == nil {
		o.stats.Store(nil)
		return
	}
	o.stats.Store(&stats)
}

// The dispatch.Observer methods. Every label value passes through a bound,
// and no key or error text ever becomes one.

// OnSubmit counts an accepted submission, and a coalesced one.
func (o *Observer) OnSubmit(e dispatch.Event, coalesced bool) {
	ct := o.callTypes.value(e.Label)
	o.submissions.WithLabelValues(ct, o.tenants.value(e.Tenant)).Inc()
	if coalesced {
		o.coalesced.WithLabelValues(ct).Inc()
	}
}

// OnCoalesce counts a submission that waited behind its key's call in
// flight, merged into that call's retry.
func (o *Observer) OnCoalesce(e dispatch.Event) {
	o.coalesced.WithLabelValues(o.callTypes.value(e.Label)).Inc()
}

// OnReject counts a refused submission, by the reason err names.
func (o *Observer) OnReject(e dispatch.Event, err error) {
	ct := o.callTypes.value(e.Label)
	o.submissions.WithLabelValues(ct, o.tenants.value(e.Tenant)).Inc()
	o.rejected.WithLabelValues(ct, rejectReason(err)).Inc()
}

// OnStart counts an execution, and observes the queue wait of a call's
// first one.
func (o *Observer) OnStart(e dispatch.Event, attempt int, queueWait time.Duration) {
	ct := o.callTypes.value(e.Label)
	o.attempts.WithLabelValues(ct).Inc()
	if attempt <= 1 {
		o.queueWait.WithLabelValues(ct).Observe(queueWait.Seconds())
	}
}

// OnRetry counts a retry.
func (o *Observer) OnRetry(e dispatch.Event, attempt int, delay time.Duration, err error) {
	o.retries.WithLabelValues(o.callTypes.value(e.Label)).Inc()
}

// OnDrop counts a shed call, by reason.
func (o *Observer) OnDrop(e dispatch.Event, b dispatch.Bound) {
	o.dropped.WithLabelValues(o.callTypes.value(e.Label), dropReason(b)).Inc()
}

// OnFinish counts a finished call by its terminal state, and observes its
// execution time if it ran.
func (o *Observer) OnFinish(e dispatch.Event, f dispatch.Outcome) {
	ct, res := o.callTypes.value(e.Label), result(f.State)
	o.finished.WithLabelValues(ct, res).Inc()
	if f.Attempts > 0 {
		o.duration.WithLabelValues(ct, res).Observe(f.RunTime.Seconds())
	}
}

// OnModeChange counts a mode switch, by the mode entered and the reason.
func (o *Observer) OnModeChange(from, to dispatch.Mode, why string) {
	o.modeChanges.WithLabelValues(modeValue(to), switchReason(why)).Inc()
}

// OnLimitChange counts a change of the adaptive concurrency limit.
func (o *Observer) OnLimitChange(from, to int) {
	dir := "up"
	if to < from {
		dir = "down"
	}
	o.limitChanges.WithLabelValues(dir).Inc()
}

// OnCircuitChange counts a circuit breaker transition.
func (o *Observer) OnCircuitChange(from, to dispatch.Circuit) {
	o.breakerChanges.WithLabelValues(breakerValue(from), breakerValue(to)).Inc()
}
