package kube

import (
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
// status, with rv as a resourceVersion precondition if it is not empty.
func statusPatchBody(base, status *v1.PodStatus, rv string) ([]byte, error) {
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
	if rv == "" || len(patch) < 2 || patch[0] != '{' {
		return patch, nil
	}
	// A resourceVersion in a patch is a precondition: the server refuses
	// the patch with a conflict if the pod has changed since.
	meta, err := json.Marshal(map[string]map[string]string{"metadata": {"resourceVersion": rv}})
	if err != nil {
		return nil, err
	}
	if string(patch) == "{}" {
		return meta, nil
	}
	out := make([]byte, 0, len(meta)+len(patch))
	out = append(out, meta[:len(meta)-1]...) // without its closing brace
	out = append(out, ',')
	return append(out, patch[1:]...), nil
}

// statusPatch returns the body of the status patch c, or nil if it would
// change nothing against its baseline.
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
	return statusPatchBody(c.base, status, rv)
}

// disruptionPatch returns the body of a deletion's condition patch, or nil
// if there is none to send. It carries no precondition: the condition is
// true whatever else changed, and the deletion is fenced by UID.
func (c *Call) disruptionPatch(now metav1.Time) ([]byte, error) {
	if c.disruption == nil {
		return nil, nil
	}
	status, changed := applyConditions(c.base, []v1.PodCondition{*c.disruption}, now)
	if !changed {
		return nil, nil
	}
	return statusPatchBody(c.base, status, "")
}
