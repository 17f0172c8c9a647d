package scheduler

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/coalescer/dispatch"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
)

// entry is one Add: the call as the caller handed it over, and where its
// outcome goes. The core queues entries under the object's UID; a merge
// makes the incoming entry the one that runs and the pending one
// overwritten.
type entry struct {
	call     fwk.APICall
	typ      fwk.APICallType // call.CallType(), asked once
	onFinish chan<- error
	ticket   *Ticket // nil unless the call came through Submit

	// noop is the call's IsNoOp as of its Add, its last merge or its last
	// SyncObject: the core's no-op test reads it, so IsNoOp is asked where
	// upstream asks it, but for a call waiting behind its object's call in
	// flight: upstream asks that one too, and its answer changes nothing a
	// caller sees (the differential tests compare what a caller sees).
	noop atomic.Bool
	// seen is what the core's hooks found as the entry was admitted
	// (admission), a bit each, whether it has run (aRan) and whether its
	// outcome has been told (aTold). Set under the core's lock, mostly
	// during the entry's own Add (a retry that absorbs the entry as its
	// successor may mark it merged later, from a worker), but for aRan,
	// which its first execution sets, and aTold; never cleared. One word
	// for all of them, beside noop, keeps an entry in the allocator's
	// 112-byte class.
	seen atomic.Uint32
	// displaced is the pending entry this one overwrote, until it has been
	// told so. Whoever tells takes it (Swap), so each is told once and an
	// entry holds on to at most a short chain of others.
	displaced atomic.Pointer[entry]
	// failed is the error its last execution that failed returned, for a
	// call absorbed by a successor that arrived while it was in flight
	// (aInFlight): it is told that, its own outcome. Set only on a
	// failure, by the execution.
	failed atomic.Pointer[error]
	// first is the context of the entry's first execution (execCtxFor):
	// kept in the entry, so that a call that runs once, as nearly every
	// call does, allocates none. It is never reused: it stays bound to
	// that execution's context, done once the execution ended.
	first execCtx
}

// admission is one thing the core's hooks found about an entry as it was
// admitted (entry.seen), or, aRan, that it has begun to run.
type admission uint32

const (
	// aMerged: the core merged the entry into a pending call, and the merge
	// asked IsNoOp.
	aMerged admission = 1 << iota
	// aSkipped: the pending call was more relevant.
	aSkipped
	// aLessInFlight: the call in flight was more relevant.
	aLessInFlight
	// aBehind: a call was in flight when it was admitted, so that the merge
	// keeps it even if it IsNoOp.
	aBehind
	// aMoot: the call IsNoOp and its object had no call queued or in
	// flight when it was admitted (mootCall): it was skipped.
	aMoot
	// aRan: an execution of the entry has begun, with e.first as its
	// context (execCtxFor).
	aRan
	// aInFlight: the entry was overwritten by a call that arrived while it
	// was in flight, as its retry absorbed that call: it is told its own
	// outcome, not that it was overwritten.
	aInFlight
	// aTold: the entry's outcome has been told (entry.tell); it is told
	// once.
	aTold
	// aAbsorbedInFlight: the entry, admitted behind a call in flight with
	// none pending, absorbed that call through its Merge (follow). A retry
	// of that call that absorbs the entry does not ask Merge again.
	aAbsorbedInFlight
	// aMergedNoOp: the merge that admitted the entry found it a no-op
	// (overwrite): Add drops it, and says it was skipped.
	aMergedNoOp
	// aDropped: the entry, a pending no-op waiting for its drop, was
	// replaced by a call that came as to an idle object (merge): it is
	// told it was skipped, as its drop would have told it.
	aDropped
)

// mark records that a was found about e.
func (e *entry) mark(a admission) { e.seen.Or(uint32(a)) }

// is reports whether a was found about e.
func (e *entry) is(a admission) bool { return admission(e.seen.Load())&a != 0 }

func newEntry(call fwk.APICall, onFinish chan<- error) *entry {
	return &entry{call: call, typ: call.CallType(), onFinish: onFinish}
}

// mergeError is the error a call's own Merge returned, as the core carries
// it out of Config.Merge.
type mergeError struct{ err error }

func (e *mergeError) Error() string { return "failed to merge API calls: " + e.err.Error() }
func (e *mergeError) Unwrap() error { return e.err }

// merge is the core's Config.Merge: how a call joins the pending call for
// the same object, by upstream's rules. A less relevant call is skipped (it
// ends at once, the pending call untouched). A more relevant call, or one of
// another type and the same relevance, overwrites the pending one as
// another operation (dispatch.ReplacePending): it starts fresh, in its own
// tenant, whatever retries the pending one had been through. A call of the
// same type absorbs the pending one through its own Merge, and replaces it
// as the same operation, updated: a retry's attempts and backoff carry
// over. Either way the pending entry is told it was overwritten (displaced,
// by whoever tells next outside the lock) — unless it is the call in flight
// the incoming one arrived behind, now a retry (see overwrite) — and the
// merged call's IsNoOp is asked once.
//
// It runs under the core's lock, as upstream's merge runs under its queue's
// lock: the calls' Merge and IsNoOp must be fast.
//
// A merged call that IsNoOp is dropped by Add (with the pending call it
// replaced) only if the object has no call in flight; with one in flight
// it is kept, and runs (upstream's noOp && !inFlight).
//
// A pending call found a no-op (its noop flag: by the merge that admitted
// it, or by SyncObject) is dropped right after that step, outside the
// lock; upstream drops it in the step itself. So a call that arrives in
// between finds, as with upstream, no pending call: it replaces that one
// as another operation, without Merge or the relevance test, and is asked
// IsNoOp as a call for an idle object is; the no-op is told it was
// skipped, as its Add (or SyncObject) said.
func (d *Dispatcher) merge(pending, incoming *entry) (*entry, error) {
	if pending.noop.Load() {
		pending.mark(aDropped)
		incoming.overwrite(pending)
		return incoming, dispatch.ReplacePending
	}
	rp, ri := d.relevances[pending.typ], d.relevances[incoming.typ]
	switch {
	case ri < rp:
		incoming.mark(aSkipped)
		return pending, dispatch.SkipIncoming
	case incoming.typ == pending.typ:
		// A call that absorbed pending while it was in flight (follow) is
		// merged with it again only by pending's retry: Merge was asked
		// for this pair already, once, as upstream asks it.
		if !incoming.is(aAbsorbedInFlight) || !pending.is(aRan) {
			if err := incoming.call.Merge(pending.call); err != nil {
				return pending, &mergeError{err}
			}
		}
		incoming.overwrite(pending)
		return incoming, nil
	}
	incoming.overwrite(pending)
	return incoming, dispatch.ReplacePending
}

// overwrite makes e the call that runs in pending's place, and asks it
// IsNoOp once, unless a call is in flight (then it runs whatever it is).
//
// A pending entry that has run while e was admitted behind a call in flight
// is that call, now a retry absorbing e (a pending call behind one in
// flight never has run): it is told its own outcome, the error of the
// execution e arrived during, as upstream's call in flight is.
func (e *entry) overwrite(pending *entry) {
	if e.is(aBehind) && pending.is(aRan) {
		pending.mark(aInFlight)
	}
	e.displaced.Store(pending)
	noop := !e.is(aBehind) && e.call.IsNoOp()
	e.noop.Store(noop)
	if noop {
		e.mark(aMergedNoOp)
	}
	e.mark(aMerged)
}

// follow is the core's Config.Follow: how a call joins an object whose call
// is in flight, by upstream's rules, under the core's lock. A call less
// relevant than the one in flight is skipped. If another call is pending,
// the merge with it decides the rest; e is marked as admitted behind a
// call in flight, which a no-op does not drop. Otherwise the call in
// flight is the object's newest: a call of its type absorbs it through its
// own Merge, and either way the incoming call runs after it, no-op or not.
// The call in flight is not told it was overwritten: it ends with its own
// outcome.
func (d *Dispatcher) follow(running, incoming *entry, pending bool) (*entry, error) {
	if d.relevances[incoming.typ] < d.relevances[running.typ] {
		incoming.mark(aLessInFlight)
		return incoming, dispatch.SkipIncoming
	}
	incoming.mark(aBehind)
	if !pending && incoming.typ == running.typ {
		if err := incoming.call.Merge(running.call); err != nil {
			return incoming, &mergeError{err}
		}
		incoming.mark(aAbsorbedInFlight)
	}
	return incoming, nil
}

// mootCall is the core's Config.Moot: a call for an object with nothing
// queued or in flight to merge with that IsNoOp changes nothing, and is
// skipped (upstream's noOp && !inFlight, with no pending call). Asked
// under the core's lock, in the step that admits the call, as upstream
// asks it under its queue's lock: a call that arrives for the object
// meanwhile comes after this one.
func mootCall(_ types.UID, e *entry) bool {
	if !e.call.IsNoOp() {
		return false
	}
	e.mark(aMoot)
	return true
}

// noOp is the core's Config.NoOp: the call's IsNoOp as last asked.
func noOp(_ types.UID, e *entry) bool { return e.noop.Load() }

// label is the core's Config.Label: the call type.
func label(_ types.UID, e *entry) string { return string(e.typ) }

// The errors an entry's outcome is told with, as upstream words them.
var (
	errLessRelevant = fmt.Errorf("a more relevant call is already enqueued for this object: %w", fwk.ErrCallSkipped)
	errLessInFlight = fmt.Errorf("a more relevant call is in flight for this object: %w", fwk.ErrCallSkipped)
	errNoEffect     = fmt.Errorf("call does not need to be executed because it has no effect: %w", fwk.ErrCallSkipped)
	errOverwritten  = fmt.Errorf("a call was enqueued for this object that replaces this one: %w", fwk.ErrCallOverwritten)

	// errReplaced stops an Amend whose pending call is not the one it was for.
	errReplaced = errors.New("scheduler: the pending call was replaced")
)
