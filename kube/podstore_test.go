package kube

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// podStore keeps pods with the semantics of kube-apiserver that the calls
// rely on: a resourceVersion bumped on every write and checked as a status
// patch's precondition; a binding refused with 409 once the pod is
// assigned (and one that lands sets PodScheduled=True); UID preconditions
// on bindings and deletions. It backs both test servers, the fake
// clientset's and the HTTP one. Callers hold their own lock.
type podStore struct {
	pods map[string]*v1.Pod
	rv   int
}

func newPodStore() *podStore { return &podStore{pods: map[string]*v1.Pod{}} }

// add stores a copy of pod with a fresh resourceVersion, replacing any pod
// of its name, and returns a copy of what it stored.
func (s *podStore) add(pod *v1.Pod) *v1.Pod {
	p := pod.DeepCopy()
	s.bump(p)
	s.pods[p.Name] = p
	return p.DeepCopy()
}

func (s *podStore) bump(p *v1.Pod) {
	s.rv++
	p.ResourceVersion = strconv.Itoa(s.rv)
}

func (s *podStore) get(name string) (*v1.Pod, error) {
	p := s.pods[name]
	if p == nil {
		return nil, apierrors.NewNotFound(podsResource, name)
	}
	return p.DeepCopy(), nil
}

func (s *podStore) patchStatus(name string, patch []byte) (*v1.Pod, error) {
	p := s.pods[name]
	if p == nil {
		return nil, apierrors.NewNotFound(podsResource, name)
	}
	var pre struct {
		Metadata struct {
			UID             types.UID `json:"uid"`
			ResourceVersion string    `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(patch, &pre); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	if rv := pre.Metadata.ResourceVersion; rv != "" && rv != p.ResourceVersion {
		return nil, apierrors.NewConflict(podsResource, name, errors.New("the object has been modified; please apply your changes to the latest version and try again"))
	}
	if uid := pre.Metadata.UID; uid != "" && uid != p.UID {
		return nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, name, field.ErrorList{
			field.Invalid(field.NewPath("metadata", "uid"), uid, "field is immutable"),
		})
	}
	cur, err := json.Marshal(p)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	out, err := strategicpatch.StrategicMergePatch(cur, patch, &v1.Pod{})
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	var np v1.Pod
	if err := json.Unmarshal(out, &np); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	p.Status = np.Status // the status subresource writes nothing else
	s.bump(p)
	return p.DeepCopy(), nil
}

func (s *podStore) bind(b *v1.Binding) error {
	p := s.pods[b.Name]
	switch {
	case p == nil:
		return apierrors.NewNotFound(podsResource, b.Name)
	case b.UID != "" && b.UID != p.UID:
		return apierrors.NewConflict(podsResource, b.Name, fmt.Errorf("precondition failed: UID in precondition: %v, UID in object meta: %v", b.UID, p.UID))
	case p.DeletionTimestamp != nil:
		return apierrors.NewConflict(podsResource, b.Name, fmt.Errorf("pod %s is being deleted, cannot be assigned to a host", b.Name))
	case p.Spec.NodeName != "":
		return apierrors.NewConflict(podsResource, b.Name, fmt.Errorf("pod %v is already assigned to node %q", b.Name, p.Spec.NodeName))
	case len(p.Spec.SchedulingGates) != 0:
		return apierrors.NewConflict(podsResource, b.Name, fmt.Errorf("pod %v has non-empty .spec.schedulingGates", b.Name))
	}
	p.Spec.NodeName = b.Target.Name
	st, _ := applyConditions(&p.Status, []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionTrue}}, metav1.Now())
	p.Status = *st
	s.bump(p)
	return nil
}

func (s *podStore) delete(name string, uid *types.UID) (*v1.Pod, error) {
	p := s.pods[name]
	switch {
	case p == nil:
		return nil, apierrors.NewNotFound(podsResource, name)
	case uid != nil && *uid != p.UID:
		return nil, apierrors.NewConflict(podsResource, name, fmt.Errorf("precondition failed: UID in precondition: %v, UID in object meta: %v", *uid, p.UID))
	}
	delete(s.pods, name)
	return p, nil
}

// assign binds pod name to node on the server directly, as a write the
// dispatcher did not make (another scheduler, an earlier attempt).
func (s *podStore) assign(name, node string) {
	p := s.pods[name]
	p.Spec.NodeName = node
	s.bump(p)
}
