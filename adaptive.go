package dispatch

import (
	"cmp"
	"fmt"
	"math"
	"time"

	"github.com/coalescer/dispatch/internal/adaptive"
)

// AdaptivePolicy adapts the limit on concurrent executions to the server,
// like TCP Vegas: +1 per limit's worth of executions within Tolerance;
// −10% to −50%, in proportion, when the median of a block of executions
// (at least 64, and twice the limit) exceeds Tolerance × the lowest block
// median of the last Window, so the queue forms here, where priority
// holds; −25% on a timeout; −50% on a Retry-After, which also holds
// non-urgent executions for the time asked, at most RetryPolicy.MaxBackoff.
// It falls at most once per twice the baseline (and 10ms).
type AdaptivePolicy struct {
	MinWorkers int           // the floor of the limit (default 1)
	Tolerance  float64       // strain: a block median over Tolerance × the baseline (default 2)
	Window     time.Duration // how long the baseline is remembered (default 30s)
}

func (p *AdaptivePolicy) validate(workers int) error {
	switch {
	case p.MinWorkers < 0:
		return fieldErr("Start.Adaptive.MinWorkers", p.MinWorkers, "must not be negative")
	case p.MinWorkers > workers:
		return fieldErr("Start.Adaptive.MinWorkers", p.MinWorkers, fmt.Sprintf("must not exceed Workers (%d)", workers))
	case p.Tolerance < 0 || math.IsNaN(p.Tolerance) || (p.Tolerance > 0 && p.Tolerance < 1):
		return fieldErr("Start.Adaptive.Tolerance", p.Tolerance, "must be at least 1")
	case p.Window < 0:
		return fieldErr("Start.Adaptive.Window", p.Window, "must not be negative")
	}
	p.MinWorkers = cmp.Or(p.MinWorkers, 1)
	p.Tolerance = cmp.Or(p.Tolerance, 2)
	p.Window = cmp.Or(p.Window, 30*time.Second)
	return nil
}

// limitPolicy is p as the adaptive limit takes it.
func (p *AdaptivePolicy) limitPolicy() adaptive.Policy {
	return adaptive.Policy{MinWorkers: p.MinWorkers, Tolerance: p.Tolerance, Window: p.Window}
}

// strainOf classifies a failed attempt for the adaptive limit, by what
// its error said (attempt.readErr).
func strainOf(a *attemptEnd) (adaptive.Strain, time.Duration) {
	switch {
	case a.err == nil || a.class != ClassRetry:
		return adaptive.None, 0
	case a.hint > 0:
		return adaptive.Throttled, a.hint
	case a.timedOut:
		return adaptive.Timeout, 0
	}
	return adaptive.None, 0
}
