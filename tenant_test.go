package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// TestTenantQuotaIsolates: a tenant's MaxQueued caps its queued calls
// (not its running one), refusing the rest with BoundQuota, so another
// tenant is still admitted while it floods; merges into its pending calls
// need no quota. Stats count both tenants apart.
func TestTenantQuotaIsolates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(time.Second)
		d := newD(t, r.exec, Config[string, int]{
			Workers:  1,
			Capacity: 100,
			Tenants:  map[string]TenantConfig{"patch": {MaxQueued: 10}},
		})
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
		assert.Equal(t, uint64(39), st.Backpressure[BoundQuota])
		// Merges into the tenant's pending calls need no quota.
		require.NoError(t, d.Post("patch/5", 1, SubmitOptions{Tenant: "patch"}))
		closeD(t, d)
	})
}

// TestTenantQuotaShedsOwnWorst: a submission over its tenant's quota
// evicts that tenant's own worst droppable queued call (BoundQuota), never
// another tenant's, even a worse one; a newcomer no better than the
// tenant's worst is refused.
func TestTenantQuotaShedsOwnWorst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(time.Second)
		d, _, release := holdWorker(t, r.exec, Config[string, int]{
			Tenants: map[string]TenantConfig{"patch": {MaxQueued: 2}},
		})
		low := submit(t, d, "patch/low", 0, SubmitOptions{Tenant: "patch", Priority: 0, Droppable: true})
		submit(t, d, "patch/mid", 0, SubmitOptions{Tenant: "patch", Priority: 1, Droppable: true})
		submit(t, d, "other/1", 0, SubmitOptions{Tenant: "other", Priority: -5, Droppable: true})
		// Over quota: the tenant's own worst droppable call goes, not the
		// other tenant's (worse) one.
		submit(t, d, "patch/high", 0, SubmitOptions{Tenant: "patch", Priority: 5})
		res, err := low.Wait(t.Context())
		assert.Equal(t, StateDropped, res.State)
		assert.ErrorIs(t, err, ErrDropped)
		assert.Contains(t, err.Error(), "quota")
		st := d.Stats()
		assert.Equal(t, uint64(1), st.Shed[BoundQuota])
		assert.Equal(t, uint64(1), st.Tenants["patch"].Dropped)
		// A newcomer no better than the tenant's worst is refused.
		_, err = d.Submit(t.Context(), "patch/late", 0, SubmitOptions{Tenant: "patch", Priority: 1})
		assert.ErrorIs(t, err, ErrBackpressure)
		release()
		closeD(t, d)
	})
}

// TestTenantInFlightCapUnderStorm: a tenant's MaxInFlight caps how many
// workers its storm may hold, so another tenant finds the rest free.
func TestTenantInFlightCapUnderStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(100 * time.Millisecond)
		d := newD(t, r.exec, Config[string, int]{
			Workers:  8,
			Capacity: 20000,
			Tenants:  map[string]TenantConfig{"patch": {MaxInFlight: 3}},
		})
		for i := range 500 {
			require.NoError(t, d.Post(fmt.Sprint("patch/", i), 0, SubmitOptions{Tenant: "patch"}))
		}
		synctest.Wait()
		assert.Equal(t, 3, d.Stats().InFlight, "the storm holds 3 of 8 workers")
		var tks []*Ticket[string, int]
		for i := range 20 {
			tks = append(tks, submit(t, d, fmt.Sprint("bind/", i), 0, SubmitOptions{Tenant: "bind"}))
		}
		waitAll(tks...)
		closeD(t, d)
		r.mu.Lock()
		defer r.mu.Unlock()
		assert.Equal(t, 3, r.peak["patch"])
		assert.Equal(t, 5, r.peak["bind"], "binds use the five workers the storm may not take")
	})
}

// TestTenantWeightedShare: tenants with backlogs at one priority share the
// workers in proportion to their weights (within 10%).
func TestTenantWeightedShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(10 * time.Millisecond)
		weights := map[string]int{"a": 1, "b": 3, "c": 4}
		cfg := Config[string, int]{
			Workers:  2,
			Capacity: 10000,
			Tenants:  map[string]TenantConfig{},
		}
		for name, w := range weights {
			cfg.Tenants[name] = TenantConfig{Weight: w}
		}
		d := newD(t, r.exec, cfg)
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
		closeD(t, d)
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
				d := newD(t, r.exec, Config[string, int]{
					Workers:  2,
					Capacity: 100000,
					Aging:    aging,
				})
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
				_, err := submit(t, d, "low/0", 0, SubmitOptions{Tenant: "low"}).Wait(t.Context())
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
				closeD(t, d)
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
		d := newD(t, r.exec, Config[string, int]{
			Workers:  5,
			Capacity: 20000,
			Tenants:  map[string]TenantConfig{"patch": {MaxInFlight: 4}},
		})
		for i := range 10000 {
			require.NoError(t, d.Post(fmt.Sprint("patch/", i), 0, SubmitOptions{Tenant: "patch", Droppable: true}))
		}
		time.Sleep(time.Second + service/2)
		t0 := time.Now()
		var tks []*Ticket[string, int]
		for i := range 100 {
			tks = append(tks, submit(t, d, fmt.Sprint("bind/", i), 0, SubmitOptions{Tenant: "bind", Priority: 100}))
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
		closeD(t, d)
	})
}

// TestAdoptionQuota: a submission that coalesces into another tenant's
// pending call and takes it over — by outranking it, or by replacing it
// (ReplacePending) — moves the call into its own tenant, which must have
// room under its MaxQueued, as for a new call: the tenant's worst
// droppable queued call is evicted if the moved call would run before it,
// else the submission is refused and the pending call left as it was. It
// used to be admitted past the quota (tenant b capped at 1 ended with 2
// queued).
func TestAdoptionQuota(t *testing.T) {
	replace := func(pending, incoming int) (int, error) {
		if incoming < 0 {
			return -incoming, ReplacePending
		}
		return pending + incoming, nil
	}
	for _, tc := range []struct {
		name     string
		o        SubmitOptions // the adopting submission, of tenant b, for key "a/1"
		call     int
		victimOK bool // b's queued call is droppable and worse
		want     error
	}{
		{"outranks: evicts b's worst", SubmitOptions{Tenant: "b", Priority: 5}, 1, true, nil},
		{"outranks: refused without a victim", SubmitOptions{Tenant: "b", Priority: 5}, 1, false, ErrBackpressure},
		{"replaces: evicts b's worst", SubmitOptions{Tenant: "b", Priority: 0}, -7, true, nil},
		{"replaces: refused without a victim", SubmitOptions{Tenant: "b", Priority: 0}, -7, false, ErrBackpressure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var ran sync.Map
				d, _, release := holdWorker(t, func(_ context.Context, k string, v int) error {
					ran.Store(k, v)
					return nil
				}, Config[string, int]{Merge: replace, Tenants: map[string]TenantConfig{"b": {MaxQueued: 1}}})
				queued := submit(t, d, "b/1", 10, SubmitOptions{Tenant: "b", Priority: -1, Droppable: tc.victimOK})
				pending := submit(t, d, "a/1", 1, SubmitOptions{Tenant: "a", Priority: 0})
				tk, err := d.Submit(t.Context(), "a/1", tc.call, tc.o)
				st := d.Stats()
				assert.LessOrEqual(t, st.Tenants["b"].Queued, 1, "tenant b is over its MaxQueued")
				if tc.want != nil {
					assert.ErrorIs(t, err, tc.want)
					assert.Nil(t, tk)
					assert.Equal(t, 1, st.Tenants["a"].Queued, "the pending call stays in its tenant")
					release()
					assert.Equal(t, StateSucceeded, outcomeWait(t, pending).State)
					v, _ := ran.Load("a/1")
					assert.Equal(t, 1, v, "the pending call ran as it was")
					assert.Equal(t, StateSucceeded, outcomeWait(t, queued).State)
				} else {
					require.NoError(t, err)
					r, done := queued.Result()
					assert.True(t, done && r.State == StateDropped, "b's worst call made room: %v", r.State)
					assert.Equal(t, 1, st.Tenants["b"].Queued)
					assert.Zero(t, st.Tenants["a"].Queued)
					release()
					assert.Equal(t, StateSucceeded, outcomeWait(t, tk).State)
				}
				closeD(t, d)
			})
		})
	}
}

// outcomeWait waits for tk's outcome and returns it.
func outcomeWait[K comparable, T any](t *testing.T, tk *Ticket[K, T]) Result[K, T] {
	t.Helper()
	r, err := tk.Wait(t.Context())
	_ = err // the Result carries the error too
	return r
}

// TestRefusedAdoptionRestoresIdempotencyKey: a replacement (ReplacePending)
// that brings an idempotency key to a pending call that had none, and is
// then refused by its tenant's MaxQueued, leaves the pending call with no
// key, as it was: a later submission with another key coalesces into it,
// and the execution carries that one.
func TestRefusedAdoptionRestoresIdempotencyKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		replace := func(pending, incoming int) (int, error) {
			if incoming < 0 {
				return -incoming, ReplacePending
			}
			return pending + incoming, nil
		}
		var keys sync.Map
		d, _, release := holdWorker(t, func(ctx context.Context, k string, v int) error {
			keys.Store(k, IdempotencyKey(ctx))
			return nil
		}, Config[string, int]{Merge: replace, Tenants: map[string]TenantConfig{"b": {MaxQueued: 1}}})
		queued := submit(t, d, "b/1", 10, SubmitOptions{Tenant: "b", Priority: -1})
		pending := submit(t, d, "a/1", 1, SubmitOptions{Tenant: "a"})
		_, err := d.Submit(t.Context(), "a/1", -7, SubmitOptions{Tenant: "b", IdempotencyKey: "x"})
		require.ErrorIs(t, err, ErrBackpressure, "tenant b has no room for the replaced call")
		later := submit(t, d, "a/1", 2, SubmitOptions{Tenant: "a", IdempotencyKey: "y"})
		release()
		for _, tk := range []*Ticket[string, int]{queued, pending, later} {
			assert.Equal(t, StateSucceeded, outcomeWait(t, tk).State)
		}
		k, _ := keys.Load("a/1")
		assert.Equal(t, "y", k, "the execution's idempotency key")
		closeD(t, d)
	})
}

// TestCallLessTenantsForgotten: Stats.Tenants "holds the configured
// tenants, and others while they have calls", and tenants Config.Tenants
// does not name are "forgotten again when they have no call left … so
// memory stays bounded whatever names callers make up" — also when an
// admitted submission makes no call of its tenant: skipped (Config.Moot,
// Merge's SkipIncoming) or coalesced into another tenant's call, whether
// by Post's fast path or by Submit.
func TestCallLessTenantsForgotten(t *testing.T) {
	const names = 1000
	for _, tc := range []struct {
		name string
		cfg  Config[string, int]
	}{
		{"moot", Config[string, int]{Moot: func(k string, _ int) bool { return k != holdKey }}},
		{"skip incoming", Config[string, int]{Merge: func(int, int) (int, error) { return 0, SkipIncoming }}},
		{"coalesced", Config[string, int]{Tenants: map[string]TenantConfig{"kept": {}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d, _, release := holdWorker(t, nopExec, tc.cfg)
				if tc.cfg.Moot == nil { // a pending call, more urgent, of the tenant of no name
					require.NoError(t, d.Post("k", 1, SubmitOptions{Priority: 5}))
				}
				tks := []*Ticket[string, int]{}
				for i := range names {
					o := SubmitOptions{Tenant: fmt.Sprint("t", i)}
					if i%2 == 0 {
						require.NoError(t, d.Post("k", 1, o))
					} else {
						tks = append(tks, submit(t, d, "k", 1, o))
					}
				}
				want := []string{""}
				if tc.cfg.Tenants != nil {
					want = append(want, "kept")
				}
				assert.ElementsMatch(t, want, keysOf(d.Stats().Tenants), "tenants without a call, while the call waits")
				release()
				waitAll(tks...)
				assert.ElementsMatch(t, want, keysOf(d.Stats().Tenants), "tenants without a call, after it ran")
				closeD(t, d)
			})
		})
	}
}

func keysOf[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// TestStridePassWraps (internal): TenantConfig.Weight shares workers "by
// stride scheduling: each pick advances a tenant's pass by 2³²/Weight (at
// least 1), lowest first". A weight-1 tenant's pass wraps around 2⁶⁴ after
// 2³² picks (five days at 10 000 a second); tenants of equal weight still
// take turns across the wrap. The passes start where a long-running
// dispatcher's are.
func TestStridePassWraps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var ran []byte
		exec := func(_ context.Context, k string, _ int) error {
			mu.Lock()
			defer mu.Unlock()
			ran = append(ran, k[0])
			return nil
		}
		d, _, release := holdWorker(t, exec, Config[string, int]{
			Tenants: map[string]TenantConfig{"A": {Weight: 1}, "B": {Weight: 1}},
		})
		const uptime = ^uint64(0) - 3<<32 // three picks each before the wrap
		d.mu.Lock()
		d.q.vpass = uptime
		d.tenants.get("A").pass = uptime
		d.tenants.get("B").pass = uptime
		d.mu.Unlock()
		for i := range 8 {
			require.NoError(t, d.Post(fmt.Sprint("A", i), 0, SubmitOptions{Tenant: "A"}))
			require.NoError(t, d.Post(fmt.Sprint("B", i), 0, SubmitOptions{Tenant: "B"}))
		}
		release()
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, "ABABABABABABABAB", string(ran), "equal weights at one level take turns")
		closeD(t, d)
	})
}

// TestRetryTakesSuccessorsPlace: a call that fails while its tenant is at
// its MaxQueued, with a successor waiting behind it, still retries if the
// successor merges into the retry and the retry waits in its place: the
// successor is of the same tenant, or of another that takes the merged
// call over (it is the more urgent), so no tenant queues more than before.
// If the merge refuses the successor, or leaves the retry in its tenant
// beside another tenant's successor, the retry fails (RetryError reason
// "quota") as it was, and the successor runs alone.
func TestRetryTakesSuccessorsPlace(t *testing.T) {
	for _, tc := range []struct {
		name   string
		refuse bool
		succ   SubmitOptions
		retry  bool
	}{
		{"same tenant", false, SubmitOptions{Tenant: "t"}, true},
		{"same tenant, merge refused", true, SubmitOptions{Tenant: "t"}, false},
		{"other tenant takes it over", false, SubmitOptions{Tenant: "o", Priority: 1}, true},
		{"other tenant, not more urgent", false, SubmitOptions{Tenant: "o"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := newGate()
				var execs sync.Map
				var n atomic.Int32
				cfg := Config[string, int]{
					Workers:  1,
					Retry:    noJitter(3),
					Classify: func(error) Class { return ClassRetry },
					Tenants:  map[string]TenantConfig{"t": {MaxQueued: 1}, "o": {MaxQueued: 1}},
				}
				if tc.refuse {
					cfg.Merge = func(int, int) (int, error) { return 0, errors.New("apart") }
				}
				d := newD(t, func(ctx context.Context, key string, v int) error {
					if key != "k" {
						return nil
					}
					execs.Store(n.Add(1), v)
					if n.Load() == 1 {
						_ = g.wait(ctx)
						return errors.New("transient")
					}
					return nil
				}, cfg)
				first := submit(t, d, "k", 1, SubmitOptions{Tenant: "t"})
				synctest.Wait()
				var other *Ticket[string, int]
				if tc.succ.Tenant != "t" { // t at its quota, the successor apart
					other = submit(t, d, "x", 0, SubmitOptions{Tenant: "t", Priority: -9})
				}
				second := submit(t, d, "k", 2, tc.succ)
				g.open()
				synctest.Wait()
				st := d.Stats()
				assert.LessOrEqual(t, st.Tenants["t"].Queued, 1)
				assert.LessOrEqual(t, st.Tenants["o"].Queued, 1)
				r1, err1 := first.Wait(t.Context())
				r2, _ := second.Wait(t.Context())
				assert.Equal(t, StateSucceeded, r2.State)
				assert.Equal(t, int32(2), n.Load(), "the retry ran the successor's call, or the successor ran alone")
				v, _ := execs.Load(int32(2))
				assert.Equal(t, 2, v)
				if tc.retry {
					assert.Equal(t, StateSucceeded, r1.State, "%v", err1)
				} else {
					assert.Equal(t, StateFailed, r1.State)
					var re *RetryError
					require.ErrorAs(t, err1, &re)
					assert.Equal(t, "quota", re.Reason)
					assert.Equal(t, 1, r1.Call, "the failed retry's call is its own")
				}
				if other != nil {
					assert.Equal(t, StateSucceeded, outcomeWait(t, other).State)
				}
				st = closeD(t, d)
				for _, ten := range []string{"t", "o"} {
					assert.Zero(t, st.Tenants[ten].Queued)
					assert.Zero(t, st.Tenants[ten].InFlight)
				}
			})
		})
	}
}

// TestUnfinishableCostsNoShare: a call the deadline check ends unstarted
// takes no worker, so it costs its tenant none of its share
// (TenantConfig.Weight): two tenants of equal weight take turns, though
// one of them has a call refused before each of its own. Each refusal
// used to advance the tenant's pass as an execution does, and that tenant
// got one worker in three.
func TestUnfinishableCostsNoShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var order []string
		slow := func(k string) bool { return strings.Contains(k, "slow") }
		d := newD(t, func(ctx context.Context, k string, _ int) error {
			mu.Lock()
			order = append(order, k)
			mu.Unlock()
			if slow(k) {
				time.Sleep(2 * time.Second)
			} else {
				time.Sleep(10 * time.Millisecond)
			}
			return nil
		}, Config[string, int]{Workers: 1, Label: func(k string, _ int) string {
			if slow(k) {
				return "slow"
			}
			return "fast"
		}})
		var tks []*Ticket[string, int]
		for i := range 20 { // the start check learns: a slow call takes 2s
			tks = append(tks, submit(t, d, fmt.Sprint("warm/slow", i), 0, SubmitOptions{}))
		}
		waitAll(tks...)
		hold := submit(t, d, "hold", 0, SubmitOptions{})
		synctest.Wait()
		mu.Lock()
		order = nil
		mu.Unlock()
		tks = tks[:0]
		for i := range 10 {
			// Unfinishable: 1.5s left, for a call that takes 2s.
			tks = append(tks, submit(t, d, fmt.Sprint("a/slow", i), 0, SubmitOptions{Tenant: "a", Timeout: 1500 * time.Millisecond}))
			tks = append(tks, submit(t, d, fmt.Sprint("a/", i), 0, SubmitOptions{Tenant: "a"}))
			tks = append(tks, submit(t, d, fmt.Sprint("b/", i), 0, SubmitOptions{Tenant: "b"}))
		}
		waitAll(append(tks, hold)...)
		assert.Equal(t, uint64(10), d.Stats().Unfinishable)
		mu.Lock()
		ran := slices.Clone(order)
		mu.Unlock()
		require.Len(t, ran, 20)
		for n := 2; n <= len(ran); n += 2 {
			a := 0
			for _, k := range ran[:n] {
				if tenantOf(k) == "a" {
					a++
				}
			}
			assert.Equal(t, n/2, a, "tenant a's executions among the first %d: %v", n, ran)
		}
		closeD(t, d)
	})
}

// TestQuotaVictimBehindRunningCall: a droppable call that waits behind its
// key's running call is one of its tenant's queued calls, and the worst
// of them is evicted under TenantConfig.MaxQueued for a newcomer that
// would run before it, as any other. It used to be passed over, and the
// newcomer refused. Evicting it frees no key, so at Capacity the
// newcomer still needs a call that does, or is refused with nothing shed.
func TestQuotaVictimBehindRunningCall(t *testing.T) {
	for _, full := range []bool{false, true} {
		t.Run(fmt.Sprint("atCapacity=", full), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := newGate()
				cfg := Config[string, int]{Workers: 2, Tenants: map[string]TenantConfig{"p": {MaxQueued: 1}}}
				if full {
					cfg.Capacity = 1
				}
				d := newD(t, func(ctx context.Context, k string, _ int) error {
					if k == "p/hot" {
						return g.wait(ctx)
					}
					return nil
				}, cfg)
				run := submit(t, d, "p/hot", 0, SubmitOptions{Tenant: "p", Droppable: true})
				synctest.Wait()
				behind := submit(t, d, "p/hot", 1, SubmitOptions{Tenant: "p", Droppable: true, Priority: -5})
				urgent, err := d.Submit(t.Context(), "p/urgent", 0, SubmitOptions{Tenant: "p", Priority: 5})
				r, done := behind.Result()
				if full {
					var be *BackpressureError
					require.ErrorAs(t, err, &be)
					assert.Equal(t, BoundCapacity, be.Bound)
					assert.False(t, done, "shed for a refused newcomer: %v", r.State)
				} else {
					require.NoError(t, err)
					require.True(t, done)
					assert.Equal(t, StateDropped, r.State)
					assert.ErrorContains(t, r.Err, "quota")
					assert.LessOrEqual(t, d.Stats().Tenants["p"].Queued, 1, "urgent, queued or started")
				}
				g.open()
				waitAll(run, behind)
				if urgent != nil {
					waitAll(urgent)
					assert.Equal(t, StateSucceeded, outcome(t, urgent).State)
				}
				st := closeD(t, d)
				assert.Zero(t, st.Tenants["p"].Queued)
				if !full {
					assert.Equal(t, uint64(1), st.Tenants["p"].Dropped)
				}
			})
		})
	}
}

// TestQuotaVictimBehindAdopted: a droppable call behind its key's running
// call that another tenant's submission takes over (by outranking it)
// counts under that tenant's MaxQueued, and is that tenant's to evict.
func TestQuotaVictimBehindAdopted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		d := newD(t, func(ctx context.Context, k string, _ int) error {
			if k == "hot" {
				return g.wait(ctx)
			}
			return nil
		}, Config[string, int]{Workers: 2, Tenants: map[string]TenantConfig{"q": {MaxQueued: 1}}})
		run := submit(t, d, "hot", 0, SubmitOptions{Tenant: "p", Droppable: true})
		synctest.Wait()
		behind := submit(t, d, "hot", 1, SubmitOptions{Tenant: "p", Droppable: true, Priority: -5})
		adopter := submit(t, d, "hot", 2, SubmitOptions{Tenant: "q", Droppable: true, Priority: -3})
		st := d.Stats()
		assert.Equal(t, 1, st.Tenants["q"].Queued, "q took the call over")
		assert.Zero(t, st.Tenants["p"].Queued)
		urgent, err := d.Submit(t.Context(), "q/urgent", 0, SubmitOptions{Tenant: "q", Priority: 5})
		require.NoError(t, err)
		for _, tk := range []*Ticket[string, int]{behind, adopter} {
			r, done := tk.Result()
			require.True(t, done)
			assert.Equal(t, StateDropped, r.State)
		}
		g.open()
		waitAll(run, urgent)
		assert.Equal(t, StateSucceeded, outcome(t, urgent).State)
		st = closeD(t, d)
		assert.Zero(t, st.Tenants["q"].Queued)
		assert.Equal(t, uint64(1), st.Tenants["q"].Dropped)
	})
}

// TestSupersedeFreesWaitingRetrysPlace: a newer generation ends its key's
// calls, so it frees the places under TenantConfig.MaxQueued of those that
// wait — the pending one, and a retry waiting as the key's running call
// behind which a successor the merge refused waits (another idempotency
// key) — and needs no other room. It used to count only the pending one,
// and was refused with BoundQuota; nor may the retry it ends be taken for
// a victim to shed as well.
func TestSupersedeFreesWaitingRetrysPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		var first atomic.Bool
		first.Store(true)
		d := newD(t, func(ctx context.Context, k string, _ int) error {
			if first.CompareAndSwap(true, false) {
				_ = g.wait(ctx)
				return errors.New("transient")
			}
			return nil
		}, Config[string, int]{
			Workers: 1, Retry: noJitter(3), Classify: func(error) Class { return ClassRetry },
			Tenants: map[string]TenantConfig{"t": {MaxQueued: 1}},
		})
		retry := submit(t, d, "k", 1, SubmitOptions{Tenant: "t", Droppable: true, Priority: -5, Generation: 1, IdempotencyKey: "y"})
		synctest.Wait()
		succ := submit(t, d, "k", 2, SubmitOptions{Tenant: "o", Generation: 1, IdempotencyKey: "x"})
		g.open()
		synctest.Wait()
		st := d.Stats()
		require.Equal(t, 1, st.Delayed, "the retry waits out its backoff")
		require.Equal(t, 1, st.Successors, "its successor waits behind it")
		require.Equal(t, 1, st.Tenants["t"].Queued, "t is at its quota")
		newer, err := d.Submit(t.Context(), "k", 3, SubmitOptions{Tenant: "t", Priority: 5, Generation: 2})
		require.NoError(t, err)
		waitAll(retry, succ, newer)
		assert.Equal(t, StateStale, outcome(t, retry).State)
		assert.Equal(t, StateStale, outcome(t, succ).State)
		assert.Equal(t, StateSucceeded, outcome(t, newer).State)
		st = closeD(t, d)
		assert.Zero(t, st.Tenants["t"].Queued)
		assert.Zero(t, st.Shed[BoundQuota])
	})
}

// TestRetryMergeExitAtQuota: a call fails while its tenant is at
// TenantConfig.MaxQueued, so its retry has room only in the place of its
// successor, which must merge into it; the merge function ends the
// goroutine instead (runtime.Goexit), which refuses the successor. The
// retry then gives up (RetryError reason quota), as for a merge that
// refuses: the tenant never queues one over its quota, and Stats counts
// no retry. It used to wait beside the successor until it ran.
func TestRetryMergeExitAtQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		f := newFailFirst(g, errors.New("transient"))
		obs := newCountingObserver()
		d := newD(t, f.exec, Config[string, int]{
			Workers:  1,
			Retry:    noJitter(3),
			Classify: func(error) Class { return ClassRetry },
			Tenants:  map[string]TenantConfig{"t": {MaxQueued: 1}},
			Merge:    func(int, int) (int, error) { goexit(); return 0, nil },
			Observer: obs,
		})
		first := submit(t, d, "k", 1, SubmitOptions{Tenant: "t"})
		synctest.Wait()
		second := submit(t, d, "k", 2, SubmitOptions{Tenant: "t"})
		g.open()
		synctest.Wait() // the attempt ended: a retry would wait out its backoff
		assert.LessOrEqual(t, d.Stats().Tenants["t"].Queued, 1, "the tenant queues beyond its MaxQueued")
		r1 := outcomeWait(t, first)
		assert.Equal(t, StateFailed, r1.State)
		var re *RetryError
		require.ErrorAs(t, r1.Err, &re)
		assert.Equal(t, "quota", re.Reason)
		assert.Equal(t, 1, r1.Call)
		assert.Equal(t, StateSucceeded, outcomeWait(t, second).State)
		assert.Equal(t, int32(2), f.n.Load(), "the call failed once, its successor ran alone")
		st := closeD(t, d)
		assert.Zero(t, st.Retries)
		obs.mu.Lock()
		defer obs.mu.Unlock()
		assert.Zero(t, obs.counts["retry"])
	})
}

// TestRetryMergeExitCountsRetry: a retry whose merge with its successor
// ends the goroutine (runtime.Goexit) waits in the queue, the successor
// behind it, as if the merge had refused: it is a retry, which Stats and
// the Observer count (Stats.Retries, OnRetry) as for any other.
func TestRetryMergeExitCountsRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		var mu sync.Mutex
		var ran []int
		obs := newCountingObserver()
		d := newD(t, func(ctx context.Context, key string, v int) error {
			mu.Lock()
			ran = append(ran, v)
			first := len(ran) == 1
			mu.Unlock()
			if first {
				_ = g.wait(ctx)
				return errors.New("transient")
			}
			return nil
		}, Config[string, int]{
			Workers:  1,
			Retry:    noJitter(3),
			Classify: func(error) Class { return ClassRetry },
			Merge:    func(int, int) (int, error) { goexit(); return 0, nil },
			Observer: obs,
		})
		first := submit(t, d, "k", 1, SubmitOptions{})
		synctest.Wait()
		second := submit(t, d, "k", 2, SubmitOptions{})
		g.open()
		r1 := outcomeWait(t, first)
		assert.Equal(t, StateSucceeded, r1.State)
		assert.Equal(t, 2, r1.Attempts)
		assert.Equal(t, StateSucceeded, outcomeWait(t, second).State)
		mu.Lock()
		assert.Equal(t, []int{1, 1, 2}, ran, "the retry, then its successor")
		mu.Unlock()
		st := closeD(t, d)
		assert.Equal(t, uint64(1), st.Retries)
		obs.mu.Lock()
		defer obs.mu.Unlock()
		assert.Equal(t, 1, obs.counts["retry"])
	})
}
