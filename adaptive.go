package dispatch

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/coalescer/dispatch/internal/hist"
)

// This file decides whether the next execution may start at all: the
// adaptive concurrency limit (AdaptivePolicy), the reservation of workers
// for urgent calls (Reservation), and the check that a call can still
// finish by its deadline (StartCheck). Everything here runs under the
// dispatcher's lock.

// adaptive is the running state of an AdaptivePolicy.
type adaptive struct {
	p     *AdaptivePolicy
	limit int // concurrent executions allowed now
	max   int // Config.Workers
	grow  int // healthy executions since the limit last grew
	rtts  hist.Recent
	calm  int64 // no decrease before this time: one burst counts once
	hold  int64 // no execution starts before this time (a server's Retry-After)
}

func newAdaptive(p *AdaptivePolicy, workers int) *adaptive {
	return &adaptive{p: p, limit: workers, max: workers, rtts: hist.NewRecent(p.Window)}
}

// strain is what an execution says about the server.
type strain uint8

const (
	strainNone      strain = iota // healthy
	strainLatency                 // slower than Tolerance × baseline
	strainTimeout                 // timed out
	strainThrottled               // asked to slow down (Retry-After)
)

// record takes an execution's latency and verdict, and returns the limit
// before and after.
func (a *adaptive) record(now int64, rtt time.Duration, s strain, retryAfter time.Duration) (from, to int) {
	from = a.limit
	base := a.baseline(now)
	a.rtts.Observe(now, rtt)
	if s == strainNone && base > 0 && float64(rtt) > a.p.Tolerance*float64(base) {
		s = strainLatency
	}
	if s == strainThrottled {
		a.hold = max(a.hold, now+int64(retryAfter))
	}
	switch {
	case s == strainNone:
		if a.grow++; a.grow >= a.limit && a.limit < a.max {
			a.limit++
			a.grow = 0
		}
	case now >= a.calm:
		factor := 0.9 // strainLatency
		switch s {
		case strainTimeout:
			factor = 0.75
		case strainThrottled:
			factor = 0.5
		}
		a.limit = max(a.p.MinWorkers, int(float64(a.limit)*factor))
		a.grow = 0
		a.calm = now + max(2*int64(base), int64(10*time.Millisecond))
	}
	return from, a.limit
}

// baseline is a low quantile of recent latencies: what the server does
// when it is not strained. It is 0 until there are enough samples.
func (a *adaptive) baseline(now int64) time.Duration {
	h := a.rtts.Sum(now)
	if h.Count() < 10 {
		return 0
	}
	return h.QuantileAtLeast(0.05)
}

// strainOf classifies a failed attempt for the adaptive limit.
func strainOf(err error, class Class) (strain, time.Duration) {
	if err == nil || class != Retry {
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

// urgent reports whether c may use a reserved worker: its priority is at
// least the reservation's. Aging never makes a call urgent: the reservation
// starts a band (Config.validate), and aging stays within bands.
func (d *Dispatcher[K, T]) urgent(c *call[K, T]) bool {
	return c.prio >= d.cfg.Reserve.MinPriority
}

// labelTimes are the recent execution times of one label, and the
// StartCheck estimate taken from them, refreshed at most every
// estimateEvery.
type labelTimes struct {
	label  string
	recent *hist.Recent  // without Config.Label, the dispatcher's execTime
	est    time.Duration // 0: not enough samples
	at     int64         // when est was taken
}

const (
	// maxLabelTimes bounds the labels whose execution times are kept for
	// StartCheck; calls of labels beyond it are not checked. Labels come
	// from a small fixed set by contract; this is the safety net.
	maxLabelTimes = 64
	estimateEvery = int64(100 * time.Millisecond)
)

// observeExec records an execution time for c's label.
func (d *Dispatcher[K, T]) observeExec(c *call[K, T], now int64, rt time.Duration) {
	if d.cfg.StartCheck.Disabled || d.cfg.Label == nil {
		return // without labels, execTime holds the same times (New)
	}
	lt := d.lastTimes
	if lt == nil || lt.label != c.label { // one label, the usual case: no map lookup
		lt = d.labelTimes[c.label]
	}
	if lt == nil {
		if len(d.labelTimes) >= maxLabelTimes {
			return
		}
		r := hist.NewRecent(LatencyWindow)
		lt = &labelTimes{label: c.label, recent: &r}
		d.labelTimes[c.label] = lt
	}
	d.lastTimes = lt
	lt.recent.Observe(now, rt)
}

// unfinishable reports whether c cannot finish by its waiters' latest
// deadline: it is closer than the StartCheck estimate for c's label.
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
	return lt.est > 0 && dl-now < int64(lt.est)
}
