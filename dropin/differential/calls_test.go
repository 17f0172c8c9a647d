package differential

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientset "k8s.io/client-go/kubernetes"
	fwk "k8s.io/kube-scheduler/framework"
	apicalls "k8s.io/kubernetes/pkg/scheduler/framework/api_calls"
)

const namespace = "default"

// labelCallType is a plugin's own call type: labelCall's, as a rule.
const labelCallType fwk.APICallType = "test_label"

// otherCallType is another plugin's call type, which the relevance table
// does not name: relevance 0, below a status patch's.
const otherCallType fwk.APICallType = "test_other"

// urgentCallType is a plugin's call type more relevant than a binding.
const urgentCallType fwk.APICallType = "test_urgent"

// relevances is upstream's table (apicalls.Relevances) with labelCall at
// a status patch's relevance: another type at the same relevance, which
// overwrites a pending status patch and is overwritten by one; and
// urgentCallType above a binding, which it overwrites and skips.
// otherCallType is left out, as a plugin may leave its type out.
var relevances = fwk.APICallRelevances{
	apicalls.PodStatusPatch: apicalls.Relevances[apicalls.PodStatusPatch],
	apicalls.PodBinding:     apicalls.Relevances[apicalls.PodBinding],
	urgentCallType:          apicalls.Relevances[apicalls.PodBinding] + 1,
	labelCallType:           apicalls.Relevances[apicalls.PodStatusPatch],
}

// cond is the PodScheduled condition a pod has, or a status patch sets.
type cond int

const (
	noCond cond = iota
	unschedulable
	schedulerError
)

func (c cond) String() string {
	return [...]string{"none", "Unschedulable", "SchedulerError"}[c]
}

func (c cond) condition() *v1.PodCondition {
	switch c {
	case unschedulable:
		return &v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable}
	case schedulerError:
		return &v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonSchedulerError}
	}
	return nil
}

// podState is a pod as a call is made from it, or as SyncObject is given
// it: its PodScheduled condition, its nominated node and its label a.
type podState struct {
	cond      cond
	nominated string // status.nominatedNodeName
	label     string // label a's value; "" for none
}

func (s podState) String() string {
	var parts []string
	if s.cond != noCond {
		parts = append(parts, "PodScheduled="+s.cond.String())
	}
	if s.nominated != "" {
		parts = append(parts, "nominated="+s.nominated)
	}
	if s.label != "" {
		parts = append(parts, "a="+s.label)
	}
	return "{" + strings.Join(parts, " ") + "}"
}

func podName(i int) string { return fmt.Sprint("p", i) }

// pod returns pod i in state s.
func pod(i int, s podState) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(i), Namespace: namespace, UID: types.UID("uid-" + podName(i))}}
	if s.label != "" {
		p.Labels = map[string]string{"a": s.label}
	}
	if c := s.cond.condition(); c != nil {
		p.Status.Conditions = []v1.PodCondition{*c}
	}
	p.Status.NominatedNodeName = s.nominated
	return p
}

// describePod renders a pod's PodScheduled condition and label a, or
// what obj is if it is not a pod.
func describePod(obj metav1.Object) string {
	p, ok := obj.(*v1.Pod)
	if !ok {
		return fmt.Sprintf("%T", obj)
	}
	var parts []string
	for _, c := range p.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s/%s", c.Type, c.Status, c.Reason))
	}
	if p.Status.NominatedNodeName != "" {
		parts = append(parts, "nominatedNodeName="+p.Status.NominatedNodeName)
	}
	if v, ok := p.Labels["a"]; ok {
		parts = append(parts, "a="+v)
	}
	return "{" + strings.Join(parts, " ") + "}"
}

type callKind int

const (
	statusPatch callKind = iota
	binding
	setLabel
)

// labelKind is which of the tests' own calls a setLabel callSpec makes.
type labelKind int

const (
	// plainLabel: a labelCall of labelCallType.
	plainLabel labelKind = iota
	// strictLabel: a labelCall of labelCallType whose Merge refuses every
	// call, and whose Sync returns nil with its error for an object that
	// is not a pod, as a plugin's call may.
	strictLabel
	// otherLabel: a labelCall of otherCallType, which relevances does not
	// name.
	otherLabel
	// impostorLabel: a labelCall that says it is a status patch
	// (apicalls.PodStatusPatch): upstream's PodStatusPatchCall.Merge
	// refuses it, and it refuses a PodStatusPatchCall.
	impostorLabel
	// urgentLabel: a labelCall of urgentCallType, more relevant than a
	// binding.
	urgentLabel
)

func (k labelKind) String() string {
	return [...]string{"label call", "strict label call", "other-type label call", "status-patch-typed label call", "urgent label call"}[k]
}

// callSpec says how to make a call; each dispatcher gets a call of its
// own, made from it.
type callSpec struct {
	kind  callKind
	pod   int
	from  podState  // the pod a status patch or label call is made from
	cond  cond      // what a status patch sets
	node  string    // where a binding binds
	value string    // what a label call sets label a to
	label labelKind // which label call
	// nominate, if set, is the node a status patch nominates
	// (fwk.ModeOverride).
	nominate string
}

func (c callSpec) String() string {
	switch c.kind {
	case statusPatch:
		s := fmt.Sprintf("status patch %s from %s sets PodScheduled=%s", podName(c.pod), c.from, c.cond)
		if c.nominate != "" {
			s += ", nominates " + c.nominate
		}
		return s
	case binding:
		return fmt.Sprintf("binding %s to %s", podName(c.pod), c.node)
	default:
		return fmt.Sprintf("%s %s from %s sets a=%s", c.label, podName(c.pod), c.from, c.value)
	}
}

// build makes the call: upstream's own, with their constructors
// (apicalls.Implementations, as the scheduler makes them), or a labelCall,
// known as the Add at step id, whose Merges are told to merged (nil: not
// told).
func (c callSpec) build(id int, merged func(string)) fwk.APICall {
	p := pod(c.pod, c.from)
	switch c.kind {
	case statusPatch:
		var ni *fwk.NominatingInfo
		if c.nominate != "" {
			ni = &fwk.NominatingInfo{NominatedNodeName: c.nominate, NominatingMode: fwk.ModeOverride}
		}
		return apicalls.Implementations.PodStatusPatch(p, []*v1.PodCondition{c.cond.condition()}, ni)
	case binding:
		return apicalls.Implementations.PodBinding(&v1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID},
			Target:     v1.ObjectReference{Kind: "Node", Name: c.node},
		})
	default:
		typ := map[labelKind]fwk.APICallType{otherLabel: otherCallType, impostorLabel: apicalls.PodStatusPatch, urgentLabel: urgentCallType}[c.label]
		return &labelCall{
			uid: p.UID, name: p.Name, value: c.value, have: c.from.label,
			typ: cmp.Or(typ, labelCallType), strict: c.label == strictLabel, id: id, merged: merged,
		}
	}
}

// labelCall is a plugin's own call, written the way upstream's
// PodStatusPatchCall is: it sets the pod's label a, is a no-op when the pod
// (as it was made from it, or last synced before it executes) already has
// it, and a newer call absorbs an older one through Merge. It has one key,
// so Merge carries nothing over: the newer value wins; but each Merge is
// told (merged), as a plugin's Merge may act on what it is given. Unlike a
// status patch, its Execute always sends its request, so that every
// execution is seen at the server.
type labelCall struct {
	uid    types.UID
	name   string
	value  string
	typ    fwk.APICallType
	strict bool // Merge refuses; Sync returns nil for an object not a pod
	id     int  // its Add's step
	merged func(string)

	mu       sync.Mutex
	have     string
	executed bool
}

func (c *labelCall) CallType() fwk.APICallType { return c.typ }
func (c *labelCall) UID() types.UID            { return c.uid }

func (c *labelCall) Execute(ctx context.Context, client clientset.Interface) error {
	c.mu.Lock()
	c.executed = true
	c.mu.Unlock()
	patch := fmt.Sprintf(`{"metadata":{"labels":{"a":%q}}}`, c.value)
	_, err := client.CoreV1().Pods(namespace).Patch(ctx, c.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

func (c *labelCall) Sync(obj metav1.Object) (metav1.Object, error) {
	p, ok := obj.(*v1.Pod)
	if !ok {
		err := fmt.Errorf("object of type %T is not a *v1.Pod", obj)
		if c.strict {
			return nil, err
		}
		return obj, err
	}
	c.mu.Lock()
	if !c.executed {
		c.have = p.Labels["a"]
	}
	c.mu.Unlock()
	if p.Labels["a"] == c.value {
		return p, nil
	}
	out := p.DeepCopy()
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	out.Labels["a"] = c.value
	return out, nil
}

func (c *labelCall) Merge(old fwk.APICall) error {
	o, ok := old.(*labelCall)
	if !ok {
		return fmt.Errorf("call of type %T is not a *labelCall", old)
	}
	if c.merged != nil {
		c.merged(fmt.Sprintf("#%d Merge(#%d)", c.id, o.id))
	}
	if c.strict {
		return errors.New("this call merges with none")
	}
	return nil
}

func (c *labelCall) IsNoOp() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.have == c.value
}

// The errors a released request may be answered with (answer), which
// neither dispatcher retries: a 403, which neither do upstream's calls; a
// 404; a 409, which upstream's status patch retries inside its Execute; an
// error that is no API status.
var (
	forbidden  = apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("test"))
	notFound   = apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "p")
	conflict   = apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "p", errors.New("test"))
	errRefused = errors.New("test: the server said no")
	internal   = apierrors.NewInternalError(errors.New("test"))
)

// class is what a caller can tell of an outcome with errors.Is and the
// apierrors predicates.
func class(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, fwk.ErrCallSkipped):
		return "skipped"
	case errors.Is(err, fwk.ErrCallOverwritten):
		return "overwritten"
	case apierrors.IsForbidden(err):
		return "403"
	case apierrors.IsNotFound(err):
		return "404"
	case apierrors.IsConflict(err):
		return "409"
	case apierrors.IsInternalError(err):
		return "500"
	default:
		return "error: " + err.Error()
	}
}
