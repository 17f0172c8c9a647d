// Package window counts events in a sliding window of fixed buckets, so that
// a rate (failures per execution, retries per first attempt) costs no
// allocation or timer per event. It is not safe for concurrent use: the
// dispatcher guards it with its lock.
package window

import "time"

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
	width int64 // ns per bucket
	// cur is the bucket now fell in last, and curStart its start: a count
	// in the same bucket, the usual case, skips the divisions.
	cur      int
	curStart int64
	buckets  [Buckets]bucket
}

type bucket struct {
	start int64
	Counts
}

// New returns an empty Window covering span.
func New(span time.Duration) Window {
	return Window{width: max(int64(span)/Buckets, 1)}
}

// At returns the counts of the bucket holding now, to add to; the bucket is
// cleared first if it is from an older round. now is ns on any monotonic
// clock, ≥ 0.
func (w *Window) At(now int64) *Counts {
	if now-w.curStart >= w.width || now < w.curStart || w.curStart == 0 {
		start := now - now%w.width
		w.cur, w.curStart = int((now/w.width)%Buckets), start
		if b := &w.buckets[w.cur]; b.start != start {
			*b = bucket{start: start}
		}
	}
	return &w.buckets[w.cur].Counts
}

// Sum totals the buckets still inside the window at now.
func (w *Window) Sum(now int64) Counts {
	var s Counts
	oldest := now - now%w.width - (Buckets-1)*w.width
	for i := range w.buckets {
		b := &w.buckets[i]
		if b.start >= oldest && b.start <= now {
			s.Total += b.Total
			s.Marked += b.Marked
		}
	}
	return s
}

// Step is how often a check over the window should run: once per bucket.
func (w *Window) Step() int64 { return w.width }
