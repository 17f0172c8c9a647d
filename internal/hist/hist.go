// Package hist is a fixed-bucket latency histogram, and a sliding window of
// them. Observing is an index computation and an increment, with no
// allocation. It is not safe for concurrent use: the dispatcher guards it
// with its lock.
package hist

import (
	"math/bits"
	"time"
)

// NumBuckets is the number of buckets: enough for every positive
// time.Duration.
const NumBuckets = 128

// Hist counts durations in buckets that grow by a factor of 1.5 then 4/3 in
// turn: bucket 2k holds [2^k, 1.5×2^k) ns and bucket 2k+1 holds
// [1.5×2^k, 2^(k+1)). A bucket's upper bound overstates any value in it by
// at most 50%, and its lower bound understates it by at most a third.
type Hist struct {
	n      uint64
	counts [NumBuckets]uint64
}

// Index is the bucket of d; durations below 1ns count as 1ns.
func Index(d time.Duration) int {
	ns := uint64(max(d, 1))
	k := bits.Len64(ns) - 1
	i := 2 * k
	if k > 0 && ns&(1<<(k-1)) != 0 {
		i++
	}
	return i
}

// Upper is the exclusive upper bound of bucket i.
func Upper(i int) time.Duration {
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

// Lower is the inclusive lower bound of bucket i.
func Lower(i int) time.Duration {
	if i <= 1 {
		return 1
	}
	return Upper(i - 1)
}

// Observe counts d.
func (h *Hist) Observe(d time.Duration) {
	h.counts[Index(d)]++
	h.n++
}

// Count is the number of observations.
func (h *Hist) Count() uint64 { return h.n }

// Add adds o's observations to h.
func (h *Hist) Add(o *Hist) {
	h.n += o.n
	for i, c := range o.counts {
		h.counts[i] += c
	}
}

// bucket returns the bucket holding quantile q (0 ≤ q ≤ 1), or -1 if h is
// empty.
func (h *Hist) bucket(q float64) int {
	if h.n == 0 {
		return -1
	}
	rank := uint64(q*float64(h.n-1)) + 1
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return i
		}
	}
	return NumBuckets - 1
}

// Quantile returns the upper bound of the bucket holding quantile q: at
// least the true quantile, at most 50% more. It is 0 for an empty Hist.
func (h *Hist) Quantile(q float64) time.Duration {
	if i := h.bucket(q); i >= 0 {
		return Upper(i)
	}
	return 0
}

// QuantileAtLeast returns the lower bound of the bucket holding quantile q:
// at most the true quantile, at least two thirds of it. It is 0 for an
// empty Hist.
func (h *Hist) QuantileAtLeast(q float64) time.Duration {
	if i := h.bucket(q); i >= 0 {
		return Lower(i)
	}
	return 0
}

// Recent is a histogram of the last Parts × width nanoseconds: a ring of
// histograms, each covering width; observing clears the one it lands in if
// that one is from an older round.
type Recent struct {
	width int64
	// cur is the part that now fell in last, and curStart its start: an
	// observation in the same part, the usual case, skips the divisions.
	cur      int
	curStart int64
	parts    [Parts]struct {
		start int64
		h     Hist
	}
}

// Parts is the number of histograms a Recent keeps.
const Parts = 6

// NewRecent returns a Recent covering span (at least Parts ns).
func NewRecent(span time.Duration) Recent {
	return Recent{width: max(int64(span)/Parts, 1)}
}

// Observe counts d at time now (ns on any monotonic clock; now ≥ 0).
func (r *Recent) Observe(now int64, d time.Duration) {
	if now-r.curStart >= r.width || now < r.curStart || r.curStart == 0 {
		start := now - now%r.width
		r.cur, r.curStart = int((now/r.width)%Parts), start
		if p := &r.parts[r.cur]; p.start != start {
			p.start, p.h = start, Hist{}
		}
	}
	r.parts[r.cur].h.Observe(d)
}

// Sum returns the observations still inside the window at now.
func (r *Recent) Sum(now int64) Hist {
	var sum Hist
	oldest := now - now%r.width - (Parts-1)*r.width
	for i := range r.parts {
		if p := &r.parts[i]; p.start >= oldest && p.start <= now && p.h.n > 0 {
			sum.Add(&p.h)
		}
	}
	return sum
}
