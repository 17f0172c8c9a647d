package writer

import (
	"sync/atomic"

	"github.com/coalescer/dispatch"
)

// Stats is a snapshot of a Writer: its queue, and what its desires cost in
// requests. Requests per desire are (Writes + Reads) / Desires; a desire
// that changes nothing costs none.
type Stats struct {
	// Dispatch is the queue's snapshot: depth, in flight, outcomes by
	// state, coalesced desires, retries, queue wait, tenants, and labels
	// (the classes).
	Dispatch dispatch.Stats
	// Desires counts accepted Set and Submit calls.
	Desires uint64
	// NoOps counts writes not sent because they would change nothing (one
	// per target, status or object): at Set, with nothing queued (no
	// queue slot, no token); before a request; or after a read.
	NoOps uint64
	// Writes counts write requests sent (update, patch, apply), Written
	// those the server accepted, and Reads the reads: for a desire with no
	// baseline, after a write refused as stale, or after a status write
	// answered 404 (is the object gone, or its status subresource?).
	Writes, Written, Reads uint64
	// Conflicts counts writes refused as stale (409, a failed patch test)
	// whose change was applied again to a fresh read.
	Conflicts uint64
	// Replaced and Gone count writes the fence kept off a recreated object,
	// and writes whose object no longer exists (ErrReplaced, ErrGone).
	Replaced, Gone uint64
	// Known counts the objects whose last server answer the writer keeps
	// as a baseline: at most the objects with a write queued or in flight.
	Known int
}

// counters are the writer's own figures.
type counters struct {
	moot, noOps, writes, written, reads, conflicts, replaced, gone atomic.Uint64
}

// Stats returns a snapshot. The dispatcher's part is consistent in itself;
// the writer's counters are read just after it.
func (w *Writer[O]) Stats() Stats {
	d := w.d.Stats()
	return Stats{
		Dispatch:  d,
		Desires:   d.Submitted - d.Rejected + w.n.moot.Load(),
		NoOps:     w.n.noOps.Load(),
		Writes:    w.n.writes.Load(),
		Written:   w.n.written.Load(),
		Reads:     w.n.reads.Load(),
		Conflicts: w.n.conflicts.Load(),
		Replaced:  w.n.replaced.Load(),
		Gone:      w.n.gone.Load(),
		Known:     w.known.len(),
	}
}
