package scheduler

import (
	"fmt"
	"maps"
	"time"

	"github.com/coalescer/dispatch"
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

	// DefaultBindingPriority is the priority of PodBinding calls: a pod's
	// binding cycle waits on it.
	DefaultBindingPriority = 10
	// DefaultPriority is the priority of PodStatusPatch calls and of every
	// call type Options.Priorities does not name — a plugin's own calls —
	// so that no call goes ahead of a binding unless configured to.
	DefaultPriority = 0
)

// Options configures New. The zero value gives the defaults. The type-based
// fields are keyed by fwk.APICallType: PodBinding, PodStatusPatch or a
// plugin's own type.
type Options struct {
	// Workers bounds concurrent executions. 0 means DefaultWorkers.
	Workers int
	// Priorities overrides the priority of call types: PodBinding is
	// DefaultBindingPriority, every other type DefaultPriority. Higher runs
	// first; waiting calls age one level per Aging.
	Priorities map[fwk.APICallType]int
	// ReservedWorkers is how many workers are kept for calls at the
	// binding's priority or above, so that a storm of status patches never
	// leaves a binding without a worker (kubernetes#135900). 0 means a
	// quarter of the workers, at least one (none with a single worker); a
	// negative value keeps none.
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
	// Aging is how fast a waiting call gains priority: one level per
	// interval. 0 means dispatch.DefaultAging.
	Aging time.Duration
	// StrictPriority turns aging off (see dispatch.Config.StrictPriority).
	StrictPriority bool
	// Tenants sets per-call-type quotas: each call type is its own tenant,
	// so a type's queued and in-flight calls can be capped and its share
	// of workers weighted.
	Tenants map[fwk.APICallType]dispatch.TenantConfig
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
	// Mode is the mode to start in: dispatch.Async (the default), or
	// dispatch.Sync, in which Add runs each call inline, through the same
	// merging, retries and outcomes. See ModeOf.
	Mode dispatch.Mode
	// SwitchPolicy says what a switch to Sync does with queued calls.
	SwitchPolicy dispatch.SwitchPolicy
	// Fallback, if set, switches to Sync by itself when the async path is
	// doing harm.
	Fallback *dispatch.FallbackPolicy
	// Observer, if set, receives the dispatcher's events, labelled by call
	// type and with the call type as tenant: a dispatchprom.Observer, say.
	Observer dispatch.Observer
	// Metrics, if set, receives what kube-scheduler's own async-call
	// metrics record.
	Metrics Metrics
}

// settings is Options resolved: the defaults filled in, and what New needs
// besides the core's Config.
type settings struct {
	prio     map[fwk.APICallType]int
	timeout  map[fwk.APICallType]time.Duration
	deflt    time.Duration // Timeout for the other types; < 0: none
	urgent   int           // priority at or above which a call is kept and never shed
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
		Droppable: p < s.urgent,
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
	}
	s := settings{
		prio:     map[fwk.APICallType]int{PodBinding: DefaultBindingPriority, PodStatusPatch: DefaultPriority},
		timeout:  maps.Clone(o.Timeouts),
		deflt:    o.Timeout,
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
	s.urgent = s.prio[PodBinding]
	return s, nil
}

// coreConfig is the one place the adapter sets the core's Config: every
// dispatch setting the adapter derives from Options, and the callbacks that
// give fwk.APICall its semantics.
func (d *Dispatcher) coreConfig(o Options) dispatch.Config[types.UID, *entry] {
	workers := o.Workers
	if workers == 0 {
		workers = DefaultWorkers
	}
	capacity := o.Capacity
	if capacity == 0 {
		capacity = DefaultCapacity
	}
	cfg := dispatch.Config[types.UID, *entry]{
		Workers:        workers,
		RateLimit:      d.wire.gate,
		Capacity:       capacity,
		Aging:          o.Aging,
		StrictPriority: o.StrictPriority,
		Adaptive:       o.Adaptive,
		Merge:          d.merge,
		NoOp:           noOp,
		Label:          label,
		OnDone:         d.done,
		Classify:       o.Classify,
		Retry:          o.Retry,
		Breaker:        o.Breaker,
		Mode:           o.Mode,
		SwitchPolicy:   o.SwitchPolicy,
		Fallback:       o.Fallback,
		Observer:       newLogObserver(d, o.Observer),
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
	if kept := o.ReservedWorkers; kept >= 0 && workers > 1 {
		if kept == 0 {
			kept = max(1, workers/4)
		}
		cfg.Reserve = dispatch.Reservation{Workers: kept, MinPriority: d.set.urgent}
	}
	return cfg
}
