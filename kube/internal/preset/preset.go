// Package preset holds what the kube family's presets (kube.NewDispatcher,
// kube/scheduler.New, kube/writer.New) share, so that each default is
// stated once: the worker count, the priority band's width, the API rate,
// and the rule for the workers kept for urgent calls.
package preset

import (
	"fmt"
	"strings"

	"github.com/coalescer/dispatch"
)

// The defaults. The presets state them rather than leave them to the core,
// so that their rules (the bands their priorities sit in, the share of
// workers they keep) do not move with the core's defaults.
const (
	// Workers is kube-scheduler's default parallelism.
	Workers = 16
	// AgingBand is the width of a priority band: the call types' default
	// priorities are a band apart.
	AgingBand = 10
	// QPS and Burst are kube-scheduler's client defaults (--kube-api-qps,
	// --kube-api-burst).
	QPS   = 50
	Burst = 100
	// MinQPS is the slowest positive QPS a preset accepts, one call a
	// minute: a slower limiter would hold calls past any deadline a
	// scheduler or controller sets.
	MinQPS = 1.0 / 60
)

// Start returns p with the preset's zeros filled in, for a dispatcher of
// workers workers whose urgent calls are those of priority urgent and
// above (and its band): ReservedWorkers 0 keeps a quarter of the workers,
// at least one (none with a single worker), a negative value none; while
// workers are kept, UrgentPriority 0 means urgent.
func Start(p dispatch.StartPolicy, workers, urgent int) dispatch.StartPolicy {
	switch {
	case p.ReservedWorkers < 0, p.ReservedWorkers == 0 && workers <= 1:
		p.ReservedWorkers = 0
	case p.ReservedWorkers == 0:
		p.ReservedWorkers = max(1, workers/4)
	}
	if p.ReservedWorkers > 0 && p.UrgentPriority == 0 {
		p.UrgentPriority = urgent
	}
	return p
}

// OptionsErr is an adapter's error for dispatch.New's err, after prefix
// (the adapter's name and a colon): one about a Config field names the
// adapter's Options field the caller set instead — the first of renames
// (a Config field's path, and the Options field it came from) that begins
// it, else the field of the same name — so that bad input is reported as
// the caller wrote it. The core's error stays wrapped.
func OptionsErr(prefix string, err error, renames ...[2]string) error {
	rest, ok := strings.CutPrefix(err.Error(), "dispatch: Config.")
	if !ok {
		return fmt.Errorf("%s Options: %w", prefix, err)
	}
	for _, r := range renames {
		if after, ok := strings.CutPrefix(rest, r[0]); ok {
			rest = r[1] + after
			break
		}
	}
	return &renamedErr{msg: prefix + " Options." + rest, err: err}
}

// renamedErr is err with a message of its own.
type renamedErr struct {
	msg string
	err error
}

func (e *renamedErr) Error() string { return e.msg }
func (e *renamedErr) Unwrap() error { return e.err }
