package dispatch

import (
	"time"

	"github.com/coalescer/dispatch/internal/hist"
)

// This file is the deadline check (StartPolicy.NoDeadlineCheck): a call
// whose deadline is closer than its label's usual execution time is not
// started. It runs under the dispatcher's lock.

// labelTimes are the recent execution times of one label, and the
// deadline check's estimate taken from them, refreshed at most every
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
	if d.cfg.Start.NoDeadlineCheck {
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
		lt = &labelTimes{label: c.label, recent: hist.NewRecent(latencyWindow)}
		d.labelTimes[c.label] = lt
	}
	d.lastTimes = lt
	if c.checkProbe {
		c.checkProbe = false
		if ran && rt < lt.est {
			// The server is faster than the estimate says: start over.
			lt.recent, lt.est, lt.at = hist.NewRecent(latencyWindow), 0, 0
		}
	}
	if ran {
		lt.recent.Observe(now, rt)
		lt.last = now
	}
}

// unfinishable reports whether c cannot finish by its waiters' latest
// deadline: it is closer than the deadline check's estimate for c's label. A
// call it would refuse starts as a probe if none of its label has for a
// while (see labelTimes).
func (d *Dispatcher[K, T]) unfinishable(c *call[K, T], now int64) bool {
	sc := &d.cfg.Start
	if sc.NoDeadlineCheck {
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
		if h.Count() >= uint64(sc.DeadlineSamples) {
			lt.est = h.QuantileAtLeast(sc.DeadlineQuantile)
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
