package dispatch

import (
	"math/bits"
	"time"
)

// hist is a fixed-bucket latency histogram: observing is an index
// computation and an increment, with no allocation. Bucket 2k holds
// durations in [2^k, 1.5×2^k) ns and bucket 2k+1 those in [1.5×2^k, 2^(k+1)),
// so a bucket's upper bound overstates a value by at most 50%.
type hist struct {
	n      uint64
	counts [128]uint64
}

func histIndex(d time.Duration) int {
	ns := uint64(max(d, 1))
	k := bits.Len64(ns) - 1
	i := 2 * k
	if k > 0 && ns&(1<<(k-1)) != 0 {
		i++
	}
	return i
}

// histUpper is the (exclusive) upper bound of bucket i.
func histUpper(i int) time.Duration {
	k := i / 2
	if i%2 == 0 {
		if k == 0 {
			return 2 // bucket 0 is [1, 2); bucket 1 stays empty
		}
		return time.Duration(3) << (k - 1)
	}
	if k >= 62 {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(2) << k
}

func (h *hist) observe(d time.Duration) {
	h.counts[histIndex(d)]++
	h.n++
}

func (h *hist) add(o *hist) {
	h.n += o.n
	for i, c := range o.counts {
		h.counts[i] += c
	}
}

// quantile returns the upper bound of the bucket holding quantile q.
func (h *hist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n-1)) + 1
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return histUpper(i)
		}
	}
	return histUpper(len(h.counts) - 1)
}

func (h *hist) quantiles() Quantiles {
	return Quantiles{Count: h.n, P50: h.quantile(0.5), P90: h.quantile(0.9), P99: h.quantile(0.99)}
}

// recentHist is a histogram of the last LatencyWindow: a ring of
// histograms, each covering a sixth of the window; observing clears the
// one it lands in if that one is from an older round.
type recentHist struct {
	parts [recentParts]struct {
		start int64
		h     hist
	}
}

const (
	recentParts = 6
	recentWidth = int64(LatencyWindow) / recentParts
)

func (r *recentHist) observe(now int64, d time.Duration) {
	start := now - now%recentWidth
	p := &r.parts[(now/recentWidth)%recentParts]
	if p.start != start {
		p.start, p.h = start, hist{}
	}
	p.h.observe(d)
}

// quantiles summarises the parts still inside the window at now.
func (r *recentHist) quantiles(now int64) Quantiles {
	var sum hist
	oldest := now - now%recentWidth - (recentParts-1)*recentWidth
	for i := range r.parts {
		if p := &r.parts[i]; p.start >= oldest && p.start <= now && p.h.n > 0 {
			sum.add(&p.h)
		}
	}
	return sum.quantiles()
}
