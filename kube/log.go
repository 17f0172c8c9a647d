package kube

import (
	"github.com/coalescer/dispatch"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// The verbosities of the dispatcher's log lines: kube-scheduler's for the
// same events (its api_calls and preemption code), so that a scheduler's
// -v shows the same writes with the preset as without it.
const (
	// vGone: a deletion finds its pod already gone.
	vGone = 2
	// vWrite: a write is sent — a binding, a status patch's conditions, a
	// deletion.
	vWrite = 3
	// vNoOp: a call is not sent because it would change nothing.
	vNoOp = 5
)

// Messages logged from more than one place.
const (
	msgNoOp     = "Call has no effect; not sent"
	msgGone     = "Pod to delete is already gone"
	msgDeleting = "Pod to delete is already being deleted"
)

// ref names c's pod in log lines.
func (c *Call) ref() klog.ObjectRef { return klog.KRef(c.namespace, c.name) }

// info logs msg about c's pod at verbosity v, with kv.
func (a *calls) info(v int, c *Call, msg string, kv ...any) {
	if l := a.log.V(v); l.Enabled() {
		l.Info(msg, append([]any{"pod", c.ref()}, kv...)...)
	}
}

// logConditions logs each condition a write sets on c's pod.
func (a *calls) logConditions(c *Call, conds []v1.PodCondition) {
	for _, cond := range conds {
		a.info(vWrite, c, "Setting pod condition", "type", cond.Type, "status", cond.Status, "reason", cond.Reason)
	}
}

// logStatusPatch logs a status patch about to be sent.
func (a *calls) logStatusPatch(c *Call) {
	a.logConditions(c, c.conds)
	if c.setNNN {
		a.info(vWrite, c, "Setting pod's nominated node", "nominatedNodeName", c.nnn)
	}
}

// onDone is the Config.OnDone of kube calls: it logs a status patch that
// failed — nobody waits on one, so the log is where its failure shows —
// then calls the user's hook, if any, even if the logger panicked. A
// binding's or a deletion's failure is its submitter's to report.
func (a *calls) onDone(user func(Result)) func(Result) {
	if user == nil {
		user = func(Result) {}
	}
	return func(r Result) {
		defer user(r)
		if r.State == dispatch.StateFailed && r.Call.typ == PodStatusPatch {
			a.log.Error(r.Err, "Status patch failed", "pod", r.Call.ref(), "attempts", r.Attempts)
		}
	}
}
