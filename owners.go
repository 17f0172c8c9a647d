package dispatch

import "github.com/coalescer/dispatch/internal/goid"

// This file is the registry of the goroutines Close would wait for: its
// own, and callers running a call inline (Sync mode), so that a callback
// on one of them that calls Close or SetMode gets ErrReentrant instead of
// waiting for itself.

// owners counts, by goroutine id, the registrations of the goroutines
// Close would wait for: the dispatcher's own, and callers running a call
// inline. Guarded by the Dispatcher's lock.
type owners map[uint64]int

// add registers goroutine id once more.
func (o owners) add(id uint64) { o[id]++ }

// drop forgets one registration of goroutine id.
func (o owners) drop(id uint64) {
	if o[id]--; o[id] <= 0 {
		delete(o, id)
	}
}

// reentrant reports whether the calling goroutine is one that Close or
// SetMode would wait for. It costs about a microsecond: cold paths only.
// It takes the lock itself.
func (d *Dispatcher[K, T]) reentrant() bool {
	id := goid.ID()
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.owned[id] > 0
}

// closeReentrant is reentrant for Close, which also waits for Sync-mode
// callers until they have told their calls' outcomes (runSyncUnlock):
// their completion hooks and observer methods are on a goroutine Close
// would wait for. SetMode's drain does not need those. It takes the lock
// itself.
func (d *Dispatcher[K, T]) closeReentrant() bool {
	id := goid.ID()
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.owned[id] > 0 || d.callers[id] > 0
}
