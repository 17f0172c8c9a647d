package dispatch

import "time"

// Event names the call an observation is about: the label Config.Label
// gives it (a call type such as "bind"; "" without Label) and its tenant.
// Both become metric labels, so both must come from small fixed sets: the
// dispatcher does not bound them (the prometheus module caps what it
// exports).
type Event struct {
	Label  string
	Tenant string
}

// Observer receives the dispatcher's events, for metrics and logs. Every
// method is called outside the dispatcher's lock, on the goroutine that
// caused the event (a submitter, a worker, a caller of SetMode or Close),
// or, for events of the clock (a deadline, a fallback), on the
// dispatcher's notifier goroutine, so that a slow observer never delays
// the clock or holds the lock. Methods may be called concurrently and must
// not block for long.
//
// Methods may be added to this interface in later versions, as the
// dispatcher learns to report more: embed NopObserver in an implementation
// so that it keeps compiling.
type Observer interface {
	// OnSubmit: a submission was accepted; coalesced if it merged into an
	// existing pending call rather than making a new one.
	OnSubmit(e Event, coalesced bool)
	// OnReject: a submission was refused with err.
	OnReject(e Event, err error)
	// OnStart: an execution started; attempt counts from 1.
	OnStart(e Event, attempt int, queueWait time.Duration)
	// OnRetry: a failed attempt will be retried after delay.
	OnRetry(e Event, attempt int, delay time.Duration, err error)
	// OnDrop: a queued call was shed to make room under bound b
	// (BoundCapacity or BoundQuota).
	OnDrop(e Event, b Bound)
	// OnFinish: a call ended (once per call, like the completion hook),
	// with the outcome the hook sees.
	OnFinish(e Event, o Outcome)
	// OnModeChange: the dispatcher switched mode, for reason: "manual"
	// (SetMode), or a FallbackPolicy's "backlog", "queue_wait",
	// "failure_ratio", "circuit_open" or "cool_down".
	OnModeChange(from, to Mode, reason string)
	// OnCircuitChange: the circuit breaker changed state.
	OnCircuitChange(from, to Circuit)
	// OnLimitChange: the adaptive concurrency limit changed.
	OnLimitChange(from, to int)
}

// NopObserver implements every Observer method as a no-op. Embed it in an
// observer that only needs some of them.
type NopObserver struct{}

func (NopObserver) OnSubmit(Event, bool)                     {}
func (NopObserver) OnReject(Event, error)                    {}
func (NopObserver) OnStart(Event, int, time.Duration)        {}
func (NopObserver) OnRetry(Event, int, time.Duration, error) {}
func (NopObserver) OnDrop(Event, Bound)                      {}
func (NopObserver) OnFinish(Event, Outcome)                  {}
func (NopObserver) OnModeChange(Mode, Mode, string)          {}
func (NopObserver) OnCircuitChange(Circuit, Circuit)         {}
func (NopObserver) OnLimitChange(int, int)                   {}
