package scheduler

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/internal/band"
	"github.com/coalescer/dispatch/kube"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
)

// The call types of kube-scheduler's own calls
// (k8s.io/kubernetes/pkg/scheduler/framework/api_calls), named here so that
// their defaults can be given without importing k8s.io/kubernetes.
const (
	PodBinding     fwk.APICallType = "pod_binding"
	PodStatusPatch fwk.APICallType = "pod_status_patch"
)

// Defaults for the Options fields left zero.
const (
	// DefaultWorkers is kube-scheduler's default parallelism, which its
	// APIDispatcher is given.
	DefaultWorkers = 16
	// DefaultCapacity bounds the objects with a call queued or in flight.
	// It is ten times the core's default: every pending pod of a large
	// cluster may have a status patch waiting during a storm, and upstream's
	// dispatcher has no bound at all.
	DefaultCapacity = 100_000
	// DefaultTimeout is how long a call may wait and run before it ends
	// with an error matching dispatch.ErrExpired: five minutes, the longest a
	// pod stays in kube-scheduler's unschedulable pool before it is tried
	// again (and a fresh status patch is made for it).
	DefaultTimeout = 5 * time.Minute

	// The default priorities, each call type in a priority band of its
	// own (Options.AgingBand, 10 by default), so that aging never lifts a
	// call past one of a more urgent type, however long it waits:
	//
	// DefaultBindingPriority is PodBinding's: a pod's binding cycle waits
	// on it.
	DefaultBindingPriority = 20
	// DefaultPriority is the priority of every call type that is neither
	// PodBinding nor PodStatusPatch and that Options.Priorities does not
	// name — a plugin's own calls. Such a call may be something a pod's
	// scheduling waits on, which a status patch never is, and it is not a
	// binding: it runs after bindings and before status patches.
	DefaultPriority = 10
	// DefaultStatusPatchPriority is PodStatusPatch's: a report nobody
	// waits on.
	DefaultStatusPatchPriority = 0
	// DefaultAgingBand is the width of a priority band when
	// Options.AgingBand is 0.
	DefaultAgingBand = 10
)

// Options configures New. The zero value gives the defaults. The type-based
// fields are keyed by fwk.APICallType: PodBinding, PodStatusPatch or a
// plugin's own type.
type Options struct {
	// Workers bounds concurrent executions. 0 means DefaultWorkers; a
	// value above 65 536, the most workers the core runs, means 65 536:
	// kube-scheduler accepts any positive parallelism and hands it over.
	Workers int
	// Priorities overrides the priority of call types: PodBinding is
	// DefaultBindingPriority, PodStatusPatch DefaultStatusPatchPriority,
	// every other type DefaultPriority. Higher runs first; a waiting call
	// ages one level per Aging, within its priority band (AgingBand). New
	// refuses priorities that put a type in PodBinding's band below it:
	// aging would lift those calls past bindings.
	Priorities map[fwk.APICallType]int
	// ReservedWorkers is how many workers are kept for calls in the
	// binding's priority band or above, so that a storm of status patches
	// (or of a plugin's calls) never leaves a binding without a worker
	// (kubernetes#135900). 0 means a quarter of the workers, at least one
	// (none with a single worker); a negative value keeps none; a positive
	// value must be less than the workers.
	ReservedWorkers int
	// Timeout bounds how long a call may wait and run, from Add to its
	// end, for the call types Timeouts does not name. 0 means
	// DefaultTimeout; a negative value means no limit.
	Timeout time.Duration
	// Timeouts overrides Timeout by call type (a negative value: no limit).
	Timeouts map[fwk.APICallType]time.Duration
	// Capacity bounds the objects with a call queued or in flight. Beyond
	// it, a call for a new object evicts the worst queued call below the
	// binding's priority if the newcomer would run before it, and is
	// otherwise refused with an error matching dispatch.ErrBackpressure.
	// 0 means DefaultCapacity.
	Capacity int
	// Aging is how fast a waiting call gains priority over the other calls
	// of its priority band: one level per interval. 0 means the core's
	// default, a level per second.
	Aging time.Duration
	// AgingBand groups priorities into bands of this many consecutive
	// levels, and aging works only within a band (see
	// dispatch.Config.AgingBand): a call never runs before a ready call of
	// a higher band. 0 means DefaultAgingBand; 1 is strict priority.
	AgingBand int
	// Tenants sets per-call-type quotas: each call type is its own tenant,
	// so a type's queued and in-flight calls can be capped and its share
	// of workers weighted.
	Tenants map[fwk.APICallType]dispatch.TenantConfig
	// PaceStatusPatches caps the status patches executing at once at what
	// the client's rate needs at the speed the server answers them: twice
	// the client's QPS × their average execution time (a moving average,
	// each new patch weighing 1/8), rounded up, at least 1 and at most the
	// workers not reserved for bindings; the cap moves after every patch.
	// The patches then keep the client's rate however slow the server or
	// the machine get — a constant cap of n carries only n ÷ the latency a
	// second — and put no more at the server than that rate needs, so that
	// a binding sent meanwhile does not queue there behind a burst of them.
	// It needs a client whose token bucket the adapter takes its tokens
	// from (see New); with any other (a fake clientset) it does nothing.
	// Tenants must not then give PodStatusPatch a MaxInFlight.
	PaceStatusPatches bool
	// Retry bounds the dispatcher's own retries; zero fields mean the
	// dispatch defaults (3 attempts, backoff from 100ms, a retry budget of
	// 20% of first attempts). Upstream's PodStatusPatchCall and
	// PodBindingCall retry inside Execute too; see the package
	// documentation for the bound on requests per call.
	Retry dispatch.RetryPolicy
	// Classify judges a failed execution's error. nil means kube.Classify.
	Classify func(error) dispatch.Class
	// Breaker, if set, enables a circuit breaker.
	Breaker *dispatch.BreakerPolicy
	// Adaptive, if set, adapts concurrency to the API server.
	Adaptive *dispatch.AdaptivePolicy
	// Rollout is the feature gate's lever: the mode to start in
	// (dispatch.ModeAsync, the default, or dispatch.ModeSync, in which Add
	// runs each call inline, through the same merging, retries and
	// outcomes; see ModeOf), what a switch to Sync does with queued calls,
	// and the automatic fallback to Sync when the async path does harm.
	Rollout dispatch.RolloutPolicy
	// Observer, if set, receives the dispatcher's events, labelled by call
	// type and with the call type as tenant: a dispatchprom.Observer, say.
	Observer dispatch.Observer
	// Metrics, if set, receives what kube-scheduler's own async-call
	// metrics record.
	Metrics Metrics
}

// maxWorkers is the most workers the core runs (dispatch.Config.Workers).
const maxWorkers = 1 << 16

// settings is Options resolved: the defaults filled in, and what New needs
// besides the core's Config.
type settings struct {
	prio     map[fwk.APICallType]int
	timeout  map[fwk.APICallType]time.Duration
	deflt    time.Duration // Timeout for the other types; < 0: none
	band     int           // AgingBand
	bind     int           // PodBinding's priority: calls in its band or above are kept and never shed
	reserved int           // workers kept for them
	workers  int
	pace     bool // PaceStatusPatches
	metrics  Metrics
	observer dispatch.Observer
}

func (s *settings) priority(t fwk.APICallType) int {
	if p, ok := s.prio[t]; ok {
		return p
	}
	return DefaultPriority
}

func (s *settings) deadline(t fwk.APICallType, now time.Time) time.Time {
	d, ok := s.timeout[t]
	if !ok {
		d = s.deflt
	}
	if d < 0 {
		return time.Time{}
	}
	return now.Add(d)
}

// options returns the submission options of a call of type t.
func (s *settings) options(t fwk.APICallType, now time.Time) dispatch.SubmitOptions {
	p := s.priority(t)
	return dispatch.SubmitOptions{
		Priority:  p,
		Tenant:    string(t),
		Deadline:  s.deadline(t, now),
		Droppable: band.Below(int64(p), int64(s.bind), int64(s.band)),
	}
}

func optErr(field string, v any, why string) error {
	return fmt.Errorf("scheduler: Options.%s %v %s", field, v, why)
}

// resolve checks o and fills in the defaults that are the adapter's own.
func (o Options) resolve() (settings, error) {
	switch {
	case o.Workers < 0:
		return settings{}, optErr("Workers", o.Workers, "must not be negative")
	case o.Capacity < 0:
		return settings{}, optErr("Capacity", o.Capacity, "must not be negative")
	case o.AgingBand < 0:
		return settings{}, optErr("AgingBand", o.AgingBand, "must not be negative")
	case o.PaceStatusPatches && o.Tenants[PodStatusPatch].MaxInFlight > 0:
		return settings{}, optErr("PaceStatusPatches", true, fmt.Sprintf(
			"and Tenants[%s].MaxInFlight %d both cap the status patches in flight: set one", PodStatusPatch, o.Tenants[PodStatusPatch].MaxInFlight))
	}
	s := settings{
		prio:     map[fwk.APICallType]int{PodBinding: DefaultBindingPriority, PodStatusPatch: DefaultStatusPatchPriority},
		timeout:  maps.Clone(o.Timeouts),
		deflt:    o.Timeout,
		band:     cmp.Or(o.AgingBand, DefaultAgingBand),
		workers:  min(cmp.Or(o.Workers, DefaultWorkers), maxWorkers),
		pace:     o.PaceStatusPatches,
		metrics:  o.Metrics,
		observer: o.Observer,
	}
	maps.Copy(s.prio, o.Priorities)
	if s.deflt == 0 {
		s.deflt = DefaultTimeout
	}
	for t, d := range s.timeout {
		if d == 0 {
			delete(s.timeout, t) // zero means the default, as everywhere else
		}
	}
	s.bind = s.prio[PodBinding]
	lower := maps.Clone(s.prio)
	lower["a plugin's type (DefaultPriority)"] = DefaultPriority
	for _, t := range slices.Sorted(maps.Keys(lower)) {
		if p := lower[t]; p < s.bind && band.Same(int64(p), int64(s.bind), int64(s.band)) {
			return settings{}, optErr("Priorities", o.Priorities, fmt.Sprintf(
				"put %s (%d) below %s (%d) in one priority band (of %d): aging would lift its calls past bindings",
				t, p, PodBinding, s.prio[PodBinding], s.band))
		}
	}
	switch kept := o.ReservedWorkers; {
	case kept >= s.workers:
		return settings{}, optErr("ReservedWorkers", kept, fmt.Sprintf("must be less than the workers (%d)", s.workers))
	case kept > 0:
		s.reserved = kept
	case kept == 0 && s.workers > 1:
		s.reserved = max(1, s.workers/4)
	}
	return s, nil
}

// coreConfig is the one place the adapter sets the core's Config: every
// dispatch setting the adapter derives from Options, and the callbacks that
// give fwk.APICall its semantics.
func (d *Dispatcher) coreConfig(o Options) dispatch.Config[types.UID, *entry] {
	s := &d.set
	cfg := dispatch.Config[types.UID, *entry]{
		Workers:   s.workers,
		RateLimit: d.wire.gate,
		Capacity:  cmp.Or(o.Capacity, DefaultCapacity),
		Aging:     o.Aging,
		AgingBand: s.band,
		Merge:     d.merge,
		Follow:    d.follow,
		NoOp:      noOp,
		Label:     label,
		OnDone:    d.done,
		Classify:  o.Classify,
		Retry:     o.Retry,
		Breaker:   o.Breaker,
		Start:     dispatch.StartPolicy{Adaptive: o.Adaptive},
		Rollout:   o.Rollout,
		Observer:  newLogObserver(d, o.Observer),
	}
	if cfg.Classify == nil {
		cfg.Classify = kube.Classify
	}
	if len(o.Tenants) > 0 {
		cfg.Tenants = make(map[string]dispatch.TenantConfig, len(o.Tenants))
		for t, tc := range o.Tenants {
			cfg.Tenants[string(t)] = tc
		}
	}
	if s.reserved > 0 {
		cfg.Start.ReservedWorkers, cfg.Start.UrgentPriority = s.reserved, s.bind
	}
	return cfg
}
