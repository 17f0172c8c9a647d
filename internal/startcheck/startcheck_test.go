package startcheck

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

const ms = int64(time.Millisecond)

var policy = Policy{Quantile: 0.1, Samples: 20, Window: time.Minute}

// warm gives label n executions of rt each, ending at now.
func warm(k *Check, label string, n int, now int64, rt time.Duration) {
	for range n {
		k.Observe(label, now, rt, true, false)
	}
}

func TestRefusesUnfinishable(t *testing.T) {
	k := New(policy)
	now := int64(time.Hour)
	refuse, _ := k.Refuse("bind", now+ms, now)
	assert.False(t, refuse, "an unknown label is not checked")
	warm(k, "bind", 19, now, 100*time.Millisecond)
	refuse, _ = k.Refuse("bind", now+ms, now)
	assert.False(t, refuse, "not before Samples executions")

	k = New(policy)
	warm(k, "bind", 20, now, 100*time.Millisecond)
	refuse, _ = k.Refuse("bind", now+50*ms, now)
	assert.True(t, refuse, "50ms left, executions take 100ms")
	refuse, _ = k.Refuse("bind", now+200*ms, now)
	assert.False(t, refuse, "time enough")
	refuse, _ = k.Refuse("bind", 0, now)
	assert.False(t, refuse, "no deadline")
}

func TestProbeAfterQuiet(t *testing.T) {
	k := New(policy)
	now := int64(time.Hour)
	warm(k, "bind", 20, now, 100*time.Millisecond)
	later := now + int64(time.Second)
	refuse, probe := k.Refuse("bind", later+50*ms, later)
	assert.False(t, refuse)
	assert.True(t, probe, "nothing ended for 1s: one refused call starts as a probe")
	refuse, probe = k.Refuse("bind", later+50*ms, later)
	assert.True(t, refuse, "one probe at a time")
	assert.False(t, probe)

	k.Observe("bind", later+10*ms, 10*time.Millisecond, true, true)
	refuse, _ = k.Refuse("bind", later+int64(time.Second)+50*ms, later+int64(time.Second))
	assert.False(t, refuse, "a fast probe dropped the label's history")
}

func TestBoundedLabels(t *testing.T) {
	k := New(policy)
	for i := range maxLabels + 10 {
		k.Observe(fmt.Sprint(i), 1, time.Millisecond, true, false)
	}
	assert.Len(t, k.labels, maxLabels)
}
