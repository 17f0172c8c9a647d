package dispatchprom

import (
	"errors"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/coalescer/dispatch"
)

// overflow is the label value that stands for every value past a label's
// bound, and for text that does not look like a bounded identifier.
const overflow = "other"

// bounded maps label values onto a set that grows to at most max distinct
// values; later newcomers become overflow. It guards the registry against a
// Config.Label function or tenant scheme that is not as small as promised: a
// series per key would grow without end and take the monitoring down with
// it. A value that is not valid UTF-8, which no exposition format can
// carry, is overflow too: as a label value it would make every scrape of
// the registry fail. It is safe for concurrent use; the common case (a
// value already seen) is one lock-free map read.
type bounded struct {
	max  int // < 0: unbounded
	seen sync.Map
	mu   sync.Mutex // serialises admissions, so n is exact
	n    int
	// over is set once a value has become overflow: from then on overflow
	// is a value seen, like an admitted one.
	over atomic.Bool
}

func (b *bounded) value(v string) string {
	if _, ok := b.seen.Load(v); ok {
		return v
	}
	if !utf8.ValidString(v) {
		b.over.Store(true)
		return overflow
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.seen.Load(v); ok {
		return v
	}
	if b.max >= 0 && b.n >= b.max {
		b.over.Store(true)
		return overflow
	}
	b.seen.Store(v, struct{}{})
	b.n++
	return v
}

// each calls f for every admitted value.
func (b *bounded) each(f func(string)) {
	b.seen.Range(func(k, _ any) bool {
		f(k.(string))
		return true
	})
}

// overflowed reports whether any value has become overflow.
func (b *bounded) overflowed() bool { return b.over.Load() }

// knownBounds and knownSwitches are the dispatcher's own vocabularies: the
// Bound constants, and the mode-change reasons Observer.OnModeChange and
// FallbackPolicy name. A value outside them (from a newer dispatch, say) is
// exported as overflow; TestVocabulariesAreTheCores fails when the core's
// lists and these part.
var (
	knownBounds   = set([]dispatch.Bound{dispatch.BoundCapacity, dispatch.BoundWaiters, dispatch.BoundQuota})
	knownSwitches = set([]string{"manual", "cool_down", "backlog", "failure_ratio", "queue_wait", "circuit_open"})
)

func set[S ~string](vs []S) map[S]bool {
	m := make(map[S]bool, len(vs))
	for _, v := range vs {
		m[v] = true
	}
	return m
}

// switchReason returns the label value for a mode change's reason.
func switchReason(r string) string {
	if knownSwitches[r] {
		return r
	}
	return overflow
}

// rejectReason names why a submission was refused, from a fixed set: the
// backpressure bound (a dispatch.Bound; "backpressure" for an untyped or
// unknown one), or "closed", "circuit", "stale", "expired", "merge",
// "canceled", else "other". The error's text is never used.
func rejectReason(err error) string {
	if bp, ok := errors.AsType[*dispatch.BackpressureError](err); ok {
		if knownBounds[bp.Bound] {
			return string(bp.Bound)
		}
		return "backpressure"
	}
	switch {
	case errors.Is(err, dispatch.ErrBackpressure):
		return "backpressure"
	case errors.Is(err, dispatch.ErrClosed):
		return "closed"
	case errors.Is(err, dispatch.ErrCircuitOpen):
		return "circuit"
	case errors.Is(err, dispatch.ErrStale):
		return "stale"
	case errors.Is(err, dispatch.ErrExpired):
		return "expired"
	case errors.Is(err, dispatch.ErrMergeRejected):
		return "merge"
	case errors.Is(err, dispatch.ErrCanceled):
		return "canceled"
	}
	return overflow
}

// dropReason names the bound a queued call was shed for; anything the
// dispatcher does not define is "other".
func dropReason(b dispatch.Bound) string {
	if knownBounds[b] {
		return string(b)
	}
	return overflow
}

// results are the result label values, indexed by dispatch.State: the
// state's name (already lower-case snake), computed once so OnFinish does
// not allocate.
var results = func() []string {
	rs := []string{""}
	for s := dispatch.StateSucceeded; s <= dispatch.StateClosed; s++ {
		rs = append(rs, s.String())
	}
	return rs
}()

func result(s dispatch.State) string {
	if s != 0 && int(s) < len(results) {
		return results[s]
	}
	return "unknown"
}

func breakerValue(s dispatch.Circuit) string {
	switch s {
	case dispatch.CircuitClosed, dispatch.CircuitOpen, dispatch.CircuitHalfOpen:
		return s.String()
	}
	return "unknown"
}

func modeValue(m dispatch.Mode) string {
	switch m {
	case dispatch.ModeAsync, dispatch.ModeSync:
		return m.String()
	}
	return "unknown"
}
