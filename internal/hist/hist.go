// Package hist is a fixed-bucket latency histogram, and a sliding window of
// them. Observing is an index computation and an increment, with no
// allocation. It is not safe for concurrent use: the dispatcher guards it
// with its lock.
package hist

import (
	"math/bits"
	"time"

	"github.com/coalescer/dispatch/internal/window"
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

// Recent is a histogram of the last span: a ring (window.Ring) of Parts
// histograms, each covering span/Parts.
type Recent struct {
	ring window.Ring[Hist]
}

// Parts is the number of histograms a Recent keeps.
const Parts = 6

// NewRecent returns a Recent covering span (at least Parts ns).
func NewRecent(span time.Duration) Recent {
	return Recent{window.NewRing[Hist](span, Parts)}
}

// Observe counts d at time now (ns on any monotonic clock; now ≥ 0).
func (r *Recent) Observe(now int64, d time.Duration) {
	r.ring.At(now).Observe(d)
}

// Sum returns the observations still inside the window at now.
func (r *Recent) Sum(now int64) Hist {
	var sum Hist
	r.ring.Each(now, func(h *Hist) {
		if h.n > 0 {
			sum.Add(h)
		}
	})
	return sum
}
