package dispatch

import (
	"sync/atomic"

	"github.com/google/btree"
)

// TenantStats are one tenant's figures in Stats: calls queued and
// executing; submissions admitted and rejected, and calls shed.
type TenantStats struct {
	Queued   int
	InFlight int
	Admitted uint64
	Rejected uint64
	Dropped  uint64
}

// strideBase is the pass a weight-1 tenant advances per pick; a tenant of
// weight w advances strideBase/w, so it is picked w times as often.
const strideBase = 1 << 32

// tenant is one tenant's share of the queue, guarded by the Dispatcher's
// lock. Each tenant keeps its ready calls in its own index in ready order;
// the queue picks among the tenants' best calls (queue.pick).
type tenant[K comparable, T any] struct {
	name       string
	cfg        TenantConfig
	configured bool // named in Config.Tenants (or the tenant of no name): kept while idle
	stride     uint64
	ready      readyIndex[K, T]
	victims    *btree.BTreeG[entry[K, T]] // own calls that may be shed, if MaxQueued > 0
	queued     int
	inflight   int
	// held counts the places kept for calls a worker has taken whose
	// attempt has not begun (runRelock): taken without the lock, and read
	// by overQuota under it.
	held   atomic.Int32
	pass   uint64 // stride scheduling: lowest pass is picked next among equals
	active int    // index in queue.active, or -1
	st     TenantStats
	tag    callTag[K, T] // its calls' without Config.Label (liveCalls)
	// lastTag is the tag with Config.Label its last call was counted
	// under, while liveCalls keeps it: the next call of the tenant is
	// most often of the same label, and is counted without a lookup.
	lastTag *callTag[K, T]
}

func newTenant[K comparable, T any](name string, cfg TenantConfig) *tenant[K, T] {
	w := max(cfg.Weight, 1)
	t := &tenant[K, T]{
		name:   name,
		cfg:    cfg,
		stride: max(strideBase/uint64(w), 1), // weights beyond 2³² count as 2³²,
		ready:  newReadyIndex[K, T](),
		active: -1,
	}
	t.tag.ten = t
	if cfg.MaxQueued > 0 {
		t.victims = btree.NewG(btreeDegree, readyLess[K, T])
	}
	return t
}

// capped reports whether the tenant may not start another execution.
func (t *tenant[K, T]) capped() bool {
	return t.cfg.MaxInFlight > 0 && t.inflight >= t.cfg.MaxInFlight
}

// overQuota reports whether one more queued call would exceed the quota,
// counting freed calls about to leave, and the places held for calls
// taken whose attempt has not begun.
func (t *tenant[K, T]) overQuota(freed int) bool {
	return t.cfg.MaxQueued > 0 && t.queued+int(t.held.Load())-freed >= t.cfg.MaxQueued
}

// tenants are the tenants with calls, and the configured ones, by name.
// Tenants that Config.Tenants does not name are forgotten again when they
// have no call left (forgetIdle), so memory stays bounded whatever names
// callers make up. Guarded by the Dispatcher's lock.
type tenants[K comparable, T any] struct {
	byName map[string]*tenant[K, T]
	none   *tenant[K, T] // the tenant of submissions that name none
	rest   TenantConfig  // of the tenants Config.Tenants does not name
}

// newTenants returns the tenants configured by named and rest, each
// reported from the start. The named ones are made here, as named says
// now, and kept for good: named itself is not kept, so that the caller
// may change or reuse its map while the dispatcher runs.
func newTenants[K comparable, T any](named map[string]TenantConfig, rest TenantConfig) tenants[K, T] {
	ts := tenants[K, T]{byName: map[string]*tenant[K, T]{}, rest: rest}
	for name, cfg := range named {
		ts.add(name, cfg, true)
	}
	ts.none = ts.get("")
	return ts
}

// get returns the tenant named name, creating it the first time.
func (ts *tenants[K, T]) get(name string) *tenant[K, T] {
	if name == "" && ts.none != nil {
		return ts.none
	}
	t := ts.byName[name]
	if t == nil {
		t = ts.add(name, ts.rest, name == "")
	}
	return t
}

// add makes the tenant named name, with cfg; a configured one is kept
// while idle.
func (ts *tenants[K, T]) add(name string, cfg TenantConfig, configured bool) *tenant[K, T] {
	t := newTenant[K, T](name, cfg)
	t.configured = configured
	ts.byName[name] = t
	return t
}

// keep puts t back if shedding its last call made forgetIdle drop it while
// a new call of t is on its way in.
func (ts *tenants[K, T]) keep(t *tenant[K, T]) {
	if !t.configured {
		ts.byName[t.name] = t
	}
}

// forgetIdle forgets an unconfigured tenant that has no call left, with its
// statistics.
func (ts *tenants[K, T]) forgetIdle(t *tenant[K, T]) {
	if !t.configured && t.queued == 0 && t.inflight == 0 && t.active < 0 {
		delete(ts.byName, t.name)
	}
}

// count records a submission's admission or refusal: err says which.
// Either way the submission may have left t without a call — refused,
// skipped (Config.Moot, SkipIncoming), or coalesced into another tenant's
// call — and t is forgotten then, as it would be when its last call ended.
func (ts *tenants[K, T]) count(t *tenant[K, T], err error, totals *counters) {
	totals.submitted++
	if err != nil {
		totals.rejected++
		t.st.Rejected++
	} else {
		t.st.Admitted++
	}
	ts.forgetIdle(t)
}

// TenantConfig bounds one tenant; its zero value bounds nothing, weight 1.
type TenantConfig struct {
	// MaxQueued caps the tenant's calls waiting to run: beyond it a new
	// call — or another tenant's pending call that a submission of this
	// one takes over, by outranking or replacing it — evicts the tenant's
	// worst droppable queued call if it would run before it, else the
	// submission is refused with BoundQuota. A call a worker has taken
	// keeps its place until its attempt begins (while the worker tells
	// earlier outcomes, and Observer.OnStart), so that a callback that
	// ends the worker's goroutine sends it back to the queue, never out.
	MaxQueued int
	// MaxInFlight caps its executions: at the cap its calls are passed
	// over. The tenant then takes back the workers its executions free
	// as they end, but banks no more share of the workers (Weight) for
	// the time it spent at the cap.
	MaxInFlight int
	// Weight shares workers among tenants whose best ready calls are at
	// one band and level (Config.AgingBand), by stride scheduling: each
	// call a worker takes advances its tenant's pass by 2³²/Weight (at
	// least 1), lowest first. A call the deadline check ends unstarted
	// (StartPolicy.NoDeadlineCheck) took no worker, and advances nothing.
	Weight int
}

func (c TenantConfig) check(field string) error {
	switch {
	case c.MaxQueued < 0:
		return fieldErr(field+".MaxQueued", c.MaxQueued, "must not be negative")
	case c.MaxInFlight < 0:
		return fieldErr(field+".MaxInFlight", c.MaxInFlight, "must not be negative")
	case c.Weight < 0:
		return fieldErr(field+".Weight", c.Weight, "must not be negative")
	}
	return nil
}
