package breaker

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var policy = Policy{
	ConsecutiveFailures: 3, FailureRatio: math.Inf(1), MinSamples: 20,
	Window: 10 * time.Second, Cooldown: time.Second, Probes: 1,
}

func TestTransitions(t *testing.T) {
	b := New(policy)
	now := int64(time.Hour)
	ok, probe, ch := b.Admit(now)
	require.True(t, ok)
	assert.False(t, probe)
	assert.False(t, ch.Changed())

	for range 2 {
		assert.False(t, b.Record(now, Failed).Changed())
	}
	assert.False(t, b.Record(now, Ignored).Changed(), "an ignored verdict does not count")
	assert.Equal(t, Change{Closed, Open}, b.Record(now, Failed), "the third failure in a row opens it")
	assert.Equal(t, now, b.Since())
	assert.Equal(t, now+int64(time.Second), b.OpenUntil())

	ok, _, _ = b.Admit(now + int64(time.Second) - 1)
	assert.False(t, ok, "nothing starts during the cool-down")

	at := b.OpenUntil()
	ok, probe, ch = b.Admit(at)
	require.True(t, ok)
	assert.True(t, probe)
	assert.Equal(t, Change{Open, HalfOpen}, ch)
	ok, _, ch = b.Admit(at)
	assert.False(t, ok, "one probe at a time")
	assert.False(t, ch.Changed())

	b.EndProbe(0) // as its owner does before recording the probe's verdict
	assert.Equal(t, Change{HalfOpen, Open}, b.Record(at, Failed), "a failed probe re-opens it")
	ok, probe, _ = b.Admit(b.OpenUntil())
	require.True(t, ok)
	require.True(t, probe)
	b.EndProbe(0)
	assert.Equal(t, Change{HalfOpen, Closed}, b.Record(b.OpenUntil(), Healthy), "a healthy probe closes it")
	assert.Equal(t, Closed, b.State())
}

func TestFailureRatio(t *testing.T) {
	p := policy
	p.ConsecutiveFailures, p.FailureRatio, p.MinSamples = 100, 0.5, 10
	b := New(p)
	now := int64(time.Hour)
	for i := range 9 {
		v := Healthy
		if i%2 == 0 {
			v = Failed
		}
		assert.False(t, b.Record(now, v).Changed(), "fewer than MinSamples")
	}
	assert.Equal(t, Change{Closed, Open}, b.Record(now, Failed), "6 of 10 failed")
}

func TestProbers(t *testing.T) {
	b := New(policy)
	now := int64(time.Hour)
	for range 3 {
		b.Record(now, Failed)
	}
	assert.False(t, b.ProbeRunning())
	ok, probe, _ := b.Admit(b.OpenUntil())
	require.True(t, ok && probe)
	b.StartProbe(7)
	assert.True(t, b.ProbeRunning())
	assert.True(t, b.Probing(7))
	assert.False(t, b.Probing(8))
	b.EndProbe(7)
	assert.False(t, b.ProbeRunning())
	ok, _, _ = b.Admit(b.OpenUntil())
	assert.True(t, ok, "the probe's slot is free again")
}

// TestStateAt: once the cool-down is over, an open breaker is half-open to
// whoever asks, though it moves, and says so, only when Admit is asked.
func TestStateAt(t *testing.T) {
	b := New(policy)
	now := int64(time.Hour)
	assert.Equal(t, Closed, b.StateAt(now))
	for range 3 {
		b.Record(now, Failed)
	}
	at := b.OpenUntil()
	assert.Equal(t, Open, b.StateAt(at-1), "still cooling down")
	assert.Equal(t, HalfOpen, b.StateAt(at), "what the next execution finds")
	assert.Equal(t, Open, b.State(), "StateAt moves nothing")
	ok, probe, ch := b.Admit(at)
	require.True(t, ok && probe)
	assert.Equal(t, Change{Open, HalfOpen}, ch)
	assert.Equal(t, HalfOpen, b.StateAt(at))
}

// TestProbeOfAnEarlierRound: a probe still running when another
// execution's success closed the breaker gives up no slot when it ends:
// the probe of the next half-open round keeps running alone.
func TestProbeOfAnEarlierRound(t *testing.T) {
	b := New(policy)
	now := int64(time.Hour)
	for range 3 {
		b.Record(now, Failed)
	}
	ok, probe, _ := b.Admit(b.OpenUntil())
	require.True(t, ok && probe)
	b.StartProbe(7)
	assert.Equal(t, Change{HalfOpen, Closed}, b.Record(b.OpenUntil(), Healthy), "an execution of before the trip")
	for range 3 {
		b.Record(b.OpenUntil(), Failed)
	}
	ok, probe, _ = b.Admit(b.OpenUntil())
	require.True(t, ok && probe)
	b.StartProbe(8)
	b.EndProbe(7) // the earlier round's probe ends
	ok, _, _ = b.Admit(b.OpenUntil())
	assert.False(t, ok, "one probe at a time")
	assert.True(t, b.Probing(8))
	assert.False(t, b.Probing(7))
	b.EndProbe(8)
	ok, _, _ = b.Admit(b.OpenUntil())
	assert.True(t, ok, "the probe's slot is free again")
}
