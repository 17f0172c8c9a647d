package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"

	"github.com/coalescer/dispatch"
	"golang.org/x/time/rate"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
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
	// (dispatch's Config.AgingBand, 10 by default), so that aging never
	// lifts a call past one of a more urgent type, however long it waits.
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
type Options struct {
	// Config is passed to dispatch.New, with the preset's settings added:
	// Merge, NoOp, Label and BeforeRetry are the preset's and must be left
	// nil; Classify, if nil, is Classify; RateLimit, if nil, is a
	// *rate.Limiter of QPS and Burst; Reserve, if zero, keeps
	// ReservedWorkers workers for bindings and deletions; Tenants gets a
	// PodStatusPatch tenant with the in-flight cap below, if one is asked
	// for and Tenants does not name one. Everything else —
	// Workers, Capacity, Retry, Breaker, Mode, Fallback, Observer, OnDone,
	// … — is used as given.
	Config dispatch.Config[types.UID, Call]

	// QPS is the API rate the dispatcher allows, taken per execution after
	// calls are ordered by priority. 0 means DefaultQPS; a negative value
	// means no limit. A positive value must allow at least one call a
	// minute (1.0/60): a slower limiter would hold calls past any deadline a
	// scheduler or controller sets, and one so slow that its interval
	// overflows a time.Duration never grants at all. NaN and +Inf are
	// refused too. Ignored if Config.RateLimit is set. Give the clientset no
	// limit of its own (see RESTConfig).
	QPS float64
	// Burst is the rate limiter's burst. 0 means DefaultBurst.
	Burst int

	// Priorities overrides the default priority of a call type: a
	// submission whose SubmitOptions.Priority is 0 gets its type's.
	Priorities map[CallType]int

	// ReservedWorkers is how many workers are kept for bindings and
	// deletions (Config.Reserve, at the lower of their priorities), so that
	// a storm of status patches never leaves a binding without a worker
	// (kubernetes#135900), whether the limit is tokens, connections or the
	// server's latency. 0 means a quarter of the workers, at least 1 (none
	// with a single worker); a negative value keeps none; a positive value
	// must be less than the workers (Config.Workers, or its default).
	// Ignored if Config.Reserve is set.
	ReservedWorkers int
	// StatusPatchMaxInFlight, if positive, caps how many workers status
	// patches may hold at once (their tenant's MaxInFlight). The
	// reservation makes it unnecessary for bindings' sake; it remains a way
	// to bound the patches' share of the server. 0 means no cap.
	StatusPatchMaxInFlight int
}

// Dispatcher is a dispatch.Dispatcher for kube calls, keyed by pod UID,
// with the preset's defaults for each submission. It embeds the core
// Dispatcher, whose methods (Cancel, Pending, Stats, SetMode, Close, …)
// it keeps; Submit and Post take the key from the call. Like the core
// Dispatcher it is safe for concurrent use; create one with NewDispatcher.
type Dispatcher struct {
	*dispatch.Dispatcher[types.UID, Call]
	prio map[CallType]int
}

// NewDispatcher returns a Dispatcher that runs kube calls with client,
// configured by o: the classifier, merge and no-op rules, SyncObject,
// labels, priorities, the workers kept for bindings and deletions, and the
// QPS limit.
//
// Bad options are reported here, each error naming the Options field the
// user set: "kube: Options.QPS …" for a field of the preset's own, and
// "kube: Options.Config: " followed by dispatch.New's error for a field of
// Config. What the preset derives from its own fields (the rate limiter,
// the reservation, the status-patch tenant) is checked before dispatch.New
// sees it.
func NewDispatcher(client kubernetes.Interface, o Options) (*Dispatcher, error) {
	if client == nil {
		return nil, errors.New("kube: NewDispatcher: client is nil")
	}
	cfg, prio, err := o.config()
	if err != nil {
		return nil, err
	}
	a := &calls{pods: podsFor(client)}
	cfg.BeforeRetry = a.beforeRetry
	d, err := dispatch.New(a.exec, cfg)
	if err != nil {
		return nil, fmt.Errorf("kube: Options.Config: %w", err)
	}
	a.amend = d.Amend // before any call can run: workers start on the first submission
	return &Dispatcher{Dispatcher: d, prio: prio}, nil
}

// config is the one place the preset turns Options into the core's
// Config: what it sets, and every default.
func (o Options) config() (dispatch.Config[types.UID, Call], map[CallType]int, error) {
	cfg := o.Config
	switch {
	case cfg.Merge != nil:
		return cfg, nil, optErr("Config.Merge", "is the preset's: leave it nil")
	case cfg.NoOp != nil:
		return cfg, nil, optErr("Config.NoOp", "is the preset's: leave it nil")
	case cfg.Label != nil:
		return cfg, nil, optErr("Config.Label", "is the preset's: leave it nil")
	case cfg.BeforeRetry != nil:
		return cfg, nil, optErr("Config.BeforeRetry", "is the preset's: leave it nil")
	case math.IsNaN(o.QPS) || math.IsInf(o.QPS, 1):
		return cfg, nil, optErr("QPS", fmt.Sprintf("%v is not a rate", o.QPS))
	case o.QPS > 0 && o.QPS < minQPS:
		return cfg, nil, optErr("QPS", fmt.Sprintf("%.3g is below one call a minute (%.3g)", o.QPS, minQPS))
	case o.Burst < 0:
		return cfg, nil, optErr("Burst", fmt.Sprintf("%d must not be negative", o.Burst))
	case o.StatusPatchMaxInFlight < 0:
		return cfg, nil, optErr("StatusPatchMaxInFlight", fmt.Sprintf("%d must not be negative", o.StatusPatchMaxInFlight))
	}
	prio := map[CallType]int{
		PodStatusPatch: DefaultStatusPatchPriority,
		PodBinding:     DefaultBindingPriority,
		PodDeletion:    DefaultDeletionPriority,
	}
	for t, p := range o.Priorities {
		if t.relevance() == 0 {
			return cfg, nil, optErr("Priorities", fmt.Sprintf("%q is not a CallType", t))
		}
		prio[t] = p
	}
	if cfg.AgingBand <= 0 {
		cfg.AgingBand = defaultBand
	}
	band := cfg.AgingBand
	for _, u := range []CallType{PodBinding, PodDeletion} {
		if p := prio[PodStatusPatch]; p < prio[u] && bandOf(p, band) == bandOf(prio[u], band) {
			return cfg, nil, optErr("Priorities", fmt.Sprintf(
				"puts status patches (%d) below %s (%d) in one priority band (of %d): aging would lift old patches past them",
				p, u, prio[u], band))
		}
	}
	cfg.Merge, cfg.NoOp, cfg.Label = merge, noOp, label
	if cfg.Classify == nil {
		cfg.Classify = Classify
	}
	if cfg.RateLimit == nil && o.QPS >= 0 {
		qps, burst := o.QPS, o.Burst
		if qps == 0 {
			qps = DefaultQPS
		}
		if burst == 0 {
			burst = DefaultBurst
		}
		cfg.RateLimit = rate.NewLimiter(rate.Limit(qps), burst)
	}
	if cfg.Workers == 0 {
		cfg.Workers = defaultWorkers
	}
	workers := cfg.Workers
	if cfg.Start.ReservedWorkers == 0 && workers > 0 {
		kept := o.ReservedWorkers
		switch {
		case kept >= workers:
			return cfg, nil, optErr("ReservedWorkers", fmt.Sprintf("%d must be less than the workers (%d)", kept, workers))
		case kept == 0 && workers > 1:
			kept = max(1, workers/4)
		}
		if kept > 0 {
			// The reservation starts the band of the less urgent of the two.
			urgent := bandOf(min(prio[PodBinding], prio[PodDeletion]), band) * band
			cfg.Start.ReservedWorkers, cfg.Start.UrgentPriority = kept, urgent
		}
	}
	if _, named := cfg.Tenants[string(PodStatusPatch)]; !named && o.StatusPatchMaxInFlight > 0 {
		tenants := maps.Clone(cfg.Tenants)
		if tenants == nil {
			tenants = make(map[string]dispatch.TenantConfig, 1)
		}
		tenants[string(PodStatusPatch)] = dispatch.TenantConfig{MaxInFlight: o.StatusPatchMaxInFlight}
		cfg.Tenants = tenants
	}
	return cfg, prio, nil
}

// bandOf is p's priority band (floor division).
func bandOf(p, band int) int {
	b := p / band
	if p%band < 0 {
		b--
	}
	return b
}

func optErr(field, why string) error {
	return fmt.Errorf("kube: Options.%s %s", field, why)
}

// options fills in the preset's defaults of a submission: its call type's
// priority if o.Priority is 0, and its call type as tenant if o.Tenant is
// "".
func (d *Dispatcher) options(c Call, o dispatch.SubmitOptions) dispatch.SubmitOptions {
	if o.Priority == 0 {
		o.Priority = d.prio[c.typ]
	}
	if o.Tenant == "" {
		o.Tenant = string(c.typ)
	}
	return o
}

// Submit hands c to the dispatcher under its pod's UID and returns at once
// with a Ticket on its outcome, as dispatch.Dispatcher.Submit does. A zero
// o.Priority means the call type's priority, an empty o.Tenant the call
// type. An invalid call is refused with an error matching ErrInvalidCall,
// and nothing is queued.
//
// Against a pending call for the same pod, relevance decides: a more
// relevant call replaces it (both submissions then share the outcome of
// the one that runs), a less relevant one ends Skipped at once, and a
// status patch folds into a pending status patch. While the pod's call is
// in flight, c waits behind it.
//
// A call that replaces a pending one runs at its own, higher priority, in
// its own tenant and under its own label: a binding that replaced a
// pending status patch runs, and is counted, as a binding.
func (d *Dispatcher) Submit(ctx context.Context, c Call, o dispatch.SubmitOptions) (*dispatch.Ticket[types.UID, Call], error) {
	if err := c.Err(); err != nil {
		return nil, err
	}
	return d.Dispatcher.Submit(ctx, c.uid, c, d.options(c, o))
}

// Post is the fire-and-forget form of Submit (see dispatch.Dispatcher.Post):
// its outcome reaches only the completion hook, the observer and Stats.
func (d *Dispatcher) Post(c Call, o dispatch.SubmitOptions) error {
	if err := c.Err(); err != nil {
		return err
	}
	return d.Dispatcher.Post(c.uid, c, d.options(c, o))
}

// SyncObject returns pod as it will look once its pending call lands —
// with a pending status patch's fields or a deletion's condition set, or a
// pending binding's node if pod is unbound — and makes pod the pending
// call's new baseline: the newest view of the pod, which the no-op test and
// the patch are computed against and whose resourceVersion a status patch
// sends as its precondition. If the call then has nothing left to change,
// it ends Skipped for every waiter, at once. A pod bound to another node
// than its pending binding's is returned as it is: a pod's node never
// changes once set, so the server's truth wins over a binding that cannot
// land (it ends Failed when it runs). It is kube-scheduler's
// APIDispatcher.SyncObject, for an informer's update handler or the
// scheduler's cache.
//
// Only the pending call is seen and rewritten (see dispatch's Amend): a
// call in flight may be taking effect already, and pod is returned as it
// is. pod is never written: a changed copy is returned, or pod itself if
// nothing changes.
func (d *Dispatcher) SyncObject(pod *v1.Pod) (*v1.Pod, error) {
	if pod == nil {
		return nil, errors.New("kube: SyncObject: pod is nil")
	}
	if pod.UID == "" {
		return pod, nil
	}
	b := baselineOf(pod) // outside the lock; rebase only assigns
	var pending Call
	found, err := d.Amend(pod.UID, func(c Call) (Call, error) {
		if c.Err() != nil {
			return c, c.Err()
		}
		pending = c.rebase(b)
		return pending, nil
	})
	if err != nil || !found {
		return pod, err
	}
	return pending.project(pod), nil
}

// ModeOf maps a feature gate's position to the dispatcher's mode: enabled
// is Async, disabled is Sync, the synchronous path through the same
// machinery. Use it for Options.Config.Mode at start-up.
func ModeOf(enabled bool) dispatch.Mode {
	if enabled {
		return dispatch.ModeAsync
	}
	return dispatch.ModeSync
}

// SetEnabled flips the dispatcher with a feature gate at run time:
// SetMode(ctx, ModeOf(enabled)). Turning it off follows
// Config.SwitchPolicy for what is queued, and waits until ctx ends at most.
func (d *Dispatcher) SetEnabled(ctx context.Context, enabled bool) error {
	return d.SetMode(ctx, ModeOf(enabled))
}
