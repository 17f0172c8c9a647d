package kube

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// conditionChanges reports whether setting cond would change status. The
// timestamps a writer fills in (LastTransitionTime) do not count; what the
// condition says does, as in kube-scheduler.
func conditionChanges(status *v1.PodStatus, cond *v1.PodCondition) bool {
	old := findCondition(status, cond.Type)
	return old == nil ||
		old.Status != cond.Status ||
		old.Reason != cond.Reason ||
		old.Message != cond.Message ||
		old.ObservedGeneration != cond.ObservedGeneration ||
		!old.LastProbeTime.Equal(&cond.LastProbeTime)
}

func findCondition(status *v1.PodStatus, t v1.PodConditionType) *v1.PodCondition {
	for i := range status.Conditions {
		if status.Conditions[i].Type == t {
			return &status.Conditions[i]
		}
	}
	return nil
}

// statusChanges reports whether the status patch c would change its
// baseline: the no-op test.
func (c *Call) statusChanges() bool {
	if c.setNNN && c.base.NominatedNodeName != c.nnn {
		return true
	}
	for i := range c.conds {
		if conditionChanges(c.base, &c.conds[i]) {
			return true
		}
	}
	return false
}

// applyConditions returns a copy of base with conds set, and whether
// anything changed. A condition whose status changes gets now as its
// LastTransitionTime unless it brings its own; one whose status stays
// keeps the old transition time.
func applyConditions(base *v1.PodStatus, conds []v1.PodCondition, now metav1.Time) (*v1.PodStatus, bool) {
	out := base.DeepCopy()
	changed := false
	for _, cond := range conds {
		if !conditionChanges(out, &cond) {
			continue
		}
		changed = true
		old := findCondition(out, cond.Type)
		switch {
		case old != nil && old.Status == cond.Status:
			cond.LastTransitionTime = old.LastTransitionTime
		case cond.LastTransitionTime.IsZero():
			cond.LastTransitionTime = now
		}
		if old != nil {
			*old = cond
		} else {
			out.Conditions = append(out.Conditions, cond)
		}
	}
	return out, changed
}

// statusPatchBody returns the strategic-merge patch that takes base to
// status, fenced by the pod's UID and, if rv is not empty, by its
// resourceVersion.
func statusPatchBody(base, status *v1.PodStatus, uid types.UID, rv string) ([]byte, error) {
	oldJSON, err := json.Marshal(v1.Pod{Status: *base})
	if err != nil {
		return nil, err
	}
	newJSON, err := json.Marshal(v1.Pod{Status: *status})
	if err != nil {
		return nil, err
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(oldJSON, newJSON, &v1.Pod{})
	if err != nil {
		return nil, fmt.Errorf("kube: computing the status patch: %w", err)
	}
	if len(patch) < 2 || patch[0] != '{' {
		return patch, nil
	}
	// metadata in a patch is a precondition. A resourceVersion: the server
	// refuses the patch with a conflict if the pod has changed since. A
	// UID: kube-apiserver refuses it as a change to an immutable field
	// (422, cause metadata.uid; see replaced) if the name now holds
	// another pod, which a patch by name would otherwise write to.
	meta, err := json.Marshal(map[string]patchMeta{"metadata": {UID: uid, ResourceVersion: rv}})
	if err != nil {
		return nil, err
	}
	if string(patch) == "{}" {
		// A change the API would not keep (a time below JSON's second):
		// nothing to send, as upstream's patch helper sends no empty patch.
		return nil, nil
	}
	out := make([]byte, 0, len(meta)+len(patch))
	out = append(out, meta[:len(meta)-1]...) // without its closing brace
	out = append(out, ',')
	return append(out, patch[1:]...), nil
}

// patchMeta is the metadata a status patch sends as its preconditions.
type patchMeta struct {
	UID             types.UID `json:"uid,omitempty"`
	ResourceVersion string    `json:"resourceVersion,omitempty"`
}

// replaced reports whether err is kube-apiserver's refusal of a status
// patch whose metadata.uid is not the pod's: the pod the call was built
// for is gone and its name holds a newer pod.
func replaced(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	return slices.ContainsFunc(status.Status().Details.Causes, func(c metav1.StatusCause) bool {
		return c.Field == "metadata.uid"
	})
}

// statusPatch returns the body of the status patch c, or nil if it would
// change nothing against its baseline that the API keeps.
func (c *Call) statusPatch(now metav1.Time) ([]byte, error) {
	status, changed := applyConditions(c.base, c.conds, now)
	if c.setNNN && status.NominatedNodeName != c.nnn {
		status.NominatedNodeName, changed = c.nnn, true
	}
	if !changed {
		return nil, nil
	}
	rv := c.rv
	if c.unconditional {
		rv = ""
	}
	return statusPatchBody(c.base, status, c.uid, rv)
}

// disruptionPatch returns the body of a deletion's condition patch, or nil
// if there is none to send. It is fenced by the pod's UID only: the
// condition is true of the victim whatever else changed, and of no newer
// pod of its name.
func (c *Call) disruptionPatch(now metav1.Time) ([]byte, error) {
	if c.disruption == nil {
		return nil, nil
	}
	status, changed := applyConditions(c.base, []v1.PodCondition{*c.disruption}, now)
	if !changed {
		return nil, nil
	}
	return statusPatchBody(c.base, status, c.uid, "")
}
