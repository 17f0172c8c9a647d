package dispatch

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/coalescer/dispatch/internal/band"
	"github.com/coalescer/dispatch/internal/due"
)

// --- the ready order: band, then virtual time within the band ---

// refBand is band.Of computed with math/big: floor(prio / width) and the
// non-negative remainder.
func refBand(prio, width int64) (band, off *big.Int) {
	band, off = new(big.Int), new(big.Int)
	band.DivMod(big.NewInt(prio), big.NewInt(width), off) // Euclidean: off ≥ 0
	return band, off
}

// refCmp compares two calls' places in the ready order with math/big:
// the higher band first, then the lower virtual time enq − off×aging.
func refCmp(e1, p1, e2, p2, width, aging int64) int {
	b1, o1 := refBand(p1, width)
	b2, o2 := refBand(p2, width)
	if c := b2.Cmp(b1); c != 0 {
		return c
	}
	v1 := new(big.Int).Sub(big.NewInt(e1), new(big.Int).Mul(o1, big.NewInt(aging)))
	v2 := new(big.Int).Sub(big.NewInt(e2), new(big.Int).Mul(o2, big.NewInt(aging)))
	return v1.Cmp(v2)
}

// orderKeyOf is the order of a call of priority prio enqueued at enq, with
// bands of width levels and aging ns per level.
func orderKeyOf(enq, prio, width, aging int64) orderKey {
	return newOrderer(width, aging).of(int(prio), enq)
}

func keyCmp(a, b orderKey) int {
	switch {
	case a.less(b):
		return -1
	case b.less(a):
		return 1
	}
	return 0
}

// extremes are the int64 values where overflow bugs live.
var extremes = []int64{
	math.MinInt64, math.MinInt64 + 1, math.MinInt64 / 2, -1 << 32, -1e9, -2, -1,
	0, 1, 2, 1e9, 1 << 32, math.MaxInt64 / 2, math.MaxInt64 - 1, math.MaxInt64,
}

// TestOrderKey (internal) checks the ready index's sort key against the
// contract, computed with math/big, on ordinary and extreme priorities,
// for every band width and aging interval the dispatcher can be
// configured with, however wide, and enqueue times within the
// dispatcher's clock range.
func TestOrderKey(t *testing.T) {
	widths := []int64{1, 2, 10, 1000, 1 << 40, math.MaxInt64}
	agings := []int64{1, 1e6, 1e9, 5e9, 1 << 40, math.MaxInt64}
	enqs := []int64{-1 << 62, -1, 0, 1, 1e9, 1 << 40, 1<<62 - 1, 1 << 62}
	r := rand.New(rand.NewPCG(1, 2))
	check := func(e1, p1, e2, p2, width, aging int64) {
		t.Helper()
		want := refCmp(e1, p1, e2, p2, width, aging)
		if got := keyCmp(orderKeyOf(e1, p1, width, aging), orderKeyOf(e2, p2, width, aging)); got != want {
			t.Fatalf("width %d aging %d: (enq %d, prio %d) vs (enq %d, prio %d): %d, want %d", width, aging, e1, p1, e2, p2, got, want)
		}
	}
	for _, w := range widths {
		for _, a := range agings {
			for _, p1 := range extremes {
				for _, p2 := range extremes {
					check(enqs[r.IntN(len(enqs))], p1, enqs[r.IntN(len(enqs))], p2, w, a)
				}
			}
			for range 2000 {
				check(r.Int64N(1<<62), pickInt64(r), r.Int64N(1<<62), pickInt64(r), w, a)
			}
		}
	}
}

// TestOrderKeyBands (internal) checks the two properties the rule rests
// on, across the whole range: a call of a higher band sorts before one of
// a lower band whatever their enqueue times (aging never crosses a band),
// and within a band a higher priority sorts strictly earlier at the same
// enqueue time, and a later enqueue time never sorts earlier.
func TestOrderKeyBands(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 100_000 {
		aging := 1 + r.Int64N(math.MaxInt64)
		width := 1 + r.Int64N(1000)
		if r.IntN(2) == 0 {
			width = 1 + r.Int64N(math.MaxInt64)
		}
		e1, e2 := r.Int64N(1<<62), r.Int64N(1<<62)
		p1, p2 := pickInt64(r), pickInt64(r)
		b1, _ := band.Of(p1, width)
		b2, _ := band.Of(p2, width)
		k1, k2 := orderKeyOf(e1, p1, width, aging), orderKeyOf(e2, p2, width, aging)
		switch {
		case b1 > b2 && !k1.less(k2), b2 > b1 && !k2.less(k1):
			t.Fatalf("width %d: bands %d and %d out of order (enq %d, %d)", width, b1, b2, e1, e2)
		case b1 == b2 && p1 < p2 && !orderKeyOf(e1, p2, width, aging).less(k1):
			t.Fatalf("width %d aging %d: priority %d does not sort before %d at one enqueue time", width, aging, p2, p1)
		case b1 == b2 && e1 < e2 && orderKeyOf(e2, p1, width, aging).less(k1):
			t.Fatalf("width %d aging %d: enq %d sorts before %d", width, aging, e2, e1)
		}
	}
}

// pickInt64 draws an int64 from a mix of distributions: full range, small,
// near an extreme, and every magnitude.
func pickInt64(r *rand.Rand) int64 {
	switch r.IntN(4) {
	case 0:
		return int64(r.Uint64())
	case 1:
		return r.Int64N(1<<20) - 1<<19
	case 2:
		return extremes[r.IntN(len(extremes))] + r.Int64N(5) - 2 // may wrap: still a valid input
	default:
		return int64(r.Uint64() >> r.UintN(64))
	}
}

// --- the ready index ---

type qEntry struct {
	prio int
	enq  int64
	seq  uint64
}

// refLess is the contract's ready order: band, then virtual time within
// the band, then arrival.
func refLess(width, aging int64) func(a, b qEntry) int {
	return func(a, b qEntry) int {
		if c := refCmp(a.enq, int64(a.prio), b.enq, int64(b.prio), width, aging); c != 0 {
			return c
		}
		if a.seq < b.seq {
			return -1
		}
		return 1
	}
}

// TestQueueReadyOrder (internal) pushes random calls (extreme priorities included),
// re-keys some of them, and checks that popReady returns them in the
// contract's order.
func TestQueueReadyOrder(t *testing.T) {
	for _, tc := range []struct{ width, aging int64 }{
		{1, int64(time.Second)}, {2, 1}, {10, int64(time.Second)}, {1 << 40, 1}, {2, 1 << 62},
		{1e9, int64(10 * time.Second)}, {math.MaxInt64, math.MaxInt64},
	} {
		width, aging := tc.width, tc.aging
		t.Run(fmt.Sprintf("band=%d/aging=%v", width, time.Duration(aging)), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(aging), 5))
			q := newQueue[int, int](aging, width)
			dl := due.New(func(int64) bool { return false })
			q.due = &dl
			ten := newTenant[int, int]("", TenantConfig{})
			prios := []int{math.MinInt, math.MinInt + 1, -1, 0, 1, 2, 3, math.MaxInt - 1, math.MaxInt}
			randPrio := func() int {
				if r.IntN(2) == 0 {
					return prios[r.IntN(len(prios))]
				}
				return r.IntN(7) - 3
			}
			randEnq := func() int64 { return r.Int64N(4) * int64(time.Second) }
			const n = 500
			calls := make([]*call[int, int], n)
			for i := range calls {
				c := &call[int, int]{seq: uint64(i + 1), prio: randPrio(), enq: randEnq(), tag: &ten.tag}
				calls[i] = c
				q.push(c)
			}
			for range n / 2 {
				c := calls[r.IntN(n)]
				q.rekey(c, randPrio(), randEnq())
			}
			// Take a few out, as a cancelled pending call would be.
			removed := map[*call[int, int]]bool{}
			for range n / 10 {
				c := calls[r.IntN(n)]
				if !removed[c] {
					q.remove(c)
					removed[c] = true
				}
			}
			var want []qEntry
			for _, c := range calls {
				if !removed[c] {
					want = append(want, qEntry{c.prio, c.enq, c.seq})
				}
			}
			slices.SortFunc(want, refLess(width, aging))
			require.Equal(t, len(want), q.nready)
			var got []qEntry
			for q.nready > 0 {
				c := q.popFrom(q.pick(0))
				assert.Equal(t, csTaken, c.state, "popped: in no index")
				got = append(got, qEntry{c.prio, c.enq, c.seq})
			}
			require.Equal(t, want, got)
		})
	}
}

// --- priority and aging, end to end ---

// TestPriorityOrderFIFOTies queues calls of mixed priorities at one instant
// behind the held worker, and checks they run highest first, FIFO among
// equal priorities, with extreme priorities in their place — whether the
// order comes from strict priority or from virtual time with any aging.
func TestPriorityOrderFIFOTies(t *testing.T) {
	subs := []struct {
		key  string
		prio int
	}{
		{"a1", 1}, {"b3", 3}, {"c1", 1}, {"min1", math.MinInt}, {"d2", 2}, {"max1", math.MaxInt},
		{"e3", 3}, {"f-1", -1}, {"g2", 2}, {"h0", 0}, {"max2", math.MaxInt}, {"i0", 0}, {"min2", math.MinInt},
	}
	byPriority := []string{"max1", "max2", "b3", "e3", "d2", "g2", "a1", "c1", "h0", "i0", "f-1", "min1", "min2"}
	for _, aging := range []time.Duration{0, time.Nanosecond, time.Second, time.Duration(math.MaxInt64)} {
		t.Run("aging="+aging.String(), func(t *testing.T) {
			// Even at the largest aging, where priority × aging is far past
			// the int64 range, every priority keeps its place.
			runPriorityOrder(t, aging, subs, byPriority)
		})
	}
}

// TestLargePrioritiesDoNotTie: Kubernetes' own priority classes —
// system-node-critical (2 000 001 000) above system-cluster-critical
// (2 000 000 000), and 2e9 above 1e9 — run in priority order at every
// aging setting, including those where priority × aging overflows int64
// (they used to tie and run in arrival order).
func TestLargePrioritiesDoNotTie(t *testing.T) {
	subs := []struct {
		key  string
		prio int
	}{
		{"user-1e9", 1e9}, {"cluster-critical", 2000000000}, {"node-critical", 2000001000}, {"user-2e9", 2e9}, {"zero", 0},
	}
	want := []string{"node-critical", "cluster-critical", "user-2e9", "user-1e9", "zero"}
	for _, aging := range []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, time.Hour} {
		t.Run("aging="+aging.String(), func(t *testing.T) {
			runPriorityOrder(t, aging, subs, want)
		})
	}
}

// runPriorityOrder holds the only worker, queues subs at one instant, and
// checks they run in the order want.
func runPriorityOrder(t *testing.T, aging time.Duration, subs []struct {
	key  string
	prio int
}, want []string) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d, _, release := holdWorker(t, f.exec, Config[string, int]{
			Aging:     aging,
			AgingBand: strictIf(aging == 0),
		})
		var tks []*Ticket[string, int]
		for _, s := range subs {
			tks = append(tks, submit(t, d, s.key, 0, prio(s.prio)))
		}
		st := checkConservation(t, d)
		assert.Equal(t, len(subs), st.Ready)
		assert.Equal(t, 1, st.InFlight)
		release()
		assert.Equal(t, want, f.keys())
		assert.Equal(t, map[State]int{StateSucceeded: len(tks)}, tally(t, tks...))
		closeD(t, d)
	})
}

// TestAgingOvertake: a call of priority 0 waits while calls of priority Δ
// keep arriving. Those that arrive before Δ×Aging have a lower virtual time
// and run first; one arriving at exactly Δ×Aging ties and loses to the
// earlier arrival; every later one — in particular every one arriving after
// (Δ+1)×Aging — runs after the low-priority call.
func TestAgingOvertake(t *testing.T) {
	for _, tc := range []struct {
		aging time.Duration
		delta int
	}{
		{time.Second, 1}, {time.Second, 3}, {40 * time.Millisecond, 2}, {time.Minute, 5},
	} {
		t.Run("aging="+tc.aging.String()+"/delta="+itoa(tc.delta), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture[string, int]()
				d, _, release := holdWorker(t, f.exec, Config[string, int]{Aging: tc.aging})
				start := time.Now()
				tks := []*Ticket[string, int]{submit(t, d, "low", 0, prio(0))}
				var before, after []string
				for k := 1; k <= 2*tc.delta+4; k++ { // arrivals every Aging/2 up to (Δ+2)×Aging
					time.Sleep(time.Until(start.Add(time.Duration(k) * tc.aging / 2)))
					key := "high@" + itoa(k) + "/2"
					tks = append(tks, submit(t, d, key, 0, prio(tc.delta)))
					if time.Since(start) < time.Duration(tc.delta)*tc.aging {
						before = append(before, key)
					} else {
						after = append(after, key)
					}
				}
				require.NotEmpty(t, before)
				require.NotEmpty(t, after)
				release()
				want := append(before, "low")
				want = append(want, after...)
				assert.Equal(t, want, f.keys())
				assert.Equal(t, map[State]int{StateSucceeded: len(tks)}, tally(t, tks...))
				closeD(t, d)
			})
		})
	}
}

// TestAgingStream: one worker, an endless stream of priority-2 calls that
// keeps a backlog, and one priority-0 call. With aging it starts within
// (Δ+1)×Aging of its submission, while the stream is still going; with
// AgingBand 1 (strict priority, starvation-prone) it waits for the stream
// to end and runs last.
func TestAgingStream(t *testing.T) {
	const (
		delta   = 2
		service = 100 * time.Millisecond // exec time
		streamT = 8 * time.Second        // how long the stream lasts
	)
	for _, aging := range []time.Duration{time.Second, 0} {
		t.Run("aging="+aging.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture[string, int]()
				exec := func(ctx context.Context, key string, call int) error {
					_ = f.exec(ctx, key, call)
					time.Sleep(service)
					return nil
				}
				d := newD(t, exec, Config[string, int]{
					Workers:   1,
					Aging:     aging,
					AgingBand: strictIf(aging == 0),
				})
				start := time.Now()
				var tks []*Ticket[string, int]
				for i := range 5 { // the initial backlog: 0.5s of work
					tks = append(tks, submit(t, d, "burst"+itoa(i), 0, prio(delta)))
				}
				type streamed struct {
					tks []*Ticket[string, int]
					err error
				}
				stream := make(chan streamed)
				go func() {
					var out streamed
					for i := 0; ; i++ {
						at := 50*time.Millisecond + time.Duration(i)*service // off the service beat
						if at >= streamT {
							break
						}
						time.Sleep(time.Until(start.Add(at)))
						tk, err := d.Submit(bg, "high"+itoa(i), 0, prio(delta))
						if err != nil {
							out.err = err
							break
						}
						out.tks = append(out.tks, tk)
					}
					stream <- out
				}()
				time.Sleep(1025 * time.Millisecond)
				lowAt := time.Now()
				low := submit(t, d, "low", 0, prio(0))
				r, err := low.Wait(bg)
				require.NoError(t, err)
				require.Equal(t, StateSucceeded, r.State)
				out := <-stream
				require.NoError(t, out.err)
				tks = append(tks, out.tks...)
				tks = append(tks, low)
				lowStart := f.startOf("low")
				wait := lowStart.Sub(lowAt)
				assert.Equal(t, wait, r.QueueWait, "QueueWait is not first start − enqueue time")
				if aging > 0 {
					bound := time.Duration(delta+1) * aging
					assert.LessOrEqual(t, wait, bound, "low-priority call waited %v, more than (Δ+1)×Aging = %v", wait, bound)
					assert.Less(t, lowStart.Sub(start), streamT, "low-priority call only ran after the stream ended")
				} else {
					assert.GreaterOrEqual(t, lowStart.Sub(start), streamT, "strict priority: low ran during the stream")
					keys := f.keys()
					assert.Equal(t, "low", keys[len(keys)-1], "strict priority: low is not last")
				}
				waitAll(tks...)
				assert.Equal(t, map[State]int{StateSucceeded: len(tks)}, tally(t, tks...))
				closeD(t, d)
			})
		})
	}
}

// TestAgedStormNeverPassesBinding: aging never lifts a
// call past a higher priority band. A storm of priority-0 status patches
// of any age — 12 s is past the ten levels between it and a priority-10
// binding, at one level per second — never runs before a binding, and
// never holds the worker kept for urgent calls: a binding submitted into
// the storm waits for one token (10 a second here), however old the
// storm. While no binding is ready the patches take every token.
func TestAgedStormNeverPassesBinding(t *testing.T) {
	for _, age := range []time.Duration{12 * time.Second, 100 * time.Second, 1000 * time.Second} {
		t.Run("age="+age.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				log := newStartLog()
				const qps = 10
				d := newD(t, log.exec(20*time.Millisecond), Config[string, int]{
					Workers:   4,
					Capacity:  20000,
					RateLimit: rate.NewLimiter(qps, 1),
					Start:     StartPolicy{ReservedWorkers: 1, UrgentPriority: 10},
				})
				storm := int(age.Seconds())*qps + 100 // outlasts the binding
				for i := range storm {
					require.NoError(t, d.Post(fmt.Sprint("patch", i), 0, SubmitOptions{Tenant: "status"}))
				}
				time.Sleep(age)
				synctest.Wait()
				ran := d.Stats().Executions
				assert.InDelta(t, float64(age.Seconds()*qps), float64(ran), 2, "patches take every token while no binding is ready")
				submitted := time.Now()
				bind := submit(t, d, "bind", 1, SubmitOptions{Priority: 10, Tenant: "binding"})
				<-bind.Done()
				assert.Equal(t, StateSucceeded, outcome(t, bind).State)
				start, ok := log.startOf("bind")
				require.True(t, ok)
				assert.LessOrEqual(t, start.Sub(submitted), time.Second/qps, "the binding waited for more than one token")
				time.Sleep(time.Second)
				synctest.Wait()
				assert.InDelta(t, float64(ran+qps+1), float64(d.Stats().Executions), 2, "the patches drain again at the full rate")
				ctx, cancel := context.WithCancel(bg)
				cancel() // end the rest of the storm
				assert.ErrorIs(t, d.Close(ctx), context.Canceled)
				checkConservation(t, d)
			})
		})
	}
}

// TestBandEdgeNeverOvertaken: Config.AgingBand "groups priorities into
// bands of this many levels … A call never runs before a ready call of a
// higher band, however long it waited", at any width and aging: the last
// priority of a band, long aged, runs after the first of the band above,
// and before the one below it in its band. Wide bands once moved their
// boundaries (narrowed to what 64 bits of virtual time hold): at width 1e9
// and aging 10s, 1e9−1 and 1e9 shared a band. Each case runs with the calls
// in one tenant (the ready index's order) and in a tenant each (the pick's
// levels), at the largest widths and agings too.
func TestBandEdgeNeverOvertaken(t *testing.T) {
	for _, tc := range []struct {
		width int
		aging time.Duration
	}{
		{1, time.Nanosecond}, {2, time.Nanosecond}, {10, time.Second},
		{1e9, 10 * time.Second}, {1e9, time.Nanosecond}, {1e9, math.MaxInt64},
		{math.MaxInt, time.Nanosecond}, {math.MaxInt, time.Second}, {math.MaxInt, math.MaxInt64},
	} {
		for _, tenants := range []bool{false, true} {
			t.Run(fmt.Sprintf("band=%d/aging=%v/tenants=%v", tc.width, tc.aging, tenants), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					f := newFixture[string, int]()
					d, _, release := holdWorker(t, f.exec, Config[string, int]{AgingBand: tc.width, Aging: tc.aging})
					tenant := func(name string) string {
						if tenants {
							return name
						}
						return ""
					}
					top := tc.width // the first priority of band 1
					below := submit(t, d, "below", 0, SubmitOptions{Priority: top - 2, Tenant: tenant("a")})
					last := submit(t, d, "last", 0, SubmitOptions{Priority: top - 1, Tenant: tenant("b")})
					time.Sleep(time.Hour) // 3.6e12 levels of aging at 1ns
					first := submit(t, d, "first", 0, SubmitOptions{Priority: top, Tenant: tenant("c")})
					release()
					waitAll(below, last, first)
					assert.Equal(t, []string{"first", "last", "below"}, f.keys())
					closeD(t, d)
				})
			})
		}
	}
}

// TestStarvationUnderOverload: the within-band bound, about (q−p+1)×Aging,
// assumes the workers keep up with the stream at q. Under overload (a
// stream at 1.5× the service rate) a call at p runs after exactly the calls
// at q that arrived before, or within (q−p)×Aging after, it — the rule the
// bound comes from — so its wait is the time to serve that backlog, longer
// than the bound.
func TestStarvationUnderOverload(t *testing.T) {
	const (
		aging   = time.Second
		service = 100 * time.Millisecond
		dp      = 1
	)
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		arrived := map[string]time.Time{}
		started := map[string]time.Time{}
		d := newD(t, func(_ context.Context, k string, _ int) error {
			mu.Lock()
			started[k] = time.Now()
			mu.Unlock()
			time.Sleep(service)
			return nil
		}, Config[string, int]{Workers: 2, Capacity: 100000, Aging: aging})
		post := func(k string, p int) {
			mu.Lock()
			arrived[k] = time.Now()
			mu.Unlock()
			require.NoError(t, d.Post(k, 0, SubmitOptions{Priority: p}))
		}
		ctx, stop := context.WithCancel(bg)
		var wg sync.WaitGroup
		wg.Go(func() { // 3 calls per service time: 1.5× what 2 workers serve
			for i := 0; ctx.Err() == nil; i++ {
				for j := range 3 {
					post(fmt.Sprintf("q/%d/%d", i, j), dp)
				}
				time.Sleep(service)
			}
		})
		time.Sleep(2 * time.Second)
		at := time.Now()
		post("p", 0)
		for {
			time.Sleep(service)
			mu.Lock()
			_, ok := started["p"]
			mu.Unlock()
			if ok {
				break
			}
		}
		stop()
		wg.Wait()
		closeD(t, d)
		mu.Lock()
		defer mu.Unlock()
		pStart := started["p"]
		cut := at.Add(dp * aging)
		for k, s := range started {
			if k == "p" || s.Before(at) {
				continue
			}
			if s.Before(pStart) {
				assert.True(t, arrived[k].Before(cut), "%s arrived %v after p, past (q−p)×Aging, and ran first", k, arrived[k].Sub(at))
			} else {
				assert.False(t, arrived[k].Before(cut), "%s arrived %v after p, within (q−p)×Aging, and ran after it", k, arrived[k].Sub(at))
			}
		}
		wait := pStart.Sub(at)
		assert.Greater(t, wait, (dp+1)*aging, "under overload the wait exceeds (q−p+1)×Aging")
		t.Logf("p waited %v under 1.5× overload (the bound with workers keeping up: %v)", wait, (dp+1)*aging)
	})
}

// TestEqualLevelArrival: Config.AgingBand: "At equal levels tenants take
// turns by TenantConfig.Weight, then arrival decides." B and A (weight 1,
// neither picked yet: equal passes) each have a call at one level; B's
// arrived first and runs first, however the tenants left by others (C's
// call cancelled) are kept internally.
func TestEqualLevelArrival(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d, _, release := holdWorker(t, f.exec, Config[string, int]{})
		for _, k := range []string{"C", "B", "A"} {
			require.NoError(t, d.Post(k, 0, SubmitOptions{Tenant: k}))
		}
		require.True(t, d.Cancel("C", nil))
		release()
		assert.Equal(t, []string{"B", "A"}, f.keys())
		closeD(t, d)
	})
}
