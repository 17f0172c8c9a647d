package dispatch

import (
	"context"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --- virtualTime: enq − prio×aging, exact in 128 bits ---

// refVirtualTime is virtualTime computed with math/big.
func refVirtualTime(enq, prio, aging int64) *big.Int {
	x := new(big.Int).Mul(big.NewInt(prio), big.NewInt(aging))
	return x.Sub(big.NewInt(enq), x)
}

// bigOf is k as a math/big integer: hi·2⁶⁴ + lo.
func bigOf(k orderKey) *big.Int {
	x := new(big.Int).Lsh(big.NewInt(k.hi), 64)
	return x.Add(x, new(big.Int).SetUint64(k.lo))
}

// extremes are the int64 values where overflow bugs live.
var extremes = []int64{
	math.MinInt64, math.MinInt64 + 1, math.MinInt64 / 2, -1 << 32, -1e9, -2, -1,
	0, 1, 2, 1e9, 1 << 32, math.MaxInt64 / 2, math.MaxInt64 - 1, math.MaxInt64,
}

// TestVirtualTime (internal) checks the ready index's sort key, enqueue
// time − priority × aging, on a table of ordinary and extreme inputs, each
// checked against math/big first.
func TestVirtualTime(t *testing.T) {
	tests := []struct {
		name             string
		enq, prio, aging int64
		want             string // decimal, exact
	}{
		{"zero", 0, 0, 1, "0"},
		{"priority zero is enq", 12345, 0, math.MaxInt64, "12345"},
		{"one level per aging", 10e9, 3, 1e9, "7000000000"},
		{"negative priority is later", 10e9, -3, 1e9, "13000000000"},
		{"negative enq", -5, 2, 10, "-25"},
		{"below MinInt64", -2, 1, math.MaxInt64, "-9223372036854775809"},
		{"above MaxInt64", 1, -1, math.MaxInt64, "9223372036854775808"},
		{"MaxInt64 priority", 0, math.MaxInt64, 2, "-18446744073709551614"},
		{"MinInt64 priority", 0, math.MinInt64, 1, "9223372036854775808"},
		{"MinInt64 priority, huge aging", math.MinInt64, math.MinInt64, math.MaxInt64, "85070591730234615847396907784232501248"},
		{"largest product", 0, math.MaxInt64, math.MaxInt64, "-85070591730234615847396907784232501249"},
		// kube-scheduler's system-node-critical and system-cluster-critical
		// at 5s aging: 5 µs of virtual time apart, not tied.
		{"system-node-critical", 1e9, 2000001000, 5e9, "-10000004999000000000"},
		{"system-cluster-critical", 1e9, 2000000000, 5e9, "-9999999999000000000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want, ok := new(big.Int).SetString(tc.want, 10)
			require.True(t, ok)
			require.Zero(t, want.Cmp(refVirtualTime(tc.enq, tc.prio, tc.aging)), "the table disagrees with math/big")
			assert.Equal(t, tc.want, bigOf(virtualTime(tc.enq, tc.prio, tc.aging)).String())
		})
	}
}

// TestVirtualTimeMatchesBig (internal) compares virtualTime with the exact value for
// every combination of extreme values and for many random ones, full range
// and small.
func TestVirtualTimeMatchesBig(t *testing.T) {
	check := func(enq, prio, aging int64) {
		t.Helper()
		want := refVirtualTime(enq, prio, aging)
		if got := bigOf(virtualTime(enq, prio, aging)); got.Cmp(want) != 0 {
			t.Fatalf("virtualTime(%d, %d, %d) = %v, want %v", enq, prio, aging, got, want)
		}
	}
	agings := []int64{1, 2, 3, 1e6, 1e9, 5e9, 1 << 32, math.MaxInt64 / 2, math.MaxInt64 - 1, math.MaxInt64}
	for _, enq := range extremes {
		for _, prio := range extremes {
			for _, aging := range agings {
				check(enq, prio, aging)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		aging := pickInt64(r)
		if aging <= 0 {
			aging = 1 + r.Int64N(math.MaxInt64)
		}
		check(pickInt64(r), pickInt64(r), aging)
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

// TestVirtualTimeMonotone (internal) checks the order properties the ready
// index relies on, across the whole range: a higher priority always sorts
// strictly earlier at the same enqueue time (no two priorities tie, however
// large they or the aging interval are), and a later enqueue time never
// sorts earlier.
func TestVirtualTimeMonotone(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 100_000 {
		enq, aging := pickInt64(r), 1+r.Int64N(math.MaxInt64)
		p1, p2 := pickInt64(r), pickInt64(r)
		if r.IntN(2) == 0 {
			p1, p2 = extremes[r.IntN(len(extremes))], extremes[r.IntN(len(extremes))]
		}
		if p1 > p2 {
			p1, p2 = p2, p1
		}
		if v1, v2 := virtualTime(enq, p1, aging), virtualTime(enq, p2, aging); p1 < p2 && !v2.less(v1) {
			t.Fatalf("enq=%d aging=%d: priority %d (vt %v) does not sort after priority %d (vt %v)", enq, aging, p1, v1, p2, v2)
		}
		e1, e2 := pickInt64(r), pickInt64(r)
		if e1 > e2 {
			e1, e2 = e2, e1
		}
		if v1, v2 := virtualTime(e1, p1, aging), virtualTime(e2, p1, aging); v2.less(v1) {
			t.Fatalf("prio=%d aging=%d: enq %d (vt %v) sorts after enq %d (vt %v)", p1, aging, e1, v1, e2, v2)
		}
	}
}

// --- the ready index ---

type qEntry struct {
	prio int
	enq  int64
	seq  uint64
}

// refLess is the contract's ready order: virtual time then arrival, or with
// aging 0, priority (descending) then enqueue time then arrival.
func refLess(aging int64) func(a, b qEntry) int {
	return func(a, b qEntry) int {
		if aging == 0 {
			if a.prio != b.prio {
				if a.prio > b.prio {
					return -1
				}
				return 1
			}
			if a.enq != b.enq {
				if a.enq < b.enq {
					return -1
				}
				return 1
			}
		} else {
			va := refVirtualTime(a.enq, int64(a.prio), aging)
			vb := refVirtualTime(b.enq, int64(b.prio), aging)
			if c := va.Cmp(vb); c != 0 {
				return c
			}
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
	for _, aging := range []int64{0, 1, int64(time.Second), math.MaxInt64} {
		t.Run("aging="+time.Duration(aging).String(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(aging), 5))
			q := newQueue[int, int](aging)
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
				c := &call[int, int]{seq: uint64(i + 1), prio: randPrio(), enq: randEnq(), firstStart: -1, ten: ten}
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
			slices.SortFunc(want, refLess(aging))
			require.Equal(t, len(want), q.nready)
			var got []qEntry
			for q.nready > 0 {
				c := q.popFrom(q.pick(0))
				assert.Equal(t, csBehind, c.state, "popped: in no index")
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
			Aging:          aging,
			StrictPriority: aging == 0,
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
		assert.Equal(t, map[State]int{Succeeded: len(tks)}, tally(t, tks...))
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
					time.Sleep(start.Add(time.Duration(k) * tc.aging / 2).Sub(time.Now()))
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
				assert.Equal(t, map[State]int{Succeeded: len(tks)}, tally(t, tks...))
				closeD(t, d)
			})
		})
	}
}

// TestAgingStream: one worker, an endless stream of priority-2 calls that
// keeps a backlog, and one priority-0 call. With aging it starts within
// (Δ+1)×Aging of its submission, while the stream is still going; with
// Config.StrictPriority (strict priority, starvation-prone) it waits for the stream
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
					Workers:        1,
					Aging:          aging,
					StrictPriority: aging == 0,
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
						time.Sleep(start.Add(at).Sub(time.Now()))
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
				require.Equal(t, Succeeded, r.State)
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
				assert.Equal(t, map[State]int{Succeeded: len(tks)}, tally(t, tks...))
				closeD(t, d)
			})
		})
	}
}
