package kube

import (
	"context"
	"errors"
	"fmt"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/internal/retryafter"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// calls runs kube calls against one pods API: the dispatcher's exec,
// no-op test, completion hook and before-retry hook.
type calls struct {
	pods podAPI
	log  klog.Logger
	// classify is the dispatcher's classifier (Options.Classify, or
	// Classify): it judges the read before a retry too.
	classify func(error) dispatch.Class
	// amend is the dispatcher's Amend, set once New has returned and
	// before any call runs: what a write taught about the pod is passed on
	// to the call waiting behind it.
	amend func(types.UID, func(Call) (Call, error)) (bool, error)
}

// errKeep makes an Amend leave the pending call as it is.
var errKeep = errors.New("kube: pending call kept")

// exec performs one attempt of c. An error the server sent with a delay
// (Retry-After) comes back wrapped so that the dispatcher's backoff honours
// it.
//
// A write that lands tells the pod's successor (the call submitted while
// this one was in flight) what it needs to know: after a status patch sent
// with its resourceVersion precondition, the pod is exactly the patch's
// response, so a successor built from the same view is rebased onto it —
// instead of being refused by the server and read back; after a binding,
// a successor status patch's PodScheduled=False and nomination are stale
// and dropped, and a successor binding to the same node is moot; after a
// deletion, the pod is gone and every successor is moot, as a call
// submitted onto a pending deletion is.
func (a *calls) exec(ctx context.Context, uid types.UID, c Call) error {
	if err := c.Err(); err != nil {
		return err
	}
	if c.unread != nil {
		return retryafter.FromStatus(c.unread)
	}
	switch c.typ {
	case PodStatusPatch:
		pod, err := a.patch(ctx, &c)
		if err == nil && pod != nil && c.rv != "" && !c.unconditional {
			b := baselineOf(pod)
			a.successor(uid, func(next Call) (Call, error) {
				if next.rv != c.rv {
					return next, errKeep // built from another view: let the server judge it
				}
				return next.rebase(b), nil
			})
		}
		return retryafter.FromStatus(err)
	case PodBinding:
		a.info(vWrite, &c, "Binding pod to node", "node", c.node)
		if c.sent != nil {
			c.sent.Store(true)
		}
		err := a.pods.bind(ctx, &v1.Binding{
			ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: c.name, UID: c.uid},
			Target:     v1.ObjectReference{Kind: "Node", Name: c.node},
		})
		if err == nil {
			a.bound(uid, c.node)
		}
		return retryafter.FromStatus(err)
	default:
		err := a.delete(ctx, &c)
		if err == nil {
			a.gone(uid)
		}
		return retryafter.FromStatus(err)
	}
}

// successor rewrites the pending call of uid with f, if there is one.
func (a *calls) successor(uid types.UID, f func(Call) (Call, error)) {
	if a.amend != nil {
		_, _ = a.amend(uid, f) // errKeep, or nothing pending: nothing to do
	}
}

// bound tells the successor of a binding that landed, found by its
// response or by the read before its retry: the pod is bound to node.
func (a *calls) bound(uid types.UID, node string) {
	a.successor(uid, func(next Call) (Call, error) { return next.boundTo(node), nil })
}

// gone tells the successor of a deletion that landed, found by its
// response or by the read before its retry: the pod is gone.
func (a *calls) gone(uid types.UID) {
	a.successor(uid, func(next Call) (Call, error) { next.gone = true; return next, nil })
}

// patch sends the status patch c, and returns the pod as the server
// answered. With nothing to send — a change the no-op test saw that the
// API would not keep — it sends nothing and returns dispatch.SkipCall: the
// call ends Skipped, as one the no-op test stops does. A patch refused
// because the name holds a newer pod (see replaced) fails for good, saying
// so.
func (a *calls) patch(ctx context.Context, c *Call) (*v1.Pod, error) {
	body, err := c.statusPatch(metav1.Now())
	if err != nil {
		return nil, err
	}
	if body == nil {
		a.info(vNoOp, c, msgNoOp, "callType", c.typ)
		return nil, dispatch.SkipCall
	}
	a.logStatusPatch(c)
	pod, err := a.pods.patchStatus(ctx, c.namespace, c.name, body)
	if replaced(err) {
		return nil, fmt.Errorf("kube: %s: the pod was replaced (UID %s is gone): %w", c, c.uid, err)
	}
	return pod, err
}

// delete patches the deletion's condition, if any, then deletes the pod
// with its UID as a precondition. A pod that is gone — NotFound, or a
// refusal of the UID precondition of either request (the name now holds a
// newer pod) — is deleted as far as this call is concerned: the call has
// met its goal, and the newer pod is left alone.
func (a *calls) delete(ctx context.Context, c *Call) error {
	body, err := c.disruptionPatch(metav1.Now())
	if err != nil {
		return err
	}
	if body != nil {
		a.logConditions(c, []v1.PodCondition{*c.disruption})
		if _, err := a.pods.patchStatus(ctx, c.namespace, c.name, body); err != nil {
			if apierrors.IsNotFound(err) || replaced(err) {
				a.info(vGone, c, msgGone, "uid", c.uid)
				return nil
			}
			return err
		}
	}
	a.info(vWrite, c, "Deleting pod", "uid", c.uid)
	err = a.pods.delete(ctx, c.namespace, c.name, c.uid)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		a.info(vGone, c, msgGone, "uid", c.uid)
		return nil
	}
	return err
}

// beforeRetry is the Config.BeforeRetry of kube calls: before a call runs
// again, it finds out what the earlier attempt did, so that no write
// happens twice and none is made from a view the server refused.
//
//   - A binding reads the pod: bound to the call's node, the earlier attempt
//     took effect (its response was lost, or this is the 409 "already
//     assigned" it caused) and the call ends Succeeded without binding
//     again; bound to another node, or replaced by a pod with another UID,
//     or gone, or being deleted, or gated (kube-apiserver refuses to bind
//     a pod with a deletionTimestamp or schedulingGates), it ends Failed;
//     otherwise, still unbound, it binds again.
//   - A status patch refused with a conflict (its resourceVersion
//     precondition failed) is rebuilt against the pod as read now; if the
//     pod is bound meanwhile, a PodScheduled=False or a nomination is
//     dropped as stale, and a patch left with nothing to change ends
//     Skipped. Other status-patch retries resend the same patch.
//   - A deletion reads the pod: gone, replaced, or being deleted (its
//     deletionTimestamp set: the earlier attempt's DELETE landed, or
//     another's), it ends Succeeded without sending anything more;
//     otherwise it runs again against the pod as read now (a condition that
//     landed is not patched twice).
//
// A binding or deletion the read finds landed tells the call waiting
// behind it, as exec does for one whose response says so.
//
// If the read itself fails with an error the dispatcher's classifier
// (Options.Classify) retries, the call runs again as it was: the next
// attempt will tell. Unless the server asked for a delay (Retry-After):
// then the attempt sends nothing and fails with the read's error, so that
// the call waits the delay out in the queue, as after a write's, and
// reads again. The call's attempt limit bounds the loop.
func (a *calls) beforeRetry(ctx context.Context, uid types.UID, c Call, lastErr error) (Call, bool, error) {
	c.unread = nil
	if re := (*readError)(nil); errors.As(lastErr, &re) {
		lastErr = re.last // the read the last attempt waited for is still to make
	}
	if c.Err() != nil || (c.typ == PodStatusPatch && !apierrors.IsConflict(lastErr)) {
		return c, false, nil
	}
	pod, err := a.pods.get(ctx, c.namespace, c.name)
	switch {
	case err == nil && pod.UID != uid:
		if c.typ == PodDeletion {
			a.gone(uid)
			return c, true, nil
		}
		return c, false, fmt.Errorf("kube: %s: the pod was replaced (UID %s, not %s): %w", c, pod.UID, uid, lastErr)
	case apierrors.IsNotFound(err):
		if c.typ == PodDeletion {
			a.gone(uid)
			return c, true, nil
		}
		return c, false, fmt.Errorf("kube: %s: reading the pod back: %w", c, err)
	case err != nil:
		if a.classify(err) == dispatch.ClassRetry {
			if s, _ := apierrors.SuggestsClientDelay(err); s > 0 {
				c.unread = &readError{err: fmt.Errorf("kube: %s: reading the pod back: %w", c, err), last: lastErr}
			}
			return c, false, nil
		}
		return c, false, fmt.Errorf("kube: %s: reading the pod back: %w", c, err)
	}
	if c.typ == PodDeletion && pod.DeletionTimestamp != nil {
		// Graceful deletion has started (the earlier attempt's DELETE
		// landed, or another's): as upstream's preemption, send nothing
		// more.
		a.info(vGone, &c, msgDeleting, "uid", c.uid)
		a.gone(uid)
		return c, true, nil
	}
	if c.typ == PodBinding {
		switch pod.Spec.NodeName {
		case c.node:
			a.bound(uid, c.node)
			return c, true, nil
		case "":
			// kube-apiserver refuses to bind a pod being deleted or one
			// with scheduling gates (409): a binding sent again would be
			// refused the same way.
			switch {
			case pod.DeletionTimestamp != nil:
				return c, false, fmt.Errorf("kube: %s: the pod is being deleted: %w", c, lastErr)
			case len(pod.Spec.SchedulingGates) > 0:
				return c, false, fmt.Errorf("kube: %s: the pod has scheduling gates: %w", c, lastErr)
			}
		default:
			return c, false, fmt.Errorf("kube: %s: the pod is bound to node %s: %w", c, pod.Spec.NodeName, lastErr)
		}
	}
	return c.rebase(baselineOf(pod)), false, nil
}

// readError is the error of an attempt that sent nothing because the read
// before it failed with a delay to wait (see calls.beforeRetry): the
// read's error, and last, the error of the write that made the read
// needed, which decides what the next read is for.
type readError struct {
	err  error
	last error
}

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }
