package dispatch

// Queued returns the calls of tenant waiting to run — ready, out a backoff
// or behind their key's running call — as Stats().Tenants[tenant].Queued
// would: 0 for a tenant with none. It is for a gauge kept current on every
// call: it holds the lock for one map lookup and allocates nothing, where
// Stats copies every figure.
func (d *Dispatcher[K, T]) Queued(tenant string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if t := d.tenants.byName[tenant]; t != nil {
		return t.queued
	}
	return 0
}
