package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"github.com/coalescer/dispatch/internal/hist"
	"github.com/coalescer/dispatch/internal/sat"
)

// This file is adaptive concurrency (StartPolicy.Adaptive): the limit on
// concurrent executions that follows what the server says. It runs under
// the dispatcher's lock.

// AdaptivePolicy adapts the number of concurrent executions to the API
// server (Config.Start.Adaptive), in the spirit of TCP Vegas and gradient
// limiters. The limit grows by one per limit's worth of executions within
// the latency tolerance, and shrinks on strain:
//
//   - latency, judged per block of executions (at least 64, and twice the
//     limit): when a block's median exceeds Tolerance × the baseline — the
//     lowest block median of the last Window, the server least loaded — the
//     limit falls in proportion, by a tenth to a half. A server whose
//     latency varies but does not grow with load keeps its concurrency;
//     one that queues sheds it until its median is back within the
//     tolerance, so the queue forms in the dispatcher, where priority
//     holds. The baseline is learnt from lighter load, and forgotten after
//     Window: a server that stays slower becomes the new normal;
//   - a timeout: by a quarter;
//   - a Retry-After (429, 503): by half. It also holds new executions
//     until the time the server asked for, at most Retry.MaxBackoff,
//     except calls that may use reserved workers, which are never held.
//
// Decreases come at most once per twice the baseline (and 10ms). Stats and
// Observer.OnLimitChange show the limit. Zero fields mean their defaults.
type AdaptivePolicy struct {
	// MinWorkers is the floor of the limit (default 1).
	MinWorkers int
	// Tolerance is how many times the baseline a block's median latency
	// may be before it counts as strain (default 2).
	Tolerance float64
	// Window is the span the baseline latency is taken over: how long the
	// dispatcher remembers the server's best (default 30s).
	Window time.Duration
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

// adaptive is the running state of an AdaptivePolicy.
//
// Latency is judged in blocks of executions, never one by one: a server
// whose latency varies widely but does not grow with load (2–20 ms, say)
// has many single executions far above its fastest, and judging each
// would shrink a healthy server's concurrency to the floor. A block's
// median is compared with the baseline, the lowest block median of the
// last Window: the server's typical latency when it was least loaded. A
// block whose median exceeds Tolerance × baseline is strain — the server
// queues, or slowed down — and the limit falls in proportion; the
// baseline forgets old blocks after Window, so a server that stays slower
// becomes the new normal and the limit grows back.
type adaptive struct {
	p       *AdaptivePolicy
	limit   int   // concurrent executions allowed now
	max     int   // Config.Workers
	grow    int   // healthy executions since the limit last grew
	maxHold int64 // the longest hold a Retry-After puts on other calls
	block   hist.Hist
	best    minRing // block medians: the baseline is the lowest in the window
	calm    int64   // no decrease before this time: one burst counts once
	hold    int64   // no execution below the reservation starts before this time (a Retry-After)
}

// blockMin is the fewest executions a latency block holds: enough that a
// block's median is stable for a server whose latency spreads tenfold.
const blockMin = 64

func newAdaptive(p *AdaptivePolicy, workers int, maxHold time.Duration) *adaptive {
	return &adaptive{p: p, limit: workers, max: workers, maxHold: int64(maxHold), best: newMinRing(p.Window)}
}

// strain is what an execution says about the server.
type strain uint8

const (
	strainNone      strain = iota // healthy
	strainTimeout                 // timed out
	strainThrottled               // asked to slow down (Retry-After)
)

// record takes an execution's latency and verdict, and returns the limit
// before and after.
func (a *adaptive) record(now int64, rtt time.Duration, s strain, retryAfter time.Duration) (from, to int) {
	from = a.limit
	switch s {
	case strainThrottled:
		a.hold = max(a.hold, sat.Add(now, min(int64(retryAfter), a.maxHold)))
		a.decrease(now, 0.5)
	case strainTimeout:
		a.decrease(now, 0.75)
	default:
		// Growth counts executions within the tolerance of the baseline,
		// so that a strained block does not grow back what it costs.
		if base := a.best.min(now); base == 0 || float64(rtt) <= a.p.Tolerance*float64(base) {
			if a.grow++; a.grow >= a.limit && a.limit < a.max {
				a.limit++
				a.grow = 0
			}
		}
		a.block.Observe(rtt)
		if a.block.Count() >= uint64(max(blockMin, 2*a.limit)) {
			a.endBlock(now)
		}
	}
	return from, a.limit
}

// endBlock judges the block just completed against the baseline, and adds
// its median to the window the baseline is taken from.
func (a *adaptive) endBlock(now int64) {
	med := a.block.Quantile(0.5)
	a.block = hist.Hist{}
	if base := a.best.min(now); base > 0 && float64(med) > a.p.Tolerance*float64(base) {
		// Fall in proportion to the strain: to the concurrency at which
		// the median would be back at the tolerance, between a tenth and
		// half less.
		a.decrease(now, min(max(a.p.Tolerance*float64(base)/float64(med), 0.5), 0.9))
	}
	a.best.add(now, med)
}

// decrease lowers the limit by factor, at most once per calm period.
func (a *adaptive) decrease(now int64, factor float64) {
	if now < a.calm {
		return
	}
	a.limit = max(a.p.MinWorkers, int(float64(a.limit)*factor))
	a.grow = 0
	a.calm = now + max(2*int64(a.best.min(now)), int64(10*time.Millisecond))
}

// minRing keeps the lowest value seen in each tenth of a sliding window.
type minRing struct {
	width int64
	slots [10]struct {
		start int64
		v     time.Duration
	}
}

func newMinRing(span time.Duration) minRing { return minRing{width: max(int64(span)/10, 1)} }

// add records v at now.
func (m *minRing) add(now int64, v time.Duration) {
	start := now - now%m.width
	s := &m.slots[(now/m.width)%10]
	if s.start != start || s.v == 0 {
		s.start, s.v = start, v
		return
	}
	s.v = min(s.v, v)
}

// min is the lowest value in the window at now, or 0 if none.
func (m *minRing) min(now int64) time.Duration {
	oldest := now - now%m.width - 9*m.width
	var low time.Duration
	for _, s := range m.slots {
		if s.v > 0 && s.start >= oldest && s.start <= now && (low == 0 || s.v < low) {
			low = s.v
		}
	}
	return low
}

// strainOf classifies a failed attempt for the adaptive limit.
func strainOf(err error, class Class) (strain, time.Duration) {
	if err == nil || class != ClassRetry {
		return strainNone, 0
	}
	if d, ok := retryAfter(err); ok {
		return strainThrottled, d
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return strainTimeout, 0
	}
	return strainNone, 0
}

// adapt feeds an attempt's end to the adaptive limit, if any.
func (d *Dispatcher[K, T]) adapt(a *attempt[K, T], now int64, ob *outbox[K, T]) {
	if d.adaptive == nil || !a.ran || a.callDone || a.panicked {
		return
	}
	s, hint := strainOf(a.err, a.class)
	from, to := d.adaptive.record(now, a.runTime, s, hint)
	if to > from {
		d.wakeWorker()
	}
	if obs := d.cfg.Observer; obs != nil && to != from {
		ob.notes = append(ob.notes, func() { obs.OnLimitChange(from, to) })
	}
}

// concurrency is the number of worker executions allowed now.
func (d *Dispatcher[K, T]) concurrency() int {
	if d.adaptive != nil {
		return d.adaptive.limit
	}
	return d.cfg.Workers
}
