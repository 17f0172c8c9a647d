package kube

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// CallType is the kind of a Call. It is the call's metric label
// (Stats.Labels, the Observer's Event), its tenant unless a submission
// names one (SubmitOptions.Tenant) and its place in the
// relevance order: PodDeletion > PodBinding > PodStatusPatch.
type CallType string

// The call types. The first two are kube-scheduler's own APICallType names,
// so metrics line up with upstream's.
const (
	// PodStatusPatch patches pods/status: conditions and nominatedNodeName.
	PodStatusPatch CallType = "pod_status_patch"
	// PodBinding creates pods/binding: it assigns the pod to a node.
	PodBinding CallType = "pod_binding"
	// PodDeletion deletes the pod (a preemption victim), optionally after
	// patching a DisruptionTarget condition onto it.
	PodDeletion CallType = "pod_deletion"
)

// CallTypes lists every CallType, for callers that set up one series per
// type.
func CallTypes() []CallType { return []CallType{PodStatusPatch, PodBinding, PodDeletion} }

// relevance orders call types as kube-scheduler does, extended with
// deletion: a more relevant call replaces a less relevant pending one, and
// makes a less relevant incoming one moot. 0 is not a call type.
func (t CallType) relevance() int {
	switch t {
	case PodStatusPatch:
		return 1
	case PodBinding:
		return 2
	case PodDeletion:
		return 3
	}
	return 0
}

// ErrInvalidCall reports a Call that cannot be submitted: built from a nil
// pod, a pod without a name or UID, a binding without a node, a status patch
// that sets nothing, or the zero Call. Submit and Post return it (wrapped,
// with the reason) before anything is queued.
var ErrInvalidCall = errors.New("kube: invalid call")

// Call is one API write on one pod: a status patch, a binding or a
// deletion, built by PatchStatus, Bind or Delete. It is the dispatcher's
// call value, keyed by the pod's UID, so every write to a pod runs in order
// on one lane.
//
// A Call carries its baseline: the pod's status, resourceVersion and node
// as last seen (when it was built, or refreshed by SyncObject or a retry).
// The no-op test and the patch are computed against it. A Call is an
// immutable value: copying it is cheap and safe, and nothing it holds is
// ever written after it is built. Its zero value is invalid.
type Call struct {
	typ       CallType
	namespace string
	name      string
	uid       types.UID

	// The baseline.
	base     *v1.PodStatus // never nil in a valid call; shared, never written
	rv       string
	nodeName string
	// deleting: the pod's graceful deletion has started (its
	// deletionTimestamp is set), so a deletion has nothing left to send.
	deleting bool

	// PodStatusPatch.
	conds         []v1.PodCondition // shared, never written
	nnn           string
	setNNN        bool
	unconditional bool

	// gone: a deletion of the pod landed while the call waited behind
	// it, so the call has nothing left to do (see calls.exec). Beside
	// the other flags, it takes no room of its own.
	gone bool
	// unread: the read before this attempt (see calls.beforeRetry)
	// failed, and the server asked for a delay: the attempt sends
	// nothing and fails with it, so that the call waits it out in the
	// queue and reads again.
	unread *readError

	// PodBinding.
	node string
	// sent is set once the binding is sent: from then on it may have
	// landed (see merge). Each submission has its own (Dispatcher.Submit);
	// it is the one thing a Call points to that is written, and only by
	// the call's execution.
	sent *atomic.Bool

	// PodDeletion: the condition to patch on before deleting, if any.
	disruption *v1.PodCondition // shared, never written

	err error
}

// StatusPatch is what PatchStatus writes to a pod's status. Its zero value
// sets nothing and is refused.
type StatusPatch struct {
	// Conditions are set by type: each replaces the pod's condition of its
	// type, or is added. LastTransitionTime is kept when the status does
	// not change and set to the write's time when it does, unless given.
	Conditions []v1.PodCondition
	// NominatedNodeName, if not nil, sets status.nominatedNodeName; a
	// pointer to "" clears it.
	NominatedNodeName *string
	// Unconditional sends the patch without the pod's resourceVersion. By
	// default a pod built with a resourceVersion is patched with it as a
	// precondition, so that a patch computed from a stale view — a
	// PodScheduled=False racing a successful bind (kubernetes#139602) —
	// is refused by the server with a conflict instead of landing; the
	// dispatcher then re-reads the pod and rebuilds the patch. Two
	// patches merged into one write are sent without the precondition
	// only if both are Unconditional: the other's fields may need it.
	Unconditional bool
}

// PatchStatus returns a call that patches pod's status with p, as a
// strategic-merge patch on pods/status computed against pod's status.
// pod is the baseline: the call is a no-op (Skipped, never sent) if p
// changes nothing in it. The patch carries pod's UID as a precondition,
// Unconditional or not, so that it never lands on a newer pod of the same
// name: one whose pod was replaced ends Failed. PatchStatus copies what it
// needs; pod may be changed afterwards.
func PatchStatus(pod *v1.Pod, p StatusPatch) Call {
	c := fromPod(PodStatusPatch, pod)
	if c.err != nil {
		return c
	}
	if len(p.Conditions) == 0 && p.NominatedNodeName == nil {
		return invalid(c, "status patch sets nothing")
	}
	for i, cond := range p.Conditions {
		if cond.Type == "" {
			return invalid(c, fmt.Sprintf("condition %d has no type", i))
		}
		for _, prev := range p.Conditions[:i] {
			if prev.Type == cond.Type {
				return invalid(c, fmt.Sprintf("condition type %s given twice", cond.Type))
			}
		}
	}
	c.conds = slices.Clone(p.Conditions)
	if p.NominatedNodeName != nil {
		c.nnn, c.setNNN = *p.NominatedNodeName, true
	}
	c.unconditional = p.Unconditional
	return c
}

// Bind returns a call that binds pod to node through pods/binding, with
// the pod's UID as a precondition. A 409 (the pod is already assigned) is
// resolved by reading the pod back: bound to node, the call ends
// Succeeded without binding again; bound elsewhere, being deleted or
// gated (the server's other 409s), it ends Failed, unsent again. It is
// a no-op if the baseline already shows the pod on node.
func Bind(pod *v1.Pod, node string) Call {
	c := fromPod(PodBinding, pod)
	if c.err == nil && node == "" {
		return invalid(c, "binding has no node")
	}
	c.node = node
	return c
}

// Delete returns a call that deletes pod with its UID as a precondition,
// so that a newer pod of the same name is never deleted. If condition is
// not nil (a DisruptionTarget condition for a preemption victim, say), it
// is first patched onto the pod's status unless the baseline already has
// it, with the same UID precondition, so that a newer pod of the same name
// never gets it either.
//
// The call's goal is that pod is gone. A pod that is already gone —
// deleted (NotFound), or replaced by a newer pod of the same name (the
// server refuses the UID precondition of the condition patch or of the
// deletion) — counts as deleted: the call ends Succeeded at the first
// request that finds out, and the newer pod is neither patched nor
// deleted. So does a pod the read before a retry finds being deleted (its
// deletionTimestamp set, as a DELETE whose response was lost leaves a pod
// with a grace period): no second DELETE is sent. A deletion whose
// baseline shows the pod being deleted — built from such a pod, or
// refreshed to one by SyncObject — is a no-op (Skipped, never sent), as
// upstream's preemption sends nothing for a victim whose graceful
// deletion has started.
func Delete(pod *v1.Pod, condition *v1.PodCondition) Call {
	c := fromPod(PodDeletion, pod)
	if c.err != nil {
		return c
	}
	if condition != nil {
		if condition.Type == "" {
			return invalid(c, "condition has no type")
		}
		cond := *condition
		c.disruption = &cond
	}
	return c
}

// submitted returns the call as one submission runs it: a binding with a
// record of its own of whether it was sent (see merge).
func (c Call) submitted() Call {
	if c.typ == PodBinding {
		c.sent = new(atomic.Bool)
	}
	return c
}

// fromPod starts a call of type t on pod, with pod as its baseline.
func fromPod(t CallType, pod *v1.Pod) Call {
	c := Call{typ: t}
	switch {
	case pod == nil:
		return invalid(c, "pod is nil")
	case pod.Name == "":
		return invalid(c, "pod has no name")
	case pod.UID == "":
		return invalid(c, fmt.Sprintf("pod %s/%s has no UID", pod.Namespace, pod.Name))
	}
	c.namespace, c.name, c.uid = pod.Namespace, pod.Name, pod.UID
	c.base, c.rv, c.nodeName = pod.Status.DeepCopy(), pod.ResourceVersion, pod.Spec.NodeName
	c.deleting = pod.DeletionTimestamp != nil
	return c
}

func invalid(c Call, why string) Call {
	c.err = fmt.Errorf("%w: %s: %s", ErrInvalidCall, c.typ, why)
	return c
}

// Type returns the call's type.
func (c Call) Type() CallType { return c.typ }

// UID returns the UID of the call's pod: its key in the dispatcher.
func (c Call) UID() types.UID { return c.uid }

// Pod returns the namespace and name of the call's pod.
func (c Call) Pod() types.NamespacedName {
	return types.NamespacedName{Namespace: c.namespace, Name: c.name}
}

// Node returns a binding's target node, and "" for other calls.
func (c Call) Node() string { return c.node }

// Err reports why the call is invalid (an error matching ErrInvalidCall),
// or nil.
func (c Call) Err() error {
	if c.typ.relevance() == 0 {
		return fmt.Errorf("%w: the zero Call: build calls with PatchStatus, Bind or Delete", ErrInvalidCall)
	}
	return c.err
}

// String describes the call for logs: type, pod and, for a binding, node.
func (c Call) String() string {
	s := fmt.Sprintf("%s %s/%s", c.typ, c.namespace, c.name)
	if c.typ == PodBinding {
		s += " -> " + c.node
	}
	return s
}

// rebase makes b (the newest view of the pod) the call's baseline. If b
// shows the pod bound, the call is as boundTo leaves it.
func (c Call) rebase(b baseline) Call {
	c.base, c.rv, c.nodeName, c.deleting = b.status, b.rv, b.nodeName, b.deleting
	if b.nodeName != "" {
		c = c.boundTo(b.nodeName)
	}
	return c
}

// boundTo returns the call as it stands once its pod is bound to node: a
// binding to node has nothing left to do (the no-op test finds it moot),
// and a status patch's pending PodScheduled=False or nomination is stale
// (kubernetes#139602) and is dropped, so that the patch is not sent for
// them. Other conditions are unchanged.
func (c Call) boundTo(node string) Call {
	c.nodeName = node
	if c.typ != PodStatusPatch {
		return c
	}
	if c.setNNN && c.nnn != "" {
		c.nnn, c.setNNN = "", false
	}
	if i := slices.IndexFunc(c.conds, unscheduled); i >= 0 {
		c.conds = slices.Concat(c.conds[:i], c.conds[i+1:])
	}
	return c
}

func unscheduled(cond v1.PodCondition) bool {
	return cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse
}

// baseline is a pod's state as a call compares against it, taken outside
// the dispatcher's lock so that rebase under it only assigns fields.
type baseline struct {
	status   *v1.PodStatus
	rv       string
	nodeName string
	deleting bool
}

func baselineOf(pod *v1.Pod) baseline {
	return baseline{status: pod.Status.DeepCopy(), rv: pod.ResourceVersion, nodeName: pod.Spec.NodeName, deleting: pod.DeletionTimestamp != nil}
}
