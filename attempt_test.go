package dispatch

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// Core bugs found while extending the fuzz model and the chaos soak with
// the tenant quotas (TenantConfig.MaxQueued). Each test fails until the
// core is fixed; none changes non-test code.

// TestAbandonedAttemptKeepsQuota: a call that a worker has taken leaves its
// tenant's queued count (begin), and a worker whose goroutine a completion
// hook ends (runtime.Goexit) while it tells earlier outcomes, before the
// call's own user code ran, sends the call back to the queue untouched
// (endAttempt's abandoned case, requeue). That return is not checked
// against the tenant's MaxQueued, as a retry's is (roomForRetry): if a
// submission of the tenant took the room the call left while the hook ran,
// the tenant ends with more calls queued than its MaxQueued.
//
// Found by reading, for the soak's new invariant (no tenant's Queued above
// its MaxQueued in any snapshot), which a hook's Goexit on a worker can
// break in TestChaosSoak.
func TestAbandonedAttemptKeepsQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		inHook, leaveHook := make(chan struct{}), make(chan struct{})
		var once atomic.Bool
		d := newD(t, func(ctx context.Context, k string, _ int) error {
			if k == "first" {
				return g.wait(ctx)
			}
			return nil
		}, Config[string, int]{
			Workers: 1,
			// Two tokens, then none for an hour of virtual time: the worker
			// that replaces the exited one cannot take a call while the
			// test looks.
			RateLimit: rate.NewLimiter(rate.Every(time.Hour), 2),
			Tenants:   map[string]TenantConfig{"q": {MaxQueued: 1}},
			OnDone: func(r Result[string, int]) {
				if r.Key == "first" && once.CompareAndSwap(false, true) {
					close(inHook)
					<-leaveHook
					runtime.Goexit()
				}
			},
		})
		first := submit(t, d, "first", 0, SubmitOptions{})
		synctest.Wait() // first is in flight
		q1 := submit(t, d, "q1", 1, SubmitOptions{Tenant: "q"})
		g.open()
		// The worker ended first and took q1 (q's queued count is 0), and
		// tells first's hook before q1's attempt begins.
		<-inHook
		q2, err := d.Submit(bg, "q2", 2, SubmitOptions{Tenant: "q"})
		require.NoError(t, err, "q has room: its only call is taken")
		close(leaveHook) // the hook exits the worker: q1 goes back, abandoned
		synctest.Wait()
		st := d.Stats().Tenants["q"]
		assert.LessOrEqual(t, st.Queued, 1, "tenant q over its MaxQueued after an abandoned attempt: %+v", st)
		waitAll(first, q1, q2) // the limiter's next tokens come within two virtual hours
		closeD(t, d)
	})
}

// TestSupersedeKeepsTenant: a submission of a newer generation ends the
// key's calls (Stale) before it makes its own. When the call it ends was
// the last of a tenant that Config.Tenants does not name, finish forgets
// the tenant (forgetIdle) — but the submission goes on with it, and its
// new call is counted in a tenant the dispatcher no longer knows (admit
// calls keep only when it shed a victim). The next submission of that
// tenant gets a fresh one: the tenant's MaxQueued is passed (two calls
// queued, quota one), and Stats.Tenants no longer counts the first call,
// nor the tenant's earlier submissions.
//
// Found by TestChaosSoak's quota invariant, with the DefaultTenant's quota
// on tenant "a".
func TestSupersedeKeepsTenant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, _, release := holdWorker(t, nopExec, Config[string, int]{DefaultTenant: TenantConfig{MaxQueued: 1}})
		submit(t, d, "k1", 1, SubmitOptions{Tenant: "a"})
		submit(t, d, "k1", 2, SubmitOptions{Tenant: "a", Generation: 1}) // k1's call of generation 0 ends Stale
		tk, err := d.Submit(bg, "k2", 3, SubmitOptions{Tenant: "a"})
		st := d.Stats()
		assert.ErrorIs(t, err, ErrBackpressure, "tenant a has k1's call queued, and may queue one")
		queued := 0
		for _, ts := range st.Tenants {
			queued += ts.Queued
		}
		assert.Equal(t, st.Ready+st.Delayed+st.Successors, queued, "Stats.Tenants counts every queued call: %+v", st.Tenants)
		assert.Equal(t, uint64(2), st.Tenants["a"].Admitted, "tenant a's admissions: %+v", st.Tenants["a"])
		release()
		if tk != nil {
			<-tk.Done()
		}
		closeD(t, d)
	})
}
