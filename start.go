package dispatch

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
