package kube

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/internal/band"
	"github.com/coalescer/dispatch/kube/internal/preset"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// defaultPriorities are the call types' priorities when Options.Priorities
// does not name them (see there).
var defaultPriorities = map[CallType]int{PodBinding: 20, PodDeletion: 10, PodStatusPatch: 0}

// Options configures NewDispatcher. The zero value gives the defaults.
//
// It holds what a user of the preset may set: the preset's own settings,
// and the dispatch.Config settings that make sense for pod writes, under
// their Config names and types, the preset filling in some zeros. The
// merge, no-op, label and before-retry rules are the preset's — they are
// what makes a Call work — and have no field; so is the rule for a call
// submitted while the pod's call is in flight (Config.Follow is not set):
// it waits behind that call, and what the call in flight does when it
// lands decides what is left of it. Nor is the rule for a call that would
// change nothing on an idle pod (Config.Moot is not set): it is queued,
// and skipped when it would run (Config.NoOp), as a call behind another
// is.
type Options struct {
	// Workers bounds the API calls in flight (Config.Workers). 0 means 16,
	// kube-scheduler's default parallelism.
	Workers int

	// QPS is the API rate the dispatcher allows, taken per execution after
	// calls are ordered by priority. 0 means 50, kube-scheduler's client
	// default (--kube-api-qps); a negative value means no limit. A
	// positive value must allow at least one call a minute (1.0/60): a
	// slower limiter would hold calls past any deadline a scheduler or
	// controller sets. NaN and +Inf are refused too. Give the clientset no
	// limit of its own (see RESTConfig).
	QPS float64
	// Burst is the rate limiter's burst. 0 means 100 (--kube-api-burst).
	// With no limit (a negative QPS) it must be left 0.
	Burst int
	// RateLimit, if set, is the limiter instead of the preset's of QPS and
	// Burst, which must then be left 0 (Config.RateLimit).
	RateLimit dispatch.RateLimiter

	// Priorities sets call types' priorities, for the submissions that do
	// not give their own (SubmitOptions.Priority). A type it does not name
	// keeps its default: PodBinding 20 (a pod waits on it), PodDeletion 10
	// (a preemptor waits for its room), PodStatusPatch 0 (a report nobody
	// waits on), each in a priority band of its own (AgingBand), so that
	// aging never lifts a call past one of a more urgent type. Priorities
	// that put status patches below bindings or deletions in one band are
	// refused.
	Priorities map[CallType]int
	// StatusPatchMaxInFlight, if positive, caps how many workers status
	// patches may hold at once: it is the MaxInFlight of their tenant,
	// PodStatusPatch, which Tenants must then not name; DefaultTenant's
	// other bounds (MaxQueued, Weight) still apply to it. It caps the
	// status patches submitted under that tenant — those that name none —
	// and only them: a status patch whose submission names a tenant of its
	// own (SubmitOptions.Tenant) is bounded by that tenant's MaxInFlight
	// (Tenants, or DefaultTenant), as every call of the tenant is, each
	// tenant on its own. The reservation (Start) makes it unnecessary for
	// bindings' sake; it remains a way to bound the patches' share of the
	// server. 0 means no cap.
	StatusPatchMaxInFlight int

	// Start decides whether the next execution may start (Config.Start).
	// The preset fills in two zeros: ReservedWorkers 0 keeps a quarter of
	// the workers (at least 1, none with a single worker) for bindings and
	// deletions, so that a storm of status patches never leaves a binding
	// without a worker (kubernetes#135900), whether the limit is tokens,
	// connections or the server's latency, and a negative value keeps
	// none; while workers are kept, UrgentPriority 0 means the priority of
	// the less urgent of bindings and deletions.
	Start dispatch.StartPolicy

	// Classify judges a failed call, and the read a retry makes first
	// (see the calls' documentation). nil means Classify.
	Classify func(error) dispatch.Class
	// Retry bounds retries (Config.Retry).
	Retry dispatch.RetryPolicy
	// Breaker, if set, stops executions after sustained retryable failures
	// (Config.Breaker).
	Breaker *dispatch.BreakerPolicy

	// Capacity bounds the pods with a call queued or running, and
	// MaxWaiters the live tickets (Config.Capacity, Config.MaxWaiters).
	Capacity, MaxWaiters int
	// Aging and AgingBand set how waiting calls gain priority within a
	// band (Config.Aging, Config.AgingBand; AgingBand 0 means 10). An
	// AgingBand that puts the status patches' priority in the band of the
	// bindings' or the deletions' is refused (see Priorities): with the
	// default priorities (0, 10, 20), it must be at most 10.
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

// config is the one place the preset turns Options into the core's
// Config: what it sets, and every default. It returns every call type's
// priority.
func (o Options) config(a *calls) (dispatch.Config[types.UID, Call], map[CallType]int, error) {
	prio, err := o.priorities()
	if err == nil {
		err = o.check(prio)
	}
	if err != nil {
		return dispatch.Config[types.UID, Call]{}, nil, err
	}
	workers := cmp.Or(o.Workers, preset.Workers)
	cfg := dispatch.Config[types.UID, Call]{
		Workers:       workers,
		RateLimit:     o.limiter(),
		Capacity:      o.Capacity,
		Merge:         merge,
		NoOp:          a.noOp,
		Classify:      o.Classify,
		Retry:         o.Retry,
		OnDone:        a.onDone(o.OnDone),
		Observer:      o.Observer,
		MaxWaiters:    o.MaxWaiters,
		Aging:         o.Aging,
		AgingBand:     cmp.Or(o.AgingBand, preset.AgingBand),
		Label:         label,
		BeforeRetry:   a.beforeRetry,
		Tenants:       o.tenants(),
		DefaultTenant: o.DefaultTenant,
		Breaker:       o.Breaker,
		Start:         preset.Start(o.Start, workers, min(prio[PodBinding], prio[PodDeletion])),
		Rollout:       o.Rollout,
	}
	if cfg.Classify == nil {
		cfg.Classify = Classify
	}
	a.classify = cfg.Classify // the read before a retry is judged as the call is
	return cfg, prio, nil
}

// priorities returns every call type's priority: Options.Priorities over
// the defaults.
func (o Options) priorities() (map[CallType]int, error) {
	prio := maps.Clone(defaultPriorities)
	for _, t := range slices.Sorted(maps.Keys(o.Priorities)) {
		if _, ok := prio[t]; !ok {
			return nil, optErr("Priorities", fmt.Sprintf("names %q, which is not a call type (%v)", t, CallTypes()))
		}
		prio[t] = o.Priorities[t]
	}
	return prio, nil
}

// limiter is the core's rate limiter: RateLimit, or the preset's of QPS
// and Burst, or nil for none.
func (o Options) limiter() dispatch.RateLimiter {
	switch {
	case o.RateLimit != nil:
		return o.RateLimit
	case o.QPS < 0:
		return nil
	}
	return rate.NewLimiter(rate.Limit(cmp.Or(o.QPS, preset.QPS)), cmp.Or(o.Burst, preset.Burst))
}

// check reports a bad setting of the preset's own, naming its Options
// field. The settings passed through are the core's to check.
func (o Options) check(prio map[CallType]int) error {
	switch {
	case math.IsNaN(o.QPS) || math.IsInf(o.QPS, 1):
		return optErr("QPS", fmt.Sprintf("%v is not a rate", o.QPS))
	case o.QPS > 0 && o.QPS < preset.MinQPS:
		return optErr("QPS", fmt.Sprintf("%.3g is below one call a minute (%.3g)", o.QPS, preset.MinQPS))
	case o.Burst < 0:
		return optErr("Burst", fmt.Sprintf("%d must not be negative", o.Burst))
	case o.QPS < 0 && o.Burst != 0:
		return fmt.Errorf("kube: Options.Burst %d is set, but Options.QPS %v means no limit: leave Burst 0", o.Burst, o.QPS)
	case o.RateLimit != nil && (o.QPS != 0 || o.Burst != 0):
		return errors.New("kube: Options.RateLimit is set: leave QPS and Burst 0, they configure the preset's limiter")
	case o.StatusPatchMaxInFlight < 0:
		return optErr("StatusPatchMaxInFlight", fmt.Sprintf("%d must not be negative", o.StatusPatchMaxInFlight))
	}
	if _, named := o.Tenants[string(PodStatusPatch)]; named && o.StatusPatchMaxInFlight > 0 {
		return fmt.Errorf("kube: Options.StatusPatchMaxInFlight is set and Options.Tenants names %s: set its MaxInFlight there instead", PodStatusPatch)
	}
	width := cmp.Or(o.AgingBand, preset.AgingBand)
	if width < 0 {
		return nil // the core names it
	}
	u, p, q, shared := patchesBelow(prio, width)
	if !shared {
		return nil
	}
	err := optErr("Priorities", fmt.Sprintf(
		"puts status patches (%d) below %s (%d) in one priority band (of %d): aging would lift old patches past them",
		p, u, q, width))
	if _, _, _, atDefault := patchesBelow(prio, preset.AgingBand); o.AgingBand != 0 && !atDefault {
		// The priorities are a band apart at the default width: the
		// caller's AgingBand put them in one.
		return fmt.Errorf("kube: Options.AgingBand %d is too wide: %s", o.AgingBand, strings.TrimPrefix(err.Error(), "kube: "))
	}
	return err
}

// patchesBelow reports a call type whose priority q lies above the status
// patches' p in one priority band of width width, if there is one.
func patchesBelow(prio map[CallType]int, width int) (u CallType, p, q int, shared bool) {
	for _, u := range []CallType{PodBinding, PodDeletion} {
		if p, q := prio[PodStatusPatch], prio[u]; p < q && band.Same(int64(p), int64(q), int64(width)) {
			return u, p, q, true
		}
	}
	return "", 0, 0, false
}

// tenants is Options.Tenants, with the status patches' in-flight cap: their
// tenant is otherwise bounded by DefaultTenant, as a tenant Tenants does
// not name is. The user's map is not written.
func (o Options) tenants() map[string]dispatch.TenantConfig {
	if o.StatusPatchMaxInFlight <= 0 {
		return o.Tenants
	}
	out := maps.Clone(o.Tenants)
	if out == nil {
		out = make(map[string]dispatch.TenantConfig, 1)
	}
	patches := o.DefaultTenant
	patches.MaxInFlight = o.StatusPatchMaxInFlight
	out[string(PodStatusPatch)] = patches
	return out
}

func optErr(field, why string) error {
	return fmt.Errorf("kube: Options.%s %s", field, why)
}
