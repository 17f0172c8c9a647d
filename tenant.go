package dispatch

import (
	"math"

	"github.com/google/btree"
)

// TenantStats are one tenant's figures in a Stats snapshot.
type TenantStats struct {
	// Queued is the number of the tenant's calls waiting to run.
	Queued int
	// InFlight is the number of the tenant's calls executing.
	InFlight int
	// Admitted counts the tenant's accepted submissions.
	Admitted uint64
	// Rejected counts the tenant's refused submissions.
	Rejected uint64
	// Dropped counts the tenant's calls shed under load.
	Dropped uint64
}

// strideBase is the pass a weight-1 tenant advances per pick; a tenant of
// weight w advances strideBase/w, so it is picked w times as often.
const strideBase = 1 << 32

// tenant is one tenant's share of the queue, guarded by the Dispatcher's
// lock. Each tenant keeps its ready calls in its own B-tree in ready order;
// the queue picks among the tenants' best calls (queue.pick).
type tenant[K comparable, T any] struct {
	name     string
	cfg      TenantConfig
	stride   uint64
	ready    *btree.BTreeG[entry[K, T]]
	shed     *btree.BTreeG[entry[K, T]] // own evictable calls, if MaxQueued > 0
	queued   int
	inflight int
	pass     uint64 // stride scheduling: lowest pass is picked next among equals
	active   int    // index in queue.active, or -1
	st       TenantStats
}

func newTenant[K comparable, T any](name string, cfg TenantConfig) *tenant[K, T] {
	w := max(cfg.Weight, 1)
	t := &tenant[K, T]{
		name:   name,
		cfg:    cfg,
		stride: strideBase / uint64(w),
		ready:  btree.NewG(btreeDegree, readyLess[K, T]),
		active: -1,
	}
	if cfg.MaxQueued > 0 {
		t.shed = btree.NewG(btreeDegree, readyLess[K, T])
	}
	return t
}

// capped reports whether the tenant may not start another execution.
func (t *tenant[K, T]) capped() bool {
	return t.cfg.MaxInFlight > 0 && t.inflight >= t.cfg.MaxInFlight
}

// overQuota reports whether one more queued call would exceed the quota,
// counting freed calls about to leave.
func (t *tenant[K, T]) overQuota(freed int) bool {
	return t.cfg.MaxQueued > 0 && t.queued-freed >= t.cfg.MaxQueued
}

// tenantFor returns the tenant named name, creating it with the default
// configuration the first time.
func (d *Dispatcher[K, T]) tenantFor(name string) *tenant[K, T] {
	if name == "" {
		return d.t0
	}
	t := d.tenants[name]
	if t == nil {
		cfg, ok := d.cfg.Tenants[name]
		if !ok {
			cfg = d.cfg.DefaultTenant
		}
		t = newTenant[K, T](name, cfg)
		d.tenants[name] = t
	}
	return t
}

// level is a ready call's effective priority at now: its priority plus one
// per aging interval waited, floor((now − virtual time) / aging), saturated.
// Without aging it is the priority.
func (q *queue[K, T]) level(c *call[K, T], now int64) int64 {
	if q.aging == 0 {
		return int64(c.prio)
	}
	diff := now - c.k1
	if (c.k1 < 0) && diff < now { // now − k1 overflowed
		return math.MaxInt64 / q.aging
	}
	if (c.k1 > 0) && diff > now {
		return math.MinInt64 / q.aging
	}
	lvl := diff / q.aging
	if diff%q.aging != 0 && diff < 0 {
		lvl-- // floor
	}
	return lvl
}

// pick chooses the tenant whose best ready call runs next: the highest
// effective level wins; among tenants whose best calls are at the same level,
// the one with the lowest stride pass (so workers are shared in proportion to
// weights). Tenants at their in-flight cap are passed over. It returns nil
// if no tenant may run.
func (q *queue[K, T]) pick(now int64) *tenant[K, T] {
	if len(q.active) == 1 {
		if t := q.active[0]; !t.capped() {
			return t
		}
		return nil
	}
	var best *tenant[K, T]
	var bestLvl int64
	for _, t := range q.active {
		if t.capped() {
			continue
		}
		h, _ := t.ready.Min()
		lvl := q.level(h.c, now)
		if best == nil || lvl > bestLvl || (lvl == bestLvl && t.pass < best.pass) {
			best, bestLvl = t, lvl
		}
	}
	return best
}

// popFrom removes and returns t's best ready call, charging t one stride.
func (q *queue[K, T]) popFrom(t *tenant[K, T]) *call[K, T] {
	e, _ := t.ready.DeleteMin()
	c := e.c
	q.nready--
	if t.ready.Len() == 0 {
		q.deactivate(t)
	}
	q.vpass = t.pass
	t.pass += t.stride
	c.state = csIdle
	q.unshed(c)
	return c
}

// activate adds t to the tenants with ready calls. A tenant returning from
// idle starts at the current pass, so it cannot claim the service it did
// not use while idle.
func (q *queue[K, T]) activate(t *tenant[K, T]) {
	t.pass = max(t.pass, q.vpass)
	t.active = len(q.active)
	q.active = append(q.active, t)
}

func (q *queue[K, T]) deactivate(t *tenant[K, T]) {
	last := q.active[len(q.active)-1]
	q.active[t.active] = last
	last.active = t.active
	q.active[len(q.active)-1] = nil
	q.active = q.active[:len(q.active)-1]
	t.active = -1
}
