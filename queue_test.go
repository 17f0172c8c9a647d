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

// --- virtualTime: enq − prio×aging, saturated, never overflowing ---

var (
	bigMinInt64 = big.NewInt(math.MinInt64)
	bigMaxInt64 = big.NewInt(math.MaxInt64)
)

// refVirtualTime is virtualTime computed exactly with math/big and clamped
// to the int64 range.
func refVirtualTime(enq, prio, aging int64) (v int64, saturated bool) {
	x := new(big.Int).Mul(big.NewInt(prio), big.NewInt(aging))
	x.Sub(big.NewInt(enq), x)
	switch {
	case x.Cmp(bigMaxInt64) > 0:
		return math.MaxInt64, true
	case x.Cmp(bigMinInt64) < 0:
		return math.MinInt64, true
	}
	return x.Int64(), false
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
		want             int64
	}{
		{"zero", 0, 0, 1, 0},
		{"priority zero is enq", 12345, 0, math.MaxInt64, 12345},
		{"one level per aging", 10e9, 3, 1e9, 7e9},
		{"negative priority is later", 10e9, -3, 1e9, 13e9},
		{"negative enq", -5, 2, 10, -25},
		{"exact lower bound", 0, 1, math.MaxInt64, -math.MaxInt64},
		{"exact MinInt64", -1, 1, math.MaxInt64, math.MinInt64},
		{"just below MinInt64 saturates", -2, 1, math.MaxInt64, math.MinInt64},
		{"exact MaxInt64", 0, -1, math.MaxInt64, math.MaxInt64},
		{"just above MaxInt64 saturates", 1, -1, math.MaxInt64, math.MaxInt64},
		{"MaxInt64 priority saturates low", 0, math.MaxInt64, 2, math.MinInt64},
		{"MinInt64 priority saturates high", 0, math.MinInt64, 1, math.MaxInt64},
		{"MinInt64 priority from MinInt64 enq", math.MinInt64, math.MinInt64, 1, 0},
		{"MinInt64 priority, huge aging", math.MinInt64, math.MinInt64, math.MaxInt64, math.MaxInt64},
		{"MaxInt64 priority from MaxInt64 enq", math.MaxInt64, math.MaxInt64, 1, 0},
		{"product overflows 64 bits", 0, math.MaxInt64, math.MaxInt64, math.MinInt64},
		{"negative product overflows 64 bits", 0, math.MinInt64, math.MaxInt64, math.MaxInt64},
		{"MinInt64 enq, positive priority", math.MinInt64, 1, 1, math.MinInt64},
		{"MaxInt64 enq, negative priority", math.MaxInt64, -1, 1, math.MaxInt64},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ref, _ := refVirtualTime(tc.enq, tc.prio, tc.aging)
			require.Equal(t, tc.want, ref, "the table disagrees with math/big")
			assert.Equal(t, tc.want, virtualTime(tc.enq, tc.prio, tc.aging))
		})
	}
}

// TestVirtualTimeMatchesBig (internal) compares virtualTime with the exact value for
// every combination of extreme values and for many random ones, full range
// and small, and checks that saturation happens exactly when the exact
// value is out of range.
func TestVirtualTimeMatchesBig(t *testing.T) {
	check := func(enq, prio, aging int64) {
		t.Helper()
		want, sat := refVirtualTime(enq, prio, aging)
		got := virtualTime(enq, prio, aging)
		if got != want {
			t.Fatalf("virtualTime(%d, %d, %d) = %d, want %d (saturated: %v)", enq, prio, aging, got, want, sat)
		}
	}
	agings := []int64{1, 2, 3, 1e6, 1e9, 1 << 32, math.MaxInt64 / 2, math.MaxInt64 - 1, math.MaxInt64}
	for _, enq := range extremes {
		for _, prio := range extremes {
			for _, aging := range agings {
				check(enq, prio, aging)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	pick := func() int64 {
		switch r.IntN(4) {
		case 0:
			return int64(r.Uint64()) // full range
		case 1:
			return r.Int64N(1<<20) - 1<<19 // small
		case 2:
			return extremes[r.IntN(len(extremes))] + r.Int64N(5) - 2 // near an extreme (may wrap: still a valid input)
		default:
			return int64(r.Uint64() >> r.UintN(64)) // every magnitude
		}
	}
	for range 200_000 {
		aging := pick()
		if aging <= 0 {
			aging = 1 + r.Int64N(math.MaxInt64)
		}
		check(pick(), pick(), aging)
	}
}

// TestVirtualTimeMonotone (internal) checks the order properties the ready index relies
// on, across the whole range: a higher priority never sorts later, and a
// later enqueue time never sorts earlier.
func TestVirtualTimeMonotone(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 100_000 {
		enq, aging := int64(r.Uint64()), 1+r.Int64N(math.MaxInt64)
		p1, p2 := int64(r.Uint64()), int64(r.Uint64())
		if r.IntN(2) == 0 {
			p1, p2 = extremes[r.IntN(len(extremes))], extremes[r.IntN(len(extremes))]
		}
		if p1 > p2 {
			p1, p2 = p2, p1
		}
		if v1, v2 := virtualTime(enq, p1, aging), virtualTime(enq, p2, aging); v1 < v2 {
			t.Fatalf("enq=%d aging=%d: priority %d (vt %d) sorts before priority %d (vt %d)", enq, aging, p1, v1, p2, v2)
		}
		e1, e2 := int64(r.Uint64()), int64(r.Uint64())
		if e1 > e2 {
			e1, e2 = e2, e1
		}
		if v1, v2 := virtualTime(e1, p1, aging), virtualTime(e2, p1, aging); v1 > v2 {
			t.Fatalf("prio=%d aging=%d: enq %d (vt %d) sorts after enq %d (vt %d)", p1, aging, e1, v1, e2, v2)
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
			va, _ := refVirtualTime(a.enq, int64(a.prio), aging)
			vb, _ := refVirtualTime(b.enq, int64(b.prio), aging)
			if va != vb {
				if va < vb {
					return -1
				}
				return 1
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
	for _, tc := range []struct {
		aging time.Duration // 0: Config.StrictPriority
		want  []string
	}{
		{0, byPriority},
		{time.Nanosecond, byPriority},
		{time.Second, byPriority},
		// With aging this large every |priority| ≥ 2 saturates: the order
		// collapses to three classes, FIFO within each. That is the
		// saturation the contract asks for, not a wrap-around.
		{time.Duration(math.MaxInt64), []string{"b3", "d2", "max1", "e3", "g2", "max2", "a1", "c1", "h0", "i0", "min1", "f-1", "min2"}},
	} {
		t.Run("aging="+tc.aging.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture[string, int]()
				d, _, release := holdWorker(t, f.exec, Config[string, int]{
					Aging:          tc.aging,
					StrictPriority: tc.aging == 0,
				})
				var tks []*Ticket[string, int]
				for _, s := range subs {
					tks = append(tks, submit(t, d, s.key, 0, prio(s.prio)))
				}
				st := checkConservation(t, d)
				assert.Equal(t, len(subs), st.Ready)
				assert.Equal(t, 1, st.InFlight)
				release()
				assert.Equal(t, tc.want, f.keys())
				assert.Equal(t, map[State]int{Succeeded: len(tks)}, tally(t, tks...))
				closeD(t, d)
			})
		})
	}
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
