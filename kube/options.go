package kube

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/internal/band"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Defaults of the preset, for the Options fields left zero.
const (
	// DefaultQPS and DefaultBurst are the API rate the dispatcher allows
	// when Options.QPS and Options.Burst are 0: kube-scheduler's own
	// client defaults (--kube-api-qps, --kube-api-burst).
	DefaultQPS   = 50
	DefaultBurst = 100

	// The default priorities: a binding first (a pod waits on it), then a
	// deletion (a preemptor waits for its room), then status patches
	// (reports nobody waits on), each in a priority band of its own
	// (Options.AgingBand, 10 by default), so that aging never lifts a call
	// past one of a more urgent type, however long it waits.
	DefaultBindingPriority     = 20
	DefaultDeletionPriority    = 10
	DefaultStatusPatchPriority = 0
)

// The core's settings the preset states itself, so that its rules (the
// bands its priorities sit in, the share of workers it keeps) do not move
// with the core's defaults.
const (
	defaultWorkers = 16
	defaultBand    = 10
)

// minQPS is the slowest positive Options.QPS: one call a minute.
const minQPS = 1.0 / 60

// Options configures NewDispatcher. The zero value gives the defaults.
//
// It holds what a user of the preset may set: the preset's own settings,
// and the dispatch.Config settings that make sense for pod writes, each
// passed to dispatch.New under its Config name (Adaptive and the deadline
// check go into Config.Start). The merge, no-op, label and before-retry
// rules are the preset's — they are what makes a Call work — and have no
// field; so is the rule for a call submitted while the pod's call is in
// flight (Config.Follow is not set): it waits behind that call, and what
// the call in flight does when it lands decides what is left of it.
type Options struct {
	// Workers bounds the API calls in flight (Config.Workers). 0 means 16.
	Workers int

	// QPS is the API rate the dispatcher allows, taken per execution after
	// calls are ordered by priority. 0 means DefaultQPS; a negative value
	// means no limit. A positive value must allow at least one call a
	// minute (1.0/60): a slower limiter would hold calls past any deadline
	// a scheduler or controller sets, and one so slow that its interval
	// overflows a time.Duration never grants at all. NaN and +Inf are
	// refused too. Give the clientset no limit of its own (see
	// RESTConfig).
	QPS float64
	// Burst is the rate limiter's burst. 0 means DefaultBurst.
	Burst int
	// RateLimit, if set, is the limiter instead of the preset's of QPS and
	// Burst, which must then be left 0 (Config.RateLimit).
	RateLimit dispatch.RateLimiter

	// Priorities sets each call type's priority, for the submissions that
	// do not give their own (SubmitOptions.Priority).
	Priorities Priorities
	// ReservedWorkers is how many workers are kept for bindings and
	// deletions (Config.Start.ReservedWorkers, with UrgentPriority the
	// band of the less urgent of the two), so that a storm of status
	// patches never leaves a binding without a worker (kubernetes#135900),
	// whether the limit is tokens, connections or the server's latency.
	// 0 means a quarter of the workers, at least 1 (none with a single
	// worker); a negative value keeps none; a positive value must be less
	// than Workers.
	ReservedWorkers int
	// StatusPatchMaxInFlight, if positive, caps how many workers status
	// patches may hold at once: the MaxInFlight of their tenant,
	// PodStatusPatch, which Tenants must then not name. The reservation
	// makes it unnecessary for bindings' sake; it remains a way to bound
	// the patches' share of the server. 0 means no cap.
	StatusPatchMaxInFlight int

	// Classify judges a failed call. nil means Classify.
	Classify func(error) dispatch.Class
	// Retry bounds retries (Config.Retry).
	Retry dispatch.RetryPolicy
	// Breaker, if set, stops executions after sustained retryable failures
	// (Config.Breaker).
	Breaker *dispatch.BreakerPolicy
	// Adaptive, if set, adapts concurrency to what the server says
	// (Config.Start.Adaptive).
	Adaptive *dispatch.AdaptivePolicy
	// NoDeadlineCheck, DeadlineQuantile and DeadlineSamples tune the
	// check that does not start a call its deadline leaves no time for
	// (Config.Start's fields of the same names).
	NoDeadlineCheck  bool
	DeadlineQuantile float64
	DeadlineSamples  int

	// Capacity bounds the pods with a call queued or running, and
	// MaxWaiters the live tickets (Config.Capacity, Config.MaxWaiters).
	Capacity, MaxWaiters int
	// Aging and AgingBand set how waiting calls gain priority within a
	// band (Config.Aging, Config.AgingBand; AgingBand 0 means 10). The
	// call types' priorities must keep status patches out of the bands of
	// bindings and deletions.
	Aging     time.Duration
	AgingBand int
	// Tenants and DefaultTenant bound tenants (Config.Tenants,
	// Config.DefaultTenant). A submission's tenant is its call type's name
	// unless it names one (SubmitOptions.Tenant).
	Tenants       map[string]dispatch.TenantConfig
	DefaultTenant dispatch.TenantConfig

	// Rollout is the feature gate's lever: the mode at start-up (ModeOf),
	// what a switch to Sync does with queued calls, and an automatic
	// fallback (Config.Rollout).
	Rollout dispatch.RolloutPolicy

	// OnDone fires once per finished call (Config.OnDone).
	OnDone func(Result)
	// Observer receives the dispatcher's events, for metrics
	// (Config.Observer); its labels are the call types.
	Observer dispatch.Observer
	// Logger receives the dispatcher's log lines, at kube-scheduler's
	// verbosities for the same events (see the package documentation).
	// The zero Logger — which logr.Discard also returns — means
	// klog.Background(), the process's klog logger, whose -v decides what
	// is written. To drop the lines, give a logger whose sink drops them.
	Logger klog.Logger
}

// Priorities sets the priority of each call type. A nil field keeps its
// type's default (DefaultBindingPriority, DefaultDeletionPriority,
// DefaultStatusPatchPriority); any other priority, 0 included, is given as
// a pointer: Priorities{Binding: new(0)}.
type Priorities struct {
	Binding, Deletion, StatusPatch *int
}

// of returns t's priority.
func (p Priorities) of(t CallType) int {
	switch t {
	case PodBinding:
		return valueOr(p.Binding, DefaultBindingPriority)
	case PodDeletion:
		return valueOr(p.Deletion, DefaultDeletionPriority)
	}
	return valueOr(p.StatusPatch, DefaultStatusPatchPriority)
}

// resolved returns p with every field set.
func (p Priorities) resolved() Priorities {
	return Priorities{
		Binding:     new(p.of(PodBinding)),
		Deletion:    new(p.of(PodDeletion)),
		StatusPatch: new(p.of(PodStatusPatch)),
	}
}

func valueOr(p *int, def int) int {
	if p == nil {
		return def
	}
	return *p
}

// config is the one place the preset turns Options into the core's
// Config: what it sets, and every default. It returns the priorities with
// every field set.
func (o Options) config(a *calls) (dispatch.Config[types.UID, Call], Priorities, error) {
	prio := o.Priorities.resolved()
	if err := o.check(prio); err != nil {
		return dispatch.Config[types.UID, Call]{}, prio, err
	}
	cfg := dispatch.Config[types.UID, Call]{
		Workers:       o.Workers,
		RateLimit:     o.RateLimit,
		Capacity:      o.Capacity,
		Merge:         merge,
		NoOp:          a.noOp,
		Classify:      o.Classify,
		Retry:         o.Retry,
		OnDone:        a.onDone(o.OnDone),
		Observer:      o.Observer,
		MaxWaiters:    o.MaxWaiters,
		Aging:         o.Aging,
		AgingBand:     o.AgingBand,
		Label:         label,
		BeforeRetry:   a.beforeRetry,
		Tenants:       o.tenants(),
		DefaultTenant: o.DefaultTenant,
		Breaker:       o.Breaker,
		Start: dispatch.StartPolicy{
			Adaptive:         o.Adaptive,
			NoDeadlineCheck:  o.NoDeadlineCheck,
			DeadlineQuantile: o.DeadlineQuantile,
			DeadlineSamples:  o.DeadlineSamples,
		},
		Rollout: o.Rollout,
	}
	if cfg.Workers == 0 {
		cfg.Workers = defaultWorkers
	}
	if cfg.AgingBand == 0 {
		cfg.AgingBand = defaultBand
	}
	if cfg.Classify == nil {
		cfg.Classify = Classify
	}
	if cfg.RateLimit == nil && o.QPS >= 0 {
		cfg.RateLimit = o.limiter()
	}
	if kept := o.reserved(cfg.Workers); kept > 0 && cfg.AgingBand > 0 {
		// The reservation is for the band of the less urgent of the two,
		// and every band above it.
		cfg.Start.ReservedWorkers = kept
		cfg.Start.UrgentPriority = min(*prio.Binding, *prio.Deletion)
	}
	return cfg, prio, nil
}

// limiter is the preset's rate limiter, of QPS and Burst.
func (o Options) limiter() *rate.Limiter {
	qps, burst := o.QPS, o.Burst
	if qps == 0 {
		qps = DefaultQPS
	}
	if burst == 0 {
		burst = DefaultBurst
	}
	return rate.NewLimiter(rate.Limit(qps), burst)
}

// check reports a bad setting of the preset's own, naming its Options
// field. The settings passed through are the core's to check.
func (o Options) check(prio Priorities) error {
	switch {
	case math.IsNaN(o.QPS) || math.IsInf(o.QPS, 1):
		return optErr("QPS", fmt.Sprintf("%v is not a rate", o.QPS))
	case o.QPS > 0 && o.QPS < minQPS:
		return optErr("QPS", fmt.Sprintf("%.3g is below one call a minute (%.3g)", o.QPS, minQPS))
	case o.Burst < 0:
		return optErr("Burst", fmt.Sprintf("%d must not be negative", o.Burst))
	case o.RateLimit != nil && (o.QPS != 0 || o.Burst != 0):
		return errors.New("kube: Options.RateLimit is set: leave QPS and Burst 0, they configure the preset's limiter")
	case o.StatusPatchMaxInFlight < 0:
		return optErr("StatusPatchMaxInFlight", fmt.Sprintf("%d must not be negative", o.StatusPatchMaxInFlight))
	}
	if _, named := o.Tenants[string(PodStatusPatch)]; named && o.StatusPatchMaxInFlight > 0 {
		return fmt.Errorf("kube: Options.StatusPatchMaxInFlight is set and Options.Tenants names %s: set its MaxInFlight there instead", PodStatusPatch)
	}
	workers := o.Workers
	if workers == 0 {
		workers = defaultWorkers
	}
	if o.ReservedWorkers > 0 && workers > 0 && o.ReservedWorkers >= workers {
		return optErr("ReservedWorkers", fmt.Sprintf("%d must be less than the workers (%d)", o.ReservedWorkers, workers))
	}
	width := o.AgingBand
	if width == 0 {
		width = defaultBand
	}
	if width < 0 {
		return nil // the core names it
	}
	for _, u := range []CallType{PodBinding, PodDeletion} {
		if p, q := *prio.StatusPatch, prio.of(u); p < q && band.Same(int64(p), int64(q), int64(width)) {
			return optErr("Priorities", fmt.Sprintf(
				"puts status patches (%d) below %s (%d) in one priority band (of %d): aging would lift old patches past them",
				p, u, q, width))
		}
	}
	return nil
}

// reserved is how many of workers the preset keeps for bindings and
// deletions.
func (o Options) reserved(workers int) int {
	switch kept := o.ReservedWorkers; {
	case kept < 0 || workers <= 1:
		return 0
	case kept == 0:
		return max(1, workers/4)
	default:
		return kept
	}
}

// tenants is Options.Tenants, with the status patches' in-flight cap.
// The user's map is not written.
func (o Options) tenants() map[string]dispatch.TenantConfig {
	if o.StatusPatchMaxInFlight <= 0 {
		return o.Tenants
	}
	out := maps.Clone(o.Tenants)
	if out == nil {
		out = make(map[string]dispatch.TenantConfig, 1)
	}
	out[string(PodStatusPatch)] = dispatch.TenantConfig{MaxInFlight: o.StatusPatchMaxInFlight}
	return out
}

func optErr(field, why string) error {
	return fmt.Errorf("kube: Options.%s %s", field, why)
}
