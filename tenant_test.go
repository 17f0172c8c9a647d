package dispatch

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is an exec that sleeps a fixed service time and records, per
// tenant (the key's prefix before '/'), when each call started and how many
// ran at once.
type recorder struct {
	mu      sync.Mutex
	service time.Duration
	starts  map[string]time.Time
	order   []string
	now     map[string]int
	peak    map[string]int
	release chan struct{} // if set, exec waits for it first
}

func newRecorder(service time.Duration) *recorder {
	return &recorder{service: service, starts: map[string]time.Time{}, now: map[string]int{}, peak: map[string]int{}}
}

func tenantOf(key string) string {
	for i := range len(key) {
		if key[i] == '/' {
			return key[:i]
		}
	}
	return key
}

func (r *recorder) exec(ctx context.Context, key string, _ int) error {
	if r.release != nil {
		<-r.release
	}
	ten := tenantOf(key)
	r.mu.Lock()
	r.starts[key] = time.Now()
	r.order = append(r.order, key)
	r.now[ten]++
	r.peak[ten] = max(r.peak[ten], r.now[ten])
	r.mu.Unlock()
	time.Sleep(r.service)
	r.mu.Lock()
	r.now[ten]--
	r.mu.Unlock()
	return nil
}

func (r *recorder) startOf(key string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts[key]
}

func TestTenantQuotaIsolates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(time.Second)
		d, err := New(r.exec, Config[string, int]{Workers: 1, Capacity: 100, Tenants: map[string]TenantConfig{"patch": TenantConfig{MaxQueued: 10}}})
		require.NoError(t, err)
		require.NoError(t, d.Post("patch/first", 0, SubmitOptions{Tenant: "patch"}))
		synctest.Wait() // it runs, and no longer counts as queued
		refused := 0
		for i := range 49 {
			err := d.Post(fmt.Sprint("patch/", i), 0, SubmitOptions{Tenant: "patch"})
			if err != nil {
				var be *BackpressureError
				require.ErrorAs(t, err, &be)
				assert.Equal(t, BoundQuota, be.Bound)
				refused++
			}
		}
		assert.Equal(t, 39, refused, "ten queued, the rest refused")
		// Another tenant is admitted although "patch" keeps flooding.
		for i := range 20 {
			require.NoError(t, d.Post(fmt.Sprint("bind/", i), 0, SubmitOptions{Tenant: "bind"}))
		}
		st := d.Stats()
		assert.Equal(t, 10, st.Tenants["patch"].Queued)
		assert.Equal(t, 1, st.Tenants["patch"].InFlight)
		assert.Equal(t, uint64(39), st.Tenants["patch"].Rejected)
		assert.Equal(t, uint64(11), st.Tenants["patch"].Admitted)
		assert.Equal(t, 20, st.Tenants["bind"].Queued)
		assert.Equal(t, uint64(39), st.Backpressure["quota"])
		// Merges into the tenant's pending calls need no quota.
		require.NoError(t, d.Post("patch/5", 1, SubmitOptions{Tenant: "patch"}))
		require.NoError(t, d.Close(t.Context()))
		checkConservation(t, d)
	})
}

func TestTenantQuotaShedsOwnWorst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(time.Second)
		r.release = make(chan struct{})
		d, err := New(r.exec, Config[string, int]{Workers: 1, Tenants: map[string]TenantConfig{"patch": TenantConfig{MaxQueued: 2}}})
		require.NoError(t, err)
		other, err := d.Submit(t.Context(), "other/0", 0, SubmitOptions{Tenant: "other", Droppable: true})
		require.NoError(t, err)
		synctest.Wait() // "other/0" holds the worker
		low, err := d.Submit(t.Context(), "patch/low", 0, SubmitOptions{Tenant: "patch", Priority: 0, Droppable: true})
		require.NoError(t, err)
		_, err = d.Submit(t.Context(), "patch/mid", 0, SubmitOptions{Tenant: "patch", Priority: 1, Droppable: true})
		require.NoError(t, err)
		_, err = d.Submit(t.Context(), "other/1", 0, SubmitOptions{Tenant: "other", Priority: -5, Droppable: true})
		require.NoError(t, err)
		// Over quota: the tenant's own worst droppable call goes, not the
		// other tenant's (worse) one.
		_, err = d.Submit(t.Context(), "patch/high", 0, SubmitOptions{Tenant: "patch", Priority: 5})
		require.NoError(t, err)
		res, err := low.Wait(t.Context())
		assert.Equal(t, Dropped, res.State)
		assert.ErrorIs(t, err, ErrDropped)
		assert.Contains(t, err.Error(), "quota")
		st := d.Stats()
		assert.Equal(t, uint64(1), st.Shed["quota"])
		assert.Equal(t, uint64(1), st.Tenants["patch"].Dropped)
		// A newcomer no better than the tenant's worst is refused.
		_, err = d.Submit(t.Context(), "patch/late", 0, SubmitOptions{Tenant: "patch", Priority: 1})
		assert.ErrorIs(t, err, ErrBackpressure)
		close(r.release)
		_, err = other.Wait(t.Context())
		require.NoError(t, err)
		require.NoError(t, d.Close(t.Context()))
		checkConservation(t, d)
	})
}

func TestTenantInFlightCapUnderStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(100 * time.Millisecond)
		d, err := New(r.exec, Config[string, int]{Workers: 8, Capacity: 20000, Tenants: map[string]TenantConfig{"patch": TenantConfig{MaxInFlight: 3}}})
		require.NoError(t, err)
		for i := range 500 {
			require.NoError(t, d.Post(fmt.Sprint("patch/", i), 0, SubmitOptions{Tenant: "patch"}))
		}
		synctest.Wait()
		assert.Equal(t, 3, d.Stats().InFlight, "the storm holds 3 of 8 workers")
		var tks []*Ticket[string, int]
		for i := range 20 {
			tk, err := d.Submit(t.Context(), fmt.Sprint("bind/", i), 0, SubmitOptions{Tenant: "bind"})
			require.NoError(t, err)
			tks = append(tks, tk)
		}
		waitAll(tks...)
		require.NoError(t, d.Close(t.Context()))
		r.mu.Lock()
		defer r.mu.Unlock()
		assert.Equal(t, 3, r.peak["patch"])
		assert.Equal(t, 5, r.peak["bind"], "binds use the five workers the storm may not take")
		checkConservation(t, d)
	})
}

func TestTenantWeightedShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(10 * time.Millisecond)
		weights := map[string]int{"a": 1, "b": 3, "c": 4}
		cfg := Config[string, int]{Workers: 2, Capacity: 10000, Tenants: map[string]TenantConfig{}}
		for name, w := range weights {
			cfg.Tenants[name] = TenantConfig{Weight: w}
		}
		d, err := New(r.exec, cfg)
		require.NoError(t, err)
		// Equal priority, all queued at one instant: weights decide.
		for i := range 1000 {
			for name := range weights {
				require.NoError(t, d.Post(fmt.Sprint(name, "/", i), 0, SubmitOptions{Tenant: name}))
			}
		}
		time.Sleep(8 * time.Second) // 1600 of the 3000 calls run; every tenant stays backlogged
		r.mu.Lock()
		counts := map[string]int{}
		for _, k := range r.order {
			counts[tenantOf(k)]++
		}
		total := len(r.order)
		r.mu.Unlock()
		require.Greater(t, total, 1000)
		for name, w := range weights {
			want := float64(total) * float64(w) / 8
			got := float64(counts[name])
			assert.InDelta(t, want, got, want*0.10, "tenant %s (weight %d): %v of %d executions", name, w, got, total)
		}
		require.NoError(t, d.Close(context.Background()))
	})
}

// TestStarvationBound: two workers kept busy by a continuous stream of
// priority-Δp work from one tenant (arriving as fast as it is served, so the
// backlog stays small); a priority-0 call from another tenant starts within
// (Δp+1)×Aging plus one service time, while the stream goes on.
func TestStarvationBound(t *testing.T) {
	const (
		aging   = time.Second
		service = 100 * time.Millisecond
	)
	for _, dp := range []int{1, 3, 6} {
		t.Run(fmt.Sprint("dp=", dp), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRecorder(service)
				d, err := New(r.exec, Config[string, int]{Workers: 2, Aging: aging, StrictPriority: aging == 0, Capacity: 100000})
				require.NoError(t, err)
				ctx, stop := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				// A backlog of 4 calls, then 2 more per service time: the
				// service rate of 2 workers, for longer than the bound.
				for i := range 4 {
					require.NoError(t, d.Post(fmt.Sprint("high/init", i), 0, SubmitOptions{Tenant: "high", Priority: dp}))
				}
				wg.Go(func() {
					time.Sleep(service / 2) // off the service beat
					for i := 0; ctx.Err() == nil; i++ {
						_ = d.Post(fmt.Sprint("high/", i, "a"), 0, SubmitOptions{Tenant: "high", Priority: dp})
						_ = d.Post(fmt.Sprint("high/", i, "b"), 0, SubmitOptions{Tenant: "high", Priority: dp})
						time.Sleep(service)
					}
				})
				time.Sleep(2 * time.Second) // a backlog builds
				at := time.Now()
				low, err := d.Submit(t.Context(), "low/0", 0, SubmitOptions{Tenant: "low"})
				require.NoError(t, err)
				_, err = low.Wait(t.Context())
				require.NoError(t, err)
				stop()
				wg.Wait()
				lowStart := r.startOf("low/0")
				wait := lowStart.Sub(at)
				bound := time.Duration(dp+1)*aging + service
				assert.LessOrEqual(t, wait, bound)
				assert.GreaterOrEqual(t, wait, time.Duration(dp)*aging-service, "aging, not idleness, let it run")
				r.mu.Lock()
				busy := 0
				for k, s := range r.starts {
					if tenantOf(k) == "high" && !s.Before(at) && s.Before(lowStart) {
						busy++
					}
				}
				r.mu.Unlock()
				assert.GreaterOrEqual(t, busy, int(2*wait/service)-2, "the stream kept both workers busy while low waited")
				require.NoError(t, d.Close(context.Background()))
			})
		})
	}
}

// TestStatusPatchStorm is kubernetes/kubernetes#135900 in miniature: 10,000
// low-priority status patches capped at 4 in flight, then 100 binds. No
// worker that frees up while a bind waits goes to a patch, so each bind
// starts within one service time of a worker freeing up.
func TestStatusPatchStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const service = 100 * time.Millisecond
		r := newRecorder(service)
		d, err := New(r.exec, Config[string, int]{Workers: 5, Capacity: 20000, Tenants: map[string]TenantConfig{"patch": TenantConfig{MaxInFlight: 4}}})
		require.NoError(t, err)
		for i := range 10000 {
			require.NoError(t, d.Post(fmt.Sprint("patch/", i), 0, SubmitOptions{Tenant: "patch", Droppable: true}))
		}
		time.Sleep(time.Second + service/2)
		t0 := time.Now()
		var tks []*Ticket[string, int]
		for i := range 100 {
			tk, err := d.Submit(t.Context(), fmt.Sprint("bind/", i), 0, SubmitOptions{Tenant: "bind", Priority: 100})
			require.NoError(t, err)
			tks = append(tks, tk)
		}
		waitAll(tks...)
		r.mu.Lock()
		var lastBind time.Time
		var binds []time.Time
		for i := range 100 {
			s := r.starts[fmt.Sprint("bind/", i)]
			binds = append(binds, s)
			if s.After(lastBind) {
				lastBind = s
			}
		}
		patchesDuring := 0
		for k, s := range r.starts {
			if tenantOf(k) == "patch" && !s.Before(t0) && s.Before(lastBind) {
				patchesDuring++
			}
		}
		r.mu.Unlock()
		assert.Equal(t, 0, patchesDuring, "a patch took a worker while binds waited")
		// 5 workers, 100 binds of one service time each: 20 rounds. The
		// first bind starts at once (the fifth worker is free), and no round
		// waits more than one service time for a worker.
		assert.Equal(t, t0, binds[0])
		assert.LessOrEqual(t, lastBind.Sub(t0), 20*service)
		require.NoError(t, d.Close(context.Background()))
	})
}
