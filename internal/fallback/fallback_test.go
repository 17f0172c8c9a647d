package fallback

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const sec = int64(time.Second)

func TestBacklogFallsBackAndReturns(t *testing.T) {
	f := New(Policy{Window: 10 * time.Second, MaxBacklog: 2, MinSamples: 20, ReturnAfter: 5 * time.Second})
	now := 100 * sec
	first := f.Start(now)
	assert.Equal(t, now+sec, first, "checked every tenth of the window")
	due, at := f.Due(now)
	assert.False(t, due)
	assert.Equal(t, first, at)

	busy := Facts{Live: 3, Backlog: 2}
	sw, _ := f.Check(first, busy)
	assert.Equal(t, Stay, sw, "a backlog at the threshold is not over it")
	assert.Equal(t, first+sec, f.Next(busy))

	busy.Backlog = 3
	sw, code := f.Check(first+sec, busy)
	assert.Equal(t, ToSync, sw)
	assert.Equal(t, ReasonBacklog, code)
	assert.Equal(t, "backlog 3 > 2", f.Reason())

	sync := Facts{Sync: true}
	assert.NotZero(t, f.Next(sync), "a return is due: not parked")
	sw, _ = f.Check(first+3*sec, sync)
	assert.Equal(t, Stay, sw)
	sw, code = f.Check(first+6*sec, sync)
	assert.Equal(t, ToAsync, sw)
	assert.Equal(t, ReasonCoolDown, code)
}

func TestParksWhileIdle(t *testing.T) {
	f := New(Policy{Window: time.Second, MaxBacklog: 1})
	now := 100 * sec
	f.Start(now)
	sw, _ := f.Check(now, Facts{})
	require.Equal(t, Stay, sw)
	assert.Zero(t, f.Next(Facts{}), "Async with no live call parks")
	assert.True(t, f.Parked())
	due, at := f.Due(now + sec)
	assert.False(t, due)
	assert.Zero(t, at, "parked: nothing to arm")
	at, ok := f.Wake(now + sec)
	assert.True(t, ok)
	assert.Equal(t, now+sec, at)
	due, _ = f.Due(now + sec)
	assert.True(t, due)
	_, ok = f.Wake(now + sec)
	assert.False(t, ok, "only a parked fallback wakes")

	p := Policy{Window: time.Second, MaxCircuitOpen: time.Second}
	f = New(p)
	f.Start(now)
	assert.NotZero(t, f.Next(Facts{CircuitOpen: true}), "an open circuit is watched while idle")
}

func TestRatios(t *testing.T) {
	f := New(Policy{Window: 10 * time.Second, MaxFailureRatio: 0.5, MaxQueueWaitP99: time.Second, MinSamples: 4})
	now := 100 * sec
	for i := range 4 {
		f.Waited(now, time.Duration(i)*time.Second) // 2 of 4 over 1s
	}
	sw, code := f.Check(now, Facts{Live: 1})
	assert.Equal(t, ToSync, sw)
	assert.Equal(t, ReasonQueueWait, code)

	f = New(Policy{Window: 10 * time.Second, MaxFailureRatio: 0.5, MinSamples: 4})
	for i := range 4 {
		f.Finished(now, i > 0)
	}
	sw, code = f.Check(now, Facts{Live: 1})
	assert.Equal(t, ToSync, sw)
	assert.Equal(t, ReasonFailureRatio, code)
	assert.Equal(t, "failure ratio 0.750 > 0.500", f.Reason())

	f = New(Policy{Window: 10 * time.Second, MaxCircuitOpen: time.Second})
	sw, code = f.Check(now, Facts{Live: 1, CircuitOpen: true, CircuitSince: now - 2*sec})
	assert.Equal(t, ToSync, sw)
	assert.Equal(t, ReasonCircuitOpen, code)
}

// TestCancelReturn: once the owner's mode is set by hand, the cool-down
// return an earlier fallback armed is not due, and the fallback parks; a
// later fallback arms a return of its own.
func TestCancelReturn(t *testing.T) {
	f := New(Policy{Window: 10 * time.Second, MaxBacklog: 1, MinSamples: 20, ReturnAfter: 5 * time.Second})
	now := 100 * sec
	f.Start(now)
	sw, _ := f.Check(now, Facts{Live: 3, Backlog: 2})
	require.Equal(t, ToSync, sw)
	f.CancelReturn()
	sync := Facts{Sync: true}
	sw, _ = f.Check(now+time.Minute.Nanoseconds(), sync)
	assert.Equal(t, Stay, sw, "no return after the mode was set by hand")
	assert.Zero(t, f.Next(sync), "nothing to watch: parked")

	f.Wake(now + 2*time.Minute.Nanoseconds())
	busy := Facts{Live: 3, Backlog: 2}
	sw, _ = f.Check(now+2*time.Minute.Nanoseconds(), busy)
	require.Equal(t, ToSync, sw)
	sw, code := f.Check(now+2*time.Minute.Nanoseconds()+6*sec, sync)
	assert.Equal(t, ToAsync, sw, "a later fallback returns")
	assert.Equal(t, ReasonCoolDown, code)
}
