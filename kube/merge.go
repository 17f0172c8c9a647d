package kube

import (
	"fmt"
	"slices"

	"github.com/coalescer/dispatch"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// merge is the Config.Merge of kube calls: how a submission coalesces into
// the pod's pending call. Relevance decides between types, as in
// kube-scheduler: a more relevant incoming call replaces the pending one,
// as a new operation (ReplacePending: no attempts, backoff or last error
// carried over); a
// less relevant one is moot (SkipIncoming: it ends Skipped at once, without
// waiting for the pending call). Within a type, status patches combine —
// what the newer one sets wins, what it leaves out is kept — and bindings
// and deletions are replaced by the newer one (a deletion keeps the older
// one's condition if the newer has none). A binding that was sent and is
// being retried is not replaced: it may have landed, and a pod is bound
// once. A binding to its node joins it; one to another node is refused
// with a conflict, and the retry goes on as it was (a call that arrived
// while it was in flight then runs after it, and is refused by the server).
//
// Within a type, the merged call keeps the newer of the two baselines: the
// incoming call's, unless the pending call's resourceVersion is the later
// one — the pending call was rebased onto a write's response or a read
// while the incoming one was built from a view that had not caught up —
// or the incoming call's pod has no resourceVersion where the pending
// call's has one.
// Judged against the older view, a patch could find nothing to change that
// the pod as it now is needs, and would end Skipped without being sent.
// A pending patch built while the pod was unbound, merged with a call built
// from a view that shows it bound, loses its PodScheduled=False and
// nomination as stale (see Call.boundTo), as a rebase onto that view would.
//
// It runs under the dispatcher's lock: it only assigns fields, and
// allocates only when two patches' conditions combine.
func merge(pending, incoming Call) (Call, error) {
	if err := incoming.Err(); err != nil {
		return pending, err // refused: the pending call stays as it was
	}
	if pending.Err() != nil {
		return incoming, nil
	}
	if pending.gone {
		return pending, dispatch.SkipIncoming // the pod is deleted: nothing left to do
	}
	switch rp, ri := pending.typ.relevance(), incoming.typ.relevance(); {
	case ri < rp:
		return pending, dispatch.SkipIncoming
	case ri > rp:
		// Another operation: it starts fresh, in its own tenant and
		// under its own label, whatever the call it replaces had been
		// through.
		return incoming, dispatch.ReplacePending
	}
	if pending.typ == PodBinding && pending.sent != nil && pending.sent.Load() {
		// The pending binding is a retry: it may have landed, and its
		// submitter is owed the answer.
		if incoming.node != pending.node {
			return pending, apierrors.NewConflict(v1.Resource("pods"), pending.name, fmt.Errorf(
				"its binding to node %s was sent and is being retried, so a binding to node %s cannot replace it", pending.node, incoming.node))
		}
		incoming.sent = pending.sent
	}
	if !supersedes(incoming.rv, pending.rv) {
		incoming = incoming.rebase(baseline{status: pending.base, rv: pending.rv, nodeName: pending.nodeName, deleting: pending.deleting})
	} else if pending.nodeName == "" && incoming.nodeName != "" {
		// The incoming view shows the pod bound since the pending call
		// was built: what the pending call reported about an unbound
		// pod is stale, as when it is rebased onto that view.
		pending = pending.boundTo(incoming.nodeName)
	}
	switch incoming.typ {
	case PodStatusPatch:
		return mergeStatus(pending, incoming), nil
	case PodDeletion:
		if incoming.disruption == nil {
			incoming.disruption = pending.disruption
		}
	}
	return incoming, nil
}

// supersedes reports whether a view of the pod at resourceVersion view
// may replace a baseline at resourceVersion base: unless base is the later
// one, or view has none where base has one — a view without a version
// (a pod made by hand) cannot be ordered, and would strip a status patch
// built from base of its precondition.
func supersedes(view, base string) bool {
	return !newer(base, view) && (view != "" || base == "")
}

// newer reports whether resourceVersion a is later than b. Resource
// versions compare as the integers they are (KEP-5504); one that is not
// well formed, or empty, is never newer nor older than another.
func newer(a, b string) bool {
	cmp, err := resourceversion.CompareResourceVersion(a, b)
	return err == nil && cmp > 0
}

// mergeStatus combines two status patches: incoming's baseline (by then the
// newer of the two, see merge) and the fields it sets, plus those of
// pending it does not set; sent with the precondition unless both are
// Unconditional.
func mergeStatus(pending, incoming Call) Call {
	out := incoming
	// Unconditional only if both are: the pending patch's fields were
	// computed from a view its precondition still fences.
	out.unconditional = pending.unconditional && incoming.unconditional
	if !incoming.setNNN && pending.setNNN {
		out.nnn, out.setNNN = pending.nnn, true
	}
	for _, cond := range pending.conds {
		if !slices.ContainsFunc(incoming.conds, func(c v1.PodCondition) bool { return c.Type == cond.Type }) {
			// A clipped slice: append copies, so incoming's conditions,
			// which other calls may share, are never written.
			out.conds = append(slices.Clip(out.conds), cond)
		}
	}
	return out
}

// noOp is the Config.NoOp of kube calls: a status patch that changes
// nothing in its baseline, a binding whose baseline already shows the
// pod on its node, a deletion whose baseline shows the pod being deleted
// (as upstream's preemption skips such a victim), and any call behind a
// deletion that landed, are not sent (and logged so).
// An invalid call runs, so that exec reports why it is invalid.
func (a *calls) noOp(_ types.UID, c Call) bool {
	if isNoOp(&c) {
		a.info(vNoOp, &c, msgNoOp, "callType", c.typ)
		return true
	}
	return false
}

// isNoOp reports whether c would change nothing (see calls.noOp).
func isNoOp(c *Call) bool {
	if c.Err() != nil {
		return false
	}
	if c.gone {
		return true
	}
	switch c.typ {
	case PodStatusPatch:
		return !c.statusChanges()
	case PodBinding:
		return c.nodeName == c.node
	case PodDeletion:
		return c.deleting
	}
	return false
}

// label is the Config.Label of kube calls: the call type.
func label(_ types.UID, c Call) string {
	if c.Err() != nil {
		return "invalid"
	}
	return string(c.typ)
}

// project returns pod as it will look once c lands: with a status patch's
// fields or a deletion's condition set, or, if pod is unbound, a binding's
// node. A pod bound elsewhere stays where it is: a pod's node never
// changes once set, so the binding cannot land (it will end Failed), and
// the server's truth wins. It returns pod itself if c changes nothing in
// it, and a changed copy otherwise; pod is never written.
func (c *Call) project(pod *v1.Pod) *v1.Pod {
	now := metav1.Now()
	switch c.typ {
	case PodStatusPatch:
		status, changed := applyConditions(&pod.Status, c.conds, now)
		if c.setNNN && status.NominatedNodeName != c.nnn {
			status.NominatedNodeName, changed = c.nnn, true
		}
		if changed {
			out := pod.DeepCopy()
			out.Status = *status
			return out
		}
	case PodBinding:
		if pod.Spec.NodeName == "" {
			out := pod.DeepCopy()
			out.Spec.NodeName = c.node
			return out
		}
	case PodDeletion:
		if c.disruption != nil && !c.deleting {
			if status, changed := applyConditions(&pod.Status, []v1.PodCondition{*c.disruption}, now); changed {
				out := pod.DeepCopy()
				out.Status = *status
				return out
			}
		}
	}
	return pod
}
