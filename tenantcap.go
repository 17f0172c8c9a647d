package dispatch

import "fmt"

// SetTenantMaxInFlight changes the MaxInFlight of the tenant named name
// (see TenantConfig) while the dispatcher runs, for a cap that follows
// something only known at run time — the server's latency, say. Executions
// already running keep running; the new cap decides which calls start
// next, and raising it wakes idle workers for the tenant's ready calls. 0
// lifts the cap. A tenant Config.Tenants does not name takes the cap with
// Config.DefaultTenant's other settings, and is kept while idle from then
// on, so that the cap holds for its next calls. n must not be negative.
// It takes the dispatcher's lock briefly and never blocks otherwise.
func (d *Dispatcher[K, T]) SetTenantMaxInFlight(name string, n int) error {
	if n < 0 {
		return fmt.Errorf("dispatch: SetTenantMaxInFlight(%q): n %d must not be negative", name, n)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	t := d.tenants.get(name)
	t.configured = true
	old := t.cfg.MaxInFlight
	t.cfg.MaxInFlight = n
	if n == 0 || (old > 0 && n > old) {
		// Calls passed over at the old cap may start now.
		d.wake.workers()
		d.wake.kick()
	}
	return nil
}
