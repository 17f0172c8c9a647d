package dispatchprom

import (
	"errors"
	"testing"
	"time"

	"github.com/coalescer/dispatch"
)

// The event methods run on the dispatcher's submit and worker paths, so
// they must be cheap and allocation-free once a label value has been seen.
func BenchmarkEvents(b *testing.B) {
	obs, err := NewObserver(Options{})
	if err != nil {
		b.Fatal(err)
	}
	e := dispatch.Event{Label: "status-patch", Tenant: "plugin-a"}
	retryErr := errors.New("connection reset")
	for _, bc := range []struct {
		name string
		f    func()
	}{
		{"event=submit", func() { obs.OnSubmit(e, false) }},
		{"event=coalesce", func() { obs.OnSubmit(e, true) }},
		{"event=reject", func() { obs.OnReject(e, dispatch.ErrClosed) }},
		{"event=start", func() { obs.OnStart(e, 1, time.Millisecond) }},
		{"event=retry", func() { obs.OnRetry(e, 1, time.Millisecond, retryErr) }},
		{"event=finish", func() {
			obs.OnFinish(e, dispatch.Outcome{State: dispatch.StateSucceeded, Attempts: 1, RunTime: time.Millisecond})
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					bc.f()
				}
			})
		})
	}
}
