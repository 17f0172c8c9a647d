package scheduler

import (
	"math"
	"sync"
	"time"
)

// paceHeadroom is how many times the client's rate the paced status
// patches may reach at the latency last observed: twice, so that the
// client's token bucket, not the cap, is what limits them whenever it
// grants tokens — a burst it has saved up drains at twice its rate — and
// so that a latency that grows between two estimates does not at once
// make the cap the limit.
const paceHeadroom = 2

// paceSmoothing is the weight of each new execution time in the moving
// average the cap follows (1/8, TCP's for its round-trip time): a few
// slow patches raise the cap a little, a server that slows down for good
// raises it within some dozens of patches.
const paceSmoothing = 1.0 / 8

// pacer is Options.PaceStatusPatches: it caps the status patches
// executing at once at paceHeadroom × the client's rate × their average
// execution time, rounded up, at least 1 and at most the workers not kept
// for bindings. By Little's law that many in flight carry twice the rate,
// so the patches keep the rate however slow the server or the machine
// get; and they put no more at the server than that, so that a binding
// sent meanwhile does not queue there behind a burst of them. The cap is
// the core's MaxInFlight of the PodStatusPatch tenant, changed as the
// average moves (dispatch.Dispatcher.SetTenantMaxInFlight).
type pacer struct {
	qps  float64           // the client's rate: its bucket's QPS
	most int               // the workers not kept for bindings
	set  func(n int) error // sets the cap

	mu   sync.Mutex
	avg  float64 // seconds
	seen bool    // avg holds an execution's time: the first sets it
	cap  int     // the cap last set
}

// newPacer returns the pacer of a client whose bucket grants qps tokens a
// second, on workers of which reserved are kept for bindings, that sets
// the cap with set; it sets the first cap, 1, at once. It returns nil if
// there is no rate to follow (qps not positive or not finite): a bucket
// that grants without limit.
func newPacer(qps float64, workers, reserved int, set func(int) error) *pacer {
	if !(qps > 0) || math.IsInf(qps, 1) {
		return nil
	}
	p := &pacer{qps: qps, most: max(workers-reserved, 1), set: set, cap: 1}
	_ = set(1) // the core refuses only a negative cap
	return p
}

// observe takes a status patch's execution time into the average and
// moves the cap if the average asks for another. It runs on the worker,
// after the execution, outside the core's lock.
func (p *pacer) observe(elapsed time.Duration) {
	s := max(elapsed.Seconds(), 0)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.seen {
		p.avg, p.seen = s, true
	} else {
		p.avg += paceSmoothing * (s - p.avg)
	}
	n := p.most
	if f := math.Ceil(paceHeadroom * p.qps * p.avg); f < float64(p.most) {
		n = max(int(f), 1)
	}
	if n != p.cap {
		_ = p.set(n) // never negative: the core takes it
		p.cap = n
	}
}

// current returns the cap last set.
func (p *pacer) current() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cap
}
