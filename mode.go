package dispatch

import "fmt"

// Mode is how the dispatcher runs calls.
type Mode uint8

const (
	// Async runs calls on the dispatcher's workers: Submit and Post return
	// at once. It is the default.
	Async Mode = iota
	// Sync runs each call inline, in the goroutine that submits it, through
	// the same coalescing, retry, breaker, hook and outcome machinery:
	// Submit and Post return when the call has ended. It is the feature
	// gate's "off" position and the fallback path.
	Sync
)

func (m Mode) String() string {
	switch m {
	case Async:
		return "async"
	case Sync:
		return "sync"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}
