package adaptive

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

var policy = Policy{MinWorkers: 1, Tolerance: 2, Window: 30 * time.Second}

const ms = time.Millisecond

func TestThrottledHolds(t *testing.T) {
	a := New(policy, 16, time.Second)
	now := int64(time.Hour)
	from, to := a.Record(now, 5*ms, Throttled, 10*time.Second)
	assert.Equal(t, 16, from)
	assert.Equal(t, 8, to, "a Retry-After halves the limit")
	assert.Equal(t, now+int64(time.Second), a.Hold(), "the hold is capped at maxHold")
	_, to = a.Record(now+1, 5*ms, Timeout, 0)
	assert.Equal(t, 8, to, "one fall per calm period")
	_, to = a.Record(now+int64(time.Second), 5*ms, Timeout, 0)
	assert.Equal(t, 6, to, "a timeout takes a quarter")
}

func TestGrowsBack(t *testing.T) {
	a := New(policy, 4, time.Second)
	now := int64(time.Hour)
	a.Record(now, 5*ms, Throttled, ms)
	assert.Equal(t, 2, a.Limit())
	for i := range 2 + 3 {
		a.Record(now+int64(i), 5*ms, None, 0)
	}
	assert.Equal(t, 4, a.Limit(), "+1 per limit's worth of healthy executions, up to the ceiling")
	for i := range 100 {
		a.Record(now+int64(i), 5*ms, None, 0)
	}
	assert.Equal(t, 4, a.Limit(), "never above the ceiling")
}

func TestStrainedBlockFalls(t *testing.T) {
	a := New(policy, 16, time.Second)
	now := int64(time.Hour)
	for range blockMin {
		a.Record(now, 10*ms, None, 0) // the baseline: 10ms
	}
	for range blockMin {
		a.Record(now+int64(time.Second), 40*ms, None, 0) // four times slower
	}
	assert.Equal(t, 8, a.Limit(), "a block at 4× the baseline (tolerance 2) falls by half")
}

func TestFloor(t *testing.T) {
	a := New(Policy{MinWorkers: 3, Tolerance: 2, Window: time.Second}, 4, time.Second)
	a.Record(int64(time.Hour), ms, Throttled, ms)
	assert.Equal(t, 3, a.Limit())
}

func TestMinRing(t *testing.T) {
	m := newMinRing(10 * time.Second)
	now := int64(time.Hour)
	assert.Zero(t, m.min(now))
	m.add(now, 5*ms)
	m.add(now, 3*ms)
	m.add(now+int64(2*time.Second), 4*ms)
	assert.Equal(t, 3*ms, m.min(now+int64(2*time.Second)))
	assert.Equal(t, 4*ms, m.min(now+int64(10*time.Second)), "the oldest tenth has left the window")
	assert.Zero(t, m.min(now+int64(time.Minute)))
}
