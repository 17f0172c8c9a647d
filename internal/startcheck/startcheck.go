// Package startcheck is the deadline check a dispatcher makes before it
// starts a call: a call whose deadline is closer than its label's usual
// execution time — a low quantile of the label's recent executions — is
// not started, since it could not finish in time.
//
// Calls the check refuses add no sample, so an estimate could outlive the
// server's slowness: after a speed-up nothing would ever show it. So the
// check lets one refused call of a label start anyway — a probe — once no
// call of the label has ended, nor been let through as a probe, for
// max(1s, 2 × estimate); a probe that finishes faster than the estimate
// shows the server changed, and the label's history is dropped, so its
// calls start again until new samples judge them.
//
// A Check takes times and labels and returns decisions. It is not safe for
// concurrent use: its owner guards it with its lock.
package startcheck

import (
	"time"

	"github.com/coalescer/dispatch/internal/hist"
)

// Policy is a check's configuration, validated and with its defaults
// filled in by the owner.
type Policy struct {
	Quantile float64       // the quantile of a label's executions taken as its usual time
	Samples  int           // executions of a label before it is judged
	Window   time.Duration // the span of executions the quantile is taken over
}

const (
	// maxLabels bounds the labels whose execution times are kept; calls
	// of labels beyond it are not checked. Labels come from a small fixed
	// set by contract; this is the safety net.
	maxLabels = 64
	// estimateEvery is how long an estimate is used before it is taken
	// again from the samples.
	estimateEvery = int64(100 * time.Millisecond)
)

// Check is the start check's state. Its zero value is not usable: create
// one with New.
type Check struct {
	p      Policy
	labels map[string]*times
	last   *times // the label Observe saw last
}

// times are the recent execution times of one label, and the estimate
// taken from them.
type times struct {
	label   string
	recent  hist.Recent
	est     time.Duration // 0: not enough samples
	at      int64         // when est was taken
	probeAt int64         // when a refused call last started as a probe
	last    int64         // when an execution of the label last ended
}

// New returns a check that has seen no execution.
func New(p Policy) *Check { return &Check{p: p, labels: map[string]*times{}} }

// Observe records, at now, the end of an attempt of a call of label: its
// execution time rt if it ran. probe says the call started as the check's
// probe; if it ran faster than the estimate, the label's history is
// dropped.
func (k *Check) Observe(label string, now int64, rt time.Duration, ran, probe bool) {
	lt := k.last
	if lt == nil || lt.label != label { // one label, the usual case: no map lookup
		lt = k.labels[label]
	}
	if lt == nil {
		if len(k.labels) >= maxLabels {
			return
		}
		lt = &times{label: label, recent: hist.NewRecent(k.p.Window)}
		k.labels[label] = lt
	}
	k.last = lt
	if probe && ran && rt < lt.est {
		// The server is faster than the estimate says: start over.
		lt.recent, lt.est, lt.at = hist.NewRecent(k.p.Window), 0, 0
	}
	if ran {
		lt.recent.Observe(now, rt)
		lt.last = now
	}
}

// Refuse reports whether a call of label whose waiters' latest deadline is
// deadline (0: none) cannot finish by it, starting at now. A call it would
// refuse starts as a probe (probe) if none of its label has for a while.
func (k *Check) Refuse(label string, deadline, now int64) (refuse, probe bool) {
	if deadline == 0 {
		return false, false
	}
	lt := k.labels[label]
	if lt == nil {
		return false, false
	}
	if lt.at == 0 || now-lt.at >= estimateEvery {
		h := lt.recent.Sum(now)
		lt.est, lt.at = 0, now
		if h.Count() >= uint64(k.p.Samples) {
			lt.est = h.QuantileAtLeast(k.p.Quantile)
		}
	}
	if lt.est == 0 || deadline-now >= int64(lt.est) {
		return false, false
	}
	if now-max(lt.last, lt.probeAt) >= max(int64(time.Second), 2*int64(lt.est)) {
		lt.probeAt = now
		return false, true
	}
	return true, false
}
