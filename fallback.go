package dispatch

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/coalescer/dispatch/internal/breaker"
	"github.com/coalescer/dispatch/internal/due"
	"github.com/coalescer/dispatch/internal/fallback"
)

// checkFallback runs on the clock: every tenth of the window it checks the
// thresholds (switching to Sync when one is crossed) or, after an automatic
// fallback, whether the cool-down return is due. While nothing it watches
// can change it parks, and wakeFallback resumes it: an idle dispatcher
// does not wake. Once Close has begun it switches nothing, as SetMode
// does not: the drain runs in the mode Close found.
func (d *Dispatcher[K, T]) checkFallback(now int64, ob *outbox[K, T]) {
	if d.drain.closing {
		return
	}
	f := d.fallback
	if ok, at := f.Due(now); !ok {
		if at != 0 {
			d.due.Set(due.Check, at)
		}
		return
	}
	switch sw, reason := f.Check(now, d.fallbackFacts()); sw {
	case fallback.ToSync:
		d.switchMode(ModeSync, reason, ob)
	case fallback.ToAsync:
		d.switchMode(ModeAsync, reason, ob)
	}
	if at := f.Next(d.fallbackFacts()); at != 0 {
		d.due.Set(due.Check, at)
	}
}

// fallbackFacts is what the fallback looks at besides its own windows.
func (d *Dispatcher[K, T]) fallbackFacts() fallback.Facts {
	in := fallback.Facts{Sync: d.mode == ModeSync, Live: d.calls.n, Backlog: d.calls.n - d.running}
	if b := d.gate.breaker; b != nil && b.State() != breaker.Closed {
		in.CircuitOpen, in.CircuitSince = true, b.Since()
	}
	return in
}

// FallbackPolicy switches to ModeSync, as SetMode would, when a threshold
// is crossed, and records the values in Stats.FallbackReason. A zero
// threshold is not checked; at least one must be set. Once Close is
// called, it switches nothing, either way: what is queued drains as
// Close promises, not cancelled with ErrFallback.
type FallbackPolicy struct {
	// Window is the span thresholds are measured over, checked every
	// tenth of it while there is work (default 10s; at least 10ms).
	Window     time.Duration
	MaxBacklog int // more calls than this wait to run ("backlog")
	// MaxQueueWaitP99: the window's p99 queue wait exceeds it
	// ("queue_wait"); MaxFailureRatio, below 1: more than this fraction
	// of the window's finished calls failed ("failure_ratio"); each once
	// MinSamples calls (default 20) counted.
	MaxQueueWaitP99 time.Duration
	MaxFailureRatio float64
	MinSamples      int
	MaxCircuitOpen  time.Duration // the circuit stayed not closed longer ("circuit_open")
	// ReturnAfter, if set, switches back to ModeAsync this long after a
	// fallback (reason "cool_down"), unless SetMode was called meanwhile;
	// else only SetMode does. Back in ModeAsync, by either, the thresholds
	// judge the calls from then on: those of the window before do not
	// count, so the ones that made it fall back do not switch it again.
	// MaxBacklog and MaxCircuitOpen judge the present, as always.
	ReturnAfter time.Duration
}

// minFallbackWindow is the shortest FallbackPolicy.Window.
const minFallbackWindow = 10 * time.Millisecond

func (p *FallbackPolicy) validate() error {
	const f = "Rollout.Fallback."
	switch {
	case p.Window < 0 || (p.Window > 0 && p.Window < minFallbackWindow):
		return fieldErr(f+"Window", p.Window, fmt.Sprintf("must be at least %v (0 means the default)", minFallbackWindow))
	case p.MaxQueueWaitP99 < 0:
		return fieldErr(f+"MaxQueueWaitP99", p.MaxQueueWaitP99, "must not be negative")
	case p.MaxCircuitOpen < 0:
		return fieldErr(f+"MaxCircuitOpen", p.MaxCircuitOpen, "must not be negative")
	case p.ReturnAfter < 0:
		return fieldErr(f+"ReturnAfter", p.ReturnAfter, "must not be negative")
	case p.MaxBacklog < 0:
		return fieldErr(f+"MaxBacklog", p.MaxBacklog, "must not be negative")
	case p.MinSamples < 0:
		return fieldErr(f+"MinSamples", p.MinSamples, "must not be negative")
	case p.MaxFailureRatio < 0 || p.MaxFailureRatio >= 1 || math.IsNaN(p.MaxFailureRatio):
		// 1 too: more than all of the calls never fail.
		return fieldErr(f+"MaxFailureRatio", p.MaxFailureRatio, "must be in [0, 1)")
	case p.MaxBacklog == 0 && p.MaxQueueWaitP99 == 0 && p.MaxFailureRatio == 0 && p.MaxCircuitOpen == 0:
		return errors.New("dispatch: Config.Rollout.Fallback: no threshold set")
	}
	p.Window = cmp.Or(p.Window, 10*time.Second)
	p.MinSamples = cmp.Or(p.MinSamples, 20)
	return nil
}

// fallbackPolicy is p as the fallback takes it.
func (p *FallbackPolicy) fallbackPolicy() fallback.Policy {
	return fallback.Policy{
		Window: p.Window, MaxBacklog: p.MaxBacklog, MaxQueueWaitP99: p.MaxQueueWaitP99,
		MaxFailureRatio: p.MaxFailureRatio, MinSamples: p.MinSamples,
		MaxCircuitOpen: p.MaxCircuitOpen, ReturnAfter: p.ReturnAfter,
	}
}
