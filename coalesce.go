package dispatch

import (
	"errors"
	"fmt"
)

// This file is coalescing: how a submission joins a call, how a call's
// value absorbs another, and how a pending call is amended.

// adopt gives queued call c the tenant and label of a submission that
// raises its priority: a merged call is counted, capped and labelled as
// its most urgent submission — a binding that replaces a pending status
// patch runs as a binding. The caller then joins the submission.
func (d *Dispatcher[K, T]) adopt(c *call[K, T], ten *tenant[K, T], label string) {
	old, state := c.tag.ten, c.state
	if ten == old {
		c.tag = d.calls.retag(c.tag, ten, label)
		return
	}
	d.q.remove(c) // from the old tenant's indexes
	old.queued--
	c.tag = d.calls.retag(c.tag, ten, label)
	ten.queued++
	d.tenants.keep(ten)
	switch state {
	case csReady:
		d.q.push(c)
	case csDelayed:
		d.q.delay(c, c.notBefore())
	case csBehind:
		d.q.markVictim(c) // in its new tenant's index
	}
	d.tenants.forgetIdle(old)
}

// callValue is what a merge changes in a call: its value and its
// idempotency key.
type callValue[T any] struct {
	val  T
	idem string
}

// value returns c's value, to restore it with setValue.
func (c *call[K, T]) value() callValue[T] { return callValue[T]{c.val, c.idem()} }

// setValue restores a value that value returned.
func (c *call[K, T]) setValue(v callValue[T]) {
	c.val = v.val
	c.setIdem(v.idem)
}

// merge merges an incoming submission's call value into the pending call
// c, by the merge function (Config.Merge; nil: the incoming wins). On error
// c is untouched; SkipIncoming means the merge function found the incoming
// call has nothing to add. ReplacePending means c's value is now the
// incoming call's, a new operation: the caller restarts c. panicked is the
// merge function's panic, if it panicked: err then refuses the incoming
// call with it.
//
// The merge function runs under the lock. If it ends the goroutine
// (runtime.Goexit), onExit runs — with the lock held, on the way out of
// the goroutine — and must finish the caller's work and release the lock:
// the one place where a lock is released other than by the function that
// took it, since the goroutine never returns to that function.
func (c *call[K, T]) merge(val T, idem string, merge func(pending, incoming T) (T, error), onExit func(*PanicError)) (panicked *PanicError, err error) {
	if idem != "" && c.idem() != "" && idem != c.idem() {
		return nil, errRejectIdemKey
	}
	var replace error
	if merge != nil {
		var v T
		var skip, replacing bool
		panicked, err = guard(callbackMerge, func() (err error) {
			v, err = merge(c.val, val)
			if err != nil { // its Is is user code too: a panic there is the merge's
				skip = errors.Is(err, SkipIncoming)
				replacing = !skip && errors.Is(err, ReplacePending)
			}
			return err
		}, onExit)
		switch {
		case err == nil:
		case skip:
			return nil, SkipIncoming
		case replacing:
			replace = ReplacePending
		default:
			return panicked, fmt.Errorf("%w: %w", ErrMergeRejected, err)
		}
		val = v
	}
	c.val = val
	if idem != "" { // without one, c.rare is not even read
		c.setIdem(idem) // equal to c's, or c had none
	}
	return nil, replace
}

// restart makes queued call c, whose value was just replaced by another
// operation (ReplacePending), start fresh: no attempts, last error or run
// time carried over, its queue wait measured anew, and a retry's backoff
// dropped. It keeps its place in line (its waiters' enqueue times).
func (d *Dispatcher[K, T]) restart(c *call[K, T]) {
	c.exec = nil // its attempts, run time and first start
	c.setLastErr(nil)
	if c.state == csDelayed {
		d.q.remove(c)
		d.q.push(c)
		d.wake.worker()
	}
}

// absorb moves every waiter of the successor n into c (whose value already
// holds the merge of both) and forgets n, which was never queued. If n is
// the more urgent, or replaced c's value (ReplacePending), c takes its
// tenant and label, as any merged call does.
func (d *Dispatcher[K, T]) absorb(c, n *call[K, T], replaced bool, ob *outbox[K, T]) {
	d.q.unmarkVictim(n) // its tenant's index may hold it
	if (replaced || n.prio > c.prio) && n.tag != c.tag {
		d.adopt(c, n.tag.ten, n.tag.label)
	}
	d.waiters.absorb(c, n)
	if !n.is(fDroppable) {
		c.mark(fDroppable, false)
	}
	if n.joinedCount() > 0 {
		// n's first submission is now coalesced too; the others were
		// counted as they joined n.
		d.totals.coalesced++
		if d.cfg.Observer != nil {
			ob.notes = append(ob.notes, note{kind: noteCoalesce, e: n.event()})
		}
	}
	n.tag.ten.queued--
	d.tenants.forgetIdle(n.tag.ten)
	d.calls.remove(n.tag)
	d.handover.ended(n.seq)
	d.q.reprioritize(c)
}

// Amend rewrites the pending call of key (queued, out a backoff, or behind
// the key's running call; a running call, maybe taking effect, is never
// rewritten) and reports whether there was one: "what will this key look
// like once its pending write lands?" (kube-scheduler's SyncObject). f
// returns the call rewritten, or an error, which leaves it as it was and
// which Amend returns. f runs under the dispatcher's lock, like
// Config.Merge; a panic in f is returned as a *PanicError. If Config.NoOp
// finds the rewritten call changes nothing, it ends Skipped — unless key
// has a call in flight: the call's own test then decides before it
// starts. A panic in the test ends the call Failed, as it would before the
// call starts, and Amend returns it. The test runs outside the lock; a
// call changed meanwhile — a submission merged into it, another Amend
// rewrote it, or it started (a retry waits as the key's pending call
// again) — runs.
func (d *Dispatcher[K, T]) Amend(key K, f func(pending T) (T, error)) (bool, error) {
	return d.amend(key, false, func(v T, _ bool) (T, error) { return f(v) })
}

// AmendNewest is Amend for key's newest call: the pending one, or, if none
// is pending, the one in flight. f learns whether a call for key is in
// flight. The call in flight is never rewritten — f's result is then
// dropped — but f may read it, and update what the call value keeps for
// itself (an adapter refreshing its view of the object, as upstream's
// SyncObject does). It reports whether key had a call to show f.
func (d *Dispatcher[K, T]) AmendNewest(key K, f func(newest T, inFlight bool) (T, error)) (bool, error) {
	return d.amend(key, true, f)
}

// amend is Amend (newest false) and AmendNewest. It takes the lock itself.
func (d *Dispatcher[K, T]) amend(key K, newest bool, f func(T, bool) (T, error)) (bool, error) {
	d.mu.Lock()
	l := d.lanes.lookup(key)
	if l == nil || l.pending == nil && (!newest || l.running == nil) {
		d.mu.Unlock()
		return false, nil
	}
	unlock := func(*PanicError) { d.mu.Unlock() }
	inFlight := l.running != nil
	c := l.pending
	if c == nil { // the newest call is in flight: shown, never rewritten
		_, err := guard(callbackAmend, func() (err error) { _, err = f(l.running.val, true); return err }, unlock)
		d.mu.Unlock()
		return true, err
	}
	var v T
	_, err := guard(callbackAmend, func() (err error) { v, err = f(c.val, inFlight); return err }, unlock)
	if err != nil {
		d.mu.Unlock()
		return true, err
	}
	c.val = v
	if d.cfg.NoOp == nil { // no no-op test will ask whether c changed
		d.mu.Unlock()
		return true, nil
	}
	c.rareOf().amends++ // even in flight: an Amend testing c now must see it
	mark := c.amendMark()
	d.mu.Unlock()
	if inFlight {
		return true, nil
	}
	return true, d.skipIfNoOp(key, v, mark)
}

// amendMark is what tells that a key's pending call is still the one an
// Amend rewrote, as it left it: the same call (seq), no submission merged
// into it since (joined counts every merge), no other Amend rewrote it
// (amends), and it has not started since (exec: a retry waits as the key's
// pending call again, its value maybe rebuilt by the before-retry hook).
type amendMark struct {
	seq    uint64
	joined int
	amends uint64
	exec   *execution
}

// amendMark returns c's amendMark; c has been amended, so c.rare is set.
func (c *call[K, T]) amendMark() amendMark {
	return amendMark{c.seq, c.joinedCount(), c.rare.amends, c.exec}
}

// skipIfNoOp ends key's pending call Skipped if Config.NoOp finds its
// amended value v would change nothing, or Failed with the test's
// *PanicError if it panics or ends the goroutine, as a call whose own test
// does before it starts — unless the call changed since (mark tells). It
// returns the no-op test's panic, if any. It takes the lock itself.
func (d *Dispatcher[K, T]) skipIfNoOp(key K, v T, mark amendMark) error {
	var noop bool
	pe, _ := guard(callbackNoOp, func() error { noop = d.cfg.NoOp(key, v); return nil }, func(pe *PanicError) {
		d.endAmended(key, mark, StateFailed, pe)
	})
	switch {
	case pe != nil:
		d.endAmended(key, mark, StateFailed, pe)
		return pe
	case noop:
		d.endAmended(key, mark, StateSkipped, nil)
	}
	return nil
}

// endAmended ends key's pending call with st and err, unless it changed
// since an Amend left it (mark tells). It takes the lock itself.
func (d *Dispatcher[K, T]) endAmended(key K, mark amendMark, st State, err error) {
	var ob outbox[K, T]
	d.mu.Lock()
	if l := d.lanes.lookup(key); l != nil && l.pending != nil && l.pending.rare != nil && l.pending.amendMark() == mark {
		c := l.pending
		now := d.clk.now()
		d.waiters.settleAll(c, st, err, now, onTime, &ob)
		d.finish(c, st, err, now, &ob)
	}
	d.mu.Unlock()
	d.tell.deliver(&ob)
}
