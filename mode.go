package dispatch

import (
	"context"
	"fmt"
	"slices"

	"github.com/coalescer/dispatch/internal/due"
)

// Mode is how the dispatcher runs calls.
type Mode uint8

const (
	// ModeAsync runs calls on the dispatcher's workers: Submit and Post return
	// at once. It is the default.
	ModeAsync Mode = iota
	// ModeSync runs each call inline, in the goroutine that submits it,
	// through the same coalescing, retry, breaker, hook and outcome
	// machinery: Submit and Post return when the call has ended (a Post
	// holds a ticket meanwhile, counted by Config.MaxWaiters). It is the
	// feature gate's "off" position and the fallback path; the caller
	// sleeps out a retry's backoff itself. Per key calls stay serialized:
	// a submission waits for its key's running call, then runs, or for a
	// call still queued from Async that a worker runs. Tenant in-flight
	// caps do not apply, nor do Config.Start's limits on starting
	// (ReservedWorkers, the adaptive limit and the hold a Retry-After puts
	// on it): the callers are the concurrency.
	ModeSync
)

func (m Mode) String() string {
	switch m {
	case ModeAsync:
		return "async"
	case ModeSync:
		return "sync"
	}
	return fmt.Sprintf("mode_%d", uint8(m))
}

// reasonManual is the reason Observer.OnModeChange is given for SetMode;
// an automatic switch gives internal/fallback's (a fixed set, safe as
// metric label values), and its measured values are in
// Stats.FallbackReason.
const reasonManual = "manual"

// SetMode switches the dispatcher between ModeAsync and ModeSync at run
// time — the feature gate's lever, and the manual rollback. In ModeSync
// each submission runs inline in its caller. What was queued before the
// switch is ended Canceled with ErrFallback at once if
// Config.Rollout.CancelQueued is set; otherwise the workers drain it while
// SetMode waits, until ctx ends: then it cancels the rest the same way
// (unless Close has begun meanwhile, which runs it as Close promises) and
// returns ctx's error. Another switch meanwhile ends neither the wait nor
// its promise: SetMode returns nil only once what was queued before its
// own switch has ended (back in ModeAsync, the workers run it, and a ctx
// that ends then cancels nothing). Calls in flight run to their end, and
// a call that a Sync-mode caller runs or waits for (its own submission,
// or a queued call it coalesced into) is never cancelled: it is on the
// synchronous path already. Every submission sees one mode or the other,
// so a switch never loses a call or runs one twice. Called from a
// callback on one of the dispatcher's goroutines, SetMode switches
// without waiting for the drain (which may need that goroutine) and, if
// there is one to wait for, returns ErrReentrant. Setting the mode the
// dispatcher is in switches nothing: SetMode returns nil at once, waits
// for and cancels nothing, and the observer is not told. SetMode also
// cancels the return to ModeAsync that an automatic fallback scheduled
// (FallbackPolicy.ReturnAfter): the mode a person sets stays until SetMode
// is called again or, in ModeAsync, a threshold is crossed.
func (d *Dispatcher[K, T]) SetMode(ctx context.Context, m Mode) error {
	if m > ModeSync {
		return fmt.Errorf("dispatch: SetMode(%d): unknown mode", m)
	}
	var ob outbox[K, T]
	d.mu.Lock()
	if d.drain.closing {
		d.mu.Unlock()
		return ErrClosed
	}
	if f := d.fallback; f != nil {
		f.CancelReturn() // the cool-down undoes a fallback, not a person
	}
	if d.mode == m {
		d.mu.Unlock()
		return nil // nothing to switch, nor to drain
	}
	d.switchMode(m, reasonManual, &ob)
	var w *handover
	if m == ModeSync && !d.cfg.Rollout.CancelQueued {
		w = d.handover.await(d.seq, d.calls.n) // every live call arrived before the switch
	}
	d.mu.Unlock()
	d.tell.deliver(&ob)
	if w == nil {
		return nil
	}
	return d.awaitDrain(ctx, w)
}

// awaitDrain waits until the calls w counts, which arrived before a switch
// to Sync mode, have ended, or ctx ends: then, if the dispatcher is in
// Sync mode and Close is not draining them, it cancels those still queued.
// The mode switched again meanwhile changes neither: back in Async mode the
// workers run those calls, which then end; a later switch to Sync mode
// waits for its own. It takes the lock itself.
func (d *Dispatcher[K, T]) awaitDrain(ctx context.Context, w *handover) error {
	var ob outbox[K, T]
	var err error
	checked := false
	d.mu.Lock()
wait:
	for w.left > 0 {
		if !checked {
			d.mu.Unlock()
			checked = true
			reentrant := d.reentrant()
			d.mu.Lock()
			if reentrant {
				err = ErrReentrant // the drain may need this very goroutine
				break
			}
			continue // look again: the state may have changed meanwhile
		}
		ch := d.wake.kicked()
		d.mu.Unlock()
		select {
		case <-ch:
			d.mu.Lock()
		case <-ctx.Done():
			d.mu.Lock()
			if d.mode == ModeSync && !d.drain.closing {
				d.cancelQueued(w.upTo, d.clk.now(), &ob)
			}
			err = ctx.Err()
			break wait
		}
	}
	d.handover.done(w)
	d.mu.Unlock()
	d.tell.deliver(&ob)
	return err
}

// Mode returns the current mode.
func (d *Dispatcher[K, T]) Mode() Mode {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mode
}

// switchMode changes the mode under the lock; reason is what the observer
// is told.
func (d *Dispatcher[K, T]) switchMode(m Mode, reason string, ob *outbox[K, T]) {
	from := d.mode
	if from == m {
		return
	}
	d.mode = m
	if m == ModeSync && d.cfg.Rollout.CancelQueued {
		d.cancelQueued(d.seq, d.clk.now(), ob) // every live call arrived before the switch
	}
	if m == ModeAsync {
		d.wake.workers() // queued successors and retries run on workers again
		if f := d.fallback; f != nil {
			// ModeAsync is judged on its own calls.
			f.Afresh()
			if at, ok := f.Wake(d.clk.now()); ok { // back to Async: the check resumes
				d.due.Set(due.Check, at)
			}
		}
	}
	d.wake.kick()
	if obs := d.cfg.Observer; obs != nil {
		ob.notes.add(func() { obs.OnModeChange(from, m, reason) })
	}
}

// cancelQueued ends the calls handed over to the workers by a switch to
// Sync mode — those that arrived up to upTo — that are still queued
// (ready, in backoff, or waiting behind their key's in-flight call) with
// Canceled and ErrFallback, but for those a Sync-mode caller waits for:
// ErrFallback would tell that caller to take the path it is on. Calls in
// flight are left to finish.
func (d *Dispatcher[K, T]) cancelQueued(upTo uint64, now int64, ob *outbox[K, T]) {
	for _, l := range slices.Collect(d.lanes.all()) { // finish releases lanes
		for _, c := range [2]*call[K, T]{l.pending, l.running} { // as endLane
			if c != nil && c.state != csRunning && !c.orphaned() && c.seq <= upTo && !c.awaitedInline() {
				d.waiters.settleAll(c, StateCanceled, errFallbackCanceled, now, onTime, ob)
				d.finish(c, StateCanceled, errFallbackCanceled, now, ob)
			}
		}
	}
}
