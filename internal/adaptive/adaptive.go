// Package adaptive is a limit on concurrent executions that follows what
// the server says, like TCP Vegas: it grows by one per limit's worth of
// executions within a tolerance of the server's baseline latency, and falls
// — in proportion to the strain, on a timeout, or on a Retry-After, which
// also holds other executions for the time asked — at most once per calm
// period.
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
//
// A Limit takes times and verdicts and returns the limit; it is not safe
// for concurrent use: its owner guards it with its lock.
package adaptive

import (
	"time"

	"github.com/coalescer/dispatch/internal/hist"
	"github.com/coalescer/dispatch/internal/sat"
)

// Policy is a Limit's configuration, validated and with its defaults
// filled in by the owner.
type Policy struct {
	MinWorkers int           // the floor of the limit
	Tolerance  float64       // strain: a block median over Tolerance × the baseline
	Window     time.Duration // how long the baseline is remembered
}

// Strain is what an execution says about the server.
type Strain uint8

const (
	None      Strain = iota // healthy
	Timeout                 // timed out
	Throttled               // asked to slow down (Retry-After)
)

// Limit is the running state of an adaptive limit. Its zero value is not
// usable: create one with New.
type Limit struct {
	p       Policy
	limit   int   // concurrent executions allowed now
	max     int   // the ceiling: the workers there are
	grow    int   // healthy executions since the limit last grew
	maxHold int64 // the longest hold a Retry-After puts on other calls
	block   hist.Hist
	best    minRing // block medians: the baseline is the lowest in the window
	calm    int64   // no decrease before this time: one burst counts once
	hold    int64   // no held execution starts before this time (a Retry-After)
}

// blockMin is the fewest executions a latency block holds: enough that a
// block's median is stable for a server whose latency spreads tenfold.
const blockMin = 64

// New returns a limit that starts at workers, its ceiling; a Retry-After
// holds other executions for at most maxHold.
func New(p Policy, workers int, maxHold time.Duration) *Limit {
	return &Limit{p: p, limit: workers, max: workers, maxHold: int64(maxHold), best: newMinRing(p.Window)}
}

// Limit returns the number of concurrent executions allowed now.
func (a *Limit) Limit() int { return a.limit }

// Hold returns the time before which executions the owner holds for a
// Retry-After do not start (0, or past: none).
func (a *Limit) Hold() int64 { return a.hold }

// Record takes an execution's latency and strain (with the server's
// Retry-After, if throttled), and returns the limit before and after.
func (a *Limit) Record(now int64, rtt time.Duration, s Strain, retryAfter time.Duration) (from, to int) {
	from = a.limit
	switch s {
	case Throttled:
		a.hold = max(a.hold, sat.Add(now, min(int64(retryAfter), a.maxHold)))
		a.decrease(now, 0.5)
	case Timeout:
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
func (a *Limit) endBlock(now int64) {
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
func (a *Limit) decrease(now int64, factor float64) {
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
