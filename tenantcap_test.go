package dispatch

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSetTenantMaxInFlight: a tenant's cap changed at run time holds for
// the calls that start after it — lowered, running executions finish and
// no more start than the new cap; raised, idle workers start the tenant's
// waiting calls at once; lifted (0), every worker may take them.
func TestSetTenantMaxInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(100 * time.Millisecond)
		d := newD(t, r.exec, Config[string, int]{
			Workers:  8,
			Capacity: 1000,
			Tenants:  map[string]TenantConfig{"patch": {MaxInFlight: 4}},
		})
		for i := range 200 {
			require.NoError(t, d.Post(fmt.Sprint("patch/", i), 0, SubmitOptions{Tenant: "patch"}))
		}
		synctest.Wait()
		assert.Equal(t, 4, d.Stats().InFlight, "the configured cap")

		require.NoError(t, d.SetTenantMaxInFlight("patch", 1))
		synctest.Wait()
		assert.Equal(t, 4, d.Stats().InFlight, "running executions are not stopped")
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, 1, d.Stats().InFlight, "lowered: one starts as the four end")

		require.NoError(t, d.SetTenantMaxInFlight("patch", 3))
		synctest.Wait()
		assert.Equal(t, 3, d.Stats().InFlight, "raised: idle workers start the waiting calls at once")

		require.NoError(t, d.SetTenantMaxInFlight("patch", 0))
		synctest.Wait()
		assert.Equal(t, 8, d.Stats().InFlight, "lifted: every worker")

		closeD(t, d)
		r.mu.Lock()
		defer r.mu.Unlock()
		assert.Equal(t, 8, r.peak["patch"])
	})
}

// TestSetTenantMaxInFlightUnnamed: a tenant Config.Tenants does not name
// keeps a cap set at run time while it is idle, for its next calls; a
// negative cap is refused, naming the argument.
func TestSetTenantMaxInFlightUnnamed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(100 * time.Millisecond)
		d := newD(t, r.exec, Config[string, int]{Workers: 8, Capacity: 1000})
		require.ErrorContains(t, d.SetTenantMaxInFlight("patch", -1), `SetTenantMaxInFlight("patch"): n -1 must not be negative`)
		require.NoError(t, d.SetTenantMaxInFlight("patch", 2))
		synctest.Wait()
		for i := range 20 {
			require.NoError(t, d.Post(fmt.Sprint("patch/", i), 0, SubmitOptions{Tenant: "patch"}))
		}
		synctest.Wait()
		assert.Equal(t, 2, d.Stats().InFlight)
		closeD(t, d)
		r.mu.Lock()
		defer r.mu.Unlock()
		assert.Equal(t, 2, r.peak["patch"])
	})
}

// TestCappedTenantBanksNoCredit: a tenant held at its in-flight cap, its
// calls passed over, does not bank the picks it was passed over for: when
// its cap is lifted it shares the workers with another tenant of the same
// weight from then on, rather than taking every worker until its pass
// catches up with the other's.
func TestCappedTenantBanksNoCredit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(10 * time.Millisecond)
		d := newD(t, r.exec, Config[string, int]{
			Workers:  4,
			Capacity: 10000,
			Tenants:  map[string]TenantConfig{"a": {MaxInFlight: 1}},
		})
		for i := range 2000 {
			require.NoError(t, d.Post(fmt.Sprint("a/", i), 0, SubmitOptions{Tenant: "a"}))
			require.NoError(t, d.Post(fmt.Sprint("b/", i), 0, SubmitOptions{Tenant: "b"}))
		}
		time.Sleep(time.Second) // b runs on three workers, a on one
		synctest.Wait()
		require.NoError(t, d.SetTenantMaxInFlight("a", 0))
		r.mu.Lock()
		from := len(r.order)
		r.mu.Unlock()
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		r.mu.Lock()
		n := map[string]int{}
		for _, k := range r.order[from:] {
			n[tenantOf(k)]++
		}
		r.mu.Unlock()
		assert.InDelta(t, n["a"], n["b"], float64(n["a"]+n["b"])/4, "starts after the cap was lifted: %v", n)
		assert.Positive(t, n["b"])
		closeD(t, d)
	})
}

// TestTenantsConfigTakenAtNew: New takes Config.Tenants as it is then: a
// tenant the caller adds to its map afterwards is not configured by it
// (it takes Config.DefaultTenant's settings), and the caller may go on
// using its map — for another dispatcher, say — while this one runs.
func TestTenantsConfigTakenAtNew(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(100 * time.Millisecond)
		tenants := map[string]TenantConfig{"a": {MaxInFlight: 1}}
		d := newD(t, r.exec, Config[string, int]{Workers: 4, Tenants: tenants})
		tenants["b"] = TenantConfig{MaxInFlight: 1}
		for i := range 4 {
			require.NoError(t, d.Post(fmt.Sprint("a/", i), 0, SubmitOptions{Tenant: "a"}))
			require.NoError(t, d.Post(fmt.Sprint("b/", i), 0, SubmitOptions{Tenant: "b"}))
		}
		synctest.Wait()
		s := d.Stats()
		assert.Equal(t, 1, s.Tenants["a"].InFlight, "a's cap, given to New")
		assert.Equal(t, 3, s.Tenants["b"].InFlight, "b is not capped: added after New")
		closeD(t, d)
		r.mu.Lock()
		defer r.mu.Unlock()
		assert.Equal(t, 3, r.peak["b"])
	})
}
