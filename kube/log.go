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

// ref names c's pod in log lines.
func (c *Call) ref() klog.ObjectRef { return klog.KRef(c.namespace, c.name) }

// logConditions logs each condition a write sets on c's pod.
func (a *calls) logConditions(c *Call, conds []v1.PodCondition) {
	if l := a.log.V(vWrite); l.Enabled() {
		for _, cond := range conds {
			l.Info("Setting pod condition", "pod", c.ref(), "type", cond.Type, "status", cond.Status, "reason", cond.Reason)
		}
	}
}

// logStatusPatch logs a status patch about to be sent.
func (a *calls) logStatusPatch(c *Call) {
	a.logConditions(c, c.conds)
	if l := a.log.V(vWrite); c.setNNN && l.Enabled() {
		l.Info("Setting pod's nominated node", "pod", c.ref(), "nominatedNodeName", c.nnn)
	}
}

// logBinding logs a binding about to be sent.
func (a *calls) logBinding(c *Call) {
	if l := a.log.V(vWrite); l.Enabled() {
		l.Info("Binding pod to node", "pod", c.ref(), "node", c.node)
	}
}

// logDeletion logs a deletion about to be sent.
func (a *calls) logDeletion(c *Call) {
	if l := a.log.V(vWrite); l.Enabled() {
		l.Info("Deleting pod", "pod", c.ref(), "uid", c.uid)
	}
}

// logGone logs a deletion whose pod was already gone.
func (a *calls) logGone(c *Call) {
	if l := a.log.V(vGone); l.Enabled() {
		l.Info("Pod to delete is already gone", "pod", c.ref(), "uid", c.uid)
	}
}

// logNoOp logs a call that is not sent because it would change nothing.
func (a *calls) logNoOp(c *Call) {
	if l := a.log.V(vNoOp); l.Enabled() {
		l.Info("Call has no effect; not sent", "pod", c.ref(), "callType", c.typ)
	}
}

// onDone is the Config.OnDone of kube calls: it logs a status patch that
// failed — nobody waits on one, so the log is where its failure shows —
// then calls the user's hook, if any. A binding's or a deletion's
// failure is its submitter's to report.
func (a *calls) onDone(user func(Result)) func(Result) {
	return func(r Result) {
		if r.State == dispatch.StateFailed && r.Call.typ == PodStatusPatch {
			a.log.Error(r.Err, "Status patch failed", "pod", r.Call.ref(), "attempts", r.Attempts)
		}
		if user != nil {
			user(r)
		}
	}
}
