// Package window keeps values in a sliding window of fixed buckets — event
// counts for a rate (failures per execution, retries per first attempt)
// here, latency histograms in package hist — so that observing costs no
// allocation or timer. It is not safe for concurrent use: the dispatcher
// guards it with its lock.
package window

import "time"

// Ring is a sliding window of buckets of V, each covering an equal part of
// its span. A bucket is zeroed when the clock comes back to it a round
// later.
type Ring[V any] struct {
	width int64 // ns per bucket
	// cur is the bucket now fell in last, and curStart its start: a value
	// in the same bucket, the usual case, skips the divisions.
	cur      int
	curStart int64
	buckets  []slot[V]
}

type slot[V any] struct {
	start int64
	v     V
}

// NewRing returns an empty Ring of n buckets covering span.
func NewRing[V any](span time.Duration, n int) Ring[V] {
	return Ring[V]{width: max(int64(span)/int64(n), 1), buckets: make([]slot[V], n)}
}

// At returns the bucket holding now, to add to; it is zeroed first if it is
// from an older round. now is ns on any monotonic clock, ≥ 0.
func (r *Ring[V]) At(now int64) *V {
	if now-r.curStart >= r.width || now < r.curStart || r.curStart == 0 {
		start := now - now%r.width
		r.cur, r.curStart = int((now/r.width)%int64(len(r.buckets))), start
		if b := &r.buckets[r.cur]; b.start != start {
			*b = slot[V]{start: start}
		}
	}
	return &r.buckets[r.cur].v
}

// Each calls f with every bucket still inside the window at now.
func (r *Ring[V]) Each(now int64, f func(*V)) {
	oldest := now - now%r.width - int64(len(r.buckets)-1)*r.width
	for i := range r.buckets {
		if b := &r.buckets[i]; b.start >= oldest && b.start <= now {
			f(&b.v)
		}
	}
}

// Step is the width of one bucket: how often a check over the window
// should run.
func (r *Ring[V]) Step() int64 { return r.width }

// Buckets is the number of buckets a Window keeps: the window slides by a
// tenth of its span.
const Buckets = 10

// Counts are two counters: Total counts events, Marked the events of
// interest among them (failures, say) — or, for a budget, the spending
// (retries) against the total allowance (first attempts).
type Counts struct {
	Total, Marked uint64
}

// Window sums Counts over its span.
type Window struct {
	Ring[Counts]
}

// New returns an empty Window covering span.
func New(span time.Duration) Window {
	return Window{NewRing[Counts](span, Buckets)}
}

// Sum totals the buckets still inside the window at now.
func (w *Window) Sum(now int64) Counts {
	var s Counts
	w.Each(now, func(c *Counts) {
		s.Total += c.Total
		s.Marked += c.Marked
	})
	return s
}
