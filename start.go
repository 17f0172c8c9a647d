package dispatch

import (
	"github.com/coalescer/dispatch/internal/breaker"
	"github.com/coalescer/dispatch/internal/due"
)

// This file is the reservation of workers for urgent calls
// (StartPolicy.ReservedWorkers). It runs under the dispatcher's lock.

// lowLimit is how many worker executions below the reservation's priority
// may run: the rest of the concurrency, and at least one.
func (d *Dispatcher[K, T]) lowLimit() int {
	return max(d.concurrency()-d.cfg.Start.ReservedWorkers, 1)
}

// mayProbe reports whether c may start while a server's Retry-After holds
// the other calls (AdaptivePolicy): a call that may use a reserved worker
// is never held, so that a binding does not wait out a hold that a status
// patch drew; if the server throttles it too, its own retry waits.
func (d *Dispatcher[K, T]) mayProbe(c *call[K, T]) bool {
	return d.cfg.Start.ReservedWorkers > 0 && d.urgent(c)
}

// urgent reports whether c may use a reserved worker: its priority is in
// the reservation's band or above (settings.urgent).
func (d *Dispatcher[K, T]) urgent(c *call[K, T]) bool {
	return c.prio >= d.cfg.urgent
}

// breakerAdmits reports whether the circuit breaker lets an execution start
// now, and whether it runs as a half-open probe.
func (d *Dispatcher[K, T]) breakerAdmits(now int64, ob *outbox[K, T]) (probe, ok bool) {
	b := d.breaker
	if b == nil {
		return false, true
	}
	ok, probe, ch := b.Admit(now)
	noteCircuit(d.cfg.Observer, ch, &ob.notes)
	if !ok && b.State() == breaker.Open {
		d.due.Set(due.Probe, b.OpenUntil())
	}
	return probe, ok
}

// breakerRecord tells the circuit breaker how an attempt of c ended. Only
// executions that say something about the API's health count: ones that
// ran, were not cut short by the call's own end, and succeeded or failed
// retryably.
func (d *Dispatcher[K, T]) breakerRecord(c *call[K, T], a *attempt[K, T], now int64, ob *outbox[K, T]) {
	b := d.breaker
	if b == nil {
		return
	}
	v := breaker.Ignored
	if a.ran && !c.orphan && !a.callDone {
		switch {
		case a.err == nil:
			v = breaker.Healthy
		case a.class == ClassRetry:
			v = breaker.Failed
		}
	}
	if c.probe {
		b.EndProbe(c.runner)
		c.probe = false
	}
	ch := b.Record(now, v)
	noteCircuit(d.cfg.Observer, ch, &ob.notes)
	switch {
	case ch.To == breaker.Closed && ch.Changed():
		d.cond.Broadcast() // resume every worker
	case ch.To == breaker.Open:
		d.due.Set(due.Probe, b.OpenUntil())
	}
}

// adapt feeds an attempt's end to the adaptive limit, if any.
func (d *Dispatcher[K, T]) adapt(a *attempt[K, T], now int64, ob *outbox[K, T]) {
	if d.adaptive == nil || !a.ran || a.callDone || a.panicked {
		return
	}
	s, hint := strainOf(a.err, a.class)
	from, to := d.adaptive.Record(now, a.runTime, s, hint)
	if to > from {
		d.wakeWorker()
	}
	if obs := d.cfg.Observer; obs != nil && to != from {
		ob.notes = append(ob.notes, func() { obs.OnLimitChange(from, to) })
	}
}

// concurrency is the number of worker executions allowed now.
func (d *Dispatcher[K, T]) concurrency() int {
	if d.adaptive != nil {
		return d.adaptive.Limit()
	}
	return d.cfg.Workers
}

// unfinishable reports whether c cannot finish by its waiters' latest
// deadline (the start check, internal/startcheck); a call it would refuse
// may start as the check's probe.
func (d *Dispatcher[K, T]) unfinishable(c *call[K, T], now int64) bool {
	if d.check == nil {
		return false
	}
	refuse, probe := d.check.Refuse(c.label, c.execDeadline(), now)
	c.checkProbe = c.checkProbe || probe
	return refuse
}
