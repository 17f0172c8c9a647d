package dispatch

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/coalescer/dispatch/internal/hist"
	"github.com/coalescer/dispatch/internal/sat"
)

// This file decides whether the next execution may start at all: the
// adaptive concurrency limit (AdaptivePolicy), the reservation of workers
// for urgent calls (Reservation), and the check that a call can still
// finish by its deadline (StartCheck). Everything here runs under the
// dispatcher's lock.

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

// lowLimit is how many worker executions below the reservation's priority
// may run: the rest of the concurrency, and at least one.
func (d *Dispatcher[K, T]) lowLimit() int {
	return max(d.concurrency()-d.cfg.Reserve.Workers, 1)
}

// mayProbe reports whether c may start while a server's Retry-After holds
// the other calls (AdaptivePolicy): a call that may use a reserved worker
// is never held, so that a binding does not wait out a hold that a status
// patch drew; if the server throttles it too, its own retry waits.
func (d *Dispatcher[K, T]) mayProbe(c *call[K, T]) bool {
	return d.cfg.Reserve.Workers > 0 && d.urgent(c)
}

// urgent reports whether c may use a reserved worker: its priority is at
// least the reservation's. Aging never makes a call urgent: the reservation
// starts a band (Config.validate), and aging stays within bands.
func (d *Dispatcher[K, T]) urgent(c *call[K, T]) bool {
	return c.prio >= d.cfg.Reserve.MinPriority
}

// labelTimes are the recent execution times of one label, and the
// StartCheck estimate taken from them, refreshed at most every
// estimateEvery.
//
// Calls the check refuses add no sample, so an estimate could outlive the
// server's slowness: after a speed-up nothing would ever show it. So the
// check lets one refused call of a label start anyway — a probe — once no
// call of the label has ended, nor been let through as a probe, for
// max(1s, 2 × estimate); a probe that finishes faster than the
// estimate shows the server changed, and the label's history is dropped,
// so its calls start again until new samples judge them.
type labelTimes struct {
	label   string
	recent  hist.Recent
	est     time.Duration // 0: not enough samples
	at      int64         // when est was taken
	probeAt int64         // when a refused call last started as a probe
	last    int64         // when an execution of the label last ended
}

const (
	// maxLabelTimes bounds the labels whose execution times are kept for
	// StartCheck; calls of labels beyond it are not checked. Labels come
	// from a small fixed set by contract; this is the safety net.
	maxLabelTimes = 64
	estimateEvery = int64(100 * time.Millisecond)
)

// observeExec records an execution time for c's label, and ends a probe.
func (d *Dispatcher[K, T]) observeExec(c *call[K, T], now int64, rt time.Duration, ran bool) {
	if d.cfg.StartCheck.Disabled {
		return
	}
	lt := d.lastTimes
	if lt == nil || lt.label != c.label { // one label, the usual case: no map lookup
		lt = d.labelTimes[c.label]
	}
	if lt == nil {
		if len(d.labelTimes) >= maxLabelTimes {
			return
		}
		lt = &labelTimes{label: c.label, recent: hist.NewRecent(LatencyWindow)}
		d.labelTimes[c.label] = lt
	}
	d.lastTimes = lt
	if c.checkProbe {
		c.checkProbe = false
		if ran && rt < lt.est {
			// The server is faster than the estimate says: start over.
			lt.recent, lt.est, lt.at = hist.NewRecent(LatencyWindow), 0, 0
		}
	}
	if ran {
		lt.recent.Observe(now, rt)
		lt.last = now
	}
}

// unfinishable reports whether c cannot finish by its waiters' latest
// deadline: it is closer than the StartCheck estimate for c's label. A
// call it would refuse starts as a probe if none of its label has for a
// while (see labelTimes).
func (d *Dispatcher[K, T]) unfinishable(c *call[K, T], now int64) bool {
	sc := &d.cfg.StartCheck
	if sc.Disabled {
		return false
	}
	dl := c.execDeadline()
	if dl == 0 {
		return false
	}
	lt := d.labelTimes[c.label]
	if lt == nil {
		return false
	}
	if lt.at == 0 || now-lt.at >= estimateEvery {
		h := lt.recent.Sum(now)
		lt.est, lt.at = 0, now
		if h.Count() >= uint64(sc.MinSamples) {
			lt.est = h.QuantileAtLeast(sc.Quantile)
		}
	}
	if lt.est == 0 || dl-now >= int64(lt.est) {
		return false
	}
	if now-max(lt.last, lt.probeAt) >= max(int64(time.Second), 2*int64(lt.est)) {
		lt.probeAt = now
		c.checkProbe = true
		return false
	}
	return true
}
