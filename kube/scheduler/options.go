package scheduler

import (
	"cmp"
	"fmt"
	"iter"
	"maps"
	"slices"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/internal/band"
	"github.com/coalescer/dispatch/kube"
	"github.com/coalescer/dispatch/kube/internal/preset"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
)

// The call types of kube-scheduler's own calls (upstream's
// api_calls.PodBinding and PodStatusPatch), whose names are kube's.
const (
	podBinding     = fwk.APICallType(kube.PodBinding)
	podStatusPatch = fwk.APICallType(kube.PodStatusPatch)
)

// The adapter's own defaults (see Options).
const (
	defaultCapacity     = 100_000
	defaultTimeout      = 5 * time.Minute
	bindingPriority     = 20
	pluginPriority      = 10
	statusPatchPriority = 0
)

// Options configures New. The zero value gives the defaults, each stated
// in its field's doc. The fields of dispatch.Config's types are passed to
// it, the adapter filling in the zeros whose default is its own. The
// type-based fields are keyed by fwk.APICallType: upstream's
// api_calls.PodBinding ("pod_binding", kube.PodBinding),
// api_calls.PodStatusPatch ("pod_status_patch", kube.PodStatusPatch), or a
// plugin's own type.
type Options struct {
	// Workers bounds concurrent executions. 0 means 16, kube-scheduler's
	// default parallelism; a value above 65 536, the most workers the core
	// runs, means 65 536: kube-scheduler accepts any positive parallelism
	// and hands it over.
	Workers int
	// Priorities overrides the priority of call types. A type it does not
	// name keeps its default: "pod_binding" 20 (a pod's binding cycle
	// waits on it), "pod_status_patch" 0 (a report nobody waits on), and
	// every other type 10 — a plugin's call may be something a pod's
	// scheduling waits on, and is not a binding. Higher runs first; a
	// waiting call ages one level per Aging, within its priority band
	// (AgingBand). New refuses priorities that put a type in the binding's
	// band below it: aging would lift those calls past bindings.
	Priorities map[fwk.APICallType]int
	// Start decides whether the next execution may start
	// (dispatch.Config.Start). The adapter fills in two zeros:
	// ReservedWorkers 0 keeps a quarter of the workers (at least one, none
	// with a single worker) for calls in the binding's priority band or
	// above, so that a storm of status patches (or of a plugin's calls)
	// never leaves a binding without a worker (kubernetes#135900), and a
	// negative value keeps none; while workers are kept, UrgentPriority 0
	// means the binding's priority.
	Start dispatch.StartPolicy
	// Timeout bounds how long a call may wait and run, from Add to its
	// end, for the call types Timeouts does not name: past it the call
	// ends with an error matching dispatch.ErrExpired. 0 means five
	// minutes, the longest a pod stays in kube-scheduler's unschedulable
	// pool before it is tried again (with a fresh status patch); a
	// negative value means no limit.
	Timeout time.Duration
	// Timeouts overrides Timeout by call type (a negative value: no limit).
	Timeouts map[fwk.APICallType]time.Duration
	// Capacity bounds the objects with a call queued or in flight. Beyond
	// it, a call for a new object evicts the worst queued call below the
	// binding's priority if the newcomer would run before it, and is
	// otherwise refused with an error matching dispatch.ErrBackpressure.
	// 0 means 100 000, ten times the core's default: every pending pod of a
	// large cluster may have a status patch waiting during a storm, and
	// upstream's dispatcher has no bound at all.
	Capacity int
	// Aging is how fast a waiting call gains priority over the other calls
	// of its priority band: one level per interval. 0 means the core's
	// default, a level per second.
	Aging time.Duration
	// AgingBand groups priorities into bands of this many consecutive
	// levels, and aging works only within a band (see
	// dispatch.Config.AgingBand): a call never runs before a ready call of
	// a higher band. 0 means 10; 1 is strict priority.
	AgingBand int
	// Tenants sets per-call-type quotas: each call type is its own tenant,
	// so a type's queued and in-flight calls can be capped and its share
	// of workers weighted. The tenants of kube-scheduler's two types, of
	// the relevance table's and of the types Options names are kept (and
	// in Stats.Tenants) from New on, even while they have no call; another
	// type's is made for its calls and forgotten when they end.
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
	// from (see New); with any other (a fake clientset), or one built
	// without a limiter (rest.Config.QPS negative), it does nothing.
	// Tenants must not then give "pod_status_patch" a MaxInFlight.
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
	// Rollout is the feature gate's lever: the mode to start in
	// (dispatch.ModeAsync, the default, or dispatch.ModeSync, in which Add
	// runs each call inline, through the same merging, retries and
	// outcomes; see kube.ModeOf), what a switch to Sync does with queued calls,
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
	timeouts map[fwk.APICallType]time.Duration
	deflt    time.Duration // Timeout for the other types; < 0: none
	band     int           // AgingBand
	bind     int           // the binding's priority: calls in its band or above are kept and never shed
	start    dispatch.StartPolicy
	reserved int // workers kept for urgent calls (start.ReservedWorkers)
	workers  int
	pace     bool // PaceStatusPatches
	metrics  Metrics
	observer dispatch.Observer
}

func (s *settings) priority(t fwk.APICallType) int {
	if p, ok := s.prio[t]; ok {
		return p
	}
	return pluginPriority
}

// timeout is the submission Timeout of a call of type t: its deadline,
// that long after Add, read on the core's clock, so that Add reads none
// of its own; negative (Options' "none") is 0.
func (s *settings) timeout(t fwk.APICallType) time.Duration {
	d, ok := s.timeouts[t]
	if !ok {
		d = s.deflt
	}
	return max(d, 0)
}

// options returns the submission options of a call of type t.
func (s *settings) options(t fwk.APICallType) dispatch.SubmitOptions {
	p := s.priority(t)
	return dispatch.SubmitOptions{
		Priority:  p,
		Tenant:    string(t),
		Timeout:   s.timeout(t),
		Droppable: band.Below(int64(p), int64(s.bind), int64(s.band)),
	}
}

func optErr(field string, v any, why string) error {
	return fmt.Errorf("scheduler: Options.%s %v %s", field, v, why)
}

// resolve checks o and fills in the defaults that are the adapter's own.
func (o Options) resolve() (settings, error) {
	if err := o.check(); err != nil {
		return settings{}, err
	}
	s := settings{
		timeouts: maps.Clone(o.Timeouts),
		deflt:    cmp.Or(o.Timeout, defaultTimeout),
		band:     cmp.Or(o.AgingBand, preset.AgingBand),
		workers:  min(cmp.Or(o.Workers, preset.Workers), maxWorkers),
		pace:     o.PaceStatusPatches,
		metrics:  o.Metrics,
		observer: o.Observer,
	}
	// A zero timeout means the default, as everywhere else.
	maps.DeleteFunc(s.timeouts, func(_ fwk.APICallType, d time.Duration) bool { return d == 0 })
	var err error
	if s.prio, err = o.priorities(s.band); err != nil {
		return settings{}, err
	}
	s.bind = s.prio[podBinding]
	s.start = preset.Start(o.Start, s.workers, s.bind)
	s.reserved = s.start.ReservedWorkers
	return s, nil
}

// check reports a bad setting of the adapter's own, naming its field; the
// settings passed through are the core's to check.
func (o Options) check() error {
	switch {
	case o.Workers < 0:
		return optErr("Workers", o.Workers, "must not be negative")
	case o.Capacity < 0:
		return optErr("Capacity", o.Capacity, "must not be negative")
	case o.AgingBand < 0:
		return optErr("AgingBand", o.AgingBand, "must not be negative")
	case o.PaceStatusPatches && o.Tenants[podStatusPatch].MaxInFlight > 0:
		return optErr("PaceStatusPatches", true, fmt.Sprintf(
			"and Tenants[%s].MaxInFlight %d both cap the status patches in flight: set one", podStatusPatch, o.Tenants[podStatusPatch].MaxInFlight))
	}
	return nil
}

// priorities returns the named call types' priorities, Options.Priorities
// over the defaults, and refuses any type's, a plugin's default included,
// in the binding's band of width below it.
func (o Options) priorities(width int) (map[fwk.APICallType]int, error) {
	prio := map[fwk.APICallType]int{podBinding: bindingPriority, podStatusPatch: statusPatchPriority}
	maps.Copy(prio, o.Priorities)
	bind := prio[podBinding]
	lower := maps.Clone(prio)
	lower["a plugin's type (by default)"] = pluginPriority
	for _, t := range slices.Sorted(maps.Keys(lower)) {
		if p := lower[t]; p < bind && band.Same(int64(p), int64(bind), int64(width)) {
			return nil, optErr("Priorities", o.Priorities, fmt.Sprintf(
				"put %s (%d) below %s (%d) in one priority band (of %d): aging would lift its calls past bindings",
				t, p, podBinding, bind, width))
		}
	}
	return prio, nil
}

// coreConfig is the one place the adapter sets the core's Config: every
// dispatch setting the adapter derives from Options, and the callbacks that
// give fwk.APICall its semantics.
func (d *Dispatcher) coreConfig(o Options) dispatch.Config[types.UID, *entry] {
	s := &d.set
	cfg := dispatch.Config[types.UID, *entry]{
		Workers:   s.workers,
		RateLimit: d.wire.gate,
		Capacity:  cmp.Or(o.Capacity, defaultCapacity),
		Aging:     o.Aging,
		AgingBand: s.band,
		Merge:     d.merge,
		Follow:    d.follow,
		Moot:      mootCall,
		NoOp:      noOp,
		Label:     label,
		OnDone:    d.done,
		Classify:  o.Classify,
		Retry:     o.Retry,
		Breaker:   o.Breaker,
		Start:     s.start,
		Rollout:   o.Rollout,
		Observer:  newLogObserver(d, o.Observer),
	}
	if cfg.Classify == nil {
		cfg.Classify = kube.Classify
	}
	cfg.Tenants = d.tenants(o)
	return cfg
}

// tenants returns the core's Config.Tenants: every call type the adapter
// knows of (kube-scheduler's two, the relevance table's, and those Options
// name) with its Options.Tenants entry, or none. Named, a call type's
// tenant is kept while it has no call. The core forgets an unnamed tenant
// when its last call ends and makes it again for the next one, at the
// cost of allocations on every call that finds its type idle
// (TestCallTypeTenantAllocs). A plugin's type that none of these names
// still works, as an unnamed tenant.
func (d *Dispatcher) tenants(o Options) map[string]dispatch.TenantConfig {
	ts := make(map[string]dispatch.TenantConfig, 2+len(d.relevances)+len(o.Tenants))
	for _, known := range []iter.Seq[fwk.APICallType]{
		slices.Values([]fwk.APICallType{podBinding, podStatusPatch}),
		maps.Keys(d.relevances), maps.Keys(o.Priorities), maps.Keys(o.Timeouts), maps.Keys(o.Tenants),
	} {
		for t := range known {
			ts[string(t)] = o.Tenants[t]
		}
	}
	return ts
}
