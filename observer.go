package dispatch

import (
	"errors"
	"time"
)

// Event names the call an observation is about, with bounded cardinality:
// a label derived from the call by the WithLabel function (a call type such
// as "bind" or "status-patch"; "" without it) and the tenant.
type Event struct {
	Label    string
	Tenant   string
	Priority int
}

// Finish describes a finished call for Observer.OnFinish.
type Finish struct {
	// State is the call's terminal state, as the completion hook sees it.
	State State
	// Err is the call's error, if any.
	Err error
	// Attempts counts executions (API attempts).
	Attempts int
	// Waiters counts the submissions the call served.
	Waiters int
	// QueueWait is the time from enqueue to the first execution (or to the
	// end, if it never ran).
	QueueWait time.Duration
	// RunTime is the time spent in exec, over all attempts.
	RunTime time.Duration
}

// Observer receives the dispatcher's events, for metrics and logs. Every
// method is called outside the dispatcher's lock, on whichever goroutine
// caused the event (a submitter, a worker, the timer goroutine, a caller of
// SetMode or Close), so a slow observer slows only that goroutine and never
// blocks the dispatcher's lock. Methods may be called concurrently and must
// not block for long. Embed NopObserver to implement only some methods.
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
	// OnDrop: a queued call was shed to make room, for reason ("capacity",
	// "quota").
	OnDrop(e Event, reason string)
	// OnFinish: a call ended (once per call, like the completion hook).
	OnFinish(e Event, f Finish)
	// OnModeChange: the dispatcher switched mode, by SetMode ("manual"), by
	// the fallback policy ("backlog", "failure-ratio", "queue-wait",
	// "breaker-open"; the measured values are in Stats.FallbackReason), or by
	// its cool-down return ("cool-down"). Reasons come from this fixed set,
	// so they are safe as metric labels.
	OnModeChange(from, to Mode, reason string)
	// OnBreakerChange: the circuit breaker changed state.
	OnBreakerChange(from, to BreakerState)
}

// NopObserver implements every Observer method as a no-op. Embed it in an
// observer that only needs some of them.
type NopObserver struct{}

func (NopObserver) OnSubmit(Event, bool)                       {}
func (NopObserver) OnReject(Event, error)                      {}
func (NopObserver) OnStart(Event, int, time.Duration)          {}
func (NopObserver) OnRetry(Event, int, time.Duration, error)   {}
func (NopObserver) OnDrop(Event, string)                       {}
func (NopObserver) OnFinish(Event, Finish)                     {}
func (NopObserver) OnModeChange(Mode, Mode, string)            {}
func (NopObserver) OnBreakerChange(BreakerState, BreakerState) {}

// WithObserver sets the observer of the dispatcher's events.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) error {
		if o == nil {
			return errors.New("dispatch: WithObserver: nil Observer")
		}
		c.observer = o
		return nil
	})
}

// WithLabel sets the function that labels calls for the observer and for
// Stats.Labels, e.g. by call type. Its results must come from a small fixed
// set, since each becomes a metric label value. It runs on the submitting
// goroutine, outside the lock, once per submission. K and T must be the
// Dispatcher's, or New fails.
func WithLabel[K comparable, T any](label func(key K, call T) string) Option {
	return optionFunc(func(c *config) error {
		if label == nil {
			return errors.New("dispatch: WithLabel: nil function")
		}
		c.label = label
		return nil
	})
}
