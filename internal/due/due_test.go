package due

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rig is a List with a fake timer that records when it is armed for.
type rig struct {
	l     List
	timer int64 // Never: not set
	ready bool  // false: no timer yet (before the dispatcher starts)
}

func newRig() *rig {
	r := &rig{timer: Never, ready: true}
	r.l = New(func(at int64) bool {
		if !r.ready {
			return false
		}
		r.timer = at
		return true
	})
	return r
}

// fire runs one round of the clock at now: it takes what is due, and lets
// act record each duty's next time, then re-arms.
func (r *rig) fire(now int64, act func(Duty)) Set {
	r.timer = Never
	s := r.l.Take(now)
	for d := range count {
		if s.Has(d) && act != nil {
			act(d)
		}
	}
	r.l.Rearm()
	return s
}

// TestPairs sets two duties due at different times, in both orders, and
// fires the clock when its timer says: each duty comes due at its own time,
// the earlier never hides the later.
func TestPairs(t *testing.T) {
	for a := range count {
		for b := range count {
			if a == b {
				continue
			}
			t.Run(fmt.Sprintf("%v at 10, %v at 20", a, b), func(t *testing.T) {
				r := newRig()
				r.l.Set(b, 20)
				r.l.Set(a, 10)
				require.EqualValues(t, 10, r.timer, "armed for the earlier")
				s := r.fire(r.timer, nil)
				assert.True(t, s.Has(a))
				assert.False(t, s.Has(b))
				require.EqualValues(t, 20, r.timer, "re-armed for the later")
				s = r.fire(r.timer, nil)
				assert.True(t, s.Has(b))
				assert.EqualValues(t, Never, r.timer, "nothing left")
				assert.EqualValues(t, Never, r.l.Next())
			})
		}
	}
}

// TestLaterSetKeepsEarlier: a later time for a duty never replaces an
// earlier one, and does not touch the timer.
func TestLaterSetKeepsEarlier(t *testing.T) {
	r := newRig()
	r.l.Set(Start, 10)
	r.l.Set(Start, 30)
	assert.EqualValues(t, 10, r.l.At(Start))
	assert.EqualValues(t, 10, r.timer)
}

// TestBeforeTimer: times recorded before there is a timer are kept, and
// Rearm arms for the earliest once there is one.
func TestBeforeTimer(t *testing.T) {
	r := newRig()
	r.ready = false
	r.l.Set(Check, 50)
	r.l.Set(Expire, 40)
	assert.EqualValues(t, Never, r.l.Armed())
	r.ready = true
	r.l.Rearm()
	assert.EqualValues(t, 40, r.timer)
	assert.EqualValues(t, 40, r.l.Armed())
}

// TestModel drives a List with random Sets and clock rounds, duties that
// re-record a next time while they act among them, and checks it against a
// reference: every time set for a duty comes due in the first round at or
// after it, and after every round the timer is set no later than every
// entry.
func TestModel(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		r := newRig()
		// want[d] is the earliest time set for d and not yet taken.
		var want [count]int64
		for i := range want {
			want[i] = Never
		}
		now := int64(0)
		for range 300 {
			switch rng.IntN(3) {
			case 0, 1:
				d := Duty(rng.IntN(int(count)))
				at := now + int64(rng.IntN(100))
				r.l.Set(d, at)
				want[d] = min(want[d], at)
			case 2:
				// The clock fires at its timer, or late.
				if r.timer == Never {
					now += int64(rng.IntN(50))
				} else {
					now = max(now, r.timer) + int64(rng.IntN(3))
				}
				s := r.fire(now, func(d Duty) {
					if rng.IntN(3) == 0 { // the duty still has work: its next time
						r.l.Set(d, now+1+int64(rng.IntN(100)))
					}
				})
				for d := range count {
					due := want[d] <= now
					require.Equal(t, due, s.Has(d), "seed %d: duty %v due at %d, now %d", seed, d, want[d], now)
					if due {
						want[d] = r.l.At(d) // what acting recorded, if anything
					}
				}
			}
			for d := range count {
				require.Equal(t, want[d], r.l.At(d), "seed %d: duty %v", seed, d)
				require.LessOrEqual(t, r.timer, r.l.At(d), "seed %d: the timer is set after duty %v's time", seed, d)
			}
		}
	}
}
