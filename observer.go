package dispatch

import "time"

// Event names the call an observation is about: its Config.Label label
// ("" without Label) and its tenant, both as given. As metric labels both
// must come from small fixed sets; the dispatcher does not bound them.
type Event struct {
	Label  string
	Tenant string
}

// Observer receives the dispatcher's events, for metrics and logs. Its
// methods are called concurrently, outside the lock, on the goroutine that
// caused the event, or for events of the clock (a deadline, a fallback) on
// the dispatcher's notifier goroutine; they must not block for long.
// Methods may be added later: embed NopObserver to keep compiling.
type Observer interface {
	// OnSubmit: accepted; coalesced into a pending call, or not.
	OnSubmit(e Event, coalesced bool)
	OnReject(e Event, err error)
	// OnStart: an execution started; attempt counts from 1.
	OnStart(e Event, attempt int, queueWait time.Duration)
	OnRetry(e Event, attempt int, delay time.Duration, err error)
	// OnDrop: a queued call was shed under BoundCapacity or BoundQuota.
	OnDrop(e Event, b Bound)
	// OnFinish: a call ended, with what OnDone sees.
	OnFinish(e Event, o Outcome)
	// OnModeChange's reason is "manual" (SetMode), or a FallbackPolicy's
	// "backlog", "queue_wait", "failure_ratio", "circuit_open" or
	// "cool_down".
	OnModeChange(from, to Mode, reason string)
	OnCircuitChange(from, to Circuit)
	// OnLimitChange: the adaptive concurrency limit changed.
	OnLimitChange(from, to int)
}

// NopObserver implements every Observer method as a no-op, for embedding.
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
