package dispatch

import "time"

// Event names an observation's call by label and tenant, as given: as
// metric labels, both must come from small fixed sets.
type Event struct {
	Label  string
	Tenant string
}

// Observer receives events, concurrently, outside the lock, on the
// goroutine that caused each, or on the notifier goroutine for those of
// the clock (a deadline, a fallback) and of a Submit context that ended.
// Methods may be added: embed NopObserver.
type Observer interface {
	OnSubmit(e Event, coalesced bool) // accepted, merged into a pending call or not
	// OnCoalesce: a submission made while its key's call ran, which waited
	// behind it as a call of its own (OnSubmit's coalesced false), was
	// merged into that call's retry; e names it. With the submissions
	// OnSubmit tells coalesced, these are what Stats.Coalesced counts.
	OnCoalesce(e Event)
	OnReject(e Event, err error)
	// OnStart runs as an attempt is about to begin, on the goroutine that
	// executes it, once the attempt has its rate-limiter token (in Sync
	// mode the caller waits for it first); attempt counts from 1, and
	// queueWait is the call's wait to its first execution, as
	// Outcome.QueueWait and Stats.QueueWait count it: the wait for that
	// token included. If it ends that goroutine
	// (runtime.Goexit), the call goes back to the queue untouched, to be
	// taken again; after three such exits in a row, the attempt begins
	// without OnStart, so that one that always exits cannot hold a call
	// back forever. A retry tells OnStart again.
	OnStart(e Event, attempt int, queueWait time.Duration)
	OnRetry(e Event, attempt int, delay time.Duration, err error)
	OnDrop(e Event, b Bound)     // a queued call was shed
	OnFinish(e Event, o Outcome) // a call ended: what OnDone sees
	// OnModeChange's reason is "manual" (SetMode) or a FallbackPolicy's.
	OnModeChange(from, to Mode, reason string)
	OnCircuitChange(from, to Circuit)
	OnLimitChange(from, to int) // the adaptive concurrency limit
}

// NopObserver implements every Observer method as a no-op, for embedding.
type NopObserver struct{}

func (NopObserver) OnSubmit(Event, bool)                     {}
func (NopObserver) OnCoalesce(Event)                         {}
func (NopObserver) OnReject(Event, error)                    {}
func (NopObserver) OnStart(Event, int, time.Duration)        {}
func (NopObserver) OnRetry(Event, int, time.Duration, error) {}
func (NopObserver) OnDrop(Event, Bound)                      {}
func (NopObserver) OnFinish(Event, Outcome)                  {}
func (NopObserver) OnModeChange(Mode, Mode, string)          {}
func (NopObserver) OnCircuitChange(Circuit, Circuit)         {}
func (NopObserver) OnLimitChange(int, int)                   {}
